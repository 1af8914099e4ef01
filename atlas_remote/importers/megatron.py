"""Megatron IndexedDataset (`prefix.idx` + `prefix.bin`) converted: one example per sequence,
`{"tokens": np.ndarray of the .idx dtype, "document": int}`. The index is parsed and checked as
`megatron_index.py` says (shared with the in-place reader, read/megatron.py); both files are read in ranged
chunks.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np

from .megatron_index import HEADER, check_sequences, document_starts, header, within
from .sources import expand, source

SEQUENCES_PER_CHUNK = 1 << 16
CHUNK_BYTES = 8 << 20


def inputs(src: str | Iterable[str], storage_options: dict[str, Any] | None = None) -> list[str]:
    """Path prefixes: `.../corpus_text_document` for `.idx` and `.bin` (an `.idx` or `.bin` URL works too)."""
    return [url[:-4] if url.endswith((".idx", ".bin")) else url for url in expand(src, storage_options)]


def samples(prefixes: str | Iterable[str], storage_options: dict[str, Any] | None = None) -> Iterator[dict]:
    options = storage_options or {}
    for prefix in inputs(prefixes, storage_options):
        idx_url, bin_url = f"{prefix}.idx", f"{prefix}.bin"
        idx_store, bin_store = source(idx_url, options), source(bin_url, options)
        bin_size = bin_store.identity("").size
        with idx_store.open_input() as idx, bin_store.open_input() as data:
            head = header(idx.read(HEADER), idx_url, idx_store.identity("").size)
            dtype, sequences = head.dtype, head.sequences
            idx.seek(head.documents_at)
            starts = document_starts(np.frombuffer(idx.read(head.documents * 8), np.int64), sequences, idx_url)
            end = 0  # where the previous sequence ends in the .bin
            for first in range(0, sequences, SEQUENCES_PER_CHUNK):
                count = min(SEQUENCES_PER_CHUNK, sequences - first)
                idx.seek(HEADER + first * 4)
                lengths = np.frombuffer(idx.read(count * 4), np.int32).astype(np.int64)
                idx.seek(head.pointers_at + first * 8)
                pointers = np.frombuffer(idx.read(count * 8), np.int64)
                end = check_sequences(lengths, pointers, dtype, first, end, idx_url)
                ends = within(lengths, pointers, dtype, first, bin_size, bin_url)
                yield from _sequences(data, dtype, first, lengths, pointers, ends, starts)


def _sequences(
    data: Any,
    dtype: np.dtype,
    first: int,
    lengths: np.ndarray,
    pointers: np.ndarray,
    ends: np.ndarray,
    document_starts: np.ndarray,
) -> Iterator[dict]:
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
