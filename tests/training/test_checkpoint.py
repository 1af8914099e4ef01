"""Deals and checkpoints of an epoch, with ranks and DataLoader workers simulated in one process.

A job here goes through the bookkeeping `ShuffledStream` itself uses (`Epochs`: the plan, the state, the deal):
each rank takes a batch from each of its workers in turn, as a DataLoader does, all ranks in step. What every
stream serves is read off its piece of the deal, so every rule is checked position by position: every position
of the epoch served, nothing twice beyond the deal's stated padding, nothing left out beyond its stated drop,
every rank the same number of batches, and a window's blocks read by one stream except where a piece's edge
cuts it. The last tests drive `ShuffledStream` itself (no DataLoader) through its `state_dict`.
"""

from __future__ import annotations

import json
import pickle
from collections import Counter
from unittest import mock

import numpy as np
import pytest
from helpers import tries
from hypothesis import given, settings
from hypothesis import strategies as st
from jobs import Job, Stand, layouts, positions

from atlas_remote.training import streams as training
from atlas_remote.training.epoch_state import Deal, EpochState, Segment, complement, cut, intervals, round_robin, split
from atlas_remote.training.mixture import Mixture
from atlas_remote.training.plan import EpochPlan, Layout, Source

pytestmark = pytest.mark.unit  # no server, no process: the fast tier (pytest -m unit)


knobs = st.tuples(st.integers(1, 12), st.integers(1, 4), st.integers(0, 2**32))


def check_exact(size: int, served: list[int], deals: list[Deal]) -> None:
    """Every position of [0, size) served once, but: with drop_last, the final deal's `dropped` never (and
    nothing twice); without, each deal's padding at most once more (the final deal's all of it)."""
    counts = Counter(served)
    assert set(counts) <= set(range(size))
    final = deals[-1]
    if final.drop_last:
        assert max(counts.values(), default=1) == 1, "nothing twice"
        assert size - len(counts) == final.dropped, "left out: exactly the final deal's drop"
    else:
        assert len(counts) == size, "every position served"
        twice = len(served) - size
        assert final.padding <= twice <= sum(d.padding for d in deals), "served twice: the deals' padding only"


def check_locality(deal: Deal) -> None:
    """A window is read by one stream unless a piece's edge (or a padding position) falls in it: counted over
    the deal, the windows' extra readers are at most the edges between pieces plus the padding. A mixture
    interleaves a window of every source, so an edge cuts one of each (two, where one of that source's windows
    ends in the block of positions mixed together at the edge)."""
    readers: dict[int, set[int]] = {}
    for s, piece in enumerate(deal.pieces):
        for a, b in piece.tolist():
            for w, _, _ in deal.plan.examples(a, b):
                readers.setdefault(w, set()).add(s)
    per_edge = 2 * len(deal.plan.active) if deal.plan.mixed else 1
    assert sum(len(r) - 1 for r in readers.values()) <= (deal.streams - 1) * per_edge + deal.padding


# -- a deal ------------------------------------------------------------------------------------------------


