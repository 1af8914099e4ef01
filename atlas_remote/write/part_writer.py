"""The part machinery: how shards are stored (WriteSettings), one part of a dataset written into a staging folder
(PartWriter: shards staged, no lease, no commit) and what it records (PartManifest), and the staged manifest.

A part writer builds each shard in a local temporary folder, finishes it (its last blocks compressed, its
dictionary trained) and uploads it to the staging prefix on a background thread while the next shard fills, then
deletes it locally: local disk holds at most two shards.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass

import numpy as np

from ..errors import FormatError, ObjectNotFoundError
from ..format.manifest import MANIFEST, Manifest, Seals, Sidecar, row_of, shard_digest
from ..format.names import STAGING
from ..format.seal import content_digest, staged
from ..format.spec import DICT_FILE, CompressionStrategy
from ..format.token_counts import document
from ..storage import Store
from ..trust.keys import Signer, writer_signer
from .settings import WriteSettings
from .shard_writer import AtlasDatasetShardWriter, BlockFiller, Closed

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PartManifest:
    """What a part of a dataset holds once written: recorded beside its shards (a part with one is done) and read
    back by whoever commits."""

    shard_sizes: list[int]
    shard_files: list[list[str]]  # file names of each shard
    stored_bytes: int  # every shard file counted
    compression_strategy: CompressionStrategy  # the part's final strategy (a fallback changes it)
    trained_dictionary: bool  # the part's first shard trained the shared dictionary, staged beside it
    shards: list[list] | None  # each shard's row of the dataset's manifest; None with checksums=False
    tokens: list[int] | None = None  # with settings.tokens: each block's tokens, in order
    tokens_refused: str = ""  # why the part's tokens could not be counted (an example without them)
    # each shard's content digest, the id of the key that sealed it staged, that seal (hex); None: unsealed
    seals: list[list[str] | None] | None = None

    @property
    def examples(self) -> int:
        return sum(self.shard_sizes)

    def to_json(self) -> bytes:
        return json.dumps({**asdict(self), "compression_strategy": int(self.compression_strategy)}).encode()

    @classmethod
    def from_json(cls, raw: bytes, where: str) -> PartManifest:
        try:
            record = json.loads(raw)
            record["compression_strategy"] = CompressionStrategy(record["compression_strategy"])
            return cls(**record)
        except (ValueError, TypeError, KeyError) as err:
            raise FormatError(f"unreadable part manifest ({err})", url=where) from err


@dataclass(frozen=True)
class _FinishedShard:
    """One shard of a part, closed: what its manifest says of it."""

    size: int
    files: list[str]
    row: list  # its row of the dataset's manifest
    stored_bytes: int
    seal: list[str] | None  # PartManifest.seals


class PartWriter(BlockFiller):
    """Writes shards into a staging folder and nothing else: no lease, no commit. Engine-independent, so a
    process of a local pool or a task on a cluster can write one part of a dataset.

    Each shard is built in a local temporary folder; once full it is finished (its last blocks compressed, its
    dictionary trained with DICTIONARY_COMPRESSION: zstd releases the interpreter lock for both) and uploaded to
    `<staging>/<prefix><k>/` on a background thread while the next one fills, then deleted locally: local disk
    holds at most two shards. On a local destination shards are built where they are staged (no copy). With
    SHARED_DICTIONARY_COMPRESSION and no dictionary given, the first shard trains
    it (the spec's rule; that shard is finished before the next one starts, which compresses with it) and it is
    uploaded to `<staging>/zstd_dict.bin`; fewer than 7 blocks there makes the part fall back to
    STANDARD_COMPRESSION. `close()` returns the part's manifest: its shard sizes, files and final strategy.
    """

    def __init__(
        self,
        store: Store,
        staging: str,
        prefix: str,
        settings: WriteSettings,
        dictionary: bytes | None = None,
        name_in_errors: str | None = None,
    ) -> None:
        self.settings = settings
        self.strategy = settings.compression_strategy
        self._store, self._staging, self._prefix = store, staging, prefix
        self._shared_dict = dictionary
        self._trains_dictionary = (
            self.strategy == CompressionStrategy.SHARED_DICTIONARY_COMPRESSION and dictionary is None
        )
        self._in_place = store.is_local  # shards built where they are staged: nothing to upload
        self._local = "" if self._in_place else tempfile.mkdtemp(prefix="atlas-remote-")
        self._background = ThreadPoolExecutor(max_workers=1, thread_name_prefix="atlas-upload")
        self._finishing: Future | None = None  # the shard being finished and uploaded
        self._finished: list[_FinishedShard] = []
        self._shard: AtlasDatasetShardWriter | None = None  # made with its first block
        self._shards = 0  # shards started
        self._in_shard = 0  # examples in the shard being filled
        self._stored = 0  # examples in blocks, every shard counted
        self._tokens: list[int] | None = [] if settings.tokens else None  # each block's tokens
        self._tokens_refused = ""
        self._signer: Signer | None = writer_signer() if settings.checksums else None
        self._start_blocks(name_in_errors or store.url, min(settings.block_size, settings.shard_size))

    def __len__(self) -> int:
        return self._stored + len(self._block)

    def _take(self, pickled: bytes, block: list) -> None:
        if self._tokens is not None:
            self._count_tokens(block)
        if self._shard is None:
            self._shard = self._new_shard()
        self._shard.add_pickled_block(pickled, len(block))
        self._stored += len(block)
        self._in_shard += len(block)
        if self._in_shard == self.settings.shard_size:
            self._finish_shard()
        self._room = min(self.settings.block_size, self.settings.shard_size - self._in_shard)

    def _count_tokens(self, block: list) -> None:
        """The block's tokens under settings.tokens; an example without them stops the counting (the part is
        still written: the counts are an addition, and the commit says why there are none)."""
        key, total = str(self.settings.tokens), 0
        for k, example in enumerate(block):
            tokens = document(example, key)
            if isinstance(tokens, str):
                self._tokens, self._tokens_refused = None, f"example {self._stored + k} of {self._url} {tokens}"
                return
            total += len(tokens)
        assert self._tokens is not None
        self._tokens.append(total)

    def _new_shard(self) -> AtlasDatasetShardWriter:
        number, strategy = self._shards, self.strategy
        self._shards += 1
        if self._trains_dictionary and number == 0:
            strategy = CompressionStrategy.DICTIONARY_COMPRESSION  # the first shard trains the shared dictionary
        if self._in_place:
            folder = self._store.path(f"{self._staging}/{self._prefix}{number}")
            shutil.rmtree(folder, ignore_errors=True)  # what an interrupted run of this part left
        else:
            folder = os.path.join(self._local, str(number))
        return AtlasDatasetShardWriter(
            folder,
            self.settings.block_size,
            strategy,
            self.settings.compression_level,
            self._shared_dict,
            self.settings.compression_dict_size,
            checksums=self.settings.checksums,
        )

    def _finish_shard(self) -> None:
        shard, number = self._shard, self._shards - 1
        assert shard is not None
        self._shard, self._in_shard = None, 0
        if number == 0 and self._trains_dictionary:
            self._train_shared_dictionary(shard)  # here: the next shard compresses with it
        self._wait_for_upload()
        self._finishing = self._background.submit(self._finish_and_upload, shard, number)

    def _train_shared_dictionary(self, shard: AtlasDatasetShardWriter) -> None:
        trained = shard.close()
        if trained is None:  # fewer than 7 blocks in the first shard: the whole dataset falls back
            self.strategy = CompressionStrategy.STANDARD_COMPRESSION
            return
        self._shared_dict = trained
        os.replace(shard.path / DICT_FILE, self._dictionary_file())
        shard.metadata = shard.metadata._replace(compression_strategy=CompressionStrategy.SHARED_DICTIONARY_COMPRESSION)
        shard.write_meta()

    def _finish_and_upload(self, shard: AtlasDatasetShardWriter, number: int) -> None:
        """On the background thread: close the shard (if not yet), record it, upload it, delete it locally."""
        shard.close()
        meta, folder = shard.metadata, shard.path
        files = sorted(os.listdir(folder))
        offsets, sums = shard.written()
        digest = shard_digest(np.array(offsets, np.uint64), sums)
        sidecar = Sidecar.NONE if sums is None else Sidecar.BLOCKS
        row = list(row_of(meta, offsets[-1], sidecar, digest))  # offsets[-1]: data.bin's size
        seal = None
        if sums is not None and sums.digests is not None and sums.dictionary is not None and self._signer:
            content = content_digest(meta, sums.dictionary, np.array(offsets, np.uint64), sums.digests)
            sealed = self._signer.sign(staged(f"{self._staging}/{self._prefix}{number}", content))
            seal = [content.hex(), self._signer.id, sealed.hex()]
        stored = sum(os.path.getsize(folder / name) for name in files)
        if not self._in_place:
            if number == 0 and self._trains_dictionary and self._shared_dict is not None:
                self._store.upload(self._dictionary_file(), f"{self._staging}/{DICT_FILE}")
            for name in files:
                self._store.upload(str(folder / name), f"{self._staging}/{self._prefix}{number}/{name}")
            shutil.rmtree(folder)
        self._finished.append(_FinishedShard(meta.stored_examples, files, row, stored, seal))

    def _dictionary_file(self) -> str:
        """Where the trained shared dictionary is kept: staged already, or beside the local shards."""
        if self._in_place:
            return self._store.path(f"{self._staging}/{DICT_FILE}")
        return os.path.join(self._local, DICT_FILE)

    def _wait_for_upload(self) -> None:
        """Wait for the shard being finished and uploaded (its failure is raised here)."""
        if self._finishing is not None:
            finishing, self._finishing = self._finishing, None
            finishing.result()

    @property
    def shard_sizes(self) -> list[int]:
        return [shard.size for shard in self._finished]

    def close(self, keep_empty: bool = True) -> PartManifest:
        """Finish the last shard and wait for every upload; returns the part's manifest. An empty part has one
        empty shard (as the original writer leaves an empty dataset), or none with keep_empty=False. The last
        block's unpicklable examples are refused here (UnpicklableExampleError; the part stays open)."""
        self.pickle_pending()
        self._block = Closed(self._url)
        try:
            if self._shard is None and self._shards == 0 and keep_empty:
                self._shard = self._new_shard()
            if self._shard is not None:
                self._finish_shard()
            self._wait_for_upload()
        finally:
            self._cleanup_local()
        finished = self._finished
        return PartManifest(
            [shard.size for shard in finished],
            [shard.files for shard in finished],
            sum(shard.stored_bytes for shard in finished),
            self.strategy,
            self._trains_dictionary and self._shared_dict is not None,
            [shard.row for shard in finished] if self.settings.checksums else None,  # else: the original's files
            self._tokens,
            self._tokens_refused,
            [shard.seal for shard in finished],
        )

    def abandon(self) -> None:
        """Stop without finishing (what was uploaded stays staged, for the caller to delete or keep)."""
        self._block = Closed(self._url)
        try:
            self._wait_for_upload()
        except BaseException as err:  # the upload's own failure is what the caller is already handling
            log.debug("upload failed while abandoning a part of %s: %s", self._url, err)
        self._cleanup_local()

    def _cleanup_local(self) -> None:
        self._background.shutdown(wait=True)
        if self._shard is not None:
            self._shard.discard()
            self._shard = None
        if self._local:
            shutil.rmtree(self._local, ignore_errors=True)


def stage_manifest(store: Store, staging: str, root_meta: bytes, rows: list, seals: Seals | None = None) -> None:
    """The dataset's manifest (manifest.py), staged beside its shards, for the commit to put at the root."""
    manifest = Manifest.from_rows(root_meta, [(n, *row) for n, row in enumerate(rows)], seals)
    store.write(f"{staging}/{MANIFEST}", manifest.encode())


def remove_staged(store: Store, token: str) -> None:
    """Delete a run's staging folder, and the staging root if no other run is in it (a local disk keeps empty
    folders)."""
    store.remove(f"{STAGING}/{token}")
    try:
        if not store.list_names(STAGING):
            store.remove(STAGING)
    except ObjectNotFoundError:
        pass
