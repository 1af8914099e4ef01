"""One writer per URL: a lease object created with a conditional create, renewed while the writer lives.

The lease is the file `URL/.atlas-lease` (a file, so the original reader, which takes every folder for a
shard, never sees it). It is created only if absent: S3 `If-None-Match: *`, GCS `ifGenerationMatch=0`, Azure
`If-None-Match: *`, `O_EXCL` locally. Its holder renews it every `ttl / 4` seconds; a lease not renewed for `ttl`
seconds, or held by a process of this machine that no longer exists, is stale and may be taken over.

Every change to an existing lease is conditional on the version its actor read (If-Match on S3 and Azure,
ifGenerationMatch on GCS, a folder lock locally): a renewal, a takeover or a release that finds the lease changed
since does nothing. So of two actors taking over one stale lease only one gets it, and a writer frozen between
reading its lease and renewing it cannot write over the lease someone took meanwhile. Each takeover raises the
lease's generation (the fencing token), which the messages name.

The lease's token is the fence: before every step that deletes or places a file, a writer calls `fence()`, which
reads the lease back unless this process renewed it less than `ttl / 2` ago (nobody can take over a lease
younger than `ttl`, clocks allowing). A writer frozen past its lease (SIGSTOP, a VM pause, a long GC) therefore
finds on waking that its lease was taken, and stops before touching anything. What no object store lets us close
is the gap between that read and the next request (S3 cannot make a delete conditional on another object):
a pause of more than `ttl / 2` inside that gap, microseconds wide, is the one case left (docs/security.md).
"""

from __future__ import annotations

import json
import logging
import math
import os
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, replace
from datetime import datetime, timezone

from ..errors import AtlasError, DatasetLockedError, ObjectNotFoundError
from ..format.names import LEASE
from ..storage import Store

log = logging.getLogger(__name__)

DEFAULT_LEASE_SECONDS = 600.0


@dataclass(frozen=True)
class LeaseRecord:
    token: str
    host: str
    pid: int
    purpose: str
    started: str  # ISO time, for people
    renewed: float  # epoch seconds, for expiry
    ttl: float
    generation: int = 1  # one more at every takeover: the fencing token's number

    @property
    def holder(self) -> str:
        return f"{self.purpose} (pid {self.pid} on {self.host})"

    def stale(self, now: float) -> bool:
        if now - self.renewed > self.ttl:
            return True
        if self.host == socket.gethostname():
            try:
                os.kill(self.pid, 0)
            except ProcessLookupError:
                return True  # its process is gone: it was killed
            except PermissionError:
                pass  # alive, another user's
        return False

    def to_json(self) -> bytes:
        return json.dumps(asdict(self), indent=1).encode()

    @classmethod
    def from_json(cls, raw: bytes) -> LeaseRecord | None:
        """The record, or None for anything a writer never wrote (treated as stale): the lease is a file in
        someone's bucket like any other."""
        try:
            record = cls(**json.loads(raw))
        except (ValueError, TypeError, RecursionError):  # not JSON, not these fields, nested 100,000 deep
            return None
        texts = (record.token, record.host, record.purpose, record.started)
        numbers = (record.renewed, record.ttl)
        if not all(type(t) is str for t in texts) or type(record.pid) is not int or not 0 < record.pid < 1 << 31:
            return None  # a pid os.kill cannot take, or that names a process group
        if not all(type(n) in (int, float) and math.isfinite(n) for n in numbers):
            return None
        if type(record.generation) is not int:
            return None
        return record


UNREADABLE = LeaseRecord("?", "?", 0, "unreadable lease", "?", 0.0, 0.0, 0)


def read_lease(store: Store) -> LeaseRecord | None:
    """The current lease, or None if there is none (one GET: a fence before each commit step needs no version)."""
    try:
        raw = store.read(LEASE, "meta")
    except ObjectNotFoundError:
        return None
    return LeaseRecord.from_json(raw) or UNREADABLE


def read_versioned_lease(store: Store) -> tuple[LeaseRecord, str] | None:
    """The current lease and the version it was read at (what a conditional change names), or None."""
    try:
        raw, version = store.read_versioned(LEASE, "meta")
    except ObjectNotFoundError:
        return None
    return LeaseRecord.from_json(raw) or UNREADABLE, version


