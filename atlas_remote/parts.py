"""A dataset written as numbered parts by any number of processes or machines, committed once: what `convert`,
`build` and `write` (a local process pool, or Ray tasks) and Ray Data's datasink build on; and the pool that
writes the parts of one run."""

from __future__ import annotations

import itertools
import json
import multiprocessing
import os
import signal
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, replace
from typing import Any

from .codec import PicklePolicy, pickle_block, train_dictionary
from .commit import CommitPlan, commit_and_release, recover_locked, refuse_unless_writable, step_done, take_lease
from .errors import DatasetExistsError, ObjectNotFoundError, UnsafePickleError
from .format import DICT_FILE, MIN_BLOCKS_FOR_DICTIONARY, VERSION, AtlasDatasetMetadata, CompressionStrategy
from .layout import STAGING
from .lease import DEFAULT_LEASE_SECONDS
from .storage import Store
from .writer import PartManifest, PartWriter, ShardSettings, remove_staged, stage_manifest

PARTS_MANIFEST = "part.json"
JOB_FILE = "parts.json"
CHUNK = 4096  # examples handed to the writer at once (and counted for progress at once)
Progress = Callable[[int, int], None]  # (examples, bytes) done since the last call
PartTask = Callable[..., tuple[int, int]]  # (spec, unit, progress=None) -> (examples, bytes stored); picklable


@dataclass(frozen=True)
class PartSpec:
    """Everything a worker needs to write part `part` of a staged dataset: picklable, engine-independent."""

    url: str
    storage_options: dict[str, Any] | None
    token: str
    part: int
    settings: ShardSettings
    dictionary: bytes | None
    allowed_classes: tuple[str, ...] = ()  # what readers of the dataset will be told to allow

    @property
    def folder(self) -> str:
        return f"{STAGING}/{self.token}/parts/{self.part}"

    def write(
        self, examples: Iterable[Any], progress: Callable[[int], None] | None = None, source: str | None = None
    ) -> PartManifest:
        """Write the examples as this part's shards and its manifest (last: a part with a manifest is done).

        Before anything is written, the first block is read back as a reader would read it (the restricted
        unpickler, with `allowed_classes`): a value such a reader would refuse fails the part at once, naming
        `source` (what the examples come from) and the example, rather than a dataset that does not open.
        """
        store = Store(self.url, self.storage_options)
        writer = PartWriter(
            store, f"{STAGING}/{self.token}", f"parts/{self.part}/", self.settings, self.dictionary, source
        )
        examples = iter(examples)
        try:
            first = list(itertools.islice(examples, self.settings.block_size))
            refuse_unreadable(first, PicklePolicy(self.allowed_classes), source or self.url)
            chunk = first
            while chunk:
                writer.add_examples(chunk)
                if progress:
                    progress(len(chunk))
                chunk = list(itertools.islice(examples, CHUNK))
            manifest = writer.close(keep_empty=False)
        except BaseException:
            writer.abandon()
            raise
        store.write(f"{self.folder}/{PARTS_MANIFEST}", manifest.to_json())
        step_done(f"part-{self.part}-staged")
        return manifest


def refuse_unreadable(examples: list, policy: PicklePolicy, source: str) -> None:
    """UnsafePickleError naming the first example (numbered from 0) a reader with `policy` would refuse."""
    try:
        pickled = pickle_block(examples)
    except Exception:
        return  # what cannot be pickled at all, the writer names
    try:
        policy.loads(pickled)
        return
    except UnsafePickleError as err:
        number, refusal = 0, err
    for position, example in enumerate(examples):
        try:
            policy.loads(pickle_block([example]))
        except UnsafePickleError as err:
            number, refusal = position, err
            break
    raise UnsafePickleError(
        f"example {number} holds a value that readers with default settings refuse ({refusal.problem}); make it "
        f"plain data (a map function can), or give allowed_classes here and to the readers; nothing was committed",
        url=source,
    ) from refusal


