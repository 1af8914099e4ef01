"""How far an epoch has been served, and who serves the rest: small, JSON-ready, valid at any topology.

An epoch (plan.EpochPlan) is one sequence of positions. To serve what is left, `Deal` cuts it into one piece
per stream (rank x DataLoader worker), each piece a run of the remaining sequence, as even as can be, so that
every stream yields the same number of batches. A piece's cut can fall inside a window; the two streams on
either side then each read the blocks their part of the window needs.

Ranks of a data-parallel job take their steps together, so after b batches on every rank the whole job's
progress is known to any of them: the deals served since the epoch began, each with its shape and the batches
every rank took from it (`EpochState.deals`). That is a few integers per change of topology, however many
streams there are; the positions served are worked out from it (`EpochState.served`) when a deal of another
shape takes over, and loading a state at another world size or worker count re-deals exactly what was not
served.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import CheckpointError
from .plan import EpochPlan

STATE_FORMAT = "atlas_remote.epoch/2"
# A state is data from whoever handed it over: every number in it is bounded before anything is made from it.
MAX_STREAMS = 1 << 17  # streams (ranks x DataLoader workers) of one deal
MAX_WORKERS = 1 << 10  # DataLoader workers of one rank
MAX_DEALS = 64  # changes of topology within one epoch
MAX_COUNT = 1 << 40  # a batch size, or batches taken
MAX_INTEGER = (1 << 63) - 1  # a seed or an epoch
REDO = "load a state that state_dict() wrote for these datasets and knobs"
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


def split(spans: Intervals, offsets: np.ndarray) -> list[Intervals]:
    """The positions between each pair of consecutive offsets into the sequence the intervals make, end to end
    (each piece found by bisection, so cutting many pieces costs no pass over every interval per piece)."""
    lengths = spans[:, 1] - spans[:, 0]
    ends = np.cumsum(lengths)
    before = ends - lengths
    limit = int(ends[-1]) if len(ends) else 0
    pieces = []
    for start, stop in zip(np.minimum(offsets[:-1], limit).tolist(), np.minimum(offsets[1:], limit).tolist()):
        if stop <= start:
            pieces.append(np.zeros((0, 2), dtype=np.int64))
            continue
        first = int(np.searchsorted(ends, start, side="right"))
        last = int(np.searchsorted(ends, stop - 1, side="right"))
        piece = spans[first : last + 1].copy()
        piece[0, 0] = spans[first, 0] + start - before[first]
        piece[-1, 1] = spans[last, 0] + stop - before[last]
        pieces.append(piece)
    return pieces


def cut(spans: Intervals, start: int, stop: int) -> Intervals:
    """The positions at offsets [start, stop) of the sequence the intervals make, end to end."""
    return split(spans, np.array([max(start, 0), max(stop, start, 0)], dtype=np.int64))[0]


@dataclass(frozen=True)
class Segment:
    """One deal of an epoch: its shape, and the batches every rank took from it (ranks move in step)."""

    streams: int
    workers: int
    batch_size: int
    drop_last: bool
    batches: int

    def __post_init__(self) -> None:
        if min(self.streams, self.workers, self.batch_size) < 1 or self.streams % self.workers or self.batches < 0:
            raise CheckpointError(
                f"an epoch state's deal of {self.streams} streams, {self.workers} workers a rank, batches of "
                f"{self.batch_size} and {self.batches} batches taken cannot be: {REDO}"
            )

    @classmethod
    def from_dict(cls, record: Any, name: str) -> Segment:
        record = fields(record, name, ("streams", "workers", "batch_size", "drop_last", "batches"))
        streams = integer(record["streams"], f"{name}.streams", 1, MAX_STREAMS)
        workers = integer(record["workers"], f"{name}.workers", 1, MAX_WORKERS)
        if type(record["drop_last"]) is not bool:
            raise CheckpointError(
                f"{name}.drop_last must be true or false, got {describe(record['drop_last'])}: {REDO}"
            )
        batch_size = integer(record["batch_size"], f"{name}.batch_size", 1, MAX_COUNT)
        return cls(
            streams,
            workers,
            batch_size,
            record["drop_last"],
            integer(record["batches"], f"{name}.batches", 0, MAX_COUNT),
        )

    @property
    def shape(self) -> tuple[int, int, int, bool]:
        return self.streams, self.workers, self.batch_size, self.drop_last


@dataclass(frozen=True)
class EpochState:
    """How far an epoch has gone: the deals served one after another since it began (`deals`; the last may
    still be going on). `plan` identifies the plan it belongs to (EpochPlan.digest)."""

    epoch: int = 0
    seed: int = 0
    plan: str = ""
    deals: tuple[Segment, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": STATE_FORMAT,
            "seed": self.seed,
            "epoch": self.epoch,
            "plan": self.plan,
            "deals": [vars(segment) for segment in self.deals],
        }

    @classmethod
    def from_dict(cls, state: Any) -> EpochState:
        """A state as `to_dict` wrote it, every field checked for type and bound before it is used."""
        if not isinstance(state, dict) or state.get("format") != STATE_FORMAT:
            found = describe(state.get("format")) if isinstance(state, dict) else describe(state)
            raise CheckpointError(
                f"not an atlas_remote epoch state (expected format {STATE_FORMAT!r}, got {found}): {REDO}"
            )
        state = fields(state, "epoch state", ("format", "seed", "epoch", "plan", "deals"))
        plan, deals = state["plan"], state["deals"]
        if not isinstance(plan, str) or len(plan) > 64:
            raise CheckpointError(
                f"epoch state: plan must be a digest of at most 64 characters, got {describe(plan)}: {REDO}"
            )
        if not isinstance(deals, list) or len(deals) > MAX_DEALS:
            shown = f"{len(deals):,} of them" if isinstance(deals, list) else describe(deals)
            raise CheckpointError(
                f"epoch state: deals must be a list of at most {MAX_DEALS} deals, got {shown}: {REDO}"
            )
        segments = tuple(Segment.from_dict(deal, f"epoch state: deals[{k}]") for k, deal in enumerate(deals))
        if sum(s.streams for s in segments) > 4 * MAX_STREAMS:
            raise CheckpointError(f"epoch state: its deals have more than {4 * MAX_STREAMS:,} streams in all: {REDO}")
        epoch = integer(state["epoch"], "epoch state: epoch", 0, MAX_INTEGER)
        return cls(epoch, integer(state["seed"], "epoch state: seed", 0, MAX_INTEGER), plan, segments)

    def check(self, plan: EpochPlan, made_of: str = "the datasets, their weights, window_blocks or run_blocks") -> None:
        """Refuse a state saved for other datasets, shares, knobs or seed (it would serve the wrong rest);
        `made_of` names what the stream's plan is made of (a TokenStream's: seq_len first)."""
        if self.seed != plan.seed or (self.plan and self.plan != plan.digest()):
            raise CheckpointError(
                f"this state was saved for another epoch plan (seed {self.seed}, plan {self.plan}; this one has "
                f"seed {plan.seed}, plan {plan.digest()}): {made_of} differ; make the stream as it was saved"
            )

    def replayed(self, plan: EpochPlan) -> EpochState:
        """This state, its deals dealt one after another: refused where a deal says more batches were taken than
        it had (or the epoch went on after a deal ended it); a last deal taken whole is the next epoch's start."""
        served = intervals()
        for k, segment in enumerate(self.deals):
            deal = Deal(plan, served, segment.streams, segment.batch_size, segment.drop_last)
            total, last = deal.batches_per_stream * segment.workers, k == len(self.deals) - 1
            if segment.batches > total or (segment.batches == total > 0 and not last):
                raise CheckpointError(
                    f"epoch state: deals[{k}] says every rank took {segment.batches:,} batches of it, but it has "
                    f"{total:,}{'' if last else ' and the epoch ended there'}: {REDO}"
                )
            if last and segment.batches == total:
                return EpochState(self.epoch + 1, self.seed, self.plan)
            served = deal.served_after(segment.workers, segment.batches)
        return self

    def served(self, plan: EpochPlan, deals: int | None = None) -> Intervals:
        """The positions served by the first `deals` deals (all by default), each dealt from what the ones
        before it left."""
        served = intervals()
        for segment in self.deals[:deals]:
            deal = Deal(plan, served, segment.streams, segment.batch_size, segment.drop_last)
            served = deal.served_after(segment.workers, segment.batches)
        return served

    def after(self, segment: Segment) -> EpochState:
        """This state with its last deal replaced by `segment` if that is the same deal further on, else followed
        by it (a last deal that served nothing is forgotten)."""
        deals = list(self.deals)
        if deals and (deals[-1].shape == segment.shape or deals[-1].batches == 0):
            deals.pop()
        return EpochState(self.epoch, self.seed, self.plan, (*deals, segment))


