"""The manifest: every shard's metadata in one object at the dataset's root, so that opening a dataset and
planning an epoch take a few requests whatever the number of shards (in the manner of zarr's consolidated
metadata and Lance's manifest).

`atlas_manifest.npz` is a file, not a folder, so the format's original reader (which takes every folder for a
shard) never sees it, as with `.atlas-lease`. It records, per shard: its number, everything its meta.json says
(examples, block size, compression strategy, level and dictionary size), data.bin's size, which sidecar its blocks
are checked against (`Sidecar`), and a CRC-32 of its offsets, checksums and signatures (which change with any
change of its content); and the SHA-256 of the root meta.json it was written with. A manifest whose root digest differs from the root meta.json
(the dataset rewritten by a tool that does not know manifests) is stale and ignored.

A shard the manifest describes opens with its atlas_blocks.npy only (index.npy and block_checksums.npy for shards
written before it existed; its meta.json and data.bin's size are here). It is never trusted for data: what is
fetched must have the digest recorded here, blocks are checked against it as always, and a disagreement is an error that says to rebuild the manifest
(`atlas-remote index URL`).
"""

from __future__ import annotations

import hashlib
import io
import json
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from enum import IntEnum

import numpy as np

from .errors import FormatError
from .format import VERSION as FORMAT_VERSION
from .format import AtlasDatasetShardMetadata, BlockSums, CompressionStrategy
from .plan import Layout

MANIFEST = "atlas_manifest.npz"
MANIFEST_FORMAT = "atlas_remote.manifest/3"
# /2's `checksums` column was a flag for block_checksums.npy (read as Sidecar.CHECKSUMS); /1 had no compression level
# or dictionary size
READS = ("atlas_remote.manifest/2", MANIFEST_FORMAT)


class Sidecar(IntEnum):
    """Which of our files a shard's blocks are checked against (the manifest's `checksums` column)."""

    NONE = 0
    CHECKSUMS = 1  # block_checksums.npy: a CRC-32 per block (before signing existed)
    BLOCKS = 2  # atlas_blocks.npy: offsets, CRC-32s and, where the writer held a key, signatures


COLUMNS = (
    "numbers",
    "sizes",
    "block_sizes",
    "strategies",
    "data_bytes",
    "checksums",
    "digests",
    "levels",
    "dict_sizes",
)


def row_of(meta: AtlasDatasetShardMetadata, data_bytes: int, sidecar: Sidecar, digest: int) -> tuple:
    """A shard's row, after its number: what `Manifest.from_rows` takes (and a staged part records)."""
    return (
        meta.stored_examples,
        meta.block_size,
        int(meta.compression_strategy),
        data_bytes,
        int(sidecar),
        digest,
        meta.compression_level,
        meta.compression_dict_size,
    )


def root_digest(root_meta: bytes) -> str:
    return hashlib.sha256(root_meta).hexdigest()


def shard_digest(offsets: np.ndarray, sums: BlockSums | None) -> int:
    """CRC-32 of a shard's block offsets, checksums and signatures: what its content is, in a few bytes."""
    digest = zlib.crc32(np.ascontiguousarray(offsets, dtype="<u8").tobytes())
    if sums is not None:
        digest = zlib.crc32(np.ascontiguousarray(sums.crc32, dtype="<u4").tobytes(), digest)
        if sums.macs is not None:
            digest = zlib.crc32(sums.macs + (sums.key_id or b""), digest)
    return digest


