"""A local disk: blocks read with pread on files kept open, conditional creates with O_EXCL, files written under a
temporary name and renamed into place, large indexes memory-mapped. Listings go through fsspec's local filesystem.

A file's version is its inode and modification time: a writer replaces a dataset's files by rename, so a file
opened for a version keeps serving that version, and a file opened later is checked against the version its
shard was opened with. Conditional replaces and deletes hold an exclusive lock on the folder (flock) while they
compare and act.

A dataset's folder comes from strangers too (an archive unpacked, a shared disk): nothing here reads, writes or
deletes outside the root's folder through a symbolic link. A path that is a link, or lies under one, leading out
of the root is refused (FormatError), whatever the operation; a link that stays inside is followed when reading.
A write never follows a link: it renames a new file over the name, replacing the link. Reads open regular files
only (a FIFO named meta.json would block the reader), and a whole file is read up to its limit.
"""

from __future__ import annotations

import errno
import fcntl
import functools
import os
import re
import shutil
import stat
import tempfile
import threading
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import IO, Any, cast

import cachetools
import numpy as np

from ..errors import FormatError
from .base import Capabilities, ObjectChanged, Oversized
from .fsspec_backend import FsspecBackend

TEMPORARY_PREFIX = ".atlas-tmp-"


def file_version(st: os.stat_result) -> str:
    return f"{st.st_ino}:{st.st_mtime_ns}"


class _ClosingLRU(cachetools.LRUCache):
    """cachetools' LRU of open files, each closed when it is dropped."""

    def popitem(self) -> tuple[str, tuple[Any, str]]:
        path, held = super().popitem()
        held[0].close()
        return path, held


class _OpenFiles(threading.local):
    """Files kept open per thread for ranged reads (pread needs no seek, so no lock), the least recently used
    closed beyond a bound, each with the version it was opened at."""

    LIMIT = 64

    def __init__(self, opener: Callable[[str], tuple[int, os.stat_result]]) -> None:
        self.opener = opener
        self.files = _ClosingLRU(maxsize=self.LIMIT)

    def pread(self, path: str, start: int, end: int, version: str | None = None) -> bytes:
        entry = self.files.get(path)
        if entry is None or (version is not None and entry[1] != version):
            fd, st = self.opener(path)
            f = os.fdopen(fd, "rb", buffering=0)
            opened = file_version(st)
            if version is not None and opened != version:
                f.close()
                raise ObjectChanged(f"{path} is no longer version {version} (now {opened})")
            if entry is not None:
                entry[0].close()
            entry = self.files[path] = (f, opened)
        return os.pread(entry[0].fileno(), end - start, start)


class _ReplacingFile:
    """A file written under a temporary name beside its target and renamed over it when closed whole (so a link
    at the target is replaced, never followed); removed if the writing failed."""

    def __init__(self, target: str) -> None:
        self.target = target
        self.file = open(_temporary(os.path.dirname(target)), "xb")
        self.failed = False

    def write(self, data: Any) -> int:
        return self.file.write(data)

    def __enter__(self) -> _ReplacingFile:
        return self

    def __exit__(self, kind: Any, *rest: Any) -> None:
        self.failed = self.failed or kind is not None
        self.close()

    def close(self) -> None:
        if self.file.closed:
            return
        self.file.close()
        if self.failed:
            os.unlink(self.file.name)
        else:
            os.replace(self.file.name, self.target)


def _copied(source: str, staged: str) -> None:
    shutil.copyfile(source, staged)


def _names_below(folder: str, path: str) -> list[str] | None:
    """The names of path below folder, or None if it is not plainly below it (`..`, `.` or another folder)."""
    if path == folder:
        return []
    prefix = folder.rstrip("/") + "/"
    if not path.startswith(prefix):
        return None
    names = path[len(prefix) :].split("/")
    return None if any(name in ("", ".", "..") for name in names) else names


def _link_among(folder: str, names: list[str]) -> bool:
    """Whether a symbolic link lies on the way from folder down names (what does not exist is no link)."""
    here = folder
    for name in names:
        here = os.path.join(here, name)
        try:
            if stat.S_ISLNK(os.lstat(here).st_mode):
                return True
        except FileNotFoundError:
            return False
    return False


