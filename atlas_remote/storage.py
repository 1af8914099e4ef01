"""The one place that talks to fsspec: URL -> filesystem, counted reads, batched ranged reads, writes.

The filesystem object is rebuilt lazily in each process (fsspec's async filesystems are not fork-safe), and
a Store pickles to its URL and options only. Every backend error is translated here, once, keeping the cause.
"""

from __future__ import annotations

import os
import random
import threading
import time
from collections import Counter
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, TypeVar

import fsspec
import numpy as np
from fsspec.core import split_protocol, url_to_fs
from fsspec.implementations.local import LocalFileSystem
from fsspec.implementations.memory import MemoryFileSystem

from .errors import (
    AccessDeniedError,
    AtlasError,
    BucketNotFoundError,
    FormatError,
    ObjectNotFoundError,
    RangeNotSupportedError,
    StorageError,
    TruncatedReadError,
)

T = TypeVar("T")
BACKOFF_BASE_SECONDS = 0.1
BACKOFF_CAP_SECONDS = 5.0
# Stores whose conditional create ("create this object only if it does not exist") is atomic on the server.
ATOMIC_CREATE_PROTOCOLS = {"file", "local", "memory", "s3", "s3a", "gs", "gcs"}
_memory_create_lock = threading.Lock()  # memory:// lives in this process: a lock makes its creates atomic


def location(**names: Any) -> str:
    """The one location given under any of its names (`url` here; `root` and `path` in the format's first
    implementation), as a string: a local path or any fsspec URL."""
    given = {name: value for name, value in names.items() if value is not None}
    if len(given) != 1:
        raise TypeError(f"give the dataset's location once, as one of {', '.join(names)} (got {len(given)})")
    return os.fspath(next(iter(given.values())))


def _transient(error: AtlasError) -> bool:
    """Worth another try: network and server failures and short bodies; not missing objects or refusals."""
    if isinstance(error, TruncatedReadError):
        return True
    return isinstance(error, StorageError) and not isinstance(error, (ObjectNotFoundError, AccessDeniedError))


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
class ObjectIdentity:
    """What changes when an object is rewritten: its size and its ETag, generation or modification time."""

    url: str
    size: int
    version: str


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
    retries: int = 0

    @property
    def total_requests(self) -> int:
        return sum(self.requests.values())

    @property
    def total_bytes(self) -> int:
        return sum(self.bytes.values())

    def copy(self) -> Stats:
        return Stats(Counter(self.requests), Counter(self.bytes), self.cache_hits, self.cache_misses,
                     self.disk_hits, self.disk_misses, self.retries)

    def __str__(self) -> str:
        kinds = ", ".join(f"{k}={v}" for k, v in sorted(self.requests.items()))
        return (
            f"requests: {self.total_requests} ({kinds}); bytes fetched: {self.total_bytes}; "
            f"block cache: {self.cache_hits} hits, {self.cache_misses} misses"
            + (f"; disk cache: {self.disk_hits} hits, {self.disk_misses} misses" if self.disk_hits + self.disk_misses else "")
            + (f"; retries: {self.retries}" if self.retries else "")
        )


try:  # botocore comes with s3fs; its credential errors are not OSErrors, and retrying them never helps
    from botocore.exceptions import NoCredentialsError, PartialCredentialsError, ProfileNotFound

    CREDENTIAL_ERRORS: tuple[type[Exception], ...] = (NoCredentialsError, PartialCredentialsError, ProfileNotFound)
except ImportError:  # pragma: no cover
    CREDENTIAL_ERRORS = ()

# Fields of fsspec's info() that change when an object is rewritten, most specific first.
IDENTITY_FIELDS = ("VersionId", "generation", "ETag", "etag", "md5Hash", "mtime", "LastModified", "Last-Modified", "created")


def _translate(err: Exception, url: str, path: str, action: str) -> AtlasError:
    """Map a backend exception onto our error types, naming the URL, the object and what we were doing."""
    if isinstance(err, AtlasError):
        return err.located(url=url, path=path or None)
    message = f"{action}: {type(err).__name__}: {err}"
    if isinstance(err, FileNotFoundError):
        kind = ObjectNotFoundError
    elif isinstance(err, (PermissionError, *CREDENTIAL_ERRORS)):
        kind = AccessDeniedError
    else:
        kind = StorageError
    return kind(message, url=url, path=path or None)


