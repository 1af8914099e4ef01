"""Faults between us and S3 (a proxy injecting them): retried within bounds, visible, never decoded as data."""

from __future__ import annotations

import threading
import time

import pytest
from conftest import Faults
from helpers import same, sample_examples

import atlas_remote as ar
from atlas_remote import CompressionStrategy as CS
from atlas_remote import storage
from atlas_remote.storage import obstore_backend as obstore_module
from atlas_remote.storage import store as store_module


@pytest.fixture(params=["obstore", "fsspec"])
def faulty(request, s3, proxy_endpoint, monkeypatch):
    """(url of a dataset written directly, storage options that go through the proxy, faults, examples), with
    blocks read by either client (obstore with the `obstore` extra, s3fs without it or in a forked child)."""
    if request.param == "fsspec":
        monkeypatch.setattr(obstore_module, "obstore_backend", lambda *args: None)
    options, bucket, _ = s3
    examples = sample_examples(200)
    with ar.AtlasDatasetWriter(f"s3://{bucket}/ds", 100, 10, CS.STANDARD_COMPRESSION, storage_options=options) as w:
        for example in examples:
            w.add_example(example)
    through_proxy = {**options, "endpoint_url": proxy_endpoint}
    assert storage.Store(f"s3://{bucket}/ds", through_proxy).read_client == request.param  # makes no request
    faults = Faults(proxy_endpoint)
    faults.set()
    yield f"s3://{bucket}/ds", through_proxy, faults, examples
    faults.set()


def data_gets(report: dict, shard: str = "0") -> int:
    return sum(
        n for key, n in report["requests"].items() if key.startswith("GET") and key.endswith(f"/{shard}/data.bin")
    )


def test_throttling_is_retried_and_counted(faulty):
    url, options, faults, examples = faulty
    ds = ar.open(url, storage_options=options)
    faults.set({"method": "GET", "path": r"/0/data\.bin", "fault": "503", "times": 2})
    assert same(ds[5], examples[5])
    assert ds.stats.retries == 2 and faults.report()["injected"] == {"503": 2}
    assert data_gets(faults.report()) == 3


def test_a_pass_asks_for_its_first_blocks_while_the_shard_opens(faulty):
    """A pass over a shard not yet open asks for the start of its data.bin before the shard's index has come
    back (the blocks start at byte 0 whatever the index says): one round trip less before the first example."""
    url, options, faults, examples = faulty
    ds = ar.open(url, storage_options=options)
    faults.set({"method": "GET", "path": r"/0/index\.npy", "fault": "slow", "delay": 1, "times": 1})
    passed: list = []
    reader = threading.Thread(target=lambda: passed.extend(ds))
    reader.start()
    report = faults.report()
    while not data_gets(report) and reader.is_alive():
        time.sleep(0.01)
        report = faults.report()
    index_answered = any(key.endswith("/0/index.npy") for key in report["bytes_down"])
    reader.join()
    assert same(passed, examples)
    assert data_gets(report) == 1 and not index_answered, "data.bin was asked for only after the index came back"
    assert data_gets(faults.report()) == 1, "the first window came from that one read"


def test_a_pass_whose_early_read_fails_reads_its_blocks_again(faulty):
    """That early read is a guess: when it fails, the blocks are read as usual and nothing is counted a retry."""
    url, options, faults, examples = faulty
    ds = ar.open(url, storage_options=options)
    faults.set({"method": "GET", "path": r"/0/data\.bin", "fault": "500", "times": 1})
    assert same(list(ds), examples)
    assert faults.report()["injected"] == {"500": 1} and ds.stats.retries == 0
    assert data_gets(faults.report()) > 1


def test_persistent_failure_is_tried_retries_plus_one_times_then_named(faulty):
    url, options, faults, _ = faulty
    ds = ar.open(url, storage_options=options, retries=2)
    faults.set({"method": "GET", "path": r"/0/data\.bin", "fault": "500", "times": 1000})
    with pytest.raises(ar.StorageError, match=r"reading bytes \[\d+, \d+\)") as failed:
        ds[35]
    err = failed.value
    assert (err.url, err.path, err.shard, err.block) == (url, "0/data.bin", "0", 3) and err.byte_range is None
    assert str(err).startswith(f"{url}/0/data.bin: shard 0 block 3: reading bytes [")
    assert data_gets(faults.report()) == 3, "one layer of retries: no hidden retries in s3fs or botocore"


