"""S3 and Azure reads through obstore (Rust), when the optional extra `atlas_remote[obstore]` is installed;
writes through fsspec (s3fs, adlfs), made only when something is written.

Why: the CPU s3fs/aiobotocore spend per GET is what bounds a batch of random block reads on a few cores;
obstore spends a fraction of it and holds no GIL while it waits. And a process that only reads never imports
s3fs nor makes botocore's client, a good part of a fresh process's time to its first example (figures in
docs/benchmarks.md). Reads go this way: GETs of blocks and of the small objects a shard is opened with, HEADs
and listings. Writes stay on s3fs or adlfs, and so does every request of a store obstore cannot serve exactly as
they would (obstore_config: a chained URL, an option it does not map, a region it cannot tell, a credential it
does not take), or of a process forked after obstore ran (its runtime does not survive a fork: the child's
requests hang). For plain HTTP servers fsspec's aiohttp client is as fast, so they stay on it.

Each read is one request (a HEAD that finds a folder, two); obstore's own retries are off (`Store` has the one
retry loop) and its errors become the builtin types `storage.errors.translated` maps: FileNotFoundError,
PermissionError, OSError.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import IO, Any

from . import forksafe
from .azure_backend import AzureBackend
from .base import Capabilities, ObjectChanged, Oversized, ServerAnswer, Unreachable
from .errors import client_failure
from .fsspec_backend import FsspecBackend
from .obstore_config import azure_settings, obstore_settings
from .s3_backend import S3Backend

# obstore's errors keep the server's answer only in their debug structure: its status field, and S3's or Azure's
# own error code in the body it quotes
ANSWER_STATUS = re.compile(r"inner: Status \{\s*status: (\d{3}),")
ANSWER_CODE = re.compile(r"<Code>(\w+)</Code>")
# how obstore introduces a server's answer, before its status: the URL and time, already in our message or noise
OBSTORE_PREAMBLE = re.compile(r"Error performing \w+ \S+ in [\d.]+\w+ - Server returned non-2xx status code: ")
CONNECT_KIND = re.compile(r"HttpError \{\s*kind: Connect,")
_runtime = {"started": False, "inherited": False}  # obstore's runtime ran in this process / in a parent


def _after_fork() -> None:
    """A child forked after obstore's runtime started cannot use it (its requests hang): s3fs serves it."""
    _runtime["inherited"] = _runtime["inherited"] or _runtime["started"]


forksafe.on_fork(_after_fork)


def s3_store(url: str, options: dict[str, Any], timeout: float) -> Any | None:
    """obstore's store for an s3:// URL, or None where s3fs must serve it (see obstore_settings)."""
    settings = obstore_settings(url, options)
    if settings is None:
        return None
    from obstore.store import S3Store

    bucket, config, provider = settings
    return S3Store(
        bucket,
        config=config,  # type: ignore[arg-type]  # obstore's TypedDicts; our keys are its own
        client_options=_client_options(timeout, str(config.get("endpoint", ""))),  # type: ignore[arg-type]
        retry_config={"max_retries": 0},
        credential_provider=provider,
    )


def azure_store(url: str, options: dict[str, Any], timeout: float) -> Any | None:
    settings = azure_settings(url, options)
    if settings is None:
        return None
    from obstore.store import AzureStore

    container, config = settings
    return AzureStore(
        container,
        config=config,  # type: ignore[arg-type]
        client_options=_client_options(timeout, str(config.get("endpoint", ""))),  # type: ignore[arg-type]
        retry_config={"max_retries": 0},
    )


def _client_options(timeout: float, endpoint: str) -> dict[str, Any]:
    return {"timeout": f"{timeout}s", "connect_timeout": f"{timeout}s", "allow_http": endpoint.startswith("http://")}


def obstore_backend(url: str, options: dict[str, Any], timeout: float, bound: int) -> ObstoreBackend | None:
    """An obstore backend for this URL, or None where its fsspec sibling must serve it (see the module)."""
    try:
        import obstore  # noqa: F401
    except ImportError:
        return None
    protocol = url.partition("://")[0]
    if _runtime["inherited"]:
        return None
    writer: type[FsspecBackend]
    if protocol in ("s3", "s3a"):
        store, writer = s3_store(url, options, timeout), S3Backend
    elif protocol in ("az", "abfs", "abfss"):
        store, writer = azure_store(url, options, timeout), AzureBackend
    else:
        return None
    return None if store is None else ObstoreBackend(url, options, timeout, store, writer, bound)


