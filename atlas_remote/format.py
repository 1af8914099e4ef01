"""The Atlas v1 format as data: metadata records, their validation, shard names and the block index.

No I/O happens here, so every rule of the spec can be tested on plain bytes and dicts.
"""

from __future__ import annotations

import io
import json
import math
from enum import IntEnum
from typing import NamedTuple

import numpy as np

from .errors import FormatError

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
        if not set(map(type, sizes)) <= {int} or (sizes and min(sizes) < 0):  # at C speed: 100,000 shards
            raise FormatError(f"shard_sizes must be non-negative integers, got {sizes!r}", path=where)
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
        block_size = _require(record, "block_size", int, where)
        stored = _require(record, "stored_examples", int, where)
        if block_size <= 0 or stored < 0:
            raise FormatError(
                f"block_size must be > 0 and stored_examples >= 0, got {block_size}, {stored}", path=where
            )
        strategy = _strategy(_require(record, "compression_strategy", int, where), where)
        level = _require(record, "compression_level", int, where)
        dict_size = _require(record, "compression_dict_size", (int, float), where)
        return cls(version, block_size, stored, strategy, level, float(dict_size))

    def to_json(self) -> bytes:
        return _to_json(self)

    @property
    def num_blocks(self) -> int:
        return math.ceil(self.stored_examples / self.block_size)


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


def decode_index(raw: bytes, meta: AtlasDatasetShardMetadata, where: str) -> np.ndarray:
    """Parse index.npy bytes and check them against the shard's metadata."""
    try:
        offsets = np.load(io.BytesIO(raw), allow_pickle=False)
    except (ValueError, OSError, EOFError) as err:
        raise FormatError(f"not a valid .npy array of offsets ({npy_problem(err)})", path=where) from err
    return check_index(offsets, meta, where)


def npy_problem(err: Exception) -> str:
    """numpy's reason, except its advice to load object arrays "unsafely": an index or checksum file never holds
    objects, so that file is damaged or not what it claims, and loading it with pickle is never the fix."""
    text = str(err)
    if "allow_pickle" in text:
        return "its header declares Python objects, which index and checksum files never hold: the file is damaged"
    return text


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


def _load_npy(raw: bytes, dtype: np.dtype, where: str) -> np.ndarray:
    """A 1-D .npy of items of exactly `dtype`, its header read and checked against its bytes before anything is
    allocated (a header may claim any shape)."""
    stream = io.BytesIO(raw)
    try:
        version = np.lib.format.read_magic(stream)
        read_header = {(1, 0): np.lib.format.read_array_header_1_0, (2, 0): np.lib.format.read_array_header_2_0}
        if version not in read_header:
            raise ValueError(f"unsupported .npy version {version}")
        shape, fortran, found = read_header[version](stream, max_header_size=4096)
    except (ValueError, OSError, EOFError, SyntaxError) as err:
        raise FormatError(f"not a valid .npy array ({npy_problem(err)})", path=where) from err
    if found != dtype or len(shape) != 1 or fortran:
        raise FormatError(f"expected a 1-D array of {dtype}, got {found} with shape {shape}", path=where)
    start, length = stream.tell(), shape[0]
    if len(raw) - start != length * dtype.itemsize:
        raise FormatError(
            f"holds {len(raw) - start:,} bytes of rows where its header says {length:,} rows of {dtype.itemsize}",
            path=where,
        )
    return np.frombuffer(raw, dtype=dtype, count=length, offset=start)


class BlockSums(NamedTuple):
    """What a reader checks each stored block against: its CRC-32, and where the writer held a key, its signature
    (keys.SigningKey.sign) and the key's id."""

    crc32: np.ndarray  # uint32, one per block
    macs: bytes | None  # MAC_BYTES per block, in order; None: unsigned
    key_id: bytes | None


# atlas_blocks.npy: one row per block (its start in data.bin, its CRC-32, its signature), then one more row (the
# end of the last block; 0; the signing key's id, or zeros when unsigned). A .npy, so numpy reads it as it is.
BLOCKS_DTYPE = np.dtype([("offset", "<u8"), ("crc32", "<u4"), ("mac", "V16")])


def encode_blocks(offsets: list[int], crc32: list[int], macs: list[bytes] | None, key_id: bytes | None) -> bytes:
    rows = np.zeros(len(offsets), dtype=BLOCKS_DTYPE)
    rows["offset"] = offsets
    rows["crc32"][:-1] = crc32
    if macs is not None and key_id is not None:
        rows["mac"] = np.frombuffer(b"".join(macs) + key_id, dtype="V16")
    buffer = io.BytesIO()
    np.save(buffer, rows, allow_pickle=False)
    return buffer.getvalue()


def decode_blocks(raw: bytes, meta: AtlasDatasetShardMetadata, where: str) -> tuple[np.ndarray, BlockSums]:
    """atlas_blocks.npy's offsets (checked as the index is) and block sums."""
    rows = _load_npy(raw, BLOCKS_DTYPE, where)
    if len(rows) != meta.num_blocks + 1:
        raise FormatError(
            f"{len(rows)} rows for {meta.stored_examples} examples in blocks of {meta.block_size} (expected "
            f"{meta.num_blocks + 1}: one per block and one more)",
            path=where,
        )
    offsets = check_index(rows["offset"], meta, where)
    key_id = rows["mac"][-1].tobytes()
    signed = key_id != bytes(16)
    macs = rows["mac"][:-1].tobytes() if signed else None
    return np.ascontiguousarray(offsets), BlockSums(
        np.ascontiguousarray(rows["crc32"][:-1]), macs, key_id if signed else None
    )


def decode_checksums(raw: bytes, meta: AtlasDatasetShardMetadata, where: str) -> np.ndarray:
    try:
        checksums = np.load(io.BytesIO(raw), allow_pickle=False)
    except (ValueError, OSError, EOFError) as err:
        raise FormatError(f"not a valid .npy array ({npy_problem(err)})", path=where) from err
    if checksums.dtype != np.uint32 or checksums.shape != (meta.num_blocks,):
        raise FormatError(
            f"expected {meta.num_blocks} uint32 checksums, got {checksums.dtype} {checksums.shape}", path=where
        )
    return checksums
