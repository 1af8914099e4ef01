"""The epoch plan and its checkpoints, as pure functions: every rule checked for every input hypothesis finds.

Ranks and workers are simulated in one process: a stream is a piece of the deal, served batch by batch.
"""

from __future__ import annotations

import json
from collections import Counter

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from atlas_remote.checkpoint import Deal, EpochState, complement, cut, intervals, round_robin
from atlas_remote.plan import EpochPlan, Layout, Source, shares

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


@given(layouts, knobs, st.integers(0, 3))
def test_an_epoch_serves_every_example_once(layout, knob, epoch):
    plan = plan_of(layout, knob, epoch)
    assert plan.size == len(layout)
    assert sorted(e for _, e in example_ids(plan, 0, plan.size)) == list(range(len(layout)))


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


@given(layouts, knobs, st.integers(0, 300))
def test_a_source_upsampled_or_cut_gives_exactly_its_count(layout, knob, count):
    plan = plan_of(layout, knob, count=count)
    served = Counter(e for _, e in example_ids(plan, 0, plan.size))
    assert sum(served.values()) == (count if len(layout) else 0)
    if len(layout):
        cycles = count // len(layout)
        assert set(served.values()) <= {cycles, cycles + 1}


@given(layouts, knobs)
def test_the_order_depends_on_seed_and_epoch_only(layout, knob):
    a, b = plan_of(layout, knob, 1), plan_of(layout, knob, 1)
    assert example_ids(a, 0, a.size) == example_ids(b, 0, b.size)


def test_epochs_differ():
    layout = Layout.of([500] * 4, [10] * 4)
    orders = [example_ids(plan_of(layout, (4, 2, 3), e), 0, 2000) for e in range(3)]
    assert orders[0] != orders[1] != orders[2]


@given(st.lists(st.tuples(st.integers(0, 50), st.integers(0, 50)), max_size=8), st.integers(0, 120))
def test_interval_algebra(pairs, size):
    merged = intervals(pairs)
    covered = {p for a, b in pairs for p in range(a, b)}
    assert set(served_by(None, merged)) == covered
    assert np.all(merged[1:, 0] > merged[:-1, 1])
    rest = complement(intervals([(min(a, size), min(b, size)) for a, b in pairs]), size)
    assert set(served_by(None, rest)) == set(range(size)) - covered
    sequence = served_by(None, merged)
    assert served_by(None, cut(merged, 3, 11)) == sequence[3:11]


def run_job(
    plan: EpochPlan,
    state: EpochState,
    ranks: int,
    workers: int,
    batch: int,
    drop_last: bool,
    stop_after: int | None = None,
):
    """Serve a deal as a job would: every rank yields batches from its workers in turn, all ranks in step;
    stop after `stop_after` batches per rank (None: the whole epoch). Returns (positions served, state after)."""
    deal = Deal(plan, state, ranks * max(workers, 1), batch, drop_last)
    per_rank = deal.batches_per_stream * max(workers, 1)
    seen = per_rank if stop_after is None else min(stop_after, per_rank)
    counts = round_robin(seen, workers, deal.batches_per_stream) * ranks
    positions = []
    for piece, b in zip(deal.pieces, counts):
        positions += served_by(plan, cut(piece, 0, min(b * batch, deal.per_stream)))
    return positions, deal.served_after(counts), deal


def padding_of(deal: Deal) -> int:
    """Positions a deal serves twice to make its pieces equal (drop_last=False)."""
    return deal.per_stream * deal.streams - (deal.plan.size - sum(int(b - a) for a, b in deal.base.served.tolist()))


def check_exact(plan: EpochPlan, positions: list[int], deals: list[Deal], drop_last: bool) -> None:
    """The multiset check: every position of the epoch once, plus no more repeats than the deals' stated
    padding (drop_last=False), or no repeats and no more left out than the deals' stated drop (drop_last=True)."""
    counts = Counter(positions)
    assert set(counts) <= set(range(plan.size))
    if drop_last:
        assert max(counts.values(), default=1) == 1
        assert plan.size - len(counts) <= sum(d.streams * d.batch_size for d in deals)
    else:
        assert set(counts) == set(range(plan.size))
        assert sum(counts.values()) - plan.size <= sum(padding_of(d) for d in deals)


