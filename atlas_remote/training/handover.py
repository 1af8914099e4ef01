"""The hand-over from the training process to its DataLoader workers: no gap between batches, and nothing read
twice but the window each worker's piece is in when it takes over.

A worker takes a second or more to start (a fork server's interpreter importing torch), so `TensorLoader` serves
the workers' batches itself meanwhile, a round at a time in the DataLoader's order (one batch of each worker's
stream a round). A worker, once started, claims a round the training process should not have begun by the time
the worker's batch of it is ready (from the rounds begun so far and how long one takes, PREPARE_SECONDS ahead),
claiming again further on if the training process got there first. Once every worker has claimed, the training
process decides the round they take over at (the latest claimed, or its own next), fetches no window that
begins past it, serves the rounds before it and goes on with the DataLoader's batches, while each worker reads
from that round on. The batches and their order are the ones the workers alone give, so a checkpoint counts
batches as before.

The protocol is a few integers in shared memory, each written by one side only: the rounds the training process
began and its time per round, each worker's claimed round, and the decided round.
"""

from __future__ import annotations

import ctypes
import math
import multiprocessing
import os
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np

from ..read.readahead import Gate
from .epoch_state import cut
from .serving import Held

PREPARE_SECONDS = 0.25  # how long a worker's first batch may take once the round is decided (a window's fetch)
POLL_SECONDS = 0.001  # a worker waiting for the decided round looks this often
UNDECIDED = -1
DECIDED, BEGUN, NS_PER_ROUND, PARENT, ROUNDS, PREPARED = 0, 1, 2, 3, 4, 5  # PREPARED + w: worker w's round


class HandOver:
    """The shared integers of one hand-over (made by the training process before its workers start)."""

    def __init__(self, workers: int, rounds: int, generation: int = 0) -> None:
        self.workers = workers
        self.generation = generation  # of the stream's control block when the pass began: a worker that starts
        # its first pass after the training process served it whole and published another epoch serves nothing
        self.starting: threading.Thread | None = None  # starting the workers (where they start from a fork server)
        self.block = multiprocessing.RawArray(ctypes.c_int64, PREPARED + workers)
        self.block[DECIDED] = UNDECIDED
        self.block[PARENT] = os.getpid()
        self.block[ROUNDS] = rounds  # in the pass: no round is guessed or decided past it
        for w in range(workers):
            self.block[PREPARED + w] = UNDECIDED

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "starting": None}  # the thread stays in the training process

    def started(self) -> None:
        """Wait until the workers are started (a DataLoader is not iterated again while it starts its workers)."""
        if self.starting is not None:
            self.starting.join()

    # -- the training process ----------------------------------------------------------------------------

    def begin(self, round: int, seconds_per_round: float, covered: Callable[[], int] = lambda: 0) -> bool:
        """Round `round` is next: published, and whether the workers take over at it. Once every worker has
        claimed a round, the round is decided: the latest claimed, or further on to the rounds `covered()` by
        the windows this process has fetched (so that none of them is fetched for nothing)."""
        block = self.block
        block[BEGUN] = round
        block[NS_PER_ROUND] = int(seconds_per_round * 1e9)
        if block[DECIDED] == UNDECIDED:
            prepared = [block[PREPARED + w] for w in range(self.workers)]
            if min(prepared) == UNDECIDED:
                return False
            block[DECIDED] = min(max(*prepared, round, covered()), block[ROUNDS])
        return block[DECIDED] <= round

    def end(self, round: int) -> None:
        """The training process serves no more (the piece ran out, or the loop stopped): the workers go on from
        the round it would have served next, if nothing was decided."""
        if self.block[DECIDED] == UNDECIDED:
            self.block[DECIDED] = round

    def claimed(self) -> bool:
        """Whether every worker has claimed a round (it is decided at the training process's next round)."""
        return min(self.block[PREPARED + w] for w in range(self.workers)) != UNDECIDED

    def taken_over(self) -> int | None:
        """The round the workers take over at, once decided."""
        decided = self.block[DECIDED]
        return None if decided == UNDECIDED else int(decided)

    # -- a worker ---------------------------------------------------------------------------------------

    def guess(self) -> int:
        """A round the training process should not have begun once a batch is prepared."""
        per_round = self.block[NS_PER_ROUND] / 1e9
        ahead = math.ceil(PREPARE_SECONDS / per_round) if per_round > 0 else 1
        return min(self.block[BEGUN] + max(ahead, 1), self.block[ROUNDS])

    def prepared(self, worker: int, round: int) -> bool:
        """Worker claims `round` (it will have that round's batch ready by the time the training process gets
        there); False if the training process began it first (guess again)."""
        if self.block[BEGUN] >= round and self.block[DECIDED] == UNDECIDED:
            return False
        self.block[PREPARED + worker] = round
        return True

    def decided(self) -> int:
        """The round the workers take over at, once the training process has decided it."""
        waited = 0
        while self.block[DECIDED] == UNDECIDED:
            time.sleep(POLL_SECONDS)
            waited += 1
            if waited % 1000 == 0 and not _alive(int(self.block[PARENT])):
                raise SystemExit(f"the training process {self.block[PARENT]} is gone")
        return int(self.block[DECIDED])


