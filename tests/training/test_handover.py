"""The hand-over from the training process to its workers (training/handover.py): every round served once, in
order, by one side or the other, whatever the timing; workers take over at a round they have ready; and through a
real DataLoader, the loop's batches are the planned ones with no gap waiting for a worker to start."""

from __future__ import annotations

import threading
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from atlas_remote.training.handover import HandOver, worker_batches

pytestmark = pytest.mark.unit


def simulate(workers: int, rounds: int, parent_pause: float, worker_delays: list[float]) -> tuple[list, list]:
    """The training process serving rounds (pausing between them) while workers, started after their delays,
    take over: (who served each (worker, round), in the loop's order; what each worker's serve was asked)."""
    handover = HandOver(workers, rounds)
    served: list = []
    asked: list[list[int]] = [[] for _ in range(workers)]
    results: dict[int, tuple[int, list]] = {}

    def serve_from(w: int):
        def serve(first: int):
            asked[w].append(first)
            return iter([(w, r) for r in range(first, rounds)])

        return serve

    def worker(w: int) -> None:
        time.sleep(worker_delays[w])
        start, batches = worker_batches(handover, w, serve_from(w))
        results[w] = (start, list(batches))

    threads = [threading.Thread(target=worker, args=(w,)) for w in range(workers)]
    for t in threads:
        t.start()
    r, began = 0, time.perf_counter()
    while r < rounds and not handover.begin(r, (time.perf_counter() - began) / max(r, 1)):
        served += [("parent", w, r) for w in range(workers)]
        r += 1
        time.sleep(parent_pause)
    handover.end(r)
    for t in threads:
        t.join(10)
    starts = {results[w][0] for w in range(workers)}
    assert starts == {r}, f"the workers start at {starts}, the training process stopped at {r}"
    for k in range(rounds - r):  # the DataLoader's order: a batch of each worker in turn
        served += [("worker",) + results[w][1][k] for w in range(workers)]
    return served, asked


@settings(max_examples=20, deadline=None)
@given(
    st.integers(1, 3),
    st.integers(0, 60),
    st.sampled_from([0.0, 0.0005, 0.003]),
    st.lists(st.sampled_from([0.0, 0.005, 0.03]), min_size=3, max_size=3),
)
def test_every_round_is_served_once_in_order_whatever_the_timing(workers, rounds, pause, delays):
    served, asked = simulate(workers, rounds, pause, delays)
    assert [(w, r) for _, w, r in served] == [(w, r) for r in range(rounds) for w in range(workers)]
    for first in asked:  # a worker starts its own serving at most twice: its guess, and the decided round
        assert 1 <= len(first) <= 2


def test_workers_take_over_at_a_round_they_prepared_ahead_of_the_training_process():
    served, asked = simulate(2, 400, 0.002, [0.01, 0.02])
    taken = next(r for who, _, r in served if who == "worker")
    assert 0 < taken < 400
    assert all(first == [first[0]] for first in asked)  # prepared once, not again from the decided round
    assert all(first[0] <= taken for first in asked)


def test_a_training_process_that_serves_everything_leaves_the_workers_nothing():
    served, _ = simulate(2, 5, 0.0, [0.2, 0.2])
    assert {who for who, _, _ in served} == {"parent"}
