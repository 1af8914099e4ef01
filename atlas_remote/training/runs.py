"""The runs an epoch is made of: a dataset's layout (examples per block, blocks per shard), its runs of
consecutive blocks, the keyed permutation that orders them, and a source (a layout and its share of an epoch).
`plan.py` builds an epoch's order from these."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..format.spec import Layout

_M1, _M2, _GOLDEN = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB), np.uint64(0x9E3779B97F4A7C15)


class Runs:
    """The runs of a layout: up to `run_blocks` consecutive blocks of one shard, numbered in dataset order. Two
    integers a shard; everything else about a run is worked out when it is asked for."""

    def __init__(self, layout: Layout, run_blocks: int) -> None:
        self.layout, self.run_blocks = layout, run_blocks
        self.ends = np.cumsum(self._per_shard(np.arange(len(layout.sizes))))  # runs up to and including each shard
        self.starts = layout.starts

    def _per_shard(self, shard: np.ndarray) -> np.ndarray:
        blocks = -(-self.layout.sizes[shard] // self.layout.block_sizes[shard])
        return -(-blocks // self.run_blocks)

    def __len__(self) -> int:
        return int(self.ends[-1]) if len(self.ends) else 0

    @property
    def size(self) -> int:
        """Items (examples) in all the runs."""
        return len(self.layout)

    def spans(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(first example, number of examples) of each run."""
        shard = np.searchsorted(self.ends, ids, side="right")
        span = self.run_blocks * self.layout.block_sizes[shard]
        first = (ids - (self.ends[shard] - self._per_shard(shard))) * span
        return self.starts[shard] + first, np.minimum(span, self.layout.sizes[shard] - first)

    def whole(self) -> int | None:
        """The examples of every run but a shard's last, if that is one number (every shard one block size)."""
        present = self.layout.sizes > 0
        block_sizes = self.layout.block_sizes[present]
        if not len(block_sizes) or block_sizes.min() != block_sizes.max():
            return None
        return int(block_sizes[0]) * self.run_blocks

    def window_sizes(self, order: Permutation, per_window: int) -> np.ndarray:
        """Examples in each window of per_window runs taken in the order's sequence (an array per window: for a
        layout of several block sizes, or where that is smaller than `CycleEnds`' shortcut)."""
        n, windows = len(self), -(-len(self) // per_window)
        whole = self.whole()
        if whole is not None:  # every run whole but a shard's last: only those are looked at
            runs_in = np.full(windows, per_window, dtype=np.int64)
            runs_in[-1] = n - (windows - 1) * per_window
            last_runs = self.ends[self.layout.sizes > 0] - 1
            _, last_sizes = self.spans(last_runs)
            at = order.inverse(last_runs) // per_window
            short = np.bincount(at, weights=whole - last_sizes, minlength=windows).astype(np.int64)
            return runs_in * whole - short
        sizes = np.zeros(windows, dtype=np.int64)
        for lo in range(0, n, 1 << 20):  # any layout: every run, a slice at a time
            positions = np.arange(lo, min(lo + (1 << 20), n), dtype=np.int64)
            np.add.at(sizes, positions // per_window, self.spans(order(positions))[1])
        return sizes


class SizedRuns(Runs):
    """Runs of a layout whose items are not its examples but a number of their own per run (the packed
    sequences of `tokens.TokenStream`): items are numbered run after run. An array per run, the one thing a
    plan then holds beyond O(shards)."""

    def __init__(self, layout: Layout, run_blocks: int, items: np.ndarray) -> None:
        super().__init__(layout, run_blocks)
        self.items = np.asarray(items, dtype=np.int64)
        if self.items.shape != (len(self),) or (len(self.items) and self.items.min() < 0):
            raise ValueError(f"{len(self)} runs need as many item counts (>= 0), got {self.items.shape}")
        self.first = np.cumsum(self.items) - self.items

    @property
    def size(self) -> int:
        return int(self.items.sum())

    def spans(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return self.first[ids], self.items[ids]

    def whole(self) -> int | None:
        return None


class Permutation:
    """A keyed pseudo-random bijection of [0, n), computed at any index and inverted (a four-round Feistel
    network on the smallest even number of bits that holds n, cycle-walking back into range): a permutation of
    millions of runs without an array of them."""

    def __init__(self, n: int, key: Sequence[int] | None) -> None:
        self.n = n
        self.half = max((max(n - 1, 1).bit_length() + 1) // 2, 1)
        self.mask = np.uint64((1 << self.half) - 1)
        self.keys = None if key is None else np.random.SeedSequence([int(k) for k in key]).generate_state(4, np.uint64)

    def _mix(self, right: np.ndarray, key: np.uint64) -> np.ndarray:
        z = (right + key) * _GOLDEN
        z = (z ^ (z >> np.uint64(30))) * _M1
        z = (z ^ (z >> np.uint64(27))) * _M2
        return (z ^ (z >> np.uint64(31))) & self.mask

    def _walk(self, values: np.ndarray, step) -> np.ndarray:
        out = step(values)
        outside = out >= self.n
        while outside.any():
            out[outside] = step(out[outside])
            outside = out >= self.n
        return out

    def _forward(self, x: np.ndarray, keys: np.ndarray) -> np.ndarray:
        half = np.uint64(self.half)
        left, right = x >> half, x & self.mask
        for key in keys:
            left, right = right, left ^ self._mix(right, key)
        return (left << half) | right

    def _backward(self, y: np.ndarray, keys: np.ndarray) -> np.ndarray:
        half = np.uint64(self.half)
        left, right = y >> half, y & self.mask
        for key in keys[::-1]:
            left, right = right ^ self._mix(left, key), left
        return (left << half) | right

    def __call__(self, positions: np.ndarray) -> np.ndarray:
        """The element at each position of the permuted sequence."""
        keys = self.keys
        if keys is None:
            return np.asarray(positions, dtype=np.int64)
        with np.errstate(over="ignore"):
            return self._walk(np.asarray(positions, dtype=np.uint64), lambda x: self._forward(x, keys)).astype(np.int64)

    def inverse(self, elements: np.ndarray) -> np.ndarray:
        """The position of each element in the permuted sequence."""
        keys = self.keys
        if keys is None:
            return np.asarray(elements, dtype=np.int64)
        with np.errstate(over="ignore"):
            return self._walk(np.asarray(elements, dtype=np.uint64), lambda y: self._backward(y, keys)).astype(np.int64)


@dataclass(frozen=True)
class Source:
    """One dataset of an epoch: its layout and how many examples it gives the epoch."""

    layout: Layout
    count: int

    def runs(self, run_blocks: int) -> Runs:
        return Runs(self.layout, run_blocks)

    def digest(self) -> str:
        return f"{self.layout.digest()}:{self.count}"