class ObstoreBackend:
    """Reads of one bucket through obstore's blocking calls, which release the GIL while they wait: GETs (ranged
    or whole, up to max_concurrency in flight on a pool of threads), HEADs and listings. Everything else (writes,
    deletes, copies, recursive listings) through s3fs, made at its first use.

    Why blocking calls rather than obstore's coroutines: a coroutine's result is handed back to Python by one of
    obstore's runtime threads, which may still hold Python objects when the interpreter shuts down (short
    processes then died with SIGABRT at exit; docs/benchmarks.md). A blocking call keeps every Python object on
    the calling thread, so the runtime's threads never touch Python.
    """

    client = "obstore"
    # what s3fs's capabilities say of an s3:// store
    capabilities = Capabilities(
        local=False, remote=True, can_list=True, atomic_create=True, batched=True, conditional=True
    )

    def __init__(
        self,
        url: str,
        storage_options: dict[str, Any],
        timeout: float,
        store: Any,
        writer: type[FsspecBackend],
        bound: int,
    ) -> None:
        self.url, self.storage_options, self.timeout, self.bound = url, storage_options, timeout, bound
        self.root = url.split("://", 1)[1].rstrip("/")
        self.store, self._writer_class = store, writer
        self._threads: ThreadPoolExecutor | None = None
        self._threads_lock = threading.Lock()
        self._writer: FsspecBackend | None = None

    @property
    def writer(self) -> FsspecBackend:
        """s3fs or adlfs, for what obstore does not do here (made at first use: a reading process never loads it)."""
        if self._writer is None:
            self._writer = self._writer_class(self.url, self.storage_options, self.timeout)
        return self._writer

    def get(
        self,
        paths: Sequence[str],
        starts: Sequence[int],
        ends: Sequence[int | None],
        in_flight: int,
        versions: Sequence[str | None] | None = None,
        limits: Sequence[int | None] | None = None,
    ) -> list:
        """Bodies (or the errors, as builtin exceptions) of bucket/key paths, in order; an end of None reads the
        whole object (start is then 0) within its limit; a version makes the read conditional (If-Match). One
        read is made on the calling thread."""
        keys = [_key(p) for p in paths]
        versions = versions or [None] * len(keys)
        limits = limits or [None] * len(keys)
        if len(keys) == 1:
            return [self._get(keys[0], starts[0], ends[0], versions[0], limits[0])]
        gate = threading.BoundedSemaphore(in_flight)  # the pool is sized once; the pace may be lower now

        def gated(key: str, start: int, end: int | None, version: str | None, limit: int | None) -> Any:
            with gate:
                return self._get(key, start, end, version, limit)

        return list(self._pool().map(gated, keys, starts, ends, versions, limits))

    def version_of(self, info: dict[str, Any]) -> str:
        return str(info.get("ETag") or info.get("etag") or "")

    def put_if_version(self, path: str, data: bytes, version: str) -> bool:
        return self.writer.put_if_version(path, data, version)

    def delete_if_version(self, path: str, version: str) -> bool:
        return self.writer.delete_if_version(path, version)

    def info(self, path: str) -> dict[str, Any]:
        """An object's size and version, named as s3fs's info() names them (one HEAD). As with s3fs, a folder
        (a prefix with objects under it, found by a second request) is a directory."""
        return _builtin_errors(_info)(self.store, _key(path))

    def list_names(self, path: str) -> list[str]:
        """Names directly under a folder (one delimited listing, every page); a folder with nothing in it is
        not found, as s3fs says."""
        import obstore

        key = _key(path)
        _mark_runtime()
        listing = _builtin_errors(obstore.list_with_delimiter)(self.store, key + "/" if key else None)
        names = [p.rstrip("/").rsplit("/", 1)[-1] for p in listing["common_prefixes"]]
        names += [o["path"].rsplit("/", 1)[-1] for o in listing["objects"]]
        if not names and key:
            raise FileNotFoundError(path)
        return names

    def find(self, path: str) -> dict[str, dict[str, Any]]:
        return self.writer.find(path)

    def put(self, path: str, data: bytes) -> None:
        self.writer.put(path, data)

    def put_if_absent(self, path: str, data: bytes) -> bool:
        return self.writer.put_if_absent(path, data)

    def put_file(self, local_path: str, path: str) -> None:
        self.writer.put_file(local_path, path)

    def open_write(self, path: str) -> IO[bytes]:
        return self.writer.open_write(path)

    def open_read(self, path: str, compression: str | None = None) -> IO[bytes]:
        return self.writer.open_read(path, compression)

    def glob(self, pattern: str) -> list[str]:
        return self.writer.glob(pattern)

    def copy(self, src: str, dst: str) -> None:
        self.writer.copy(src, dst)

    def promote(self, src: str, dst: str) -> None:
        self.writer.promote(src, dst)

    def delete(self, path: str) -> None:
        self.writer.delete(path)

    def namespace(self) -> object:
        return self.writer.namespace()

    def bucket_info(self, bucket: str) -> dict[str, Any]:
        """obstore's store is bound to its bucket: s3fs or adlfs looks at the bucket itself."""
        return self.writer.info(bucket)

    def close(self) -> None:
        """Shut the pool of reading threads (made again if the backend is used after)."""
        with self._threads_lock:
            threads, self._threads = self._threads, None
        if threads is not None:
            threads.shutdown(wait=True)

    def _pool(self) -> ThreadPoolExecutor:
        """The threads that carry reads made together, sized once: a store's max_concurrency does not change."""
        with self._threads_lock:
            if self._threads is None:
                self._threads = ThreadPoolExecutor(self.bound, thread_name_prefix="atlas-obstore")
            return self._threads

    def _get(self, key: str, start: int, end: int | None, version: str | None = None, limit: int | None = None) -> Any:
        """One GET, its body read within the limit. obstore's own `bytes()` takes a body whole, and first
        allocates what Content-Length announces: 1 TiB announced aborted the process. So a whole object's
        announced size is checked first, and a range is read as a stream in one chunk of at least its size plus
        one byte (obstore yields smaller chunks only at the end), which is all of a body that fits."""
        import obstore

        _mark_runtime()
        options: Any = {} if version is None else {"if_match": version}  # obstore's GetOptions
        try:
            if end is None:  # a whole (small) object: metadata, parsed by callers that want bytes
                answer = obstore.get(self.store, key, options=options or None)
                if limit is not None and answer.meta["size"] > limit:
                    raise Oversized(answer.meta["size"])
                return answer.bytes().to_bytes()
            options["range"] = (start, end)
            chunk = next(iter(obstore.get(self.store, key, options=options).stream(end - start + 1)), b"")
            return memoryview(chunk)
        except Oversized as err:
            return err
        except Exception as err:
            return _builtin(err)
        except BaseException as err:  # obstore's PanicException: Store translates it (ClientFailedError)
            if not client_failure(err):
                raise
            return err


