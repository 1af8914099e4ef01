"""A checkpoint is data from a stranger (issue 35, row 13): every field of an epoch state, a stream worker's state
and what wraps them is bounded before anything is allocated from it, and anything no run could have written is
refused in one line (`CheckpointError`, a `ValueError`) saying what is wrong and what to do. A state that is
accepted resumes exactly: hypothesis mutates real states with hostile JSON values and checks both outcomes."""

from __future__ import annotations

import copy
import json
import math
import time
import tracemalloc
from collections import Counter

import pytest
from helpers import tries
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from jobs import Job, Stand, positions

from atlas_remote import AtlasError, CheckpointError
from atlas_remote.training import ShuffledStream
from atlas_remote.training.epoch_state import MAX_DEALS, MAX_STREAMS
from atlas_remote.training.plan import Layout

pytestmark = pytest.mark.unit  # no server, no process: the fast tier (pytest -m unit)

LAYOUT = Layout.of([40, 40, 25], [4, 4, 4])  # 105 examples
KNOBS = {"window_blocks": 4, "run_blocks": 2, "prefetch": 0, "seed": 5, "collate": list}


def stream(workers: int = 2, world: int = 1, rank: int = 0) -> ShuffledStream:
    return ShuffledStream(Stand(LAYOUT), 4, workers, rank=rank, world_size=world, **KNOBS)


def saved(batches: int = 3) -> dict:
    return json.loads(json.dumps(stream().state_dict(batches_seen=batches)))


def refused(state, target: ShuffledStream | None = None) -> str:
    """Load a hostile state: refused in one line, quickly, without allocating much."""
    target = target or stream()
    tracemalloc.start()
    began = time.monotonic()
    try:
        with pytest.raises(CheckpointError) as error:
            target.load_state_dict(state)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    message = str(error.value)
    assert "\n" not in message and len(message) < 400, message
    assert isinstance(error.value, (AtlasError, ValueError))
    assert time.monotonic() - began < 5 and peak < 32 << 20, (time.monotonic() - began, peak)
    return message


def with_deal(**fields) -> dict:
    state = saved()
    state["deals"][0].update(fields)
    return state


@pytest.mark.parametrize(
    "field, value, says",
    [
        ("streams", 10**8, "streams"),  # the row: 1.8 GB RSS, then MemoryError
        ("streams", MAX_STREAMS + 2, "streams"),
        ("workers", 10**9, "workers"),  # held before: keep it held
        ("batches", 10**30, "batches"),
        ("batches", 10**6, "batches"),  # within bounds, but past every batch the deal has
        ("batch_size", 2**62, "batch_size"),
        ("batch_size", 0, "batch_size"),
        ("streams", -8, "streams"),
        ("batches", -1, "batches"),
        ("streams", 8.0, "integer"),
        ("batches", math.nan, "integer"),
        ("batches", math.inf, "integer"),
        ("streams", True, "integer"),
        ("streams", "8", "integer"),
        ("batches", [3], "integer"),
        ("drop_last", "no", "drop_last"),
        ("drop_last", 0, "drop_last"),
        ("extra", 1, "extra"),
    ],
    ids=lambda value: str(value)[:16],
)
def test_a_hostile_deal_field_is_refused_in_one_line(field, value, says):
    assert says in refused(with_deal(**{field: value}))


@pytest.mark.parametrize(
    "field, value, says",
    [
        ("epoch", 10**40, "epoch"),
        ("epoch", -1, "epoch"),
        ("epoch", math.nan, "epoch"),
        ("epoch", 1.5, "epoch"),
        ("seed", 10**4000, "seed"),  # an int whose repr alone would raise (4,300 digits)
        ("seed", None, "seed"),
        ("plan", 12, "plan"),
        ("plan", "x" * 10**6, "plan"),
        ("deals", {"0": {}}, "deals"),
        ("deals", "[]", "deals"),
        ("deals", [None], "deals"),
        ("deals", [[8, 2, 4, False, 3]], "deals"),
        ("format", "atlas_remote.epoch/1", "format"),
        ("format", None, "format"),
    ],
    ids=lambda value: str(value)[:16],
)
def test_a_hostile_state_field_is_refused_in_one_line(field, value, says):
    state = saved()
    state[field] = value
    assert says in refused(state)


