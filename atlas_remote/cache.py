"""Block caches: decoded blocks in memory, raw block bytes on local disk, and what a decoded block holds."""

from __future__ import annotations

import gc
import hashlib
import sys
import threading
import types
import warnings
from collections.abc import Hashable
from typing import Any, NamedTuple

import cachetools

from . import forksafe

NOT_DATA = (type, types.ModuleType, types.FunctionType, types.BuiltinFunctionType, types.MethodType, types.CodeType)


class DecodedBlock(NamedTuple):
    """A block's examples, kept in memory (a tuple: one is made per block read)."""

    examples: list
    nbytes: int  # what the examples hold in memory, as HeldBytes counts it


def held_in_memory(examples: list) -> int:
    """The bytes of every object reachable from a block's examples, each counted once at sys.getsizeof (classes,
    modules and functions they refer to are not theirs; a torch tensor's storage is not seen: see HeldBytes).
    Walked a level at a time with C-level calls (map, zip, set operations), not object by object; each level
    costs what it holds (what was seen is looked up, never walked again: a list nested 40,000 deep took 10 s)."""
    seen: set[int] = set()
    level: list[Any] = [examples]
    total = 0
    while level:
        fresh = dict(zip(map(id, level), level))
        new = fresh.keys() - seen if len(seen) < len(fresh) else set(fresh).difference(seen)
        seen.update(new)
        objects = list(map(fresh.__getitem__, new))
        not_data = {kind for kind in set(map(type, objects)) if issubclass(kind, NOT_DATA)}  # a few kinds a level
        if not_data:
            objects = [obj for obj in objects if type(obj) not in not_data]
        total += sum(map(sys.getsizeof, objects))
        level = gc.get_referents(*objects)
    return total


class HeldBytes:
    """What decoded blocks hold in memory, for the memory cache's bound. Counting every object of every block
    would cost several times what unpickling it does, and a pickle's bytes alone say little (a 7-character string
    takes 10 bytes in a block and 56 in memory, an int in a list 3 and 36). So the first block, and every
    MEASURE_EVERY-th after it, is measured: SAMPLE of its examples, spread across it, object by object
    (held_in_memory), scaled to all of them. The others are counted at the largest ratio of memory to
    decompressed bytes measured so far, and never below their decompressed size."""

    MEASURE_EVERY = 32
    SAMPLE = 8

    def __init__(self) -> None:
        self.ratio = 0.0
        self.blocks = 0

    def of(self, examples: list, size: int) -> int:
        """The bytes a block of `size` decompressed bytes holds once unpickled into `examples`."""
        self.blocks += 1
        if self.ratio and self.blocks % self.MEASURE_EVERY:
            return int(size * self.ratio)
        sample = examples[:: max(1, len(examples) // self.SAMPLE)]
        scaled = held_in_memory(sample) * len(examples) // max(len(sample), 1)
        held = max(sys.getsizeof(examples) + scaled, size)
        self.ratio = max(self.ratio, held / max(size, 1))
        return held


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
