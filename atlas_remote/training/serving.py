"""A stream's piece of an epoch, in position order, its windows fetched whole ahead of use.

A window is read once, with one request per run of blocks, however its items are spread over the positions: one
source's windows follow each other, and a mixture's positions interleave a window of each source (a batch draws
on several windows at once). The windows a piece needs are fetched in about the order they are first needed,
`prefetch` ahead (from the second window on: the first is fetched alone, so that a job whose streams all start at
once sends one window's requests a stream, not prefetch + 1); a window is let go once a later window of its
source is being served.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np

from ..read.readahead import Gate, read_ahead
from .plan import EpochPlan


def serve(
    plan: EpochPlan,
    piece: np.ndarray,
    fetch: Callable[[int, np.ndarray], list],
    prefetch: int,
    hold: Held | None = None,
) -> Iterator[list]:
    """The items at the piece's positions, in order, a list per stretch (a window, or a block of a mixture).
    `fetch(source, examples)` returns the items of a window's examples (decoded examples, packed sequences).
    `hold`: what the training process's serving before its workers take over is held to (see Held)."""
    first_arrived = threading.Event()

    def fetched(need: tuple[int, int, np.ndarray]) -> list:
        window, _, examples = need
        try:
            return fetch(plan.source_of(window), examples)
        finally:
            first_arrived.set()

    for start, stop in piece.tolist():
        needs = plan.needs(start, stop)
        if hold is not None and not plan.mixed:
            needs = _until(needs, start, hold)
        gate = hold.gate if hold is not None else None
        arriving = read_ahead(fetched, _ramped(needs, first_arrived), prefetch, name="atlas-epoch", gate=gate)
        held: dict[int, tuple[int, list]] = {}  # window -> (offset of its first item fetched, its items)
        for windows, offsets in plan.segments(start, stop):
            used = dict.fromkeys(windows.tolist())
            for window in used:
                while window not in held:
                    (got, first, _), items = next(arriving)
                    held[got] = (first, items)
            if len(used) == 1 and bool(np.all(np.diff(offsets) == 1)):  # a stretch of one window: a slice
                first, items = held[int(windows[0])]
                yield items[int(offsets[0]) - first : int(offsets[-1]) - first + 1]
            else:
                yield [held[w][1][o - held[w][0]] for w, o in zip(windows.tolist(), offsets.tolist())]
            least: dict[int, int] = {}
            for window in used:
                source = plan.source_of(window)
                least[source] = min(least.get(source, window), window)
            for window in [w for w in held if w < least.get(plan.source_of(w), -1)]:
                del held[window]


def _ramped(needs: Iterator, first_arrived: threading.Event) -> Iterator:
    """The needs, each after the first held back until a window has arrived (read_ahead draws them as it submits)."""
    for need in needs:
        yield need
        first_arrived.wait()


@dataclass
class Held:
    """A piece served by the training process until its DataLoader workers take over (handover.py): `until()`,
    once it says a position, stops fetching windows that begin at or past it (one source: no item is served
    from there, so what is in flight is all that is read); `reach[0]` is kept at the position the windows asked
    for so far reach; behind a shut `gate`, nothing is fetched ahead (read_ahead)."""

    until: Callable[[], int | None]
    gate: Gate
    reach: list[int]


def _until(needs: Iterator, position: int, held: Held) -> Iterator:
    """The needs (one source's: each covers the positions after the one before), up to the first that begins at
    or past the position `held.until()` says."""
    for need in needs:
        limit = held.until()
        if limit is not None and position >= limit:
            return
        position += len(need[2])
        held.reach[0] = position
        yield need
