"""The one place that talks to fsspec: URL -> filesystem, counted reads, batched ranged reads, writes.

The filesystem object is rebuilt lazily in each process (fsspec's async filesystems are not fork-safe), and
a Store pickles to its URL and options only. Every backend error is translated here, once, keeping the cause.
"""

from __future__ import annotations

import os
import threading
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Iterable

import fsspec
from fsspec.core import split_protocol, url_to_fs
from fsspec.implementations.local import LocalFileSystem

from .errors import AtlasError, StorageError


class ObjectNotFoundError(StorageError, FileNotFoundError):
    """The object (or its bucket) does not exist."""


class AccessDeniedError(StorageError, PermissionError):
    """The store refused the credentials, or they may not read/write this object."""


@dataclass(frozen=True)
class ByteRange:
    """Bytes [start, end) of one object, named relative to the store's root."""

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
            if (
                r.path == span.path
                and r.start - span.end <= max_gap
                and max(r.end, span.end) - span.start <= max_bytes
            ):
                new_span = ByteRange(span.path, span.start, max(span.end, r.end))
                merged[-1] = MergedRead(new_span, last.members + (r,))
                continue
        merged.append(MergedRead(r, (r,)))
    return merged


@dataclass
class Stats:
    """What a reader has fetched and served: requests and bytes by kind, cache hits and misses."""

    requests: Counter = field(default_factory=Counter)
    bytes: Counter = field(default_factory=Counter)
    cache_hits: int = 0
    cache_misses: int = 0
    disk_hits: int = 0
    disk_misses: int = 0

    @property
    def total_requests(self) -> int:
        return sum(self.requests.values())

    @property
    def total_bytes(self) -> int:
        return sum(self.bytes.values())

    def copy(self) -> Stats:
        return Stats(Counter(self.requests), Counter(self.bytes), self.cache_hits, self.cache_misses,
                     self.disk_hits, self.disk_misses)

    def __str__(self) -> str:
        kinds = ", ".join(f"{k}={v}" for k, v in sorted(self.requests.items()))
        return (
            f"requests: {self.total_requests} ({kinds}); bytes fetched: {self.total_bytes}; "
            f"block cache: {self.cache_hits} hits, {self.cache_misses} misses"
            + (f"; disk cache: {self.disk_hits} hits, {self.disk_misses} misses" if self.disk_hits + self.disk_misses else "")
        )


# Fields of fsspec's info() that change when an object is rewritten, most specific first.
IDENTITY_FIELDS = ("VersionId", "generation", "ETag", "etag", "md5Hash", "mtime", "LastModified", "Last-Modified", "created")


def _translate(err: Exception, url: str, action: str) -> AtlasError:
    """Map a backend exception onto our error types, naming the URL and what we were doing."""
    if isinstance(err, AtlasError):
        return err
    message = f"{action} {url}: {type(err).__name__}: {err}"
    if isinstance(err, FileNotFoundError):
        return ObjectNotFoundError(message)
    if isinstance(err, PermissionError):
        return AccessDeniedError(message)
    return StorageError(message)