class StagedParts:
    """A dataset written as numbered parts by any number of processes or machines, then committed once.

    The coordinator takes the URL's lease and picks the staging folder; `spec(n)` tells a worker how to write
    part n (PartSpec.write); `commit(parts)` numbers the shards of parts 0..parts-1 in that order and commits
    them as the writer commits (root meta.json last). `job` describes the work (inputs, options): with
    resume=True an earlier, interrupted run with the same job and settings is continued, and `done()` lists
    the parts it finished. For SHARED_DICTIONARY_COMPRESSION every part compresses with one dictionary, given
    here (train it on the dataset's first shard, as the spec says); None makes the dataset fall back to
    STANDARD_COMPRESSION.
    """

    def __init__(
        self,
        url: str,
        settings: ShardSettings,
        storage_options: dict[str, Any] | None = None,
        *,
        job: dict[str, Any] | None = None,
        dictionary: bytes | None = None,
        overwrite: bool = False,
        resume: bool = False,
        lease_seconds: float = DEFAULT_LEASE_SECONDS,
    ) -> None:
        if settings.compression_strategy == CompressionStrategy.SHARED_DICTIONARY_COMPRESSION and dictionary is None:
            settings = replace(settings, compression_strategy=CompressionStrategy.STANDARD_COMPRESSION)
        self.url, self.storage_options, self.settings, self.overwrite = str(url), storage_options, settings, overwrite
        self.store = Store(self.url, storage_options)
        self.store.require_writable()
        self.lease = take_lease(self.store, "atlas-remote convert", lease_seconds)
        with self.lease.released_on_failure():
            record = {
                "job": job or {},
                "settings": {**asdict(settings), "compression_strategy": int(settings.compression_strategy)},
                "dictionary": dictionary is not None,
            }
            self.token = self._resumable(record) if resume else None
            if self.token is None:
                recover_locked(self.store, self.lease)
                refuse_unless_writable(self.store, overwrite)
                self.token = uuid.uuid4().hex[:12]
                if dictionary is not None:
                    self.store.write(f"{STAGING}/{self.token}/{DICT_FILE}", dictionary)
                self.store.write(f"{STAGING}/{self.token}/{JOB_FILE}", json.dumps(record).encode())
            else:
                refuse_unless_writable(self.store, overwrite)
                if dictionary is not None:
                    dictionary = self.store.read(f"{STAGING}/{self.token}/{DICT_FILE}", "dict")
        self.dictionary = dictionary

    def _resumable(self, record: dict[str, Any]) -> str | None:
        """The staging folder of an interrupted run of the same job, if there is one."""
        try:
            tokens = self.store.list_names(STAGING)
        except ObjectNotFoundError:
            return None
        for token in tokens:
            try:
                staged = json.loads(self.store.read(f"{STAGING}/{token}/{JOB_FILE}", "meta"))
            except ObjectNotFoundError:
                continue
            if staged == json.loads(json.dumps(record)):
                return token
            raise DatasetExistsError(
                f"the staged run in {STAGING}/{token} was started with other inputs or settings; "
                f"run without resume (it is then discarded)",
                url=self.url,
            )
        return None

    @property
    def staging(self) -> str:
        return f"{STAGING}/{self.token}"

    def spec(self, part: int, allowed_classes: tuple[str, ...] = ()) -> PartSpec:
        return PartSpec(
            self.url, self.storage_options, str(self.token), part, self.settings, self.dictionary, allowed_classes
        )

    def done(self) -> set[int]:
        """The parts whose manifest is staged."""
        found = self.store.find(f"{STAGING}/{self.token}/parts")
        prefix = f"{STAGING}/{self.token}/parts/"
        return {int(rel[len(prefix) :].split("/")[0]) for rel in found if rel.endswith(f"/{PARTS_MANIFEST}")}

    def commit(self, parts: int) -> AtlasDatasetMetadata:
        """Commit parts 0..parts-1, their shards numbered in part order. Releases the lease."""
        with self.lease.released_on_failure():
            self.lease.check()
            refuse_unless_writable(self.store, self.overwrite)
            manifests = [
                PartManifest.from_json(self.store.read(f"{self.staging}/parts/{n}/{PARTS_MANIFEST}", "meta"), self.url)
                for n in range(parts)
            ]
            if not any(m.shard_files for m in manifests):  # nothing at all: the original's empty dataset, one shard
                manifests = [PartWriter(self.store, self.staging, "parts/empty/", self.settings).close()]
                folders = ["parts/empty/0"]
            else:
                folders = [f"parts/{n}/{k}" for n, m in enumerate(manifests) for k in range(len(m.shard_sizes))]
            sizes = [size for m in manifests for size in m.shard_sizes]
            files = [names for m in manifests for names in m.shard_files]
            meta = AtlasDatasetMetadata(VERSION, sizes, self.settings.compression_strategy)
            has_manifest = all(m.shards is not None for m in manifests)  # checksums=False: the original's files
            rows = [row for m in manifests for row in m.shards or []]
            if has_manifest:
                stage_manifest(self.store, self.staging, meta, rows)
        plan = CommitPlan(str(self.token), files, self.dictionary is not None, meta.to_json(), folders, has_manifest)
        commit_and_release(self.store, plan, self.lease)
        return meta

    def discard(self) -> None:
        """Delete everything staged and give the URL back (the staging folder too, unless another run is in it)."""
        try:
            remove_staged(self.store, str(self.token))
        finally:
            self.lease.release()

    def release(self) -> None:
        """Give the URL back, keeping what is staged (to resume later)."""
        self.lease.release()


