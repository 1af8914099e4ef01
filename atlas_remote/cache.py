"""The bytes-bounded LRU of decoded blocks."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Hashable

import cachetools


@dataclass(frozen=True)
class DecodedBlock:
    examples: list
    nbytes: int  # decompressed pickle size: a cheap, stable stand-in for the block's memory


class MemoryBlockCache:
    """Least recently used decoded blocks, bounded by their decoded size. Safe to share between threads."""

    def __init__(self, max_bytes: int) -> None:
        if max_bytes < 0:
            raise ValueError(f"cache size must be >= 0 bytes, got {max_bytes}")
        self.max_bytes = max_bytes
        self._lru: cachetools.LRUCache = cachetools.LRUCache(maxsize=max_bytes, getsizeof=lambda b: b.nbytes)
        self._lock = threading.Lock()

    def get(self, key: Hashable) -> DecodedBlock | None:
        with self._lock:
            return self._lru.get(key)

    def put(self, key: Hashable, block: DecodedBlock) -> None:
        if block.nbytes > self.max_bytes:
            return  # larger than the whole cache: serve it, do not keep it
        with self._lock:
            self._lru[key] = block

    @property
    def current_bytes(self) -> int:
        with self._lock:
            return self._lru.currsize

    def __len__(self) -> int:
        with self._lock:
            return len(self._lru)
