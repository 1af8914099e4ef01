"""Block caches: decoded blocks in memory, raw block bytes on local disk, and what a decoded block holds."""

from __future__ import annotations

import hashlib
import threading
import warnings
from collections.abc import Hashable
from typing import NamedTuple

import cachetools

from ..storage import forksafe


class DecodedBlock(NamedTuple):
    """A block's examples, kept in memory (a tuple: one is made per block read)."""

    examples: list
    nbytes: int  # what the examples hold in memory, as HeldBytes counts it


class MemoryBlockCache:
    """Least recently used decoded blocks, bounded by their decoded size. Safe to share between threads."""

    def __init__(self, max_bytes: int) -> None:
        if max_bytes < 0:
            raise ValueError(f"cache size must be >= 0 bytes, got {max_bytes}")
        self.max_bytes = max_bytes
        self._lru: cachetools.LRUCache = cachetools.LRUCache(maxsize=max_bytes, getsizeof=lambda b: b.nbytes)
        self.after_fork()
        forksafe.register(self)

    def after_fork(self) -> None:
        """A forked child keeps the cached blocks (copy-on-write) but not a lock another thread may hold."""
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
            return int(self._lru.currsize)

    def __len__(self) -> int:
        with self._lock:
            return len(self._lru)


class DiskBlockCache:
    """Raw block bytes on local disk, bounded in bytes, least recently used out first, shared by processes.

    Built on diskcache (a SQLite index plus files, process-safe, entries committed only once fully written),
    rather than a hand-written store. Keys carry the identity of the object a block came from (URL, size,
    ETag/generation/mtime), so a rewritten dataset never gets an older version's blocks. The folder must be
    private to this user, and what is read from it is raw bytes or nothing (cache_folder.py); the reader checks
    an entry's length and checksum as it checks a block from the store.
    """

    MIN_BYTES = 16 * 1024 * 1024  # below this the SQLite index alone fills the budget and every entry is evicted

    def __init__(self, directory: str, max_bytes: int) -> None:
        if max_bytes < self.MIN_BYTES:
            raise ValueError(
                f"disk cache limit {max_bytes} bytes is too small to hold blocks; use at least {self.MIN_BYTES}"
            )
        from .cache_folder import check_private

        self.directory = str(directory)
        self.max_bytes = max_bytes
        self._cache = None
        self._warned = False
        check_private(self.directory)  # at open: a folder another user can write is refused here, in one line
        forksafe.register(self)

    def after_fork(self) -> None:
        self._cache = None  # SQLite connections must not cross a fork

    def _open(self):
        if self._cache is None:
            import diskcache

            from .cache_folder import SETTINGS, RawBytesDisk, check_database, check_private

            check_private(self.directory)  # again in each process (a pickled reader opens it elsewhere)
            check_database(self.directory)
            self._cache = diskcache.Cache(
                self.directory, disk=RawBytesDisk, **{**SETTINGS, "size_limit": self.max_bytes}
            )
        return self._cache

    @staticmethod
    def _name(key: Hashable) -> str:
        """A key as text, so diskcache stores it raw (a key it pickles is unpickled when it lists them)."""
        return hashlib.sha256(repr(key).encode()).hexdigest()

    def get(self, key: Hashable, size: int) -> bytes | None:
        """The block's bytes if an entry of exactly `size` bytes is held (read no further), else None."""
        found = self._open().get(self._name(key), read=True)
        if found is not None and not isinstance(found, bytes):
            with found:
                found = found.read(size + 1)
        return found if found is not None and len(found) == size else None

    def put(self, key: Hashable, data: bytes) -> None:
        if len(data) * 8 > self.max_bytes and not self._warned:
            self._warned = True
            warnings.warn(
                f"disk cache at {self.directory} holds fewer than 8 blocks of {len(data)} bytes "
                f"(limit {self.max_bytes}); it will thrash: raise disk_cache_bytes",
                ResourceWarning,
                stacklevel=3,
            )
        self._open().set(self._name(key), data)

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_cache": None}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        forksafe.register(self)
