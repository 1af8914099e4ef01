"""Nothing grows with the dataset that should not: shards open when needed, are forgotten past a byte bound, and
a stream's first batch opens only the shards of its first windows; a storm of 503s is waited out. (benchmarks/
scale.py measures the figures at 100,000 shards; these check the rules on 400 and 1,000.)"""

from __future__ import annotations

import pytest
from conftest import Faults
from helpers import write_dataset

import atlas_remote as ar

SHARDS, PER_SHARD = 400, 5


@pytest.fixture(scope="module")
def many_shards(tmp_path_factory):
    url = str(tmp_path_factory.mktemp("scale") / "ds")
    return write_dataset(url, [{"i": i} for i in range(SHARDS * PER_SHARD)], PER_SHARD, 1)


def test_a_reader_opens_only_the_shards_it_reads(many_shards):
    ds = ar.open(many_shards)
    assert ds.table.open_count == 0, "opening the dataset opens no shard"
    got = ds.get_many([7, 1003, 1999])
    assert [g["i"] for g in got] == [7, 1003, 1999]
    assert ds.table.open_count == 3 and ds.stats.requests["index"] == 3


def test_open_shards_are_forgotten_past_the_byte_bound(many_shards):
    ds = ar.open(many_shards, shard_cache_bytes=40_000)
    for shard in range(SHARDS):
        assert ds[shard * PER_SHARD]["i"] == shard * PER_SHARD
    one = ds.table.state(0).nbytes
    assert ds.table.open_count <= 40_000 // one + 1 < SHARDS
    assert ds[0]["i"] == 0 and ds.stats.requests["index"] > SHARDS, "a forgotten shard is opened again"


def test_a_streams_first_batch_opens_the_shards_of_its_first_windows_only(many_shards):
    from atlas_remote.training import ShuffledStream

    ds = ar.open(many_shards)
    stream = ShuffledStream(ds, 4, num_workers=0, window_blocks=4, run_blocks=1, prefetch=0, seed=3)
    first = next(iter(stream))
    assert len(first["i"]) == 4
    assert ds.stats.requests["index"] <= 4, dict(ds.stats.requests)
    assert len(stream) == SHARDS * PER_SHARD // 4


@pytest.fixture(scope="module")
def thousand_shards(tmp_path_factory):
    url = str(tmp_path_factory.mktemp("thousand") / "ds")
    return write_dataset(url, [{"i": i} for i in range(1000 * 4)], 4, 4)  # one block of 4 examples a shard


def test_a_stream_opens_the_shards_it_touches_and_its_prefetch_only(thousand_shards):
    """Three batches touch three shards of 1,000 (windows of one block); the stream keeps its next `prefetch`
    (by default 2) windows in flight, so at most five shards are opened, and nothing else."""
    from atlas_remote.training import ShuffledStream

    ds = ar.open(thousand_shards)
    stream = ShuffledStream(ds, 4, num_workers=0, window_blocks=1, run_blocks=1, seed=5)
    assert stream.prefetch == 2, "the default this test is about"
    batches = iter(stream)
    served = [int(i) for _ in range(3) for i in next(batches)["i"]]
    batches.close()  # waits for the fetches in flight
    touched = {i // 4 for i in served}
    assert len(touched) == 3 and len(served) == 12
    assert 3 <= ds.table.open_count <= 3 + stream.prefetch
    assert ds.stats.requests["index"] == ds.table.open_count, dict(ds.stats.requests)
    assert "meta" not in ds.stats.requests or ds.stats.requests["meta"] == 1, "no shard's meta.json"


def test_a_storm_of_slow_downs_during_a_stream_epoch_is_waited_out_exactly(s3, proxy_endpoint):
    """Half of the requests to the dataset (root, manifest, listing, indexes, checksums, blocks) answered 503
    SlowDown, 20 times from before it is opened, and the first requests for an index, a block and the root
    meta.json refused outright: a 2-worker epoch still serves every example exactly once."""
    from atlas_remote.training import ShuffledStream

    options, bucket, _ = s3
    url = write_dataset(f"s3://{bucket}/storm", [{"i": i} for i in range(400)], 50, 5, options)
    faults = Faults(proxy_endpoint)
    first_ones = [r"/storm/meta\.json", r"/storm/\d+/atlas_blocks\.npy", r"/storm/\d+/data\.bin"]
    faults.set(
        *({"path": path, "fault": "503", "times": 1} for path in first_ones),
        {"path": r"storm", "fault": "503", "times": 20, "every": 2},  # by count: a busy machine is slow to start
    )
    ds = ar.open(url, storage_options={**options, "endpoint_url": proxy_endpoint}, retries=1)
    stream = ShuffledStream(ds, 16, num_workers=2, window_blocks=4, run_blocks=1, seed=9)
    served = sorted(int(i) for batch in stream.loader() for i in batch["i"])
    assert served == list(range(400)), "every example once"
    report = faults.report()
    assert report["left"][:3] == [0, 0, 0], "the root, an index and a block were each refused once"
    assert report["injected"]["503"] >= 10, report["injected"]
