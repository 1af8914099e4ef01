"""The request pattern, proved with ds.stats over a real S3 endpoint (and memory:// where it is the same)."""

from __future__ import annotations

import pickle
import threading

import pytest
from helpers import same, sample_examples

import atlas_remote as ar
from atlas_remote import CompressionStrategy as CS
from atlas_remote.read import discovery

N, SHARD, BLOCK = 400, 100, 10  # 4 shards of 10 blocks


@pytest.fixture
def s3_dataset(s3):
    options, bucket, _ = s3
    url = f"s3://{bucket}/ds"
    examples = sample_examples(N, seed=3)
    with ar.AtlasDatasetWriter(url, SHARD, BLOCK, CS.SHARED_DICTIONARY_COMPRESSION, storage_options=options) as w:
        for example in examples:
            w.add_example(example)
    return url, options, examples


def test_open_costs_root_meta_and_manifest_in_one_round_trip(s3_dataset, monkeypatch):
    url, options, _ = s3_dataset
    monkeypatch.setattr(discovery, "LISTED_AT_OPEN", 3)  # this dataset's 4 shards are then "many"
    ds = ar.open(url, storage_options=options)
    assert dict(ds.stats.requests) == {"meta": 1, "manifest": 1}  # no listing: the manifest names every shard
    assert len(ds) == N and ds.stats.total_requests == 2  # the length needs no shard metadata


def test_a_dataset_of_few_shards_is_listed_too(s3_dataset):
    """Up to LISTED_AT_OPEN shards one listing page says which are present, as the original reader finds them."""
    url, options, _ = s3_dataset
    ds = ar.open(url, storage_options=options)
    assert dict(ds.stats.requests) == {"meta": 1, "manifest": 1, "list": 1}
    assert len(ds) == N and ds.manifest is not None


def test_without_a_manifest_open_costs_root_meta_its_version_and_one_listing(s3):
    options, bucket, _ = s3
    url = f"s3://{bucket}/plain"
    with ar.AtlasDatasetWriter(url, SHARD, BLOCK, checksums=False, storage_options=options) as w:
        for example in sample_examples(N, seed=3):
            w.add_example(example)
    ds = ar.open(url, storage_options=options)
    # the manifest's GET finds nothing; the root's version (a HEAD) tells a later rewrite of the same root bytes
    assert dict(ds.stats.requests) == {"meta": 1, "manifest": 1, "info": 1, "list": 1}
    assert len(ds) == N


def test_one_cold_example_is_one_block_request(s3_dataset):
    url, options, examples = s3_dataset
    ds = ar.open(url, storage_options=options)
    ds.reset_stats()
    assert same(ds[123], examples[123])
    # first touch of shard 1: its index and checksums with the shared dictionary in one round trip (its meta.json
    # and data.bin's size are in the manifest), then one ranged block read
    assert dict(ds.stats.requests) == {"index": 1, "dict": 1, "block": 1}
    block_bytes = ds.shards[1].block_range(2).size
    assert ds.stats.bytes["block"] == block_bytes


def test_every_example_of_one_block_costs_one_request_and_repeats_cost_none(s3_dataset):
    url, options, examples = s3_dataset
    ds = ar.open(url, storage_options=options)
    ds[0]
    ds.reset_stats()
    for i in range(BLOCK, 2 * BLOCK):
        assert same(ds[i], examples[i])
    assert dict(ds.stats.requests) == {"block": 1}
    for i in range(BLOCK, 2 * BLOCK):
        ds[i]
    assert dict(ds.stats.requests) == {"block": 1}
    assert ds.stats.cache_misses == 1 and ds.stats.cache_hits == 2 * BLOCK - 1


def test_many_blocks_of_a_shard_fetch_its_index_once(s3_dataset):
    url, options, examples = s3_dataset
    ds = ar.open(url, storage_options=options, readahead=0, max_gap_bytes=0, max_merged_bytes=1)
    got = [ds[i] for i in range(0, SHARD, BLOCK)]  # one example from each of shard 0's 10 blocks
    assert same(got, examples[0:SHARD:BLOCK])
    assert ds.stats.requests["index"] == 1 and ds.stats.requests["block"] == 10


def test_a_block_is_never_read_whole_file(s3_dataset):
    url, options, _ = s3_dataset
    ds = ar.open(url, storage_options=options)
    ds[5]
    data_size = int(ds.shards[0].offsets[-1])
    assert ds.stats.bytes["block"] == ds.shards[0].block_range(0).size < data_size


def test_batch_fetches_each_distinct_block_once_and_keeps_order(s3_dataset):
    url, options, examples = s3_dataset
    ds = ar.open(url, storage_options=options, max_gap_bytes=0, max_merged_bytes=1)
    wanted = [399, 5, 7, 250, 5, 251, 120, 0]  # blocks: (3,9) (0,0) (0,0) (2,5) (0,0) (2,5) (1,2) (0,0)
    ds.reset_stats()
    assert same(ds.get_many(wanted), [examples[i] for i in wanted])
    assert ds.stats.requests["block"] == 4
    assert same(ds[wanted], [examples[i] for i in wanted]) and ds.stats.requests["block"] == 4


def test_adjacent_blocks_merge_into_one_request(s3_dataset):
    url, options, examples = s3_dataset
    ds = ar.open(url, storage_options=options)
    ds[0]
    ds.reset_stats()
    assert same(ds[10:60], examples[10:60])  # blocks 1..5 of shard 0, contiguous in data.bin
    assert ds.stats.requests["block"] == 1


def test_concurrent_readers_of_one_missing_block_cause_one_request(s3_dataset):
    url, options, examples = s3_dataset
    ds = ar.open(url, storage_options=options)
    ds[0]
    ds.reset_stats()
    barrier = threading.Barrier(8)
    results = []

    def read():
        barrier.wait()
        results.append(ds[215])

    threads = [threading.Thread(target=read) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(same(r, examples[215]) for r in results) and len(results) == 8
    assert ds.stats.requests["block"] == 1 and ds.stats.requests["index"] == 1


def test_sequential_pass_reads_each_block_once(s3_dataset):
    url, options, examples = s3_dataset
    ds = ar.open(url, storage_options=options, cache_bytes=0)
    assert same(list(ds), examples)
    assert ds.stats.requests["index"] == 4 and ds.stats.requests["block"] <= 40
    assert ds.stats.bytes["block"] == sum(int(s.offsets[-1]) for s in ds.shards)


def test_cache_is_bounded_by_bytes(s3_dataset):
    url, options, examples = s3_dataset
    ds = ar.open(url, storage_options=options, cache_bytes=3000)
    for i in range(0, N, BLOCK):
        ds[i]
    assert 0 < ds.blocks.memory.current_bytes <= 3000


def test_dataset_pickles_small_and_reopens(s3_dataset):
    url, options, examples = s3_dataset
    ds = ar.open(url, storage_options=options, cache_bytes=1234)
    ds[:50]
    blob = pickle.dumps(ds)
    assert len(blob) < 1000
    clone = pickle.loads(blob)
    assert clone.options.cache_bytes == 1234 and clone.stats.requests["block"] == 0
    assert same(clone[399], examples[399])
