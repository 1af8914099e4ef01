"""Committing staged shards so that a URL always serves one whole dataset, whatever fails or is killed.

Staged shards wait in `URL/.atlas-staging/<token>/`. A commit first writes the journal
`.atlas-staging/<token>/commit.json`, naming every file of the new dataset and the new root meta.json: before
that, nothing at the URL has changed (the old dataset, if any, is served as it was). From then on the commit
only rolls forward, and every step can be run again:

1. delete the old root meta.json (readers now see no dataset, never a mix of two);
2. delete the old dataset's Atlas files that the new one does not overwrite (never anything else);
3. put each staged file at its final name (a rename locally, a server-side copy on object stores);
4. write the new root meta.json (the dataset exists again, the new one, whole);
5. delete the journal, then the rest of the staging folder.

A commit that fails or is killed after step 0 is finished by `recover(url)` (`atlas-remote recover URL`),
which every new writer at the URL runs first. Staging without a journal is a writer that never committed:
recover deletes it.

Whoever rolls forward holds the URL's lease and fences every step with it (lease.py): a writer paused past its
lease wakes, finds the lease taken, and stops. A journal is data like any other in someone's bucket: every
name in it is checked against the format before any of it is acted on.
"""

from __future__ import annotations

import json
import logging
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..errors import (
    AtlasError,
    CommitInterruptedError,
    DatasetExistsError,
    DatasetLockedError,
    FormatError,
    ObjectNotFoundError,
)
from ..format.manifest import MANIFEST
from ..format.names import JOURNAL, LEASE, SHARD_FILES, STAGING, is_atlas_file, pending_journals, refuse_links_out
from ..format.spec import DICT_FILE, ROOT_META, parse_shard_name, shard_name
from ..storage import Store
from .lease import DEFAULT_LEASE_SECONDS, Lease

log = logging.getLogger(__name__)

SAFE_NAME = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9_.-]{0,127}")  # a staging token, a part's folder: never "..", no "/"

Fence = Callable[[], None]


def step_done(name: str) -> None:
    """A named step of a write, after which a crash must leave the URL recoverable: does nothing. The crash tests
    kill or stop their writer here from the test side (tests/crash_hooks/sitecustomize.py)."""


@dataclass(frozen=True)
class CommitPlan:
    """Everything a commit needs, written to the journal before anything at the URL changes."""

    token: str  # the staging folder's name
    shard_files: list[list[str]]  # file names of each shard, by final shard number ([] for a missing shard)
    shared_dict: bool
    root_meta: bytes
    # where each shard's files are staged, relative to the staging folder (default: its number)
    shard_folders: list[str] | None = None
    manifest: bool = False  # the dataset's manifest is staged beside its shards

    @property
    def staging(self) -> str:
        return f"{STAGING}/{self.token}"

    def final_files(self) -> dict[str, str]:
        """{final path: staged path} of every file of the new dataset."""
        count = len(self.shard_files)
        folders = self.shard_folders or [str(n) for n in range(count)]
        files = {
            f"{shard_name(n, count)}/{name}": f"{self.staging}/{folders[n]}/{name}"
            for n, names in enumerate(self.shard_files)
            for name in names
        }
        if self.shared_dict:
            files[DICT_FILE] = f"{self.staging}/{DICT_FILE}"
        if self.manifest:
            files[MANIFEST] = f"{self.staging}/{MANIFEST}"
        return files

    def to_json(self) -> bytes:
        return json.dumps(
            {
                "token": self.token,
                "shard_files": self.shard_files,
                "shared_dict": self.shared_dict,
                "root_meta": self.root_meta.decode(),
                "shard_folders": self.shard_folders,
                "manifest": self.manifest,
            }
        ).encode()

    @classmethod
    def from_json(cls, raw: bytes, where: str, token: str) -> CommitPlan:
        """The journal found in staging folder `token`, refused unless every name in it is one the format makes."""
        try:
            record: dict[str, Any] = json.loads(raw)
            plan = cls(
                record["token"],
                record["shard_files"],
                record["shared_dict"],
                record["root_meta"].encode(),
                record.get("shard_folders"),
                bool(record.get("manifest", False)),
            )
        except (ValueError, KeyError, TypeError, AttributeError, RecursionError) as err:
            raise FormatError(f"unreadable commit journal ({err}); nothing was done", url=where) from err
        problem = plan.problem(token)
        if problem:
            raise FormatError(
                f"refusing the commit journal in {STAGING}/{token}: {problem}; it was not written by this library "
                f"(nothing was done: delete {STAGING} by hand once you have looked at it)",
                url=where,
            )
        return plan

    def problem(self, token: str) -> str | None:
        """What makes this journal one a writer never wrote, or None."""
        if self.token != token or not SAFE_NAME.fullmatch(token):
            return f"its token {self.token!r} is not its folder's name"
        if not isinstance(self.shard_files, list) or not all(isinstance(names, list) for names in self.shard_files):
            return "shard_files is not a list of lists"
        for names in self.shard_files:
            bad = [name for name in names if name not in SHARD_FILES]
            if bad:
                return f"{bad[0]!r} is not a shard file of the format"
        folders = self.shard_folders
        if folders is not None:
            if not isinstance(folders, list) or len(folders) != len(self.shard_files):
                return "shard_folders does not name one folder per shard"
            for folder in folders:
                if not isinstance(folder, str) or not all(SAFE_NAME.fullmatch(p) for p in folder.split("/")):
                    return f"shard folder {folder!r} is not a folder inside the staging folder"
        try:
            meta = json.loads(self.root_meta)
        except (ValueError, RecursionError):
            return "its root meta.json is not JSON"
        if not isinstance(meta, dict) or not isinstance(meta.get("shard_sizes"), list):
            return "its root meta.json has no shard_sizes"
        if len(meta["shard_sizes"]) != len(self.shard_files):
            return "its root meta.json and its shard list disagree"
        return None


