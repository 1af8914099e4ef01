"""Writing an Atlas dataset to any fsspec URL, atomically, one writer per URL.

The writer first takes the URL's lease (see lease.py): that also proves the bucket exists and is writable,
before any shard is built. Each shard is built in a local temporary folder, uploaded to a staging prefix inside
the dataset URL as soon as it is finished (in the background, while the next shard fills), and deleted locally:
local disk holds at most two shards. `close()` commits (see commit.py): the URL serves the old dataset until
the new one is complete, then the new one, never a mix. A writer that fails before its commit, or leaves its
`with` block by an exception, discards everything it staged.
"""

from __future__ import annotations

import json
import logging
import os
import pickle
import shutil
import tempfile
import uuid
import zlib
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import zstandard

from .codec import compressor, pickle_block, train_dictionary
from .commit import (
    CommitPlan,
    begin_write,
    commit_and_release,
    refuse_unless_writable,
)
from .errors import FormatError, StorageError, UnpicklableExampleError
from .format import (
    CHECKSUM_FILE,
    DATA_FILE,
    DICT_FILE,
    INDEX_FILE,
    MIN_BLOCKS_FOR_DICTIONARY,
    SHARD_META,
    VERSION,
    AtlasDatasetMetadata,
    AtlasDatasetShardMetadata,
    CompressionStrategy,
    encode_checksums,
    encode_index,
)
from .layout import STAGING
from .lease import DEFAULT_LEASE_SECONDS
from .manifest import MANIFEST, Manifest, row_of, shard_digest
from .storage import Store, location

log = logging.getLogger(__name__)
COMPRESSING_AHEAD = 8  # blocks handed to the compression thread and not yet written: bounds the memory they hold


def _check_picklable(example: Any, url: str, index: int) -> None:
    try:
        pickle.dumps(example, protocol=pickle.DEFAULT_PROTOCOL)
    except Exception as err:
        raise UnpicklableExampleError(
            f"example #{index} (counting every add_example call from 0) cannot be pickled "
            f"({type(err).__name__}: {err}); it was not added, nothing else changed",
            example_index=index,
            url=url,
        ) from err


class _CloseOrDiscard:
    """A `with` block that finishes the work when it ends normally and throws it away when it raises (the
    original writer closes, and so publishes, half-written data after an exception)."""

    def close(self) -> Any:
        raise NotImplementedError

    def discard(self) -> None:
        raise NotImplementedError

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc_value, traceback) -> None:
        if exc_type is None:
            self.close()
        else:
            self.discard()