def _mark_runtime() -> None:
    """Record that obstore's runtime runs in this process (a forked child must not use it)."""
    _runtime["started"] = True


def _key(path: str) -> str:
    """The key of a bucket/key path (the bucket is the store's)."""
    return path.partition("/")[2]


def _info(store: Any, key: str) -> dict[str, Any]:
    import obstore

    _mark_runtime()
    try:
        meta = obstore.head(store, key)
    except FileNotFoundError:
        for chunk in obstore.list(store, key + "/", chunk_size=1):
            if chunk:
                return {"size": 0, "type": "directory"}
        raise
    return {
        "size": meta["size"],
        "VersionId": meta["version"],
        "ETag": meta["e_tag"],
        "LastModified": meta["last_modified"],
        "type": "file",
    }


def _builtin_errors(function: Any) -> Any:
    """An obstore function whose errors are raised as builtin ones (see _builtin)."""

    def call(*args: Any) -> Any:
        try:
            return function(*args)
        except Exception as err:
            builtin = _builtin(err)
            if builtin is err:
                raise
            raise builtin from err

    return call


def _builtin(err: Exception) -> Exception:
    """obstore's refusals as PermissionError (never retried); not-found already comes as FileNotFoundError; the
    rest (network, server errors) as OSError, which Store retries."""
    from obstore.exceptions import PermissionDeniedError, PreconditionError, UnauthenticatedError

    if isinstance(err, (FileNotFoundError, PermissionError)):
        return err
    if isinstance(err, PreconditionError):
        changed = ObjectChanged(str(err).split("\n\nDebug source:")[0])
        changed.__cause__ = err
        return changed
    text, _, debug = str(err).partition("\n\nDebug source:")
    text = OBSTORE_PREAMBLE.sub("", text)  # the status and the store's own words say it
    answered = ANSWER_STATUS.search(debug)  # obstore keeps the server's status only in its debug structure
    wrapped: Exception
    if "TimedOut" in debug or "timed out" in debug:
        wrapped = TimeoutError(f"no whole answer within the timeout setting ({text})")
    elif isinstance(err, (PermissionDeniedError, UnauthenticatedError)):
        wrapped = PermissionError(text)
    elif answered is not None:
        code = ANSWER_CODE.search(debug)
        wrapped = ServerAnswer(int(answered.group(1)), code.group(1) if code else "", text)
    elif CONNECT_KIND.search(debug):
        wrapped = Unreachable(text)
    else:
        wrapped = OSError(text)
    wrapped.__cause__ = err
    return wrapped
