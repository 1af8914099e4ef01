"""Writing an Atlas dataset to any fsspec URL, atomically, one writer per URL.

The writer first takes the URL's lease (see lease.py): that also proves the bucket exists and is writable,
before any shard is built. Each shard is built in a local temporary folder, then finished (its last blocks
compressed, its dictionary trained where it has one) and uploaded to a staging prefix inside the dataset URL in
the background while the next shard fills, and deleted locally: local disk holds at most two shards. `close()`
commits (see commit.py): the URL serves the old dataset until the new one is complete, then the new one, never a
mix. A writer that fails before its commit, or leaves its `with` block by an exception, discards everything it
staged.

Examples are pickled once per block, as the format stores them: an example that cannot be pickled is found when
its block is, and only then are that block's examples pickled one by one to name it (docs/benchmarks.md has what
pickling every example on its own cost).
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
from collections.abc import Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass
from itertools import accumulate, islice
from pathlib import Path
from typing import Any, NoReturn, cast

import numpy as np
import zstandard

from .codec import compressor, pickle_block, train_dictionary
from .commit import (
    CommitPlan,
    begin_write,
    commit_and_release,
    refuse_unless_writable,
)
from .errors import FormatError, ObjectNotFoundError, StorageError, UnpicklableExampleError
from .format import (
    BLOCKS_FILE,
    DATA_FILE,
    DICT_FILE,
    INDEX_FILE,
    MIN_BLOCKS_FOR_DICTIONARY,
    SHARD_META,
    VERSION,
    AtlasDatasetMetadata,
    AtlasDatasetShardMetadata,
    BlockSums,
    CompressionStrategy,
    encode_blocks,
    encode_index,
)
from .keys import SigningKey, writer_key
from .layout import STAGING
from .lease import DEFAULT_LEASE_SECONDS
from .manifest import MANIFEST, Manifest, Sidecar, row_of, shard_digest
from .storage import Store, location

log = logging.getLogger(__name__)
BATCH_BYTES = 1 << 20  # pickled blocks compressed by one zstd call and written by one write
COMPRESSION_THREADS = 2  # zstd's threads for that call (its own, outside the interpreter lock)


class _CloseOrDiscard:
    """A `with` block that finishes the work when it ends normally and throws it away when it raises, or when
    finishing fails (the original writer closes, and so publishes, half-written data after an exception)."""

    def close(self) -> Any:
        raise NotImplementedError

    def discard(self) -> None:
        raise NotImplementedError

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc_value, traceback) -> None:
        if exc_type is not None:
            self.discard()
            return
        try:
            self.close()
        except BaseException:
            self.discard()  # nothing once the commit's point of no return is passed: close() says so
            raise


class _Closed:
    """The pending block of a closed writer: adding to it raises, so adding needs no check of its own."""

    def __init__(self, url: str) -> None:
        self.url = url

    def append(self, example: Any) -> None:
        raise ValueError(f"{self.url}: the writer is closed")

    def extend(self, examples: Any) -> None:
        self.append(examples)

    def __len__(self) -> int:
        return 0


class _BlockFiller:
    """Examples gathered into blocks, each block pickled once (the format's one pickle per block).

    An example that cannot be pickled is found when its block is: the block's examples are then pickled one by
    one, those that fail are dropped, the others wait for the block to fill as if the refused ones had never been
    given, and UnpicklableExampleError names the first refused one by its number (every add counted from 0).
    So the output is what it would be without the refused examples, and nothing else is lost.
    """

    _room: int  # examples the pending block takes before it is pickled

    def _start_blocks(self, url: str, room: int) -> None:
        self._url = url
        self._block: list | _Closed = []
        self._room = room
        self._first = 0  # the number of the pending block's first example
        self._refused: list[int] = []  # numbers of the examples refused from the pending block

    def add_example(self, example: Any) -> None:
        """Add one example. One that cannot be pickled is refused when its block is pickled, by this call, a later
        one or close(), with UnpicklableExampleError naming it; the others are kept and the writer goes on."""
        block = self._block
        block.append(example)
        if len(block) >= self._room:
            self._block_full()

    def add_examples(self, examples: Iterable[Any]) -> None:
        """add_example for each, without a Python call per example. After UnpicklableExampleError the iterator
        is read up to the block that failed: pass it again to go on."""
        iterator = iter(examples)
        while True:
            block = self._block
            block.extend(islice(iterator, self._room - len(block)))
            if len(block) < self._room:
                return
            self._block_full()

    def pickle_pending(self) -> None:
        """Pickle the examples still waiting for their block to fill, as the last block (close() does this first,
        so that an unpicklable one among them is refused while the writer is still open)."""
        if self._block:
            self._block_full()

    def _block_full(self) -> None:
        """Pickle the pending block (full, or the last one) and hand it on."""
        block = self._block
        assert isinstance(block, list)
        try:
            pickled = pickle_block(block)
        except Exception as err:
            self._refuse(block, err)
        self._block = []
        self._first += len(block) + len(self._refused)
        self._refused = []
        self._take(pickled, block)

    def _take(self, pickled: bytes, block: list) -> None:
        raise NotImplementedError

    def _numbers(self, count: int) -> list[int]:
        """The numbers of the pending block's examples (refused ones leave gaps)."""
        numbers: list[int] = []
        number, refused = self._first, set(self._refused)
        while len(numbers) < count:
            if number not in refused:
                numbers.append(number)
            number += 1
        return numbers

    def _refuse(self, block: list, err: Exception) -> NoReturn:
        numbers = self._numbers(len(block))
        bad = []
        for position, example in enumerate(block):
            try:
                pickle.dumps(example, protocol=pickle.DEFAULT_PROTOCOL)
            except Exception as one:
                bad.append((position, one))
        if not bad:  # each pickles alone but not together (a pickler's state, recursion depth): the block goes
            bad = [(position, err) for position in range(len(block))]
        for position, _ in reversed(bad):
            del block[position]
        refused = [numbers[position] for position, _ in bad]
        self._refused = sorted(self._refused + refused)
        position, first_error = bad[0]
        others = f" (and #{', #'.join(map(str, refused[1:]))} of the same block)" if len(refused) > 1 else ""
        raise UnpicklableExampleError(
            f"example #{refused[0]}{others} (counting every example added from 0) cannot be pickled "
            f"({type(first_error).__name__}: {first_error}); found when its block was pickled, it was dropped, "
            f"the other examples are kept and the writer can go on",
            example_index=refused[0],
            refused=refused,
            url=self._url,
        ) from first_error


class _DataFile:
    """A shard's data.bin: blocks appended in order, their offsets and CRC-32s recorded; created with the first
    block, as the original writer creates it.

    Blocks are gathered into batches of BATCH_BYTES. Blocks to compress are compressed by one zstd call per batch,
    on COMPRESSION_THREADS threads of zstd's own, outside the interpreter lock (the same frames as compressing
    each block in turn); each batch is then written by one call on a thread of ours while the caller pickles the
    next. Work handed to a Python thread block by block was tried: that thread waited for the interpreter lock
    after every block, so only whole batches cross (docs/benchmarks.md)."""

    def __init__(
        self, path: Path, cctx: zstandard.ZstdCompressor | None, checksums: bool, key: SigningKey | None
    ) -> None:
        self.path, self._cctx, self.key = path, cctx, key if checksums else None
        self.offsets = [0]
        self.checksums: list[int] | None = [] if checksums else None
        self.macs: list[bytes] | None = [] if self.key is not None else None
        self._file: Any = None
        self._batch: list[bytes] = []
        self._batch_bytes = 0
        self._thread: ThreadPoolExecutor | None = None
        self._writing: Future | None = None

    def add(self, pickled: bytes) -> None:
        self._batch.append(pickled)
        self._batch_bytes += len(pickled)
        if self._batch_bytes >= BATCH_BYTES:
            self._write_batch()

    def _write_batch(self, last: bool = False) -> None:
        batch: Any = self._batch
        self._batch, self._batch_bytes = [], 0
        if self._cctx is not None:
            compressed = self._cctx.multi_compress_to_buffer(batch, threads=COMPRESSION_THREADS)
            batch = [compressed[i] for i in range(len(compressed))]
        self.offsets += accumulate(map(len, batch), initial=self.offsets.pop())  # its first value: the one popped
        if self.checksums is not None:
            self.checksums += map(zlib.crc32, batch)
        if self.macs is not None:
            self.macs += map(cast(SigningKey, self.key).sign, batch)
        if last and self._thread is None:  # a shard of one batch: no thread for it
            self._write(batch)
            return
        if self._thread is None:
            self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="atlas-write")
        if self._writing is not None:
            self._writing.result()
        self._writing = self._thread.submit(self._write, batch)

    def _write(self, batch: list) -> None:
        if self._file is None:
            self._file = open(self.path, "wb")
        self._file.write(b"".join(batch))

    def finish(self) -> None:
        """Write what is left and close the file."""
        try:
            if self._batch:
                self._write_batch(last=True)
            if self._writing is not None:
                self._writing.result()
        finally:
            self.abandon()

    def abandon(self) -> None:
        self._batch = []
        if self._thread is not None:
            self._thread.shutdown()
        if self._file is not None:
            self._file.close()


