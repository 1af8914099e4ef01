"""The manifest: every shard's metadata in one object at the dataset's root, so that opening a dataset and
planning an epoch take a few requests whatever the number of shards (in the manner of zarr's consolidated
metadata and Lance's manifest).

`atlas_manifest.npz` is a file, not a folder, so the format's original reader (which takes every folder for a
shard) never sees it, as with `.atlas-lease`. It records, per shard: its number, everything its meta.json says
(examples, block size, compression strategy, level and dictionary size), data.bin's size, which sidecar its blocks
are checked against (`Sidecar`), a CRC-32 of its offsets and block sums (which change with any change of its
content), and, in a signed dataset, its seal (format/seal.py); and the SHA-256 of the root meta.json it was written
with, and, in a signed dataset, the dataset's identity and which key sealed it. A manifest whose root digest
differs from the root meta.json (the dataset rewritten by a tool that does not know manifests) is stale and
ignored.

A shard the manifest describes opens with its atlas_blocks.npy only (index.npy and block_checksums.npy for shards
written before it existed; its meta.json and data.bin's size are here). It is never trusted for data: what is
fetched must have the digest recorded here, blocks are checked against it as always, and a disagreement is an error that says to rebuild the manifest
(`atlas-remote index URL`). A seal vouches for itself: whoever changes a row, the identity or a shard makes it
fail, and a shard whose seal fails is refused.
"""

from __future__ import annotations

import hashlib
import io
import json
import re
import zipfile
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from enum import IntEnum
from typing import Any, NamedTuple, NoReturn

import numpy as np

from ..errors import FormatError
from ..trust.keys import SEAL_BYTES
from .seal import DATASET_ID_BYTES
from .spec import NPY_HEADER_BYTES, AtlasDatasetShardMetadata, BlockSums, CompressionStrategy, Layout, read_npy
from .spec import VERSION as FORMAT_VERSION

MANIFEST = "atlas_manifest.npz"
MANIFEST_FORMAT = "atlas_remote.manifest/4"
# /3 had no seals; /2's `checksums` column was a flag for block_checksums.npy (read as Sidecar.CHECKSUMS); /1 had no
# compression level or dictionary size
READS = ("atlas_remote.manifest/2", "atlas_remote.manifest/3", MANIFEST_FORMAT)
SIGNER = re.compile(r"(secret:[0-9a-f]{32}|ed25519:[0-9a-f]{64})")


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
SEALS = "seals"  # a signed dataset's: each row's seal
# Each column's item type (either byte order): what bounds its bytes, at one row per shard of the root meta.json.
COLUMN_DTYPES: dict[str, tuple[type | np.dtype, ...]] = {
    "numbers": (np.int64,),
    "sizes": (np.int64,),
    "block_sizes": (np.int64,),
    "strategies": (np.uint8,),
    "data_bytes": (np.int64,),
    "checksums": (np.uint8, np.bool_),  # which sidecar (Sidecar); a flag in /2
    "digests": (np.uint32,),
    "levels": (np.int32,),
    "dict_sizes": (np.float64,),
    SEALS: (np.dtype(f"V{SEAL_BYTES}"),),
}
HEADER = "header"  # a member of JSON bytes: the manifest's format and the root meta.json's digest
HEADER_JSON_BYTES = 1024
MANIFEST_FIXED_BYTES = 1 << 17  # the zip's own records (a comment may take 64 KiB) and each member's .npy header
MANIFEST_ROW_BYTES = 128  # a shard's row, stored uncompressed: 50 bytes, and a seal of 64
MAX_MEMBERS = 32  # numpy writes the header and 10 columns
CENTRAL_DIRECTORY_ENTRY = b"PK\x01\x02"
DEFLATE_MOST = 1032  # deflate's largest ratio of output to input


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
    """CRC-32 of a shard's block offsets and sums (an earlier sidecar's HMACs too, as it was digested then):
    what its content is, in a few bytes."""
    digest = zlib.crc32(np.ascontiguousarray(offsets, dtype="<u8").tobytes())
    if sums is not None:
        digest = zlib.crc32(np.ascontiguousarray(sums.crc32, dtype="<u4").tobytes(), digest)
        if sums.earlier:
            digest = zlib.crc32(sums.earlier, digest)
        elif sums.digests is not None and sums.dictionary is not None:
            digest = zlib.crc32(sums.digests + sums.dictionary, digest)
    return digest


