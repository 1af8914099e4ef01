"""`Store`: a dataset's root on one backend, with what holds for every backend: names relative to the root,
request and byte counters, the one retry loop, body checks (a short body is never handed on, a long one never
read past its bound: storage/answers.py), Range refusal, merged reads. The backend is chosen in one place
(`connect`), made lazily, and made again in a forked child; a Store pickles to its URL and options only."""

from __future__ import annotations

import importlib
import os
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import IO, Any, TypeVar

import numpy as np
from fsspec.core import split_protocol

from .. import forksafe
from ..errors import (
    AtlasError,
    BucketNotFoundError,
    FormatError,
    ObjectNotFoundError,
    RangeNotSupportedError,
    StorageError,
    TruncatedReadError,
)
from ..ranges import ByteRange, coalesce
from ..stats import Stats
from .answers import WHOLE_OBJECT_BYTES
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
from .errors import translated
from .retry import Pace, with_retries
from .settings import StoreSettings

T = TypeVar("T")
RANGE_RECHECK_SECONDS = 60.0
OBJECT_STORES = ("s3", "s3a", "gs", "gcs", "az", "abfs", "abfss")


# The backend of each protocol, as (module, class) in this package: imported only when a URL needs it, so a reader
# of a local folder never imports s3fs, gcsfs or adlfs. Any other protocol is fsspec's (`FsspecBackend`).
SIBLINGS: dict[str, tuple[str, str]] = {
    "file": ("local_backend", "LocalBackend"),
    "local": ("local_backend", "LocalBackend"),
    "memory": ("fsspec_backend", "MemoryBackend"),
    "s3": ("s3_backend", "S3Backend"),
    "s3a": ("s3_backend", "S3Backend"),
    "gs": ("gcs_backend", "GCSBackend"),
    "gcs": ("gcs_backend", "GCSBackend"),
    "http": ("fsspec_backend", "HTTPBackend"),
    "https": ("fsspec_backend", "HTTPBackend"),
    "az": ("azure_backend", "AzureBackend"),
    "abfs": ("azure_backend", "AzureBackend"),
    "abfss": ("azure_backend", "AzureBackend"),
}
OBSTORE_READS = ("s3", "s3a", "az", "abfs", "abfss")  # protocols obstore may read (storage/obstore_backend.py)


def backend_class(protocol: str) -> Callable[[str, dict[str, Any], float], Backend]:
    """The class serving a protocol, its module imported now."""
    module, name = SIBLINGS.get(protocol, ("fsspec_backend", "FsspecBackend"))
    return getattr(importlib.import_module(f"{__package__}.{module}"), name)


def connect(url: str, storage_options: dict[str, Any], settings: StoreSettings) -> Backend:
    """The backend that serves a URL in this process: the one place the choice is made. A chained URL
    (simplecache::s3://...) is fsspec's to serve as a whole."""
    protocol = split_protocol(url)[0] or "file"
    if "::" in url:
        return backend_class("")(url, storage_options, settings.timeout)
    if protocol in OBSTORE_READS:
        from .obstore_backend import obstore_backend

        reads = obstore_backend(url, storage_options, settings.timeout, settings.max_concurrency)
        if reads is not None:
            return reads
    return backend_class(protocol)(url, storage_options, settings.timeout)


def location(**names: Any) -> str:
    """The one location given under any of its names (`url` here; `root` and `path` in the format's first
    implementation), as a string: a local path or any fsspec URL."""
    given = {name: value for name, value in names.items() if value is not None}
    if len(given) != 1:
        raise TypeError(f"give the dataset's location once, as one of {', '.join(names)} (got {len(given)})")
    return os.fspath(next(iter(given.values())))