class AtlasDatasetShardWriter(_BlockFiller, _CloseOrDiscard):
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
        self._stored = 0  # examples in blocks pickled
        self._held_blocks: list[bytes] | None = None  # DICTIONARY_COMPRESSION: pickled blocks awaiting the dictionary
        self._checksums = checksums
        self._key = writer_key() if checksums else None  # blocks signed as they are compressed
        self._data: _DataFile | None = None
        if strategy == CompressionStrategy.DICTIONARY_COMPRESSION:
            self._held_blocks = []
        else:
            self._data = _DataFile(self.path / DATA_FILE, self.compressor, checksums, self._key)
        self._closed = False
        self._start_blocks(str(self.path), block_size)
        self.path.mkdir(parents=True)

    @property
    def stored_examples(self) -> int:
        """Examples added (the original's attribute): those in blocks and those waiting for theirs to fill."""
        return self._stored + len(self._block)

    def __len__(self) -> int:
        return self.stored_examples

    def _take(self, pickled: bytes, block: list) -> None:
        self.add_pickled_block(pickled, len(block))

    def add_pickled_block(self, pickled: bytes, examples: int) -> None:
        """A block pickled by the caller (a part writer gathers its own blocks)."""
        self._stored += examples
        if self._held_blocks is not None:
            self._held_blocks.append(pickled)
        else:
            self._data.add(pickled)

    def close(self) -> bytes | None:
        """Finish the shard's files (once); returns the dictionary it trained, if it trained one. The last
        block's unpicklable examples are refused here (UnpicklableExampleError; the shard stays open)."""
        if self._closed:
            return None
        self.pickle_pending()
        self._closed = True
        self._block = _Closed(str(self.path))
        meta = self.metadata._replace(stored_examples=self.stored_examples)
        trained = None
        if self._held_blocks is not None:
            if len(self._held_blocks) >= MIN_BLOCKS_FOR_DICTIONARY:
                trained = train_dictionary(self._held_blocks, meta.compression_dict_size, meta.compression_level)
                (self.path / DICT_FILE).write_bytes(trained)
            else:
                meta = meta._replace(compression_strategy=CompressionStrategy.STANDARD_COMPRESSION)
            self._data = _DataFile(
                self.path / DATA_FILE,
                compressor(meta.compression_strategy, meta.compression_level, trained),
                self._checksums,
                self._key,
            )
            for pickled in self._held_blocks:
                self._data.add(pickled)
            self._held_blocks = None
        self._data.finish()
        (self.path / INDEX_FILE).write_bytes(encode_index(self._data.offsets))
        if self._data.checksums is not None:
            key_id = self._key.id if self._key is not None else None
            sidecar = encode_blocks(self._data.offsets, self._data.checksums, self._data.macs, key_id)
            (self.path / BLOCKS_FILE).write_bytes(sidecar)
        self.metadata = meta
        self.write_meta()
        return trained

    def written(self) -> tuple[list[int], BlockSums | None]:
        """Once closed: the block offsets in data.bin and what blocks are checked against (None without
        checksums)."""
        data = cast(_DataFile, self._data)
        if data.checksums is None:
            return data.offsets, None
        macs = b"".join(data.macs) if data.macs is not None else None
        return data.offsets, BlockSums(np.array(data.checksums, np.uint32), macs, data.key.id if data.key else None)

    def write_meta(self) -> None:
        (self.path / SHARD_META).write_bytes(self.metadata.to_json())

    def discard(self) -> None:
        self._closed = True
        self._block = _Closed(str(self.path))
        self._held_blocks = None
        if self._data is not None:
            self._data.abandon()
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