class Store:
    """A dataset's root on some fsspec filesystem, with request counters."""

    def __init__(
        self,
        url: str,
        storage_options: dict[str, Any] | None = None,
        *,
        max_concurrency: int = 32,
        max_gap_bytes: int = 0,
        max_merged_bytes: int = 8 * 1024 * 1024,
    ) -> None:
        self.url = str(url).rstrip("/") or str(url)
        self.storage_options = dict(storage_options or {})
        self.max_concurrency = max_concurrency
        self.max_gap_bytes = max_gap_bytes
        self.max_merged_bytes = max_merged_bytes
        self.stats = Stats()
        self._lock = threading.Lock()
        self._fs: fsspec.AbstractFileSystem | None = None
        self._pid = -1
        self.root = self._connect()

    def _connect(self) -> str:
        options = dict(self.storage_options)
        if "::" not in self.url:  # chained URLs take per-protocol options; the user sets those
            # A cached listing would hide objects written since (a committed meta.json, new shards).
            options.setdefault("use_listings_cache", False)
            if split_protocol(self.url)[0] in (None, "file", "local"):
                options.setdefault("auto_mkdir", True)  # local writes create their folders; never buckets
        try:
            fs, root = url_to_fs(self.url, **options)
        except Exception as err:  # unknown protocol, missing backend package, bad options
            raise StorageError(f"cannot open {self.url}: {type(err).__name__}: {err}") from err
        self._fs, self._pid = fs, os.getpid()
        return root.rstrip("/")

    @property
    def fs(self) -> fsspec.AbstractFileSystem:
        if self._fs is None or self._pid != os.getpid():
            self._connect()
        return self._fs

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        state.update(_fs=None, _pid=-1, _lock=None, stats=Stats())
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    # -- naming ------------------------------------------------------------------------------------

    def path(self, rel: str = "") -> str:
        return f"{self.root}/{rel}" if rel else self.root

    def url_of(self, rel: str = "") -> str:
        return f"{self.url}/{rel}" if rel else self.url

    # -- counted reads -----------------------------------------------------------------------------

    def _count(self, kind: str, requests: int, nbytes: int) -> None:
        with self._lock:
            self.stats.requests[kind] += requests
            self.stats.bytes[kind] += nbytes

    def count_cache(self, **counts: int) -> None:
        """Add to the cache counters: cache_hits, cache_misses, disk_hits, disk_misses."""
        with self._lock:
            for name, n in counts.items():
                setattr(self.stats, name, getattr(self.stats, name) + n)

    def snapshot(self) -> Stats:
        with self._lock:
            return self.stats.copy()

    def reset_stats(self) -> None:
        with self._lock:
            self.stats = Stats()

    def read(self, rel: str, kind: str) -> bytes:
        """A whole (small) object in one request (start=0: without a range s3fs first asks for the size)."""
        (body,) = self.read_many([(rel, kind)])
        if isinstance(body, AtlasError):
            raise body from body.__cause__
        return body

    def read_many(self, rels: list[tuple[str, str]]) -> list[bytes | AtlasError]:
        """Whole (small) objects fetched together, as (path, kind) pairs; a failed read is returned, not raised."""
        fs = self.fs
        paths = [self.path(rel) for rel, _ in rels]
        bodies: list = []
        if fs.async_impl and len(paths) > 1:
            try:
                bodies = fs.cat_ranges(paths, [0] * len(paths), [None] * len(paths), on_error="return")
            except Exception:  # some layers (fsspec's whole-file caches) fail the whole batch for one object
                bodies = []
        if not bodies:
            for p in paths:
                try:
                    bodies.append(fs.cat_file(p, start=0))
                except Exception as err:
                    bodies.append(err)
        out: list[bytes | AtlasError] = []
        for (rel, kind), body in zip(rels, bodies):
            if isinstance(body, BaseException):
                self._count(kind, 1, 0)
                error = _translate(body, self.url_of(rel), "reading")
                error.__cause__ = error.__cause__ or (body if error is not body else None)
                out.append(error)
            else:
                self._count(kind, 1, len(body))
                out.append(body)
        return out

    def read_ranges(self, ranges: list[ByteRange], kind: str) -> dict[ByteRange, bytes]:
        """Fetch many ranges: nearby ones merged, the requests in flight together (bounded)."""
        reads = coalesce((r for r in ranges if r.size > 0), self.max_gap_bytes, self.max_merged_bytes)
        results: dict[ByteRange, bytes] = {r: b"" for r in ranges if r.size == 0}
        if not reads:
            return results
        fs = self.fs
        paths = [self.path(m.span.path) for m in reads]
        starts = [m.span.start for m in reads]
        ends = [m.span.end for m in reads]
        if fs.async_impl and len(reads) > 1:
            bodies = fs.cat_ranges(paths, starts, ends, batch_size=self.max_concurrency, on_error="return")
        else:
            bodies = []
            for p, s, e in zip(paths, starts, ends):
                try:
                    bodies.append(fs.cat_file(p, start=s, end=e))
                except Exception as err:
                    bodies.append(err)
        failures = [(m, b) for m, b in zip(reads, bodies) if isinstance(b, BaseException)]
        self._count(kind, len(reads), sum(len(b) for b in bodies if not isinstance(b, BaseException)))
        if failures:
            read, err = failures[0]
            span = read.span
            raise _translate(err, self.url_of(span.path), f"reading bytes [{span.start}, {span.end}) of") from err
        for read, body in zip(reads, bodies):
            for member in read.members:
                offset = member.start - read.span.start
                results[member] = body[offset : offset + member.size]
        return results

    def list_names(self, rel: str = "") -> list[str]:
        """Names of the entries directly under rel (one listing request)."""
        try:
            entries = self.fs.ls(self.path(rel), detail=False, refresh=True)
        except Exception as err:
            self._count("list", 1, 0)
            raise _translate(err, self.url_of(rel), "listing") from err
        self._count("list", 1, 0)
        return sorted({str(e).rstrip("/").rsplit("/", 1)[-1] for e in entries})

    @property
    def can_list(self) -> bool:
        """Whether folders can be listed: a static web server (http/https) has no listing."""
        protocols = self.fs.protocol if isinstance(self.fs.protocol, (tuple, list)) else (self.fs.protocol,)
        return not {"http", "https"} & set(protocols)

    def identity(self, rel: str) -> str:
        """What changes when the object is rewritten: size plus ETag, generation or modification time."""
        try:
            info = self.fs.info(self.path(rel))
        except Exception as err:
            self._count("info", 1, 0)
            raise _translate(err, self.url_of(rel), "inspecting") from err
        self._count("info", 1, 0)
        version = next((info[k] for k in IDENTITY_FIELDS if info.get(k) is not None), "")
        return f"{self.url_of(rel)}|{info.get('size')}|{version}"

    def exists(self, rel: str) -> bool:
        try:
            return self.fs.exists(self.path(rel))
        except Exception as err:
            raise _translate(err, self.url_of(rel), "checking") from err

    # -- writes (uncounted: the counters describe reading) ------------------------------------------

    def write(self, rel: str, data: bytes) -> None:
        try:
            self.fs.pipe_file(self.path(rel), data)
        except Exception as err:
            raise _translate(err, self.url_of(rel), "writing") from err

    def upload(self, local_path: str, rel: str) -> None:
        try:
            self.fs.put_file(local_path, self.path(rel))
        except Exception as err:
            raise _translate(err, self.url_of(rel), "uploading to") from err

    def promote(self, src: str, dst: str) -> None:
        """Put a staged object at its final name: a rename on a local disk, a server-side copy on object
        stores (the caller deletes the staging folder in bulk afterwards; no data passes through us)."""
        try:
            if self.is_local:
                self.fs.mv(self.path(src), self.path(dst))
            else:
                self.fs.cp_file(self.path(src), self.path(dst))
        except Exception as err:
            raise _translate(err, self.url_of(src), f"copying to {self.url_of(dst)}:") from err

    @property
    def is_local(self) -> bool:
        return isinstance(self.fs, LocalFileSystem)

    def remove(self, rel: str) -> None:
        """Delete an object or a whole folder; a missing one is not an error."""
        try:
            if self.fs.exists(self.path(rel)):
                self.fs.rm(self.path(rel), recursive=True)
        except FileNotFoundError:
            pass
        except Exception as err:
            raise _translate(err, self.url_of(rel), "deleting") from err
