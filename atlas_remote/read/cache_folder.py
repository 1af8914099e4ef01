"""The disk cache's folder, and what is read from it: a folder private to its user, checked when a reader opens
it, and a diskcache `Disk` that hands back raw bytes from inside it, or nothing.

A cache folder another user can write is a way into every reader that names it (docs/security.md): diskcache
unpickles a row whose mode says pickle (code ran), deletes the file an expired row names (a file outside the
folder was deleted), and a block swapped for another with its CRC-32 forged was served as the first. So the
folder must be private (checked here at open; created 0700), and even a row planted in a private folder is inert:
`RawBytesDisk` never unpickles, opens only value files of diskcache's own naming inside the folder, owned by this
user, and removes nothing else; a database whose schema or settings diskcache did not write is refused before
diskcache opens it (its settings become PRAGMAs and attributes, its triggers run with every write).
"""

from __future__ import annotations

import functools
import os
import re
import sqlite3
import stat
import tempfile
from typing import Any
from urllib.parse import quote

import diskcache
from diskcache.core import DBNAME, DEFAULT_SETTINGS, EVICTION_POLICY, METADATA, MODE_BINARY, MODE_RAW, UNKNOWN

from ..errors import CacheFolderError

VALUE_FILE = re.compile(r"[0-9a-f]{2}/[0-9a-f]{2}/[0-9a-f]{28}\.val")  # Disk.filename's names, and no other
JOURNAL_MODES = {"delete", "truncate", "persist", "memory", "wal", "off"}
SETTINGS = {**DEFAULT_SETTINGS, "eviction_policy": "least-recently-used"}  # every one given: none from the file


def check_private(folder: str) -> None:
    """Create the folder (mode 0700) if it is missing; CacheFolderError if anyone but this process's user could
    write it, or put something in its place: it is not a folder of ours, not ours, writable by group or others,
    a link, or under a folder someone else may rename things in (writable by others without the sticky bit)."""
    if not os.path.lexists(folder):
        os.makedirs(os.path.dirname(os.path.abspath(folder)), exist_ok=True)
        try:
            os.mkdir(folder, 0o700)
        except FileExistsError:
            pass  # another process made it: checked below like any other
    problem = _not_private(folder)
    if problem:
        raise CacheFolderError(
            f"the disk cache folder is not private to this user ({problem}): another user could plant blocks in "
            f"it. Name a folder only you can write (atlas_remote makes it, mode 0700), or, if nobody else ever "
            f"could, make this one yours alone (chown it to you, chmod 700)",
            path=folder,
        )


def _not_private(folder: str) -> str:
    me = os.geteuid()  # root too: a folder another user owns is theirs to fill, whoever reads it
    st = os.lstat(folder)
    if stat.S_ISLNK(st.st_mode):
        return "it is a symbolic link"
    if not stat.S_ISDIR(st.st_mode):
        return "it is not a folder"
    for name in (DBNAME, f"{DBNAME}-wal", f"{DBNAME}-shm", ""):
        path = os.path.join(folder, name) if name else folder
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            continue
        what = name or "it"
        if stat.S_ISLNK(st.st_mode):
            return f"{what} is a symbolic link"
        if st.st_uid != me:
            return f"{what} belongs to user {st.st_uid}, not to user {me}"
        if st.st_mode & 0o022:
            return f"group or others may write {what} (mode {stat.S_IMODE(st.st_mode):o})"
    absolute = os.path.abspath(folder)
    above = {os.path.dirname(p) for p in (absolute, os.path.realpath(absolute))}
    for start in sorted(above):
        path = start
        while True:
            st = os.stat(path)
            if st.st_uid not in (0, me):
                return f"{path}, above it, belongs to user {st.st_uid}"
            if st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX:
                return f"group or others may rename what is in {path}, above it (mode {stat.S_IMODE(st.st_mode):o})"
            if path == os.path.dirname(path):
                break
            path = os.path.dirname(path)
    return ""


