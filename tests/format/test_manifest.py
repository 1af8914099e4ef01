"""The manifest: every shard's metadata in one root object, never trusted for data."""

from __future__ import annotations

import io
import json

import numpy as np
import pytest
from helpers import same, write_dataset

import atlas_remote as ar
from atlas_remote import FormatError, discovery
from atlas_remote.cli import main
from atlas_remote.format.manifest import MANIFEST, Manifest, Sidecar
from atlas_remote.format.spec import AtlasDatasetShardMetadata, CompressionStrategy


def meta(stored: int, block: int = 8, strategy: int = 2) -> AtlasDatasetShardMetadata:
    return AtlasDatasetShardMetadata(1, block, stored, CompressionStrategy(strategy), 3, 0.01)


ROOT = b'{"version": 1, "shard_sizes": [100, 60, 0], "compression_strategy": 2}'


def small() -> Manifest:
    return Manifest.of(
        ROOT, [(2, meta(0), 0, True, 7), (0, meta(100), 5000, True, 8), (1, meta(60, 8, 1), 3100, False, 9)]
    )


def test_a_manifest_round_trips_and_describes_its_root():
    decoded = Manifest.decode(small().encode(), shards=3)
    assert decoded.numbers.tolist() == [0, 1, 2] and decoded.sizes.tolist() == [100, 60, 0]
    assert decoded.strategies.tolist() == [2, 1, 2] and decoded.checksums.tolist() == [True, False, True]
    assert decoded.describes(ROOT, [100, 60, 0])
    assert not decoded.describes(ROOT.replace(b"60", b"61"), [100, 61, 0]), "another root: stale"
    assert decoded.layout([0, 2]).sizes.tolist() == [100, 0]


def test_a_shard_that_disagrees_is_named():
    manifest = small()
    sums = Sidecar.CHECKSUMS
    assert manifest.check_shard(0, meta(100), 5000, 8, sums) is None
    assert "block_size 16 (manifest: 8)" in manifest.check_shard(0, meta(100, 16), 5000, 8, sums)
    assert "data.bin bytes 4999 (manifest: 5000)" in manifest.check_shard(0, meta(100), 4999, 8, sums)
    assert "index digest 5 (manifest: 8)" in manifest.check_shard(0, meta(100), 5000, 5, sums)
    assert "sidecar 2 (manifest: 1)" in manifest.check_shard(0, meta(100), 5000, 8, Sidecar.BLOCKS)
    assert "no entry" in manifest.check_shard(7, meta(100), 5000, 8, sums)