@settings(max_examples=tries(300), deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 40), st.integers(0, 6)), max_size=6),
    st.integers(0, 150),
    st.integers(1, 70),
    st.integers(1, 9),
    st.booleans(),
)
def test_a_deal_pads_or_drops_only_what_equal_batches_force(pairs, size, streams, batch, drop_last):
    """Pieces differ by one position at most; every stream yields the same number of batches; a position is
    repeated only when the lengths would straddle a multiple of batch_size, one per shorter piece; with
    drop_last, what does not fill a batch on every stream is left out, no more."""
    served = intervals([(min(a, size), min(a + n, size)) for a, n in pairs])
    plan = EpochPlan([Source(Layout.of([size], [3]), size)])
    deal = Deal(plan, served, streams, batch, drop_last)
    remaining = positions(complement(served, size))
    left = len(remaining)
    even, rest = divmod(left, streams)
    dealt = [positions(p) for p in deal.pieces]
    assert [len(d) for d in dealt] == deal.lengths.tolist()
    assert {-(-len(d) // batch) for d in dealt} == {deal.batches_per_stream}, "every stream the same batches"
    assert max(map(len, dealt)) - min(map(len, dealt)) <= 1, "a last batch at most one example smaller"
    flat = [p for d in dealt for p in d]
    if drop_last:
        assert set(map(len, dealt)) == {left // (streams * batch) * batch}, "whole batches only"
        assert len(set(flat)) == len(flat) and set(flat) <= set(remaining), "nothing twice"
        assert (deal.dropped, deal.padding) == (left % (streams * batch), 0), "left out: the least that must be"
        return
    forced = rest > 0 and even % batch == 0  # q and q + 1 positions would be different numbers of batches
    assert (deal.padding, deal.dropped) == (streams - rest if forced else 0, 0)
    own = [(s + 1) * left // streams - s * left // streams for s in range(streams)]
    unpadded = [d[:-1] if forced and n == even else d for d, n in zip(dealt, own)]
    assert [p for d in unpadded for p in d] == remaining, "pieces are runs of what is left, in order"
    for d, n in zip(dealt, own):
        if forced and n == even:  # the one repeated position: the piece's own first, or (if none) any left
            assert d[-1] == d[0] if n else d[-1] in remaining


@settings(max_examples=tries(100), deadline=None)
@given(st.lists(st.tuples(st.integers(0, 50), st.integers(0, 50)), max_size=8), st.integers(0, 120), st.data())
def test_interval_algebra(pairs, size, data):
    merged = intervals(pairs)
    covered = {p for a, b in pairs for p in range(a, b)}
    assert set(positions(merged)) == covered
    assert np.all(merged[1:, 0] > merged[:-1, 1])
    rest = complement(intervals([(min(a, size), min(b, size)) for a, b in pairs]), size)
    assert set(positions(rest)) == set(range(size)) - covered
    sequence = positions(merged)
    assert positions(cut(merged, 3, 11)) == sequence[3:11]
    offsets = sorted(data.draw(st.lists(st.integers(0, len(sequence) + 3), max_size=6)))
    pieces = split(merged, np.asarray([0, *offsets, len(sequence)], dtype=np.int64))
    bounds = [0, *offsets, len(sequence)]
    assert [positions(p) for p in pieces] == [sequence[a:b] for a, b in zip(bounds, bounds[1:])]


@settings(max_examples=tries(30), deadline=None)
@given(st.integers(1, 32), st.integers(1, 8), st.integers(0, 100))
def test_round_robin_counts(workers, per_worker, seen):
    counts = round_robin(seen, workers, per_worker)
    assert sum(counts) == min(seen, workers * per_worker)
    assert max(counts) - min(counts) <= 1


# -- a job resumed -----------------------------------------------------------------------------------------


@settings(max_examples=tries(25), deadline=None)
@given(
    layouts(4, 30),
    knobs,
    st.sampled_from([(1, 0), (2, 0), (1, 2), (2, 3), (3, 1)]),
    st.integers(1, 5),
    st.booleans(),
    st.integers(0, 2),
    st.sampled_from([1, 0.5, 2.5]),
)
def test_resume_from_every_step_then_again_then_across_the_epoch_end(
    layout, knob, topology, batch, drop_last, epoch, repeat
):
    """The same topology, a checkpoint after every step of the epoch (through JSON), then from every step of the
    resumed run a second checkpoint: each resumed run serves exactly what the uninterrupted run had left, in its
    order, rank by rank. Epochs 1 and 2 of an upsampled source included (MosaicML Streaming #869); after the
    last step the state is the next epoch's start, and the next epoch comes whole."""
    ranks, workers = topology
    data = Mixture([Stand(layout)], repeat=[repeat])
    size = round(repeat * len(layout))
    batch = max(batch, -(-size // (ranks * max(workers, 1) * 4)))  # at most about 4 batches a stream: small

    def job(state: EpochState | None = None) -> Job:
        fresh = Job(data, knob, ranks, workers, batch, drop_last)
        fresh.epochs.set_epoch(epoch)
        return fresh.load(state) if state is not None else fresh

    start = job()
    whole, deal = start.rank_batches(), start.epochs.deal()[0]
    served, end = start.take()
    check_exact(deal.plan.size, served, [deal])
    assert end == EpochState(epoch + 1, knob[2], deal.plan.digest())
    steps = len(whole[0])
    for stop in range(steps + 1):
        first, state = job().take(stop)
        if stop == steps:  # across the epoch's end: the next epoch, whole, as a fresh job serves it
            assert state.epoch == epoch + 1 and state.deals == ()
            following = Job(data, knob, ranks, workers, batch, drop_last)
            following.epochs.set_epoch(epoch + 1)
            assert job(state).rank_batches() == following.rank_batches()
            continue
        assert [rank[stop:] for rank in whole] == job(state).rank_batches()
        for again in range(stop, steps + 1):
            second, state2 = job(state).take(again - stop)
            rest = job(state2)
            if again == steps:
                assert state2.epoch == epoch + 1
                continue
            assert [rank[again:] for rank in whole] == rest.rank_batches()
            tail, finished = rest.take()
            assert finished.epoch == epoch + 1 and finished.deals == ()
            assert sorted(first + second + tail) == sorted(served)


topologies = st.sampled_from(
    [
        [(32, 0), (16, 0)],
        [(8, 0), (64, 0)],
        [(4, 0), (6, 0)],
        [(1, 2), (1, 8)],
        [(1, 8), (1, 2)],
        [(2, 3), (3, 2), (5, 0)],  # two changes within an epoch
        [(4, 2), (2, 8), (4, 2)],  # and back to the first shape: a fresh deal of what is left, not the old one
    ]
)


def sources():
    """One dataset, or a mixture through the Mixture API: weights, repeat or choose."""
    draw_layouts = layouts(4, 50)
    single = draw_layouts.map(lambda layout: Stand(layout))
    mixture = st.tuples(
        st.lists(draw_layouts, min_size=2, max_size=3),
        st.sampled_from(["weights", "repeat", "choose"]),
        st.lists(st.integers(1, 9), min_size=3, max_size=3),
    ).map(
        lambda m: Mixture(
            [Stand(layout, f"d{i}") for i, layout in enumerate(m[0])],
            **{
                "weights": {"weights": m[2][: len(m[0])]},
                "repeat": {"repeat": [w / 4 for w in m[2][: len(m[0])]]},
                "choose": {"choose": [w * 7 for w in m[2][: len(m[0])]]},
            }[m[1]],
        )
    )
    return st.one_of(single, mixture)


@settings(max_examples=tries(60), deadline=None)
@given(sources(), knobs, topologies, st.integers(1, 6), st.booleans(), st.lists(st.integers(0, 12), min_size=2))
def test_topology_changes_serve_the_epoch_exactly(data, knob, chain, batch, drop_last, stops):
    """32->16, 8->64, 4->6 ranks, 2->8 and 8->2 workers, two changes in one epoch; one dataset or a mixture:
    across the job every position is served exactly once but for the stated padding or drop, every rank of
    every deal yields the same number of batches (checked by `take`), and each deal reads a window with one
    stream but where a piece's edge cuts it."""
    state, served, deals = None, [], []
    for k, (ranks, workers) in enumerate(chain):
        job = Job(data, knob, ranks, workers, batch, drop_last)
        if state is not None:
            job.load(state)
        deal = job.epochs.deal()[0]
        check_locality(deal)
        deals.append(deal)
        more, state = job.take(None if k == len(chain) - 1 else stops[k % len(stops)])
        served += more
        if state.epoch == 1:
            break
    assert state.epoch == 1 and state.deals == ()
    check_exact(deal.plan.size, served, deals)


# -- mixtures, through the Mixture API ----------------------------------------------------------------------


@settings(max_examples=tries(40), deadline=None)
@given(st.lists(layouts(3, 60), min_size=2, max_size=3), st.data(), knobs, st.integers(0, 3))
def test_a_mixture_serves_each_dataset_exactly_its_count_every_epoch(mixed, data, knob, epoch):
    form = data.draw(st.sampled_from(["weights", "repeat", "choose"]))
    values = data.draw(st.lists(st.integers(1, 12), min_size=len(mixed), max_size=len(mixed)))
    if form == "repeat":
        values = [v / 4 for v in values]
    elif form == "choose":
        values = [v * 11 for v in values]
    mixture = Mixture([Stand(layout, f"d{i}") for i, layout in enumerate(mixed)], **{form: values})
    job = Job(mixture, knob, 2, 2, 3, False)
    job.epochs.set_epoch(epoch)
    plan, deal = job.epochs.plan(epoch), job.epochs.deal()[0]
    served, _ = job.take()
    check_exact(plan.size, served, [deal])  # every position once, and the deal's padding once more
    sources = Counter()
    for d, examples in map(plan.window, range(len(plan))):
        sources.update((d, int(e)) for e in examples)
    counts = mixture.counts([len(layout) for layout in mixed])
    for d, (count, layout) in enumerate(zip(counts, mixed)):
        own = [n for (s, _), n in sources.items() if s == d]
        assert sum(own) == (count if len(layout) else 0), "exactly the dataset's count"
        if len(layout):  # each example floor(count / size) times or once more: a different part each epoch
            assert set(own) <= {count // len(layout), count // len(layout) + 1}
            assert len(own) == min(count, len(layout))


# -- what a checkpoint weighs ------------------------------------------------------------------------------


def test_a_state_stays_small_however_many_streams_and_changes():
    """A job of 32 ranks x 2 workers goes on with 1,000 x 8, then 16 x 2, then 4 x 6, checkpointing part-way
    through each: the state is a few integers per deal (it was every stream's served interval, 190 KB after
    the 8,000 streams), and still exact."""
    layout = Layout.of([10_000] * 20, [16] * 20)
    data, knob, served, deals = Stand(layout), (64, 8, 7), [], []
    state = None
    for ranks, workers, steps in [(32, 2, 5), (1000, 8, 9), (16, 2, 7), (4, 6, None)]:
        job = Job(data, knob, ranks, workers, 2, False)
        if state is not None:
            job.load(state)
        deals.append(job.epochs.deal()[0])
        more, state = job.take(steps)
        served += more
        saved = json.dumps(state.to_dict())
        assert len(saved) <= 120 + 110 * len(state.deals), saved
    assert state.epoch == 1
    check_exact(len(layout), served, deals)


def test_a_malformed_or_foreign_state_is_refused_in_one_line():
    layout = Layout.of([100, 100], [10, 10])
    plan = EpochPlan([Source(layout, 200)], 3, 0, 4, 2)
    state = EpochState(seed=3, plan=plan.digest())
    with pytest.raises(ValueError, match="another epoch plan"):
        state.check(EpochPlan([Source(Layout.of([100, 99], [10, 10]), 199)], 3, 0, 4, 2))
    with pytest.raises(ValueError, match="another epoch plan"):
        state.check(EpochPlan([Source(layout, 200)], 3, 0, 8, 2))
    with pytest.raises(ValueError, match="not an atlas_remote epoch state"):
        EpochState.from_dict({"epoch": 1})
    for bad in ({"streams": 6, "workers": 4}, {"batch_size": 0}, {"batches": -1}):
        deal = {"streams": 8, "workers": 2, "batch_size": 4, "drop_last": False, "batches": 3, **bad}
        saved = {**state.to_dict(), "deals": [deal]}
        with pytest.raises(ValueError, match="load a state that state_dict") as error:
            EpochState.from_dict(saved)
        assert "\n" not in str(error.value)
    assert EpochState.from_dict(json.loads(json.dumps(state.to_dict()))) == state
    assert Segment(8, 2, 4, False, 3).shape == (8, 2, 4, False)


# -- ShuffledStream itself -----------------------------------------------------------------------------------


def loader_of(stream: training.ShuffledStream) -> list:
    """What a DataLoader over the stream yields, its workers simulated in this process: each worker gets a
    pickled copy, and a batch is taken from each worker in turn."""
    if not stream.num_workers:
        return [list(map(int, batch)) for batch in stream]
    copies, workers = [pickle.loads(pickle.dumps(stream)) for _ in range(stream.num_workers)], []
    for k, copy in enumerate(copies):
        with mock.patch.object(training, "_worker", return_value=(stream.num_workers, k)):
            workers.append(iter(copy))
    batches, active = [], list(range(len(workers)))
    while active:
        for k in list(active):
            batch = next(workers[k], None)
            if batch is None:
                active.remove(k)
            else:
                batches.append(list(map(int, batch)))
    stream._copies = copies  # what a StatefulDataLoader asks each worker for
    return batches


@settings(max_examples=tries(20), deadline=None)
@given(
    layouts(4, 60),
    st.sampled_from([(1, 0, 3, 0), (2, 0, 3, 0), (3, 0, 1, 0), (1, 2, 1, 3), (2, 2, 1, 0)]),
    st.integers(1, 6),
    st.booleans(),
    st.integers(0, 15),
    st.integers(0, 2),
)
def test_a_shuffled_stream_resumes_from_its_state_dict_at_another_world_size(
    layout, topology, batch, drop_last, stop, epoch
):
    """Ranks (and simulated DataLoader workers) of real ShuffledStreams take `stop` batches each; one rank's
    `state_dict(batches_seen=stop)` (the same on every rank) is loaded, through JSON, by the streams of another
    world size and worker count: across the job every example once, but the final deal's padding or drop."""
    ranks, workers, new_ranks, new_workers = topology
    ds, knobs = Stand(layout), {"window_blocks": 4, "run_blocks": 2, "prefetch": 0, "seed": 5, "collate": list}

    def streams(world: int, n_workers: int) -> list[training.ShuffledStream]:
        return [
            training.ShuffledStream(ds, batch, n_workers, rank=r, world_size=world, drop_last=drop_last, **knobs)
            for r in range(world)
        ]

    before = streams(ranks, workers)
    for stream in before:
        stream.set_epoch(epoch)
    per_rank = [loader_of(stream) for stream in before]
    assert len({len(b) for b in per_rank}) == 1, "every rank the same number of batches"
    with pytest.raises(ValueError, match="batches per rank left"):
        before[0].state_dict(batches_seen=len(per_rank[0]) + 1)  # past the epoch: refused
    stop = min(stop, len(per_rank[0]))
    served = [e for rank in per_rank for b in rank[:stop] for e in b]
    states = [json.loads(json.dumps(stream.state_dict(batches_seen=stop))) for stream in before]
    assert all(state == states[0] for state in states), "the same checkpoint on every rank"
    after = streams(new_ranks, new_workers)
    for stream in after:
        stream.load_state_dict(states[0])
    first_deal, final = before[0].epochs.deal()[0], after[0].epochs.deal()[0]
    rest = [loader_of(stream) for stream in after]
    assert len({len(b) for b in rest}) == 1 and all(len(r) == len(s) for r, s in zip(rest, after))
    later = [e for rank in rest for b in rank for e in b]
    if EpochState.from_dict(states[0]).epoch == epoch + 1:  # checkpointed at the epoch's end: the next, whole
        check_exact(len(layout), served, [first_deal])
        check_exact(len(layout), later, [final])
    else:
        check_exact(len(layout), served + later, [first_deal, final])


def test_a_stateful_dataloader_state_of_simulated_workers_resumes_on_another_number():
    """The workers' own states (what torchdata's StatefulDataLoader keeps) are read back by a stream of another
    worker count: the job serves every example once."""
    layout = Layout.of([90, 45, 77], [4, 4, 4])
    stream = training.ShuffledStream(Stand(layout), 5, 2, 4, 2, prefetch=0, seed=1, collate=list)
    whole = loader_of(stream)
    stream = training.ShuffledStream(Stand(layout), 5, 2, 4, 2, prefetch=0, seed=1, collate=list)
    copies = [pickle.loads(pickle.dumps(stream)) for _ in range(2)]
    iterators = []
    for k, copy in enumerate(copies):
        with mock.patch.object(training, "_worker", return_value=(2, k)):
            iterators.append(iter(copy))
    first = [list(map(int, next(iterators[k % 2]))) for k in range(7)]  # 7 batches: worker 0 gave one more
    assert first == whole[:7]
    saved = json.loads(json.dumps({f"worker_{k}": copy.state_dict() for k, copy in enumerate(copies)}))
    wider = training.ShuffledStream(Stand(layout), 5, 4, 4, 2, prefetch=0, seed=1, collate=list)
    wider.load_state_dict(saved)
    rest = loader_of(wider)
    assert sorted(e for b in first + rest for e in b) == list(range(len(layout)))
