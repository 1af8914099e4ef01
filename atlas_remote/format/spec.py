"""The Atlas v1 format as data: metadata records, their validation, shard names and the block index.

No I/O happens here, so every rule of the spec can be tested on plain bytes and dicts.
"""

from __future__ import annotations

import hashlib
import io
import json
from collections.abc import Sequence
from dataclasses import dataclass
from enum import IntEnum
from typing import NamedTuple

import numpy as np

from ..errors import FormatError
from .npy import Buffer, HeaderError, read_header

VERSION = 1
ROOT_META = "meta.json"
SHARD_META = "meta.json"
DATA_FILE = "data.bin"
INDEX_FILE = "index.npy"
DICT_FILE = "zstd_dict.bin"
# Our sidecars, files the original reader never opens. The first: a CRC-32 (zlib) of each stored block, as
# atlas_remote wrote them before signing. The second, written since: each block's offsets, CRC-32 and signature.
CHECKSUM_FILE = "block_checksums.npy"
BLOCKS_FILE = "atlas_blocks.npy"

# The spec's fallback rule: zstd cannot train a dictionary on fewer than 7 samples (blocks).
MIN_BLOCKS_FOR_DICTIONARY = 7
INDEX_DTYPES = (np.uint8, np.uint16, np.uint32, np.uint64)


class CompressionStrategy(IntEnum):
    NO_COMPRESSION = 0
    STANDARD_COMPRESSION = 1
    SHARED_DICTIONARY_COMPRESSION = 2
    DICTIONARY_COMPRESSION = 3


def _require(record: dict, field: str, kind: type | tuple[type, ...], where: str):
    if field not in record:
        raise FormatError(f"missing key {field!r}", path=where)
    value = record[field]
    if isinstance(value, bool) or not isinstance(value, kind):
        raise FormatError(f"{field!r} must be {getattr(kind, '__name__', kind)}, got {value!r}", path=where)
    return value


# Counts are int64 wherever they are held (the shard table's cumulative sizes, the manifest's columns), and a
# compression level int32 (the manifest's column): larger numbers in a meta.json are refused, not overflowed.
MAX_COUNT = 2**63 - 1
MAX_LEVEL = 2**31 - 1


def _count(record: dict, field: str, where: str, least: int) -> int:
    value = _require(record, field, int, where)
    if not least <= value <= MAX_COUNT:
        raise FormatError(f"{field!r} must be an integer from {least} to 2**63-1, got {value}", path=where)
    return value


def _parse_json_object(raw: bytes, where: str) -> dict:
    try:
        record = json.loads(raw)
    except (ValueError, RecursionError) as err:  # bad bytes or syntax, a 5,000-digit int, nesting too deep
        raise FormatError(f"not valid JSON ({type(err).__name__}: {str(err)[:200]})", path=where) from err
    if not isinstance(record, dict):
        raise FormatError(f"expected a JSON object, got {type(record).__name__}", path=where)
    return record


def _check_version(version: int, where: str) -> None:
    if version != VERSION:
        raise FormatError(
            f"unsupported Atlas format version {version} (this library reads version {VERSION})", path=where
        )


def _strategy(value: int, where: str) -> CompressionStrategy:
    try:
        return CompressionStrategy(value)
    except ValueError:
        raise FormatError(f"unknown compression_strategy {value!r} (expected 0-3)", path=where) from None


def _to_json(record: NamedTuple) -> bytes:
    """A meta.json, written with exactly the spec's keys, as the original writer writes them."""
    fields = record._asdict()
    fields["compression_strategy"] = int(fields["compression_strategy"])
    return json.dumps(fields, indent=4).encode()


class AtlasDatasetMetadata(NamedTuple):
    """The root meta.json (the original's named tuple); its presence is the dataset's commit marker."""

    version: int
    shard_sizes: list[int]
    compression_strategy: CompressionStrategy

    @classmethod
    def from_json(cls, raw: bytes, where: str) -> AtlasDatasetMetadata:
        record = _parse_json_object(raw, where)
        version = _require(record, "version", int, where)
        _check_version(version, where)
        sizes = _require(record, "shard_sizes", list, where)
        if not set(map(type, sizes)) <= {int} or (sizes and (min(sizes) < 0 or sum(sizes) > MAX_COUNT)):
            raise FormatError(  # at C speed: 100,000 shards
                f"shard_sizes must be non-negative integers adding up to at most 2**63-1, got {str(sizes)[:200]}",
                path=where,
            )
        strategy = _strategy(_require(record, "compression_strategy", int, where), where)
        return cls(version, list(sizes), strategy)

    def to_json(self) -> bytes:
        return _to_json(self)