@dataclass(frozen=True)
class _FinishedShard:
    """One shard of a part, closed: what its manifest says of it."""

    size: int
    files: list[str]
    row: list  # its row of the dataset's manifest
    stored_bytes: int


class PartWriter(_BlockFiller):
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
        settings: ShardSettings,
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
        self._start_blocks(name_in_errors or store.url, min(settings.block_size, settings.shard_size))

    def __len__(self) -> int:
        return self._stored + len(self._block)

    def _take(self, pickled: bytes, block: list) -> None:
        if self._shard is None:
            self._shard = self._new_shard()
        self._shard.add_pickled_block(pickled, len(block))
        self._stored += len(block)
        self._in_shard += len(block)
        if self._in_shard == self.settings.shard_size:
            self._finish_shard()
        self._room = min(self.settings.block_size, self.settings.shard_size - self._in_shard)

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
        stored = sum(os.path.getsize(folder / name) for name in files)
        if not self._in_place:
            if number == 0 and self._trains_dictionary and self._shared_dict is not None:
                self._store.upload(self._dictionary_file(), f"{self._staging}/{DICT_FILE}")
            for name in files:
                self._store.upload(str(folder / name), f"{self._staging}/{self._prefix}{number}/{name}")
            shutil.rmtree(folder)
        self._finished.append(_FinishedShard(meta.stored_examples, files, row, stored))

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
        self._block = _Closed(self._url)
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
        )

    def abandon(self) -> None:
        """Stop without finishing (what was uploaded stays staged, for the caller to delete or keep)."""
        self._block = _Closed(self._url)
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
        # the part's own methods, so that adding an example is one Python call (it refuses once closed)
        self.add_example = self._part.add_example  # type: ignore[method-assign]
        self.add_examples = self._part.add_examples  # type: ignore[method-assign]
        self._closed = False

    def __len__(self) -> int:
        return len(self._part)

    def add_example(self, example: Any) -> None:
        """Add one example. One that cannot be pickled is refused when its block is pickled, by this call, a later
        one or close(), with UnpicklableExampleError naming it; the others are kept and the writer goes on."""
        self._part.add_example(example)

    def add_examples(self, examples: Iterable[Any]) -> None:
        """add_example for each, without a Python call per example (see PartWriter.add_examples)."""
        self._part.add_examples(examples)

    def close(self) -> None:
        """Finish the last shard, upload it, and commit the dataset (see commit.py for the guarantee).

        Unpicklable examples of the last block are refused first (UnpicklableExampleError, the writer still open:
        close() again commits the others). A failure after that and before the commit's point of no return
        discards what was staged and leaves the URL as it was; a failure after it raises CommitInterruptedError,
        and `recover(url)` (or the next writer) finishes it.
        """
        if self._closed:
            return
        self._part.pickle_pending()
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
            remove_staged(self._store, self._token)
        except StorageError as err:
            log.warning(
                "could not delete the staged files of %s (%s); the next writer there removes them", self.url, err
            )
        self._lease.release()


def stage_manifest(store: Store, staging: str, meta: AtlasDatasetMetadata, rows: list) -> None:
    """The dataset's manifest (manifest.py), staged beside its shards, for the commit to put at the root."""
    manifest = Manifest.from_rows(meta.to_json(), [(n, *row) for n, row in enumerate(rows)])
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
