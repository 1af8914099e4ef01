"""Writing an Atlas dataset to any fsspec URL, atomically.

Each shard is built in a local temporary folder, uploaded to a staging prefix inside the dataset URL as soon
as it is finished (in the background, while the next shard fills), and deleted locally: local disk holds at
most two shards. `close()` commits: it moves the staged shards to their final zero-padded names and writes
the root meta.json last. Until that file exists no reader opens the dataset; a writer that fails, is
interrupted or leaves its `with` block by an exception discards everything it staged.
"""

from __future__ import annotations

import logging
import os
import pickle
import shutil
import tempfile
import uuid
import zlib
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import replace
from typing import Any

from .codec import compressor, pickle_block, train_dictionary
from .errors import AtlasError, DatasetExistsError, StorageError
from .format import (
    CHECKSUM_FILE,
    DATA_FILE,
    DICT_FILE,
    INDEX_FILE,
    MIN_BLOCKS_FOR_DICTIONARY,
    ROOT_META,
    SHARD_META,
    VERSION,
    CompressionStrategy,
    DatasetMeta,
    ShardMeta,
    encode_checksums,
    encode_index,
    parse_shard_name,
    shard_name,
)
from .storage import Store

log = logging.getLogger(__name__)

STAGING = ".atlas-staging"  # hidden from readers: not a shard name, and gone once the dataset is committed
SHARD_FILES = {SHARD_META, DATA_FILE, INDEX_FILE, DICT_FILE, CHECKSUM_FILE}


class UnpicklableExampleError(AtlasError, TypeError):
    """An example could not be pickled; it was not added and the writer can go on."""


class AtlasDatasetShardWriter:
    """Builds one shard in a local folder, following the spec and the original writer exactly.

    Blocks are pickled, compressed and appended to data.bin as they fill, except with DICTIONARY_COMPRESSION,
    where they are kept in memory until close() trains the shard's dictionary on them (falling back to
    STANDARD_COMPRESSION when there are fewer than 7 blocks).
    """

    def __init__(
        self,
        folder: str,
        block_size: int,
        compression_strategy: CompressionStrategy = CompressionStrategy.DICTIONARY_COMPRESSION,
        compression_level: int = 3,
        compression_dict: bytes | None = None,
        compression_dict_size: float = 0.01,
        first_example: int = 0,
        checksums: bool = True,
    ) -> None:
        strategy = CompressionStrategy(compression_strategy)
        if strategy == CompressionStrategy.SHARED_DICTIONARY_COMPRESSION and compression_dict is None:
            raise ValueError("SHARED_DICTIONARY_COMPRESSION needs the shared dictionary (compression_dict)")
        self.folder = folder
        self.meta = ShardMeta(VERSION, block_size, 0, strategy, compression_level, compression_dict_size)
        self.dictionary = compression_dict if strategy == CompressionStrategy.SHARED_DICTIONARY_COMPRESSION else None
        self.first_example = first_example  # global number of this shard's first example, for error messages
        self._compressor = compressor(strategy, compression_level, self.dictionary)
        self._block: list = []
        self._held_blocks: list[bytes] = []  # DICTIONARY_COMPRESSION: pickled blocks awaiting the dictionary
        self._offsets = [0]
        self._checksums: list[int] | None = [] if checksums else None
        self._stored = 0
        os.makedirs(folder, exist_ok=True)
        self._data = open(os.path.join(folder, DATA_FILE), "wb")

    def __len__(self) -> int:
        return self._stored

    def add_example(self, example: Any) -> None:
        """Add one example; one that cannot be pickled is refused here, before anything is added."""
        try:
            pickle.dumps(example, protocol=pickle.DEFAULT_PROTOCOL)
        except Exception as err:
            raise UnpicklableExampleError(
                f"{self.folder}: example number {self.first_example + self._stored} (counting from 0 in the order "
                f"added) cannot be pickled ({type(err).__name__}: {err}); it was not added, nothing else changed"
            ) from err
        self._block.append(example)
        self._stored += 1
        if len(self._block) == self.meta.block_size:
            self._flush_block()

    def _flush_block(self) -> None:
        pickled = pickle_block(self._block)
        self._block = []
        if self.meta.compression_strategy == CompressionStrategy.DICTIONARY_COMPRESSION:
            self._held_blocks.append(pickled)
        else:
            self._append(self._compressor.compress(pickled) if self._compressor else pickled)

    def _append(self, block: bytes) -> None:
        self._data.write(block)
        self._offsets.append(self._offsets[-1] + len(block))
        if self._checksums is not None:
            self._checksums.append(zlib.crc32(block))

    def close(self) -> tuple[ShardMeta, bytes | None]:
        """Finish the shard's files; returns its metadata and, if it trained one, its dictionary."""
        if self._block:
            self._flush_block()
        meta = replace(self.meta, stored_examples=self._stored)
        trained = None
        if meta.compression_strategy == CompressionStrategy.DICTIONARY_COMPRESSION:
            if len(self._held_blocks) >= MIN_BLOCKS_FOR_DICTIONARY:
                trained = train_dictionary(self._held_blocks, meta.compression_dict_size, meta.compression_level)
                with open(os.path.join(self.folder, DICT_FILE), "wb") as f:
                    f.write(trained)
            else:
                meta = replace(meta, compression_strategy=CompressionStrategy.STANDARD_COMPRESSION)
            cctx = compressor(meta.compression_strategy, meta.compression_level, trained)
            for pickled in self._held_blocks:
                self._append(cctx.compress(pickled))
            self._held_blocks = []
        self._data.close()
        with open(os.path.join(self.folder, INDEX_FILE), "wb") as f:
            f.write(encode_index(self._offsets))
        if self._checksums is not None:
            with open(os.path.join(self.folder, CHECKSUM_FILE), "wb") as f:
                f.write(encode_checksums(self._checksums))
        self.meta = meta
        self.write_meta()
        return meta, trained

    def write_meta(self) -> None:
        with open(os.path.join(self.folder, SHARD_META), "wb") as f:
            f.write(self.meta.to_json())

    def discard(self) -> None:
        self._data.close()
        shutil.rmtree(self.folder, ignore_errors=True)


