"""An epoch's order, from metadata only, whatever the number of ranks or workers that serve it.

The unit shuffled is a *run*: up to `run_blocks` consecutive blocks of one shard, read with one request. Runs
are shuffled (a permutation per seed, epoch, source and cycle), taken in that order until the source has given
its share of the epoch (cycling through further permutations to upsample), grouped into windows of about
`window_blocks` blocks, and the examples of each window are shuffled when the window is served, so every block
fetched is used whole. A mixture interleaves its sources' windows so that every prefix of the epoch holds each
source's share to within one window.

The epoch is then one sequence of positions `0 .. size - 1`. Nothing is stored per run: the permutation is a
keyed bijection (`Permutation`) computed at any index, a window's runs are worked out when it is served, and a
window's size comes from how many short runs (a shard's last) it holds. What is kept is a few integers per
window. Which stream serves which positions is decided elsewhere (`checkpoint.Deal`), from what is left of the
sequence: the order itself never depends on the topology.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np

_M1, _M2, _GOLDEN = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB), np.uint64(0x9E3779B97F4A7C15)


@dataclass(frozen=True, eq=False)
class Layout:
    """Where a dataset's examples are: the examples and block size of each shard present, in order."""

    sizes: np.ndarray  # examples per shard (int64)
    block_sizes: np.ndarray  # examples per block, per shard (int64)

    @classmethod
    def of(cls, sizes: Sequence[int] | np.ndarray, block_sizes: Sequence[int] | np.ndarray) -> Layout:
        sizes, block_sizes = np.asarray(sizes, dtype=np.int64), np.asarray(block_sizes, dtype=np.int64)
        if sizes.shape != block_sizes.shape or sizes.ndim != 1:
            raise ValueError("a layout needs one example count and one block size per shard")
        if np.any(sizes < 0) or np.any(block_sizes <= 0):
            raise ValueError("shard sizes must be >= 0 and block sizes > 0")
        return cls(sizes, block_sizes)

    def __len__(self) -> int:
        return int(self.sizes.sum())

    @property
    def starts(self) -> np.ndarray:
        """Global index of each shard's first example."""
        return np.cumsum(self.sizes) - self.sizes

    def digest(self) -> str:
        """Identifies the layout in a checkpoint: a state saved for one dataset is refused by another."""
        return hashlib.sha256(self.sizes.tobytes() + b"/" + self.block_sizes.tobytes()).hexdigest()[:16]


