"""Byte ranges and how nearby ones merge into one request: pure data, no I/O."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import NamedTuple


class ByteRange(NamedTuple):
    """Bytes [start, end) of one object, named relative to the store's root (a tuple: one is made per block read,
    and a tuple is the cheapest to make)."""

    path: str
    start: int
    end: int

    @property
    def size(self) -> int:
        return self.end - self.start


@dataclass(frozen=True)
class MergedRead:
    """One request that serves several ranges lying close together in the same object."""

    span: ByteRange
    members: tuple[ByteRange, ...]


def coalesce(ranges: Iterable[ByteRange], max_gap: int, max_bytes: int) -> list[MergedRead]:
    """Merge ranges of one object whose gaps are at most max_gap bytes, keeping each read under max_bytes."""
    merged: list[MergedRead] = []
    for r in sorted(set(ranges), key=lambda r: (r.path, r.start, r.end)):
        if merged:
            last = merged[-1]
            span = last.span
            if r.path == span.path and r.start - span.end <= max_gap and max(r.end, span.end) - span.start <= max_bytes:
                merged[-1] = MergedRead(ByteRange(span.path, span.start, max(span.end, r.end)), last.members + (r,))
                continue
        merged.append(MergedRead(r, (r,)))
    return merged
