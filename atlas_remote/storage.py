"""The one place that talks to fsspec: URL -> filesystem, counted reads, batched ranged reads, writes.

The filesystem object is rebuilt lazily in each process (fsspec's async filesystems are not fork-safe), and
a Store pickles to its URL and options only. Every backend error is translated here, once, keeping the cause.
"""

from __future__ import annotations

import itertools
import os
import random
import re
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

import fsspec
import numpy as np
from fsspec.core import split_protocol, url_to_fs
from fsspec.implementations.cached import CachingFileSystem
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
    one_line,
)
from .format import npy_problem
from .obstore_reads import ObstoreReads, obstore_reader
from .options import ReaderOptions
from .ranges import ByteRange, coalesce
from .stats import Stats

T = TypeVar("T")
BACKOFF_BASE_SECONDS = 0.1
BACKOFF_CAP_SECONDS = 5.0
# A store that says "slow down" (S3 503 SlowDown, 429, GCS rateLimitExceeded) is not failing: such answers are
# retried for this long from the first one, not counted against `retries`, while the requests in flight halve.
THROTTLED_FOR_AT_MOST_SECONDS = 120.0
THROTTLE_SIGNS = (
    "SlowDown",
    "reduce your request rate",  # s3fs turns SlowDown into OSError(EBUSY) with S3's message
    "503",
    "429",
    "Too Many Requests",
    "TooManyRequests",
    "rateLimitExceeded",
    "Throttl",
)
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


def _throttled(error: AtlasError) -> bool:
    """The store asks us to slow down: retried while it lasts, with fewer requests in flight."""
    text = f"{error.problem} {error.__cause__!r}"
    return isinstance(error, StorageError) and any(sign in text for sign in THROTTLE_SIGNS)


class Pace:
    """How many requests a store's batched reads keep in flight: additive increase (one more after each batch
    that was not throttled), multiplicative decrease (halved by each batch that was), between 1 and the bound."""

    def __init__(self, bound: int) -> None:
        self.bound, self.limit = bound, float(bound)

    def after(self, throttled: bool) -> None:
        self.limit = max(1.0, self.limit / 2) if throttled else min(float(self.bound), self.limit + 1)

    @property
    def in_flight(self) -> int:
        return int(self.limit)


def _transient(error: AtlasError) -> bool:
    """Worth another try: network and server failures and short bodies; not missing objects or refusals."""
    if isinstance(error, TruncatedReadError):
        return True
    return isinstance(error, StorageError) and not isinstance(error, (ObjectNotFoundError, AccessDeniedError))


@dataclass(frozen=True)
class ObjectIdentity:
    """What changes when an object is rewritten: its size and its ETag, generation or modification time."""

    url: str
    size: int
    version: str


try:  # botocore comes with s3fs; its credential errors are not OSErrors, and retrying them never helps
    from botocore.exceptions import NoCredentialsError, PartialCredentialsError, ProfileNotFound

    CREDENTIAL_ERRORS: tuple[type[Exception], ...] = (NoCredentialsError, PartialCredentialsError, ProfileNotFound)
except ImportError:  # pragma: no cover
    CREDENTIAL_ERRORS = ()

# Fields of fsspec's info() that change when an object is rewritten, most specific first.
IDENTITY_FIELDS = (
    "VersionId",
    "generation",
    "ETag",
    "etag",
    "md5Hash",
    "mtime",
    "LastModified",
    "Last-Modified",
    "created",
)


CLIENT_TEXT_CHARS = 300
RANGE_RECHECK_SECONDS = 60.0
UNKNOWN_OPTION = re.compile(r"unexpected keyword argument '(\w+)'")
DENIED_SIGNS = ("InvalidAccessKeyId", "SignatureDoesNotMatch", "AccessDenied", "ExpiredToken", "403 Forbidden")
UNREACHABLE_SIGNS = (
    "EndpointConnectionError",
    "ClientConnectorError",
    "ConnectionRefusedError",
    "error sending request",
    "Cannot connect to host",
    "Connection refused",
)