class Runs:
    """The runs of a layout: up to `run_blocks` consecutive blocks of one shard, numbered in dataset order."""

    def __init__(self, layout: Layout, run_blocks: int) -> None:
        self.layout, self.run_blocks = layout, run_blocks
        blocks = -(-layout.sizes // layout.block_sizes)
        self.per_shard = -(-blocks // run_blocks)
        self.ends = np.cumsum(self.per_shard)  # runs up to and including each shard
        self.firsts = self.ends - self.per_shard  # number of each shard's first run
        self.starts = layout.starts
        self.span = run_blocks * layout.block_sizes  # examples in a whole run, per shard

    def __len__(self) -> int:
        return int(self.ends[-1]) if len(self.ends) else 0

    def spans(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(first example, number of examples) of each run."""
        shard = np.searchsorted(self.ends, ids, side="right")
        first = (ids - self.firsts[shard]) * self.span[shard]
        return self.starts[shard] + first, np.minimum(self.span[shard], self.layout.sizes[shard] - first)

    def window_sizes(self, order: Permutation, per_window: int) -> np.ndarray:
        """Examples in each window of per_window runs taken in the order's sequence. A run is whole unless it is
        its shard's last, so only those are looked at (one per shard), unless block sizes differ between shards."""
        n, windows = len(self), -(-len(self) // per_window)
        runs_in = np.full(windows, per_window, dtype=np.int64)
        runs_in[-1] = n - (windows - 1) * per_window
        if len(np.unique(self.span[self.per_shard > 0])) <= 1:  # every whole run the same size
            whole = int(self.span[self.per_shard > 0][0])
            present = self.per_shard > 0
            last_runs = self.ends[present] - 1
            _, last_sizes = self.spans(last_runs)
            at = order.inverse(last_runs) // per_window
            short = np.bincount(at, weights=whole - last_sizes, minlength=windows).astype(np.int64)
            return runs_in * whole - short
        sizes = np.zeros(windows, dtype=np.int64)
        for lo in range(0, n, 1 << 20):  # any layout: every run, a slice at a time
            positions = np.arange(lo, min(lo + (1 << 20), n), dtype=np.int64)
            np.add.at(sizes, positions // per_window, self.spans(order(positions))[1])
        return sizes


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

    def _forward(self, x: np.ndarray) -> np.ndarray:
        half = np.uint64(self.half)
        left, right = x >> half, x & self.mask
        for key in self.keys:
            left, right = right, left ^ self._mix(right, key)
        return (left << half) | right

    def _backward(self, y: np.ndarray) -> np.ndarray:
        half = np.uint64(self.half)
        left, right = y >> half, y & self.mask
        for key in self.keys[::-1]:
            left, right = right ^ self._mix(left, key), left
        return (left << half) | right

    def __call__(self, positions: np.ndarray) -> np.ndarray:
        """The element at each position of the permuted sequence."""
        if self.keys is None:
            return np.asarray(positions, dtype=np.int64)
        with np.errstate(over="ignore"):
            return self._walk(np.asarray(positions, dtype=np.uint64), self._forward).astype(np.int64)

    def inverse(self, elements: np.ndarray) -> np.ndarray:
        """The position of each element in the permuted sequence."""
        if self.keys is None:
            return np.asarray(elements, dtype=np.int64)
        with np.errstate(over="ignore"):
            return self._walk(np.asarray(elements, dtype=np.uint64), self._backward).astype(np.int64)


@dataclass(frozen=True)
class Source:
    """One dataset of an epoch: its layout and how many examples it gives the epoch."""

    layout: Layout
    count: int


class EpochPlan:
    """The order of one epoch over one or more sources (a mixture), as windows of runs of blocks.

    `size` positions in all; `window(w)` and `examples(start, stop)` say what stands at them. Deterministic for
    (sources, counts, seed, epoch, window_blocks, run_blocks, shuffle).
    """

    def __init__(
        self,
        sources: Sequence[Source],
        seed: int = 0,
        epoch: int = 0,
        window_blocks: int = 64,
        run_blocks: int = 8,
        shuffle: bool = True,
    ) -> None:
        if window_blocks < 1 or run_blocks < 1:
            raise ValueError(f"window_blocks and run_blocks must be >= 1, got {window_blocks} and {run_blocks}")
        if seed < 0 or epoch < 0:
            raise ValueError(f"seed and epoch must be >= 0, got {seed} and {epoch}")
        self.sources, self.seed, self.epoch, self.shuffle = list(sources), seed, epoch, shuffle
        self.window_blocks, self.run_blocks = window_blocks, run_blocks
        self.per_window = max(window_blocks // run_blocks, 1)
        self.runs = [Runs(s.layout, run_blocks) for s in self.sources]
        self._windows_per_cycle: list[int] = []
        sizes = [self._source_windows(d, source.count) for d, source in enumerate(self.sources)]
        if len(sizes) == 1:  # one source: window w is its window w (no arrays of owners and indices)
            self.window_source = self.window_index = None
            self.window_sizes = sizes[0]
        else:
            # the share of each source done at each of its windows' ends
            key = np.concatenate([np.zeros(0)] + [np.cumsum(n) / max(s.count, 1) for n, s in zip(sizes, self.sources)])
            owner = np.concatenate([np.zeros(0, np.int64)] + [np.full(len(n), d) for d, n in enumerate(sizes)])
            order = np.lexsort((owner, key))  # by share done, then by source: every prefix keeps the proportions
            self.window_source = owner[order]
            self.window_index = np.concatenate([np.zeros(0, np.int64)] + [np.arange(len(n)) for n in sizes])[order]
            self.window_sizes = np.concatenate([np.zeros(0, np.int64), *sizes])[order]
        self.ends = np.cumsum(self.window_sizes)

    def _order(self, d: int, cycle: int) -> Permutation:
        return Permutation(len(self.runs[d]), (self.seed, self.epoch, d, cycle, 1) if self.shuffle else None)

    def _source_windows(self, d: int, count: int) -> np.ndarray:
        """The sizes of source d's windows this epoch: whole cycles through its runs while count exceeds the
        source, then windows of one more cycle until count is reached, the last window cut short."""
        runs, total = self.runs[d], len(self.sources[d].layout)
        self._windows_per_cycle.append(-(-len(runs) // self.per_window))
        if count <= 0 or total == 0:
            return np.zeros(0, np.int64)
        cycles, rest = divmod(count, total)
        sizes = [runs.window_sizes(self._order(d, cycle), self.per_window) for cycle in range(cycles)]
        if rest:
            partial = runs.window_sizes(self._order(d, cycles), self.per_window)
            ends = np.cumsum(partial)
            keep = int(np.searchsorted(ends, rest)) + 1
            partial = partial[:keep].copy()
            partial[-1] -= int(ends[keep - 1]) - rest
            sizes.append(partial)
        return np.concatenate(sizes)

    @property
    def size(self) -> int:
        return int(self.ends[-1]) if len(self.ends) else 0

    def __len__(self) -> int:
        return len(self.window_sizes)

    def digest(self) -> str:
        """Identifies what the plan is made of (not seed or epoch): a checkpoint records it, to be refused by a
        plan of other datasets, shares or knobs."""
        parts = [f"{s.layout.digest()}:{s.count}" for s in self.sources]
        text = f"{'|'.join(parts)}/{self.window_blocks}/{self.run_blocks}/{self.shuffle}"
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def window_of(self, position: int) -> int:
        return int(np.searchsorted(self.ends, position, side="right"))

    def window(self, w: int) -> tuple[int, np.ndarray]:
        """(source, its example indices in serving order) of window w."""
        if self.window_source is None:
            d, index = 0, w
        else:
            d, index = int(self.window_source[w]), int(self.window_index[w])
        cycle, k = divmod(index, self._windows_per_cycle[d])
        runs = self.runs[d]
        positions = np.arange(k * self.per_window, min((k + 1) * self.per_window, len(runs)), dtype=np.int64)
        starts, sizes = runs.spans(self._order(d, cycle)(positions))
        offsets = np.cumsum(sizes) - sizes
        examples = np.repeat(starts - offsets, sizes) + np.arange(int(sizes.sum()), dtype=np.int64)
        examples = examples[: int(self.window_sizes[w])]  # the source's last window may be cut short
        if self.shuffle:
            examples = np.random.default_rng(np.random.SeedSequence([self.seed, self.epoch, w, 2])).permutation(
                examples
            )
        return d, examples

    def examples(self, start: int, stop: int) -> Iterator[tuple[int, int, np.ndarray]]:
        """(window, source, example indices) for positions [start, stop), window by window."""
        position = start
        while position < stop:
            w = self.window_of(position)
            d, examples = self.window(w)
            base = int(self.ends[w]) - len(examples)
            end = min(stop, int(self.ends[w]))
            yield w, d, examples[position - base : end - base]
            position = end


def shares(weights: Sequence[float], total: int) -> list[int]:
    """`total` split in proportion to weights, each share a whole number and the shares summing to total
    (largest remainders first)."""
    w = np.asarray(weights, dtype=np.float64)
    if len(w) == 0 or np.any(w < 0) or not np.isfinite(w).all() or w.sum() <= 0:
        raise ValueError(f"weights must be non-negative, finite and not all zero, got {list(weights)}")
    exact = w / w.sum() * total
    counts = np.floor(exact).astype(np.int64)
    short = total - int(counts.sum())
    counts[np.argsort(-(exact - counts), kind="stable")[:short]] += 1
    return counts.tolist()
