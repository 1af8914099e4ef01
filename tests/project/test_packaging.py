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

import pytest

import atlas_remote

pytestmark = pytest.mark.wheel  # CI runs these against the wheel it built, from a fresh environment
SOURCE = Path(__file__).resolve().parents[2] / "atlas_remote"
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


def test_every_module_name_before_the_cut_into_subpackages_still_imports_as_the_module_itself():
    for old, new in atlas_remote.MOVED.items():
        module = importlib.import_module(f"atlas_remote.{old}")
        assert module is importlib.import_module(f"atlas_remote.{new}"), old
        assert module.__spec__.name == f"atlas_remote.{new}", old  # the alias leaves the module's own spec alone
    from atlas_remote.checkpoint import EpochState
    from atlas_remote.ray_data import read_atlas
    from atlas_remote.tokens import TokenStream

    from atlas_remote.training import BlockShuffleSampler, ShuffledStream

    assert (EpochState.__module__, read_atlas.__module__) == (
        "atlas_remote.training.epoch_state",
        "atlas_remote.write.ray_data",
    )
    assert TokenStream is atlas_remote.TokenStream and ShuffledStream.__module__ == "atlas_remote.training.streams"
    assert BlockShuffleSampler.__module__ == "atlas_remote.training.samplers"
    assert atlas_remote.codec is importlib.import_module("atlas_remote.format.codec")  # as an attribute too
    # and nothing imported under an old name covers a public function of the same name on the package
    assert all(not isinstance(getattr(atlas_remote, name), type(atlas_remote)) for name in atlas_remote.__all__)


def test_the_top_of_the_package_is_its_concerns():
    entries = {p.name for p in SOURCE.iterdir() if p.name != "__pycache__"}
    assert entries == {
        "__init__.py",
        "py.typed",
        "errors.py",
        "runtime",
        "storage",
        "trust",
        "format",
        "read",
        "importers",
        "write",
        "training",
        "viewer",
        "cli",
    }, entries