class Seals(NamedTuple):
    """A signed dataset's: its identity (chosen by the writer that sealed it), the key's id, each shard's seal
    by number."""

    dataset: bytes
    signer: str
    by_number: dict[int, bytes]


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
    dataset: bytes | None = None  # a signed dataset's identity
    signer: str | None = None  # the id of the key that sealed it (keys.py)
    seals: np.ndarray | None = None  # each row's seal (V64; zeros: none)

    @classmethod
    def of(
        cls,
        root_meta: bytes,
        shards: list[tuple[int, AtlasDatasetShardMetadata, int, Sidecar, int]],
        seals: Seals | None = None,
    ) -> Manifest:
        """From (number, meta, data.bin size, its sidecar, digest) of each shard."""
        rows = [(n, *row_of(m, size, sums, digest)) for n, m, size, sums, digest in shards]
        return cls.from_rows(root_meta, rows, seals)

    @classmethod
    def from_rows(cls, root_meta: bytes, rows: list, seals: Seals | None = None) -> Manifest:
        """From (number, *row_of(...)) of each shard, and the seals of a signed dataset."""
        rows = sorted(rows, key=lambda r: r[0])
        column = lambda i, dtype: np.asarray([r[i] for r in rows], dtype=dtype)
        sealed = None
        if seals is not None:
            zeros = bytes(SEAL_BYTES)
            sealed = np.frombuffer(b"".join(seals.by_number.get(r[0], zeros) for r in rows), f"V{SEAL_BYTES}")
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
            seals.dataset if seals is not None else None,
            seals.signer if seals is not None else None,
            sealed,
        )

    def __len__(self) -> int:
        return len(self.numbers)

    def encode(self) -> bytes:
        fields = {"format": MANIFEST_FORMAT, "root_sha256": self.root_sha256}
        signed: dict[str, Any] = {}
        if self.dataset is not None and self.signer is not None and self.seals is not None:
            fields.update(dataset=self.dataset.hex(), signer=self.signer)
            signed[SEALS] = self.seals
        header = json.dumps(fields).encode()
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
            **signed,
        )
        return buffer.getvalue()

    @classmethod
    def decode(cls, raw: bytes, where: str = MANIFEST, *, shards: int) -> Manifest:
        """The manifest of a dataset whose root meta.json names `shards` shards, read within what such a manifest
        can hold (`ManifestReader`); anything else is a FormatError that says to rebuild it."""
        reader = ManifestReader(raw, where, shards)
        header = reader.header()
        columns = {name: reader.column(name) for name in COLUMNS}
        dataset, signer = header.get("dataset"), header.get("signer")
        signed = dataset is not None or signer is not None or f"{SEALS}.npy" in reader.members
        if signed:
            if not (
                isinstance(dataset, str)
                and re.fullmatch(f"[0-9a-f]{{{2 * DATASET_ID_BYTES}}}", dataset)
                and isinstance(signer, str)
                and SIGNER.fullmatch(signer)
            ):
                reader.refuse("its header's dataset identity or signer is not one a writer records")
            columns[SEALS] = reader.column(SEALS)
        if len({len(c) for c in columns.values()}) > 1:
            raise FormatError(
                "the manifest's columns differ in length; rebuild it with `atlas-remote index URL`", path=where
            )
        numbers, sizes, block_sizes = columns["numbers"], columns["sizes"], columns["block_sizes"]
        dict_sizes = columns["dict_sizes"]
        if (
            np.any(np.diff(numbers) <= 0)
            or np.any(numbers < 0)
            or np.any(numbers >= shards)
            or np.any(sizes < 0)
            or np.any(block_sizes <= 0)
            or np.any(columns["strategies"] > max(CompressionStrategy))
            or np.any(columns["data_bytes"] < 0)
            or np.any(columns["checksums"].astype(np.uint8) > max(Sidecar))
            or not np.all((dict_sizes >= 0) & (dict_sizes <= 1))  # NaN fails both
        ):
            raise FormatError(
                "the manifest's shard numbers, sizes, block sizes, strategies, data.bin sizes, sidecars or "
                "dictionary sizes are out of range; rebuild it with `atlas-remote index URL`",
                path=where,
            )
        return cls(
            str(header.get("root_sha256", "")),
            numbers.astype(np.int64),
            sizes.astype(np.int64),
            block_sizes.astype(np.int64),
            columns["strategies"].astype(np.uint8),
            columns["data_bytes"].astype(np.int64),
            columns["checksums"].astype(np.uint8),  # /2's flag: True is Sidecar.CHECKSUMS
            columns["digests"].astype(np.uint32),
            columns["levels"].astype(np.int32),
            dict_sizes.astype(np.float64),
            bytes.fromhex(str(dataset)) if signed else None,
            signer if signed else None,
            columns[SEALS] if signed else None,
        )

    def seal(self, row: int) -> bytes | None:
        """The row's seal, if it has one."""
        if self.seals is None:
            return None
        seal = self.seals[row].tobytes()
        return seal if seal != bytes(SEAL_BYTES) else None

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


