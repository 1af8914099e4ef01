"""The backend protocol: the few operations `Store` asks of a storage client, what a client can do, and what
identifies an object's version. Backends are siblings (fsspec's filesystems, S3, GCS, Azure, local disk, obstore);
everything that holds for every store (names, counters, retries, body checks) lives in `Store`, above them.

Paths here are the client's own (`bucket/key` on object stores, absolute paths locally); bodies and failures of
a batch come back in order, a failure as the exception the client raised, for `Store` to translate and retry.

A version is the string a conditional request names an object's version by: the ETag on S3, Azure and HTTP, the
generation on GCS, the inode and modification time on a local disk. A read given a version fails with
`ObjectChanged` rather than return another version's bytes; a conditional write or delete returns False.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import IO, Any, Protocol, runtime_checkable

import numpy as np


class ObjectChanged(Exception):
    """A conditional request found the object at another version than the one it named (HTTP 412)."""


class ServerAnswer(OSError):
    """A server's error answer as a backend read it, for clients whose own exceptions lose it (gcsfs keeps no
    status for a 403; obstore keeps it only in its text): the HTTP status and the store's own error code
    (`rateLimitExceeded`, `SlowDown`). `storage.errors` classifies failures from these, never from words."""

    def __init__(self, status: int, code: str = "", text: str = "") -> None:
        super().__init__(f"HTTP {status}" + (f" {code}" if code else "") + (f": {text}" if text else ""))
        self.status, self.code = status, code


class Unreachable(ConnectionError):
    """No connection to the server could be made (for clients whose own exceptions do not say so by type)."""


class Oversized(Exception):
    """A body longer than the read accepts, refused before the rest was read: a whole object past its bound, or a
    ranged read answered with more than the range. `declared`: the length the server announced, if it did."""

    def __init__(self, declared: int | None = None) -> None:
        super().__init__(f"the server announced {declared} bytes" if declared is not None else "a longer body")
        self.declared = declared


@dataclass(frozen=True)
class Capabilities:
    """What a backend can do, decided when it is made."""

    local: bool  # a local disk: blocks are read with pread on files kept open
    remote: bool  # requests cross a network: only then are they retried, and read ahead of need
    can_list: bool  # folders can be listed (a static web server has no listing)
    atomic_create: bool  # put_if_absent is atomic on the server (a conditional create), or O_EXCL locally
    batched: bool  # several reads go in flight together
    conditional: bool = False  # reads, writes and deletes can be made conditional on a version


@dataclass(frozen=True)
class ObjectIdentity:
    """What changes when an object is rewritten: its size and its version (see the module)."""

    url: str
    size: int
    version: str
    modified: str = field(default="", compare=False)  # when last written, as the store says (to the second on S3)


# Fields of an object's info that name its version, most specific first; a backend whose conditional requests
# take another field says so in `version_of`.
VERSION_FIELDS = (
    "generation",
    "ETag",
    "etag",
    "VersionId",
    "md5Hash",
    "mtime",
    "LastModified",
    "Last-Modified",
    "created",
)


def version_of(info: dict[str, Any]) -> str:
    return str(next((info[k] for k in VERSION_FIELDS if info.get(k) is not None), ""))


def modified_of(info: dict[str, Any]) -> str:
    return str(next((info[k] for k in ("LastModified", "last_modified", "updated", "mtime") if info.get(k)), ""))


class Backend(Protocol):
    """One storage client over one URL's root."""

    client: str  # who reads, for `Store.read_client`: "fsspec", "local", "obstore", ...
    root: str  # the URL's root as this client names paths
    capabilities: Capabilities

    def get(
        self,
        paths: Sequence[str],
        starts: Sequence[int],
        ends: Sequence[int | None],
        in_flight: int,
        versions: Sequence[str | None] | None = None,
        limits: Sequence[int | None] | None = None,
    ) -> list:
        """Bodies (or the exceptions raised) of whole objects (end None, start 0) and byte ranges, in order; a read
        with a version fails with ObjectChanged if the object is at another version. No body is read past its
        limit + 1 bytes (a range's limit is its size; a whole object's is given in limits, None for none): a
        longer one is cut there, or refused with Oversized when the server announces it."""
        ...

    def info(self, path: str) -> dict[str, Any]:
        """Size and version fields of an object; `type` "directory" for a folder."""
        ...

    def version_of(self, info: dict[str, Any]) -> str:
        """The version an object's info names, as conditional requests take it."""
        ...

    def list_names(self, path: str) -> list[str]:
        """Names directly under a folder (one listing)."""
        ...

    def find(self, path: str) -> dict[str, dict[str, Any]]:
        """Every object below a folder, with its info (one recursive listing)."""
        ...

    def put(self, path: str, data: bytes) -> None: ...

    def put_if_absent(self, path: str, data: bytes) -> bool:
        """Write the object only if it does not exist; False if it does (atomic where capabilities say so)."""
        ...

    def put_if_version(self, path: str, data: bytes, version: str) -> bool:
        """Replace the object only if it is at this version; False if it is not (or is gone)."""
        ...

    def delete_if_version(self, path: str, version: str) -> bool:
        """Delete the object only if it is at this version; False if it is not (or is gone)."""
        ...

    def put_file(self, local_path: str, path: str) -> None: ...

    def open_write(self, path: str) -> IO[bytes]:
        """A file to stream one object into (a multipart upload on object stores)."""
        ...

    def open_read(self, path: str, compression: str | None = None) -> IO[bytes]:
        """A file to stream one object from (importers), decompressed as `compression` says ("infer": by name)."""
        ...

    def glob(self, pattern: str) -> list[str]: ...

    def copy(self, src: str, dst: str) -> None:
        """A server-side copy within this client's namespace."""
        ...

    def promote(self, src: str, dst: str) -> None:
        """Put a staged object at its final name: a rename where that is atomic and cheap, else a copy."""
        ...

    def delete(self, path: str) -> None:
        """Delete an object or a whole folder."""
        ...

    def namespace(self) -> object:
        """Two backends with the same namespace can copy objects between them server-side."""
        ...


# Optional protocols: what some backends can do beyond `Backend`. `Store` asks `isinstance(backend, Protocol)`,
# never which class a backend is.


@runtime_checkable
class LocalFiles(Protocol):
    """A backend on a local disk: ranged reads with pread on files kept open, arrays memory-mapped, links checked."""

    def pread(self, path: str, start: int, end: int, version: str | None = None) -> bytes: ...

    def map_file(self, path: str) -> np.ndarray:
        """The file's bytes memory-mapped (uint8, read-only)."""
        ...

    def regular_file(self, path: str) -> str:
        """The path, refused if it is a link out of the root or not a regular file."""
        ...


@runtime_checkable
class CountsRedirects(Protocol):
    """A backend that follows redirects within the origin and tells `Store` how many (requests like any other)."""

    on_redirects: Callable[[int], None] | None


@runtime_checkable
class InspectsBuckets(Protocol):
    """A backend whose `info` cannot look at a bucket itself (obstore's store is bound to one) but can say so."""

    def bucket_info(self, bucket: str) -> dict[str, Any]: ...


@runtime_checkable
class Closes(Protocol):
    """A backend holding threads or clients of its own, released by `close()` (idempotent)."""

    def close(self) -> None: ...
