"""Any fsspec filesystem as a backend: S3 (s3fs), GCS (gcsfs), Azure (adlfs), HTTP, memory, chained URLs.

The filesystem is made with our settings where the user gave none: listings never cached (a cached listing would
hide a dataset committed since), the client's own retries off (`Store` has the one retry loop), and `timeout`
bounding each request where the client takes one.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import IO, Any

import fsspec
from fsspec.core import split_protocol, url_to_fs
from fsspec.implementations.cached import CachingFileSystem
from fsspec.implementations.local import LocalFileSystem
from fsspec.implementations.memory import MemoryFileSystem

from ..errors import StorageError
from .base import Capabilities

# Stores whose conditional create ("create this object only if it does not exist") is atomic on the server:
# S3 If-None-Match: *, GCS ifGenerationMatch=0.
ATOMIC_CREATE_PROTOCOLS = {"s3", "s3a", "gs", "gcs"}


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
                **options.get("config_kwargs", {}),
            }
        elif protocol in ("http", "https"):
            import aiohttp

            options["client_kwargs"] = {
                "timeout": aiohttp.ClientTimeout(total=timeout),
                **options.get("client_kwargs", {}),
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

    def __init__(self, url: str, storage_options: dict[str, Any], timeout: float) -> None:
        self.fs, self.root = make_filesystem(url, storage_options, timeout)
        protocols = set(self.fs.protocol if isinstance(self.fs.protocol, (tuple, list)) else (self.fs.protocol,))
        self.capabilities = Capabilities(
            local=False,
            remote=not isinstance(self.fs, (LocalFileSystem, MemoryFileSystem)),
            can_list=not {"http", "https"} & protocols,
            atomic_create="::" not in url and bool(ATOMIC_CREATE_PROTOCOLS & protocols),
            # fsspec's caching layers download a whole batch at once; one missing object cancels the other
            # downloads, which leave truncated files in the cache that later reads take for the object (seen in
            # CI). Behind them reads go one by one: each download finishes before the next starts.
            batched=self.fs.async_impl and not isinstance(self.fs, CachingFileSystem),
        )

    def get(self, paths: Sequence[str], starts: Sequence[int], ends: Sequence[int | None], in_flight: int) -> list:
        if self.capabilities.batched and len(paths) > 1:
            try:
                return self.fs.cat_ranges(
                    list(paths), list(starts), list(ends), batch_size=in_flight, on_error="return"
                )
            except Exception:  # a layer that fails the whole batch for one object: each read then fails alone
                pass
        bodies: list[Any] = []
        for p, s, e in zip(paths, starts, ends):
            try:
                bodies.append(self.fs.cat_file(p, start=s, end=e))
            except Exception as err:
                bodies.append(err)
        return bodies

    def info(self, path: str) -> dict[str, Any]:
        return self.fs.info(path)

    def list_names(self, path: str) -> list[str]:
        return self.fs.ls(path, detail=False, refresh=True)

    def find(self, path: str) -> dict[str, dict[str, Any]]:
        return self.fs.find(path, withdirs=False, detail=True)

    def put(self, path: str, data: bytes) -> None:
        self.fs.pipe_file(path, data)

    def put_if_absent(self, path: str, data: bytes) -> bool:
        try:
            if self.capabilities.atomic_create:
                self.fs.pipe_file(path, data, mode="create")
                return True
            if self.fs.exists(path):  # no conditional create here: a check, then a write
                return False
            self.fs.pipe_file(path, data)
        except FileExistsError:
            return False
        return True

    def put_file(self, local_path: str, path: str) -> None:
        self.fs.put_file(local_path, path)

    def open_write(self, path: str) -> IO[bytes]:
        return self.fs.open(path, "wb")

    def open_read(self, path: str, compression: str | None = None) -> IO[bytes]:
        return self.fs.open(path, "rb", compression=compression)

    def glob(self, pattern: str) -> list[str]:
        return sorted(self.fs.glob(pattern))

    def copy(self, src: str, dst: str) -> None:
        self.fs.cp_file(src, dst)

    def promote(self, src: str, dst: str) -> None:
        self.fs.cp_file(src, dst)  # object stores have no rename; the staging folder is deleted in bulk later

    def delete(self, path: str) -> None:
        self.fs.rm(path, recursive=True)

    def namespace(self) -> object:
        return self.fs  # fsspec hands the same instance to the same protocol and options


class MemoryBackend(FsspecBackend):
    """memory:// lives in this process: a lock makes its conditional creates atomic."""

    _create_lock = threading.Lock()

    def __init__(self, url: str, storage_options: dict[str, Any], timeout: float) -> None:
        super().__init__(url, storage_options, timeout)
        self.capabilities = Capabilities(False, False, True, True, False)

    def put_if_absent(self, path: str, data: bytes) -> bool:
        with self._create_lock:
            if self.fs.exists(path):
                return False
            self.fs.pipe_file(path, data)
            return True