class AtlasDatasetShardWriter(_CloseOrDiscard):
    """Builds one shard in a local folder, following the spec and the original writer exactly.

    Blocks are pickled, compressed and appended to data.bin as they fill, except with DICTIONARY_COMPRESSION,
    where they are kept in memory until close() trains the shard's dictionary on them (falling back to
    STANDARD_COMPRESSION when there are fewer than 7 blocks). The folder must not exist yet. Used in a `with`
    block, it closes the shard on success and deletes the folder if the block raised.
    """

    VERSION = VERSION

    def __init__(
        self,
        path: str | os.PathLike,
        block_size: int,
        compression_strategy: CompressionStrategy = CompressionStrategy.DICTIONARY_COMPRESSION,
        compression_level: int = 3,
        compression_dict: bytes | zstandard.ZstdCompressionDict | None = None,
        compression_dict_size: float = 0.01,
        *,
        checksums: bool = True,
    ) -> None:
        check_writer_arguments(block_size, compression_dict_size)
        strategy = CompressionStrategy(compression_strategy)
        if isinstance(compression_dict, zstandard.ZstdCompressionDict):
            compression_dict = compression_dict.as_bytes()
        if strategy == CompressionStrategy.SHARED_DICTIONARY_COMPRESSION and compression_dict is None:
            raise ValueError("SHARED_DICTIONARY_COMPRESSION needs the shared dictionary (compression_dict)")
        self.path = Path(path)
        self.metadata = AtlasDatasetShardMetadata(
            VERSION, block_size, 0, strategy, compression_level, compression_dict_size
        )
        self.dictionary = compression_dict if strategy == CompressionStrategy.SHARED_DICTIONARY_COMPRESSION else None
        # blocks are compressed as they fill, except with a shard dictionary (trained at close)
        self.compressor = (
            None
            if strategy == CompressionStrategy.DICTIONARY_COMPRESSION
            else compressor(strategy, compression_level, self.dictionary)
        )
        self.stored_examples = 0
        self._block: list = []
        self._held_blocks: list[bytes] = []  # DICTIONARY_COMPRESSION: pickled blocks awaiting the dictionary
        self._offsets = [0]
        self._checksums: list[int] | None = [] if checksums else None
        self._calls = 0
        self._closed = False
        self.path.mkdir(parents=True)
        self._data: Any = None  # data.bin is created with the first block, as the original writer does
        self._compressing: deque[Future] = deque()  # blocks being compressed, in the order they are written
        self._compression_thread: ThreadPoolExecutor | None = None

    def __len__(self) -> int:
        return self.stored_examples

    def add_example(self, example: Any) -> None:
        """Add one example; one that cannot be pickled is refused here, before anything is added."""
        self._calls += 1
        self.add_checked(example, str(self.path), self._calls - 1)

    def add_checked(self, example: Any, url: str, index: int) -> None:
        """add_example, with the dataset URL and example number an unpicklable example is reported under."""
        if self._closed:
            raise ValueError(f"{self.path}: the shard writer is closed")
        _check_picklable(example, url, index)
        self._block.append(example)
        self.stored_examples += 1
        if len(self._block) == self.metadata.block_size:
            self._flush_block()

    def _flush_block(self) -> None:
        pickled = pickle_block(self._block)
        self._block = []
        if self.metadata.compression_strategy == CompressionStrategy.DICTIONARY_COMPRESSION:
            self._held_blocks.append(pickled)
        elif self.compressor is None:
            self._append(pickled)
        else:
            self._compress_behind(pickled)

    def _compress_behind(self, pickled: bytes) -> None:
        """zstd releases the interpreter lock, so one thread compresses blocks while the caller pickles the next
        ones; blocks are written in order (the same compressor, used by that thread only: the same bytes)."""
        if self._compression_thread is None:
            self._compression_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="atlas-compress")
        self._compressing.append(self._compression_thread.submit(self.compressor.compress, pickled))
        while self._compressing and (len(self._compressing) > COMPRESSING_AHEAD or self._compressing[0].done()):
            self._append(self._compressing.popleft().result())

    def _stop_compressing(self, write: bool) -> None:
        """Write the blocks still being compressed (or drop them), and let the thread go."""
        while self._compressing:
            block = self._compressing.popleft()
            if write:
                self._append(block.result())
            else:
                block.cancel()
        if self._compression_thread is not None:
            self._compression_thread.shutdown()  # after the cancels, at most the block being compressed is awaited
            self._compression_thread = None

    def _append(self, block: bytes) -> None:
        if self._data is None:
            self._data = open(self.path / DATA_FILE, "wb")
        self._data.write(block)
        self._offsets.append(self._offsets[-1] + len(block))
        if self._checksums is not None:
            self._checksums.append(zlib.crc32(block))

    def close(self) -> bytes | None:
        """Finish the shard's files (once); returns the dictionary it trained, if it trained one."""
        if self._closed:
            return None
        self._closed = True
        if self._block:
            self._flush_block()
        self._stop_compressing(write=True)
        meta = self.metadata._replace(stored_examples=self.stored_examples)
        trained = None
        if meta.compression_strategy == CompressionStrategy.DICTIONARY_COMPRESSION:
            if len(self._held_blocks) >= MIN_BLOCKS_FOR_DICTIONARY:
                trained = train_dictionary(self._held_blocks, meta.compression_dict_size, meta.compression_level)
                (self.path / DICT_FILE).write_bytes(trained)
            else:
                meta = meta._replace(compression_strategy=CompressionStrategy.STANDARD_COMPRESSION)
            cctx = compressor(meta.compression_strategy, meta.compression_level, trained)
            for pickled in self._held_blocks:
                self._append(cctx.compress(pickled))
            self._held_blocks = []
        if self._data is not None:
            self._data.close()
        (self.path / INDEX_FILE).write_bytes(encode_index(self._offsets))
        if self._checksums is not None:
            (self.path / CHECKSUM_FILE).write_bytes(encode_checksums(self._checksums))
        self.metadata = meta
        self.write_meta()
        return trained

    def write_meta(self) -> None:
        (self.path / SHARD_META).write_bytes(self.metadata.to_json())

    def discard(self) -> None:
        self._closed = True
        self._stop_compressing(write=False)
        if self._data is not None:
            self._data.close()
        shutil.rmtree(self.path, ignore_errors=True)


