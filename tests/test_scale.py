"""Nothing grows with the dataset that should not: shards open when needed, are forgotten past a byte bound, and
a stream's first batch opens only the shards of its first windows. (benchmarks/scale.py measures the figures at
100,000 shards; these check the rules on 400.)"""

from __future__ import annotations

import pytest
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
