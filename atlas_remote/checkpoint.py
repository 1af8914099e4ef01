"""How far an epoch has been served, and who serves the rest: small, JSON-ready, valid at any topology.

An epoch (plan.EpochPlan) is one sequence of positions. The state of a job is the set of positions served, as
sorted disjoint intervals: a few per stream, never a list of examples. To serve what is left, `deal` cuts it
into one piece per stream (rank x DataLoader worker), each piece a run of the remaining sequence, all of equal
length so that every rank yields the same number of batches. A piece's cut can fall inside a window; the two
streams on either side then each read the blocks their part of the window needs.

Ranks of a data-parallel job take their steps together, so after b batches on every rank the whole job's
progress is known to any of them (`Deal.served_after`): a checkpoint is the same on every rank, and loading it
at another world size or worker count re-deals exactly what was not served.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .plan import EpochPlan

STATE_FORMAT = "atlas_remote.epoch/1"
Intervals = np.ndarray  # shape (k, 2), int64, sorted, disjoint, half-open


def intervals(pairs: Any = ()) -> Intervals:
    """Sorted, merged half-open intervals from (start, stop) pairs (empty ones dropped)."""
    array = np.asarray(pairs, dtype=np.int64).reshape(-1, 2)
    array = array[array[:, 1] > array[:, 0]]
    if len(array) < 2:
        return array
    array = array[np.argsort(array[:, 0], kind="stable")]
    reach = np.maximum.accumulate(array[:, 1])
    new = np.ones(len(array), dtype=bool)
    new[1:] = array[1:, 0] > reach[:-1]
    starts = array[new, 0]
    stops = reach[np.flatnonzero(np.append(new[1:], True))]
    return np.stack([starts, stops], axis=1)


def complement(served: Intervals, size: int) -> Intervals:
    """The positions of [0, size) not in served."""
    edges = np.concatenate([[0], served.ravel(), [size]])
    return intervals(edges.reshape(-1, 2))


def total(spans: Intervals) -> int:
    return int((spans[:, 1] - spans[:, 0]).sum())


def cut(spans: Intervals, start: int, stop: int) -> Intervals:
    """The positions at offsets [start, stop) of the sequence the intervals make, end to end."""
    lengths = spans[:, 1] - spans[:, 0]
    before = np.cumsum(lengths) - lengths
    lo = np.clip(start - before, 0, lengths)
    hi = np.clip(stop - before, 0, lengths)
    out = np.stack([spans[:, 0] + lo, spans[:, 0] + hi], axis=1)
    return out[hi > lo]


@dataclass(frozen=True)
class Segment:
    """The deal being served since the state's `served` was recorded: its shape, and the batches every rank has
    taken from it since (ranks move in step). Loading a state into a stream of the same shape continues that
    deal exactly where it was, so the rest of the epoch comes in the order an uninterrupted run would give it."""

    streams: int
    workers: int
    batch_size: int
    drop_last: bool
    batches: int

    def same_shape(self, streams: int, workers: int, batch_size: int, drop_last: bool) -> bool:
        return (self.streams, self.workers, self.batch_size, self.drop_last) == (
            streams,
            workers,
            batch_size,
            drop_last,
        )


@dataclass
class EpochState:
    """How far an epoch has gone: the positions served when the current deal started, and what the deal
    (`segment`) has served since. `plan` identifies the plan it belongs to (EpochPlan.digest)."""

    epoch: int = 0
    served: Intervals = field(default_factory=intervals)
    seed: int = 0
    plan: str = ""
    segment: Segment | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": STATE_FORMAT,
            "seed": self.seed,
            "epoch": self.epoch,
            "plan": self.plan,
            "served": self.served.tolist(),
            "segment": None if self.segment is None else vars(self.segment),
        }

    @classmethod
    def from_dict(cls, state: dict[str, Any]) -> EpochState:
        if not isinstance(state, dict) or state.get("format") != STATE_FORMAT:
            raise ValueError(f"not an atlas_remote epoch state (expected format {STATE_FORMAT!r}): {str(state)[:120]}")
        segment = state.get("segment")
        return cls(
            int(state["epoch"]),
            intervals(state["served"]),
            int(state["seed"]),
            str(state["plan"]),
            Segment(**segment) if segment else None,
        )

    def check(self, plan: EpochPlan) -> None:
        """Refuse a state saved for other datasets, shares, knobs or seed (it would serve the wrong rest)."""
        if self.seed != plan.seed or (self.plan and self.plan != plan.digest()):
            raise ValueError(
                f"this state was saved for another epoch plan (seed {self.seed}, plan {self.plan}; this one has "
                f"seed {plan.seed}, plan {plan.digest()}): the datasets, their weights, window_blocks or "
                f"run_blocks differ"
            )

    def resolved(self, plan: EpochPlan) -> EpochState:
        """The same progress with the segment folded into `served` (what a deal of another shape starts from)."""
        if self.segment is None:
            return self
        s = self.segment
        deal = Deal(
            plan, EpochState(self.epoch, self.served, self.seed, self.plan), s.streams, s.batch_size, s.drop_last
        )
        counts = round_robin(s.batches, s.workers, deal.batches_per_stream) * (s.streams // s.workers)
        return deal.served_after(counts)


@dataclass
class Deal:
    """What is left of an epoch, cut into `streams` pieces of `per_stream` positions each.

    What is left is cut as evenly as can be, then every piece is made the same length, so every stream yields
    the same number of batches: with drop_last each piece's end is left out (fewer than batch_size positions,
    plus one), without it a shorter piece is made up with its own first positions (served twice this epoch).
    """

    plan: EpochPlan
    base: EpochState
    streams: int
    batch_size: int
    drop_last: bool = False
    pieces: list[Intervals] = field(init=False)
    per_stream: int = field(init=False)

    def __post_init__(self) -> None:
        if self.streams < 1 or self.batch_size < 1:
            raise ValueError(f"streams and batch_size must be >= 1, got {self.streams} and {self.batch_size}")
        remaining = complement(self.base.served, self.plan.size)
        left = total(remaining)
        if self.drop_last:
            self.per_stream = left // self.streams // self.batch_size * self.batch_size
        else:
            self.per_stream = -(-left // self.streams)
        bounds = np.arange(self.streams + 1, dtype=np.int64) * left // self.streams  # as even as can be
        self.pieces = []
        for s in range(self.streams):
            piece = cut(
                remaining, int(bounds[s]), int(bounds[s]) + min(self.per_stream, int(bounds[s + 1] - bounds[s]))
            )
            short = self.per_stream - total(piece)
            if short > 0:  # made up with its own first positions (or, if it has none, the first of all)
                source = piece if len(piece) else remaining
                repeats = np.concatenate([source] * -(-short // total(source)))
                piece = np.concatenate([piece, cut(repeats, 0, short)])
            self.pieces.append(piece)

    @property
    def batches_per_stream(self) -> int:
        return -(-self.per_stream // self.batch_size)

    def served_after(self, batches: list[int]) -> EpochState:
        """The state once stream s has yielded batches[s] batches (its first batches[s] x batch_size positions);
        when every stream has yielded all its batches the epoch is done and the state is the next epoch's start."""
        if all(b >= self.batches_per_stream for b in batches):
            return EpochState(self.base.epoch + 1, intervals(), self.base.seed, self.base.plan)
        done = [cut(piece, 0, min(b * self.batch_size, self.per_stream)) for piece, b in zip(self.pieces, batches)]
        served = intervals(np.concatenate([self.base.served, *done]))
        return EpochState(self.base.epoch, served, self.base.seed, self.base.plan)

    def state_after(self, workers: int, batches_per_rank: int) -> EpochState:
        """The state once every rank has taken batches_per_rank batches from its `workers` streams in turn."""
        if batches_per_rank >= self.batches_per_stream * workers:
            return EpochState(self.base.epoch + 1, intervals(), self.base.seed, self.base.plan)
        segment = Segment(self.streams, workers, self.batch_size, self.drop_last, batches_per_rank)
        return EpochState(self.base.epoch, self.base.served, self.base.seed, self.base.plan, segment)

    def resume_point(self, workers: int, batches_per_rank: int, worker: int) -> tuple[int, int]:
        """(stream of the rank, batches it has yielded) that a rank's DataLoader worker serves after the rank took
        batches_per_rank batches: the workers are turned so that worker 0 goes on with the stream whose turn is
        next, as the uninterrupted DataLoader would have."""
        turn = (worker + batches_per_rank) % workers
        return turn, round_robin(batches_per_rank, workers, self.batches_per_stream)[turn]


def round_robin(batches_seen: int, workers: int, per_worker: int) -> list[int]:
    """Batches each of a rank's workers had delivered after batches_seen in all: a DataLoader takes them from
    its workers in turn, and every worker here has the same number."""
    workers = max(workers, 1)
    rounds, extra = divmod(max(batches_seen, 0), workers)
    return [min(per_worker, rounds + (1 if k < extra else 0)) for k in range(workers)]
