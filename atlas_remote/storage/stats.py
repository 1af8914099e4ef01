"""What a reader reports: requests and bytes by kind (counted by its Store), cache hits and misses (counted by
its block loader)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field


@dataclass
class Stats:
    """What a reader has fetched and served: requests and bytes by kind, cache hits and misses."""

    requests: Counter = field(default_factory=Counter)
    bytes: Counter = field(default_factory=Counter)
    cache_hits: int = 0
    cache_misses: int = 0
    disk_hits: int = 0
    disk_misses: int = 0
    retries: int = 0

    @property
    def total_requests(self) -> int:
        return sum(self.requests.values())

    @property
    def total_bytes(self) -> int:
        return sum(self.bytes.values())

    def copy(self) -> Stats:
        return Stats(
            Counter(self.requests),
            Counter(self.bytes),
            self.cache_hits,
            self.cache_misses,
            self.disk_hits,
            self.disk_misses,
            self.retries,
        )

    def __str__(self) -> str:
        kinds = ", ".join(f"{k}={v}" for k, v in sorted(self.requests.items()))
        return (
            f"requests: {self.total_requests} ({kinds}); bytes fetched: {self.total_bytes}; "
            f"block cache: {self.cache_hits} hits, {self.cache_misses} misses"
            + (
                f"; disk cache: {self.disk_hits} hits, {self.disk_misses} misses"
                if self.disk_hits + self.disk_misses
                else ""
            )
            + (f"; retries: {self.retries}" if self.retries else "")
        )
