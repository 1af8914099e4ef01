"""Batched reads, read-ahead, O(1) open and the disk cache: request patterns, not timings."""

from __future__ import annotations

import multiprocessing
import os

import pytest
from helpers import same, sample_examples, upload_tree

import atlas_remote as ar
from atlas_remote import CompressionStrategy as CS
from atlas_remote.read import discovery
from atlas_remote.storage.ranges import ByteRange, coalesce


def write(url, examples, shard_size, block_size, strategy=CS.STANDARD_COMPRESSION, storage_options=None):
    with ar.AtlasDatasetWriter(url, shard_size, block_size, strategy, storage_options=storage_options) as w:
        for example in examples:
            w.add_example(example)


def test_coalesce_merges_within_gap_and_size_only():
    r = lambda s, e, p="a": ByteRange(p, s, e)
    merged = coalesce([r(0, 10), r(10, 20), r(25, 30), r(100, 110), r(0, 5, "b"), r(10, 20)], max_gap=5, max_bytes=1000)
    assert [(m.span.path, m.span.start, m.span.end, len(m.members)) for m in merged] == [
        ("a", 0, 30, 3),
        ("a", 100, 110, 1),
        ("b", 0, 5, 1),
    ]
    assert len(coalesce([r(0, 10), r(10, 20)], max_gap=0, max_bytes=15)) == 2
    assert len(coalesce([r(0, 10), r(12, 20)], max_gap=0, max_bytes=100)) == 2


def test_open_of_many_shards_is_constant_on_s3(s3, tmp_path, monkeypatch):
    options, bucket, fs = s3
    url = f"s3://{bucket}/many"
    write(str(tmp_path / "many"), list(range(120)), 1, 1, CS.NO_COMPRESSION)
    upload_tree(fs, tmp_path / "many", f"{bucket}/many")
    monkeypatch.setattr(discovery, "LISTED_AT_OPEN", 100)  # beyond one listing page: the manifest alone says
    ds = ar.open(url, storage_options=options)  # written locally: it has a manifest, which replaces the listing
    assert len(ds.shards) == 120 and len(ds) == 120
    assert dict(ds.stats.requests) == {"meta": 1, "manifest": 1}
    assert ds[110] == 110  # the shard's index and checksums, then its block
    assert dict(ds.stats.requests) == {"meta": 1, "manifest": 1, "index": 1, "block": 1}
    fs.rm(f"{bucket}/many/atlas_manifest.npz")
    ds = ar.open(url, storage_options=options)  # without one: a listing and the root's version (HEAD) too
    assert len(ds) == 120 and dict(ds.stats.requests) == {"meta": 1, "manifest": 1, "info": 1, "list": 1}


def test_iteration_over_a_range_with_readahead(memory_url):
    examples = sample_examples(500)
    write(memory_url, examples, 120, 7)
    ds = ar.open(memory_url, readahead=3)
    assert same(list(ds.iter(33, 401)), examples[33:401])
    assert same(list(ds.iter(-10)), examples[-10:])
    assert list(ds.iter(5, 5)) == []
    assert same(list(ar.open(memory_url, readahead=0)), examples)


def test_breaking_out_of_iteration_leaves_nothing_running(memory_url):
    write(memory_url, sample_examples(500), 100, 5)
    ds = ar.open(memory_url)
    for i, _ in enumerate(ds):
        if i == 3:
            break
    import threading

    assert not [t for t in threading.enumerate() if t.name.startswith("atlas-readahead")]


def test_fetch_error_reaches_every_waiting_reader(tmp_path):
    url = tmp_path / "ds"
    write(str(url), sample_examples(100), 50, 10)
    data = url / "1" / "data.bin"
    data.write_bytes(bytes(data.stat().st_size))
    ds = ar.open(str(url))
    for _ in range(2):  # a failed block is not cached as failed: the next read tries again
        with pytest.raises(ar.CorruptBlockError, match="shard 1 block 0 .*checksum mismatch"):
            ds.get_many([0, 55])
        with pytest.raises(ar.CorruptBlockError, match="shard 1 block 0 .*checksum mismatch"):
            ds[55]  # ds[i] takes its own one-block path
    assert ds.blocks._inflight == {}
    assert ds.stats.cache_misses == 6  # each failed read fetched again: two blocks twice, one block twice


def test_disk_cache_is_shared_by_processes(s3, tmp_path):
    options, bucket, _ = s3
    url = f"s3://{bucket}/ds"
    examples = sample_examples(200)
    write(url, examples, 100, 10, storage_options=options)
    disk = str(tmp_path / "cache")
    first = ar.open(url, storage_options=options, disk_cache=disk)
    assert same(first[:100], examples[:100]) and first.stats.requests["block"] == 1  # 10 touching blocks, merged
    assert first.stats.disk_misses == 10 and first.stats.requests["info"] == 1

    other = ar.open(url, storage_options=options, disk_cache=disk)
    assert same(other[:100], examples[:100])
    assert other.stats.requests["block"] == 0 and other.stats.disk_hits == 10

    # another process (spawned: nothing inherited) finds the blocks too
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(1, initializer=_configure_child, initargs=(options,)) as pool:
        value, block_requests, disk_hits = pool.map(_read_in_child_s3, [(url, disk, 42)])[0]
    assert same(value, examples[42]) and block_requests == 0 and disk_hits == 1


_child_options = {}


def _configure_child(options):
    _child_options.update(options)


def _read_in_child_s3(args):
    url, disk, index = args
    ds = ar.open(url, storage_options=_child_options, disk_cache=disk)
    return ds[index], ds.stats.requests["block"], ds.stats.disk_hits


def test_rewritten_dataset_is_never_served_from_the_disk_cache(tmp_path):
    url, disk = str(tmp_path / "ds"), str(tmp_path / "cache")
    old = [f"old-{i}" for i in range(40)]
    new = [f"new-{i}" for i in range(40)]  # same sizes: identical index.npy, different bytes
    write(url, old, 20, 5, CS.NO_COMPRESSION)
    assert ar.open(url, disk_cache=disk)[:] == old
    os.utime(url, None)
    with ar.AtlasDatasetWriter(url, 20, 5, CS.NO_COMPRESSION, overwrite=True) as w:
        for example in new:
            w.add_example(example)
    ds = ar.open(url, disk_cache=disk)
    assert ds[:] == new
    assert ds.stats.disk_hits == 0


def test_disk_cache_limits(tmp_path):
    with pytest.raises(ValueError, match="too small"):
        ar.open("memory://whatever", disk_cache=str(tmp_path / "c"), disk_cache_bytes=1000)
    url = str(tmp_path / "ds")
    write(url, [os.urandom(3_000_000)], 10, 1, CS.NO_COMPRESSION)
    ds = ar.open(url, disk_cache=str(tmp_path / "c"), disk_cache_bytes=16 * 1024 * 1024)
    with pytest.warns(ResourceWarning, match="fewer than 8 blocks"):
        ds[0]


def test_http_reads_without_listing(tmp_path):
    from static_server import serve

    examples = sample_examples(300)
    write(str(tmp_path / "ds"), examples, 100, 8, CS.SHARED_DICTIONARY_COMPRESSION)
    with serve(str(tmp_path)) as base:
        ds = ar.open(f"{base}/ds")
        assert dict(ds.stats.requests) == {"meta": 1, "manifest": 1} and len(ds) == 300
        assert same(ds[150], examples[150])
        opened = {"meta": 1, "manifest": 1, "index": 1, "dict": 1, "block": 1}
        assert dict(ds.stats.requests) == opened
        assert same(list(ds), examples)