def _all(fd: int, size: int) -> bytes:
    """An open file read to its end: its size in one read, then on in case it grew."""
    chunks: list[bytes] = []
    while chunk := os.read(fd, size + 1 if not chunks else 1 << 20):
        chunks.append(chunk)
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def _temporary(folder: str) -> str:
    return os.path.join(folder, f"{TEMPORARY_PREFIX}{uuid.uuid4().hex}")


class LocalBackend(FsspecBackend):
    client = "local"

    def __init__(self, url: str, storage_options: dict[str, Any], timeout: float) -> None:
        super().__init__(url, storage_options, timeout)
        self.capabilities = Capabilities(
            local=True, remote=False, can_list=True, atomic_create=True, batched=False, conditional=True
        )
        self.open_files = _OpenFiles(self._open_file)

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "open_files": None}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state, open_files=None)
        self.open_files = _OpenFiles(self._open_file)

    # -- where a path leads -----------------------------------------------------------------------------

    def _inside(self, path: str, below: str | None = None, last: bool = True) -> str:
        """The path, or where it really leads if a link lies on its way: FormatError if that is out of the root's
        folder (or `below`). Each name below the folder is looked at (lstat; the last one too unless `last` is
        False: the caller opens it with O_NOFOLLOW) and the path resolved only if one is a link: realpath costs
        a lstat for every name from /, and a pass opens each shard's files."""
        folder = below or self.root
        names = _names_below(folder, path)
        if names is not None and not _link_among(folder, names if last else names[:-1]):
            return path
        real, inside = os.path.realpath(path), self._real_root if below is None else os.path.realpath(below)
        if real != inside and not real.startswith(inside.rstrip("/") + "/"):
            name = os.path.relpath(path, folder)
            raise FormatError(
                f"{name} is a symbolic link to {real}, or lies under one, outside the dataset's folder {inside}: "
                f"refused, nothing was read, written or deleted (remove the link, or copy what it leads to into "
                f"the folder)"
            )
        return real

    @functools.cached_property
    def _real_root(self) -> str:
        return os.path.realpath(self.root)

    def _entry(self, path: str) -> str:
        """The path of the name itself (a link not followed), in its folder's real place inside the root."""
        if os.path.normpath(path) == os.path.normpath(self.root):
            return path
        return os.path.join(self._inside(os.path.dirname(path)), os.path.basename(path))

    def _target(self, path: str) -> str:
        """Where a write of path goes: the name in its folder's real place inside the root, the folder made."""
        target = self._entry(path)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        return target

    def _open_file(self, path: str) -> tuple[int, os.stat_result]:
        """A descriptor of a regular file inside the root, for reading, and its stat."""
        flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
        try:
            fd = os.open(self._inside(path, last=False), flags)
        except OSError as err:
            if err.errno != errno.ELOOP:
                raise
            fd = os.open(self._inside(path), flags)  # the name is a link: followed if it stays inside
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            os.close(fd)
            if stat.S_ISDIR(st.st_mode):
                raise IsADirectoryError(errno.EISDIR, "is a folder", path)
            raise FormatError(
                f"{os.path.relpath(path, self.root)} is not a regular file (a FIFO, a socket or a device)"
            )
        return fd, st

    def regular_file(self, path: str) -> str:
        """The real path of a regular file inside the root (for calls that open it by name)."""
        os.close(self._open_file(path)[0])
        return self._inside(path)

    # -- reads ------------------------------------------------------------------------------------------

    def pread(self, path: str, start: int, end: int, version: str | None = None) -> bytes:
        return self.open_files.pread(path, start, end, version)

    def get(
        self,
        paths: Sequence[str],
        starts: Sequence[int],
        ends: Sequence[int | None],
        in_flight: int,
        versions: Sequence[str | None] | None = None,
        limits: Sequence[int | None] | None = None,
    ) -> list:
        bodies: list[Any] = []
        for i, (p, s, e) in enumerate(zip(paths, starts, ends)):
            try:
                if e is None:
                    limit = limits[i] if limits else None
                    fd, st = self._open_file(p)
                    try:  # read(limit + 1) would allocate the whole limit: the file says its size
                        bodies.append(
                            Oversized(st.st_size) if limit is not None and st.st_size > limit else _all(fd, st.st_size)
                        )
                    finally:
                        os.close(fd)
                else:
                    bodies.append(self.open_files.pread(p, s, e, versions[i] if versions else None))
            except Exception as err:
                bodies.append(err)
        return bodies

    def info(self, path: str) -> dict[str, Any]:
        real = self._inside(path)
        return {**self.fs.info(real), "name": path, "version": file_version(os.stat(real))}

    def version_of(self, info: dict[str, Any]) -> str:
        return str(info.get("version") or "")

    def list_names(self, path: str) -> list[str]:
        return super().list_names(self._inside(path))

    def find(self, path: str) -> dict[str, dict[str, Any]]:
        """Every file below a folder, a link among them refused if it leads out of the root (one that stays
        inside is listed, not followed, as fsspec lists it)."""
        self._inside(path)
        found = super().find(path)
        for name, info in found.items():
            if info.get("islink"):
                self._inside(name)
        return found

    def glob(self, pattern: str) -> list[str]:
        """Paths matching a pattern; a match that is a link out of the pattern's fixed folder is refused."""
        folder = os.path.dirname(re.split(r"[*?\[]", pattern, maxsplit=1)[0]) or "/"
        matches = super().glob(pattern)
        for match in matches:
            self._inside(match, folder)
        return matches

    def open_read(self, path: str, compression: str | None = None) -> IO[bytes]:
        return self.fs.open(self.regular_file(path), "rb", compression=compression)

    def map_file(self, path: str) -> np.ndarray:
        """A file's bytes memory-mapped, not read (uint8, read-only; an empty file is an empty array)."""
        real = self.regular_file(path)
        if not os.path.getsize(real):
            return np.zeros(0, np.uint8)
        return np.memmap(real, dtype=np.uint8, mode="r")

    # -- writes: never through a link ---------------------------------------------------------------------

    def _replace(self, path: str, write: Callable[[str], None]) -> None:
        """write(temporary path) beside path's real place, then renamed over path (a link there is replaced)."""
        target = self._target(path)
        staged = _temporary(os.path.dirname(target))
        try:
            with open(staged, "xb"):
                pass
            write(staged)
            os.replace(staged, target)
        except BaseException:
            if os.path.lexists(staged):
                os.unlink(staged)
            raise

    def put(self, path: str, data: bytes) -> None:
        def write(staged: str) -> None:
            with open(staged, "wb") as f:
                f.write(data)

        self._replace(path, write)

    def put_file(self, local_path: str, path: str) -> None:
        self._replace(path, lambda staged: _copied(local_path, staged))

    def open_write(self, path: str) -> IO[bytes]:
        return cast(IO[bytes], _ReplacingFile(self._target(path)))

    def copy(self, src: str, dst: str) -> None:
        """src: a path its own store checked (Store.copy_from: it may be another local store's)."""
        self._replace(dst, lambda staged: _copied(src, staged))

    def put_if_absent(self, path: str, data: bytes) -> bool:
        try:
            fd = os.open(self._target(path), os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
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
        target = self._entry(path)
        with self._folder_locked(target):
            if not self._at(target, version):
                return False
            fd, staged = tempfile.mkstemp(dir=os.path.dirname(target), prefix=TEMPORARY_PREFIX)
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.replace(staged, target)  # a new inode: the version changes even within one clock tick
        return True

    def delete_if_version(self, path: str, version: str) -> bool:
        target = self._entry(path)
        with self._folder_locked(target):
            if not self._at(target, version):
                return False
            os.unlink(target)
        return True

    def promote(self, src: str, dst: str) -> None:
        """A rename of the staged name itself (never of where a link leads) to its final name."""
        self._inside(src)
        source, target = self._entry(src), self._target(dst)
        try:
            os.replace(source, target)
        except OSError as err:
            if err.errno != errno.EXDEV:
                raise
            shutil.move(source, target)  # the staging folder is on another filesystem (a mount inside the dataset)

    def delete(self, path: str) -> None:
        """Delete a file or a whole folder; a link is removed, never what it leads to."""
        target = self._entry(path)
        if stat.S_ISDIR(os.lstat(target).st_mode):
            shutil.rmtree(target)  # removes links inside as links
        else:
            os.unlink(target)