def test_missing_fields_and_non_states_are_refused():
    for key in ("epoch", "seed", "plan", "deals"):
        state = saved()
        del state[key]
        assert key in refused(state)
    for key in ("streams", "batches", "drop_last"):
        state = saved()
        del state["deals"][0][key]
        assert key in refused(state)
    for hostile in (None, [], "state", 3, {}, {"format": ["x"]}, {"a": {"b": {"c": 1}}}):
        refused(hostile)


def test_many_deals_or_streams_in_all_are_refused_before_any_is_dealt():
    state = saved()
    deal = {"streams": 2, "workers": 2, "batch_size": 4, "drop_last": False, "batches": 0}
    state["deals"] = [dict(deal) for _ in range(10**6)]
    assert "deals" in refused(state)
    state["deals"] = [dict(deal, streams=MAX_STREAMS, workers=1, drop_last=bool(k % 2)) for k in range(MAX_DEALS)]
    assert "streams" in refused(state)


def test_a_deal_that_ended_the_epoch_cannot_be_followed_by_another():
    state = saved()
    first = stream()
    total = len(first)
    state["deals"] = [
        {"streams": 2, "workers": 2, "batch_size": 4, "drop_last": False, "batches": total},
        {"streams": 3, "workers": 1, "batch_size": 4, "drop_last": False, "batches": 1},
    ]
    assert "batches" in refused(state)


def hostile_nest(depth: int) -> dict:
    state: dict = {"format": "atlas_remote.stream/1"}
    for _ in range(depth):
        state = {"x": state}
    return state


@pytest.mark.parametrize(
    "wrapper",
    [
        lambda worker: hostile_nest(10**5),  # a nest deeper than the recursion limit
        lambda worker: {f"w{k}": {"x": 1} for k in range(10**6)},  # a million keys
        lambda worker: {"worker_0": dict(worker, shape=[10**8, 1, 4, False])},
        lambda worker: {"worker_0": dict(worker, shape=[2, 2, 4])},
        lambda worker: {"worker_0": dict(worker, shape="2,2,4,False")},
        lambda worker: {"worker_0": dict(worker, batches=10**20)},
        lambda worker: {"worker_0": dict(worker, batches=-3)},
        lambda worker: {"worker_0": dict(worker, worker=10**9)},
        lambda worker: {"worker_0": dict(worker, worker=math.nan)},
        lambda worker: {"worker_0": dict(worker, state={"format": "atlas_remote.epoch/2", "epoch": "0"})},
        lambda worker: {"worker_0": dict(worker, state=None)},
        lambda worker: {"worker_0": worker, "worker_1": dict(worker, state=dict(worker["state"], epoch=7))},
    ],
)
def test_a_hostile_worker_state_is_refused_in_one_line(wrapper):
    """What a StatefulDataLoader saves: our workers' states somewhere inside its own nested dict."""
    from unittest import mock

    from atlas_remote.training import streams as training

    copy_ = pickle_copy(stream())
    with mock.patch.object(training, "_worker", return_value=(2, 0)):
        iter(copy_)
    worker = json.loads(json.dumps(copy_.state_dict()))
    assert worker["format"] == "atlas_remote.stream/1"
    refused(wrapper(worker))


def pickle_copy(source: ShuffledStream) -> ShuffledStream:
    import pickle

    return pickle.loads(pickle.dumps(source))


# -- anything JSON-ish: accepted and exact, or refused in one line ---------------------------------------------

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.sampled_from([0, 1, 2, 3, 4, 5, 8, 10**9, 10**100])
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
    max_leaves=12,
)