def commit(store: Store, plan: CommitPlan, fence: Fence) -> None:
    """Write the journal (the point of no return), then roll forward. Once the journal is written, a failure
    is raised as it is; the caller reports that recover() finishes the commit."""
    fence()
    store.write(f"{plan.staging}/{JOURNAL}", plan.to_json())
    step_done("journal-written")
    roll_forward(store, plan, fence)


def roll_forward(store: Store, plan: CommitPlan, fence: Fence) -> None:
    """Bring the URL to the dataset the journal describes; safe to run again after any failure.

    It never asks which steps a killed run got through (an old and a new root meta.json can be byte-identical):
    with a journal present it does every step again. The journal is deleted before the rest of the staging
    folder, so a journal always comes with every staged file it names (or, locally, the file already moved).
    Every step is fenced: a caller whose lease was taken stops before it. Locally, nothing is done if any path
    it would touch leads out of the dataset's folder (layout.refuse_links_out).
    """
    final = plan.final_files()
    if store.is_local:
        staged_folders = {rel.rsplit("/", 1)[0] for rel in final.values()}
        present = [rel for rel in store.find() if is_atlas_file(rel) or parse_shard_name(rel.split("/")[0]) is not None]
        refuse_links_out(store, [plan.staging, *sorted(staged_folders), *final.values(), *final, *present])
    fence()
    store.remove(ROOT_META)
    step_done("old-meta-removed")
    for rel in store.find():
        if is_atlas_file(rel) and rel not in final:
            fence()
            store.remove(rel)
    if store.is_local:  # object stores have no folders; a local empty one would look like a shard
        new_names = {rel.split("/")[0] for rel in final}
        for name in store.list_names():
            if parse_shard_name(name) is not None and name not in new_names:
                try:
                    os.rmdir(store.path(name))
                except OSError:
                    pass  # not empty: it holds someone's files, which are never deleted
    step_done("old-files-removed")
    for number, rel in enumerate(sorted(final, key=lambda r: (r == DICT_FILE, r))):
        fence()
        _promote(store, final[rel], rel)
        if number == 0:
            step_done("first-file-placed")
    step_done("files-placed")
    fence()
    store.write(ROOT_META, plan.root_meta)
    step_done("meta-written")
    fence()
    store.remove(f"{plan.staging}/{JOURNAL}")
    step_done("journal-removed")
    fence()
    store.remove(STAGING)
    step_done("staging-removed")


def _promote(store: Store, staged: str, final: str) -> None:
    """A rename locally (a staged file already moved is found at its final name), a copy on object stores."""
    if store.is_local and not store.exists(staged):
        if not store.exists(final):
            raise FormatError(f"the commit journal names {staged}, which is neither staged nor in place", url=store.url)
        return
    store.promote(staged, final)


