"""Opening one shard: what its blocks are read with once open (`OpenShard`), which of its files to fetch in its one round trip (`plan_fetch`), and the checks what came
back must pass before its blocks are read (the index against meta.json and data.bin's size, the sidecars, the
bound on a block, the seal of a signed shard: `signer_of`). The shard table (shards.py) runs the plan and keeps
what passed."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import NamedTuple, Protocol

import numpy as np

from ..errors import AtlasError, CorruptBlockError, FormatError, ObjectNotFoundError
from ..format.codec import BlockDecoder
from ..format.manifest import Manifest, Sidecar
from ..format.seal import content_digest, placed
from ..format.spec import (
    BLOCKS_FILE,
    CHECKSUM_FILE,
    DATA_FILE,
    DICT_FILE,
    INDEX_FILE,
    ROOT_META,
    SHARD_META,
    AtlasDatasetShardMetadata,
    BlockSums,
    CompressionStrategy,
    decode_blocks,
    decode_checksums,
    decode_index,
)
from ..storage import ObjectIdentity, Store
from ..storage.ranges import ByteRange
from ..trust.keys import Trust
from .options import ReaderOptions

MAP_FROM_BYTES = 1 << 20  # a smaller index is read: a mapping holds a file descriptor while its shard is open
Got = dict[str, "bytes | AtlasError"]  # what a plan's files came back as, by the plan's names


class OpenShard(NamedTuple):
    """What an opened shard's blocks are read with: fetched once, kept while the table's bound allows."""

    meta: AtlasDatasetShardMetadata
    offsets: np.ndarray  # the index's N+1 offsets, as loaded (a memmap when the index is memory-mapped)
    bounds: np.ndarray  # the same as an ndarray (indexing a memmap goes through Python; its ndarray view does not)
    sums: BlockSums | None  # what each stored block is checked against, when the writer recorded it
    signer: str | None  # the id of the trusted key whose seal it passed: its blocks' SHA-256s are checked, and
    # they are not walked; None: a stranger's (CRC-32s, if any, are checked)
    sidecar: Sidecar
    decoder: BlockDecoder
    identity: ObjectIdentity  # of data.bin, when the shard was opened
    data_file: str
    size: int
    name: str

    def block_range(self, block: int) -> ByteRange:
        return ByteRange(self.data_file, self.bounds.item(block), self.bounds.item(block + 1))

    def file(self, name: str) -> str:
        return f"{self.name}/{name}" if self.name else name

    def examples_in_block(self, block: int) -> int:
        return min(self.meta.block_size, self.size - block * self.meta.block_size)

    @property
    def checksums(self) -> np.ndarray | None:
        """Each stored block's CRC-32, when the writer recorded them."""
        return self.sums.crc32 if self.sums is not None else None

    @property
    def nbytes(self) -> int:
        """What keeping it open costs: its offsets, checksums and signatures (a dictionary of its own too)."""
        own = len(self.decoder.dictionary or b"") if self.meta.compression_strategy == 3 else 0
        sums = self.sums.crc32.nbytes + len(self.sums.digests or b"") if self.sums is not None else 0
        return 1024 + self.bounds.nbytes + sums + own


class FetchPlan(NamedTuple):
    """What one shard's open fetches: its files by name (`wanted`: name -> (path, kind)), and what is asked
    beside them."""

    meta: AtlasDatasetShardMetadata | None  # known already (the manifest's copy, or an earlier open's)
    row: int | None  # the shard's row in the manifest
    sidecar: Sidecar | None  # which sidecar the manifest says it has (None: unknown, all are asked for)
    need_identity: bool  # data.bin's size and version asked for beside the reads
    mapped: bool  # index.npy memory-mapped rather than read
    data_file: str
    index_path: str
    wanted: dict[str, tuple[str, str]]


