"""Load: many threads on one dataset object, and memory that stays flat over a million reads."""

from __future__ import annotations

import random
import subprocess
import sys
import textwrap
import threading

import pytest
from helpers import same, sample_examples

import atlas_remote as ar
from atlas_remote import CompressionStrategy as CS


def hammer(ds, examples, threads: int, reads: int) -> list[str]:
    """Each thread reads random examples and checks them; returns what went wrong."""
    failures: list[str] = []

    def work(seed: int) -> None:
        rng = random.Random(seed)
        try:
            for _ in range(reads):
                i = rng.randrange(len(examples))
                if not same(ds[i], examples[i]):
                    failures.append(f"thread {seed}: wrong example at {i}")
                    return
        except Exception as err:  # reported, not swallowed: the test fails with it
            failures.append(f"thread {seed}: {type(err).__name__}: {err}")

    pool = [threading.Thread(target=work, args=(seed,)) for seed in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    return failures


@pytest.mark.slow
def test_sixteen_threads_times_five_thousand_reads(tmp_path):
    examples = sample_examples(3000)
    url = str(tmp_path / "ds")
    with ar.AtlasDatasetWriter(url, 500, 16, CS.SHARED_DICTIONARY_COMPRESSION) as w:
        for example in examples:
            w.add_example(example)
    ds = ar.open(url, cache_bytes=64 * 1024)  # a small cache: misses, evictions and shared fetches all happen
    assert hammer(ds, examples, threads=16, reads=5000) == []
    assert ds.stats.cache_misses > 188 and ds.stats.requests["index"] == 6  # every block, most more than once


def test_threads_over_s3(s3):
    options, bucket, _ = s3
    examples = sample_examples(600)
    url = f"s3://{bucket}/ds"
    with ar.AtlasDatasetWriter(url, 200, 8, storage_options=options) as w:
        for example in examples:
            w.add_example(example)
    ds = ar.open(url, storage_options=options, cache_bytes=32 * 1024)
    assert hammer(ds, examples, threads=16, reads=150) == []
    assert ds.stats.requests["index"] == 3


@pytest.mark.slow
def test_random_reads_keep_memory_flat(tmp_path):
    url = str(tmp_path / "ds")
    with ar.AtlasDatasetWriter(url, 5000, 16, CS.SHARED_DICTIONARY_COMPRESSION) as w:
        for example in sample_examples(20_000):
            w.add_example(example)
    cache = 256 * 1024  # well below the ~2 MB of decoded blocks: most reads evict and decode
    probe = textwrap.dedent(f"""
        import random, sys
        import atlas_remote as ar
        ds = ar.open({url!r}, cache_bytes={cache})
        rss = lambda: int(open("/proc/self/statm").read().split()[1]) * 4096
        rng = random.Random(0)
        for i in range(len(ds)):
            ds[i]                       # every index loaded and the cache full before the first measurement
        for _ in range(50_000):
            ds[rng.randrange(len(ds))]
        warm = rss()
        for _ in range(300_000):
            ds[rng.randrange(len(ds))]
        print(warm, rss(), ds.blocks.memory.current_bytes, ds.stats.cache_misses)
    """)
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout.split()
    warm, end, cached, misses = map(int, out)
    assert cached <= cache and misses > 150_000, "the cache must be too small for the data, or this proves nothing"
    assert end - warm < 8 * 1024 * 1024, f"RSS grew by {(end - warm) / 2**20:.1f} MiB over 300,000 reads"