def first_shard_dictionary(examples: Iterable[Any], settings: ShardSettings) -> bytes | None:
    """The shared dictionary the writer would train: on the first shard's pickled blocks (None if < 7). A block
    that cannot be pickled is left out: the part holding it names the example when it is written."""
    first = list(itertools.islice(examples, settings.shard_size))
    blocks = []
    for start in range(0, len(first), settings.block_size):
        try:
            blocks.append(pickle_block(first[start : start + settings.block_size]))
        except Exception:
            continue
    if len(blocks) < MIN_BLOCKS_FOR_DICTIONARY:
        return None
    return train_dictionary(blocks, settings.compression_dict_size, settings.compression_level)


def write_parts(
    parts: StagedParts,
    units: list[Any],
    task: PartTask,
    *,
    workers: int = 1,
    engine: str = "processes",
    resume: bool = False,
    progress: Progress | None = None,
    allowed_classes: tuple[str, ...] = (),
) -> int:
    """Write part n from units[n] with `task`, for every part not staged yet (with resume, those an earlier run
    staged are skipped), in this process (progress example by example), in `workers` processes, or as Ray
    tasks; returns how many parts were already staged. On failure the URL is given back and what was staged
    stays, for resume; nothing is committed here."""
    done = parts.done() if resume else set()
    specs = [(parts.spec(n, allowed_classes), units[n]) for n in range(len(units)) if n not in done]
    try:
        if engine == "ray":
            from .ray_data import write_parts as write_with_ray

            for counts in write_with_ray(task, specs):
                _report(progress, counts, finished=True)
        elif workers <= 1 or len(specs) <= 1:

            def examples_done(n: int) -> None:
                _report(progress, (n, 0))

            for spec, unit in specs:
                _, stored = task(spec, unit, examples_done)
                _report(progress, (0, stored), finished=True)
        else:
            quiet_resource_tracker()
            context = multiprocessing.get_context("spawn")  # no inherited threads, locks or filesystems
            with ProcessPoolExecutor(
                min(workers, len(specs)), mp_context=context, initializer=die_with_parent, initargs=(os.getpid(),)
            ) as pool:
                for counts in pool.map(task, *zip(*specs)):
                    _report(progress, counts, finished=True)
    except BaseException:
        parts.release()  # the staged parts stay, for resume=True
        raise
    return len(done)


def _report(progress: Progress | None, counts: tuple[int, int], finished: bool = False) -> None:
    """Tell progress of (examples, bytes) done; `finished`: a part is done (a progress bar counting inputs has
    an `input_done()`)."""
    if progress:
        progress(*counts)
        if finished and hasattr(progress, "input_done"):
            progress.input_done()


def die_with_parent(parent: int) -> None:
    """Worker initializer: a worker outlives a parent killed by SIGKILL (nothing runs to stop it), and would go on
    uploading into a staging folder that `recover` is about to delete. Linux's parent-death signal ends it at
    once; a watcher of the parent's pid covers the rest (other systems, a parent that died before this ran)."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(0.2)
        os._exit(1)

    threading.Thread(target=watch, daemon=True, name="atlas-parent-watch").start()


TRACKER_WARNING = "ignore:resource_tracker:UserWarning"


def quiet_resource_tracker() -> None:
    """Start multiprocessing's resource tracker without its warning of "leaked semaphore objects": after a
    SIGKILL of this process (nothing of ours runs then) it removes the pool's semaphores itself, which is all
    that is needed, and the warning only alarms. It takes its warning filters from our `-W` options when it
    starts, so one is added for that moment."""
    from multiprocessing import resource_tracker

    if TRACKER_WARNING in sys.warnoptions:
        return resource_tracker.ensure_running()
    sys.warnoptions.append(TRACKER_WARNING)
    try:
        resource_tracker.ensure_running()
    finally:
        sys.warnoptions.remove(TRACKER_WARNING)
