"""The start and the end of every write: a dataset staged as numbered parts (by this process, worker processes,
Ray tasks or machines), committed once. `AtlasDatasetWriter`, `build`, `write`, `convert`, `copy` and Ray's
datasink all begin and finish a write here, so there is one sequence of each."""

from __future__ import annotations

import contextlib
import itertools
import json
import logging
import uuid
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import (
    AtlasError,
    DatasetExistsError,
    ObjectNotFoundError,
    StorageError,
    UnsafePickleError,
    WriteEndedError,
)
from ..format.codec import PicklePolicy, pickle_block
from ..format.manifest import Seals
from ..format.names import STAGING
from ..format.seal import dataset_identity, placed, staged
from ..format.spec import DICT_FILE, VERSION, AtlasDatasetMetadata, Layout
from ..format.token_counts import counts_url, encode_counts
from ..storage import Store
from ..trust.keys import SEAL_BYTES, writer_signer
from .commit import CommitPlan, commit_and_release, recover_locked, refuse_unless_writable, step_done, take_lease
from .lease import DEFAULT_LEASE_SECONDS
from .part_writer import PartManifest, PartWriter, remove_staged, stage_manifest
from .settings import WriteSettings

log = logging.getLogger(__name__)
PARTS_MANIFEST = "part.json"
JOB_FILE = "parts.json"
CHUNK = 4096  # examples handed to the writer at once (and counted for progress at once)


@dataclass(frozen=True)
class PartSpec:
    """Everything a worker needs to write part `part` of a staged dataset: picklable, engine-independent."""

    url: str
    storage_options: dict[str, Any] | None
    token: str
    part: int
    settings: WriteSettings
    dictionary: bytes | None
    allowed_classes: tuple[str, ...] = ()  # what readers of the dataset will be told to allow

    @property
    def folder(self) -> str:
        return f"{STAGING}/{self.token}/parts/{self.part}"

    def writer(self, store: Store, source: str | None = None) -> PartWriter:
        return PartWriter(
            store, f"{STAGING}/{self.token}", f"parts/{self.part}/", self.settings, self.dictionary, source
        )

    def write(
        self, examples: Iterable[Any], progress: Callable[[int], None] | None = None, source: str | None = None
    ) -> PartManifest:
        """Write the examples as this part's shards and its manifest (last: a part with a manifest is done).

        Before anything is written, the first block is read back as a reader would read it (the restricted
        unpickler, with `allowed_classes`): a value such a reader would refuse fails the part at once, naming
        `source` (what the examples come from) and the example, rather than a dataset that does not open.
        """
        store = Store(self.url, self.storage_options)
        writer = self.writer(store, source)
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
        except BaseException as err:
            writer.abandon()
            if not self._run_goes_on(store):
                raise self._ended() from err
            raise
        self.record(store, manifest)
        if not self._run_goes_on(store):
            raise self._ended()
        return manifest

    def _run_goes_on(self, store: Store) -> bool:
        """Whether the run still has its record; if not (the write failed or was discarded while this part was
        being written: a Ray task still running after another failed), what this part wrote goes too (its
        folder, and the dictionary it may have trained for the run)."""
        if store.exists(f"{STAGING}/{self.token}/{JOB_FILE}"):
            return True
        with contextlib.suppress(AtlasError):
            remove_staged(store, self.token)
        return False

    def _ended(self) -> WriteEndedError:
        return WriteEndedError(
            f"part {self.part} finished after its write had ended (failed or discarded): nothing of it was kept; "
            f"see the write's own error",
            url=self.url,
        )

    def record(self, store: Store, manifest: PartManifest) -> None:
        """Stage the part's manifest: the part is done."""
        store.write(f"{self.folder}/{PARTS_MANIFEST}", manifest.to_json())
        step_done(f"part-{self.part}-staged")


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


def _staged_seal(record: object) -> tuple[bytes, str, bytes]:
    """(content digest, key id, seal) of a part manifest's record of a shard (PartManifest.seals), or nothing that
    verifies if the record is not one a part writer makes (part.json is a file in the bucket)."""
    try:
        fields: list = list(record)  # type: ignore[call-overload]
        found = bytes.fromhex(fields[0]), str(fields[1]), bytes.fromhex(fields[2])
    except (TypeError, ValueError, IndexError):
        return b"", "", b""
    return found if len(found[2]) == SEAL_BYTES else (b"", "", b"")


