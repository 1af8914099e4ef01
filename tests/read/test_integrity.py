"""Checksums, verify() and rewrites under an open reader: bad data is reported, never returned or mixed."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
from helpers import same, sample_examples

import atlas_remote as ar
from atlas_remote import CompressionStrategy as CS


def write(url, examples, storage_options=None, **kw):
    with ar.AtlasDatasetWriter(
        url, 100, 10, CS.SHARED_DICTIONARY_COMPRESSION, storage_options=storage_options, **kw
    ) as w:
        for example in examples:
            w.add_example(example)


def damage_block(folder, block: int) -> None:
    """Flip a byte inside one block of a shard, keeping data.bin's size."""
    start = int(np.load(folder / "index.npy")[block])
    data = bytearray((folder / "data.bin").read_bytes())
    data[start + 3] ^= 0xFF
    (folder / "data.bin").write_bytes(bytes(data))


def test_verify_a_sound_dataset(tmp_path):
    write(str(tmp_path / "ds"), sample_examples(350))
    report = ar.verify(str(tmp_path / "ds"))
    assert report.ok and report.shards_checked == 4 and report.blocks_checked == 35
    assert report.blocks_with_checksums == 35 and report.examples_checked == 350


def test_verify_reports_every_bad_block(tmp_path):
    url = tmp_path / "ds"
    write(str(url), sample_examples(500))
    damage_block(url / "0", 3)
    damage_block(url / "0", 7)
    damage_block(url / "2", 0)
    (url / "3" / "data.bin").write_bytes((url / "3" / "data.bin").read_bytes()[:-1])
    (url / "4" / "meta.json").unlink()
    report = ar.verify(str(url))
    assert not report.ok and len(report.problems) == 5, report
    text = str(report)
    for needle in ("shard 0 block 3", "shard 0 block 7", "shard 2 block 0", "3/atlas_blocks.npy", "4/meta.json"):
        assert needle in text
    assert report.blocks_checked == 30 and report.examples_checked == 270

    cli = subprocess.run([sys.executable, "-m", "atlas_remote.cli", "verify", str(url)], capture_output=True, text=True)
    assert cli.returncode == 1 and "5 problem(s)" in cli.stdout and "shard 2 block 0" in cli.stdout


def test_verify_reports_missing_shards_separately(tmp_path):
    url = tmp_path / "ds"
    write(str(url), sample_examples(300))
    import shutil

    shutil.rmtree(url / "1")
    report = ar.verify(str(url))
    assert report.ok and report.missing_shards == [1] and report.shards_checked == 2


@pytest.mark.parametrize("where", ["memory", "s3"])
def test_rewrite_under_an_open_reader_is_refused(where, request, memory_url):
    if where == "s3":
        options, bucket, _ = request.getfixturevalue("s3")
        url = f"s3://{bucket}/ds"
    else:
        options, url = None, memory_url
    old = sample_examples(300, seed=1)
    write(url, old, options)
    ds = ar.open(url, storage_options=options, cache_bytes=0)
    assert same(ds[5], old[5])  # shard 0 is open: its index and checksums are the old ones
    write(url, sample_examples(300, seed=2), options, overwrite=True)
    with pytest.raises(ar.DatasetChangedError, match="rewritten") as changed:
        ds[55]
    assert (changed.value.url, changed.value.shard) == (url, "0")
    assert same(ar.open(url, storage_options=options)[55], sample_examples(300, seed=2)[55])


def test_checksums_added_to_a_dataset_written_without_them(tmp_path):
    """A dataset as the original writer leaves it: a flipped bit may decode to wrong examples unnoticed, and
    verify says so; `checksum` adds the sidecars, touching no other byte, and from then on the flip is caught."""
    from spec_reader import SpecReader

    url = tmp_path / "ds"
    examples = sample_examples(300)
    write(str(url), examples, checksums=False)
    before = {f: f.read_bytes() for f in url.rglob("*") if f.is_file()}
    report = ar.verify(str(url))
    assert report.ok and report.blocks_with_checksums == 0 and "30 blocks have no checksums" in str(report)
    info = subprocess.run(
        [sys.executable, "-m", "atlas_remote.cli", "info", str(url)], capture_output=True, text=True, timeout=60
    )
    assert "checksums   3 of 3 shards have none" in info.stdout

    added = ar.add_checksums(str(url))
    assert added.ok and added.shards_added == ["0", "1", "2"] and added.shards_already == []
    after = {f: f.read_bytes() for f in url.rglob("*") if f.is_file()}
    assert set(after) - set(before) == {url / s / "atlas_blocks.npy" for s in "012"} | {url / "atlas_manifest.npz"}
    assert all(after[f] == data for f, data in before.items()), "every other byte untouched"
    assert same(SpecReader(url).all(), examples), "the original reading rules are unaffected"
    assert ar.add_checksums(str(url)).shards_already == ["0", "1", "2"]
    assert ar.verify(str(url)).blocks_with_checksums == 30

    damage_block(url / "1", 4)
    with pytest.raises(ar.CorruptBlockError, match="checksum mismatch") as caught:
        ar.open(str(url))[145]
    assert (caught.value.shard, caught.value.block) == ("1", 4)


def test_checksum_refuses_a_shard_whose_blocks_do_not_decode(tmp_path):
    url = tmp_path / "ds"
    write(str(url), sample_examples(300), checksums=False)
    data = bytearray((url / "2" / "data.bin").read_bytes())
    data[5:25] = bytes(20)  # the first block of shard 2 no longer decodes
    (url / "2" / "data.bin").write_bytes(bytes(data))
    result = subprocess.run(
        [sys.executable, "-m", "atlas_remote.cli", "checksum", str(url)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 1 and "shard 2 block 0" in result.stdout
    assert (url / "0" / "atlas_blocks.npy").exists() and not (url / "2" / "atlas_blocks.npy").exists()
