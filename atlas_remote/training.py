"""Feeding training loops: block-aware shuffling (map-style), batches per DataLoader worker, and streaming.

Random shuffling over a remote dataset touches a different block for every example, so every example costs a
request and most of each fetched block is thrown away. These samplers shuffle the order of blocks, then shuffle
the examples inside a window of consecutive (in the shuffled order) blocks: a fetched block is used whole while
it is in the cache, and an epoch is still a thorough shuffle. Everything is deterministic for (seed, epoch).

Only `AtlasIterableDataset` needs torch; the samplers are plain Python objects a DataLoader accepts.
"""

from __future__ import annotations

import random
from typing import Any, Iterator

from .reader import AtlasDataset

try:  # torch is optional: only the streaming dataset needs it, and the core never imports this module
    from torch.utils.data import IterableDataset as _IterableBase
except ImportError:  # pragma: no cover - exercised only without torch
    _IterableBase = object


class BlockShuffleSampler:
    """Indices of one epoch: blocks shuffled, then examples shuffled within windows of `window_blocks` blocks.

    Distributed: give `rank` and `world_size`; every rank takes a disjoint share of the blocks, and all ranks
    yield the same number of indices: the shorter ones repeat their first indices (`drop_last=False`) or the
    longer ones stop early (`drop_last=True`). Blocks of shards missing on this node are simply not there.

    Resumable: `state_dict(examples_seen=n)` after n examples of the epoch were consumed, `load_state_dict()`
    on a new sampler, and the rest of the epoch follows exactly. (A DataLoader draws indices ahead of what the
    loop has consumed, so pass the count the loop saw; without it the count of indices drawn is used.)
    """

    def __init__(self, dataset: AtlasDataset, window_blocks: int = 8, seed: int = 0, shuffle: bool = True,
                 rank: int = 0, world_size: int = 1, drop_last: bool = False) -> None:
        if window_blocks < 1:
            raise ValueError(f"window_blocks must be >= 1, got {window_blocks}")
        if not 0 <= rank < world_size:
            raise ValueError(f"rank must be in [0, {world_size}), got {rank}")
        self.blocks = dataset.block_ranges()
        self.window_blocks, self.seed, self.shuffle = window_blocks, seed, shuffle
        self.rank, self.world_size, self.drop_last = rank, world_size, drop_last
        self.epoch = 0
        self._start = 0  # indices of this epoch already consumed (after load_state_dict)
        self._drawn = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch, self._start, self._drawn = epoch, 0, 0

    def windows(self) -> list[list[int]]:
        """This rank's epoch as windows of indices, each window's examples shuffled."""
        order = list(range(len(self.blocks)))
        if self.shuffle:
            random.Random(f"{self.seed}/{self.epoch}").shuffle(order)  # the same on every rank
        shares = [order[r :: self.world_size] for r in range(self.world_size)]
        sizes = [sum(self.blocks[b][1] - self.blocks[b][0] for b in share) for share in shares]
        target = min(sizes) if self.drop_last else max(sizes)
        mine = shares[self.rank]
        rng = random.Random(f"{self.seed}/{self.epoch}/{self.rank}")
        windows = []
        for i in range(0, len(mine), self.window_blocks):
            window = [j for b in mine[i : i + self.window_blocks] for j in range(*self.blocks[b])]
            if self.shuffle:
                rng.shuffle(window)
            windows.append(window)
        return _fit(windows, target)

    def __iter__(self) -> Iterator[int]:
        indices = [i for window in self.windows() for i in window][self._start :]
        self._drawn = self._start
        for i in indices:
            self._drawn += 1
            yield i

    def __len__(self) -> int:
        return sum(len(w) for w in self.windows())

    def state_dict(self, examples_seen: int | None = None) -> dict[str, int]:
        return {"seed": self.seed, "epoch": self.epoch,
                "examples_seen": self._drawn if examples_seen is None else examples_seen}

    def load_state_dict(self, state: dict[str, int]) -> None:
        if state["seed"] != self.seed:
            raise ValueError(f"state was saved with seed {state['seed']}, this sampler has seed {self.seed}")
        self.epoch, self._start = state["epoch"], state["examples_seen"]


def _fit(windows: list[list[int]], target: int) -> list[list[int]]:
    """Cut windows down to `target` indices, or pad them by repeating the first indices, so ranks match."""
    total = sum(len(w) for w in windows)
    if total > target:
        out, left = [], target
        for window in windows:
            if left <= 0:
                break
            out.append(window[:left])
            left -= len(out[-1])
        return out
    flat = [i for w in windows for i in w]
    if total < target and flat:
        padding = (flat * (target // len(flat) + 1))[: target - total]
        windows = windows + [padding]
    return windows


class BlockBatchSampler:
    """Batches for `DataLoader(dataset, batch_sampler=..., num_workers=N)` in which every window of blocks goes
    to one worker: the DataLoader hands batch i to worker i % N, so worker k gets the batches cut from windows
    k, k + N, ... Each block is then fetched by one worker, once, instead of by every worker whose batches it
    appears in. A batch is fetched with one round of concurrent requests (`__getitems__`)."""

    def __init__(self, sampler: BlockShuffleSampler, batch_size: int, num_workers: int = 0, drop_last: bool = False):
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.sampler, self.batch_size, self.drop_last = sampler, batch_size, drop_last
        self.streams = max(num_workers, 1)
        self._start = 0
        self._drawn = 0

    def set_epoch(self, epoch: int) -> None:
        self.sampler.set_epoch(epoch)
        self._start = self._drawn = 0

    def batches(self) -> list[list[int]]:
        windows = self.sampler.windows()
        streams = [[i for w in windows[k :: self.streams] for i in w] for k in range(self.streams)]
        cut = [[s[i : i + self.batch_size] for i in range(0, len(s), self.batch_size)] for s in streams]
        if self.drop_last:
            cut = [[b for b in batches if len(b) == self.batch_size] for batches in cut]
        out = []
        for round_ in range(max((len(c) for c in cut), default=0)):
            out += [batches[round_] for batches in cut if round_ < len(batches)]
        return out

    def __iter__(self) -> Iterator[list[int]]:
        self._drawn = self._start
        for batch in self.batches()[self._start :]:
            self._drawn += 1
            yield batch

    def __len__(self) -> int:
        return len(self.batches())

    def state_dict(self, batches_seen: int | None = None) -> dict[str, int]:
        return {**self.sampler.state_dict(0), "batches_seen": self._drawn if batches_seen is None else batches_seen}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.sampler.load_state_dict({**state, "examples_seen": 0})
        self._start = state["batches_seen"]


class AtlasIterableDataset(_IterableBase):
    """Streaming: shards split across ranks, then across the DataLoader workers of each rank; each worker
    reads its shards in order with read-ahead. Shards are the unit, so balance needs many more shards than
    ranks x workers."""

    def __init__(self, dataset: AtlasDataset, rank: int = 0, world_size: int = 1) -> None:
        if _IterableBase is object:
            raise ImportError("AtlasIterableDataset needs torch: pip install 'atlas_remote[torch]'")
        super().__init__()
        self.dataset, self.rank, self.world_size = dataset, rank, world_size

    def __iter__(self) -> Iterator[Any]:
        from torch.utils.data import get_worker_info

        info = get_worker_info()
        workers, worker = (info.num_workers, info.id) if info else (1, 0)
        return self.dataset.iter_shards(self.rank * workers + worker, self.world_size * workers)
