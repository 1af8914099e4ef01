"""A local disk: blocks read with pread on files kept open, conditional creates with O_EXCL, staged files put in
place by rename, large indexes memory-mapped. Listings and deletes go through fsspec's local filesystem."""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..errors import FormatError
from ..format import npy_problem
from .base import Capabilities
from .fsspec_backend import FsspecBackend


class _OpenFiles(threading.local):
    """Files kept open per thread for ranged reads (pread needs no seek, so no lock), the least recently used
    closed beyond a bound. A file replaced by a rename keeps serving the version this thread opened."""

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


class LocalBackend(FsspecBackend):
    client = "local"

    def __init__(self, url: str, storage_options: dict[str, Any], timeout: float) -> None:
        super().__init__(url, storage_options, timeout)
        self.capabilities = Capabilities(local=True, remote=False, can_list=True, atomic_create=True, batched=False)
        self.open_files = _OpenFiles()

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "open_files": None}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state, open_files=_OpenFiles())

    def pread(self, path: str, start: int, end: int) -> bytes:
        return self.open_files.pread(path, start, end)

    def get(self, paths: Sequence[str], starts: Sequence[int], ends: Sequence[int | None], in_flight: int) -> list:
        bodies: list[Any] = []
        for p, s, e in zip(paths, starts, ends):
            try:
                if e is None:
                    with open(p, "rb") as f:
                        bodies.append(f.read())
                else:
                    bodies.append(self.open_files.pread(p, s, e))
            except Exception as err:
                bodies.append(err)
        return bodies

    def put_if_absent(self, path: str, data: bytes) -> bool:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            return False
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        return True

    def promote(self, src: str, dst: str) -> None:
        self.fs.mv(src, dst)

    def map_array(self, path: str) -> tuple[np.ndarray, int]:
        """A .npy file memory-mapped, not read, and its size."""
        try:
            array = np.load(path, mmap_mode="r", allow_pickle=False)
        except ValueError as err:
            raise FormatError(f"not a valid .npy array ({npy_problem(err)})", path=path) from err
        return array, os.path.getsize(path)