def check_writer_arguments(block_size: int, compression_dict_size: float) -> None:
    """ValueError, not the original's assert (which `python -O` removes)."""
    if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size <= 0:
        raise ValueError(f"block_size must be a positive integer, got {block_size!r}")
    if not 0.0 <= compression_dict_size <= 1.0:
        raise ValueError(f"compression_dict_size must be between 0 and 1, got {compression_dict_size!r}")


@dataclass(frozen=True)
class ShardSettings:
    """How shards are stored: the parameters every writer of one dataset shares."""

    shard_size: int
    block_size: int
    compression_strategy: CompressionStrategy = CompressionStrategy.SHARED_DICTIONARY_COMPRESSION
    compression_level: int = 3
    compression_dict_size: float = 0.01
    checksums: bool = True

    def __post_init__(self) -> None:
        if isinstance(self.shard_size, bool) or not isinstance(self.shard_size, int) or self.shard_size <= 0:
            raise ValueError(f"shard_size must be a positive integer, got {self.shard_size!r}")
        check_writer_arguments(self.block_size, self.compression_dict_size)
        object.__setattr__(self, "compression_strategy", CompressionStrategy(self.compression_strategy))


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


class PartWriter:
    """Writes shards into a staging folder and nothing else: no lease, no commit. Engine-independent, so a
    process of a local pool or a task on a cluster can write one part of a dataset.

    Each shard is built in a local temporary folder, uploaded to `<staging>/<prefix><k>/` as soon as it is
    finished (in the background, while the next one fills) and deleted locally: local disk holds at most two
    shards. With SHARED_DICTIONARY_COMPRESSION and no dictionary given, the first shard trains it (the spec's
    rule) and it is uploaded to `<staging>/zstd_dict.bin`; fewer than 7 blocks there makes the part fall back to
    STANDARD_COMPRESSION. `close()` returns the part's manifest: its shard sizes, files and final strategy.
    """

    def __init__(
        self,
        store: Store,
        staging: str,
        prefix: str,
        settings: ShardSettings,
        dictionary: bytes | None = None,
        name_in_errors: str | None = None,
    ) -> None:
        self.settings = settings
        self.strategy = settings.compression_strategy
        self._store, self._staging, self._prefix = store, staging, prefix
        self._url = name_in_errors or store.url
        self._shared_dict = dictionary
        self._trains_dictionary = (
            self.strategy == CompressionStrategy.SHARED_DICTIONARY_COMPRESSION and dictionary is None
        )
        self._local = tempfile.mkdtemp(prefix="atlas-remote-")
        self._uploader = ThreadPoolExecutor(max_workers=1, thread_name_prefix="atlas-upload")
        self._upload: Future | None = None
        self.shard_sizes: list[int] = []
        self.shard_files: list[list[str]] = []
        self.shard_rows: list[list] = []  # each shard's row of the dataset's manifest (see manifest.py)
        self.bytes = 0  # stored so far, every shard file counted
        self._calls = 0  # add_example calls, refused ones included: how examples are named in errors
        self._shard = self._new_shard()

    def __len__(self) -> int:
        return sum(self.shard_sizes) + len(self._shard)

    def _new_shard(self) -> AtlasDatasetShardWriter:
        number, strategy = len(self.shard_sizes), self.strategy
        if self._trains_dictionary and number == 0:
            strategy = CompressionStrategy.DICTIONARY_COMPRESSION  # the first shard trains the shared dictionary
        return AtlasDatasetShardWriter(
            os.path.join(self._local, str(number)),
            self.settings.block_size,
            strategy,
            self.settings.compression_level,
            self._shared_dict,
            self.settings.compression_dict_size,
            checksums=self.settings.checksums,
        )

    def add_example(self, example: Any) -> None:
        self._calls += 1
        if len(self._shard) == self.settings.shard_size:
            self._finish_shard()
            self._shard = self._new_shard()
        self._shard.add_checked(example, self._url, self._calls - 1)

    def _finish_shard(self) -> None:
        number = len(self.shard_sizes)
        trained = self._shard.close()
        meta = self._shard.metadata
        if number == 0 and self._trains_dictionary:
            if trained is None:  # fewer than 7 blocks in the first shard: the whole dataset falls back
                self.strategy = CompressionStrategy.STANDARD_COMPRESSION
            else:
                self._shared_dict = trained
                os.replace(self._shard.path / DICT_FILE, os.path.join(self._local, DICT_FILE))
                self._shard.metadata = meta._replace(
                    compression_strategy=CompressionStrategy.SHARED_DICTIONARY_COMPRESSION
                )
                self._shard.write_meta()
        meta = self._shard.metadata
        self.shard_sizes.append(meta.stored_examples)
        self.shard_files.append(sorted(os.listdir(self._shard.path)))
        data = self._shard.path / DATA_FILE
        sums = self._shard.path / CHECKSUM_FILE
        digest = shard_digest(
            np.load(self._shard.path / INDEX_FILE, allow_pickle=False),
            np.load(sums, allow_pickle=False) if sums.exists() else None,
        )
        self.shard_rows.append(list(row_of(meta, data.stat().st_size if data.exists() else 0, sums.exists(), digest)))
        self.bytes += sum(os.path.getsize(self._shard.path / name) for name in self.shard_files[-1])
        self._wait_for_upload()
        self._upload = self._uploader.submit(self._upload_shard, number, str(self._shard.path))

    def _upload_shard(self, number: int, folder: str) -> None:
        if number == 0 and self._trains_dictionary and self._shared_dict is not None:
            self._store.upload(os.path.join(self._local, DICT_FILE), f"{self._staging}/{DICT_FILE}")
        for name in sorted(os.listdir(folder)):
            self._store.upload(os.path.join(folder, name), f"{self._staging}/{self._prefix}{number}/{name}")
        shutil.rmtree(folder)

    def _wait_for_upload(self) -> None:
        if self._upload is not None:
            upload, self._upload = self._upload, None
            upload.result()

    def close(self, keep_empty: bool = True) -> PartManifest:
        """Finish the last shard and wait for every upload; returns the part's manifest. An empty part has one
        empty shard (as the original writer leaves an empty dataset), or none with keep_empty=False."""
        try:
            if len(self._shard) or keep_empty or self.shard_sizes:
                self._finish_shard()
            self._wait_for_upload()
        finally:
            self._cleanup_local()
        return PartManifest(
            self.shard_sizes,
            self.shard_files,
            self.bytes,
            self.strategy,
            self._trains_dictionary and self._shared_dict is not None,
            self.shard_rows if self.settings.checksums else None,  # checksums=False: the original's files
        )

    def abandon(self) -> None:
        """Stop without finishing (what was uploaded stays staged, for the caller to delete or keep)."""
        try:
            self._wait_for_upload()
        except BaseException as err:  # the upload's own failure is what the caller is already handling
            log.debug("upload failed while abandoning a part of %s: %s", self._url, err)
        self._cleanup_local()

    def _cleanup_local(self) -> None:
        self._uploader.shutdown(wait=True)
        self._shard.discard()
        shutil.rmtree(self._local, ignore_errors=True)


