"""Where a training epoch stands, without torch: the plan of the current epoch (made once per epoch and process),
the state of the epoch (epoch_state.py), and the deal of what is left to the job's streams. The stream and the
samplers of training.py are thin torch-facing shells over `Epochs`."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from ..errors import CheckpointError, UsageError
from ..read.megatron import MegatronCorpus
from ..read.reader import AtlasDataset
from .epoch_state import MAX_COUNT, REDO, STATE_FORMAT, Deal, EpochState, Segment, describe, fields, integer
from .mixture import Mixture
from .plan import EpochPlan

WORKER_FORMAT = "atlas_remote.stream/1"  # a stream worker's state, as a StatefulDataLoader keeps it


class Sources:
    """The datasets of a stream or sampler and their layouts (from each dataset's manifest, or its shards'
    meta.json files fetched together once, in the process that makes the plan: workers get them pickled)."""

    made_of = "the datasets, their weights, window_blocks or run_blocks"  # what a saved state's plan must match

    def __init__(self, data: AtlasDataset | MegatronCorpus | Mixture) -> None:
        self.mixture = data if isinstance(data, Mixture) else Mixture([data])
        self._layouts: list | None = None

    @classmethod
    def of(cls, data: Any) -> Sources:
        return data if isinstance(data, Sources) else cls(data)

    @property
    def datasets(self) -> list[AtlasDataset]:
        return self.mixture.datasets

    @property
    def name(self) -> str:
        """The dataset, or the datasets of a mixture, as errors name them."""
        names = self.mixture.names
        return names[0] if len(names) == 1 else f"mixture of {', '.join(names)}"

    def layouts(self) -> list:
        if self._layouts is None:
            self._layouts = [ds.layout() for ds in self.datasets]
        return self._layouts

    def plan(self, seed: int, epoch: int, window_blocks: int, run_blocks: int, shuffle: bool = True) -> EpochPlan:
        return EpochPlan(self.mixture.sources(self.layouts()), seed, epoch, window_blocks, run_blocks, shuffle)

    def check(self, run_blocks: int) -> None:
        """UsageError where a mixture's dataset asked for a share holds nothing to serve: its share was left out
        and the others served alone, silently."""
        if len(self.datasets) == 1:
            return
        for d, (name, asked) in enumerate(zip(self.mixture.names, self.mixture.asked())):
            if asked and not len(self.layouts()[d]):
                raise UsageError(
                    f"{name}, dataset {d} of the mixture, holds no examples: its share cannot be served; leave it "
                    f"out of the Mixture, or give it weight 0",
                    url=name,
                )


class Epochs:
    """What a stream and the samplers share: the plan of the current epoch (made once per epoch and process),
    where the epoch stands (`EpochState`), and the deal of what is left to `streams` streams, `workers` a rank."""

    def __init__(
        self,
        data: AtlasDataset | Mixture | Sources,
        seed: int,
        window_blocks: int,
        run_blocks: int,
        shuffle: bool,
        streams: int,
        workers: int,
        batch_size: int,
        drop_last: bool,
    ) -> None:
        if seed < 0:
            raise ValueError(f"seed must be >= 0, got {seed}")
        self.sources = Sources.of(data)
        self.seed, self.window_blocks, self.run_blocks, self.shuffle = seed, window_blocks, run_blocks, shuffle
        self.streams, self.workers, self.batch_size, self.drop_last = streams, workers, batch_size, drop_last
        self.state = EpochState(0, seed)
        self._plan: EpochPlan | None = None
        self._deal: tuple[Any, Deal] | None = None

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_plan"] = state["_deal"] = None  # a worker works out its own, in what it holds of the plan
        return state

    @property
    def shape(self) -> tuple[int, int, int, bool]:
        return self.streams, self.workers, self.batch_size, self.drop_last

    def plan(self, epoch: int) -> EpochPlan:
        if self._plan is None or self._plan.epoch != epoch:
            self._plan = self.sources.plan(self.seed, epoch, self.window_blocks, self.run_blocks, self.shuffle)
        return self._plan

    def deal(self) -> tuple[Deal, int]:
        """The deal being served and the batches every rank has taken from it: the state's last deal where it
        has this shape, else what is left of the epoch dealt afresh (and the state's last deal is then this)."""
        state = self.state
        plan = self.plan(state.epoch)
        if not state.deals or state.deals[-1].shape != self.shape:
            state = state.after(Segment(*self.shape, 0))
        self.state = state = EpochState(state.epoch, self.seed, plan.digest(), state.deals)
        key = (state.epoch, state.deals[:-1])
        if self._deal is None or self._deal[0] != key:
            served = EpochState(state.epoch, deals=state.deals[:-1]).served(plan)
            self._deal = (key, Deal(plan, served, self.streams, self.batch_size, self.drop_last))
        return self._deal[1], state.deals[-1].batches

    def set_epoch(self, epoch: int) -> None:
        """A new epoch from its start; the epoch a loaded state is in keeps its resume point."""
        if epoch != self.state.epoch:
            self.state = EpochState(epoch, self.seed)

    def after(self, batches_seen: int) -> EpochState:
        """The job's state once every rank has taken batches_seen more batches of the current deal; once the
        last batch is taken, the next epoch's start. More batches than the epoch has left is a mistake."""
        deal, taken = self.deal()
        left = deal.batches_per_stream * self.workers - taken
        if isinstance(batches_seen, bool) or not isinstance(batches_seen, int) or not 0 <= batches_seen <= left:
            raise ValueError(
                f"batches_seen={batches_seen!r}, but epoch {self.state.epoch} has {left:,} batches per rank left "
                f"from where it stood: count the batches this pass yielded (0 to {left:,})"
            )
        if batches_seen == left:
            return EpochState(self.state.epoch + 1, self.seed, self.state.plan)
        if taken + batches_seen == 0:  # a deal that served nothing is not part of the state
            return EpochState(self.state.epoch, self.seed, self.state.plan, self.state.deals[:-1])
        return self.state.after(Segment(*self.shape, taken + batches_seen))

    def load(self, state: Any) -> EpochState:
        """Go on from a state of any topology: every field checked, every deal replayed (CheckpointError names
        what no run could have written)."""
        try:
            loaded = state if isinstance(state, EpochState) else state_of(state)
            plan = self.plan(loaded.epoch)
            loaded.check(plan, self.sources.made_of)
            loaded = loaded.replayed(plan)
        except CheckpointError as error:
            raise error.located(url=self.sources.name) from None
        self.state = EpochState(loaded.epoch, self.seed, self.plan(loaded.epoch).digest(), loaded.deals)
        return self.state


@dataclass(frozen=True)
class WorkerState:
    """What one DataLoader worker's copy of a stream reports (a StatefulDataLoader keeps it): the state its pass
    started from, the shape of the deal it serves, which worker it is, and the batches it yielded."""

    state: EpochState
    shape: tuple[int, int, int, bool]
    worker: int
    batches: int

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": WORKER_FORMAT,
            "state": self.state.to_dict(),
            "shape": list(self.shape),
            "worker": self.worker,
            "batches": self.batches,
        }

    @classmethod
    def from_dict(cls, record: Any) -> WorkerState:
        record = fields(record, "stream worker state", ("format", "state", "shape", "worker", "batches"))
        shape = record["shape"]
        if not isinstance(shape, (list, tuple)) or len(shape) != 4:
            raise CheckpointError(
                f"stream worker state: shape must be [streams, workers, batch_size, drop_last]: {REDO}"
            )
        segment = Segment.from_dict(
            dict(zip(("streams", "workers", "batch_size", "drop_last"), shape), batches=0), "stream worker state: shape"
        )
        worker = integer(record["worker"], "stream worker state: worker", 0, segment.workers - 1)
        batches = integer(record["batches"], "stream worker state: batches", 0, MAX_COUNT)
        return cls(EpochState.from_dict(record["state"]), segment.shape, worker, batches)