def plan_fetch(
    shard: _ShardLike,
    manifest: Manifest | None,
    strategy: int,
    options: ReaderOptions,
    store: Store,
    every_file: bool,
    have_shared_dictionary: bool,
) -> FetchPlan:
    """A shard the manifest describes: its index.npy and block_checksums.npy (if the manifest says it has one).
    Any other, or with `every_file` (verify looks at every file): its meta.json, index.npy, every sidecar, and
    data.bin's identity. Either way its own dictionary, or the shared one if no shard brought it yet."""
    row = manifest.entry(shard.number) if manifest is not None else None
    meta = None if every_file else manifest.meta(row) if manifest is not None and row is not None else shard.meta
    data_file, index_path = shard.file(DATA_FILE), shard.file(INDEX_FILE)
    # data.bin's size is in the manifest; its version is asked for only where nothing else would tell a
    # rewritten data.bin (a shard without checksums: reads are then conditional on it) or blocks are kept on
    # disk (keyed by it)
    sidecar = None if manifest is None or row is None or every_file else Sidecar(int(manifest.checksums[row]))
    need_identity = sidecar is None or sidecar == Sidecar.NONE or options.disk_cache is not None or every_file
    mapped = (
        sidecar != Sidecar.BLOCKS and options.mmap_index and store.is_local and _worth_mapping(store.path(index_path))
    )
    wanted: dict[str, tuple[str, str]] = {}
    if meta is None:
        wanted["meta"] = (shard.file(SHARD_META), "meta")
    if sidecar in (None, Sidecar.BLOCKS):
        wanted["blocks"] = (shard.file(BLOCKS_FILE), "index")
    if sidecar != Sidecar.BLOCKS and not mapped:
        wanted["index"] = (index_path, "index")
    if sidecar in (None, Sidecar.CHECKSUMS):
        wanted["checksums"] = (shard.file(CHECKSUM_FILE), "checksums")
    if strategy == CompressionStrategy.DICTIONARY_COMPRESSION:
        wanted["dict"] = (shard.file(DICT_FILE), "dict")
    elif strategy == CompressionStrategy.SHARED_DICTIONARY_COMPRESSION and not have_shared_dictionary:
        wanted["dict"] = (DICT_FILE, "dict")  # the first shard opened brings the shared dictionary too
    return FetchPlan(meta, row, sidecar, need_identity, mapped, data_file, index_path, wanted)


class _ShardLike(Protocol):
    """What a plan needs of a shard (shards.Shard)."""

    number: int
    size: int
    meta: AtlasDatasetShardMetadata | None

    def file(self, name: str) -> str: ...


def _worth_mapping(path: str) -> bool:
    """Only a large index is memory-mapped: each mapping keeps a descriptor open, and a 1,500-shard dataset once
    ran out of them (ulimit -n 1024); the shard LRU's byte bound then bounds the mappings too."""
    try:
        return os.path.getsize(path) >= MAP_FROM_BYTES
    except OSError:
        return False  # missing: the read reports it


def parse_meta(where: str, number: int, size: int, raw: bytes | AtlasError) -> AtlasDatasetShardMetadata:
    """A shard's meta.json, which must hold as many examples as the root says the shard holds."""
    if isinstance(raw, AtlasError):
        raise raw
    meta = AtlasDatasetShardMetadata.from_json(raw, where)
    if meta.stored_examples != size:
        raise FormatError(
            f"stored_examples is {meta.stored_examples} but the root {ROOT_META} says shard {number} holds {size}",
            path=where,
        )
    return meta


def offsets_and_sums(
    file: Callable[[str], str], meta: AtlasDatasetShardMetadata, got: dict, mapped: bool, store: Store
) -> tuple[np.ndarray, BlockSums | None, Sidecar]:
    """The block offsets and what blocks are checked against, from atlas_blocks.npy if the shard has one, else
    from index.npy and block_checksums.npy (if it has one)."""
    for name in ("blocks", "index", "checksums"):  # a missing sidecar is a shard without it; not so the index
        raw = got.get(name)
        if isinstance(raw, AtlasError) and not (isinstance(raw, ObjectNotFoundError) and name != "index"):
            raise raw
    raw_blocks, index_path = got.get("blocks"), file(INDEX_FILE)
    if isinstance(raw_blocks, AtlasError) and "index" not in got and not mapped:
        raise raw_blocks  # the manifest says this shard has one
    if isinstance(raw_blocks, bytes):
        offsets, sums = decode_blocks(raw_blocks, meta, file(BLOCKS_FILE))
        raw_index = got.get("index")  # fetched too (no manifest, or verify): the original reader's must agree
        if isinstance(raw_index, bytes) and not np.array_equal(decode_index(raw_index, meta, index_path), offsets):
            raise FormatError(
                f"its offsets differ from {BLOCKS_FILE}'s, which atlas_remote reads: the format's original "
                f"reader would read other bytes as blocks (the shard is damaged)",
                path=index_path,
            )
        return offsets, sums, Sidecar.BLOCKS
    if mapped:
        offsets = decode_index(store.map_file(index_path, "index"), meta, index_path)
    else:
        raw_index = got["index"]
        assert isinstance(raw_index, bytes)  # a failed read of the index was raised above
        offsets = decode_index(raw_index, meta, index_path)
    raw_sums = got.get("checksums")
    if isinstance(raw_sums, bytes):
        crc32 = decode_checksums(raw_sums, meta, file(CHECKSUM_FILE))
        return offsets, BlockSums(crc32, None, None), Sidecar.CHECKSUMS
    return offsets, None, Sidecar.NONE


