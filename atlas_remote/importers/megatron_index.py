"""Megatron's IndexedDataset index (`prefix.idx`) as data: the header and arrays as megatron-core's
`indexed_dataset.py` writes them, and the checks that the index describes its `.bin` before anything trusts it.
The importer (`convert --from megatron`, which streams the index) and the in-place reader (read/megatron.py, which
reads it whole) both parse with these; nothing here does I/O.

.idx: magic `MMIDIDX\\x00\\x00`, version 1 (uint64), dtype code (uint8), sequence count N (uint64), document
count D (uint64), int32[N] lengths, int64[N] byte pointers into .bin, int64[D] document indices. megatron-core's
writer counts the document index array ([0, ..., N]: one more than the documents); some descriptions of the
format count the documents, the array then one entry longer than D says. Both read as the same documents: the
first D entries are where documents start, and the last document runs to the last sequence.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import numpy as np

from ..errors import FormatError

MAGIC = b"MMIDIDX\x00\x00"
DTYPES = {1: np.uint8, 2: np.int8, 3: np.int16, 4: np.int32, 5: np.int64, 6: np.float64, 7: np.float32, 8: np.uint16}
HEADER = len(MAGIC) + 8 + 1 + 8 + 8
REBUILD = "the .idx does not describe its .bin (damaged, or not written by megatron-core): rebuild it"


@dataclass(frozen=True)
class Header:
    """What an .idx's first HEADER bytes say: the token dtype and the lengths of its three arrays."""

    dtype: np.dtype
    sequences: int
    documents: int  # entries of the document index array, as the header counts them

    @property
    def pointers_at(self) -> int:
        return HEADER + 4 * self.sequences

    @property
    def documents_at(self) -> int:
        return HEADER + 12 * self.sequences

    @property
    def size(self) -> int:
        """Bytes the header and its arrays take (a multimodal index has a byte per sequence more, unread)."""
        return self.documents_at + 8 * self.documents


def header(head: bytes, url: str, size: int) -> Header:
    """The header of an .idx of `size` bytes, refused (FormatError, one line) unless its counts fit the file: a
    header claiming 10^12 sequences is refused here, before anything is allocated for them."""
    if len(head) < HEADER or head[:9] != MAGIC:
        raise FormatError(f"bad magic {head[:9]!r} (expected {MAGIC!r}): not a Megatron .idx file", url=url)
    version, code, sequences, documents = struct.unpack("<QBQQ", head[9:HEADER])
    if version != 1:
        raise FormatError(f"unsupported version {version} (megatron-core writes 1)", url=url)
    if code not in DTYPES:
        raise FormatError(f"unknown dtype code {code} (expected one of {sorted(DTYPES)})", url=url)
    found = Header(np.dtype(DTYPES[code]), sequences, documents)
    if size < found.size:
        raise FormatError(
            f"{size} bytes, but {sequences} sequences and {documents} document indices need {found.size}: truncated",
            url=url,
        )
    return found


def document_starts(starts: np.ndarray, sequences: int, url: str) -> np.ndarray:
    """The document index: from 0, never decreasing, never past the sequences (megatron-core ends it at N)."""
    bad = np.concatenate([starts[:1] != 0, np.diff(starts) < 0]) | (starts > sequences)
    if np.any(bad):
        k = int(np.argmax(bad))
        raise FormatError(
            f"document index {k} is {int(starts[k])}: document indices start at 0 and rise to at most the "
            f"{sequences} sequences; {REBUILD}",
            url=url,
        )
    return starts


def check_sequences(lengths: np.ndarray, pointers: np.ndarray, dtype: np.dtype, first: int, end: int, url: str) -> int:
    """Lengths of zero or more, and each sequence starting where the one before it ended or after: megatron-core
    lays them out one after the other. A length of -1 read the whole .bin as each sequence (419 MB from a few
    bytes of .idx); overlapping pointers can make every sequence the whole file. `first` numbers the first of
    them, `end` is where the sequence before it ends. Returns where the last ends (check `within` the .bin)."""
    starts_after = np.concatenate([[end], pointers[:-1] + lengths[:-1] * dtype.itemsize])
    bad = (lengths < 0) | (pointers < starts_after)
    if np.any(bad):
        k = int(np.argmax(bad))
        problem = (
            f"length {int(lengths[k])}"
            if lengths[k] < 0
            else f"pointer {int(pointers[k])} is inside the sequence before it, which ends at {int(starts_after[k])}"
        )
        raise FormatError(f"sequence {first + k}: {problem}; {REBUILD}", url=url)
    return int(pointers[-1]) + int(lengths[-1]) * dtype.itemsize if len(lengths) else end


def within(lengths: np.ndarray, pointers: np.ndarray, dtype: np.dtype, first: int, size: int, url: str) -> np.ndarray:
    """Where each sequence ends in a .bin of `size` bytes (`url`), refused if any lies past its end."""
    ends = pointers + lengths * dtype.itemsize
    past = (pointers > size) | (ends > size)  # the first too: a pointer near 2**63 wraps its end around
    if np.any(past):
        at = int(np.argmax(past))
        raise FormatError(
            f"sequence {first + at} ends at byte {int(ends[at])}, but the file holds {size} bytes: "
            f"shorter than its .idx pointers",
            url=url,
        )
    return ends
