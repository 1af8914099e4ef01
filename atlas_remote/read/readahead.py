"""Read-ahead: which blocks to fetch together (a pure function of a shard's offsets), and a pool that keeps the
next fetches in flight while the caller consumes the current one (in the manner of fsspec's caches, it is
handed a fetch callable and knows nothing of what it fetches)."""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import NamedTuple, TypeVar

import numpy as np

T = TypeVar("T")
R = TypeVar("R")
# Read-ahead windows this small start arriving soon, yet are large enough that the request latency is amortised.
WINDOW_BYTES = 2 * 1024 * 1024


class Window(NamedTuple):
    """A run of consecutive blocks of one shard, read together: blocks [block, stop_block), serving the
    shard-local examples [first, end)."""

    block: int
    stop_block: int
    first: int
    end: int

    def slice_of(self, block: int, block_size: int) -> slice:
        """The part of one of the window's blocks that the window's examples cover."""
        base = block * block_size
        return slice(max(self.first - base, 0), self.end - base)


def plan_windows(offsets: np.ndarray, block_size: int, first: int, stop: int, budget: int) -> Iterator[Window]:
    """Windows covering the shard-local examples [first, stop), each as many blocks as fit in budget bytes
    (always at least one block)."""
    while first < stop:
        block, last = first // block_size, (stop - 1) // block_size
        # the furthest block ending within the budget from this one's start
        within = int(np.searchsorted(offsets, int(offsets[block]) + budget, side="right")) - 2
        stop_block = min(max(within, block), last) + 1
        end = min(stop_block * block_size, stop)
        yield Window(block, stop_block, first, end)
        first = end


def split_window(window: Window, offsets: np.ndarray, block_size: int, fraction: int = 8) -> list[Window]:
    """The window cut in two, its first blocks (the fewest that hold 1/fraction of its bytes) apart: a pass's
    first examples then wait for a small decompression rather than a whole window's, while the rest decompresses
    beside them."""
    start = int(offsets[window.block])
    want = start + (int(offsets[window.stop_block]) - start) // fraction
    cut = min(max(int(np.searchsorted(offsets, want)), window.block + 1), window.stop_block)
    if cut == window.stop_block:
        return [window]
    end = cut * block_size
    return [Window(window.block, cut, window.first, end), Window(cut, window.stop_block, end, window.end)]


class Gate:
    """Whether read-aheads may fetch ahead yet: while shut, each fetches an item only once its caller asks for
    it; `open()` lets every one waiting fetch ahead at once (called from their callers' thread)."""

    def __init__(self) -> None:
        self.is_open = False
        self._waiting: list[Callable[[], None]] = []

    def open(self) -> None:
        self.is_open = True
        waiting, self._waiting = self._waiting, []
        for wake in waiting:
            wake()


def read_ahead(
    fetch: Callable[[T], R],
    items: Iterable[T],
    depth: int,
    name: str = "atlas-readahead",
    gate: Gate | None = None,
) -> Iterator[tuple[T, R]]:
    """(item, fetch(item)) in order, with up to depth fetches running ahead in threads (inline when depth is 0).

    Items are drawn from the iterable only as fetches are submitted, so a lazy plan stays lazy; fetches not
    yet started when the caller stops are cancelled. Behind a shut `gate`, an item is fetched once the caller
    asks for it, until the gate opens.
    """
    items = iter(items)
    if depth == 0:
        for item in items:
            yield item, fetch(item)
        return
    with ThreadPoolExecutor(max_workers=depth, thread_name_prefix=name) as pool:
        pending: deque = deque()
        done = False

        def top_up(n: int) -> None:
            if not done:
                for nxt in itertools.islice(items, max(n, 0)):
                    pending.append((nxt, pool.submit(fetch, nxt)))

        def wake() -> None:
            top_up(depth - len(pending))

        shut = gate is not None and not gate.is_open
        top_up(1 if shut else depth)
        if shut and gate is not None:
            gate._waiting.append(wake)
        try:
            while pending:
                item, future = pending.popleft()
                if gate is None or gate.is_open:
                    top_up(depth - len(pending))
                yield item, future.result()
                if not pending:
                    top_up(1)
        finally:
            done = True
            for _, future in pending:
                future.cancel()
