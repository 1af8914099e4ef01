"""The reader's parts: options, the pure read-ahead plan, concurrent shard opens, a pass that decompresses ahead."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from helpers import same, sample_examples

import atlas_remote as ar
from atlas_remote import CompressionStrategy as CS
from atlas_remote.read.readahead import Window, plan_windows, read_ahead, split_window


def write(url, examples, shard_size=100, block_size=10, strategy=CS.SHARED_DICTIONARY_COMPRESSION, **kw):
    with ar.AtlasDatasetWriter(url, shard_size, block_size, strategy, **kw) as w:
        for example in examples:
            w.add_example(example)


def test_options_are_one_frozen_value(tmp_path):
    options = ar.ReaderOptions(cache_bytes=1234, trusted=True)
    with pytest.raises(Exception):
        options.cache_bytes = 1  # frozen
    with pytest.raises(TypeError, match="unknown reader setting.*cache_byte"):
        ar.ReaderOptions.of(cache_byte=1)
    with pytest.raises(ValueError, match="max_concurrency"):
        ar.ReaderOptions(max_concurrency=0)
    url = str(tmp_path / "ds")
    write(url, sample_examples(50))
    ds = ar.open(url, options=options, readahead=0)  # keywords change the given options
    assert ds.options == ar.ReaderOptions(cache_bytes=1234, trusted=True, readahead=0)
    assert ds.table.options is ds.options  # the table reads the same value, not a copy of some of it
    assert ds.store.settings == ds.options.storage  # storage takes its own settings, made from the reader's


def test_windows_are_a_pure_function_of_the_offsets():
    offsets = np.array([0, 100, 250, 300, 900, 1000])  # five blocks of 10 examples
    assert [tuple(w) for w in plan_windows(offsets, 10, 0, 50, 300)] == [(0, 3, 0, 30), (3, 4, 30, 40), (4, 5, 40, 50)]
    assert [tuple(w) for w in plan_windows(offsets, 10, 15, 22, 10_000)] == [(1, 3, 15, 22)]
    window = next(plan_windows(offsets, 10, 15, 22, 10_000))
    block = list(range(10))
    assert block[window.slice_of(1, 10)] == [5, 6, 7, 8, 9] and block[window.slice_of(2, 10)] == [0, 1]
    # a pass's first window comes in two parts: the fewest first blocks holding an eighth of its bytes, the rest
    assert split_window(Window(0, 5, 0, 50), offsets, 10) == [(0, 2, 0, 20), (2, 5, 20, 50)]
    assert split_window(window, offsets, 10) == [(1, 2, 15, 20), (2, 3, 20, 22)]
    assert split_window(Window(3, 4, 30, 40), offsets, 10) == [(3, 4, 30, 40)]  # one block stays whole


def test_read_ahead_keeps_order_and_stops_early():
    started = []

    def fetch(item):
        started.append(item)
        return item * 2

    assert list(read_ahead(fetch, range(20), depth=3)) == [(i, 2 * i) for i in range(20)]
    started.clear()
    first = read_ahead(fetch, iter(range(1000)), depth=2)
    assert next(first) == (0, 0)
    first.close()
    assert len(started) <= 3, "items are drawn from the plan only as fetches are submitted"


def test_get_many_opens_untouched_shards_together(tmp_path, monkeypatch):
    """Four unopened shards in one batch are opened at the same time: each open waits at a barrier that only
    opens when all four are inside it, so opening them one after another would fail."""
    url = str(tmp_path / "ds")
    examples = sample_examples(400)
    write(url, examples)
    ds = ar.open(url, max_concurrency=8)
    barrier = threading.Barrier(4, timeout=30)
    table = ds.table
    real_open = table._open_locked

    def open_at_the_barrier(shard, *how):
        barrier.wait()
        return real_open(shard, *how)

    monkeypatch.setattr(table, "_open_locked", open_at_the_barrier)
    assert same(ds[[5, 105, 205, 305]], [examples[i] for i in (5, 105, 205, 305)])


def test_a_pass_names_the_block_that_does_not_decompress(tmp_path):
    """A pass decompresses a window of blocks in one call; when one of them is damaged, the error still names
    that block (the dataset is written without checksums, so zstd is what notices)."""
    url = tmp_path / "ds"
    examples = sample_examples(300)
    write(str(url), examples, checksums=False)
    index = np.load(url / "1" / "index.npy")
    data = bytearray((url / "1" / "data.bin").read_bytes())
    start, end = int(index[4]), int(index[5])
    data[start:end] = bytes(end - start)  # block 4 of shard 1 zeroed: not a zstd frame any more
    (url / "1" / "data.bin").write_bytes(bytes(data))
    ds = ar.open(str(url))
    seen = []
    with pytest.raises(ar.CorruptBlockError) as failed:
        for example in ds:
            seen.append(example)
    assert (failed.value.shard, failed.value.block) == ("1", 4)
    assert same(seen, examples[:100]), "every example before the damaged shard was served"
    assert same(list(ds.iter(150, 300)), examples[150:300])


@pytest.mark.parametrize("strategy", list(CS))
def test_a_local_pass_reads_each_byte_once_with_pread(tmp_path, strategy):
    url = str(tmp_path / "ds")
    examples = sample_examples(1000)
    write(url, examples, shard_size=300, block_size=7, strategy=strategy)
    ds = ar.open(url)
    assert same(list(ds), examples)
    stored = sum(int(s.offsets[-1]) for s in ds.shards)
    assert ds.stats.bytes["block"] == stored and ds.stats.requests["block"] == len(ds.shards)