class AtlasDatasetWriter(_CloseOrDiscard):
    """Writes an Atlas v1 dataset to a local path or any fsspec URL; the dataset appears only when committed.

    Use it as a context manager: leaving the block normally commits, leaving it by an exception discards.
    With checksums=True (the default) each shard folder also gets block_checksums.npy, a CRC-32 per block that
    readers verify, and the root gets atlas_manifest.npz, every shard's metadata in one object so that opening
    costs two requests however many shards there are; the original reader ignores both. checksums=False writes
    exactly the original writer's files.
    Writing to a URL that already holds a committed dataset is refused unless overwrite=True; with
    overwrite=True the old dataset stays readable until the new one is complete, and files beside it that are
    not Atlas files are kept. Only one writer at a time may write to a URL: a second one gets DatasetLockedError.
    The location is the first argument; `path=` (the original's name) is accepted for it too.
    """

    VERSION = VERSION

    def __init__(
        self,
        url: str | os.PathLike | None = None,
        shard_size: int | None = None,
        block_size: int | None = None,
        compression_strategy: CompressionStrategy = CompressionStrategy.SHARED_DICTIONARY_COMPRESSION,
        compression_level: int = 3,
        compression_dict_size: float = 0.01,
        storage_options: dict[str, Any] | None = None,
        *,
        path: str | os.PathLike | None = None,
        overwrite: bool = False,
        checksums: bool = True,
        lease_seconds: float = DEFAULT_LEASE_SECONDS,
    ) -> None:
        self.settings = ShardSettings(  # None is refused there, with the original's message
            shard_size,  # type: ignore[arg-type]
            block_size,  # type: ignore[arg-type]
            compression_strategy,
            compression_level,
            compression_dict_size,
            checksums,
        )
        self.url = location(url=url, path=path)
        self.overwrite = overwrite
        self._closed = True  # until the lease is ours: discard() then has nothing to undo
        self._store = Store(self.url, storage_options)
        self._store.require_writable()
        self._lease = begin_write(self._store, "AtlasDatasetWriter", overwrite, lease_seconds)
        self._token = uuid.uuid4().hex[:12]
        self._part = PartWriter(self._store, f"{STAGING}/{self._token}", "", self.settings)
        self._closed = False

    def __len__(self) -> int:
        return len(self._part)

    def add_example(self, example: Any) -> None:
        if self._closed:
            raise ValueError(f"{self.url}: the writer is closed")
        self._part.add_example(example)

    def close(self) -> None:
        """Finish the last shard, upload it, and commit the dataset (see commit.py for the guarantee).

        A failure before the commit's point of no return discards what was staged and leaves the URL as it was;
        a failure after it raises CommitInterruptedError, and `recover(url)` (or the next writer) finishes it.
        """
        if self._closed:
            return
        try:
            part = self._part.close()
            meta = AtlasDatasetMetadata(VERSION, part.shard_sizes, part.compression_strategy)
            if part.shards is not None:
                stage_manifest(self._store, f"{STAGING}/{self._token}", meta, part.shards)
            self._lease.check()
            refuse_unless_writable(self._store, self.overwrite)  # a writer of the original format may have been here
        except BaseException:
            self.discard()
            raise
        self._closed = True
        plan = CommitPlan(
            self._token, part.shard_files, part.trained_dictionary, meta.to_json(), manifest=part.shards is not None
        )
        commit_and_release(self._store, plan, self._lease)
        log.info("committed %s: %d examples in %d shards", self.url, sum(meta.shard_sizes), len(meta.shard_sizes))

    def discard(self) -> None:
        """Abandon the dataset being written: nothing is committed, staged uploads are deleted."""
        if self._closed:
            return
        self._closed = True
        self._part.abandon()
        try:
            self._store.remove(f"{STAGING}/{self._token}")
        except StorageError as err:
            log.warning(
                "could not delete the staged files of %s (%s); the next writer there removes them", self.url, err
            )
        self._lease.release()


def stage_manifest(store: Store, staging: str, meta: AtlasDatasetMetadata, rows: list) -> None:
    """The dataset's manifest (manifest.py), staged beside its shards, for the commit to put at the root."""
    manifest = Manifest.from_rows(meta.to_json(), [(n, *row) for n, row in enumerate(rows)])
    store.write(f"{staging}/{MANIFEST}", manifest.encode())