def state_of(state: Any) -> EpochState:
    """An epoch state from what a user saved: ours (`state_dict`), or a torchdata StatefulDataLoader's, whose
    workers' states say how many batches each yielded since the deal they serve began (ranks move in step, so
    one rank's workers tell the whole job's progress)."""
    if isinstance(state, dict) and state.get("format") == STATE_FORMAT:
        return EpochState.from_dict(state)
    records = list(worker_states(state))
    ours = [record for record in records if record.get("format") == STATE_FORMAT]
    if ours:  # a StatefulDataLoader without workers keeps the stream's own state_dict()
        if len(records) > 1:
            raise CheckpointError(f"a saved state holding {len(records)} stream states where one was expected: {REDO}")
        return EpochState.from_dict(ours[0])
    found = [WorkerState.from_dict(record) for record in records]
    if not found:
        got = f"format {describe(state.get('format'))}" if isinstance(state, dict) else describe(state)
        raise CheckpointError(
            f"not an atlas_remote stream state (expected format {STATE_FORMAT!r} as state_dict() returns, or a "
            f"StatefulDataLoader's state_dict over a stream; got {got}): {REDO}"
        )
    first = found[0]
    if any((f.state, f.shape) != (first.state, first.shape) for f in found):
        raise CheckpointError(f"the workers' states come from different epochs or resume points: {REDO}")
    workers = [f.worker for f in found]
    if len(set(workers)) != len(workers):
        raise CheckpointError(f"two workers' states name the same worker: {REDO}")
    base, (streams, n_workers, batch_size, drop_last) = first.state, first.shape
    taken = base.deals[-1].batches if base.deals and base.deals[-1].shape == first.shape else 0
    yielded = taken + sum(f.batches for f in found)
    return base.after(Segment(streams, n_workers, batch_size, drop_last, yielded))


MAX_NODES = 100_000  # values looked at while searching a saved state for our workers' states
MAX_DEPTH = 32


def worker_states(state: Any) -> Iterator[Any]:
    """Our states anywhere inside a nested dict (a StatefulDataLoader keeps each worker's under its own keys,
    or the stream's without workers), searched without recursion and within a bound: it may come from anyone."""
    stack, seen = [(state, 0)], 0
    while stack:
        value, depth = stack.pop()
        if not isinstance(value, dict):
            continue
        if value.get("format") in (WORKER_FORMAT, STATE_FORMAT):
            yield value
            continue
        seen += len(value)
        if seen > MAX_NODES or depth >= MAX_DEPTH:
            raise CheckpointError(
                f"a saved state nested deeper than {MAX_DEPTH} or holding more than {MAX_NODES:,} values: not "
                f"what state_dict() or a StatefulDataLoader writes: {REDO}"
            )
        stack.extend((item, depth + 1) for item in reversed(list(value.values())))
