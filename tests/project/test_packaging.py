"""What users install: every module imports, one version everywhere, and (in CI's wheel run) the package under
test is the installed wheel, not the source tree beside these tests."""

from __future__ import annotations

import importlib
import importlib.metadata
import os
import pkgutil
import subprocess
import sys
from pathlib import Path

import atlas_remote

SOURCE = Path(__file__).resolve().parents[1] / "atlas_remote"
# .ci/run sets this when it runs the suite against the wheel it built and installed
UNDER_TEST = os.environ.get("ATLAS_REMOTE_UNDER_TEST", "source")


def test_the_package_under_test_is_the_one_ci_meant():
    here = Path(atlas_remote.__file__).resolve().parent
    if UNDER_TEST == "wheel":
        assert here != SOURCE and "site-packages" in here.parts, here
    else:
        assert here == SOURCE, here


def test_every_module_imports_and_ships_its_type_marker():
    package = Path(atlas_remote.__file__).resolve().parent
    names = [m.name for m in pkgutil.walk_packages([str(package)], "atlas_remote.")]
    assert "atlas_remote.importers" in names and len(names) > 30, names
    for name in names:
        importlib.import_module(name)
    assert (package / "py.typed").exists()
    assert {p.name for p in package.iterdir() if p.is_dir() and p.name != "__pycache__"} == {
        p.name for p in SOURCE.iterdir() if p.is_dir() and p.name != "__pycache__"
    }, "a subpackage of the source tree is not installed"
    static = {p.name for p in (package / "viewer" / "static").iterdir()}
    assert static == {p.name for p in (SOURCE / "viewer" / "static").iterdir()}, "the viewer's page is not installed"


def test_one_version_everywhere():
    version = importlib.metadata.version("atlas_remote")
    assert atlas_remote.__version__ == version
    done = subprocess.run(
        [os.path.join(os.path.dirname(sys.executable), "atlas-remote"), "--version"], capture_output=True, text=True
    )
    assert done.stdout.strip() == f"atlas-remote {version}", done