def recover_locked(store: Store, lease: Lease) -> list[str]:
    """Finish an interrupted commit, delete what writers that never committed staged. Needs the lease."""
    done = []
    if store.is_local and store.exists(STAGING):
        refuse_links_out(store, [STAGING, *(f"{STAGING}/{token}" for token in store.list_names(STAGING))])
    journals = pending_journals(store)
    if len(journals) > 1:
        raise FormatError(
            f"{len(journals)} commit journals in {STAGING} ({journals}); only one writer can commit "
            f"at a time, so this URL was written without its lease",
            url=store.url,
        )
    if journals:
        plan = CommitPlan.from_json(store.read(f"{STAGING}/{journals[0]}/{JOURNAL}", "meta"), store.url, journals[0])
        roll_forward(store, plan, lease.fence)
        done.append(
            f"finished an interrupted commit ({sum(map(len, plan.shard_files))} files in "
            f"{len(plan.shard_files)} shards)"
        )
    elif store.exists(STAGING):
        lease.fence()
        store.remove(STAGING)
        done.append("deleted the staged files of a writer that never committed")
    if not store.exists(ROOT_META):  # no dataset: leftovers of writers of the original format, or older versions
        leftovers = [rel for rel in store.find() if is_atlas_file(rel)]
        refuse_links_out(store, leftovers)
        for rel in leftovers:
            lease.fence()
            store.remove(rel)
        if leftovers:
            done.append(f"deleted {len(leftovers)} Atlas files of an uncommitted dataset")
    return done


def take_lease(store: Store, purpose: str, lease_seconds: float = DEFAULT_LEASE_SECONDS) -> Lease:
    try:
        return Lease(store, purpose, lease_seconds).acquire()
    except ObjectNotFoundError:
        store.check_bucket()  # a missing bucket is named as such
        raise


def commit_and_release(store: Store, plan: CommitPlan, lease: Lease) -> None:
    """Commit, then give the lease back. A failure after the point of no return is CommitInterruptedError."""
    try:
        commit(store, plan, lease.fence)
    except DatasetLockedError:
        raise  # fenced: this writer stopped; whoever took its lease finished or replaced its commit
    except AtlasError as err:
        raise CommitInterruptedError(
            f"the commit failed after its point of no return ({err}); run `atlas-remote recover {store.url}` (the "
            f"next writer here does it by itself) to finish it: the URL then serves the new dataset",
            url=store.url,
        ) from err
    finally:
        lease.release()


def refuse_unless_writable(store: Store, overwrite: bool) -> None:
    """The checks that can refuse a writer, all made before anything at the URL is deleted."""
    if store.exists(ROOT_META):
        if not overwrite:
            raise DatasetExistsError(
                "already holds a committed Atlas dataset; pass overwrite=True (--overwrite) to replace it "
                "(the old one stays readable until the new one is committed)",
                url=store.url,
            )
        return
    try:
        others = [
            rel for rel in store.find() if not (is_atlas_file(rel) or rel == LEASE or rel.startswith(f"{STAGING}/"))
        ]
    except ObjectNotFoundError:
        return
    if others:
        raise DatasetExistsError(
            f"is not empty and does not hold an Atlas dataset ({others[0]!r} is there); write to an empty location",
            url=store.url,
        )


@dataclass
class RecoverReport:
    url: str
    actions: list[str]

    def __str__(self) -> str:
        return f"{self.url}: " + ("; ".join(self.actions) if self.actions else "nothing to recover")


def recover(url: str, storage_options: dict[str, Any] | None = None, *, force: bool = False) -> RecoverReport:
    """Leave the URL serving one whole dataset (or none) and no staging: finish an interrupted commit, delete
    staged files of writers that died, clear a stale lease. With force=True a live lease is broken too (only
    when you know its writer is dead: a live writer would lose its work)."""
    store = Store(url, storage_options)
    actions = []
    if force and store.exists(LEASE):
        store.remove(LEASE)
        actions.append("broke the writer's lease (force)")
    lease = take_lease(store, "atlas-remote recover")
    if lease.took_over is not None:
        actions.append(f"cleared the stale lease of {lease.took_over.holder}, since {lease.took_over.started}")
    try:
        actions += recover_locked(store, lease)
    finally:
        lease.release()
    for action in actions:
        log.info("%s: %s", url, action)
    return RecoverReport(url, actions)