class Lease:
    """This process's hold on a URL. `acquire` refuses a live holder; `release` gives the URL back."""

    def __init__(self, store: Store, purpose: str, ttl: float = DEFAULT_LEASE_SECONDS) -> None:
        self.store, self.ttl = store, ttl
        now = time.time()
        self.record = LeaseRecord(
            uuid.uuid4().hex,
            socket.gethostname(),
            os.getpid(),
            purpose,
            datetime.fromtimestamp(now, timezone.utc).isoformat(timespec="seconds"),
            now,
            ttl,
        )
        self.version = ""  # of the lease object as this process last wrote it
        self._stop = threading.Event()
        self._renewer: threading.Thread | None = None
        self.lost: str | None = None  # why the lease is no longer ours, if it is not
        self.took_over: LeaseRecord | None = None  # the stale lease this one replaced

    def acquire(self) -> Lease:
        """Create the lease object, or take over a stale one (a conditional replace: of several actors taking
        over one stale lease, one gets it); DatasetLockedError if a live writer holds it."""
        for _ in range(5):
            if self.store.create(LEASE, self.record.to_json()):
                if self._read_back():
                    break
                continue  # taken over the very moment it was made (impossible unless clocks are far off)
            found = read_versioned_lease(self.store)
            if found is None:
                continue  # released meanwhile: try to create it again
            current, version = found
            if current.token == self.record.token:  # our own create, retried after a lost answer
                self.version = version
                break
            if not current.stale(time.time()):
                raise DatasetLockedError(
                    f"another writer holds this URL: {current.holder}, since {current.started} (lease generation "
                    f"{current.generation})"
                    f"{'' if self.store.atomic_create else ' (this store cannot do conditional creates, so two writers starting at the same moment may both get through)'}"
                    f"; wait for it, or if it is dead run `atlas-remote recover URL` once its lease is "
                    f"{int(current.ttl)} s old",
                    holder=current.holder,
                    started=current.started,
                    url=self.store.url,
                )
            self.record = replace(self.record, generation=current.generation + 1)
            if self.store.replace(LEASE, self.record.to_json(), version) and self._read_back():
                self.took_over = current  # said once, by whoever took it (parts.StagedParts, commit.recover)
                break
        else:
            raise DatasetLockedError("could not take the lease: other writers keep taking it", url=self.store.url)
        self._renewer = threading.Thread(target=self._renew_until_stopped, daemon=True, name="atlas-lease")
        self._renewer.start()
        return self

    def _read_back(self) -> bool:
        """Whether the lease at the URL is the one this process just wrote, remembering its version."""
        found = read_versioned_lease(self.store)
        if found is None or found[0].token != self.record.token:
            return False
        self.version = found[1]
        return True

    def _renew_until_stopped(self) -> None:
        while not self._stop.wait(self.ttl / 4):
            try:
                renewed = replace(self.record, renewed=time.time())
                if not self.store.replace(LEASE, renewed.to_json(), self.version):
                    self.check()  # raises: someone else's lease is there now
                    raise DatasetLockedError("this writer's lease changed under it", url=self.store.url)
                self.record = renewed
                if not self._read_back():
                    self.check()
            except DatasetLockedError as err:
                self.lost = err.problem
                return
            except AtlasError as err:  # a passing failure: the next renewal may get through
                log.warning("%s: could not renew the writer's lease: %s", self.store.url, err)

    def fence(self) -> None:
        """Before a step that deletes or places a file: DatasetLockedError unless this lease is still ours."""
        if self.lost is not None:
            raise DatasetLockedError(self.lost, url=self.store.url)
        if time.time() - self.record.renewed < self.ttl / 2:
            return  # renewed so recently that nobody can have taken it over
        self.check()

    def check(self) -> None:
        """Raise DatasetLockedError unless the lease at the URL is still this one."""
        current = read_lease(self.store)
        if current is None or current.token != self.record.token:
            holder = "nobody" if current is None else current.holder
            raise DatasetLockedError(
                f"this writer's lease was taken over (it is now held by {holder}), because it was not renewed for "
                f"{int(self.ttl)} s (the process was paused or cut off); it stopped before changing anything more",
                holder=None if current is None else current.holder,
                started=None if current is None else current.started,
                url=self.store.url,
            )

    @contextmanager
    def released_on_failure(self) -> Iterator[Lease]:
        """Work done holding the lease: any exception gives the URL back (and is raised); success keeps it."""
        try:
            yield self
        except BaseException:
            self.release()
            raise

    def release(self) -> None:
        """Stop renewing and delete the lease object if it is still ours."""
        self._stop.set()
        if self._renewer is not None and self._renewer is not threading.current_thread():
            self._renewer.join()
        try:
            found = read_versioned_lease(self.store)
            if found is not None and found[0].token == self.record.token:
                self.store.remove_if(LEASE, found[1])
        except AtlasError as err:
            log.warning(
                "%s: could not release the writer's lease (%s); it expires in %d s", self.store.url, err, int(self.ttl)
            )
