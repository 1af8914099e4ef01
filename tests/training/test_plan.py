"""The epoch plan, as pure functions: every rule checked for every input hypothesis finds; its order pinned;
what a process holds of it bounded. (Deals and checkpoints: training/test_checkpoint.py.)"""

from __future__ import annotations

import hashlib
import tracemalloc
from collections import Counter

import numpy as np
import pytest
from helpers import tries
from hypothesis import given, settings
from hypothesis import strategies as st

import atlas_remote.training.plan as plan_module
from atlas_remote.training.plan import EpochPlan, Layout, Source, shares

pytestmark = pytest.mark.unit  # no server, no process: the fast tier (pytest -m unit)

layouts = st.lists(st.tuples(st.integers(0, 60), st.integers(1, 9)), min_size=1, max_size=6).map(
    lambda shards: Layout.of([n for n, _ in shards], [b for _, b in shards])
)
knobs = st.tuples(st.integers(1, 12), st.integers(1, 4), st.integers(0, 2**32))


def plan_of(layout: Layout, knob, epoch: int = 0, count: int | None = None) -> EpochPlan:
    window_blocks, run_blocks, seed = knob
    return EpochPlan([Source(layout, len(layout) if count is None else count)], seed, epoch, window_blocks, run_blocks)


def served_by(plan: EpochPlan, spans) -> list[int]:
    """The positions a stream serves, in order."""
    return [p for a, b in np.asarray(spans).tolist() for p in range(a, b)]


def example_ids(plan: EpochPlan, start: int, stop: int) -> list[tuple[int, int]]:
    return [(d, int(e)) for _, d, examples in plan.examples(start, stop) for e in examples]


@settings(deadline=None)
@given(layouts, knobs, st.integers(0, 3))
def test_an_epoch_serves_every_example_once(layout, knob, epoch):
    plan = plan_of(layout, knob, epoch)
    assert plan.size == len(layout)
    assert sorted(e for _, e in example_ids(plan, 0, plan.size)) == list(range(len(layout)))