class Store:
    """A dataset's root on some fsspec filesystem: counted, retried requests.

    Retries live here and only here: each request is tried at most `retries + 1` times, with full-jitter
    exponential backoff, for transient failures only (5xx, throttling, dropped connections, timeouts, short
    bodies). The retries of the s3fs filesystem we build are switched off, so a persistent error is not tried
    retries x retries times by stacked layers. Local and in-memory stores are not retried.
    """

    def __init__(
        self,
        url: str,
        storage_options: dict[str, Any] | None = None,
        *,
        max_concurrency: int = 32,
        max_gap_bytes: int = 0,
        max_merged_bytes: int = 8 * 1024 * 1024,
        retries: int = 4,
        timeout: float = 60.0,
    ) -> None:
        if retries < 0 or timeout <= 0:
            raise ValueError("retries must be >= 0 and timeout > 0")
        self.url = str(url).rstrip("/") or str(url)
        self.storage_options = dict(storage_options or {})
        self.max_concurrency = max_concurrency
        self.max_gap_bytes = max_gap_bytes
        self.max_merged_bytes = max_merged_bytes
        self.retries = retries
        self.timeout = timeout
        self.stats = Stats()
        self._lock = threading.Lock()
        self._fs: fsspec.AbstractFileSystem | None = None
        self._pid = -1
        self._helper: ThreadPoolExecutor | None = None
        self._helper_pid = -1
        self._ignores_range = False  # set when the server answered a ranged read with more than the range
        self.root = self._connect()

    def _connect(self) -> str:
        options = dict(self.storage_options)
        protocol = split_protocol(self.url)[0]
        if "::" not in self.url:  # chained URLs take per-protocol options; the user sets those
            # A cached listing would hide objects written since (a committed meta.json, new shards).
            options.setdefault("use_listings_cache", False)
            if protocol in (None, "file", "local"):
                options.setdefault("auto_mkdir", True)  # local writes create their folders; never buckets
            elif protocol in ("s3", "s3a"):
                config = {"connect_timeout": self.timeout, "read_timeout": self.timeout,
                          "retries": {"total_max_attempts": 1}, **options.get("config_kwargs", {})}
                # These options make the instance fsspec caches for us distinct from any other: see below.
                options["config_kwargs"] = config
            elif protocol in ("http", "https"):
                import aiohttp

                client = {"timeout": aiohttp.ClientTimeout(total=self.timeout), **options.get("client_kwargs", {})}
                options["client_kwargs"] = client
        try:
            fs, root = url_to_fs(self.url, **options)
        except Exception as err:  # unknown protocol, missing backend package, bad options
            raise StorageError(f"cannot open: {type(err).__name__}: {err}", url=self.url) from err
        if protocol in ("s3", "s3a") and "::" not in self.url:
            fs.retries = 1  # s3fs's own retry loop, on the instance only our options create: ours is the one layer
        self._fs, self._pid = fs, os.getpid()
        return root.rstrip("/")

    @property
    def fs(self) -> fsspec.AbstractFileSystem:
        if self._fs is None or self._pid != os.getpid():
            if self._pid not in (-1, os.getpid()):  # a forked child: the parent's lock, threads and counts stay there
                self._lock, self.stats, self._helper = threading.Lock(), Stats(), None
            self._connect()
        return self._fs

    @property
    def remote(self) -> bool:
        """Whether requests cross a network: only then are they retried, and read ahead of need."""
        return not isinstance(self.fs, (LocalFileSystem, MemoryFileSystem))

    @property
    def attempts(self) -> int:
        return self.retries + 1 if self.remote else 1

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        state.update(_fs=None, _pid=-1, _lock=None, stats=Stats(), _helper=None, _helper_pid=-1)
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    # -- naming ------------------------------------------------------------------------------------

    def path(self, rel: str = "") -> str:
        return f"{self.root}/{rel}" if rel else self.root

    def url_of(self, rel: str = "") -> str:
        return f"{self.url}/{rel}" if rel else self.url

    # -- retrying ----------------------------------------------------------------------------------

    def _backoff(self, attempt: int, retried: int) -> None:
        with self._lock:
            self.stats.retries += retried
        time.sleep(random.uniform(0, min(BACKOFF_CAP_SECONDS, BACKOFF_BASE_SECONDS * 2**attempt)))

    def _retrying(self, action: str, rel: str, call: Callable[[], T]) -> T:
        """Run one request, retrying transient failures; the last failure is raised, translated."""
        for attempt in range(1, self.attempts + 1):
            try:
                return call()
            except Exception as err:
                error = _translate(err, self.url, rel, action)
                if attempt == self.attempts or not _transient(error):
                    if error is err:
                        raise
                    raise error from err
            self._backoff(attempt, 1)
        raise AssertionError("unreachable")

    def _fetch(self, paths: list[str], starts: list, ends: list) -> list:
        """Bodies (or exceptions) for several reads, in flight together where the filesystem is async."""
        fs = self.fs
        if fs.async_impl and len(paths) > 1:
            try:
                return fs.cat_ranges(paths, starts, ends, batch_size=self.max_concurrency, on_error="return")
            except Exception:  # some layers (fsspec's whole-file caches) fail the whole batch for one object
                pass
        bodies = []
        for p, s, e in zip(paths, starts, ends):
            try:
                bodies.append(fs.cat_file(p, start=s, end=e))
            except Exception as err:
                bodies.append(err)
        return bodies

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
        """Whole (small) objects fetched together, as (path, kind) pairs; a failed read is returned, not raised.

        Whole objects are read as start=0: without a range s3fs first asks for the size (a second request).
        """
        out: list[bytes | AtlasError | None] = [None] * len(rels)
        pending = list(range(len(rels)))
        for attempt in range(1, self.attempts + 1):
            bodies = self._fetch([self.path(rels[i][0]) for i in pending], [0] * len(pending), [None] * len(pending))
            again = []
            for i, body in zip(pending, bodies):
                rel, kind = rels[i]
                if isinstance(body, BaseException):
                    self._count(kind, 1, 0)
                    out[i] = _translate(body, self.url, rel, "reading")
                    if out[i] is not body:
                        out[i].__cause__ = body
                    if attempt < self.attempts and _transient(out[i]):
                        again.append(i)
                else:
                    self._count(kind, 1, len(body))
                    out[i] = body
            if not again:
                break
            pending = again
            self._backoff(attempt, len(again))
        return out

    def read_ranges(self, ranges: list[ByteRange], kind: str) -> dict[ByteRange, bytes]:
        """Fetch many ranges: touching ones merged, the requests in flight together (bounded), each checked
        for length (a short body is never handed on) and retried alone if it failed transiently.

        A body longer than the range means the server ignores Range requests: that is reported at once, never
        retried, and every later ranged read of this store fails the same way without asking again.
        """
        reads = coalesce((r for r in ranges if r.size > 0), self.max_gap_bytes, self.max_merged_bytes)
        results: dict[ByteRange, bytes] = {r: b"" for r in ranges if r.size == 0}
        if reads and self._ignores_range:
            raise self._range_refused(reads[0].span, None)
        for attempt in range(1, self.attempts + 1):
            spans = [m.span for m in reads]
            bodies = self._fetch([self.path(s.path) for s in spans], [s.start for s in spans], [s.end for s in spans])
            again = []
            for read, body in zip(reads, bodies):
                span = read.span
                where = f"reading bytes [{span.start}, {span.end})"
                if isinstance(body, BaseException):
                    self._count(kind, 1, 0)
                    error, cause = _translate(body, self.url, span.path, where), body
                elif len(body) > span.size:
                    self._count(kind, 1, len(body))
                    self._ignores_range = True
                    raise self._range_refused(span, len(body))
                elif len(body) < span.size:
                    self._count(kind, 1, len(body))
                    error, cause = TruncatedReadError(
                        f"{where}: got {len(body)} bytes, expected {span.size}: the answer is shorter than the "
                        f"range (the response was cut short, or index.npy does not match data.bin)",
                        url=self.url, path=span.path, byte_range=(span.start, span.end),
                    ), None
                else:
                    self._count(kind, 1, len(body))
                    for member in read.members:
                        offset = member.start - span.start
                        results[member] = body[offset : offset + member.size]
                    continue
                if attempt == self.attempts or not _transient(error):
                    raise error from cause
                again.append(read)
            if not again:
                break
            reads = again
            self._backoff(attempt, len(again))
        return results

    def _range_refused(self, span: ByteRange, got: int | None) -> RangeNotSupportedError:
        answer = f"got {got} bytes, longer than the range" if got is not None else "refused before"
        return RangeNotSupportedError(
            f"this server ignores Range requests: asked for bytes [{span.start}, {span.end}) ({span.size} bytes), "
            f"{answer}. Serve the dataset from a server that honours Range (any object store, nginx), or copy it "
            f"to a local path", url=self.url, path=span.path, byte_range=(span.start, span.end))

    def list_names(self, rel: str = "") -> list[str]:
        """Names of the entries directly under rel (one listing request)."""

        def call():
            self._count("list", 1, 0)
            return self.fs.ls(self.path(rel), detail=False, refresh=True)

        entries = self._retrying("listing", rel, call)
        return sorted({str(e).rstrip("/").rsplit("/", 1)[-1] for e in entries})

    @property
    def can_list(self) -> bool:
        """Whether folders can be listed: a static web server (http/https) has no listing."""
        protocols = self.fs.protocol if isinstance(self.fs.protocol, (tuple, list)) else (self.fs.protocol,)
        return not {"http", "https"} & set(protocols)

    def identity(self, rel: str) -> ObjectIdentity:
        """The object's size and version (ETag, generation or modification time), one request."""

        def call():
            self._count("info", 1, 0)
            return self.fs.info(self.path(rel))

        info = self._retrying("inspecting", rel, call)
        version = next((info[k] for k in IDENTITY_FIELDS if info.get(k) is not None), "")
        return ObjectIdentity(self.url_of(rel), int(info.get("size") or 0), str(version))

    def map_array(self, rel: str, kind: str) -> np.ndarray:
        """A local .npy file memory-mapped, not read (local stores only); counted as one request of its size."""

        def call() -> np.ndarray:
            try:
                array = np.load(self.path(rel), mmap_mode="r", allow_pickle=False)
            except ValueError as err:
                raise FormatError(f"not a valid .npy array ({err})", path=rel) from err
            self._count(kind, 1, os.path.getsize(self.path(rel)))
            return array

        return self._retrying("mapping", rel, call)

    def find(self, rel: str = "") -> dict[str, int]:
        """Every object below rel and its size, by path relative to the store's root (one recursive listing)."""

        def call():
            self._count("list", 1, 0)
            return self.fs.find(self.path(rel), withdirs=False, detail=True)

        prefix = self.root + "/"
        found = {str(p).rstrip("/"): info for p, info in self._retrying("listing", rel, call).items()}
        return {p[len(prefix):]: int(info.get("size") or 0) for p, info in sorted(found.items())
                if p.startswith(prefix) and info.get("type") != "directory"}

    def copy_within(self, src_path: str, rel: str) -> None:
        """A server-side copy of an object of the same filesystem (src_path as the filesystem names it)."""
        self._retrying(f"copying {src_path} to", rel, lambda: self.fs.cp_file(src_path, self.path(rel)))

    def write_stream(self, rel: str, chunks: Iterable[bytes]) -> int:
        """Stream chunks into one object (a multipart upload on object stores), returning its size. A failure is
        translated but not retried: the chunks cannot be replayed. Errors the chunks raise pass through."""
        written = 0
        try:
            with self.fs.open(self.path(rel), "wb") as f:
                for chunk in chunks:
                    f.write(chunk)
                    written += len(chunk)
        except AtlasError:
            raise
        except Exception as err:
            raise _translate(err, self.url, rel, "writing") from err
        return written

    @property
    def bucket(self) -> str | None:
        """The bucket of an object store URL (s3://BUCKET/..., gs://BUCKET/...), else None."""
        protocol = split_protocol(self.url)[0]
        if "::" in self.url or protocol not in ("s3", "s3a", "gs", "gcs"):
            return None
        return self.root.split("/", 1)[0]

    def check_bucket(self) -> None:
        """Raise BucketNotFoundError if the URL's bucket does not exist (object stores only; one request). Called
        after a not-found error, to say which: a credential that may not inspect the bucket tells nothing."""
        bucket = self.bucket
        if bucket is None:
            return
        try:
            self._retrying("checking bucket", "", lambda: self.fs.info(bucket))
        except ObjectNotFoundError as err:
            raise BucketNotFoundError(f"bucket {bucket!r} does not exist", url=self.url) from err
        except AtlasError:
            pass

    @property
    def atomic_create(self) -> bool:
        """Whether create() is atomic here (a conditional create on the server, O_EXCL locally)."""
        protocols = self.fs.protocol if isinstance(self.fs.protocol, (tuple, list)) else (self.fs.protocol,)
        return "::" not in self.url and bool(ATOMIC_CREATE_PROTOCOLS & set(protocols))

    def create(self, rel: str, data: bytes) -> bool:
        """Write the object only if it does not exist yet; False if it does. Atomic where `atomic_create` says
        so (S3 If-None-Match: *, GCS ifGenerationMatch=0, O_EXCL locally); elsewhere a check, then a write."""
        fs, path = self.fs, self.path(rel)

        def call() -> bool:
            try:
                if isinstance(fs, LocalFileSystem):
                    os.makedirs(os.path.dirname(path), exist_ok=True)
                    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
                    with os.fdopen(fd, "wb") as f:
                        f.write(data)
                elif isinstance(fs, MemoryFileSystem):
                    with _memory_create_lock:
                        if fs.exists(path):
                            return False
                        fs.pipe_file(path, data)
                elif self.atomic_create:
                    fs.pipe_file(path, data, mode="create")
                else:
                    if fs.exists(path):
                        return False
                    fs.pipe_file(path, data)
            except FileExistsError:
                return False
            return True

        return self._retrying("creating", rel, call)

    def beside(self, fn: Callable[..., T], *args: Any) -> Future:
        """Run a request in a helper thread, to overlap it with another round trip of the caller's."""
        if self._helper is None or self._helper_pid != os.getpid():
            self._helper, self._helper_pid = ThreadPoolExecutor(4, thread_name_prefix="atlas-store"), os.getpid()
        return self._helper.submit(fn, *args)

    def exists(self, rel: str) -> bool:
        """Whether the object exists; a failure to find out is an error, never a 'no'."""
        try:
            self._retrying("checking", rel, lambda: self.fs.info(self.path(rel)))
            return True
        except ObjectNotFoundError:
            return False

    # -- writes (uncounted: the counters describe reading) ------------------------------------------

    def write(self, rel: str, data: bytes) -> None:
        self._retrying("writing", rel, lambda: self.fs.pipe_file(self.path(rel), data))

    def upload(self, local_path: str, rel: str) -> None:
        self._retrying("uploading to", rel, lambda: self.fs.put_file(local_path, self.path(rel)))

    def promote(self, src: str, dst: str) -> None:
        """Put a staged object at its final name: a rename on a local disk, a server-side copy on object
        stores (the caller deletes the staging folder in bulk afterwards; no data passes through us)."""
        if self.is_local:
            call = lambda: self.fs.mv(self.path(src), self.path(dst))  # noqa: E731
        else:
            call = lambda: self.fs.cp_file(self.path(src), self.path(dst))  # noqa: E731
        self._retrying(f"copying to {self.url_of(dst)} from", src, call)

    @property
    def is_local(self) -> bool:
        return isinstance(self.fs, LocalFileSystem)

    def remove(self, rel: str) -> None:
        """Delete an object or a whole folder; a missing one is not an error."""
        try:
            self._retrying("deleting", rel, lambda: self.fs.rm(self.path(rel), recursive=True))
        except ObjectNotFoundError:
            pass