topologies = st.sampled_from([(32, 1, 16, 1), (8, 1, 64, 1), (4, 1, 6, 1), (1, 2, 1, 8), (1, 8, 1, 2), (2, 3, 3, 2)])


@settings(max_examples=60, deadline=None)
@given(layouts, knobs, topologies, st.integers(1, 7), st.booleans(), st.integers(0, 40))
def test_resume_at_any_step_on_any_topology_serves_the_epoch_exactly(layout, knob, topology, batch, drop_last, stop):
    """Checkpoint after `stop` batches per rank on one topology (32->16, 8->64, 4->6 ranks; 2->8, 8->2 workers),
    resume on another through JSON: what was served before and after is exactly the epoch."""
    ranks, workers, new_ranks, new_workers = topology
    plan = plan_of(layout, knob)
    base = EpochState(seed=plan.seed, plan=plan.digest())
    before, state, first = run_job(plan, base, ranks, workers, batch, drop_last, stop)
    state = EpochState.from_dict(json.loads(json.dumps(state.to_dict())))
    state.check(plan)
    deals, after = [first], []
    if state.epoch == 0:
        after, end, second = run_job(plan, state, new_ranks, new_workers, batch, drop_last)
        assert end.epoch == 1 and not len(end.served)
        deals.append(second)
    check_exact(plan, before + after, deals, drop_last)


@settings(max_examples=40, deadline=None)
@given(layouts, knobs, st.integers(1, 5), st.integers(0, 30), st.integers(0, 30))
def test_a_second_resume_and_one_across_the_epoch_boundary(layout, knob, batch, first_stop, second_stop):
    plan = plan_of(layout, knob)
    base = EpochState(seed=plan.seed, plan=plan.digest())
    a, state, _ = run_job(plan, base, 4, 2, batch, True, first_stop)
    b, state, _ = run_job(plan, state, 3, 1, batch, True, second_stop) if state.epoch == 0 else ([], state, None)
    c, state, _ = run_job(plan, state, 2, 2, batch, True) if state.epoch == 0 else ([], state, None)
    served = a + b + c
    assert len(served) == len(set(served))  # nothing twice
    assert state.epoch == 1 and len(state.served) == 0  # and then the next epoch starts from nothing
    nxt = plan_of(layout, knob, epoch=state.epoch)
    d, state, _ = run_job(nxt, state, 2, 1, batch, False)
    assert set(d) == set(range(nxt.size))