class AtlasDatasetShardMetadata(NamedTuple):
    """A shard's meta.json (the original's named tuple): it alone decides how the shard's blocks are stored."""

    version: int
    block_size: int
    stored_examples: int
    compression_strategy: CompressionStrategy
    compression_level: int
    compression_dict_size: float

    @classmethod
    def from_json(cls, raw: bytes, where: str) -> AtlasDatasetShardMetadata:
        record = _parse_json_object(raw, where)
        version = _require(record, "version", int, where)
        _check_version(version, where)
        block_size = _count(record, "block_size", where, 1)
        stored = _count(record, "stored_examples", where, 0)
        strategy = _strategy(_require(record, "compression_strategy", int, where), where)
        level = _require(record, "compression_level", int, where)
        if abs(level) > MAX_LEVEL:
            raise FormatError(f"'compression_level' must fit in 32 bits, got {level}", path=where)
        dict_size = _require(record, "compression_dict_size", (int, float), where)
        if not 0 <= dict_size <= 1:  # NaN too: Python's json reads NaN and Infinity
            raise FormatError(f"'compression_dict_size' must be a fraction from 0 to 1, got {dict_size}", path=where)
        return cls(version, block_size, stored, strategy, level, float(dict_size))

    def to_json(self) -> bytes:
        return _to_json(self)

    @property
    def num_blocks(self) -> int:
        return -(-self.stored_examples // self.block_size)  # exact: a float division rounds past 2**53


def shard_name(shard: int, num_shards: int) -> str:
    """Folder name of a shard: zero-padded to the width of the last shard's number, as the spec requires."""
    return str(shard).zfill(len(str(max(num_shards - 1, 0))))


def parse_shard_name(name: str) -> int | None:
    """The shard number a folder name stands for, or None if it is not a shard folder."""
    return int(name) if name.isascii() and name.isdigit() else None


def encode_index(offsets: list[int]) -> bytes:
    """The N+1 block offsets as .npy bytes, in the smallest unsigned dtype that holds the last offset."""
    last = offsets[-1]
    for dtype in INDEX_DTYPES:
        if last <= np.iinfo(dtype).max:
            buffer = io.BytesIO()
            np.save(buffer, np.asarray(offsets, dtype=dtype), allow_pickle=False)
            return buffer.getvalue()
    raise FormatError(f"shard too large: last offset {last} does not fit in 64 bits")


def decode_index(raw: Buffer, meta: AtlasDatasetShardMetadata, where: str) -> np.ndarray:
    """Parse index.npy bytes and check them against the shard's metadata."""
    what = f"offsets for {meta.stored_examples} examples in blocks of {meta.block_size}"
    return check_index(read_npy(raw, where, INDEX_DTYPES, meta.num_blocks + 1, what), meta, where)


NPY_HEADER_BYTES = 4096  # numpy writes 128 for a plain array; a record of a few fields needs a few hundred


def read_npy(
    raw: Buffer,
    where: str,
    dtypes: Sequence[type | np.dtype],
    length: int | None,
    what: str = "items",
) -> np.ndarray:
    """A 1-D .npy array of `length` items (None: as many as its bytes hold) of one of `dtypes` (a number type in
    either byte order, or a record type exactly), as a read-only view of `raw` (bytes, or a file's bytes
    memory-mapped). Its header (at most NPY_HEADER_BYTES, read by npy.read_header, never by `ast`) is checked
    against the expected type and length and against the bytes that follow it before anything is allocated:
    np.load allocates whatever shape a header claims (10^11 entries: a 745 GiB request). Anything else is a
    FormatError naming `where` (`what` names the items in its message)."""
    try:
        shape, _, dtype, start = read_header(raw, NPY_HEADER_BYTES)
    except HeaderError as err:
        raise FormatError(f"not a valid .npy array ({err})", path=where) from None
    if dtype.hasobject:
        raise FormatError(f"not a valid .npy array ({OBJECTS})", path=where)
    wanted = [np.dtype(d) for d in dtypes]
    plain = dtype.fields is None and dtype.subdtype is None
    if dtype not in wanted and not (plain and dtype.newbyteorder("<") in wanted):
        raise FormatError(f"its items are {dtype}, where {' or '.join(map(str, wanted))} is expected", path=where)
    if len(shape) != 1 or shape[0] < 0 or length is not None and shape[0] != length:
        found = f"{shape[0]} {what}" if len(shape) == 1 else f"an array of shape {shape}"
        raise FormatError(f"{found} (expected {'a 1-D array' if length is None else length})", path=where)
    count, size = shape[0], len(raw) if not isinstance(raw, np.ndarray) else raw.nbytes
    if size - start != count * dtype.itemsize:
        raise FormatError(
            f"its header says {count} {what}, {count * dtype.itemsize} bytes, but {size - start} bytes follow "
            f"it: the file is damaged",
            path=where,
        )
    if isinstance(raw, np.ndarray):  # a mapped file stays mapped (np.memmap), viewed as the header's type
        return raw[start:].view(dtype)
    return np.frombuffer(raw, dtype, count, start)


OBJECTS = "its header declares Python objects, which index and checksum files never hold: the file is damaged"


def check_index(offsets: np.ndarray, meta: AtlasDatasetShardMetadata, where: str) -> np.ndarray:
    """The offsets as they are (any unsigned dtype, possibly memory-mapped), if they fit the shard's metadata:
    N+1 of them, starting at 0, never decreasing. Callers convert single offsets with int()."""
    if offsets.ndim != 1 or offsets.dtype.kind != "u":
        raise FormatError(
            f"expected a 1-D unsigned integer array, got {offsets.dtype} with shape {offsets.shape}", path=where
        )
    expected = meta.num_blocks + 1
    if len(offsets) != expected:
        raise FormatError(
            f"{len(offsets)} offsets for {meta.stored_examples} examples in blocks of {meta.block_size} "
            f"(expected {expected})",
            path=where,
        )
    if offsets[0] != 0 or np.any(offsets[1:] < offsets[:-1]):
        raise FormatError("offsets must start at 0 and never decrease", path=where)
    return offsets


def encode_checksums(checksums: list[int]) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, np.asarray(checksums, dtype=np.uint32), allow_pickle=False)
    return buffer.getvalue()


