"""Any fsspec filesystem as a backend (memory, chained URLs, any protocol fsspec knows), and what the async ones
share: reads made as coroutines on the filesystem's own event loop, in flight together (bounded), each with a
deadline of `timeout` seconds for the whole request (a server that trickles a byte at a time cannot hold a
reader: a client's socket timeout bounds only the wait for each byte).

The filesystem is made with our settings where the user gave none: listings never cached (a cached listing would
hide a dataset committed since), the client's own retries off (`Store` has the one retry loop), `timeout`, and for
HTTP and S3 redirects held to their origin (storage/answers.py). Clouds with conditional requests are siblings in
their own modules (s3, gcs, azure); HTTP is here, its bodies read within their bound.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Sequence
from typing import IO, Any

import fsspec
from fsspec.asyn import _run_coros_in_chunks, sync
from fsspec.core import split_protocol, url_to_fs
from fsspec.implementations.cached import CachingFileSystem
from fsspec.implementations.local import LocalFileSystem
from fsspec.implementations.memory import MemoryFileSystem

from ..errors import StorageError
from .answers import REDIRECTS, REDIRECTS_CHECKED, read_within, s3_session_class
from .base import Capabilities, ObjectChanged, ServerAnswer, version_of


def make_filesystem(url: str, storage_options: dict[str, Any], timeout: float) -> tuple[fsspec.AbstractFileSystem, str]:
    """The filesystem and the root path of a URL, with our defaults where the user set nothing."""
    options = dict(storage_options)
    protocol = split_protocol(url)[0]
    if "::" not in url:  # chained URLs take per-protocol options; the user sets those
        options.setdefault("use_listings_cache", False)
        if protocol in (None, "file", "local"):
            options.setdefault("auto_mkdir", True)  # local writes create their folders; never buckets
        elif protocol in ("s3", "s3a"):
            # These options make the instance fsspec caches for us distinct from any other s3fs instance.
            options["config_kwargs"] = {
                "connect_timeout": timeout,
                "read_timeout": timeout,
                "retries": {"total_max_attempts": 1},
                "http_session_cls": s3_session_class(),
                **options.get("config_kwargs", {}),
            }
        elif protocol in ("http", "https"):
            import aiohttp

            given = options.get("client_kwargs", {})
            options["client_kwargs"] = {
                "timeout": aiohttp.ClientTimeout(total=timeout),
                **given,
                "trace_configs": [*given.get("trace_configs", []), REDIRECTS_CHECKED],
            }
    try:
        fs, root = url_to_fs(url, **options)
    except Exception as err:  # unknown protocol, missing backend package, bad options
        raise StorageError(f"cannot open: {type(err).__name__}: {err}", url=url) from err
    if protocol in ("s3", "s3a") and "::" not in url:
        fs.retries = 1  # s3fs's own retry loop, on the instance only our options create: ours is the one layer
    return fs, root.rstrip("/")


class FsspecBackend:
    """Requests through one fsspec filesystem."""

    client = "fsspec"
    conditional = False  # siblings that make requests conditional on a version say so

    def __init__(self, url: str, storage_options: dict[str, Any], timeout: float) -> None:
        self.fs, self.root = make_filesystem(url, storage_options, timeout)
        self.timeout = timeout
        self.on_redirects: Callable[[int], None] | None = None  # Store counts redirects followed as requests
        protocols = set(self.fs.protocol if isinstance(self.fs.protocol, (tuple, list)) else (self.fs.protocol,))
        self.capabilities = Capabilities(
            local=False,
            remote=not isinstance(self.fs, (LocalFileSystem, MemoryFileSystem)),
            can_list=not {"http", "https"} & protocols,
            atomic_create=self.conditional,
            # fsspec's caching layers download a whole batch at once; one missing object cancels the other
            # downloads, which leave truncated files in the cache that later reads take for the object (seen in
            # CI). Behind them reads go one by one: each download finishes before the next starts.
            batched=self.fs.async_impl and not isinstance(self.fs, CachingFileSystem),
            conditional=self.conditional,
        )

    # -- reads ---------------------------------------------------------------------------------------

    def get(
        self,
        paths: Sequence[str],
        starts: Sequence[int],
        ends: Sequence[int | None],
        in_flight: int,
        versions: Sequence[str | None] | None = None,
        limits: Sequence[int | None] | None = None,
    ) -> list:
        if not self.capabilities.batched:
            return [self._get_sync(p, s, e) for p, s, e in zip(paths, starts, ends)]
        versions = versions or [None] * len(paths)
        limits = limits or [None] * len(paths)
        coros = [
            self._deadline(p, s, e, v, e - s if e is not None else limit)
            for p, s, e, v, limit in zip(paths, starts, ends, versions, limits)
        ]
        return sync(self.fs.loop, _run_coros_in_chunks, coros, batch_size=in_flight, return_exceptions=True)

    def _get_sync(self, path: str, start: int, end: int | None) -> Any:
        """Filesystems fsspec reads in this process or through a local copy (memory, chained URLs): read whole,
        the bound checked by Store after."""
        try:
            return self.fs.cat_file(path, start=start, end=end)
        except Exception as err:
            return err

    async def _deadline(self, path: str, start: int, end: int | None, version: str | None, limit: int | None) -> bytes:
        try:
            return await asyncio.wait_for(self._get_one(path, start, end, version, limit), self.timeout)
        except asyncio.TimeoutError:
            raise TimeoutError(f"no whole answer within {self.timeout:g} s (the timeout setting)") from None

    async def _get_one(self, path: str, start: int, end: int | None, version: str | None, limit: int | None) -> bytes:
        """One read on the filesystem's loop; siblings make it conditional on the version and read within the
        limit (here the client reads the body, and Store checks its length: gcsfs, adlfs and other async
        filesystems)."""
        return await self.fs._cat_file(path, start=start, end=end)

    def info(self, path: str) -> dict[str, Any]:
        return self.fs.info(path)

    def version_of(self, info: dict[str, Any]) -> str:
        return version_of(info)

    def list_names(self, path: str) -> list[str]:
        return self.fs.ls(path, detail=False, refresh=True)

    def find(self, path: str) -> dict[str, dict[str, Any]]:
        return self.fs.find(path, withdirs=False, detail=True)

    def open_read(self, path: str, compression: str | None = None) -> IO[bytes]:
        return self.fs.open(path, "rb", compression=compression)

    def glob(self, pattern: str) -> list[str]:
        return sorted(self.fs.glob(pattern))

    # -- writes --------------------------------------------------------------------------------------

    def put(self, path: str, data: bytes) -> None:
        self.fs.pipe_file(path, data)

    def put_if_absent(self, path: str, data: bytes) -> bool:
        """Without a conditional create: a check, then a write (capabilities.atomic_create is False)."""
        if self.fs.exists(path):
            return False
        self.fs.pipe_file(path, data)
        return True

    def put_if_version(self, path: str, data: bytes, version: str) -> bool:
        """Without conditional writes: a check, then a write (capabilities.conditional is False)."""
        if not self._at_version(path, version):
            return False
        self.fs.pipe_file(path, data)
        return True

    def delete_if_version(self, path: str, version: str) -> bool:
        if not self._at_version(path, version):
            return False
        self.fs.rm(path)
        return True

    def _at_version(self, path: str, version: str) -> bool:
        try:
            return self.version_of(self.fs.info(path)) == version
        except FileNotFoundError:
            return False

    def put_file(self, local_path: str, path: str) -> None:
        self.fs.put_file(local_path, path)

    def open_write(self, path: str) -> IO[bytes]:
        return self.fs.open(path, "wb")

    def copy(self, src: str, dst: str) -> None:
        self.fs.cp_file(src, dst)

    def promote(self, src: str, dst: str) -> None:
        self.fs.cp_file(src, dst)  # object stores have no rename; the staging folder is deleted in bulk later

    def delete(self, path: str) -> None:
        self.fs.rm(path, recursive=True)

    def namespace(self) -> object:
        return self.fs  # fsspec hands the same instance to the same protocol and options


class HTTPBackend(FsspecBackend):
    """A web server (read-only): a read names the ETag the shard was opened with (If-Match), which servers of
    static files honour (nginx, aiohttp, CDNs), so a file replaced under a reader answers 412, never new bytes.
    Bodies are read within their limit (a `200` to a ranged read is refused before its body is read), and
    redirects within the origin are counted as requests (`on_redirects`)."""

    def __init__(self, url: str, storage_options: dict[str, Any], timeout: float) -> None:
        super().__init__(url, storage_options, timeout)
        self.capabilities = Capabilities(False, True, False, False, True, conditional=True)

    async def _get_one(self, path: str, start: int, end: int | None, version: str | None, limit: int | None) -> bytes:
        REDIRECTS.set(self.on_redirects)
        kw = dict(self.fs.kwargs)
        headers = dict(kw.pop("headers", {}))
        if version:
            headers["If-Match"] = version
        if end is not None:
            headers["Range"] = f"bytes={start}-{end - 1}"
        session = await self.fs.set_session()
        async with session.get(self.fs.encode_url(path), headers=headers, **kw) as answer:
            if version and answer.status == 412:
                raise ObjectChanged(f"{path} is no longer version {version}")
            self.fs._raise_not_found_for_status(answer, path)
            if answer.status not in (200, 206):  # a redirect without a Location: not the object's bytes
                raise ServerAnswer(answer.status, "", f"{answer.reason}: the server sent no object")
            whole = end is not None and answer.status != 206
            return await read_within(answer.content.read, answer.content_length, limit, whole)

    def info(self, path: str) -> dict[str, Any]:
        return sync(self.fs.loop, self._info, path)

    async def _info(self, path: str) -> dict[str, Any]:
        REDIRECTS.set(self.on_redirects)
        return await self.fs._info(path)

    def version_of(self, info: dict[str, Any]) -> str:
        """A strong ETag, or none: If-Match never matches a weak one (nginx's for gzipped files) nor a date, and
        a file without a version is read without conditions (its size still checked)."""
        etag = str(info.get("ETag") or "")
        return etag if etag.startswith('"') else ""


class MemoryBackend(FsspecBackend):
    """memory:// lives in this process: a lock makes its conditional writes atomic, and a conditional read takes
    the version and the bytes from the same in-memory file."""

    _lock = threading.Lock()

    def __init__(self, url: str, storage_options: dict[str, Any], timeout: float) -> None:
        super().__init__(url, storage_options, timeout)
        self.capabilities = Capabilities(False, False, True, True, False, conditional=True)

    def get(
        self,
        paths: Sequence[str],
        starts: Sequence[int],
        ends: Sequence[int | None],
        in_flight: int,
        versions: Sequence[str | None] | None = None,
        limits: Sequence[int | None] | None = None,
    ) -> list:
        if not versions:
            return super().get(paths, starts, ends, in_flight)
        bodies: list[Any] = []
        for path, start, end, version in zip(paths, starts, ends, versions):
            held = self.fs.store.get(self.fs._strip_protocol(path))
            if version is None or held is None:
                bodies.append(self._get_sync(path, start, end))
            elif str(held.created) != version:
                bodies.append(ObjectChanged(f"{path} is no longer version {version}"))
            else:
                bodies.append(bytes(held.getbuffer()[start:end]))
        return bodies

    def put_if_absent(self, path: str, data: bytes) -> bool:
        with self._lock:
            return super().put_if_absent(path, data)

    def put_if_version(self, path: str, data: bytes, version: str) -> bool:
        with self._lock:
            return super().put_if_version(path, data, version)

    def delete_if_version(self, path: str, version: str) -> bool:
        with self._lock:
            return super().delete_if_version(path, version)