def test_dropped_connections_and_truncated_bodies_are_never_decoded(faulty):
    url, options, faults, examples = faulty
    ds = ar.open(url, storage_options=options, cache_bytes=0)
    faults.set(
        {"method": "GET", "path": r"/1/data\.bin", "fault": "drop", "times": 1},
        {"method": "GET", "path": r"/1/data\.bin", "fault": "truncate", "times": 2},
    )
    assert same(ds[100:200], examples[100:200])
    assert faults.report()["injected"] == {"drop": 1, "truncate": 2}
    # aiohttp itself re-sends a request once when the server closed a reused keep-alive connection
    assert ds.stats.retries in (2, 3)


def test_slow_response_times_out_and_is_retried(faulty):
    url, options, faults, examples = faulty
    ds = ar.open(url, storage_options=options, timeout=2.0)
    faults.set({"method": "GET", "path": r"/0/data\.bin", "fault": "slow", "delay": 6, "times": 1})
    assert same(ds[0], examples[0])
    # the block asked twice: cut off, then served (on a busy machine another request may time out as well)
    assert ds.stats.requests["block"] == 2 and ds.stats.retries >= 1


def test_a_server_that_trickles_is_cut_off_by_the_timeout(faulty):
    """One byte every 0.3 s never trips a socket timeout; the timeout bounds the whole request, on either client,
    and the read is retried and succeeds once the server answers normally again."""
    url, options, faults, examples = faulty
    ds = ar.open(url, storage_options=options, timeout=3.0, retries=1)
    faults.set({"method": "GET", "path": r"/0/data\.bin", "fault": "trickle", "delay": 0.3, "times": 1})
    started = time.monotonic()
    assert same(ds[0], examples[0])
    assert faults.report()["injected"] == {"trickle": 1} and ds.stats.requests["block"] == 2
    assert time.monotonic() - started < 30, "cut off, not waited out (the block takes minutes at this pace)"
    faults.set({"method": "GET", "path": r"/1/data\.bin", "fault": "trickle", "delay": 0.3, "times": 5})
    with pytest.raises(ar.StorageError, match="timeout|timed out|within"):
        ds[150]


def test_open_survives_faults_on_meta_and_manifest(faulty):
    url, options, faults, examples = faulty
    faults.set(
        {"method": "GET", "path": r"/ds/meta\.json", "fault": "503", "times": 1},
        {"method": "GET", "path": r"/ds/atlas_manifest\.npz", "fault": "drop", "times": 1},
        {"method": "GET", "path": r"/1/atlas_blocks\.npy", "fault": "500", "times": 2},
    )
    ds = ar.open(url, storage_options=options)
    assert len(ds) == 200 and same(ds[150], examples[150])
    assert faults.report()["injected"] == {"503": 1, "drop": 1, "500": 2}


def test_writer_survives_faults(s3, proxy_endpoint):
    options, bucket, _ = s3
    faults = Faults(proxy_endpoint)
    faults.set(
        {"method": "PUT", "path": r"data\.bin", "fault": "503", "times": 2},
        {"method": "PUT", "path": r"/ds/meta\.json", "fault": "drop", "times": 1},
        {"method": "PUT", "path": r"index\.npy", "fault": "500", "times": 1},
    )
    url, through = f"s3://{bucket}/ds", {**options, "endpoint_url": proxy_endpoint}
    examples = sample_examples(250)
    try:
        with ar.AtlasDatasetWriter(url, 100, 10, storage_options=through) as w:
            for example in examples:
                w.add_example(example)
        assert faults.report()["injected"] == {"503": 2, "drop": 1, "500": 1}
    finally:
        faults.set()
    assert same(ar.open(url, storage_options=options)[:], examples)


def test_writer_that_cannot_commit_leaves_no_dataset_until_recovered(s3, proxy_endpoint):
    options, bucket, fs = s3
    faults = Faults(proxy_endpoint)
    faults.set({"method": "PUT", "path": r"/ds/meta\.json", "fault": "500", "times": 1000})  # 503 is waited out
    url, through = f"s3://{bucket}/ds", {**options, "endpoint_url": proxy_endpoint}
    examples = sample_examples(150)
    try:
        with pytest.raises(ar.CommitInterruptedError, match="atlas-remote recover") as interrupted:
            with ar.AtlasDatasetWriter(url, 100, 10, storage_options=through) as w:
                for example in examples:
                    w.add_example(example)
    finally:
        faults.set()
    cause = interrupted.value.__cause__
    assert isinstance(cause, ar.StorageError) and (cause.url, cause.path) == (url, "meta.json")
    with pytest.raises(ar.DatasetNotFoundError, match="a commit here was interrupted"):
        ar.open(url, storage_options=options)
    assert "finished an interrupted commit" in str(ar.recover(url, storage_options=options))
    assert same(ar.open(url, storage_options=options)[:], examples)
    assert not fs.exists(f"{bucket}/ds/.atlas-staging") and not fs.exists(f"{bucket}/ds/.atlas-lease")


