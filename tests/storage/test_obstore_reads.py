"""Block reads through obstore (the `obstore` extra): which stores it serves, and forked processes."""

from __future__ import annotations

import json
import multiprocessing
import os
import subprocess
import sys

import pytest
from helpers import same, sample_examples

import atlas_remote as ar
from atlas_remote import CompressionStrategy as CS
from atlas_remote import storage
from atlas_remote.storage import obstore_backend as obstore_module
from atlas_remote.storage import obstore_config
from atlas_remote.storage.obstore_config import obstore_settings


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


READER = """
import json, sys
import atlas_remote as ar
ds = ar.open(sys.argv[1], storage_options=json.loads(sys.argv[2]), cache_bytes=0)
got = [ds[7], ds.get_many([0, 119]), list(ds.iter(40, 60))]
import fsspec.asyn
print(json.dumps({"client": ds.store.read_client, "s3fs": "s3fs" in sys.modules, "requests": ds.stats.requests,
                  "event_loop": fsspec.asyn.loop[0] is not None}))
"""


def test_a_reader_never_loads_s3fs(s3_dataset):
    """Reads, HEADs and listings all go through obstore, so a reading process skips s3fs and botocore's
    client, which cost about 0.35 s in a fresh process (time to first example)."""
    url, options, _ = s3_dataset
    run = subprocess.run(
        [sys.executable, "-c", READER, url, json.dumps(options)],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    facts = json.loads(run.stdout)
    assert facts["client"] == "obstore" and not facts["s3fs"], facts
    # a listing through obstore too (few shards: one page says which are present); no HEAD (sizes in the manifest)
    assert facts["requests"]["list"] == 1 and "info" not in facts["requests"], facts
    # obstore's blocking calls, not its coroutines: a coroutine's result reaches Python through obstore's runtime
    # threads, which then race the interpreter's shutdown (about one exit in 40 died with SIGABRT)
    assert not facts["event_loop"]


def test_heads_and_listings_answer_as_s3fs_does(s3_dataset, monkeypatch):
    """Same names, sizes and versions (a disk cache shared with an s3fs-reading process keys blocks on them), and
    a folder exists as it does for s3fs."""
    url, options, _ = s3_dataset
    through_obstore = storage.Store(url, options)
    monkeypatch.setattr(obstore_module, "obstore_backend", lambda *args: None)
    through_s3fs = storage.Store(url, options)
    assert through_obstore.read_client == "obstore" and through_s3fs.read_client == "fsspec"
    for store in (through_obstore, through_s3fs):
        assert store.exists("0") and store.exists("0/data.bin") and not store.exists("nothing")
        with pytest.raises(ar.ObjectNotFoundError):
            store.list_names("nothing")
    assert (
        through_obstore.list_names() == through_s3fs.list_names() == ["0", "1", "2", "atlas_manifest.npz", "meta.json"]
    )
    assert through_obstore.list_names("1") == through_s3fs.list_names("1")
    assert through_obstore.identity("1/data.bin") == through_s3fs.identity("1/data.bin")


@pytest.mark.parametrize(
    "url, options",
    [
        ("simplecache::s3://bucket/ds", {}),  # a chained URL: the caching layer must see every read
        ("gs://bucket/ds", {}),
        ("s3://bucket/ds", {"requester_pays": True}),  # an option obstore is not told about
        ("s3://bucket/ds", {"config_kwargs": {"s3": {"addressing_style": "virtual"}}}),
        ("s3://bucket/ds", {"s3_additional_kwargs": {"SSECustomerAlgorithm": "AES256"}}),  # SSE-C: headers per GET
    ],
)
def test_stores_obstore_would_not_serve_as_s3fs_does_stay_on_s3fs(url, options):
    assert obstore_settings(url, options) is None


def test_region_unknown_on_aws_stays_on_s3fs(monkeypatch):
    """s3fs finds a bucket's region by asking; obstore would sign for the wrong one."""
    monkeypatch.setenv("AWS_CONFIG_FILE", os.devnull)  # no region from a config file of the machine's either
    monkeypatch.delenv("AWS_DEFAULT_REGION", raising=False)
    monkeypatch.delenv("AWS_REGION", raising=False)
    keys = {"key": "k", "secret": "s"}
    assert obstore_settings("s3://bucket/ds", keys) is None
    assert obstore_settings("s3://bucket/ds", {**keys, "client_kwargs": {"region_name": "eu-west-1"}})
    assert obstore_settings("s3://bucket/ds", {**keys, "endpoint_url": "http://127.0.0.1:9"})


def test_botocore_is_asked_only_for_what_the_options_leave_open(monkeypatch, tmp_path):
    """Importing botocore's session costs 0.12 s of a fresh process's first example: keys, an endpoint and a
    region (from the options or AWS_DEFAULT_REGION, which botocore reads first too) need no session."""
    asked = []
    monkeypatch.setattr(obstore_config, "_botocore_session", lambda profile: asked.append(profile) or 1 / 0)
    for name in obstore_config.BOTOCORE_VARIABLES | {"AWS_DEFAULT_REGION"}:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", os.devnull)  # no ~/.aws/config
    keys = {"key": "k", "secret": "s", "endpoint_url": "http://127.0.0.1:9"}
    assert obstore_settings("s3://bucket/ds", keys) is not None
    (tmp_path / ".aws").mkdir()
    (tmp_path / ".aws" / "credentials").write_text("[default]\nregion = eu-west-1\n")
    monkeypatch.setenv("HOME", str(tmp_path))  # botocore reads profiles from this file too: it is asked
    assert obstore_settings("s3://bucket/ds", keys) is None and asked == [None]
    monkeypatch.setenv("AWS_DEFAULT_REGION", "eu-west-1")  # it comes before any file
    assert obstore_settings("s3://bucket/ds", keys) is not None and asked == [None]
    monkeypatch.setenv("HOME", os.devnull)
    assert obstore_settings("s3://bucket/ds", {"key": "k", "secret": "s"}) is not None and asked == [None]
    monkeypatch.setenv("AWS_CONFIG_FILE", os.devnull)  # it may name an endpoint: botocore is asked
    assert obstore_settings("s3://bucket/ds", {"key": "k", "secret": "s"}) is None and asked == [None, None]
    assert obstore_settings("s3://bucket/ds", {"endpoint_url": "http://127.0.0.1:9"}) is None, "credentials"
    assert asked == [None, None, None]


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


def test_a_panic_in_obstore_is_an_atlas_error(monkeypatch):
    """A BaseException from a client (obstore's PanicException, which `except Exception` misses) is never let
    through: here an endpoint obstore cannot parse, let past the check that refuses it first."""
    import importlib

    monkeypatch.setattr(importlib.import_module("atlas_remote.storage.connect"), "check_location", lambda *a: None)
    options = {"endpoint_url": "127.0.0.1:9", "key": "k", "secret": "s"}
    with pytest.raises(ar.ClientFailedError, match="PanicException") as failed:
        ar.open("s3://bucket/ds", storage_options=options)
    assert failed.value.url == "s3://bucket/ds" and "\n" not in str(failed.value)
