"""A local disk: blocks read with pread on files kept open, conditional creates with O_EXCL, staged files put in
place by rename, large indexes memory-mapped. Listings and deletes go through fsspec's local filesystem.

A file's version is its inode and modification time: a writer replaces a dataset's files by rename, so a file
opened for a version keeps serving that version, and a file opened later is checked against the version its
shard was opened with. Conditional replaces and deletes hold an exclusive lock on the folder (flock) while they
compare and act.
"""

from __future__ import annotations

import fcntl
import os
import tempfile
import threading
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import numpy as np

from .base import Capabilities, ObjectChanged
from .fsspec_backend import FsspecBackend


def file_version(st: os.stat_result) -> str:
    return f"{st.st_ino}:{st.st_mtime_ns}"


class _OpenFiles(threading.local):
    """Files kept open per thread for ranged reads (pread needs no seek, so no lock), the least recently used
    closed beyond a bound, each with the version it was opened at."""

    LIMIT = 64

    def __init__(self) -> None:
        self.files: OrderedDict[str, tuple[Any, str]] = OrderedDict()

    def pread(self, path: str, start: int, end: int, version: str | None = None) -> bytes:
        entry = self.files.get(path)
        if entry is None or (version is not None and entry[1] != version):
            f = open(path, "rb", buffering=0)
            opened = file_version(os.fstat(f.fileno()))
            if version is not None and opened != version:
                f.close()
                raise ObjectChanged(f"{path} is no longer version {version} (now {opened})")
            if entry is not None:
                entry[0].close()
            entry = self.files[path] = (f, opened)
            if len(self.files) > self.LIMIT:
                self.files.popitem(last=False)[1][0].close()
        else:
            self.files.move_to_end(path)
        return os.pread(entry[0].fileno(), end - start, start)


class LocalBackend(FsspecBackend):
    client = "local"

    def __init__(self, url: str, storage_options: dict[str, Any], timeout: float) -> None:
        super().__init__(url, storage_options, timeout)
        self.capabilities = Capabilities(
            local=True, remote=False, can_list=True, atomic_create=True, batched=False, conditional=True
        )
        self.open_files = _OpenFiles()

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "open_files": None}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state, open_files=_OpenFiles())

    def pread(self, path: str, start: int, end: int, version: str | None = None) -> bytes:
        return self.open_files.pread(path, start, end, version)

    def get(
        self,
        paths: Sequence[str],
        starts: Sequence[int],
        ends: Sequence[int | None],
        in_flight: int,
        versions: Sequence[str | None] | None = None,
    ) -> list:
        bodies: list[Any] = []
        for i, (p, s, e) in enumerate(zip(paths, starts, ends)):
            try:
                if e is None:
                    with open(p, "rb") as f:
                        bodies.append(f.read())
                else:
                    bodies.append(self.open_files.pread(p, s, e, versions[i] if versions else None))
            except Exception as err:
                bodies.append(err)
        return bodies

    def info(self, path: str) -> dict[str, Any]:
        info = self.fs.info(path)
        st = os.stat(path)
        return {**info, "version": file_version(st)}

    def version_of(self, info: dict[str, Any]) -> str:
        return str(info.get("version") or "")

    def put_if_absent(self, path: str, data: bytes) -> bool:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            return False
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        return True

    @contextmanager
    def _folder_locked(self, path: str) -> Iterator[None]:
        fd = os.open(os.path.dirname(path) or ".", os.O_RDONLY)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # releases the lock

    def _at(self, path: str, version: str) -> bool:
        try:
            return file_version(os.stat(path)) == version
        except FileNotFoundError:
            return False

    def put_if_version(self, path: str, data: bytes, version: str) -> bool:
        with self._folder_locked(path):
            if not self._at(path, version):
                return False
            fd, staged = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".atlas-tmp-")
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.replace(staged, path)  # a new inode: the version changes even within one clock tick
        return True

    def delete_if_version(self, path: str, version: str) -> bool:
        with self._folder_locked(path):
            if not self._at(path, version):
                return False
            os.unlink(path)
        return True

    def promote(self, src: str, dst: str) -> None:
        self.fs.mv(src, dst)

    def map_array(self, path: str) -> tuple[np.ndarray, int]:
        """A .npy file memory-mapped, not read, and its size (ValueError if it is not a valid array)."""
        return np.load(path, mmap_mode="r", allow_pickle=False), os.path.getsize(path)
