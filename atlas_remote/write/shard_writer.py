"""One shard written to a local folder, exactly as the original writer writes it, and the block machinery every
writer shares: examples gathered into blocks, one pickle per block, blocks compressed in batches on zstd's own
threads and appended to data.bin on a thread of ours.

Examples are pickled once per block, as the format stores them: an example that cannot be pickled is found when
its block is, and only then are that block's examples pickled one by one to name it (docs/benchmarks.md has what
pickling every example on its own cost).
"""

from __future__ import annotations

import os
import pickle
import shutil
import zlib
from collections.abc import Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from itertools import accumulate, islice
from pathlib import Path
from typing import Any, NoReturn

import numpy as np
import zstandard

from ..errors import UnpicklableExampleError
from ..format.codec import compressor, pickle_block, train_dictionary
from ..format.seal import block_digest, dictionary_digest
from ..format.spec import (
    BLOCKS_FILE,
    DATA_FILE,
    DICT_FILE,
    INDEX_FILE,
    MIN_BLOCKS_FOR_DICTIONARY,
    SHARD_META,
    VERSION,
    AtlasDatasetShardMetadata,
    BlockSums,
    CompressionStrategy,
    encode_blocks,
    encode_index,
)
from .settings import check_writer_arguments

BATCH_BYTES = 1 << 20  # pickled blocks compressed by one zstd call and written by one write
COMPRESSION_THREADS = 2  # zstd's threads for that call (its own, outside the interpreter lock)


class CloseOrDiscard:
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


class Closed:
    """The pending block of a closed writer: adding to it raises, so adding needs no check of its own."""

    def __init__(self, url: str) -> None:
        self.url = url

    def append(self, example: Any) -> None:
        raise ValueError(f"{self.url}: the writer is closed")

    def extend(self, examples: Any) -> None:
        self.append(examples)

    def __len__(self) -> int:
        return 0


class BlockFiller:
    """Examples gathered into blocks, each block pickled once (the format's one pickle per block).

    An example that cannot be pickled is found when its block is: the block's examples are then pickled one by
    one, those that fail are dropped, the others wait for the block to fill as if the refused ones had never been
    given, and UnpicklableExampleError names the first refused one by its number (every add counted from 0).
    So the output is what it would be without the refused examples, and nothing else is lost.
    """

    _room: int  # examples the pending block takes before it is pickled

    def _start_blocks(self, url: str, room: int) -> None:
        self._url = url
        self._block: list | Closed = []
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
    """A shard's data.bin: blocks appended in order, their offsets, CRC-32s and SHA-256s recorded; created with
    the first block, as the original writer creates it.

    Blocks are gathered into batches of BATCH_BYTES. Blocks to compress are compressed by one zstd call per batch,
    on COMPRESSION_THREADS threads of zstd's own, outside the interpreter lock (the same frames as compressing
    each block in turn); each batch is then written by one call on a thread of ours while the caller pickles the
    next. Work handed to a Python thread block by block was tried: that thread waited for the interpreter lock
    after every block, so only whole batches cross (docs/benchmarks.md)."""

    def __init__(self, path: Path, cctx: zstandard.ZstdCompressor | None, checksums: bool) -> None:
        self.path, self._cctx = path, cctx
        self.offsets = [0]
        self.checksums: list[int] | None = [] if checksums else None
        self.digests: list[bytes] = []
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
            self.digests += map(block_digest, batch)
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


class AtlasDatasetShardWriter(BlockFiller, CloseOrDiscard):
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
        self._dictionary_digest = dictionary_digest(self.dictionary)  # of the one its blocks are compressed with
        self._data: _DataFile | None = None
        if strategy == CompressionStrategy.DICTIONARY_COMPRESSION:
            self._held_blocks = []
        else:
            self._data = _DataFile(self.path / DATA_FILE, self.compressor, checksums)
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
        if self._data is not None:
            self._data.add(pickled)
        elif self._held_blocks is not None:
            self._held_blocks.append(pickled)

    def close(self) -> bytes | None:
        """Finish the shard's files (once); returns the dictionary it trained, if it trained one. The last
        block's unpicklable examples are refused here (UnpicklableExampleError; the shard stays open)."""
        if self._closed:
            return None
        self.pickle_pending()
        self._closed = True
        self._block = Closed(str(self.path))
        meta = self.metadata._replace(stored_examples=self.stored_examples)
        trained = None
        data = self._data
        if self._held_blocks is not None:
            if len(self._held_blocks) >= MIN_BLOCKS_FOR_DICTIONARY:
                trained = train_dictionary(self._held_blocks, meta.compression_dict_size, meta.compression_level)
                (self.path / DICT_FILE).write_bytes(trained)
                self._dictionary_digest = dictionary_digest(trained)
            else:
                meta = meta._replace(compression_strategy=CompressionStrategy.STANDARD_COMPRESSION)
            data = self._data = _DataFile(
                self.path / DATA_FILE,
                compressor(meta.compression_strategy, meta.compression_level, trained),
                self._checksums,
            )
            for pickled in self._held_blocks:
                data.add(pickled)
            self._held_blocks = None
        if data is None:
            raise ValueError(f"{self.path}: the shard was discarded")
        data.finish()
        (self.path / INDEX_FILE).write_bytes(encode_index(data.offsets))
        if data.checksums is not None:
            sidecar = encode_blocks(data.offsets, data.checksums, b"".join(data.digests), self._dictionary_digest)
            (self.path / BLOCKS_FILE).write_bytes(sidecar)
        self.metadata = meta
        self.write_meta()
        return trained

    def written(self) -> tuple[list[int], BlockSums | None]:
        """Once closed: the block offsets in data.bin and what blocks are checked against (None without
        checksums)."""
        data = self._data
        if data is None or not self._closed:
            raise ValueError(f"{self.path}: the shard is not closed yet")
        if data.checksums is None:
            return data.offsets, None
        crc32 = np.array(data.checksums, np.uint32)
        return data.offsets, BlockSums(crc32, b"".join(data.digests), self._dictionary_digest)

    def write_meta(self) -> None:
        (self.path / SHARD_META).write_bytes(self.metadata.to_json())

    def discard(self) -> None:
        self._closed = True
        self._block = Closed(str(self.path))
        self._held_blocks = None
        if self._data is not None:
            self._data.abandon()
        shutil.rmtree(self.path, ignore_errors=True)