@settings(max_examples=60, deadline=None)
@given(layouts, knobs, st.sampled_from([(1, 1), (2, 1), (4, 2), (3, 3), (5, 1)]), st.integers(1, 9), st.booleans())
def test_every_rank_yields_the_same_number_of_batches(layout, knob, topology, batch, drop_last):
    ranks, workers = topology
    deal = Deal(plan_of(layout, knob), EpochState(), ranks * workers, batch, drop_last)
    per_stream = {-(-total_len // batch) for total_len in (int((p[:, 1] - p[:, 0]).sum()) for p in deal.pieces)}
    assert len(per_stream) == 1


def test_a_state_from_another_plan_is_refused():
    layout = Layout.of([100, 100], [10, 10])
    state = EpochState(seed=3, plan=plan_of(layout, (4, 2, 3)).digest())
    with pytest.raises(ValueError, match="another epoch plan"):
        state.check(plan_of(Layout.of([100, 99], [10, 10]), (4, 2, 3)))
    with pytest.raises(ValueError, match="another epoch plan"):
        state.check(plan_of(layout, (8, 2, 3)))
    with pytest.raises(ValueError, match="not an atlas_remote epoch state"):
        EpochState.from_dict({"epoch": 1})


# -- mixtures --------------------------------------------------------------------------------------------


def mixture_plan(sizes, counts, seed=0, epoch=0, window_blocks=4, run_blocks=2) -> EpochPlan:
    sources = [Source(Layout.of([n // 2, n - n // 2], [5, 5]), c) for n, c in zip(sizes, counts)]
    return EpochPlan(sources, seed, epoch, window_blocks, run_blocks)


@settings(max_examples=50, deadline=None)
@given(st.lists(st.integers(1, 400), min_size=2, max_size=4), st.data())
def test_a_mixture_keeps_its_proportions_in_every_prefix_within_one_window(sizes, data):
    weights = data.draw(st.lists(st.floats(0.05, 1), min_size=len(sizes), max_size=len(sizes)))
    counts = shares(weights, sum(sizes))
    plan = mixture_plan(sizes, counts)
    served = [0] * len(sizes)
    window_cap = 4 * 5  # window_blocks x block size
    for w in range(len(plan)):
        d, examples = plan.window(w)
        served[d] += len(examples)
        done = served[d] / counts[d]
        for other, c in enumerate(counts):
            if c:  # no source is more than one window behind the one just served
                assert served[other] / c >= done - window_cap / c - 1e-9
    assert served == counts


@settings(max_examples=30, deadline=None)
@given(st.lists(st.integers(1, 300), min_size=2, max_size=3), st.data())
def test_repeat_and_choose_are_exact(sizes, data):
    repeats = data.draw(st.lists(st.sampled_from([0.5, 1, 1.5, 2, 3.25]), min_size=len(sizes), max_size=len(sizes)))
    counts = [round(r * n) for r, n in zip(repeats, sizes)]
    plan = mixture_plan(sizes, counts)
    by_source = Counter(d for d, _ in example_ids(plan, 0, plan.size))
    assert [by_source[d] for d in range(len(sizes))] == counts


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


@settings(max_examples=20, deadline=None)
@given(st.integers(1, 32), st.integers(1, 8), st.integers(0, 100))
def test_round_robin_counts(workers, per_worker, seen):
    counts = round_robin(seen, workers, per_worker)
    assert sum(counts) == min(seen, workers * per_worker)
    assert max(counts) - min(counts) <= 1


@given(st.integers(0, 5000), st.integers(0, 2**32))
def test_the_permutation_is_a_bijection_with_an_inverse(n, key):
    from atlas_remote.plan import Permutation

    order = Permutation(n, (key, 1))
    image = order(np.arange(n))
    assert sorted(image.tolist()) == list(range(n))
    assert order.inverse(image).tolist() == list(range(n))


@given(st.lists(st.integers(0, 80), min_size=1, max_size=8), st.integers(1, 9), knobs)
def test_window_sizes_match_the_runs_they_hold(sizes, block_size, knob):
    """The shortcut for shards of one block size (only last runs looked at) agrees with counting every run."""
    from atlas_remote.plan import Permutation, Runs

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


def rank_order(deal: Deal, rank: int, workers: int, taken: int) -> list[int]:
    """The positions a rank's DataLoader delivers from a deal once `taken` batches were taken: worker k serves
    the stream resume_point gives it, and the DataLoader takes a batch from each worker in turn."""
    streams = []
    for k in range(workers):
        turn, skip = deal.resume_point(workers, taken, k)
        positions = served_by(
            deal.plan, cut(deal.pieces[rank * workers + turn], skip * deal.batch_size, deal.per_stream)
        )
        streams.append([positions[i : i + deal.batch_size] for i in range(0, len(positions), deal.batch_size)])
    out = []
    for round_ in range(max(map(len, streams), default=0)):
        out += [p for s in streams if round_ < len(s) for p in s[round_]]
    return out


@settings(max_examples=60, deadline=None)
@given(layouts, knobs, st.integers(1, 3), st.integers(1, 4), st.integers(1, 6), st.booleans(), st.integers(0, 30))
def test_a_resume_on_the_same_topology_continues_exactly_as_an_uninterrupted_run(
    layout, knob, ranks, workers, batch, drop_last, stop
):
    """Every step: what a rank serves after the checkpoint (through JSON) is exactly what it would have served."""
    plan = plan_of(layout, knob)
    deal = Deal(plan, EpochState(seed=plan.seed, plan=plan.digest()), ranks * workers, batch, drop_last)
    state = EpochState.from_dict(json.loads(json.dumps(deal.state_after(workers, stop).to_dict())))
    for rank in range(ranks):
        whole = rank_order(deal, rank, workers, 0)
        if state.epoch == 1:
            assert stop >= deal.batches_per_stream * workers
            continue
        taken = state.segment.batches
        again = Deal(
            plan, EpochState(state.epoch, state.served, plan.seed, plan.digest()), ranks * workers, batch, drop_last
        )
        rest = rank_order(again, rank, workers, taken)
        assert whole[len(whole) - len(rest) :] == rest
        assert len(whole) - len(rest) == sum(
            min(b * batch, deal.per_stream) for b in round_robin(taken, workers, deal.batches_per_stream)
        )
