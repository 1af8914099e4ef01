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

import functools
import hashlib
import heapq
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from ..format.spec import Layout  # noqa: F401 (imported from here too)
from .runs import Permutation, Runs, SizedRuns, Source  # noqa: F401 (SizedRuns: imported from here too)


def first_true(test: Callable[[np.ndarray], np.ndarray], lo: np.ndarray | int, hi: np.ndarray | int) -> np.ndarray:
    """The smallest k in [lo, hi] at which test(k) holds, element-wise, for a test false then true as k grows
    and true at hi (a bisection, so a sequence computed on demand is searched without being stored)."""
    lo, hi = np.array(lo, dtype=np.int64), np.array(hi, dtype=np.int64)
    while (lo < hi).any():
        mid = (lo + hi) // 2
        ok = test(mid)
        hi, lo = np.where(ok, mid, hi), np.where(ok, lo, mid + 1)
    return hi


class CycleEnds:
    """Examples in the first k windows of one pass through a source's runs (one permutation), for any k.

    Every run holds `whole` examples except a shard's last, so what is kept is where the short last runs fall
    in the permuted sequence and what they lack: a few integers per shard whose last run is short, never one
    per window (an array per window is kept instead where that is smaller, or where shards differ in block
    size)."""

    def __init__(self, runs: Runs, order: Permutation, per_window: int) -> None:
        self.per_window, self.runs = per_window, len(runs)
        self.windows = -(-len(runs) // per_window)
        self.ends: np.ndarray | None = None
        whole = runs.whole()
        if whole is not None:
            last = runs.ends[runs.layout.sizes > 0] - 1
            lack = whole - runs.spans(last)[1]
            if 2 * np.count_nonzero(lack) <= self.windows:
                short = lack > 0
                at = order.inverse(last[short])
                by_position = np.argsort(at)
                self.whole, self.at = whole, at[by_position]
                self.lacking = np.concatenate([[0], np.cumsum(lack[short][by_position])])
                return
        self.ends = np.concatenate([[0], np.cumsum(runs.window_sizes(order, per_window))])

    def __call__(self, k: np.ndarray) -> np.ndarray:
        if self.ends is not None:
            return self.ends[k]
        taken = np.minimum(np.asarray(k, dtype=np.int64) * self.per_window, self.runs)
        return taken * self.whole - self.lacking[np.searchsorted(self.at, taken, side="left")]


class SourceWindows:
    """One source's windows this epoch, in its own order: whole passes through its runs (each pass another
    permutation) while its count exceeds its size, then part of one more, the last window cut short.
    `cum(i)` is the examples in its first i windows; nothing is stored per window."""

    def __init__(self, runs: Runs, count: int, per_window: int, order: Callable[[int], Permutation]) -> None:
        self.runs, self.per_window, self.order = runs, per_window, order
        self.size = runs.size
        self.count = count if count > 0 and self.size > 0 else 0
        self.per_cycle = -(-len(runs) // per_window)
        self._cycles: dict[int, CycleEnds] = {}
        self._orders: dict[int, Permutation] = {}
        self._begins: dict[int, int] = {}
        self._last = -1
        self.windows = 0
        if self.count:
            cycles, rest = divmod(self.count, self.size)
            self.windows = cycles * self.per_cycle
            if rest:  # the windows of one more pass that reach rest examples
                ends = self.cycle(cycles)
                self.windows += int(first_true(lambda k: ends(k) >= rest, 1, self.per_cycle))

    def permutation(self, c: int) -> Permutation:
        if c not in self._orders:
            self._orders[c] = self.order(c)
        return self._orders[c]

    def cycle(self, c: int) -> CycleEnds:
        if c not in self._cycles:
            self._cycles[c] = CycleEnds(self.runs, self.permutation(c), self.per_window)
        return self._cycles[c]

    def cum(self, i: np.ndarray) -> np.ndarray:
        """Examples in the first i windows (0 <= i <= windows), element-wise."""
        cycle, k = np.divmod(np.asarray(i, dtype=np.int64), max(self.per_cycle, 1))
        out = cycle * self.size
        for c in np.unique(cycle[k > 0]).tolist():
            inside = (cycle == c) & (k > 0)
            out[inside] += self.cycle(c)(k[inside])
        return np.minimum(out, self.count)

    def over(self, lo: int, hi: int) -> tuple[np.ndarray, np.ndarray]:
        """The windows holding items [lo, hi) of the source (lo < hi), and where each begins: found from the
        window found last (a stream's blocks ask for ranges one after another), by bisection otherwise."""
        i = self._last
        if not (0 <= i < self.windows and self._begin(i) <= lo < self._begin(i + 1)):
            i = int(self.locate(np.array([lo]))[0][0])
        windows, begins = [i], [self._begin(i)]
        while self._begin(windows[-1] + 1) < hi:
            windows.append(windows[-1] + 1)
            begins.append(self._begin(windows[-1]))
        self._last = windows[-1]
        return np.array(windows, dtype=np.int64), np.array(begins, dtype=np.int64)

    def _begin(self, i: int) -> int:
        """Items before window i, remembered for the few windows being served."""
        if i not in self._begins:
            if len(self._begins) > 64:
                self._begins.clear()
            self._begins[i] = int(self.cum(np.array([i]))[0])
        return self._begins[i]

    def locate(self, items: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The window holding each of the source's items (its own positions, 0 <= item < count), and the
        items before that window."""
        items = np.asarray(items, dtype=np.int64)
        if not len(items):
            return items, items
        window = first_true(
            lambda i: self.cum(i + 1) > items, np.zeros_like(items), np.full_like(items, self.windows - 1)
        )
        return window, self.cum(window)

    def window(self, i: int, size: int) -> np.ndarray:
        """The examples of window i, in run order (not yet shuffled); `size` of them, as the source's last
        window may be cut short."""
        cycle, k = divmod(i, self.per_cycle)
        positions = np.arange(k * self.per_window, min((k + 1) * self.per_window, len(self.runs)), dtype=np.int64)
        starts, sizes = self.runs.spans(self.permutation(cycle)(positions))
        offsets = np.cumsum(sizes) - sizes
        examples = np.repeat(starts - offsets, sizes) + np.arange(int(sizes.sum()), dtype=np.int64)
        return examples[:size]


@dataclass(frozen=True, eq=False)
class Chunk:
    """Consecutive windows of the epoch, worked out together: each one's source, its index among that source's
    windows, and the epoch position it ends at."""

    first_window: int
    start: int  # the epoch position of its first example
    source: np.ndarray
    index: np.ndarray
    ends: np.ndarray


CHUNK_WINDOWS = 4096  # windows of the epoch worked out at once, and all of its order a process holds


class EpochPlan:
    """The order of one epoch over one or more sources (a mixture), as windows of runs of blocks.

    `size` positions in all; `segments`, `needs`, `window(w)` and `examples(start, stop)` say what stands at
    them. Deterministic for (sources, counts, seed, epoch, window_blocks, run_blocks, shuffle).

    One source: its windows one after another, worked out a chunk at a time when positions in them are asked
    for, so a process holds O(shards), not O(windows). Several (a mixture): each source's items in its own
    order (its windows, one after another), interleaved by share done, so that every prefix of the epoch holds
    every source's share to within `mix` items; positions are then shuffled within blocks of `mix` (about a
    window's items), so a batch draws on every source as drawing each item independently would (`mixed_taken`).
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
        self.runs = [s.runs(run_blocks) for s in self.sources]
        self.windows = [
            SourceWindows(runs, source.count, self.per_window, functools.partial(self._order, d))
            for d, (runs, source) in enumerate(zip(self.runs, self.sources))
        ]
        self.size = sum(w.count for w in self.windows)
        self.base = np.concatenate([[0], np.cumsum([w.windows for w in self.windows])]).astype(np.int64)
        self.active = [d for d, w in enumerate(self.windows) if w.windows]
        self.mixed = len(self.active) > 1
        self.mix = min((self.windows[d].count // self.windows[d].windows for d in self.active), default=1)
        self.mix = max(self.mix, 1)
        self._bounds = self._chunk_bounds(max(-(-int(self.base[-1]) // CHUNK_WINDOWS), 1))
        self._first_window = self._bounds.sum(axis=1)
        self._first_position = sum(
            (w.cum(self._bounds[:, d]) for d, w in enumerate(self.windows)), np.zeros(len(self._bounds), np.int64)
        )
        self._chunk: tuple[int, Chunk] | None = None
        self._block: tuple[int, tuple[np.ndarray, np.ndarray]] | None = None
        self._cached: dict[int, np.ndarray] = {}

    def _order(self, d: int, cycle: int) -> Permutation:
        return Permutation(len(self.runs[d]), (self.seed, self.epoch, d, cycle, 1) if self.shuffle else None)

    def _chunk_bounds(self, chunks: int) -> np.ndarray:
        """How many of the (one active) source's windows come before each chunk: (chunks + 1, sources). A
        mixture is not worked out by chunks (see `mixed_taken`)."""
        bounds = np.zeros((chunks + 1, len(self.windows)), dtype=np.int64)
        if len(self.active) == 1:
            d = self.active[0]
            bounds[:, d] = np.minimum(np.arange(chunks + 1) * CHUNK_WINDOWS, self.windows[d].windows)
        return bounds

    def chunk(self, j: int) -> Chunk:
        cached = self._chunk
        if cached is not None and cached[0] == j:
            return cached[1]
        sources, indices, sizes = [], [], []
        for d, w in enumerate(self.windows):
            lo, hi = int(self._bounds[j, d]), int(self._bounds[j + 1, d])
            if hi > lo:
                sources.append(np.full(hi - lo, d, dtype=np.int64))
                indices.append(np.arange(lo, hi, dtype=np.int64))
                sizes.append(np.diff(w.cum(np.arange(lo, hi + 1))))
        source, index, size = (np.concatenate([np.zeros(0, np.int64), *x]) for x in (sources, indices, sizes))
        start = int(self._first_position[j])
        chunk = Chunk(int(self._first_window[j]), start, source, index, start + np.cumsum(size))
        self._chunk = (j, chunk)
        return chunk

    def __len__(self) -> int:
        """Windows in the epoch, over all sources."""
        return int(self.base[-1])

    def digest(self) -> str:
        """Identifies what the plan is made of (not seed or epoch): a checkpoint records it, to be refused by a
        plan of other datasets, shares or knobs."""
        parts = [s.digest() for s in self.sources]
        text = f"{'|'.join(parts)}/{self.window_blocks}/{self.run_blocks}/{self.shuffle}"
        if self.mixed:  # mixed inside batches since 0.x: a state of the order merged by windows is refused
            text += "/mixed"
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    # -- a mixture: items of every source interleaved by share done ----------------------------------------

    @property
    def scale(self) -> int:
        """log2 of what a share done is scaled by to be an integer key: 4 x the epoch's size at least."""
        return max(self.size, 1).bit_length() + 2

    def mixed_taken(self, position: int) -> np.ndarray:
        """How many items of each source the first `position` positions hold (before the shuffle within blocks):
        the merge of every source's items by share done, item k of a source of count c keyed
        floor((k + 1) 2^scale / c), ties by source. Exact in integers, the same in every process, and monotone
        in position, so every prefix holds every source's share to within an item or two per source."""
        taken = np.zeros(len(self.windows), dtype=np.int64)
        if position <= 0:
            return taken
        counts = [(d, self.windows[d].count) for d in self.active]
        if position >= self.size:
            for d, c in counts:
                taken[d] = c
            return taken
        e = self.scale

        def upto(t: int) -> list[int]:  # items of each source with key <= t: floor(((t + 1) c - 1) / 2^e)
            return [min(c, max(((t + 1) * c - 1) >> e, 0)) for _, c in counts]

        lo, hi = -1, 1 << e  # sum(upto(lo)) < position <= sum(upto(hi))
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (lo, mid) if sum(upto(mid)) >= position else (mid, hi)
        below, at = upto(hi - 1), upto(hi)
        left = position - sum(below)
        for (d, _), b, a in zip(counts, below, at):  # items keyed exactly hi, by source
            taken[d] = b + min(a - b, left)
            left -= min(a - b, left)
        return taken

    def _mix_block(self, b: int) -> tuple[np.ndarray, np.ndarray]:
        """(source, item of that source) at each position of mix block b, shuffled within the block."""
        if self._block is not None and self._block[0] == b:
            return self._block[1]
        lo, hi = self.mixed_taken(b * self.mix), self.mixed_taken(min((b + 1) * self.mix, self.size))
        source = np.repeat(np.arange(len(self.windows), dtype=np.int64), hi - lo)
        items = np.concatenate([np.arange(a, z, dtype=np.int64) for a, z in zip(lo.tolist(), hi.tolist())])
        if self.shuffle:
            order = np.random.default_rng(np.random.SeedSequence([self.seed, self.epoch, b, 4])).permutation(len(items))
            source, items = source[order], items[order]
        self._block = (b, (source, items))
        return source, items

    def _mixed_segments(self, start: int, stop: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        for b in range(start // self.mix, -(-stop // self.mix)):
            first = b * self.mix
            source, items = self._mix_block(b)
            a, z = max(start - first, 0), min(stop - first, len(items))
            source, items = source[a:z], items[a:z]
            windows, offsets = np.empty_like(items), np.empty_like(items)
            for d in np.unique(source).tolist():
                mine = source == d
                own = items[mine]
                found, begins = self.windows[d].over(int(own.min()), int(own.max()) + 1)
                at = np.searchsorted(begins, own, side="right") - 1
                windows[mine], offsets[mine] = self.base[d] + found[at], own - begins[at]
            yield windows, offsets

    def _mixed_needs(self, start: int, stop: int) -> Iterator[tuple[int, int, int, int]]:
        """(window, source, first offset, last offset + 1) of every window whose items [start, stop) may draw
        on, each source's in its order, merged by the share done where each is first needed."""
        lo = self.mixed_taken(start // self.mix * self.mix)
        hi = self.mixed_taken(min(-(-stop // self.mix) * self.mix, self.size))

        def of(d: int) -> Iterator[tuple[float, int, int, int, int, int]]:
            w = self.windows[d]
            if hi[d] <= lo[d]:
                return
            first, _ = w.locate(np.array([lo[d]]))
            last, _ = w.locate(np.array([hi[d] - 1]))
            for i in range(int(first[0]), int(last[0]) + 1):
                begin, end = (int(x) for x in w.cum(np.array([i, i + 1])))
                a, z = max(lo[d], begin), min(hi[d], end)
                if z > a:
                    yield (a + 1) / w.count, d, int(self.base[d]) + i, d, a - begin, z - begin

        for _, _, window, d, a, z in heapq.merge(*(of(d) for d in self.active)):
            yield window, d, a, z

    # -- what stands at positions -------------------------------------------------------------------------

    def _locate(self, position: int) -> tuple[Chunk, int]:
        """The chunk holding a position, and the window's place in it (one source)."""
        j = int(np.searchsorted(self._first_position, position, side="right")) - 1
        chunk = self.chunk(j)
        return chunk, int(np.searchsorted(chunk.ends, position, side="right"))

    def window_of(self, position: int) -> int:
        if self.mixed:
            windows, _ = next(self._mixed_segments(position, position + 1))
            return int(windows[0])
        chunk, k = self._locate(position)
        return chunk.first_window + k

    def window(self, w: int) -> tuple[int, np.ndarray]:
        """(source, its example indices in serving order) of window w (its source's window w - base)."""
        if w not in self._cached:
            d = int(np.searchsorted(self.base, w, side="right")) - 1
            i = w - int(self.base[d])
            begin, end = (int(x) for x in self.windows[d].cum(np.array([i, i + 1])))
            examples = self.windows[d].window(i, end - begin)
            if self.shuffle:
                examples = np.random.default_rng(np.random.SeedSequence([self.seed, self.epoch, w, 2])).permutation(
                    examples
                )
            if len(self._cached) >= 2 * len(self.windows) + 2:  # the windows being served, a few per source
                self._cached.pop(next(iter(self._cached)))
            self._cached[w] = examples
        return self.source_of(w), self._cached[w]

    def source_of(self, w: int) -> int:
        return int(np.searchsorted(self.base, w, side="right")) - 1

    def segments(self, start: int, stop: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """(window, offset in that window's serving order) of each position in [start, stop), a stretch at a
        time: a window (one source), or a block of `mix` positions (a mixture)."""
        if self.mixed:
            yield from self._mixed_segments(start, stop)
            return
        position = start
        while position < stop:
            chunk, k = self._locate(position)
            end = int(chunk.ends[k])
            first = int(chunk.ends[k - 1]) if k else chunk.start
            size = min(stop, end) - position
            yield (
                np.full(size, chunk.first_window + k, dtype=np.int64),
                np.arange(position - first, min(stop, end) - first),
            )
            position = min(stop, end)

    def needs(self, start: int, stop: int) -> Iterator[tuple[int, int, np.ndarray]]:
        """(window, first offset, its examples from there in serving order) of every window positions [start,
        stop) draw on, in about the order they are first needed: what a stream fetches ahead, a window at a
        time (for a mixture, a block's worth more at either end)."""
        if self.mixed:
            for w, _, a, z in self._mixed_needs(start, stop):
                yield w, a, self.window(w)[1][a:z]
            return
        position = start
        while position < stop:
            chunk, k = self._locate(position)
            end = int(chunk.ends[k])
            w = chunk.first_window + k
            first = end - len(self.window(w)[1])
            yield w, position - first, self.window(w)[1][position - first : min(stop, end) - first]
            position = min(stop, end)

    def examples(self, start: int, stop: int) -> Iterator[tuple[int, int, np.ndarray]]:
        """(window, source, example indices) for positions [start, stop), in order, a stretch of one window at
        a time."""
        for windows, offsets in self.segments(start, stop):
            cuts = [0, *(np.flatnonzero(np.diff(windows)) + 1).tolist(), len(windows)]
            for a, z in zip(cuts, cuts[1:]):
                d, examples = self.window(int(windows[a]))
                yield int(windows[a]), d, examples[offsets[a:z]]


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
