"""A dataset's files, not only its blocks, come from strangers: malformed JSON, links out of the dataset, many
shards on a machine with few file descriptors. Each gets one clear AtlasError, never a crash or a leak."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap

import pytest
from conftest import TESTS
from helpers import sample_examples
from helpers import write_dataset as write

import atlas_remote as ar


@pytest.mark.parametrize(
    "text",
    [
        pytest.param("[" * 100_000 + "]" * 100_000, id="nested 100,000 deep"),
        pytest.param('{"version": 1, "shard_sizes": [' + "9" * 5000 + '], "compression_strategy": 0}', id="int"),
    ],
)
def test_a_malformed_root_meta_is_a_format_error(tmp_path, text):
    url = str(tmp_path / "ds")
    write(url, sample_examples(10), 5, 2)
    (tmp_path / "ds" / "meta.json").write_text(text)
    with pytest.raises(ar.FormatError, match="meta.json.*not valid JSON"):
        ar.open(url)


def test_a_shard_folder_linked_outside_the_dataset_is_refused(tmp_path):
    url = str(tmp_path / "ds")
    write(url, sample_examples(20), 10, 2)
    os.rename(tmp_path / "ds" / "1", tmp_path / "elsewhere")
    os.symlink(tmp_path / "elsewhere", tmp_path / "ds" / "1")
    with pytest.raises(ar.FormatError, match=r"shard folder '1' is a symbolic link to .*outside the dataset"):
        ar.open(url)[15]
    os.remove(tmp_path / "ds" / "1")
    os.rename(tmp_path / "elsewhere", tmp_path / "ds" / "moved")
    os.symlink("moved", tmp_path / "ds" / "1")  # a link inside the dataset is its owner's business
    assert len(ar.open(url)[:]) == 20


READ_EVERY_SHARD = textwrap.dedent("""
    import resource, sys
    sys.path.insert(0, sys.argv[2])
    resource.setrlimit(resource.RLIMIT_NOFILE, (128, 128))
    import atlas_remote as ar
    ds = ar.open(sys.argv[1])
    print(len([ds[i] for i in range(0, len(ds), 2)]))
""")


def test_many_local_shards_need_few_file_descriptors(tmp_path):
    """Each memory-mapped index once kept a descriptor for the reader's life: 1,500 shards failed at shard 953
    under ulimit -n 1024. Here 300 shards are read under a limit of 128."""
    url = str(tmp_path / "ds")
    write(url, sample_examples(600, seed=4), 2, 1)
    assert len([n for n in os.listdir(url) if n.isdigit()]) == 300
    done = subprocess.run(
        [sys.executable, "-c", READ_EVERY_SHARD, url, str(TESTS)], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0 and done.stdout.strip() == "300", done.stderr[-2000:]


def test_a_journal_that_is_not_json_is_refused(tmp_path):
    url = str(tmp_path / "ds")
    write(url, sample_examples(10), 5, 2)
    staging = tmp_path / "ds" / ".atlas-staging" / "abc"
    staging.mkdir(parents=True)
    (staging / "commit.json").write_text(json.dumps({"token": "abc"})[:-1])
    with pytest.raises(ar.FormatError, match="unreadable commit journal"):
        ar.recover(url)
    assert len(ar.open(url)) == 10


def snapshot(folder) -> dict:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def staging_of(source, into) -> None:
    """What a writer stages for the dataset at `source`, journal included, in the folder `into`."""
    into.mkdir(parents=True)
    folders = sorted(p for p in source.iterdir() if p.is_dir())
    for number, folder in enumerate(folders):
        shutil.copytree(folder, into / str(number))
    for name in ("zstd_dict.bin", "atlas_manifest.npz"):
        if (source / name).exists():
            shutil.copy(source / name, into / name)
    journal = {
        "token": into.name,
        "shard_files": [sorted(p.name for p in folder.iterdir()) for folder in folders],
        "shared_dict": (source / "zstd_dict.bin").exists(),
        "root_meta": (source / "meta.json").read_text(),
        "shard_folders": None,
        "manifest": (source / "atlas_manifest.npz").exists(),
    }
    (into / "commit.json").write_text(json.dumps(journal))


@pytest.mark.parametrize("link", ["staging folder", "token folder", "part folder", "staged file", "shard folder"])
def test_recover_refuses_links_out_of_the_dataset_and_touches_nothing(tmp_path, link):
    """A journal reached through a symbolic link out of the dataset (or naming files there) was executed: recover
    moved the files of a folder elsewhere on the machine into the dataset. Now refused before anything is done."""
    url = write(str(tmp_path / "ds"), sample_examples(20), 10, 2)
    other = tmp_path / "other"
    write(str(other), sample_examples(30, seed=7), 10, 2)
    root, outside = tmp_path / "ds", tmp_path / "outside"
    staging = root / ".atlas-staging"
    if link == "staging folder":
        staging_of(other, outside / "t0")
        os.symlink(outside, staging)
    elif link == "token folder":
        staging_of(other, outside / "t0")
        staging.mkdir()
        os.symlink(outside / "t0", staging / "t0")
    else:
        staging_of(other, staging / "t0")
        if link == "part folder":
            shutil.move(staging / "t0" / "1", outside)
            os.symlink(outside, staging / "t0" / "1")
        elif link == "staged file":
            outside.mkdir()
            shutil.move(staging / "t0" / "1" / "data.bin", outside / "data.bin")
            os.symlink(outside / "data.bin", staging / "t0" / "1" / "data.bin")
        else:  # the journal is sound; the dataset's own shard folder leads out
            shutil.move(root / "1", outside)
            os.symlink(outside, root / "1")
    before = snapshot(outside)
    with pytest.raises(ar.FormatError, match="symbolic link to .* outside the dataset"):
        ar.recover(url)
    assert snapshot(outside) == before
    with pytest.raises(ar.FormatError, match="symbolic link to .* outside the dataset"):
        ar.AtlasDatasetWriter(url, 10, 1, overwrite=True)  # a writer recovers first, and refuses the same way
    assert snapshot(outside) == before