def _unknown_option(name: str, url: str) -> str:
    """An option the filesystem does not take, with the nearest ones it does (s3fs only finds out when it first
    connects, as `AioSession.__init__() got an unexpected keyword argument`)."""
    import difflib
    import inspect

    try:
        cls = fsspec.get_filesystem_class(url.split("://", 1)[0] if "://" in url else "file")
        known = [p for p in inspect.signature(cls.__init__).parameters if p not in ("self", "args", "kwargs")]
    except (ImportError, ValueError, TypeError):
        known = []
    near = difflib.get_close_matches(name, known, n=2)
    hint = f" (did you mean {' or '.join(repr(n) for n in near)}?)" if near else ""
    return f"unknown storage option {name!r}{hint}: storage_options are the fsspec filesystem's own arguments"


def _translated(err: BaseException, url: str, path: str, action: str) -> AtlasError:
    """A backend exception as one of our error types, naming the URL, the object and what we were doing; the
    backend's exception is kept as the cause."""
    if isinstance(err, AtlasError):
        return err.located(url=url, path=path or None)
    text = one_line(str(err))[:CLIENT_TEXT_CHARS]  # the client's own words, short enough to leave room for ours
    message = f"{action}: {type(err).__name__}: {text}"
    unknown = UNKNOWN_OPTION.search(text) if isinstance(err, TypeError) else None
    if unknown:
        kind, message = StorageError, _unknown_option(unknown.group(1), url)
    elif isinstance(err, FileNotFoundError):
        kind = ObjectNotFoundError
    elif isinstance(err, (PermissionError, *CREDENTIAL_ERRORS)) or any(s in text for s in DENIED_SIGNS):
        kind = AccessDeniedError
        message += "; check the credentials (storage_options, the environment or the profile) and their rights"
    elif any(sign in f"{type(err).__name__} {text}" for sign in UNREACHABLE_SIGNS):
        kind = StorageError
        message = (
            f"{action}: cannot reach the storage server ({type(err).__name__}); check the endpoint URL and the network"
        )
    else:
        kind = StorageError
    error = kind(message, url=url, path=path or None)
    error.__cause__ = err
    return error


@dataclass(frozen=True)
class Capabilities:
    """What a filesystem can do, decided once when the store connects."""

    local: bool  # a local disk: blocks are read with pread on files kept open
    remote: bool  # requests cross a network: only then are they retried, and read ahead of need
    can_list: bool  # folders can be listed (a static web server has no listing)
    atomic_create: bool  # create() is atomic on the server (a conditional create), or O_EXCL locally
    batched: bool  # several reads go in flight together: async, and not behind one of fsspec's caching layers

    # fsspec's caching layers download a whole batch at once; one missing object of the batch cancels the other
    # downloads, which leave truncated files in the cache that later reads take for the object (an empty
    # index.npy, seen in CI). Behind them reads go one by one: each download finishes before the next starts.

    @classmethod
    def of(cls, fs: fsspec.AbstractFileSystem, url: str) -> Capabilities:
        protocols = set(fs.protocol if isinstance(fs.protocol, (tuple, list)) else (fs.protocol,))
        return cls(
            local=isinstance(fs, LocalFileSystem),
            remote=not isinstance(fs, (LocalFileSystem, MemoryFileSystem)),
            can_list=not {"http", "https"} & protocols,
            atomic_create="::" not in url and bool(ATOMIC_CREATE_PROTOCOLS & protocols),
            batched=fs.async_impl and not isinstance(fs, CachingFileSystem),
        )


# An s3:// store whose reads obstore serves, its filesystem not made yet: what s3fs's capabilities say.
OBJECT_STORE = Capabilities(local=False, remote=True, can_list=True, atomic_create=True, batched=True)


class _OpenFiles(threading.local):
    """Local files kept open per thread for ranged reads (pread needs no seek, so no lock), the least recently
    used closed beyond a bound. A file replaced by a rename keeps serving the version this thread opened."""

    LIMIT = 64

    def __init__(self) -> None:
        self.files: OrderedDict[str, Any] = OrderedDict()

    def pread(self, path: str, start: int, end: int) -> bytes:
        f = self.files.get(path)
        if f is None:
            f = self.files[path] = open(path, "rb", buffering=0)
            if len(self.files) > self.LIMIT:
                self.files.popitem(last=False)[1].close()
        else:
            self.files.move_to_end(path)
        return os.pread(f.fileno(), end - start, start)