class StagedParts:
    """A write, from its lease to its commit: the one start and the one end every writer goes through.

    The start takes the URL's lease in the name of `holder` (what a second writer's DatasetLockedError names: "atlas-remote
    build", "AtlasDatasetWriter"...), which also proves the bucket exists and is writable before any work; then
    finishes or clears what a writer that died here left, and makes every check that can refuse. `spec(n)` tells a
    worker how to write part n (PartSpec.write); `commit(parts)` numbers the shards of parts 0..parts-1 in that
    order and commits them (root meta.json last; see commit.py). With a `job` record (what the work is: inputs,
    options) and resume=True, an interrupted run of the same job and settings is continued, and `done()` lists
    the parts it finished. `dictionary`: the shared dictionary every part compresses with (trained on the
    dataset's first shard, as the spec says); without one, a part writing SHARED_DICTIONARY_COMPRESSION trains
    it on its own first shard (the single writer does). settings=None: a copy, whose parts are files.
    """

    def __init__(
        self,
        url: str,
        settings: WriteSettings | None,
        storage_options: dict[str, Any] | None = None,
        *,
        holder: str,
        job: dict[str, Any] | None = None,
        dictionary: bytes | None = None,
        overwrite: bool = False,
        resume: bool = False,
        lease_seconds: float = DEFAULT_LEASE_SECONDS,
    ) -> None:
        self.url, self.storage_options, self.settings, self.overwrite = str(url), storage_options, settings, overwrite
        self.store = Store(self.url, storage_options)
        self.store.require_writable()
        self.lease = take_lease(self.store, holder, lease_seconds)
        stale = self.lease.took_over
        if stale is not None:  # recover says it in its report instead
            log.warning("%s: took over the stale lease of %s, since %s", self.url, stale.holder, stale.started)
        with self.lease.released_on_failure():
            record = {
                "job": job or {},
                "settings": settings and settings.record(),
                "dictionary": dictionary is not None,
            }
            token = self._resumable(record) if resume else None
            if token is None:
                recover_locked(self.store, self.lease)
                refuse_unless_writable(self.store, overwrite)
                token = uuid.uuid4().hex[:12]
                if dictionary is not None:
                    self.store.write(f"{STAGING}/{token}/{DICT_FILE}", dictionary)
                # every run has its record: a part that finds it gone knows the run ended without it (PartSpec.write)
                self.store.write(f"{STAGING}/{token}/{JOB_FILE}", json.dumps(record).encode())
            else:
                refuse_unless_writable(self.store, overwrite)
                if dictionary is not None:
                    dictionary = self.store.read(f"{STAGING}/{token}/{DICT_FILE}", "dict")
        self.token: str = token
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
            self.url, self.storage_options, self.token, part, self._settings(), self.dictionary, allowed_classes
        )

    def _settings(self) -> WriteSettings:
        if self.settings is None:
            raise ValueError(f"{self.url}: a write of files (a copy) has no parts of examples")
        return self.settings

    def done(self) -> set[int]:
        """The parts whose manifest is staged."""
        found = self.store.find(f"{self.staging}/parts")
        prefix = f"{self.staging}/parts/"
        return {int(rel[len(prefix) :].split("/")[0]) for rel in found if rel.endswith(f"/{PARTS_MANIFEST}")}

    def commit(self, parts: int | list[PartManifest], *, keep_staged: bool = True) -> AtlasDatasetMetadata:
        """Commit parts 0..parts-1 (or the manifests given, of parts written in this process), their shards
        numbered in part order; see finish()."""
        with self._given_back_on_failure(keep_staged):
            if isinstance(parts, int):
                manifests = [
                    PartManifest.from_json(
                        self.store.read(f"{self.staging}/parts/{n}/{PARTS_MANIFEST}", "meta"), self.url
                    )
                    for n in range(parts)
                ]
            else:
                manifests = parts
            if not any(m.shard_files for m in manifests):  # nothing at all: the original's empty dataset, one shard
                empty = PartWriter(self.store, self.staging, "parts/empty/", self._settings(), self.dictionary)
                manifests = [empty.close()]
                folders = ["parts/empty/0"]
            else:
                folders = [f"parts/{n}/{k}" for n, m in enumerate(manifests) for k in range(len(m.shard_sizes))]
            sizes = [size for m in manifests for size in m.shard_sizes]
            files = [names for m in manifests for names in m.shard_files]
            meta = AtlasDatasetMetadata(VERSION, sizes, manifests[0].compression_strategy)
            has_manifest = all(m.shards is not None for m in manifests)  # checksums=False: the original's files
            shared = self.dictionary is not None or manifests[0].trained_dictionary
            plan = CommitPlan(self.token, files, shared, meta.to_json(), folders, has_manifest)
            seals = self._sealed([s for m in manifests for s in m.seals or [None] * len(m.shard_sizes)], folders)
        rows = [row for m in manifests for row in m.shards or []] if has_manifest else None
        self.finish(plan, rows, keep_staged, seals)
        if self.settings is not None and self.settings.tokens:
            self._save_token_counts(self.settings, manifests, meta)
        return meta

    def _save_token_counts(self, settings: WriteSettings, manifests: list[PartManifest], meta: Any) -> None:
        """Each block's tokens, counted as the parts were written, saved beside the committed dataset (what a
        TokenStream finds there: no counting pass). The dataset is committed already: a failure is said, not
        raised."""
        key = str(settings.tokens)
        where = counts_url(self.url, key)
        refused = next((m.tokens_refused for m in manifests if m.tokens is None), None)
        if refused is not None:
            hint = "; lists of ids become arrays with dtype= (convert --dtype uint16)" if "list" in refused else ""
            log.warning("%s: no token counts saved (%s%s)", where, refused or "a part counted none", hint)
            return
        layout = Layout.of(meta.shard_sizes, [settings.block_size] * len(meta.shard_sizes))
        blocks = np.array([n for m in manifests for n in m.tokens or []], dtype=np.int64)
        if len(blocks) and blocks.max() >= 1 << 32:
            log.warning("%s: no token counts saved (a block of %s tokens: 2^32 at most)", where, int(blocks.max()))
            return
        try:
            import fsspec

            with fsspec.open(where, "wb", **(self.storage_options or {})) as file:
                file.write(encode_counts(key, layout.digest(), blocks))
        except Exception as err:  # the dataset is committed: the counts are an addition
            log.warning("%s: token counts not saved (%s: %s)", where, type(err).__name__, err)

    def _sealed(self, staged_seals: list[list[str] | None], folders: list[str]) -> Seals | None:
        """The dataset's seals (format/seal.py): each shard's placed statement sealed with this process's key, for
        each shard whose staged statement that key sealed (a worker of this write, not someone who could write
        the staging folder), under the identity those shards make. A shard sealed by another key, or by none, is
        left unsealed (read as a stranger's), with a warning."""
        if not any(staged_seals):
            return None
        signer = writer_signer()
        if signer is None:
            return None
        contents = {}
        for number, (record, folder) in enumerate(zip(staged_seals, folders)):
            content, key_id, seal = _staged_seal(record)
            if key_id == signer.id and signer.verifies(staged(f"{self.staging}/{folder}", content), seal):
                contents[number] = content
        dataset = dataset_identity(contents)
        by_number = {number: signer.sign(placed(dataset, number, c)) for number, c in contents.items()}
        unsealed = len(folders) - len(contents)
        if unsealed:
            log.warning(
                "%s: %d of %d shards are not signed: they were staged without this process's key (%s), so they "
                "are read as a stranger's; give every worker the same key (docs/security.md)",
                self.url,
                unsealed,
                len(folders),
                signer.id,
            )
        return Seals(dataset, signer.id, by_number)

    def finish(
        self, plan: CommitPlan, manifest_rows: list | None = None, keep_staged: bool = True, seals: Seals | None = None
    ) -> None:
        """The end of every write: check that the lease is still ours and the URL still writable (a writer of the
        original format may have been here), stage the dataset's manifest, commit, give the lease back. A failure
        before the commit's point of no return gives the URL back, with what was staged kept (for resume) or
        deleted (keep_staged=False); after it, CommitInterruptedError (`recover` finishes the commit)."""
        with self._given_back_on_failure(keep_staged):
            self.lease.check()
            refuse_unless_writable(self.store, self.overwrite)
            if manifest_rows is not None:
                stage_manifest(self.store, self.staging, plan.root_meta, manifest_rows, seals)
        commit_and_release(self.store, plan, self.lease)

    @contextmanager
    def _given_back_on_failure(self, keep_staged: bool) -> Iterator[None]:
        try:
            yield
        except BaseException:
            self.release() if keep_staged else self.discard()
            raise

    def discard(self) -> None:
        """Delete everything staged and give the URL back (the staging folder too, unless another run is in it)."""
        try:
            remove_staged(self.store, self.token)
        except StorageError as err:
            log.warning(
                "could not delete the staged files of %s (%s); the next writer there removes them", self.url, err
            )
        finally:
            self.lease.release()

    def release(self) -> None:
        """Give the URL back, keeping what is staged (to resume later)."""
        self.lease.release()