@st.composite
def mutated_states(draw):
    """A real state (one deal, or two after a change of topology), with some fields replaced by hostile values,
    some removed or added; or any JSON value at all."""
    if draw(st.integers(0, 9)) == 0:
        return draw(json_values)
    state = saved(draw(st.integers(0, 12)))
    if draw(st.booleans()):  # a second deal: another topology
        streams = draw(st.sampled_from([1, 3, 4]))
        state["deals"].append(
            {"streams": streams, "workers": 1, "batch_size": 4, "drop_last": draw(st.booleans()), "batches": 2}
        )
    for _ in range(draw(st.integers(1, 3))):
        deals = state["deals"] if isinstance(state.get("deals"), list) else []
        target = draw(st.sampled_from([state, *(deal for deal in deals if isinstance(deal, dict))]))
        key = draw(st.sampled_from(sorted(target) + ["other"]))
        action = draw(st.sampled_from(["replace", "replace", "delete"]))
        if action == "delete":
            target.pop(key, None)
        else:
            target[key] = draw(json_values | st.integers(0, 40))
    return state


def replay(state: dict) -> list[int]:
    """The positions a job that went through the state's deals served (each deal simulated as ranks of workers,
    loaded from the state before it), then the rest served by a job of 2 ranks x 2 workers from the whole
    state: an accepted state resumes exactly when this covers the epoch once, but the stated padding."""
    from atlas_remote.training.epochs import Epochs

    served: list[int] = []
    deals = state["deals"]
    for k, deal in enumerate(deals):
        prefix = dict(state, deals=deals[:k])
        workers = deal["workers"]
        job = Job(Stand(LAYOUT), (4, 2, 5), deal["streams"] // workers, workers, deal["batch_size"], deal["drop_last"])
        job.epochs.load(json.loads(json.dumps(prefix)))
        more, _ = job.take(deal["batches"])
        served += more
    final = Epochs(Stand(LAYOUT), 5, 4, 2, True, 4, 2, 4, False)
    final.load(json.loads(json.dumps(state)))
    job = Job(Stand(LAYOUT), (4, 2, 5), 2, 2, 4, False)
    job.epochs = final
    rest, after = job.take()
    assert after.deals == ()
    return served + rest if final.state.epoch == state["epoch"] else served


@settings(max_examples=tries(300), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mutated_states())
def test_any_json_value_as_a_state_is_accepted_and_exact_or_refused_in_one_line(state):
    original = copy.deepcopy(state)
    target = stream()
    try:
        target.load_state_dict(state)
    except CheckpointError as error:
        message = str(error)
        assert "\n" not in message and 0 < len(message) < 400
        assert repr(state) == repr(original), "a refused state is left as it was"
        return
    assert repr(state) == repr(original), "loading does not change the caller's state"
    served = replay(original)
    counts = Counter(served)
    ended_dropping = target.epochs.state.epoch > original["epoch"] and original["deals"][-1]["drop_last"]
    if not ended_dropping:  # a drop_last deal that ended the epoch left out what did not fill its batches
        assert set(counts) == set(range(len(LAYOUT))), "every example of the epoch served"
    # docs/training.md: a deal whose final round is reached serves at most streams - 1 positions twice; the job
    # that takes the rest has 4 streams
    allowance = sum(max(deal["streams"] - 1, 0) for deal in original["deals"]) + 3
    assert sum(n - 1 for n in counts.values()) <= allowance, "twice: only stated padding"


def test_a_real_state_still_loads_and_resumes_exactly():
    whole = Job(Stand(LAYOUT), (4, 2, 5), 1, 2, 4, False)
    served, state = whole.take(3)
    assert state.to_dict() == saved(3)
    assert sorted(replay(saved(3))) == sorted(positions([(0, len(LAYOUT))]))
