"""Megatron IndexedDataset (`prefix.idx` + `prefix.bin`), parsed as megatron-core's `indexed_dataset.py` does.

.idx: magic `MMIDIDX\\x00\\x00`, version 1 (uint64), dtype code (uint8), sequence count N (uint64), document
count D (uint64: the length of the document index array, which starts with 0), int32[N] lengths, int64[N] byte
pointers into .bin, int64[D] document indices. One example per sequence:
`{"tokens": np.ndarray of the .idx dtype, "document": int}`. Both files are read in ranged chunks.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np

from ..errors import FormatError
from .sources import expand, source

MAGIC = b"MMIDIDX\x00\x00"
DTYPES = {1: np.uint8, 2: np.int8, 3: np.int16, 4: np.int32, 5: np.int64, 6: np.float64, 7: np.float32, 8: np.uint16}
HEADER = len(MAGIC) + 8 + 1 + 8 + 8
SEQUENCES_PER_CHUNK = 1 << 16
CHUNK_BYTES = 8 << 20


def inputs(src: str | Iterable[str], storage_options: dict[str, Any] | None = None) -> list[str]:
    """Path prefixes: `.../corpus_text_document` for `.idx` and `.bin` (an `.idx` or `.bin` URL works too)."""
    return [url[:-4] if url.endswith((".idx", ".bin")) else url for url in expand(src, storage_options)]


def _header(idx: Any, url: str, size: int) -> tuple[np.dtype, int, int]:
    head = idx.read(HEADER)
    if len(head) < HEADER or head[:9] != MAGIC:
        raise FormatError(f"bad magic {head[:9]!r} (expected {MAGIC!r}): not a Megatron .idx file", url=url)
    version, code, sequences, documents = struct.unpack("<QBQQ", head[9:])
    if version != 1:
        raise FormatError(f"unsupported version {version} (megatron-core writes 1)", url=url)
    if code not in DTYPES:
        raise FormatError(f"unknown dtype code {code} (expected one of {sorted(DTYPES)})", url=url)
    needed = HEADER + sequences * 12 + documents * 8
    if size < needed:
        raise FormatError(
            f"{size} bytes, but {sequences} sequences and {documents} document indices need {needed}: truncated",
            url=url,
        )
    return np.dtype(DTYPES[code]), sequences, documents


def samples(prefixes: str | Iterable[str], storage_options: dict[str, Any] | None = None) -> Iterator[dict]:
    options = storage_options or {}
    for prefix in inputs(prefixes, storage_options):
        idx_url, bin_url = f"{prefix}.idx", f"{prefix}.bin"
        idx_store, bin_store = source(idx_url, options), source(bin_url, options)
        bin_size = bin_store.identity("").size
        with idx_store.open_input() as idx, bin_store.open_input() as data:
            dtype, sequences, documents = _header(idx, idx_url, idx_store.identity("").size)
            idx.seek(HEADER + sequences * 12)
            document_starts = _document_starts(np.frombuffer(idx.read(documents * 8), np.int64), sequences, idx_url)
            end = 0  # where the previous sequence ends in the .bin
            for first in range(0, sequences, SEQUENCES_PER_CHUNK):
                count = min(SEQUENCES_PER_CHUNK, sequences - first)
                idx.seek(HEADER + first * 4)
                lengths = np.frombuffer(idx.read(count * 4), np.int32).astype(np.int64)
                idx.seek(HEADER + sequences * 4 + first * 8)
                pointers = np.frombuffer(idx.read(count * 8), np.int64)
                end = _check_sequences(lengths, pointers, dtype, first, end, idx_url)
                yield from _sequences(data, bin_url, bin_size, dtype, first, lengths, pointers, document_starts)


REBUILD = "the .idx does not describe its .bin (damaged, or not written by megatron-core): rebuild it"


def _document_starts(starts: np.ndarray, sequences: int, url: str) -> np.ndarray:
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


def _check_sequences(lengths: np.ndarray, pointers: np.ndarray, dtype: np.dtype, first: int, end: int, url: str) -> int:
    """Lengths of zero or more, and each sequence starting where the one before it ended or after: megatron-core
    lays them out one after the other. A length of -1 read the whole .bin as each sequence (419 MB from a few
    bytes of .idx); overlapping pointers can make every sequence the whole file. Returns where the last ends
    (_sequences checks that against the .bin)."""
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


def _sequences(
    data: Any,
    url: str,
    size: int,
    dtype: np.dtype,
    first: int,
    lengths: np.ndarray,
    pointers: np.ndarray,
    document_starts: np.ndarray,
) -> Iterator[dict]:
    ends = pointers + lengths * dtype.itemsize
    past = (pointers > size) | (ends > size)  # the first too: a pointer near 2**63 wraps its end around
    if np.any(past):
        at = int(np.argmax(past))
        raise FormatError(
            f"sequence {first + at} ends at byte {int(ends[at])}, but the file holds {size} bytes: "
            f"shorter than its .idx pointers",
            url=url,
        )
    documents = np.searchsorted(document_starts, np.arange(first, first + len(lengths)), side="right") - 1
    i = 0
    while i < len(lengths):  # runs of sequences read in one ranged read of at most CHUNK_BYTES
        j = i + 1
        while j < len(lengths) and pointers[j] == ends[j - 1] and ends[j] - pointers[i] <= CHUNK_BYTES:
            j += 1
        data.seek(int(pointers[i]))
        chunk = data.read(int(ends[j - 1] - pointers[i]))
        for k in range(i, j):
            offset = int(pointers[k] - pointers[i])
            tokens = np.frombuffer(chunk, dtype, count=int(lengths[k]), offset=offset).copy()
            yield {"tokens": tokens, "document": int(documents[k])}
        i = j
