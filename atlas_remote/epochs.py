"""Where a training epoch stands, without torch: the plan of the current epoch (made once per epoch and process),
the state of the epoch (checkpoint.py), and the deal of what is left to the job's streams. The stream and the
samplers of training.py are thin torch-facing shells over `Epochs`."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from .checkpoint import STATE_FORMAT, Deal, EpochState, Segment
from .mixture import Mixture
from .plan import EpochPlan
from .reader import AtlasDataset

WORKER_FORMAT = "atlas_remote.stream/1"  # a stream worker's state, as a StatefulDataLoader keeps it


class Sources:
    """The datasets of a stream or sampler and their layouts (from each dataset's manifest, or its shards'
    meta.json files fetched together once, in the process that makes the plan: workers get them pickled)."""

    def __init__(self, data: AtlasDataset | Mixture) -> None:
        self.mixture = data if isinstance(data, Mixture) else Mixture([data])
        self._layouts: list | None = None

    @property
    def datasets(self) -> list[AtlasDataset]:
        return self.mixture.datasets

    def layouts(self) -> list:
        if self._layouts is None:
            self._layouts = [ds.layout() for ds in self.datasets]
        return self._layouts

    def plan(self, seed: int, epoch: int, window_blocks: int, run_blocks: int, shuffle: bool = True) -> EpochPlan:
        return EpochPlan(self.mixture.sources(self.layouts()), seed, epoch, window_blocks, run_blocks, shuffle)


class Epochs:
    """What a stream and the samplers share: the plan of the current epoch (made once per epoch and process),
    where the epoch stands (`EpochState`), and the deal of what is left to `streams` streams, `workers` a rank."""

    def __init__(
        self,
        data: AtlasDataset | Mixture,
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
        self.sources = Sources(data)
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
        last batch is taken, the next epoch's start."""
        deal, taken = self.deal()
        taken += batches_seen
        if taken >= deal.batches_per_stream * self.workers:
            return EpochState(self.state.epoch + 1, self.seed, self.state.plan)
        return self.state.after(Segment(*self.shape, taken))

    def load(self, state: dict[str, Any] | EpochState) -> EpochState:
        loaded = state if isinstance(state, EpochState) else state_of(state)
        plan = self.plan(loaded.epoch)
        loaded.check(plan)
        self.state = EpochState(loaded.epoch, self.seed, plan.digest(), loaded.deals)
        return self.state


def state_of(state: dict[str, Any]) -> EpochState:
    """An epoch state from what a user saved: ours (`state_dict`), or a torchdata StatefulDataLoader's, whose
    workers' states say how many batches each yielded since the deal they serve began (ranks move in step, so
    one rank's workers tell the whole job's progress)."""
    if isinstance(state, dict) and state.get("format") == STATE_FORMAT:
        return EpochState.from_dict(state)
    found = list(worker_states(state))
    if not found:
        raise ValueError(
            f"not an atlas_remote stream state (expected what state_dict() returns, or a "
            f"StatefulDataLoader's state_dict over a ShuffledStream): {str(state)[:120]}"
        )
    start = found[0]["state"]
    if any(f["state"] != start for f in found):
        raise ValueError("the workers' states come from different epochs or resume points")
    base = EpochState.from_dict(start)
    streams, workers, batch_size, drop_last = found[0]["shape"]
    shape = (streams, workers, batch_size, drop_last)
    taken = base.deals[-1].batches if base.deals and base.deals[-1].shape == shape else 0
    return base.after(Segment(streams, workers, batch_size, drop_last, taken + sum(f["batches"] for f in found)))


def worker_states(state: Any) -> Iterator[dict[str, Any]]:
    """Our workers' states anywhere inside a nested dict (a StatefulDataLoader keeps each worker's under its
    own keys)."""
    if isinstance(state, dict):
        if state.get("format") == WORKER_FORMAT:
            yield state
            return
        for value in state.values():
            yield from worker_states(value)
