"""`Store`: a dataset's root on one backend, with what holds for every backend: names relative to the root,
request and byte counters, the one retry loop, body checks (a short body is never handed on, a long one never
read past its bound: storage/answers.py), Range refusal, merged reads. The backend is chosen in one place
(`connect`), made lazily, and made again in a forked child; a Store pickles to its URL and options only."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import IO, Any, TypeVar

import numpy as np
from fsspec.core import split_protocol

from ..errors import (
    AtlasError,
    BucketNotFoundError,
    ObjectNotFoundError,
    StorageError,
    TruncatedReadError,
)
from . import forksafe
from .answers import WHOLE_OBJECT_BYTES, range_refused, too_large
from .base import (
    Backend,
    Capabilities,
    Closes,
    CountsRedirects,
    InspectsBuckets,
    LocalFiles,
    ObjectIdentity,
    Oversized,
    modified_of,
)
from .connect import connect
from .errors import client_failure, translated
from .ranges import ByteRange, coalesce
from .retry import Pace, with_retries
from .settings import StoreSettings
from .stats import Stats
from .writes import Writes

T = TypeVar("T")
RANGE_RECHECK_SECONDS = 60.0
OBJECT_STORES = ("s3", "s3a", "gs", "gcs", "az", "abfs", "abfss")


class Store(Writes):
    """A dataset's root on one backend: counted, retried requests (see the module)."""

    def __init__(
        self, url: str, storage_options: dict[str, Any] | None = None, settings: StoreSettings | None = None
    ) -> None:
        self.url = str(url).rstrip("/") or str(url)
        self.storage_options = dict(storage_options or {})
        self.settings = settings or StoreSettings()
        self.pace = Pace(self.settings.max_concurrency)
        self._ignored_range_at: float | None = None  # when the server last answered a ranged read with more
        self._versions: dict[str, str] = {}  # path -> the version its reads must find (see expect)
        self._start()
        self.root = self.backend.root

    def _start(self) -> None:
        """What a process needs of its own: a lock, counters, helper threads, and a backend (made at first use)."""
        self._lock = threading.Lock()
        self.stats = Stats()
        self._helper: ThreadPoolExecutor | None = None
        self._backend: Backend | None = None
        forksafe.register(self)

    def after_fork(self) -> None:
        """The parent's lock, threads, counts and clients stay with the parent."""
        self._start()

    @property
    def backend(self) -> Backend:
        backend = self._backend
        if backend is None:
            backend = self._backend = connect(self.url, self.storage_options, self.settings)
            if isinstance(backend, CountsRedirects):
                backend.on_redirects = self._count_redirects
        return backend

    def close(self) -> None:
        """Shut this store's helper threads and its backend's (obstore's pool); idempotent. The store may be used
        again after: what it needs is made again at first use."""
        with self._lock:
            helper, self._helper = self._helper, None
            backend, self._backend = self._backend, None
        if helper is not None:
            helper.shutdown(wait=True)
        if isinstance(backend, Closes):
            backend.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _count_redirects(self, n: int) -> None:
        """Redirects followed within the origin: requests like any other."""
        self._count("redirect", n, 0)

    def __getstate__(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if k not in ("_lock", "stats", "_helper", "_backend")}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._start()

    # -- what the backend can do -------------------------------------------------------------------

    @property
    def capabilities(self) -> Capabilities:
        return self.backend.capabilities

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
        """Which client reads objects in this process: "obstore", "local" (pread) or "fsspec"."""
        return self.backend.client

    @property
    def attempts(self) -> int:
        return self.settings.retries + 1 if self.remote else 1

    def require_writable(self) -> None:
        """Refuse, before any work, a URL nothing can be written to."""
        if not self.can_list:
            raise StorageError(
                "HTTP(S) URLs are read-only; write to the bucket or folder behind them (s3://, gs://, az://, a path)",
                url=self.url,
            )

    def same_namespace(self, other: Store) -> bool:
        """Whether objects can be copied from `other` to here server-side (one filesystem, one account)."""
        return self.backend.namespace() is other.backend.namespace()

    # -- naming ------------------------------------------------------------------------------------

    def path(self, rel: str = "") -> str:
        return f"{self.root}/{rel}" if rel else self.root

    def url_of(self, rel: str = "") -> str:
        return f"{self.url}/{rel}" if rel else self.url

    # -- counting and retrying ---------------------------------------------------------------------

    def _count(self, kind: str, requests: int, nbytes: int) -> None:
        with self._lock:
            self.stats.requests[kind] += requests
            self.stats.bytes[kind] += nbytes

    def _count_retries(self, n: int) -> None:
        with self._lock:
            self.stats.retries += n

    def snapshot(self) -> Stats:
        with self._lock:
            return self.stats.copy()

    def reset_stats(self) -> None:
        with self._lock:
            self.stats = Stats()

    def _with_retries(self, items: list, attempt: Callable[[list], list]) -> list:
        return with_retries(items, attempt, self.attempts, self.pace, self._count_retries, self.remote)

    def _retrying(self, action: str, rel: str, call: Callable[[], T]) -> T:
        """One request, retried; its last failure raised, translated (the backend's exception as the cause)."""

        def attempt(_: list) -> list:
            try:
                return [call()]
            except Exception as err:
                return [translated(err, self.url, rel, action)]
            except BaseException as err:  # a client's panic becomes an AtlasError; an interrupt goes on
                if not client_failure(err):
                    raise
                return [translated(err, self.url, rel, action)]

        (result,) = self._with_retries([None], attempt)
        if isinstance(result, AtlasError):
            raise result from result.__cause__
        return result

    def expect(self, rel: str, identity: ObjectIdentity | None) -> None:
        """Make every ranged read of rel conditional on this version (None: no longer), where the store can: a
        read that finds the object rewritten fails with DatasetChangedError and never returns the new bytes."""
        if identity is None:
            self._versions.pop(rel, None)
        elif self.capabilities.conditional and identity.version:
            self._versions[rel] = identity.version

    def _get(
        self, paths: list[str], starts: list[int], ends: list, rels: list[str] | None = None, limits: list | None = None
    ) -> list:
        versions = [self._versions.get(rel) for rel in rels] if rels and self._versions else None
        return self.backend.get(paths, starts, ends, self.pace.in_flight, versions, limits)

    def bound(self, kind: str) -> int:
        """The most bytes a whole object of this kind may hold (answers.WHOLE_OBJECT_BYTES; max_block_bytes for
        other kinds): a longer body is refused, never read past the bound."""
        return WHOLE_OBJECT_BYTES.get(kind, self.settings.max_block_bytes)

    # -- reads (counted) ---------------------------------------------------------------------------

    def read(self, rel: str, kind: str) -> bytes:
        """A whole (small) object in one request."""
        (body,) = self.read_many([(rel, kind)])
        if isinstance(body, AtlasError):
            raise body from body.__cause__
        return body

    def read_many(self, rels: list[tuple[str, str]]) -> list[bytes | AtlasError]:
        """Whole (small) objects fetched together, as (path, kind) pairs; a failed read is returned, not raised."""

        def attempt(batch: list[tuple[str, str]]) -> list:
            limits = [self.bound(kind) for _, kind in batch]
            bodies = self._get(
                [self.path(rel) for rel, _ in batch], [0] * len(batch), [None] * len(batch), None, limits
            )
            out: list[bytes | AtlasError] = []
            for (rel, kind), body, limit in zip(batch, bodies, limits):
                failed = isinstance(body, BaseException)
                self._count(kind, 1, 0 if failed else len(body))
                if isinstance(body, Oversized) or not failed and len(body) > limit:
                    out.append(too_large(self.url, rel, kind, limit))
                else:
                    out.append(translated(body, self.url, rel, "reading") if failed else body)
            return out

        return self._with_retries(rels, attempt)

    def read_ranges(self, ranges: list[ByteRange], kind: str) -> dict[ByteRange, bytes | memoryview]:
        """Fetch many ranges: touching ones merged, the requests in flight together (bounded), each checked
        for length (a short body is never handed on) and retried alone if it failed transiently. A range that
        is part of a merged read is a view into that read's body (no copy).

        A body longer than the range means the server ignores Range requests: that is reported at once, never
        retried, and ranged reads of this store fail the same way without asking, for RANGE_RECHECK_SECONDS.
        """
        reads = coalesce((r for r in ranges if r.size > 0), self.settings.max_gap_bytes, self.settings.max_merged_bytes)
        if reads and self._ignores_range:
            raise range_refused(self.url, reads[0].span, None, "refused before, so not asked again for a while")

        def attempt(batch: list) -> list:
            spans = [m.span for m in batch]
            rels = [s.path for s in spans]
            bodies = self._get([self.path(rel) for rel in rels], [s.start for s in spans], [s.end for s in spans], rels)
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
        backend = self.backend
        if not isinstance(backend, LocalFiles) or self._ignores_range:
            return self.read_ranges([r], kind)[r]
        body: Any
        try:
            body = backend.pread(self.path(r.path), r.start, r.end, self._versions.get(r.path))
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
        (body,) = self._get([self.path(rel)], [0], [nbytes], [rel])
        usable = not isinstance(body, BaseException) and len(body) <= nbytes
        self._count(kind, 1, len(body) if usable else 0)
        return body if usable else b""

    def _checked_body(self, span: ByteRange, body: Any, kind: str) -> Any:
        """The body of a ranged read, or the error it amounts to (counted either way)."""
        failed = isinstance(body, BaseException)
        self._count(kind, 1, 0 if failed else len(body))
        if not failed and len(body) == span.size:
            self._ignored_range_at = None
            return body
        where = f"reading bytes [{span.start}, {span.end})"
        if isinstance(body, Oversized) or not failed and len(body) > span.size:
            self._ignored_range_at = time.monotonic()
            declared = body.declared if isinstance(body, Oversized) else None
            raise range_refused(self.url, span, declared, "it sent more than the range")
        if failed:
            return translated(body, self.url, span.path, where)
        return TruncatedReadError(
            f"{where}: got {len(body)} bytes, expected {span.size}: the answer is shorter than the range (the "
            f"response was cut short, or the object is shorter than its index says)",
            url=self.url,
            path=span.path,
            byte_range=(span.start, span.end),
        )

    def list_names(self, rel: str = "") -> list[str]:
        """Names of the entries directly under rel (one listing request)."""

        def call() -> list[str]:
            self._count("list", 1, 0)
            return self.backend.list_names(self.path(rel))

        entries = self._retrying("listing", rel, call)
        return sorted({str(e).rstrip("/").rsplit("/", 1)[-1] for e in entries})

    def identity(self, rel: str) -> ObjectIdentity:
        """The object's size and version (ETag, generation or modification time), one request."""

        def call() -> dict[str, Any]:
            self._count("info", 1, 0)
            return self.backend.info(self.path(rel))

        info = self._retrying("inspecting", rel, call)
        return ObjectIdentity(
            self.url_of(rel), int(info.get("size") or 0), self.backend.version_of(info), modified_of(info)
        )

    def map_file(self, rel: str, kind: str) -> np.ndarray:
        """A local file's bytes memory-mapped, not read (local stores only; uint8); counted as one request of its
        size. What they hold is the caller's to check (format.spec.read_npy reads a .npy from them)."""
        backend = self.backend
        if not isinstance(backend, LocalFiles):
            raise StorageError("only a local disk maps files", url=self.url, path=rel)

        def call() -> np.ndarray:
            mapped = backend.map_file(self.path(rel))
            self._count(kind, 1, len(mapped))
            return mapped

        return self._retrying("mapping", rel, call)

    def find(self, rel: str = "") -> dict[str, int]:
        """Every object below rel and its size, by path relative to the store's root (one recursive listing)."""

        def call() -> dict[str, dict[str, Any]]:
            self._count("list", 1, 0)
            return self.backend.find(self.path(rel))

        prefix = self.root + "/"
        found = {str(p).rstrip("/"): info for p, info in self._retrying("listing", rel, call).items()}
        return {
            p[len(prefix) :]: int(info.get("size") or 0)
            for p, info in sorted(found.items())
            if p.startswith(prefix) and info.get("type") != "directory"
        }

    def exists(self, rel: str) -> bool:
        """Whether the object exists; a failure to find out is an error, never a 'no'."""
        try:
            self._retrying("checking", rel, lambda: self.backend.info(self.path(rel)))
            return True
        except ObjectNotFoundError:
            return False

    def glob(self, pattern: str = "") -> list[str]:
        """Paths matching a pattern below the root (the root itself, by default: a store opened on a pattern),
        as the backend names them."""
        return self._retrying("listing", pattern, lambda: self.backend.glob(self.path(pattern)))

    def open_input(self, rel: str = "", compression: str | None = None) -> IO[bytes]:
        """A file to stream a source from (importers): opened with retries; what fails while it is read is the
        reader's to report (the stream cannot be replayed)."""

        def call() -> IO[bytes]:
            self._count("source", 1, 0)
            return self.backend.open_read(self.path(rel), compression)

        return self._retrying("opening", rel, call)

    def is_folder(self, rel: str = "") -> bool:
        try:
            info = self._retrying("checking", rel, lambda: self.backend.info(self.path(rel)))
        except ObjectNotFoundError:
            return False
        return info.get("type") == "directory"

    def beside(self, fn: Callable[..., T], *args: Any) -> Future:
        """Run a request in a helper thread, to overlap it with another round trip of the caller's."""
        with self._lock:
            if self._helper is None:
                self._helper = ThreadPoolExecutor(4, thread_name_prefix="atlas-store")
        return self._helper.submit(fn, *args)

    @property
    def bucket(self) -> str | None:
        """The bucket of an object store URL (s3://BUCKET/..., gs://BUCKET/...), else None."""
        protocol = split_protocol(self.url)[0]
        if "::" in self.url or protocol not in OBJECT_STORES:
            return None
        return self.root.split("/", 1)[0]

    def check_bucket(self) -> None:
        """Raise BucketNotFoundError if the URL's bucket does not exist (object stores only; one request). Called
        after a not-found error, to say which: a credential that may not inspect the bucket tells nothing."""
        bucket = self.bucket
        if bucket is None:
            return
        backend = self.backend
        inspect = backend.bucket_info if isinstance(backend, InspectsBuckets) else backend.info
        try:
            self._retrying("checking bucket", "", lambda: inspect(bucket))
        except ObjectNotFoundError as err:
            raise BucketNotFoundError(f"bucket {bucket!r} does not exist", url=self.url) from err
        except AtlasError:
            pass
