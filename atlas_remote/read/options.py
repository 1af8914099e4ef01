"""How a reader behaves: one frozen set of options, shared by the reader, its Store, verify and the CLI."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from ..format.codec import DEFAULT_MAX_BLOCK_BYTES
from ..storage.settings import StoreSettings
from .cache import DiskBlockCache


@dataclass(frozen=True)
class ReaderOptions:
    """Every reader setting, with its default.

    cache_bytes: bound of the in-memory LRU of decoded blocks (decompressed size).
    max_concurrency: requests in flight at once for a batch or a read-ahead window.
    readahead: windows of consecutive blocks kept in flight while iterating (on a local path one window is
        read and decompressed ahead on another core, whatever the value above 0).
    max_gap_bytes, max_merged_bytes: block reads are merged into one request when the gap between them is at
        most max_gap_bytes (0: only blocks that touch, so no byte is fetched in vain) and the merged read stays
        within max_merged_bytes. A larger gap trades bytes for fewer requests.
    allowed_classes, trusted: the pickle policy (see `codec.PicklePolicy`).
    max_block_bytes: the largest block, stored or decompressed, a reader accepts (a corrupt index or a zstd
        bomb is refused rather than allocated); what unpickling one block builds is at most twice this.
    disk_cache, disk_cache_bytes: a local folder for raw block bytes, shared by every process of this user that
        names it (DataLoader workers, several jobs on one node), and its bound in bytes. Off by default. The folder
        must be private to the user (made 0700 if missing; CacheFolderError otherwise: cache_folder.py).
    retries, timeout: each request to a remote store is tried up to retries + 1 times (transient failures
        only, with jittered backoff); timeout bounds one request in seconds (S3 and HTTP; gcsfs applies its own).
    mmap_index: on a local path, index.npy files are memory-mapped rather than read (the original's option).
    shard_cache_bytes: bound of what open shards hold (their indexes and checksums): past it the least recently
        opened are forgotten, and opened again if they are needed again.
    """

    cache_bytes: int = 256 * 1024 * 1024
    max_concurrency: int = 32
    readahead: int = 4
    max_gap_bytes: int = 0
    max_merged_bytes: int = 8 * 1024 * 1024
    allowed_classes: tuple = ()
    trusted: bool = False
    max_block_bytes: int = DEFAULT_MAX_BLOCK_BYTES
    disk_cache: str | None = None
    disk_cache_bytes: int = 10 * 1024**3
    retries: int = 4
    timeout: float = 60.0
    mmap_index: bool = True
    shard_cache_bytes: int = 256 * 1024 * 1024

    def __post_init__(self) -> None:
        object.__setattr__(self, "allowed_classes", tuple(self.allowed_classes))
        if self.disk_cache is not None:
            object.__setattr__(self, "disk_cache", str(self.disk_cache))
        if self.readahead < 0 or self.max_concurrency < 1:
            raise ValueError("readahead must be >= 0 and max_concurrency >= 1")
        if self.retries < 0 or self.timeout <= 0:
            raise ValueError("retries must be >= 0 and timeout > 0")
        if self.disk_cache is not None and self.disk_cache_bytes < DiskBlockCache.MIN_BYTES:
            raise ValueError(
                f"disk cache limit {self.disk_cache_bytes} bytes is too small to hold blocks; use at "
                f"least {DiskBlockCache.MIN_BYTES}"
            )
        if self.cache_bytes < 0:
            raise ValueError(f"cache size must be >= 0 bytes, got {self.cache_bytes}")

    @classmethod
    def of(cls, options: ReaderOptions | None = None, **settings: Any) -> ReaderOptions:
        """options (or the defaults) with settings changed; an unknown setting is named in a TypeError."""
        unknown = set(settings) - {f.name for f in dataclasses.fields(cls)}
        if unknown:
            raise TypeError(f"unknown reader setting(s): {', '.join(sorted(unknown))}")
        return dataclasses.replace(options or cls(), **settings)

    @property
    def storage(self) -> StoreSettings:
        """What the reader's Store is told (storage takes its own settings, not these)."""
        return StoreSettings(
            max_concurrency=self.max_concurrency,
            retries=self.retries,
            timeout=self.timeout,
            max_block_bytes=self.max_block_bytes,
            max_gap_bytes=self.max_gap_bytes,
            max_merged_bytes=self.max_merged_bytes,
        )

    def replace(self, **settings: Any) -> ReaderOptions:
        return ReaderOptions.of(self, **settings)