def _offsets_file(file: Callable[[str], str], sidecar: Sidecar) -> str:
    return file(BLOCKS_FILE) if sidecar == Sidecar.BLOCKS else file(INDEX_FILE)


def check_block_bound(offsets: np.ndarray, max_block_bytes: int, file: Callable[[str], str], sidecar: Sidecar) -> None:
    """No block above max_block_bytes: a larger one means a damaged index, refused before anything is allocated."""
    largest = int(np.diff(offsets).max(initial=0))
    if largest > max_block_bytes:
        raise FormatError(
            f"the index gives a block of {largest:,} bytes, above max_block_bytes: it is probably damaged "
            f"(if blocks really are this large, raise max_block_bytes)",
            path=_offsets_file(file, sidecar),
        )


def check_data_size(offsets: np.ndarray, data_bytes: int, file: Callable[[str], str], sidecar: Sidecar) -> None:
    """The blocks end where data.bin does."""
    if int(offsets[-1]) != data_bytes:
        raise FormatError(
            f"the blocks end at byte {int(offsets[-1])} but {DATA_FILE} holds {data_bytes} bytes: "
            f"{'atlas_blocks.npy' if sidecar == Sidecar.BLOCKS else 'index.npy'} does not match data.bin",
            path=_offsets_file(file, sidecar),
        )


def signer_of(
    trust: Trust,
    manifest: Manifest | None,
    row: int | None,
    number: int,
    meta: AtlasDatasetShardMetadata,
    offsets: np.ndarray,
    sums: BlockSums | None,
    decoder: BlockDecoder,
    dictionary_file: str,
) -> str | None:
    """The id of the key whose seal the shard passes, if the reader trusts it: one check of what the seal binds
    (its settings, dictionary, offsets, blocks' digests, dataset and number: format/seal.py) at the shard's open;
    its blocks' digests are compared as they are read. None: no seal, or a key the reader does not trust (a
    stranger's). A trusted seal that fails is a CorruptBlockError: the shard is never read as signed, nor as a
    stranger's (what was signed is known, and this is not it)."""
    seal = manifest.seal(row) if manifest is not None and row is not None else None
    if manifest is None or manifest.dataset is None or manifest.signer is None or seal is None:
        return None
    verifier = trust.get(manifest.signer)
    if verifier is None:
        return None
    sealed_by = f"{trust.name(manifest.signer)} ({manifest.signer})"
    if sums is None or sums.digests is None or sums.dictionary is None:
        raise CorruptBlockError(
            f"it is signed with {sealed_by} but its {BLOCKS_FILE} records no block digests: it was replaced after "
            f"it was signed; copy the dataset again from a good copy"
        )
    if sums.dictionary != decoder.dictionary_digest:
        raise CorruptBlockError(
            f"the dictionary its blocks are read with ({dictionary_file}, SHA-256 {decoder.dictionary_digest.hex()[:16]}) "
            f"is not the one they were written with and signed with {sealed_by} (SHA-256 "
            f"{sums.dictionary.hex()[:16]}): the dictionary was replaced, or the shard moved here from another "
            f"dataset; copy the dataset again from a good copy"
        )
    content = content_digest(meta, decoder.dictionary_digest, offsets, sums.digests)
    if not verifier.verifies(placed(manifest.dataset, number, content), seal):
        raise CorruptBlockError(
            f"its seal ({sealed_by}) does not match it: its blocks' digests, their order, its settings, its dictionary "
            f"or its place (shard {number} of dataset {manifest.dataset.hex()}) are not what was signed; it was "
            f"changed, or moved here from another dataset or shard; copy the dataset again from a good copy"
        )
    return manifest.signer