def test_large_uploads_through_the_proxy_use_expect_100_continue(s3, proxy_endpoint):
    import os

    options, bucket, _ = s3
    faults = Faults(proxy_endpoint)
    faults.set({"method": "PUT", "path": r"data\.bin", "fault": "503", "times": 1})
    url, through = f"s3://{bucket}/big", {**options, "endpoint_url": proxy_endpoint}
    examples = [os.urandom(40_000) for _ in range(120)]  # shards of about 2.4 MB: botocore asks to continue
    try:
        with ar.AtlasDatasetWriter(url, 60, 10, CS.NO_COMPRESSION, storage_options=through) as w:
            for example in examples:
                w.add_example(example)
        assert faults.report()["requests"].get("Expect: 100-continue", 0) >= 2
    finally:
        faults.set()
    assert ar.open(url, storage_options=options)[:] == examples


def test_a_storm_of_slow_downs_is_waited_out_and_the_epoch_is_exact(faulty):
    """Every GET answered 503 SlowDown for 2 s, then half of them for 2 s more: with retries=1 a count of
    attempts would give up at once; throttling is retried for as long as it lasts, with fewer requests in flight."""
    url, options, faults, examples = faulty
    ds = ar.open(url, storage_options=options, retries=1, readahead=2)
    faults.set(
        {"method": "GET", "path": r"/data\.bin", "fault": "503", "times": 10**6, "seconds": 2},
        {"method": "GET", "path": r"/data\.bin", "fault": "503", "times": 10**6, "seconds": 4, "every": 2},
    )
    assert same(list(ds), examples)
    assert faults.report()["injected"]["503"] >= 5 and ds.stats.retries >= 5


def test_the_pace_halves_when_throttled_and_creeps_back():
    pace = storage.Pace(32)
    for expected in (16, 8, 4, 2, 1, 1):
        pace.after(throttled=True)
        assert pace.in_flight == expected
    for expected in range(2, 33):
        pace.after(throttled=False)
        assert pace.in_flight == expected
    pace.after(throttled=False)
    assert pace.in_flight == 32


def test_one_whole_answer_to_a_ranged_read_does_not_poison_the_reader(faulty, monkeypatch):
    """A proxy that once answered a ranged GET with the whole object made every later read of the dataset object
    fail for good, the server healthy. Reads fail at once for a while (no whole downloads), then ask again."""
    url, options, faults, examples = faulty
    ds = ar.open(url, storage_options=options)
    faults.set({"method": "GET", "path": r"/0/data\.bin", "fault": "whole", "times": 1})
    if ds.store.read_client == "obstore":  # obstore checks the answer's range itself, and the read is retried
        assert same(ds[0], examples[0])
    else:
        with pytest.raises(ar.RangeNotSupportedError, match="ignores Range"):
            ds[0]
        with pytest.raises(ar.RangeNotSupportedError):
            ds[15]  # at once, no download
        monkeypatch.setattr(store_module, "RANGE_RECHECK_SECONDS", 0.0)
    assert faults.report()["injected"] == {"whole": 1}
    assert same(ds[0], examples[0]) and same(ds[150], examples[150])


def test_a_port_holding_503_is_not_a_store_asking_to_slow_down(monkeypatch):
    """An HTTP server on port 503 that cannot be reached was retried as throttled for 120 s, whatever `retries`
    said: the connection's error named ('127.0.0.1', 503)."""
    monkeypatch.setattr(storage.retry, "THROTTLED_FOR_AT_MOST_SECONDS", 20.0)
    started = time.monotonic()
    with pytest.raises(ar.StorageError, match="cannot reach the storage server"):
        ar.open("http://127.0.0.1:503/ds", retries=0, timeout=5)
    assert time.monotonic() - started < 10


def test_a_port_holding_412_is_not_a_failed_precondition():
    """A conditional create on a GCS endpoint at port 412 that cannot be reached answered False ('the object is
    there at another version'), so a lease would have been called held; it must fail as unreachable."""
    store = storage.Store("gs://bucket/ds", {"endpoint_url": "http://127.0.0.1:412", "token": "anon"})
    with pytest.raises(ar.StorageError, match="cannot reach the storage server"):
        store.create("lease.json", b"{}")