@settings(deadline=None)
@given(layouts, knobs)
def test_windows_are_whole_runs_of_one_shard(layout, knob):
    """Within a window, the examples of each run are consecutive blocks of one shard: block locality."""
    plan = plan_of(layout, knob)
    starts, ends = layout.starts, layout.starts + layout.sizes
    for w in range(len(plan)):
        _, examples = plan.window(w)
        shards = np.searchsorted(ends, examples, side="right")
        blocks = (examples - starts[shards]) // layout.block_sizes[shards]
        runs = {(int(s), int(b) // plan.run_blocks) for s, b in zip(shards, blocks)}
        assert len(runs) <= max(plan.window_blocks // plan.run_blocks, 1)


@settings(deadline=None)
@given(layouts, knobs, st.integers(0, 300))
def test_a_source_upsampled_or_cut_gives_exactly_its_count(layout, knob, count):
    plan = plan_of(layout, knob, count=count)
    served = Counter(e for _, e in example_ids(plan, 0, plan.size))
    assert sum(served.values()) == (count if len(layout) else 0)
    if len(layout):
        cycles = count // len(layout)
        assert set(served.values()) <= {cycles, cycles + 1}


@settings(deadline=None)
@given(layouts, knobs)
def test_the_order_depends_on_seed_and_epoch_only(layout, knob):
    a, b = plan_of(layout, knob, 1), plan_of(layout, knob, 1)
    assert example_ids(a, 0, a.size) == example_ids(b, 0, b.size)


def test_epochs_differ():
    layout = Layout.of([500] * 4, [10] * 4)
    orders = [example_ids(plan_of(layout, (4, 2, 3), e), 0, 2000) for e in range(3)]
    assert orders[0] != orders[1] != orders[2]


# -- mixtures --------------------------------------------------------------------------------------------


def mixture_plan(sizes, counts, seed=0, epoch=0, window_blocks=4, run_blocks=2) -> EpochPlan:
    sources = [Source(Layout.of([n // 2, n - n // 2], [5, 5]), c) for n, c in zip(sizes, counts)]
    return EpochPlan(sources, seed, epoch, window_blocks, run_blocks)


@settings(max_examples=tries(50), deadline=None)
@given(st.lists(st.integers(1, 400), min_size=2, max_size=4), st.data())
def test_a_mixture_keeps_its_proportions_in_every_prefix_within_one_mix_block(sizes, data):
    """Every prefix of the epoch's positions holds each source's share to within a block of `mix` positions
    (about a window's items) and one item per source; the whole epoch holds each source's count exactly."""
    weights = data.draw(st.lists(st.floats(0.05, 1), min_size=len(sizes), max_size=len(sizes)))
    counts = shares(weights, sum(sizes))
    plan = mixture_plan(sizes, counts)
    sources = np.array([d for d, _ in example_ids(plan, 0, plan.size)])
    served = np.zeros(len(sizes))
    for p in range(plan.size + 1):
        for d, c in enumerate(counts):
            if c:
                assert abs(served[d] / c - p / plan.size) <= (plan.mix + len(sizes)) / c + 1e-9
        if p < plan.size:
            served[sources[p]] += 1
    assert served.tolist() == counts


@settings(max_examples=tries(200), deadline=None)
@given(st.lists(st.integers(0, 50), min_size=2, max_size=4), st.data())
def test_the_merge_by_share_done_is_the_sorted_merge_of_every_item(counts, data):
    """mixed_taken(p) is exactly what the first p items of every source's items sorted by (share-done key,
    source) hold: item k of a source of count c keyed floor((k + 1) 2^scale / c)."""
    sources = [Source(Layout.of([n], [3]), n) for n in counts]
    plan = EpochPlan(sources, 1, 0, 4, 2)
    if not plan.mixed:
        return
    merged = sorted(((k + 1) * (1 << plan.scale) // c, d) for d, c in enumerate(counts) for k in range(c))
    taken = np.zeros(len(counts), dtype=np.int64)
    for p in sorted(set(data.draw(st.lists(st.integers(0, sum(counts)), max_size=12))) | {0, sum(counts)}):
        taken = np.bincount([d for _, d in merged[:p]], minlength=len(counts))
        assert plan.mixed_taken(p).tolist() == taken.tolist()


@settings(max_examples=tries(30), deadline=None)
@given(st.lists(st.integers(1, 300), min_size=2, max_size=3), st.data())
def test_repeat_and_choose_are_exact(sizes, data):
    repeats = data.draw(st.lists(st.sampled_from([0.5, 1, 1.5, 2, 3.25]), min_size=len(sizes), max_size=len(sizes)))
    counts = [round(r * n) for r, n in zip(repeats, sizes)]
    plan = mixture_plan(sizes, counts)
    by_source = Counter(d for d, _ in example_ids(plan, 0, plan.size))
    assert [by_source[d] for d in range(len(sizes))] == counts


@pytest.mark.slow
def test_over_a_thousand_epochs_each_share_holds():
    sizes, weights = [3000, 1000], [0.7, 0.3]
    counts = shares(weights, 2000)
    totals = Counter()
    seen = [set(), set()]
    for epoch in range(1000):
        plan = mixture_plan(sizes, counts, seed=1, epoch=epoch, window_blocks=8, run_blocks=4)
        for _, d, examples in plan.examples(0, plan.size):
            totals[d] += len(examples)
            if epoch < 20:
                seen[d].update(examples.tolist())
    for d, w in enumerate(weights):
        assert abs(totals[d] / sum(totals.values()) - w) <= 0.025
    assert len(seen[0]) > 2100 and len(seen[1]) == 1000  # a subsampled source shows other examples each epoch


def test_shares_sum_exactly():
    assert shares([0.7, 0.3], 10) == [7, 3]
    assert sum(shares([1, 1, 1], 100)) == 100
    with pytest.raises(ValueError):
        shares([0, 0], 10)


@settings(deadline=None)
@given(st.integers(0, 5000), st.integers(0, 2**32))
def test_the_permutation_is_a_bijection_with_an_inverse(n, key):
    from atlas_remote.training.plan import Permutation

    order = Permutation(n, (key, 1))
    image = order(np.arange(n))
    assert sorted(image.tolist()) == list(range(n))
    assert order.inverse(image).tolist() == list(range(n))


@settings(deadline=None)
@given(st.lists(st.integers(0, 80), min_size=1, max_size=8), st.integers(1, 9), knobs)
def test_window_sizes_match_the_runs_they_hold(sizes, block_size, knob):
    """The shortcut for shards of one block size (only last runs looked at) agrees with counting every run."""
    from atlas_remote.training.plan import Permutation, Runs

    for layout in (
        Layout.of(sizes, [block_size] * len(sizes)),
        Layout.of(sizes, [block_size + i % 2 for i in range(len(sizes))]),
    ):
        runs = Runs(layout, knob[1])
        if not len(runs):
            continue
        order = Permutation(len(runs), (knob[2], 0))
        per_window = max(knob[0] // knob[1], 1)
        ids = order(np.arange(len(runs)))
        counts = runs.spans(ids)[1]
        expected = [int(counts[i : i + per_window].sum()) for i in range(0, len(runs), per_window)]
        assert runs.window_sizes(order, per_window).tolist() == expected


# -- the order, pinned; windows worked out a chunk at a time -------------------------------------------------

U = Layout.of([100, 37, 0, 250, 64], [8, 8, 8, 8, 8])
V = Layout.of([60, 45, 0, 33, 7], [5, 7, 3, 4, 1])
W = Layout.of([500] * 6, [4] * 6)
# (sources, seed, epoch, window_blocks, run_blocks, shuffle): digest of the order, digest of the plan. The three
# mixtures were pinned again when mixtures came to be mixed inside batches (their plan digest changed with them,
# so a state saved for the order merged by windows is refused).
PINNED = {
    "uniform": (([Source(U, len(U))], 3, 1, 16, 2, True), "a73b37efde32821f", "07ece75adcc4d79f"),
    "mixed-block-sizes": (([Source(V, len(V))], 7, 0, 6, 2, True), "6e597b87d3de32ab", "16099f424698aea3"),
    "upsampled": (([Source(U, len(U) * 5 // 2)], 3, 4, 8, 1, True), "ffcea10c681972f6", "cd58c6821257be86"),
    "cut": (([Source(V, len(V) * 3 // 10)], 5, 2, 4, 2, True), "7fbe6424f2da1bbd", "a602fae44aa5f194"),
    "mixture": (
        ([Source(U, 300), Source(V, 140), Source(W, 900)], 11, 2, 8, 2, True),
        "1c5c8509ad7256eb",
        "6393136feb175727",
    ),
    "mixture-upsampled": (
        ([Source(V, 400), Source(U, 451), Source(Layout.of([], []), 5), Source(W, 0)], 2, 7, 12, 4, True),
        "b1c6f86169d6fc62",
        "73808dc3f177e4df",
    ),
    "unshuffled": (([Source(U, len(U)), Source(W, 1000)], 0, 0, 8, 2, False), "d78d8b446e8dd168", "43e9857ff04b0de8"),
    "small-windows": (([Source(W, len(W))], 9, 3, 1, 1, True), "00e075acc1603d0c", "298577ef70e4f102"),
}


def order_digest(plan: EpochPlan) -> str:
    """Every window's source and examples, positions read in stretches across windows, and window_of."""
    h = hashlib.sha256(f"{plan.size}/{len(plan)}".encode())
    for w in range(len(plan)):
        d, examples = plan.window(w)
        h.update(f"{d}:".encode() + np.asarray(examples, np.int64).tobytes())
    step = max(plan.size // 7, 1)
    for a in range(0, plan.size, step):
        for w, d, examples in plan.examples(a, min(plan.size, a + step + 3)):
            h.update(f"{w}/{d}:".encode() + np.asarray(examples, np.int64).tobytes())
    h.update(np.asarray([plan.window_of(p) for p in range(0, plan.size, 5)], np.int64).tobytes())
    return h.hexdigest()[:16]


@pytest.mark.parametrize("chunk", [1, 3, plan_module.CHUNK_WINDOWS])
@pytest.mark.parametrize("name", sorted(PINNED))
def test_the_order_is_the_one_released(name, chunk, monkeypatch):
    """Digests taken from the plan that kept an array per window (a single dataset's): working windows out a chunk
    at a time (of any size, down to one window) changes no example's place, and no checkpoint's meaning."""
    monkeypatch.setattr(plan_module, "CHUNK_WINDOWS", chunk)
    args, order, identity = PINNED[name]
    plan = EpochPlan(*args)
    assert (order_digest(plan), plan.digest()) == (order, identity)


CHUNK_WINDOWS = plan_module.CHUNK_WINDOWS
mixtures = st.lists(
    st.tuples(st.lists(st.tuples(st.integers(0, 40), st.integers(1, 6)), min_size=1, max_size=4), st.integers(0, 200)),
    min_size=1,
    max_size=4,
)


@settings(max_examples=tries(60), deadline=None)
@given(mixtures, knobs, st.integers(0, 3), st.integers(1, 5))
def test_chunks_of_any_size_give_the_order_of_one_chunk(sources, knob, epoch, chunk):
    """A mixture merged chunk by chunk (by share done) is the merge of the whole epoch at once."""
    window_blocks, run_blocks, seed = knob
    plan_sources = [Source(Layout.of([n for n, _ in s], [b for _, b in s]), count) for s, count in sources]

    def windows(size: int) -> list:
        plan_module.CHUNK_WINDOWS = size
        try:
            plan = EpochPlan(plan_sources, seed, epoch, window_blocks, run_blocks)
            return [(d, e.tolist()) for d, e in map(plan.window, range(len(plan)))] + [
                (w, d, e.tolist()) for w, d, e in plan.examples(0, plan.size)
            ]
        finally:
            plan_module.CHUNK_WINDOWS = CHUNK_WINDOWS

    assert windows(chunk) == windows(1 << 40)


def held_by_plan(layout: Layout, serve_from: float | None = None) -> int:
    """Bytes a plan of one epoch keeps (and, with serve_from, once a window at that fraction was served), once
    what a first plan imports and caches is out of the way."""

    def plan_of(layout: Layout) -> EpochPlan:
        plan = EpochPlan([Source(layout, len(layout))], seed=1, epoch=2, window_blocks=1, run_blocks=1)
        if serve_from is not None:
            start = int(plan.size * serve_from)
            next(plan.examples(start, start + 1))
        return plan

    plan_of(Layout.of([100] * 100, [1] * 100))
    tracemalloc.start()
    try:
        plan = plan_of(layout)
        assert plan.size == len(layout)
        return tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()


def test_a_plan_holds_what_its_shards_need_not_a_word_per_window():
    """100 shards in windows of one block: 10,000 windows, then 10,000,000 (an array per window would be
    160 MB). What the plan keeps grows by the chunk table only; serving a window adds one chunk."""
    small = held_by_plan(Layout.of([100] * 100, [1] * 100))
    large = held_by_plan(Layout.of([100_000] * 100, [1] * 100))
    assert large - small < 128 * 1024, (small, large)
    serving = held_by_plan(Layout.of([100_000] * 100, [1] * 100), serve_from=0.6)
    assert serving - large < 4 * 8 * plan_module.CHUNK_WINDOWS + 64 * 1024, (large, serving)