class BlockSums(NamedTuple):
    """What a reader checks each stored block against: its CRC-32 (a stranger's dataset: damage), and its SHA-256
    with the digest of the dictionary its writer compressed it with (a signed dataset: what the seal binds,
    format/seal.py)."""

    crc32: np.ndarray  # uint32, one per block
    digests: bytes | None  # SHA-256 per block, in order; None: an earlier sidecar
    dictionary: bytes | None  # the writer's dictionary's SHA-256 (zeros: none); None: an earlier sidecar
    earlier: bytes = b""  # an earlier sidecar's per-block HMACs and key id: no longer checked, still digested


# atlas_blocks.npy: one row per block (its start in data.bin, its CRC-32, its SHA-256), then one more row (the end
# of the last block; 0; the SHA-256 of the dictionary the blocks were compressed with, or zeros). A .npy, so numpy
# reads it as it is. Written before: the same with a 16-byte HMAC per block and the key's id in the last row.
BLOCKS_DTYPE = np.dtype([("offset", "<u8"), ("crc32", "<u4"), ("sha256", "V32")])
EARLIER_BLOCKS_DTYPE = np.dtype([("offset", "<u8"), ("crc32", "<u4"), ("mac", "V16")])


def encode_blocks(offsets: list[int], crc32: list[int], digests: bytes, dictionary: bytes) -> bytes:
    rows = np.zeros(len(offsets), dtype=BLOCKS_DTYPE)
    rows["offset"] = offsets
    rows["crc32"][:-1] = crc32
    rows["sha256"] = np.frombuffer(digests + dictionary, dtype="V32")
    buffer = io.BytesIO()
    np.save(buffer, rows, allow_pickle=False)
    return buffer.getvalue()


def decode_blocks(raw: bytes, meta: AtlasDatasetShardMetadata, where: str) -> tuple[np.ndarray, BlockSums]:
    """atlas_blocks.npy's offsets (checked as the index is) and block sums."""
    rows = read_npy(raw, where, (BLOCKS_DTYPE, EARLIER_BLOCKS_DTYPE), None, "rows")
    if len(rows) != meta.num_blocks + 1:
        raise FormatError(
            f"{len(rows)} rows for {meta.stored_examples} examples in blocks of {meta.block_size} (expected "
            f"{meta.num_blocks + 1}: one per block and one more)",
            path=where,
        )
    offsets = np.ascontiguousarray(check_index(rows["offset"], meta, where))
    crc32 = np.ascontiguousarray(rows["crc32"][:-1])
    if rows.dtype == EARLIER_BLOCKS_DTYPE:
        key_id = rows["mac"][-1].tobytes()
        return offsets, BlockSums(crc32, None, None, rows["mac"].tobytes() if key_id != bytes(16) else b"")
    return offsets, BlockSums(crc32, rows["sha256"][:-1].tobytes(), rows["sha256"][-1].tobytes())


def decode_checksums(raw: bytes, meta: AtlasDatasetShardMetadata, where: str) -> np.ndarray:
    return read_npy(raw, where, (np.uint32,), meta.num_blocks, "checksums")


@dataclass(frozen=True, eq=False)
class Layout:
    """Where a dataset's examples are: the examples and block size of each shard present, in order."""

    sizes: np.ndarray  # examples per shard (int64)
    block_sizes: np.ndarray  # examples per block, per shard (int64)

    @classmethod
    def of(cls, sizes: Sequence[int] | np.ndarray, block_sizes: Sequence[int] | np.ndarray) -> Layout:
        sizes, block_sizes = np.asarray(sizes, dtype=np.int64), np.asarray(block_sizes, dtype=np.int64)
        if sizes.shape != block_sizes.shape or sizes.ndim != 1:
            raise ValueError("a layout needs one example count and one block size per shard")
        if np.any(sizes < 0) or np.any(block_sizes <= 0):
            raise ValueError("shard sizes must be >= 0 and block sizes > 0")
        return cls(sizes, block_sizes)

    def __len__(self) -> int:
        return int(self.sizes.sum())

    @property
    def starts(self) -> np.ndarray:
        """Global index of each shard's first example."""
        return np.cumsum(self.sizes) - self.sizes

    def digest(self) -> str:
        """Identifies the layout in a checkpoint: a state saved for one dataset is refused by another."""
        return hashlib.sha256(self.sizes.tobytes() + b"/" + self.block_sizes.tobytes()).hexdigest()[:16]