@dataclass(eq=False)
class Deal:
    """What is left of an epoch after `served`, cut into `streams` pieces that each yield the same number of
    batches.

    The pieces are runs of the remaining sequence, as even as can be: their lengths differ by one at most, so
    a stream's last batch is at most one example smaller than another's. That gives every stream the same
    number of batches unless the lengths straddle a multiple of batch_size (fewer positions left for the final
    round than there are streams); only then is each shorter piece made up with one position, its own first
    (`padding` of them, served twice this epoch). With drop_last every batch is whole: each piece keeps the
    batches every piece can fill, and the rest (`dropped`, fewer than streams x batch_size) is left out.
    """

    plan: EpochPlan
    served: Intervals
    streams: int
    batch_size: int
    drop_last: bool = False
    pieces: list[Intervals] = field(init=False)
    lengths: np.ndarray = field(init=False)  # positions each piece serves, its padding included
    padding: int = field(init=False)
    dropped: int = field(init=False)

    def __post_init__(self) -> None:
        if self.streams < 1 or self.batch_size < 1:
            raise ValueError(f"streams and batch_size must be >= 1, got {self.streams} and {self.batch_size}")
        remaining = complement(self.served, self.plan.size)
        left, streams, size = total(remaining), self.streams, self.batch_size
        bounds = np.arange(streams + 1, dtype=np.int64) * left // streams  # as even as can be
        even, rest = divmod(left, streams)
        self.padding = self.dropped = 0
        if self.drop_last:
            keep = left // (streams * size) * size
            self.pieces = split(remaining, np.stack([bounds[:-1], bounds[:-1] + keep], axis=1).ravel())[::2]
            self.lengths = np.full(streams, keep, dtype=np.int64)
            self.dropped = left - streams * keep
            return
        self.pieces = split(remaining, bounds)
        self.lengths = np.diff(bounds)
        if rest and even % size == 0:  # q and q + 1 positions would be different numbers of batches
            short = np.flatnonzero(self.lengths == even)
            for k, s in enumerate(short.tolist()):  # one position more: the piece's own first, or any if it has none
                first = int(self.pieces[s][0, 0]) if even else int(cut(remaining, k % left, k % left + 1)[0, 0])
                self.pieces[s] = np.concatenate([self.pieces[s], [[first, first + 1]]]).astype(np.int64)
            self.lengths[short] += 1
            self.padding = len(short)

    @property
    def batches_per_stream(self) -> int:
        return -(-int(self.lengths.max()) // self.batch_size) if self.streams else 0

    def rest(self, stream: int, batches: int) -> Intervals:
        """What stream `stream` serves once it has yielded `batches` batches."""
        return cut(self.pieces[stream], batches * self.batch_size, int(self.lengths[stream]))

    def served_after(self, workers: int, batches_per_rank: int) -> Intervals:
        """The positions served once every rank has taken batches_per_rank batches from its `workers` streams
        in turn (a rank's streams are consecutive)."""
        counts = round_robin(batches_per_rank, workers, self.batches_per_stream) * (self.streams // workers)
        done = [
            cut(piece, 0, min(b * self.batch_size, int(length)))
            for piece, b, length in zip(self.pieces, counts, self.lengths)
        ]
        return intervals(np.concatenate([self.served, *done]))

    def resume_point(self, workers: int, batches_per_rank: int, worker: int) -> tuple[int, int]:
        """(stream of the rank, batches it has yielded) that a rank's DataLoader worker serves after the rank took
        batches_per_rank batches: the workers are turned so that worker 0 goes on with the stream whose turn is
        next, as the uninterrupted DataLoader would have."""
        turn = (worker + batches_per_rank) % workers
        return turn, round_robin(batches_per_rank, workers, self.batches_per_stream)[turn]


def describe(value: Any) -> str:
    """A value from a state, shown in an error without trusting it (a 5,000-digit int cannot even be printed)."""
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value) if value.bit_length() <= 64 else f"an integer of {value.bit_length():,} bits"
    if isinstance(value, str):
        return repr(value[:40]) + ("..." if len(value) > 40 else "")
    if isinstance(value, (float, bool)) or value is None:
        return repr(value)
    return f"a {type(value).__name__}"


def integer(value: Any, name: str, low: int, high: int) -> int:
    """An integer field of a state (not a bool, a float or a string), within [low, high]."""
    if not isinstance(value, (int, np.integer)) or isinstance(value, (bool, np.bool_)):
        raise CheckpointError(f"{name} must be an integer, got {describe(value)}: {REDO}")
    if not low <= int(value) <= high:
        raise CheckpointError(f"{name} is {describe(int(value))}, outside [{low:,}, {high:,}]: {REDO}")
    return int(value)


def fields(record: Any, name: str, keys: tuple[str, ...]) -> dict[str, Any]:
    """A record of a state with exactly these keys."""
    if not isinstance(record, dict):
        raise CheckpointError(f"{name} must be a record of {', '.join(keys)}, got {describe(record)}: {REDO}")
    missing = [key for key in keys if key not in record]
    if missing:
        raise CheckpointError(f"{name} has no {missing[0]!r}: {REDO}")
    if len(record) != len(keys):
        other = next(key for key in record if key not in keys)
        raise CheckpointError(f"{name} has an unknown field {describe(other)}: {REDO}")
    return record


def round_robin(batches_seen: int, workers: int, per_worker: int) -> list[int]:
    """Batches each of a rank's workers had delivered after batches_seen in all: a DataLoader takes them from
    its workers in turn, and every worker here has the same number."""
    workers = max(workers, 1)
    rounds, extra = divmod(max(batches_seen, 0), workers)
    return [min(per_worker, rounds + (1 if k < extra else 0)) for k in range(workers)]