class Store:
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
                    out.append(self._too_large(rel, kind, limit))
                else:
                    out.append(translated(body, self.url, rel, "reading") if failed else body)
            return out

        return self._with_retries(rels, attempt)

    def _too_large(self, rel: str, kind: str, limit: int) -> FormatError:
        return FormatError(
            f"longer than {limit:,} bytes, the most a {kind} file may hold: not a file of an Atlas dataset (a server "
            f"that sends without end, or a damaged file); nothing past the bound was read. Check what this URL serves",
            url=self.url,
            path=rel,
        )

    def read_ranges(self, ranges: list[ByteRange], kind: str) -> dict[ByteRange, bytes | memoryview]:
        """Fetch many ranges: touching ones merged, the requests in flight together (bounded), each checked
        for length (a short body is never handed on) and retried alone if it failed transiently. A range that
        is part of a merged read is a view into that read's body (no copy).

        A body longer than the range means the server ignores Range requests: that is reported at once, never
        retried, and ranged reads of this store fail the same way without asking, for RANGE_RECHECK_SECONDS.
        """
        reads = coalesce((r for r in ranges if r.size > 0), self.settings.max_gap_bytes, self.settings.max_merged_bytes)
        if reads and self._ignores_range:
            raise self._range_refused(reads[0].span, None, "refused before, so not asked again for a while")

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
            raise self._range_refused(span, declared, "it sent more than the range")
        if failed:
            return translated(body, self.url, span.path, where)
        return TruncatedReadError(
            f"{where}: got {len(body)} bytes, expected {span.size}: the answer is shorter than the range (the "
            f"response was cut short, or the object is shorter than its index says)",
            url=self.url,
            path=span.path,
            byte_range=(span.start, span.end),
        )

    def _range_refused(self, span: ByteRange, announced: int | None, answer: str) -> RangeNotSupportedError:
        if announced is not None:
            answer = f"it announced {announced:,} bytes (none read)"
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

    def map_array(self, rel: str, kind: str, invalid: Callable[[ValueError], AtlasError]) -> np.ndarray:
        """A local .npy file memory-mapped, not read (local stores only); counted as one request of its size.
        invalid(err): the error to raise for a file numpy refuses (the format's words, not storage's)."""
        backend = self.backend
        if not isinstance(backend, LocalFiles):
            raise StorageError("only a local disk maps files", url=self.url, path=rel)

        def call() -> np.ndarray:
            try:
                array, size = backend.map_array(self.path(rel))
            except ValueError as err:
                raise invalid(err) from err
            self._count(kind, 1, size)
            return array

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

    # -- writes (uncounted: the counters describe reading) ------------------------------------------

    def create(self, rel: str, data: bytes) -> bool:
        """Write the object only if it does not exist yet; False if it does. Atomic where `atomic_create` says
        so (S3 If-None-Match: *, GCS ifGenerationMatch=0, O_EXCL locally); elsewhere a check, then a write."""
        return self._retrying("creating", rel, lambda: self.backend.put_if_absent(self.path(rel), data))

    def read_versioned(self, rel: str, kind: str) -> tuple[bytes, str]:
        """A small object and the version it was read at (its version first, then its bytes: if it changes
        between the two, a conditional request naming that version fails, as it should)."""
        version = self.identity(rel).version
        return self.read(rel, kind), version

    def replace(self, rel: str, data: bytes, version: str) -> bool:
        """Replace the object only if it is still at this version; False if it is not. Atomic where
        `capabilities.conditional` says so (If-Match, ifGenerationMatch, a folder lock locally)."""
        return self._retrying("replacing", rel, lambda: self.backend.put_if_version(self.path(rel), data, version))

    def remove_if(self, rel: str, version: str) -> bool:
        """Delete the object only if it is still at this version; False if it is not (or is gone)."""
        return self._retrying("deleting", rel, lambda: self.backend.delete_if_version(self.path(rel), version))

    def write(self, rel: str, data: bytes) -> None:
        self._retrying("writing", rel, lambda: self.backend.put(self.path(rel), data))

    def upload(self, local_path: str, rel: str) -> None:
        self._retrying("uploading to", rel, lambda: self.backend.put_file(local_path, self.path(rel)))

    def write_stream(self, rel: str, chunks: Iterable[bytes | memoryview]) -> int:
        """Stream chunks into one object (a multipart upload on object stores), returning its size. A failure is
        translated but not retried: the chunks cannot be replayed. Errors the chunks raise pass through."""
        written = 0
        try:
            with self.backend.open_write(self.path(rel)) as f:
                for chunk in chunks:
                    f.write(chunk)
                    written += len(chunk)
        except AtlasError:
            raise
        except Exception as err:
            raise translated(err, self.url, rel, "writing") from err
        return written

    def copy_from(self, source: Store, rel: str, dest_rel: str) -> None:
        """A server-side copy of source's object rel to dest_rel here (see same_namespace); a local file that is a
        link out of its own store's folder is refused."""
        src = source.path(rel)
        local = source.backend
        if isinstance(local, LocalFiles):
            src = source._retrying("reading", rel, lambda: local.regular_file(src))
        self._retrying(f"copying {src} to", dest_rel, lambda: self.backend.copy(src, self.path(dest_rel)))

    def promote(self, src: str, dst: str) -> None:
        """Put a staged object at its final name: a rename on a local disk, a server-side copy on object
        stores (the caller deletes the staging folder in bulk afterwards; no data passes through us)."""
        self._retrying(
            f"copying to {self.url_of(dst)} from", src, lambda: self.backend.promote(self.path(src), self.path(dst))
        )

    def remove(self, rel: str) -> None:
        """Delete an object or a whole folder; a missing one is not an error."""
        try:
            self._retrying("deleting", rel, lambda: self.backend.delete(self.path(rel)))
        except ObjectNotFoundError:
            pass