def served_then_handed_over(dataloader: Any, stream: Any, handover: HandOver) -> Iterator[Any]:
    """The training process's side: the workers' batches served here, a round at a time, while the workers start
    (in a thread where they start from a fork server, which may still be importing torch), then the DataLoader's
    once they take over; the same batches in the same order as the workers alone give. `stream` is an
    EpochStream (`_rounds()`: how many rounds are left and each worker's batches from here)."""
    started: Future = Future()
    served, gate = 0, Gate()  # nothing fetched ahead before the first round is served (a start sends one window)
    total, rounds, covered = parent_rounds(stream, handover.taken_over, gate)
    handover.block[ROUNDS] = total
    context = dataloader.multiprocessing_context
    method = context.get_start_method() if context is not None else multiprocessing.get_start_method()
    if method == "fork":  # at once, before this process reads anything: a fork copies the stream as it is
        _start(dataloader, stream, handover, started)
    else:
        handover.starting = threading.Thread(
            target=_start, args=(dataloader, stream, handover, started), name="atlas-workers"
        )
        handover.starting.start()
    began, left = time.perf_counter(), True
    stream._served_here = 0
    try:
        firsts = ThreadPoolExecutor(len(rounds), thread_name_prefix="atlas-first")  # every stream's first window
        first = [firsts.submit(next, r, None) for r in rounds]  # at once, not one after the other
        firsts.shutdown(wait=False)
        while not handover.begin(served, (time.perf_counter() - began) / served if served else 0.0, covered):
            got = 0
            for batch in (f.result() for f in first) if not served else (next(r, None) for r in rounds):
                if batch is not None:
                    got += 1
                    stream._served_here += 1
                    yield batch
            if not got:  # served to the end here: the workers, still starting, have nothing left
                left = False
                break
            served += 1
            if not gate.is_open:
                gate.open()
    finally:
        handover.end(served)
        for r in rounds:
            r.close()
    if left:
        yield from started.result()


def parent_rounds(stream: Any, taken_over: Callable[[], int | None], gate: Gate) -> tuple:
    """Each DataLoader worker's batches from where the stream's epoch stands, in the DataLoader's order, how
    many rounds they make, and a function saying how many rounds the windows fetched so far cover: what the
    training process serves while the workers start. Two windows ahead each once `gate` opens, none
    beginning past the round `taken_over()` says the workers take over at."""
    deal, taken = stream.epochs.deal()
    points = [deal.resume_point(stream.workers, taken, worker) for worker in range(stream.workers)]
    pieces = [deal.rest(stream.rank * stream.workers + turn, skip) for turn, skip in points]
    size = stream.batch_size

    def until(piece: np.ndarray) -> Callable[[], int | None]:
        def position() -> int | None:
            start = taken_over()
            rest = cut(piece, start * size, start * size + 1) if start is not None else None
            return int(rest[0, 0]) if rest is not None and len(rest) else None

        return position

    holds = [Held(until(p), gate, [int(p[0, 0]) if len(p) else 0]) for p in pieces]

    def covered() -> int:
        """The rounds every stream's fetched windows reach into (each stream's first round not fetched whole)."""
        reached = [np.clip(h.reach[0] - p[:, 0], 0, p[:, 1] - p[:, 0]).sum() for p, h in zip(pieces, holds)]
        return max(int(offset) // size for offset in reached)

    rounds = deal.batches_per_stream - min(skip for _, skip in points)
    return rounds, [stream._serve(deal.plan, p, 2, h) for p, h in zip(pieces, holds)], covered


def _start(dataloader: Any, stream: Any, handover: HandOver, started: Future) -> None:
    """The DataLoader's iterator, its workers started (what blocks while a fork server starts), each handed the
    shared integers of the hand-over."""
    stream._handover = handover
    try:
        started.set_result(iter(dataloader))
    except BaseException as err:  # handed to the thread that waits for it
        started.set_exception(err)
    finally:
        stream._handover = None


def worker_batches(handover: HandOver, worker: int, serve: Callable[[int], Iterator[Any]]) -> tuple[int, Iterator[Any]]:
    """A worker's side: the round it takes over at, and its batches from there (`serve(first_round)`, a generator
    of its batches from that round on). It claims a round the training process should not have begun by the time
    its batch is ready, guessing again while the training process is ahead, and reads nothing before the round
    is decided (so it reads only what it serves)."""
    while not handover.prepared(worker, handover.guess()):
        pass
    start = handover.decided()
    return start, serve(start)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