class ManifestReader:
    """The members of an `atlas_manifest.npz` from a stranger, each checked before a byte of it is inflated.

    np.load inflated whatever a member's compression made of it and then allocated what its .npy header claimed:
    a 3.8 KB bzip2 member claiming 1 GiB took 3.2 GB and 30 s. Here the root meta.json's shard count bounds
    everything: the file's size (MANIFEST_FIXED_BYTES + MANIFEST_ROW_BYTES a shard), the number of members
    (counted by their signature in the central directory before zipfile parses it), each member's declared size
    (its .npy header and one row per shard), its compression (stored or deflate, as numpy writes; bzip2 and lzma
    inflate without a bound), its ratio (what deflate can reach; stored is 1:1), then what inflating it yields,
    capped at its declared size and checked against it and its CRC. Each column is read by format.read_npy."""

    def __init__(self, raw: bytes, where: str, shards: int) -> None:
        self.where, self.shards = where, shards
        limit = MANIFEST_FIXED_BYTES + shards * MANIFEST_ROW_BYTES
        if len(raw) > limit:
            self.refuse(f"it is {len(raw):,} bytes, more than a manifest of {shards:,} shards can be ({limit:,})")
        if raw.count(CENTRAL_DIRECTORY_ENTRY) > MAX_MEMBERS:  # an upper bound on the entries zipfile would parse
            self.refuse(f"it has more than {MAX_MEMBERS} members")
        try:
            self.zip = zipfile.ZipFile(io.BytesIO(raw))
            members = self.zip.infolist()
        except Exception as err:  # a damaged zip can raise almost anything
            self.refuse(f"it is damaged ({type(err).__name__}: {err})")
        self.members = {m.filename: m for m in members}
        if len(self.members) != len(members):
            self.refuse("it names a member twice")
        for member in members:
            self._check(member)

    def refuse(self, problem: str) -> NoReturn:
        raise FormatError(
            f"the manifest is unusable: {problem}; rebuild it with `atlas-remote index URL`", path=self.where
        )

    def _check(self, member: zipfile.ZipInfo) -> None:
        name, suffix = member.filename[:-4], member.filename[-4:]
        if suffix == ".npy" and name == HEADER:
            items, item_bytes = HEADER_JSON_BYTES, 1
        elif suffix == ".npy" and name in COLUMN_DTYPES:
            items, item_bytes = self.shards, max(np.dtype(d).itemsize for d in COLUMN_DTYPES[name])
        else:
            self.refuse(f"it holds a member {member.filename!r}, which is not one of ours")
        if member.compress_type not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED) or member.flag_bits & 1:
            how = "encrypted" if member.flag_bits & 1 else f"compressed with method {member.compress_type}"
            self.refuse(f"its member {member.filename!r} is {how}, where numpy stores or deflates")
        bound = NPY_HEADER_BYTES + items * item_bytes
        if member.file_size > bound:
            self.refuse(f"its member {member.filename!r} declares {member.file_size:,} bytes, above {bound:,}")
        most = member.compress_size * (1 if member.compress_type == zipfile.ZIP_STORED else DEFLATE_MOST) + 64
        if member.file_size > most:
            self.refuse(f"its member {member.filename!r} declares more bytes than its compression can yield")

    def _inflate(self, name: str) -> bytes:
        member = self.members.get(f"{name}.npy")
        if member is None:
            self.refuse(f"it has no {name!r} column")
        try:
            with self.zip.open(member) as stream:
                data = stream.read(member.file_size)  # zipfile yields at most that, and checks the CRC there
        except Exception as err:  # a bad CRC, bad deflate data, a local header that is not the central one's
            self.refuse(f"its member {member.filename!r} is damaged ({type(err).__name__}: {err})")
        if len(data) != member.file_size:
            self.refuse(
                f"its member {member.filename!r} holds {len(data):,} bytes, not the {member.file_size:,} declared"
            )
        return data

    def _array(self, name: str, dtypes: tuple[type | np.dtype, ...]) -> np.ndarray:
        raw = self._inflate(name)
        try:
            return read_npy(raw, self.where, dtypes, None, "rows")
        except FormatError as err:
            self.refuse(f"its {name!r} member: {err.problem}")

    def header(self) -> dict:
        raw = self._array(HEADER, (np.uint8,)).tobytes()
        try:
            header = json.loads(raw)
        except (ValueError, RecursionError) as err:
            self.refuse(f"its header is not JSON ({type(err).__name__}: {err})")
        if not isinstance(header, dict) or header.get("format") not in READS:
            raise FormatError(
                f"not a manifest this version reads ({str(header)[:80]}); rebuild it with `atlas-remote index URL`",
                path=self.where,
            )
        if not isinstance(header.get("root_sha256"), str):
            self.refuse("its header has no root digest")
        return header

    def column(self, name: str) -> np.ndarray:
        column = self._array(name, COLUMN_DTYPES[name])
        if len(column) > self.shards:
            self.refuse(f"its {name!r} column has {len(column):,} rows for the {self.shards:,} shards of the root")
        return column