class AtlasDatasetWriter:
    """Writes an Atlas v1 dataset to a local path or any fsspec URL; the dataset appears only when committed.

    Use it as a context manager: leaving the block normally commits, leaving it by an exception discards.
    With checksums=True (the default) each shard folder also gets block_checksums.npy, a CRC-32 per block that
    readers verify; the original reader ignores the file.
    Writing to a URL that already holds a committed dataset is refused unless overwrite=True; with
    overwrite=True the old dataset stays readable until the new one is complete.
    """

    def __init__(
        self,
        url: str,
        shard_size: int,
        block_size: int,
        compression_strategy: CompressionStrategy = CompressionStrategy.SHARED_DICTIONARY_COMPRESSION,
        compression_level: int = 3,
        compression_dict_size: float = 0.01,
        storage_options: dict[str, Any] | None = None,
        *,
        overwrite: bool = False,
        checksums: bool = True,
    ) -> None:
        if not isinstance(shard_size, int) or shard_size <= 0:
            raise ValueError(f"shard_size must be a positive integer, got {shard_size!r}")
        if not isinstance(block_size, int) or block_size <= 0:
            raise ValueError(f"block_size must be a positive integer, got {block_size!r}")
        if not 0.0 <= compression_dict_size <= 1.0:
            raise ValueError(f"compression_dict_size must be between 0 and 1, got {compression_dict_size!r}")
        self.url = str(url)
        self.shard_size = shard_size
        self.block_size = block_size
        self.compression_strategy = CompressionStrategy(compression_strategy)
        self.compression_level = compression_level
        self.compression_dict_size = compression_dict_size
        self.overwrite = overwrite
        self.checksums = checksums
        self._store = Store(url, storage_options)
        if not self._store.can_list:
            raise StorageError(f"{self.url}: HTTP(S) URLs are read-only; write to the bucket or folder behind them")
        if self._store.exists(ROOT_META):
            if not overwrite:
                raise DatasetExistsError(f"{self.url} already holds a committed Atlas dataset; pass overwrite=True to replace it")
            self._store.remove(STAGING)
        else:
            _clear_uncommitted(self._store)
        self._staging = f"{STAGING}/{uuid.uuid4().hex[:12]}"
        self._local = tempfile.mkdtemp(prefix="atlas-remote-")
        self._uploader = ThreadPoolExecutor(max_workers=1, thread_name_prefix="atlas-upload")
        self._upload: Future | None = None
        self._shard_sizes: list[int] = []
        self._shard_files: list[set[str]] = []
        self._shared_dict: bytes | None = None
        self._closed = False
        self._shard = self._new_shard()

    def __len__(self) -> int:
        return sum(self._shard_sizes) + len(self._shard)

    def _new_shard(self) -> AtlasDatasetShardWriter:
        number = len(self._shard_sizes)
        strategy = self.compression_strategy
        if strategy == CompressionStrategy.SHARED_DICTIONARY_COMPRESSION and number == 0:
            strategy = CompressionStrategy.DICTIONARY_COMPRESSION  # the first shard trains the shared dictionary
        return AtlasDatasetShardWriter(
            os.path.join(self._local, str(number)), self.block_size, strategy, self.compression_level,
            self._shared_dict, self.compression_dict_size, first_example=sum(self._shard_sizes),
            checksums=self.checksums,
        )

    def add_example(self, example: Any) -> None:
        if self._closed:
            raise ValueError(f"{self.url}: the writer is closed")
        if len(self._shard) == self.shard_size:
            self._finish_shard()
            self._shard = self._new_shard()
        self._shard.add_example(example)

    def _finish_shard(self) -> None:
        number = len(self._shard_sizes)
        meta, trained = self._shard.close()
        if number == 0 and self.compression_strategy == CompressionStrategy.SHARED_DICTIONARY_COMPRESSION:
            if trained is None:  # fewer than 7 blocks in the first shard: the whole dataset falls back
                self.compression_strategy = CompressionStrategy.STANDARD_COMPRESSION
            else:
                self._shared_dict = trained
                os.replace(os.path.join(self._shard.folder, DICT_FILE), os.path.join(self._local, DICT_FILE))
                self._shard.meta = replace(meta, compression_strategy=CompressionStrategy.SHARED_DICTIONARY_COMPRESSION)
                self._shard.write_meta()
        self._shard_sizes.append(meta.stored_examples)
        self._shard_files.append(set(os.listdir(self._shard.folder)))
        self._wait_for_upload()
        self._upload = self._uploader.submit(self._upload_shard, number, self._shard.folder)

    def _upload_shard(self, number: int, folder: str) -> None:
        if number == 0 and self._shared_dict is not None:
            self._store.upload(os.path.join(self._local, DICT_FILE), f"{self._staging}/{DICT_FILE}")
        for name in sorted(os.listdir(folder)):
            self._store.upload(os.path.join(folder, name), f"{self._staging}/{number}/{name}")
        shutil.rmtree(folder)

    def _wait_for_upload(self) -> None:
        if self._upload is not None:
            upload, self._upload = self._upload, None
            upload.result()

    def close(self) -> None:
        """Finish the last shard, upload it, and commit the dataset (root meta.json written last)."""
        if self._closed:
            return
        try:
            self._finish_shard()
            self._wait_for_upload()
            self._commit()
        except BaseException:
            self.discard()
            raise
        self._closed = True
        self._cleanup_local()

    def _commit(self) -> None:
        store, count = self._store, len(self._shard_sizes)
        if store.exists(ROOT_META):
            if not self.overwrite:
                raise DatasetExistsError(f"{self.url}: another writer committed a dataset here while this one was writing")
            store.remove(ROOT_META)  # the old dataset disappears at once, never half-replaced
        _clear_uncommitted(store, keep=self._staging)
        for number, files in enumerate(self._shard_files):
            for name in sorted(files):
                store.promote(f"{self._staging}/{number}/{name}", f"{shard_name(number, count)}/{name}")
        if self._shared_dict is not None:
            store.promote(f"{self._staging}/{DICT_FILE}", DICT_FILE)
        store.write(ROOT_META, DatasetMeta(VERSION, self._shard_sizes, self.compression_strategy).to_json())
        store.remove(STAGING)
        log.info("committed %s: %d examples in %d shards", self.url, sum(self._shard_sizes), count)

    def discard(self) -> None:
        """Abandon the dataset being written: nothing is committed, staged uploads are deleted."""
        if self._closed:
            return
        self._closed = True
        try:
            self._wait_for_upload()
        except BaseException as err:  # the upload's own failure is what the caller is already handling
            log.debug("upload failed while discarding %s: %s", self.url, err)
        try:
            self._store.remove(self._staging)
        except StorageError as err:
            log.warning("could not delete the staged files of %s (%s); the next writer there removes them", self.url, err)
        self._cleanup_local()

    def _cleanup_local(self) -> None:
        self._uploader.shutdown(wait=True)
        self._shard.discard()
        shutil.rmtree(self._local, ignore_errors=True)

    def __enter__(self) -> AtlasDatasetWriter:
        return self

    def __exit__(self, exc_type, exc_value, traceback) -> None:
        if exc_type is None:
            self.close()
        else:
            self.discard()


def _clear_uncommitted(store: Store, keep: str | None = None) -> None:
    """Delete what crashed writers left at a URL holding no committed dataset: staging, shard folders, dict.

    A folder with a shard-like name is deleted only if it holds nothing but Atlas shard files, so a writer
    pointed at the wrong folder never deletes user data; anything else there makes the writer refuse.
    """
    try:
        names = store.list_names()
    except FileNotFoundError:
        return
    for name in names:
        if name == STAGING:
            if keep is None:
                store.remove(STAGING)
            else:
                for token in store.list_names(STAGING):
                    if f"{STAGING}/{token}" != keep:
                        store.remove(f"{STAGING}/{token}")
        elif name == DICT_FILE:
            store.remove(DICT_FILE)
        elif parse_shard_name(name) is not None and set(store.list_names(name)) <= SHARD_FILES:
            store.remove(name)
        else:
            raise DatasetExistsError(
                f"{store.url_of()} is not empty and does not hold an Atlas dataset ({name!r} is there); "
                f"write to an empty location"
            )
