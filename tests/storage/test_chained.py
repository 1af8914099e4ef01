"""Chained URLs: fsspec's whole-file caches in front of S3, for users who want whole shards kept local."""

from __future__ import annotations

import pytest
from helpers import same, sample_examples

import atlas_remote as ar
from atlas_remote import CompressionStrategy as CS
from atlas_remote.storage import Store


@pytest.mark.parametrize("cache", ["simplecache", "filecache"])
def test_whole_file_cache_in_front_of_s3(s3, tmp_path, cache):
    options, bucket, fs = s3
    examples = sample_examples(250)
    with ar.AtlasDatasetWriter(f"s3://{bucket}/ds", 100, 10, CS.DICTIONARY_COMPRESSION, storage_options=options) as w:
        for example in examples:
            w.add_example(example)
    local = tmp_path / "cache"
    chained = {"s3": options, cache: {"cache_storage": str(local)}}
    ds = ar.open(f"{cache}::s3://{bucket}/ds", storage_options=chained)
    assert len(ds) == 250 and same(ds[:], examples) and same(ds[-1], examples[-1])
    cached = {p.read_bytes() for p in local.rglob("*") if p.is_file() and p.name != "cache"}  # "cache": filecache's own
    objects = {p: fs.cat_file(p) for p in fs.find(f"{bucket}/ds")}
    data_files = [p for p in objects if p.endswith("data.bin")]
    assert len(data_files) == 3 and all(objects[p] in cached for p in data_files), "whole shards kept locally"
    assert cached <= set(objects.values()), "no truncated download left in the cache"
    again = ar.open(f"{cache}::s3://{bucket}/ds", storage_options=chained)
    assert same(again[100:200], examples[100:200])


def test_reads_behind_a_caching_layer_go_one_by_one(s3, tmp_path):
    """In a batch, one missing object (the zstd_dict.bin of a shard that fell back to standard compression, as
    shard 2 above) cancelled the other downloads and left a truncated index.npy in the cache, read back empty."""
    options, bucket, _ = s3
    chained = {"s3": options, "simplecache": {"cache_storage": str(tmp_path)}}
    assert not Store(f"simplecache::s3://{bucket}/ds", chained).capabilities.batched
    assert Store(f"s3://{bucket}/ds", options).capabilities.batched
