"""Map-style sampling of a shuffled epoch: this rank's example indices in the stream's order, and batches cut
so that each window of blocks goes to one DataLoader worker. Plain Python objects a DataLoader accepts (no
torch needed), over the same plan, deals and states as the streams (`epochs.Epochs`)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np

from ..read.reader import AtlasDataset
from .epochs import Epochs
from .plan import EpochPlan
from .ranks import rank_and_world

__all__ = ["BlockBatchSampler", "BlockShuffleSampler"]


class BlockShuffleSampler:
    """This rank's example indices for one epoch, in the stream's order (runs of `run_blocks` blocks shuffled,
    examples shuffled within windows of `window_blocks` blocks): a map-style sampler for a DataLoader.

    Every rank yields the same number of indices (repeating a few, or with `drop_last` leaving a few out).
    Resumable at any world size: `state_dict(examples_seen=n)` after every rank drew n indices, then
    `load_state_dict` on a new sampler.
    """

    def __init__(
        self,
        dataset: AtlasDataset,
        window_blocks: int = 8,
        seed: int = 0,
        shuffle: bool = True,
        rank: int | None = None,
        world_size: int | None = None,
        drop_last: bool = False,
        run_blocks: int = 1,
    ) -> None:
        rank, world_size = rank_and_world(rank, world_size, "BlockShuffleSampler")
        self.dataset, self.rank, self.world_size, self.drop_last = dataset, rank, world_size, drop_last
        self.epochs = Epochs(dataset, seed, window_blocks, run_blocks, shuffle, world_size, 1, 1, drop_last)
        self._drawn = 0

    @property
    def epoch(self) -> int:
        return self.epochs.state.epoch

    def set_epoch(self, epoch: int) -> None:
        self.epochs.set_epoch(epoch)

    def __iter__(self) -> Iterator[int]:
        deal, taken = self.epochs.deal()
        plan, piece = deal.plan, deal.rest(self.rank, taken)
        self._drawn = 0
        for start, stop in piece.tolist():
            for _, _, examples in plan.examples(start, stop):
                for i in examples.tolist():
                    self._drawn += 1
                    yield i

    def __len__(self) -> int:
        deal, taken = self.epochs.deal()
        return deal.batches_per_stream - taken

    def state_dict(self, examples_seen: int | None = None) -> dict[str, Any]:
        return self.epochs.after(self._drawn if examples_seen is None else examples_seen).to_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.epochs.load(state)


class BlockBatchSampler:
    """Batches for `DataLoader(dataset, batch_sampler=..., num_workers=N)` in which every window of blocks goes
    to one worker: the DataLoader hands batch i to worker i % N, so batch i is cut from the piece of the epoch
    dealt to that worker. Each block is then fetched by one worker (`__getitems__` fetches a batch's blocks in
    one round of concurrent requests), and every rank yields the same number of batches.

    Resumable at any world size or worker count: `state_dict(batches_seen=n)`, then `load_state_dict`.
    """

    def __init__(self, sampler: BlockShuffleSampler, batch_size: int, num_workers: int = 0, drop_last: bool = False):
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.sampler, self.batch_size, self.drop_last = sampler, batch_size, drop_last or sampler.drop_last
        self.workers = max(num_workers, 1)
        e = sampler.epochs
        self.epochs = Epochs(
            sampler.dataset,
            e.seed,
            e.window_blocks,
            e.run_blocks,
            e.shuffle,
            sampler.world_size * self.workers,
            self.workers,
            batch_size,
            self.drop_last,
        )
        self.epochs.state = e.state
        self._drawn = 0

    def set_epoch(self, epoch: int) -> None:
        self.sampler.set_epoch(epoch)
        self.epochs.set_epoch(epoch)

    def batches(self) -> Iterator[list[int]]:
        """This rank's batches in the order a DataLoader delivers them: one from each worker's piece in turn."""
        deal, taken = self.epochs.deal()
        rank = self.sampler.rank * self.workers
        streams = []
        for worker in range(self.workers):  # turned so that the stream whose turn is next comes first
            turn, skip = deal.resume_point(self.workers, taken, worker)
            streams.append(self._cut(deal.plan, deal.rest(rank + turn, skip)))
        for _ in range(deal.batches_per_stream * self.workers - taken):
            stream = streams.pop(0)
            batch = next(stream, None)
            streams.append(stream)
            if batch is not None:
                yield batch

    def _cut(self, plan: EpochPlan, piece: np.ndarray) -> Iterator[list[int]]:
        batch: list[int] = []
        for start, stop in piece.tolist():
            for _, _, examples in plan.examples(start, stop):
                batch += examples.tolist()
                while len(batch) >= self.batch_size:
                    yield batch[: self.batch_size]
                    batch = batch[self.batch_size :]
        if batch:
            yield batch

    def __iter__(self) -> Iterator[list[int]]:
        self._drawn = 0
        for batch in self.batches():
            self._drawn += 1
            yield batch

    def __len__(self) -> int:
        deal, taken = self.epochs.deal()
        return deal.batches_per_stream * self.workers - taken

    def state_dict(self, batches_seen: int | None = None) -> dict[str, Any]:
        return self.epochs.after(self._drawn if batches_seen is None else batches_seen).to_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.epochs.load(state)
        self.sampler.epochs.state = self.epochs.state