@pytest.mark.parametrize("damage", [lambda raw: raw[: len(raw) // 2], lambda raw: b"PK" + raw[2:40], lambda raw: b""])
def test_a_damaged_manifest_is_a_format_error(damage):
    with pytest.raises(FormatError, match="atlas-remote index"):
        Manifest.decode(damage(small().encode()), shards=3)


def test_a_manifest_of_a_hundred_thousand_shards_is_small():
    count = 100_000
    shards = Manifest(
        "x" * 64,
        np.arange(count),
        np.full(count, 10_000),
        np.full(count, 64),
        np.full(count, 2, np.uint8),
        np.random.default_rng(0).integers(900_000, 1_100_000, count),
        np.ones(count, bool),
        np.random.default_rng(1).integers(0, 2**32, count, dtype=np.uint32),  # digests do not compress
        np.full(count, 3, np.int32),
        np.full(count, 0.01),
    )
    raw = shards.encode()
    assert len(raw) < 1_000_000, f"{len(raw):,} bytes"
    assert Manifest.decode(raw, shards=count).data_bytes.tolist() == shards.data_bytes.tolist()


# -- every writer path commits a manifest that opens the dataset ------------------------------------------------

EXAMPLES = [{"i": i, "text": f"example {i}"} for i in range(60)]


@pytest.fixture
def on_s3(s3, monkeypatch):
    """(url maker, storage options) on S3, where only the manifest names the shards: a dataset this small would
    otherwise be listed at open too (discovery.LISTED_AT_OPEN)."""
    monkeypatch.setattr(discovery, "LISTED_AT_OPEN", 0)
    options, bucket, _ = s3
    return (lambda name: f"s3://{bucket}/{name}"), options


def cli(*args: str) -> None:
    with pytest.raises(SystemExit) as done:
        main([*args, "--quiet"])
    assert done.value.code == 0


def opens_from_its_manifest(url: str, options: dict, examples: list = EXAMPLES) -> ar.AtlasDataset:
    """Opened with the root meta.json and the manifest, no listing; every shard then opens from the manifest
    (no shard's meta.json fetched) and its index and checksums have the digests the manifest records."""
    ds = ar.open(url, storage_options=options)
    assert dict(ds.stats.requests) == {"meta": 1, "manifest": 1}, "no listing: the manifest named the shards"
    assert ds.manifest is not None and len(ds.manifest) == len(ds.shards) > 1
    assert same(ds[:], examples)
    assert ds.stats.requests["meta"] == 1 and ds.stats.requests["index"] == len(ds.shards)
    return ds


def test_the_writer_commits_a_manifest(on_s3):
    url, options = on_s3
    write_dataset(url("writer"), EXAMPLES, 20, 5, options)
    ds = opens_from_its_manifest(url("writer"), options)
    assert "info" not in ds.stats.requests, "no HEAD of data.bin: its size is in the manifest, blocks have CRCs"


def test_cp_commits_a_manifest(on_s3, tmp_path):
    url, options = on_s3
    local = write_dataset(str(tmp_path / "src"), EXAMPLES, 20, 5)
    cli("cp", local, url("cp"), "--dest-storage-options", json.dumps(options))
    opens_from_its_manifest(url("cp"), options)
    ar.copy_dataset(url("cp"), url("cp-again"), src_options=options, dest_options=options)  # server-side
    opens_from_its_manifest(url("cp-again"), options)


def test_convert_commits_a_manifest(on_s3, tmp_path):
    url, options = on_s3
    source = tmp_path / "rows.jsonl"
    source.write_text("".join(json.dumps(e) + "\n" for e in EXAMPLES))
    ar.convert(str(source), url("convert"), "jsonl", shard_size=20, block_size=5, dest_options=options)
    opens_from_its_manifest(url("convert"), options)


def test_index_adds_a_manifest_to_a_dataset_without_one(on_s3, s3):
    url, options = on_s3
    write_dataset(url("plain"), EXAMPLES, 20, 5, options, checksums=False)  # the original writer's files
    assert ar.open(url("plain"), storage_options=options).manifest is None
    cli("index", url("plain"), "--storage-options", json.dumps(options))
    ds = opens_from_its_manifest(url("plain"), options)
    assert s3[2].exists(f"{s3[1]}/plain/{MANIFEST}")
    # no checksums to fetch (the manifest says so), and nothing to check blocks against: data.bin's version is
    # asked for (a HEAD), and every block read is conditional on it
    assert "checksums" not in ds.stats.requests and ds.stats.requests["info"] == len(ds.shards)


# -- a stale manifest -------------------------------------------------------------------------------------------


def test_a_shard_swapped_for_another_datasets_is_named_and_the_others_still_read(on_s3, s3):
    """Shard 1's files replaced by those of another dataset of the same shape (a tool that does not know the
    manifest rewrote it): its index is not the one the manifest records, and reading it says so in one line."""
    url, options = on_s3
    fs, bucket = s3[2], s3[1]
    write_dataset(url("mine"), EXAMPLES, 20, 5, options)
    other = [{"i": -i, "text": f"other {i}!"} for i in range(60)]
    write_dataset(url("theirs"), other, 20, 5, options)
    for name in ("meta.json", "index.npy", "atlas_blocks.npy", "data.bin"):
        fs.copy(f"{bucket}/theirs/1/{name}", f"{bucket}/mine/1/{name}")
    ds = ar.open(url("mine"), storage_options=options)
    with pytest.raises(ar.FormatError) as stale:
        ds[25]
    message = str(stale.value)
    assert "\n" not in message and message.startswith(f"{url('mine')}/1/meta.json: shard 1: ")
    assert "manifest is stale" in message and "atlas-remote index URL" in message
    assert same(ds[:20] + ds[40:], EXAMPLES[:20] + EXAMPLES[40:]), "the other shards still read"
    cli("index", url("mine"), "--storage-options", json.dumps(options))
    with pytest.raises(ar.CorruptBlockError, match="moved here from another dataset"):
        ds.reopen()[25]  # re-indexed, the manifest keeps the seals: a shard of another dataset is never yours
    cli("checksum", url("mine"), "--storage-options", json.dumps(options))
    assert same(ds.reopen()[20:40], other[20:40]), "checked as a stranger's and signed again: the shard as it is now"


def test_checksums_added_to_an_indexed_dataset_are_in_its_manifest(tmp_path):
    """`atlas-remote checksum` on a dataset with a manifest rewrites it: a shard opened from a manifest that
    still said "no checksums" would never look at the new ones, and a flipped byte would be served."""
    url = str(tmp_path / "ds")
    write_dataset(url, EXAMPLES, 20, 5, checksums=False, compression_strategy=CompressionStrategy.NO_COMPRESSION)
    ar.add_manifest(url)
    assert ar.add_checksums(url).shards_added == ["0", "1", "2"]
    ds = ar.open(url)
    assert ds.manifest is not None and ds.manifest.checksums.all()
    data = tmp_path / "ds" / "1" / "data.bin"
    data.write_bytes(data.read_bytes().replace(b"example 27", b"exbmple 27"))  # same size, still a valid pickle
    with pytest.raises(ar.CorruptBlockError, match="checksum mismatch"):
        ds[27]


def test_an_older_manifest_is_named_as_such_not_damaged():
    """A /1 manifest has no level or dictionary-size columns: it was reported as damaged (a KeyError)."""
    buffer = io.BytesIO()
    header = json.dumps({"format": "atlas_remote.manifest/1", "root_sha256": ""}).encode()
    np.savez(buffer, header=np.frombuffer(header, np.uint8), numbers=np.arange(3))
    with pytest.raises(FormatError, match=r"not a manifest this version reads .*manifest/1.*atlas-remote index"):
        Manifest.decode(buffer.getvalue(), shards=3)
