"""Block reads through obstore (the `obstore` extra): which stores it serves, and forked processes."""

from __future__ import annotations

import multiprocessing
import os

import pytest

import atlas_remote as ar
from atlas_remote import CompressionStrategy as CS
from atlas_remote.obstore_reads import obstore_reader
from helpers import same, sample_examples


@pytest.fixture
def s3_dataset(s3):
    options, bucket, _ = s3
    url, examples = f"s3://{bucket}/ds", sample_examples(120)
    with ar.AtlasDatasetWriter(url, 50, 10, CS.STANDARD_COMPRESSION, storage_options=options) as w:
        for example in examples:
            w.add_example(example)
    return url, options, examples


def test_blocks_come_through_obstore_one_request_each(s3_dataset):
    url, options, examples = s3_dataset
    ds = ar.open(url, storage_options=options, cache_bytes=0)
    assert ds.store.read_client == "obstore"
    assert same(ds.get_many([3, 64, 110]), [examples[3], examples[64], examples[110]])
    assert ds.stats.requests["block"] == 3
    assert same(list(ds), examples)


@pytest.mark.parametrize("url, options", [
    ("simplecache::s3://bucket/ds", {}),  # a chained URL: the caching layer must see every read
    ("gs://bucket/ds", {}),
    ("s3://bucket/ds", {"requester_pays": True}),  # an option obstore is not told about
    ("s3://bucket/ds", {"config_kwargs": {"s3": {"addressing_style": "virtual"}}}),
    ("s3://bucket/ds", {"s3_additional_kwargs": {"SSECustomerAlgorithm": "AES256"}}),  # SSE-C: headers per GET
])
def test_stores_obstore_would_not_serve_as_s3fs_does_stay_on_s3fs(url, options):
    assert obstore_reader(url, options, 5.0) is None


def test_region_unknown_on_aws_stays_on_s3fs(monkeypatch):
    """s3fs finds a bucket's region by asking; obstore would sign for the wrong one."""
    monkeypatch.setenv("AWS_CONFIG_FILE", os.devnull)  # no region from a config file of the machine's either
    monkeypatch.delenv("AWS_DEFAULT_REGION", raising=False)
    monkeypatch.delenv("AWS_REGION", raising=False)
    keys = {"key": "k", "secret": "s"}
    assert obstore_reader("s3://bucket/ds", keys, 5.0) is None
    assert obstore_reader("s3://bucket/ds", {**keys, "client_kwargs": {"region_name": "eu-west-1"}}, 5.0)
    assert obstore_reader("s3://bucket/ds", {**keys, "endpoint_url": "http://127.0.0.1:9"}, 5.0)


def read_in_child(url: str, options: dict, queue) -> None:
    ds = ar.open(url, storage_options=options, cache_bytes=0)
    queue.put((ds.store.read_client, ds[0:120]))


def in_forked_child(url: str, options: dict) -> tuple[str, list]:
    context = multiprocessing.get_context("fork")
    queue = context.Queue()
    child = context.Process(target=read_in_child, args=(url, options, queue))
    child.start()
    try:
        return queue.get(timeout=60)  # a child that used the parent's obstore runtime would hang here
    finally:
        child.join(10)
        child.kill()


def test_a_process_forked_after_obstore_ran_reads_through_s3fs(s3_dataset):
    url, options, examples = s3_dataset
    ds = ar.open(url, storage_options=options, cache_bytes=0)
    assert same(ds[7], examples[7]) and ds.store.read_client == "obstore"
    client, got = in_forked_child(url, options)
    assert client == "fsspec" and same(got, examples)
    assert ds.store.read_client == "obstore" and same(ds[99], examples[99]), "the parent keeps obstore"