def check_database(folder: str) -> None:
    """CacheFolderError if the folder's cache.db holds tables, indexes, triggers or views diskcache does not make,
    or settings it does not know or of the wrong kind, read before diskcache opens it (which runs its settings
    as PRAGMAs, sets them as attributes, and fires its triggers on every write)."""
    path = os.path.join(folder, DBNAME)
    if not os.path.exists(path):
        return
    try:
        con = sqlite3.connect(f"file:{quote(path)}?mode=ro", uri=True, timeout=60)
        try:
            schema = set(con.execute("SELECT type, name, tbl_name, sql FROM sqlite_master").fetchall())
            foreign = schema - _diskcache_schema()
            settings = [] if foreign else con.execute("SELECT key, value FROM Settings").fetchall()
        finally:
            con.close()
    except sqlite3.Error as err:
        problem = f"it cannot be read as SQLite ({err})"
    else:
        odd = sorted(f"{kind} {name}" for kind, name, _, _ in foreign) + [
            f"setting {key!r}" for key, value in settings if not _known_setting(key, value)
        ]
        problem = f"it holds what diskcache never writes: {', '.join(odd[:5])}" if odd else ""
    if problem:
        raise CacheFolderError(
            f"{DBNAME} of the disk cache was not made by diskcache ({problem}); delete the folder (it is only a "
            f"cache) or name another disk_cache",
            path=folder,
        )


def _known_setting(key: Any, value: Any) -> bool:
    if key in METADATA:
        return type(value) is int
    if key not in DEFAULT_SETTINGS:
        return False
    if key == "eviction_policy":
        return value in EVICTION_POLICY
    if key == "sqlite_journal_mode":
        return isinstance(value, str) and value.lower() in JOURNAL_MODES
    return type(value) in (int, float)


@functools.cache
def _diskcache_schema() -> frozenset:
    """What diskcache (the version installed) makes in a new cache with our settings: every table, index and
    trigger, with its SQL (made without a journal or syncs, which the schema does not depend on: 25 ms, not 60)."""
    with tempfile.TemporaryDirectory(prefix="atlas-cache-schema-") as folder:
        quick = {"sqlite_journal_mode": "memory", "sqlite_synchronous": 0}
        diskcache.Cache(folder, disk=RawBytesDisk, **{**SETTINGS, **quick}).close()
        con = sqlite3.connect(os.path.join(folder, DBNAME))
        try:
            return frozenset(con.execute("SELECT type, name, tbl_name, sql FROM sqlite_master").fetchall())
        finally:
            con.close()


class RawBytesDisk(diskcache.Disk):
    """diskcache's serialisation for keys of text and values of bytes only. What it reads back is raw bytes (a
    row of another mode is a miss, never unpickled) or an open value file, one of diskcache's own naming inside
    the folder, a regular file owned by this user that no one else may write; it removes only such names."""

    def __init__(self, directory: str, min_file_size: int = 0, pickle_protocol: int = 0, **_: Any) -> None:
        super().__init__(directory, min_file_size, pickle_protocol)
        self.folder = directory  # its own: diskcache sets a Disk's attributes from settings named disk_*

    def put(self, key: Any) -> tuple[Any, bool]:
        if type(key) is not str:
            raise TypeError("keys of the block cache are text")
        return key, True

    def get(self, key: Any, raw: bool) -> Any:
        if not raw or type(key) is not str:
            raise ValueError("not a key of the block cache")
        return key

    def store(self, value: Any, read: bool, key: Any = UNKNOWN) -> tuple[int, int, str | None, Any]:
        if type(value) is not bytes:
            raise TypeError("values of the block cache are bytes")
        if len(value) < self.min_file_size:
            return 0, MODE_RAW, None, sqlite3.Binary(value)
        name = self.filename()[0]
        path = os.path.join(self.folder, name)
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(value)
        return len(value), MODE_BINARY, name, None

    def fetch(self, mode: int, filename: Any, value: Any, read: bool) -> Any:
        """Raw bytes, or an open value file (read=True) or its bytes; OSError otherwise, which diskcache takes
        for a miss."""
        if mode == MODE_RAW and type(value) is bytes:
            return value
        if mode == MODE_BINARY and self._ours(filename):
            fd = os.open(os.path.join(self.folder, filename), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
            st = os.fstat(fd)
            if stat.S_ISREG(st.st_mode) and st.st_uid == os.geteuid() and not st.st_mode & 0o022:
                f = os.fdopen(fd, "rb")
                if read:
                    return f
                with f:
                    return f.read()
            os.close(fd)
        raise OSError("not a value the block cache wrote")

    def remove(self, file_path: Any) -> None:
        if not self._ours(file_path):
            return  # a planted row's name: nothing of ours to remove
        path = os.path.join(self.folder, file_path)
        try:
            os.unlink(path)
            os.rmdir(os.path.dirname(path))
            os.rmdir(os.path.dirname(os.path.dirname(path)))
        except OSError:
            pass  # gone already, or the folders still hold values

    @staticmethod
    def _ours(name: Any) -> bool:
        return isinstance(name, str) and VALUE_FILE.fullmatch(name.replace(os.sep, "/")) is not None
