"""What the viewer's page shows, as JSON-ready dicts, from one open dataset: the dataset at a glance, a page of
examples, the shards, and a sample of blocks. No HTTP here (server.py); every answer says the requests it cost.

Everything is read as the library reads it: ranged reads of the blocks shown, shard tables opened only when
reached, the manifest's per-shard figures where there is one (a dataset without one is listed once, as the CLI's
`info` does). A block the reader refuses becomes its one-line error in place of its examples.
"""

from __future__ import annotations

import pickle
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from ..errors import AtlasError, ExpansionError
from ..format.spec import CHECKSUM_FILE, DATA_FILE
from ..read.discovery import LISTED_AT_OPEN
from ..read.expansion import checked
from ..read.reader import AtlasDataset
from ..read.shards import BlockKey
from ..trust.measure import held_in_memory
from .values import DEPTH, Page, key_text, render

MOST_PER_PAGE = 200
MOST_COLUMNS = 64  # dict examples with more keys than this are shown whole, one column
SAMPLE_SHARDS = 32  # shards a sample reads one block of (evenly spaced; all of them when fewer)
HISTOGRAM_BINS = 30
ORIGINAL_WRITER = "the original writer (torch-atlas-ds), or atlas_remote with checksums=False: both write these files"


class DatasetView:
    """Answers for the page, one at a time (a lock: each answer's request count is its own)."""

    def __init__(self, ds: AtlasDataset) -> None:
        self.ds = ds
        self._lock = threading.Lock()
        self._listing: dict[str, int] | None = None
        self._sample: dict[str, Any] | None = None

    def answer(self, question: Callable[..., dict[str, Any]], *args: Any) -> dict[str, Any]:
        """question(*args), with what it cost: requests by kind, bytes, seconds, and the total since opened."""
        with self._lock:
            before, started = self.ds.stats, time.perf_counter()
            result = question(*args)
            after = self.ds.stats
        requests = {
            k: n - before.requests.get(k, 0) for k, n in after.requests.items() if n > before.requests.get(k, 0)
        }
        result["cost"] = {
            "requests": sum(requests.values()),
            "by_kind": requests,
            "bytes": after.total_bytes - before.total_bytes,
            "seconds": round(time.perf_counter() - started, 4),
            "total_requests": after.total_requests,
        }
        return result

    # -- the dataset at a glance -------------------------------------------------------------------------

    def summary(self) -> dict[str, Any]:
        ds = self.ds
        stored, checksums, block_sizes = self._per_shard()
        with_sums = int(np.count_nonzero(checksums))  # the manifest's column says which sidecar (1 or 2), not a count
        return {
            "url": ds.url,
            "examples": len(ds),
            "examples_in_root": int(sum(ds.metadata.shard_sizes)),
            "shards": len(ds.metadata.shard_sizes),
            "shards_present": len(ds.shards),
            "compression_strategy": ds.metadata.compression_strategy.name,
            "block_sizes": sorted({int(b) for b in block_sizes if b > 0}),
            "bytes_stored": int(stored.sum()),
            "shards_with_checksums": with_sums,
            "manifest": ds.manifest is not None,
            "written_by": "atlas_remote" if ds.manifest is not None or with_sums else ORIGINAL_WRITER,
            "read_client": ds.store.read_client,
            "decoded_estimate": self._sample["decoded_estimate"] if self._sample else None,
        }

    def shards(self) -> dict[str, Any]:
        """Per shard: number, examples, stored bytes (and the compression ratio of the shards sampled)."""
        stored, _, _ = self._per_shard()
        return {
            "numbers": self.ds.table.numbers.tolist(),
            "examples": self.ds.table.sizes.tolist(),
            "bytes": stored.tolist(),
        }

    def _per_shard(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(data.bin bytes, has checksums, block size: 0 where unknown) of each present shard: the manifest's, or
        from one listing of the dataset (and, for a dataset small enough to have been listed at open, every
        shard's meta.json)."""
        table, manifest = self.ds.table, self.ds.manifest
        if manifest is not None and manifest.lists(table.numbers):
            rows = np.searchsorted(manifest.numbers, table.numbers)
            return manifest.data_bytes[rows], manifest.checksums[rows], manifest.block_sizes[rows]
        if self._listing is None:
            self._listing = self.ds.store.find()
        shards = list(self.ds.shards)
        stored = np.array([self._listing.get(s.file(DATA_FILE), 0) for s in shards], dtype=np.int64)
        sums = np.array([s.file(CHECKSUM_FILE) in self._listing for s in shards], dtype=bool)
        block_sizes = np.zeros(len(shards), dtype=np.int64)
        if len(shards) <= LISTED_AT_OPEN:
            block_sizes[:] = [m.block_size for m in self.ds.load_shard_metadata()]
        return stored, sums, block_sizes

    # -- examples ----------------------------------------------------------------------------------------

    def page(self, start: int, count: int) -> dict[str, Any]:
        """Examples start..start+count, each rendered (values.py); dict examples as columns."""
        n = len(self.ds)
        if not 0 <= start < max(n, 1) or not 1 <= count <= MOST_PER_PAGE:
            raise ValueError(f"start must be in [0, {n}) and count in [1, {MOST_PER_PAGE}], got {start} and {count}")
        stop = min(start + count, n)
        read = self._measured(self._examples(start, stop))
        good = [value for value in read.values() if not isinstance(value, AtlasError)]
        columns: list[str] | None = None
        if good and all(isinstance(v, dict) for v in good):
            names = list(dict.fromkeys(key_text(k) for v in good for k in v))
            columns = names if len(names) <= MOST_COLUMNS else None
        rows = []
        shown = Page()
        for i, value in read.items():
            if isinstance(value, AtlasError):
                rows.append({"index": i, "error": str(value)})
            elif columns is not None:
                cells = {key_text(k): v for k, v in value.items()}
                rows.append(
                    {"index": i, "cells": [render(cells[c], 0, shown) if c in cells else None for c in columns]}
                )
            else:
                rows.append({"index": i, "value": render(value, 0, shown)})
        return {"start": start, "stop": stop, "examples": n, "columns": columns, "rows": rows}

    def _measured(self, read: dict[int, Any]) -> dict[int, Any]:
        """What the page draws is cut, yet a stranger's value is measured first (read/expansion.py): one that
        expands past the bound stands as its error."""
        for i, value in read.items():
            if not isinstance(value, AtlasError):
                try:
                    checked(self.ds, i, value, DEPTH + 2, cuts=True)  # as deep as render() goes
                except AtlasError as err:
                    read[i] = err
        return read

    def _examples(self, start: int, stop: int) -> dict[int, Any]:
        """Examples start..stop by index, all blocks read together; if that fails, block by block, so that a
        refused or damaged block stands as its error while the others are shown (and, past what one call may
        hand back, the rest of the page says so)."""
        ds = self.ds
        try:
            return dict(zip(range(start, stop), ds.get_many(range(start, stop))))
        except AtlasError:
            pass
        out: dict[int, Any] = {}
        failed: dict[Any, AtlasError] = {}
        held, budget = 0, ds.options.max_block_bytes  # what one call may hand back (read/call_budget.py)
        for i in range(start, stop):
            if held > budget:
                out[i] = ExpansionError(
                    f"example {i:,} not read: the examples before it on this page hold more than {budget:,} bytes "
                    f"(max_block_bytes): show fewer at a time",
                    url=ds.url,
                )
                continue
            position = ds.table.position_of(i)
            if position in failed:
                out[i] = failed[position]
                continue
            try:
                key, _ = ds.locate(i)
            except AtlasError as err:  # the shard does not open
                out[i] = failed[position] = err
                continue
            if key in failed:
                out[i] = failed[key]
                continue
            try:
                out[i] = ds[i]
                held += held_in_memory([out[i]])
            except AtlasError as err:
                out[i] = failed[key] = err
        return out

    # -- a sample of blocks ------------------------------------------------------------------------------

    def sample(self) -> dict[str, Any]:
        """The middle block of up to SAMPLE_SHARDS shards, evenly spaced: each one's compression ratio, a
        histogram of its examples' pickled sizes, and the dataset's decoded size estimated from them."""
        if self._sample is not None:
            return dict(self._sample)
        ds, table = self.ds, self.ds.table
        positions = sorted(set(np.linspace(0, len(ds.shards) - 1, min(SAMPLE_SHARDS, len(ds.shards))).astype(int)))
        positions = [p for p in positions if table.sizes[p] > 0]
        table.open_many(ds.shards[p] for p in positions)
        keys: list[BlockKey] = []
        for p in positions:
            state = table.state(p)
            keys.append((p, (state.size - 1) // state.meta.block_size // 2))
        sampled, errors, sizes = [], [], []
        read: list[Lengths] = []
        for key, got in self._blocks(keys).items():
            if isinstance(got, AtlasError):
                errors.append(str(got))
                continue
            stored, decoded, pickled, lengths = got
            sizes += pickled
            read.append(lengths)
            sampled.append({"shard": ds.shards[key[0]].number, "block": key[1], "stored": stored, "decoded": decoded})
        stored_total = sum(s["stored"] for s in sampled)
        decoded_total = sum(s["decoded"] for s in sampled)
        counts, edges = np.histogram(sizes, bins=HISTOGRAM_BINS) if sizes else (np.zeros(0), np.zeros(0))
        bytes_stored = int(self._per_shard()[0].sum())
        self._sample = {
            "blocks": sampled,
            "errors": errors,
            "shards_sampled": len(positions),
            "examples_sampled": len(sizes),
            "ratio": round(decoded_total / stored_total, 3) if stored_total else None,
            "decoded_estimate": round(bytes_stored * decoded_total / stored_total) if stored_total else None,
            "histogram": {"edges": edges.tolist(), "counts": counts.astype(int).tolist()},
            "example_bytes": _spread(sizes),
            "documents": _documents(read),
        }
        return dict(self._sample)

    def _blocks(self, keys: list[BlockKey]) -> dict[BlockKey, tuple[int, int, list[int], Lengths] | AtlasError]:
        """(stored bytes, decoded bytes, each example's pickled size, its token lengths) of each block, read
        together, decoded one at a time and let go (nothing cached, never every block in memory at once), or its
        error."""
        loader = self.ds.blocks
        try:
            raw = loader.fetch_raw(keys)
        except AtlasError:
            raw = {}
            for key in keys:
                try:
                    raw.update(loader.fetch_raw([key]))
                except AtlasError as err:
                    raw[key] = err  # type: ignore[assignment]
        out: dict[BlockKey, tuple[int, int, list[int], Lengths] | AtlasError] = {}
        for key in keys:
            got = raw[key]
            if isinstance(got, AtlasError):
                out[key] = got
                continue
            where, data, _ = got
            try:
                decoded = loader.decompress(key, where, data)
                examples = loader.unpickle(key, where, decoded)
                pickled = [len(pickle.dumps(e, pickle.DEFAULT_PROTOCOL)) for e in examples]
                out[key] = (len(data), len(decoded), pickled, _token_lengths(examples))
                del examples, decoded
            except AtlasError as err:
                out[key] = err
        return out


Lengths = dict[Any, list[int]] | None  # a block's token lengths under each key where every example has an array


def _token_lengths(examples: list) -> Lengths:
    """Under each key where every example of a block holds a 1-D integer array (token ids), their lengths; None
    where an example is not a dict. Kept instead of the examples, so a block is let go once measured."""
    if not examples or not all(isinstance(e, dict) for e in examples):
        return None
    return {
        key: [len(e[key]) for e in examples]
        for key in examples[0]
        if all(
            isinstance(v, np.ndarray) and v.ndim == 1 and v.dtype.kind in "iu" for v in (e.get(key) for e in examples)
        )
    }


def _documents(blocks: list[Lengths]) -> dict[str, Any] | None:
    """A token dataset's document lengths in the sample: the first key under which every sampled example holds a
    1-D integer array (token ids), as a histogram; None for other datasets."""
    if not blocks or any(b is None for b in blocks):
        return None
    for key in blocks[0] or {}:
        if all(key in b for b in blocks if b is not None):
            lengths = [n for b in blocks if b is not None for n in b[key]]
            counts, edges = np.histogram(lengths, bins=HISTOGRAM_BINS)
            return {
                "key": key_text(key),
                "histogram": {"edges": edges.tolist(), "counts": counts.astype(int).tolist()},
                "tokens": _spread(lengths),
            }
    return None


def _spread(sizes: list[int]) -> dict[str, float] | None:
    if not sizes:
        return None
    values = np.asarray(sizes)
    return {
        "min": int(values.min()),
        "median": float(np.median(values)),
        "mean": round(float(values.mean()), 1),
        "max": int(values.max()),
    }