class Store:
    """A dataset's root on some fsspec filesystem: counted, retried requests.

    Retries live here and only here, in one loop (`_with_retries`): each request is tried at most
    `retries + 1` times, with full-jitter exponential backoff, for transient failures only (5xx, throttling,
    dropped connections, timeouts, short bodies). The retries of the s3fs filesystem we build are switched
    off, so a persistent error is not tried retries x retries times by stacked layers. Local and in-memory
    stores are not retried.
    """

    def __init__(
        self, url: str, storage_options: dict[str, Any] | None = None, options: ReaderOptions | None = None
    ) -> None:
        self.url = str(url).rstrip("/") or str(url)
        self.storage_options = dict(storage_options or {})
        self.options = options or ReaderOptions()
        self.stats = Stats()
        self._lock = threading.Lock()
        self._fs: fsspec.AbstractFileSystem | None = None
        self._pid = -1
        self._helper: ThreadPoolExecutor | None = None
        self._helper_pid = -1
        self._open_files = _OpenFiles()
        self._ignored_range_at: float | None = None  # when the server last answered a ranged read with more
        self._obstore: ObstoreReads | None = None
        self.pace = Pace(self.options.max_concurrency)
        self.root = self._connect()

    def _connect(self) -> str:
        """Decide who serves this store in this process. Where obstore serves its reads (see obstore_reads), the
        filesystem is made at its first use, so a reader that only reads never loads s3fs and botocore's client
        (about 0.35 s in a fresh process)."""
        self._fs, self._pid = None, os.getpid()
        self._obstore = obstore_reader(self.url, self.storage_options, self.options.timeout)
        if self._obstore is None:
            return self._make_fs()
        self.capabilities = OBJECT_STORE
        return self.url.split("://", 1)[1].rstrip("/")

    def _make_fs(self) -> str:
        options = dict(self.storage_options)
        protocol = split_protocol(self.url)[0]
        timeout = self.options.timeout
        if "::" not in self.url:  # chained URLs take per-protocol options; the user sets those
            # A cached listing would hide objects written since (a committed meta.json, new shards).
            options.setdefault("use_listings_cache", False)
            if protocol in (None, "file", "local"):
                options.setdefault("auto_mkdir", True)  # local writes create their folders; never buckets
            elif protocol in ("s3", "s3a"):
                config = {
                    "connect_timeout": timeout,
                    "read_timeout": timeout,
                    "retries": {"total_max_attempts": 1},
                    **options.get("config_kwargs", {}),
                }
                # These options make the instance fsspec caches for us distinct from any other: see below.
                options["config_kwargs"] = config
            elif protocol in ("http", "https"):
                import aiohttp

                client = {"timeout": aiohttp.ClientTimeout(total=timeout), **options.get("client_kwargs", {})}
                options["client_kwargs"] = client
        try:
            fs, root = url_to_fs(self.url, **options)
        except Exception as err:  # unknown protocol, missing backend package, bad options
            raise StorageError(f"cannot open: {type(err).__name__}: {err}", url=self.url) from err
        if protocol in ("s3", "s3a") and "::" not in self.url:
            fs.retries = 1  # s3fs's own retry loop, on the instance only our options create: ours is the one layer
        self._fs = fs
        if self._obstore is None:
            self.capabilities = Capabilities.of(fs, self.url)
        return root.rstrip("/")

    def _in_this_process(self) -> None:
        """In a forked or unpickled copy, connect again: the parent's lock, threads, counts and clients stay
        with the parent."""
        if self._pid != os.getpid():
            if self._pid != -1:
                self._lock, self.stats, self._helper = threading.Lock(), Stats(), None
            self._connect()

    @property
    def fs(self) -> fsspec.AbstractFileSystem:
        self._in_this_process()
        if self._fs is None:
            self._make_fs()
        return self._fs

    @property
    def remote(self) -> bool:
        return self.capabilities.remote

    @property
    def is_local(self) -> bool:
        return self.capabilities.local

    @property
    def can_list(self) -> bool:
        return self.capabilities.can_list

    @property
    def atomic_create(self) -> bool:
        return self.capabilities.atomic_create

    @property
    def read_client(self) -> str:
        """Which client reads objects in this process: "obstore" (see obstore_reads) or "fsspec"."""
        return "obstore" if self.obstore is not None else "fsspec"

    @property
    def attempts(self) -> int:
        return self.options.retries + 1 if self.remote else 1

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        state.update(
            _fs=None, _pid=-1, _lock=None, stats=Stats(), _helper=None, _helper_pid=-1, _open_files=None, _obstore=None
        )
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._lock, self._open_files = threading.Lock(), _OpenFiles()

    # -- naming ------------------------------------------------------------------------------------

    def path(self, rel: str = "") -> str:
        return f"{self.root}/{rel}" if rel else self.root

    def url_of(self, rel: str = "") -> str:
        return f"{self.url}/{rel}" if rel else self.url

    # -- retrying: the one loop --------------------------------------------------------------------

    def _with_retries(self, items: list[T], attempt: Callable[[list[T]], list]) -> list:
        """Run attempt(items), which answers each item with a result or an AtlasError; items that failed
        transiently are tried again, alone, after a backoff, until their attempts run out. Throttled ones
        ("slow down") are tried again without counting, for up to THROTTLED_FOR_AT_MOST_SECONDS, and the store's
        pace halves (see Pace)."""
        out: list = [None] * len(items)
        pending = list(range(len(items)))
        tries = [0] * len(items)
        throttled_since: float | None = None
        for n in itertools.count(1):
            again, throttled = [], False
            for i, result in zip(pending, attempt([items[i] for i in pending])):
                out[i] = result
                if not isinstance(result, AtlasError) or not self.remote:
                    continue
                if _throttled(result):
                    throttled = True
                    again.append(i)
                elif _transient(result):
                    tries[i] += 1
                    if tries[i] < self.attempts:
                        again.append(i)
            self.pace.after(throttled)
            if throttled:
                throttled_since = throttled_since or time.monotonic()
                if time.monotonic() - throttled_since > THROTTLED_FOR_AT_MOST_SECONDS:
                    break
            if not again:
                break
            pending = again
            with self._lock:
                self.stats.retries += len(again)
            time.sleep(random.uniform(0, min(BACKOFF_CAP_SECONDS, BACKOFF_BASE_SECONDS * 2 ** min(n, 10))))
        return out

    def _retrying(self, action: str, rel: str, call: Callable[[], T]) -> T:
        """One request, retried; its last failure raised, translated (the backend's exception as the cause)."""

        def attempt(_: list) -> list:
            try:
                return [call()]
            except Exception as err:
                return [_translated(err, self.url, rel, action)]

        (result,) = self._with_retries([None], attempt)
        if isinstance(result, AtlasError):
            raise result from result.__cause__
        return result

    def _fetch_through_fs(self, paths: list[str], starts: list, ends: list) -> list:
        """Bodies (or exceptions) for several reads: pread on a local disk, in flight together where the
        filesystem is async, else one after another."""
        fs = self.fs
        bodies: list[Any] = []
        if self.capabilities.local and all(e is not None for e in ends):
            for p, s, e in zip(paths, starts, ends):
                try:
                    bodies.append(self._open_files.pread(p, s, e))
                except Exception as err:
                    bodies.append(err)
            return bodies
        if self.capabilities.batched and len(paths) > 1:
            try:
                return fs.cat_ranges(paths, starts, ends, batch_size=self.pace.in_flight, on_error="return")
            except Exception:  # a layer that fails the whole batch for one object: each read then fails alone
                pass
        for p, s, e in zip(paths, starts, ends):
            try:
                bodies.append(fs.cat_file(p, start=s, end=e))
            except Exception as err:
                bodies.append(err)
        return bodies

    @property
    def obstore(self) -> ObstoreReads | None:
        """The obstore reader that serves this store's reads (GET, HEAD, listing; see obstore_reads), or None;
        decided when the store connects, and again in a forked child."""
        self._in_this_process()
        return self._obstore

    def _fetch(self, paths: list[str], starts: list[int], ends: list) -> list:
        """Reads of whole objects (end None) and ranges: through obstore where it serves this store, else
        through the filesystem."""
        reader = self.obstore
        if reader is not None:
            return reader.fetch(paths, starts, ends, self.pace.in_flight, self.pace.bound)
        return self._fetch_through_fs(paths, starts, ends)

    # -- counted reads -----------------------------------------------------------------------------

    def _count(self, kind: str, requests: int, nbytes: int) -> None:
        with self._lock:
            self.stats.requests[kind] += requests
            self.stats.bytes[kind] += nbytes

    def snapshot(self) -> Stats:
        with self._lock:
            return self.stats.copy()

    def reset_stats(self) -> None:
        with self._lock:
            self.stats = Stats()

    def read(self, rel: str, kind: str) -> bytes:
        """A whole (small) object in one request."""
        (body,) = self.read_many([(rel, kind)])
        if isinstance(body, AtlasError):
            raise body from body.__cause__
        return body

    def read_many(self, rels: list[tuple[str, str]]) -> list[bytes | AtlasError]:
        """Whole (small) objects fetched together, as (path, kind) pairs; a failed read is returned, not raised.

        Whole objects are read as start=0: without a range s3fs first asks for the size (a second request).
        """

        def attempt(batch: list[tuple[str, str]]) -> list:
            bodies = self._fetch([self.path(rel) for rel, _ in batch], [0] * len(batch), [None] * len(batch))
            out = []
            for (rel, kind), body in zip(batch, bodies):
                failed = isinstance(body, BaseException)
                self._count(kind, 1, 0 if failed else len(body))
                out.append(_translated(body, self.url, rel, "reading") if failed else body)
            return out

        return self._with_retries(rels, attempt)

    def read_ranges(self, ranges: list[ByteRange], kind: str) -> dict[ByteRange, bytes | memoryview]:
        """Fetch many ranges: touching ones merged, the requests in flight together (bounded), each checked
        for length (a short body is never handed on) and retried alone if it failed transiently. A range that
        is part of a merged read is a view into that read's body (no copy).

        A body longer than the range means the server ignores Range requests: that is reported at once, never
        retried, and every later ranged read of this store fails the same way without asking again.
        """
        reads = coalesce((r for r in ranges if r.size > 0), self.options.max_gap_bytes, self.options.max_merged_bytes)
        if reads and self._ignores_range:
            raise self._range_refused(reads[0].span, None)

        def attempt(batch: list) -> list:
            spans = [m.span for m in batch]
            bodies = self._fetch([self.path(s.path) for s in spans], [s.start for s in spans], [s.end for s in spans])
            return [self._checked_body(span, body, kind) for span, body in zip(spans, bodies)]

        results: dict[ByteRange, bytes | memoryview] = {r: b"" for r in ranges if r.size == 0}
        for read, body in zip(reads, self._with_retries(reads, attempt)):
            if isinstance(body, AtlasError):
                raise body from body.__cause__
            if len(read.members) == 1:
                results[read.span] = body
                continue
            view = memoryview(body)
            for member in read.members:
                offset = member.start - read.span.start
                results[member] = view[offset : offset + member.size]
        return results

    @property
    def _ignores_range(self) -> bool:
        """The server answered a ranged read with a whole object less than RANGE_RECHECK_SECONDS ago: reads fail
        at once rather than download whole objects; after that, one read asks again (a proxy's one-off answer
        must not poison a reader for good)."""
        at = self._ignored_range_at
        return at is not None and time.monotonic() - at < RANGE_RECHECK_SECONDS

    def read_range(self, r: ByteRange, kind: str) -> bytes | memoryview:
        """One range, with nothing to merge: the random-access path (a local disk answers it with one pread)."""
        if not self.capabilities.local or self._ignores_range:
            return self.read_ranges([r], kind)[r]
        body: Any
        try:
            body = self._open_files.pread(self.path(r.path), r.start, r.end)
        except Exception as err:
            body = err
        body = self._checked_body(r, body, kind)
        if isinstance(body, AtlasError):
            raise body from body.__cause__
        return body

    def read_head(self, rel: str, nbytes: int, kind: str) -> bytes | memoryview:
        """The first nbytes of an object (all of it if it is shorter), or nothing if the read failed: a guess
        made before the object's size is known, so a failure is left for the reads that follow to meet, counted
        and retried as usual. One request, counted."""
        if self._ignores_range:
            return b""
        (body,) = self._fetch([self.path(rel)], [0], [nbytes])
        usable = not isinstance(body, BaseException) and len(body) <= nbytes
        self._count(kind, 1, len(body) if usable else 0)
        return body if usable else b""

    def _checked_body(self, span: ByteRange, body: Any, kind: str) -> Any:
        """The body of a ranged read, or the error it amounts to (counted either way)."""
        failed = isinstance(body, BaseException)
        with self._lock:
            self.stats.requests[kind] += 1
            self.stats.bytes[kind] += 0 if failed else len(body)
        if not failed and len(body) == span.size:
            self._ignored_range_at = None
            return body
        where = f"reading bytes [{span.start}, {span.end})"
        if failed:
            return _translated(body, self.url, span.path, where)
        if len(body) > span.size:
            self._ignored_range_at = time.monotonic()
            raise self._range_refused(span, len(body))
        if len(body) < span.size:
            return TruncatedReadError(
                f"{where}: got {len(body)} bytes, expected {span.size}: the answer is shorter than the range (the "
                f"response was cut short, or the object is shorter than its index says)",
                url=self.url,
                path=span.path,
                byte_range=(span.start, span.end),
            )

    def _range_refused(self, span: ByteRange, got: int | None) -> RangeNotSupportedError:
        answer = f"got {got} bytes, longer than the range" if got is not None else "refused before"
        return RangeNotSupportedError(
            f"this server ignores Range requests: asked for bytes [{span.start}, {span.end}) ({span.size} bytes), "
            f"{answer}. Serve the dataset from a server that honours Range (any object store, nginx), or copy it "
            f"to a local path",
            url=self.url,
            path=span.path,
            byte_range=(span.start, span.end),
        )

    def list_names(self, rel: str = "") -> list[str]:
        """Names of the entries directly under rel (one listing request)."""

        def call():
            self._count("list", 1, 0)
            reader = self.obstore
            if reader is not None:
                return reader.list_names(self.path(rel))
            return self.fs.ls(self.path(rel), detail=False, refresh=True)

        entries = self._retrying("listing", rel, call)
        return sorted({str(e).rstrip("/").rsplit("/", 1)[-1] for e in entries})

    def identity(self, rel: str) -> ObjectIdentity:
        """The object's size and version (ETag, generation or modification time), one request."""

        def call():
            self._count("info", 1, 0)
            return self._info(rel)

        info = self._retrying("inspecting", rel, call)
        version = next((info[k] for k in IDENTITY_FIELDS if info.get(k) is not None), "")
        return ObjectIdentity(self.url_of(rel), int(info.get("size") or 0), str(version))

    def _info(self, rel: str) -> dict[str, Any]:
        reader = self.obstore
        return reader.info(self.path(rel)) if reader is not None else self.fs.info(self.path(rel))

    def map_array(self, rel: str, kind: str) -> np.ndarray:
        """A local .npy file memory-mapped, not read (local stores only); counted as one request of its size."""

        def call() -> np.ndarray:
            try:
                array = np.load(self.path(rel), mmap_mode="r", allow_pickle=False)
            except ValueError as err:
                raise FormatError(f"not a valid .npy array ({npy_problem(err)})", path=rel) from err
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
        return {
            p[len(prefix) :]: int(info.get("size") or 0)
            for p, info in sorted(found.items())
            if p.startswith(prefix) and info.get("type") != "directory"
        }

    def copy_within(self, src_path: str, rel: str) -> None:
        """A server-side copy of an object of the same filesystem (src_path as the filesystem names it)."""
        self._retrying(f"copying {src_path} to", rel, lambda: self.fs.cp_file(src_path, self.path(rel)))

    def write_stream(self, rel: str, chunks: Iterable[bytes | memoryview]) -> int:
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
            raise _translated(err, self.url, rel, "writing") from err
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
            self._retrying("checking", rel, lambda: self._info(rel))
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
            call = lambda: self.fs.mv(self.path(src), self.path(dst))
        else:
            call = lambda: self.fs.cp_file(self.path(src), self.path(dst))
        self._retrying(f"copying to {self.url_of(dst)} from", src, call)

    def remove(self, rel: str) -> None:
        """Delete an object or a whole folder; a missing one is not an error."""
        try:
            self._retrying("deleting", rel, lambda: self.fs.rm(self.path(rel), recursive=True))
        except ObjectNotFoundError:
            pass
