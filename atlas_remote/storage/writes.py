"""What a `Store` writes (uncounted: its counters describe reading): conditional creates, replaces and deletes
(the lease), objects, uploads and streams, server-side copies, the promotion of staged files, removal."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Protocol, TypeVar

from ..errors import AtlasError, ObjectNotFoundError
from .base import Backend, LocalFiles, ObjectIdentity
from .errors import translated

T = TypeVar("T")


class Host(Protocol):
    """What the writes use of their Store."""

    url: str

    @property
    def backend(self) -> Backend: ...

    def path(self, rel: str = "") -> str: ...

    def url_of(self, rel: str = "") -> str: ...

    def identity(self, rel: str) -> ObjectIdentity: ...

    def read(self, rel: str, kind: str) -> bytes: ...

    def _retrying(self, action: str, rel: str, call: Callable[[], T]) -> T: ...


class Writes:
    """Store's writes, each one request through the retry loop (a stream excepted: it cannot be replayed)."""

    def create(self: Host, rel: str, data: bytes) -> bool:
        """Write the object only if it does not exist yet; False if it does. Atomic where `atomic_create` says
        so (S3 If-None-Match: *, GCS ifGenerationMatch=0, O_EXCL locally); elsewhere a check, then a write."""
        return self._retrying("creating", rel, lambda: self.backend.put_if_absent(self.path(rel), data))

    def read_versioned(self: Host, rel: str, kind: str) -> tuple[bytes, str]:
        """A small object and the version it was read at (its version first, then its bytes: if it changes
        between the two, a conditional request naming that version fails, as it should)."""
        version = self.identity(rel).version
        return self.read(rel, kind), version

    def replace(self: Host, rel: str, data: bytes, version: str) -> bool:
        """Replace the object only if it is still at this version; False if it is not. Atomic where
        `capabilities.conditional` says so (If-Match, ifGenerationMatch, a folder lock locally)."""
        return self._retrying("replacing", rel, lambda: self.backend.put_if_version(self.path(rel), data, version))

    def remove_if(self: Host, rel: str, version: str) -> bool:
        """Delete the object only if it is still at this version; False if it is not (or is gone)."""
        return self._retrying("deleting", rel, lambda: self.backend.delete_if_version(self.path(rel), version))

    def write(self: Host, rel: str, data: bytes) -> None:
        self._retrying("writing", rel, lambda: self.backend.put(self.path(rel), data))

    def upload(self: Host, local_path: str, rel: str) -> None:
        self._retrying("uploading to", rel, lambda: self.backend.put_file(local_path, self.path(rel)))

    def write_stream(self: Host, rel: str, chunks: Iterable[bytes | memoryview]) -> int:
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

    def copy_from(self: Host, source: Host, rel: str, dest_rel: str) -> None:
        """A server-side copy of source's object rel to dest_rel here (see same_namespace); a local file that is a
        link out of its own store's folder is refused."""
        src = source.path(rel)
        local = source.backend
        if isinstance(local, LocalFiles):
            src = source._retrying("reading", rel, lambda: local.regular_file(src))
        self._retrying(f"copying {src} to", dest_rel, lambda: self.backend.copy(src, self.path(dest_rel)))

    def promote(self: Host, src: str, dst: str) -> None:
        """Put a staged object at its final name: a rename on a local disk, a server-side copy on object
        stores (the caller deletes the staging folder in bulk afterwards; no data passes through us)."""
        self._retrying(
            f"copying to {self.url_of(dst)} from", src, lambda: self.backend.promote(self.path(src), self.path(dst))
        )

    def remove(self: Host, rel: str) -> None:
        """Delete an object or a whole folder; a missing one is not an error."""
        try:
            self._retrying("deleting", rel, lambda: self.backend.delete(self.path(rel)))
        except ObjectNotFoundError:
            pass