@dataclass(frozen=True, eq=False)
class Manifest:
    """Every shard's metadata, as arrays (one entry per shard present when it was written, by shard number)."""

    root_sha256: str
    numbers: np.ndarray  # int64
    sizes: np.ndarray  # stored examples, int64
    block_sizes: np.ndarray  # int64
    strategies: np.ndarray  # compression strategy of each shard (a small shard may fall back), uint8
    data_bytes: np.ndarray  # size of data.bin, int64
    checksums: np.ndarray  # which sidecar each shard has (Sidecar), uint8
    digests: np.ndarray  # shard_digest() of each shard, uint32
    levels: np.ndarray  # compression_level of each shard's meta.json, int32
    dict_sizes: np.ndarray  # compression_dict_size of each shard's meta.json, float64

    @classmethod
    def of(cls, root_meta: bytes, shards: list[tuple[int, AtlasDatasetShardMetadata, int, Sidecar, int]]) -> Manifest:
        """From (number, meta, data.bin size, its sidecar, digest) of each shard."""
        rows = [(n, *row_of(m, size, sums, digest)) for n, m, size, sums, digest in shards]
        return cls.from_rows(root_meta, rows)

    @classmethod
    def from_rows(cls, root_meta: bytes, rows: list) -> Manifest:
        """From (number, *row_of(...)) of each shard."""
        rows = sorted(rows, key=lambda r: r[0])
        column = lambda i, dtype: np.asarray([r[i] for r in rows], dtype=dtype)
        return cls(
            root_digest(root_meta),
            column(0, np.int64),
            column(1, np.int64),
            column(2, np.int64),
            column(3, np.uint8),
            column(4, np.int64),
            column(5, np.uint8),
            column(6, np.uint32),
            column(7, np.int32),
            column(8, np.float64),
        )

    def __len__(self) -> int:
        return len(self.numbers)

    def encode(self) -> bytes:
        header = json.dumps({"format": MANIFEST_FORMAT, "root_sha256": self.root_sha256}).encode()
        buffer = io.BytesIO()
        np.savez_compressed(
            buffer,
            header=np.frombuffer(header, dtype=np.uint8),
            numbers=self.numbers,
            sizes=self.sizes,
            block_sizes=self.block_sizes,
            strategies=self.strategies,
            data_bytes=self.data_bytes,
            checksums=self.checksums,
            digests=self.digests,
            levels=self.levels,
            dict_sizes=self.dict_sizes,
        )
        return buffer.getvalue()

    @classmethod
    def decode(cls, raw: bytes, where: str = MANIFEST) -> Manifest:
        try:
            with np.load(io.BytesIO(raw), allow_pickle=False) as arrays:
                header = json.loads(arrays["header"].tobytes())
                if not isinstance(header, dict) or header.get("format") not in READS:
                    raise FormatError(
                        f"not a manifest this version reads ({str(header)[:80]}); rebuild it with "
                        f"`atlas-remote index URL`",
                        path=where,
                    )
                fields = {name: arrays[name] for name in COLUMNS}  # an older format lacks some: checked first
        except FormatError:
            raise
        except Exception as err:  # a damaged zip or .npy can raise almost anything
            raise FormatError(
                f"the manifest is damaged ({type(err).__name__}: {err}); rebuild it with `atlas-remote index URL`",
                path=where,
            ) from err
        lengths = {len(a) for a in fields.values()}
        if len(lengths) > 1 or any(a.ndim != 1 for a in fields.values()):
            raise FormatError("the manifest's columns differ in length", path=where)
        numbers, sizes, block_sizes = fields["numbers"], fields["sizes"], fields["block_sizes"]
        if np.any(np.diff(numbers) <= 0) or np.any(numbers < 0) or np.any(sizes < 0) or np.any(block_sizes <= 0):
            raise FormatError("the manifest's shard numbers, sizes or block sizes are out of range", path=where)
        return cls(
            str(header.get("root_sha256", "")),
            numbers.astype(np.int64),
            sizes.astype(np.int64),
            block_sizes.astype(np.int64),
            fields["strategies"].astype(np.uint8),
            fields["data_bytes"].astype(np.int64),
            fields["checksums"].astype(np.uint8),  # /2's flag: True is Sidecar.CHECKSUMS
            fields["digests"].astype(np.uint32),
            fields["levels"].astype(np.int32),
            fields["dict_sizes"].astype(np.float64),
        )

    def describes(self, root_meta: bytes, shard_sizes: list[int]) -> bool:
        """Whether it was written with this root meta.json (and agrees with its shard sizes)."""
        if self.root_sha256 != root_digest(root_meta):
            return False
        sizes = np.asarray(shard_sizes, dtype=np.int64)
        return bool(np.all(self.numbers < len(sizes))) and np.array_equal(sizes[self.numbers], self.sizes)

    def layout(self, present: Sequence[int] | np.ndarray | None = None) -> Layout:
        """The layout of the shards present (by number; all of the manifest's by default)."""
        if present is None:
            return Layout.of(self.sizes, self.block_sizes)
        rows = np.searchsorted(self.numbers, present)
        return Layout.of(self.sizes[rows], self.block_sizes[rows])

    def entry(self, number: int) -> int | None:
        row = int(np.searchsorted(self.numbers, number))
        return row if row < len(self.numbers) and int(self.numbers[row]) == number else None

    def lists(self, numbers: np.ndarray) -> bool:
        """Whether it has an entry for every one of these shard numbers."""
        rows = np.searchsorted(self.numbers, numbers)
        return bool(np.all(rows < len(self.numbers)) and np.array_equal(self.numbers[rows], numbers))

    def meta(self, row: int) -> AtlasDatasetShardMetadata:
        """The shard's meta.json, as written when the manifest was (its index digest tells if it still is)."""
        return AtlasDatasetShardMetadata(
            FORMAT_VERSION,
            int(self.block_sizes[row]),
            int(self.sizes[row]),
            CompressionStrategy(int(self.strategies[row])),
            int(self.levels[row]),
            float(self.dict_sizes[row]),
        )

    def check_shard(
        self, number: int, meta: AtlasDatasetShardMetadata, data_bytes: int, digest: int, sidecar: Sidecar
    ) -> str | None:
        """What a shard's own files say that the manifest does not, or None if they agree."""
        row = self.entry(number)
        if row is None:
            return "the manifest has no entry for it"
        expected = (
            int(self.sizes[row]),
            int(self.block_sizes[row]),
            int(self.strategies[row]),
            int(self.data_bytes[row]),
            int(self.checksums[row]),
            int(self.digests[row]),
        )
        found = (meta.stored_examples, meta.block_size, int(meta.compression_strategy), data_bytes, sidecar, digest)
        if expected == found:
            return None
        names = ("stored_examples", "block_size", "compression_strategy", "data.bin bytes", "sidecar", "index digest")
        return ", ".join(f"{n} {f} (manifest: {e})" for n, e, f in zip(names, expected, found) if e != f)
