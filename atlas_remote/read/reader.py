"""Reading an Atlas dataset from any fsspec URL: one ranged read per uncached block, never a whole data.bin.

The reader is a thin face over three parts: the shard table (shards.py: discovery, lazy open, locate), the
block loader (blocks.py: caches, single-flight, checks) and read-ahead (readahead.py: windows, the pool).

open:    root meta.json and the manifest (2 requests, one round trip); a listing where it is cheap (shards.py).
ds[i]:   shard's index.npy and checksums (+ dictionary; without a manifest, its meta.json and data.bin's size
         too) the first time the shard is touched, then one ranged read of the block, decoded once and kept in
         a bytes-bounded LRU.
batches: grouped by block, deduplicated, missing blocks fetched together (nearby ones merged into one read).
passes:  windows of consecutive blocks read ahead and decompressed on other threads; the iterating thread
         only unpickles.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import Future
from operator import itemgetter
from typing import Any

import numpy as np
import zstandard

from ..errors import AtlasError, DatasetChangedError, DatasetNotFoundError, FormatError, ObjectNotFoundError
from ..format.codec import PicklePolicy
from ..format.manifest import Manifest
from ..format.spec import (
    DATA_FILE,
    SHARD_META,
    AtlasDatasetMetadata,
    AtlasDatasetShardMetadata,
    CompressionStrategy,
    Layout,
)
from ..storage import Store, location
from ..storage.stats import Stats
from .blocks import BlockLoader
from .call_budget import OverBudget, take
from .description import describe
from .discovery import Present, Root, present_shards, read_root
from .options import ReaderOptions
from .readahead import WINDOW_BYTES, Window, plan_windows, read_ahead, split_window
from .shards import BlockKey, Shard, ShardList, ShardTable

# On a local disk there is no latency to hide, but other cores can decompress the next windows while this
# thread unpickles; smaller windows keep what was decompressed in the CPU's cache until it is unpickled.
LOCAL_READAHEAD = 2 if (os.cpu_count() or 1) > 1 else 0
LOCAL_WINDOW_BYTES = 512 * 1024


class AtlasDataset:
    """A read-only, random-access view of an Atlas v1 dataset at any fsspec URL.

    Settings are those of `ReaderOptions` (cache_bytes, max_concurrency, readahead, disk_cache, ...), given as
    keywords or as `options=`. The location is the first argument; `root=` (the original's name) is accepted
    for it too.
    """

    VERSION = 1  # the format version this reader reads (the original's class attribute)

    def __init__(
        self,
        url: str | os.PathLike | None = None,
        storage_options: dict[str, Any] | None = None,
        *,
        root: str | os.PathLike | None = None,
        options: ReaderOptions | None = None,
        **settings: Any,
    ) -> None:
        self.options = ReaderOptions.of(options, **settings)
        self.url = location(url=url, root=root)
        self.storage_options = dict(storage_options or {})
        self.store = Store(self.url, storage_options, self.options.storage)
        opened, present, shared_dictionary = self._discover()
        policy = PicklePolicy(self.options.allowed_classes, self.options.trusted)
        self.table = ShardTable(
            self.store, opened.layout, present, policy, shared_dictionary, opened.manifest, opened.version, self.options
        )
        self.blocks = BlockLoader(self.table)
        self._layout: Layout | None = None

    def _discover(self) -> tuple[Root, Present, bytes | None]:
        """The root meta.json, the manifest and the shards present (shards.present_shards): 2 requests in one
        round trip whatever the number of shards, or one listing more where listing is cheap. A local folder is
        listed while the root is read."""
        store = self.store
        listing = store.beside(store.list_names) if store.can_list and store.is_local else None
        root = read_root(store)  # a missing dataset is reported as such
        return root, present_shards(store, root, listing.result() if listing else None), None

    def __reduce__(self):  # URL, options and settings only; everything else is rebuilt in the new process
        return (_reopen, (type(self), self.url, self.storage_options, self.options, self.table.version))

    def close(self) -> None:
        """Shut every thread this reader made (the store's helpers, the backend's pool, the shard opener); the
        dataset can still be read after, making them again. `with ar.open(url) as ds:` closes at the end."""
        self.table.close()
        self.store.close()

    def __enter__(self) -> AtlasDataset:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def reopen(self) -> AtlasDataset:
        """The dataset at this URL as it is now (after DatasetChangedError: the new version), same settings."""
        return type(self)(self.url, self.storage_options, options=self.options)

    @property
    def metadata(self) -> AtlasDatasetMetadata:
        """The root meta.json, as the original's AtlasDatasetMetadata."""
        return self.table.layout

    @property
    def shards(self) -> ShardList:
        """The shards present, in order (a sequence of `Shard`, each made when asked for)."""
        return self.table.shards

    def open_shard(self, shard: Shard) -> None:
        """Fetch what a shard needs before its blocks can be read, looking at every one of its files (its
        meta.json and data.bin's size too, even where the manifest has them: what verify, cp and checksum
        use); once per process (see ShardTable.open)."""
        self.table.open(shard, every_file=True)

    @property
    def manifest(self) -> Manifest | None:
        """The dataset's manifest when it has a usable one (what let it open without a listing), else None."""
        return self.table.manifest

    @property
    def policy(self) -> PicklePolicy:
        """What blocks may hold (allowed_classes, trusted), as the unpickler applies it."""
        return self.table.policy

    def shard_blocks(self, shard: Shard) -> Iterator[tuple[int, bytes | memoryview, list | AtlasError]]:
        """(block, stored bytes, examples) of every block of a shard, checked and decoded, nothing cached; a block
        that fails comes with its error in place of its examples (and empty bytes if it could not be read). Read
        in merged windows; a window that fails is read again block by block, so every bad block is named."""
        self.open_shard(shard)
        position, blocks = shard.position, self.blocks
        for _, window in self.windows(shard.start, shard.start + shard.size):
            keys = [(position, b) for b in range(window.block, window.stop_block)]
            failed: dict[BlockKey, AtlasError] = {}
            try:
                raw = blocks.fetch_raw(keys)
            except AtlasError:
                raw = {}
                for key in keys:
                    try:
                        raw.update(blocks.fetch_raw([key]))
                    except AtlasError as err:
                        failed[key] = err
            for key in keys:
                if key in failed:
                    yield key[1], b"", failed[key]
                    continue
                where, data, _ = raw[key]
                try:
                    yield key[1], data, blocks.decode(key, where, data).examples
                except AtlasError as err:
                    yield key[1], data, err

    def load_shard_metadata(self) -> list[AtlasDatasetShardMetadata]:
        """Every present shard's meta.json (those not yet fetched come in one concurrent batch)."""
        return self.table.load_metadata()

    def block_ranges(self) -> list[tuple[int, int]]:
        """(start, stop) of every block, as global example indices, in order: what block-aware samplers shuffle."""
        return self.table.block_ranges()

    # -- locating ----------------------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self.table)

    def _normalize(self, index: Any) -> int:
        n = len(self.table)
        if type(index) is int and 0 <= index < n:
            return index
        if isinstance(index, bool) or not isinstance(index, (int, np.integer)):
            raise TypeError(
                f"dataset indices must be integers, slices or sequences of integers, not {type(index).__name__}"
            )
        i = int(index)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError(f"{self.url}: index {index} out of range (the dataset has {n} examples)")
        return i

    def locate(self, index: int) -> tuple[BlockKey, int]:
        """((shard position, block), slot) of example index (negative counts from the end)."""
        return self.table.locate(self._normalize(index))

    # -- random access -----------------------------------------------------------------------------

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, slice):
            return self.get_many(range(*index.indices(len(self))))
        if isinstance(index, (list, tuple, np.ndarray)):
            return self.get_many(index)
        key, slot = self.table.locate(self._normalize(index))
        return self.blocks.get_one(key)[slot]

    def __getitems__(self, indices: Sequence[int]) -> list:
        """What torch's DataLoader calls for a whole batch: one round of concurrent block reads."""
        return self.get_many(indices)

    def get_many(self, indices: Iterable[int]) -> list:
        """Examples in the order asked; each block touched is fetched at most once, all of them together, and
        shards not yet opened are opened together first."""
        table = self.table
        normalized = [self._normalize(i) for i in indices]
        table.open_many(table.shards[p] for p in {table.position_of(i) for i in normalized})
        located = [table.locate(i) for i in normalized]
        try:  # a call decodes at most max_block_bytes at once, as one block may (call_budget.py)
            blocks = self.blocks.get([key for key, _ in located], self.options.max_block_bytes)
        except OverBudget as over:
            return take(self.blocks, located, normalized, over.raw, self.options.max_block_bytes)
        return [blocks[key][slot] for key, slot in located]

    # -- passes ------------------------------------------------------------------------------------

    def __iter__(self) -> Iterator[Any]:
        return self.iter()

    def iter(self, start: int = 0, stop: int | None = None) -> Iterator[Any]:
        """Examples start..stop in order, with the next windows of blocks read and decompressed ahead."""
        # Python code runs once per block; the examples of each block are handed out at C speed.
        return itertools.chain.from_iterable(map(itemgetter(2), self.located_slices(start, stop)))

    def iter_shards(self, rank: int = 0, world_size: int = 1) -> Iterator[Any]:
        """Streaming: the examples of shards rank, rank + world_size, ... in order, with read-ahead."""
        if not 0 <= rank < world_size:
            raise ValueError(f"rank must be in [0, {world_size}), got {rank}")
        ends = self.table.ends
        for position in range(rank, len(ends), world_size):
            yield from self.iter(ends[position] - int(self.table.sizes[position]), ends[position])

    def windows(self, start: int, stop: int, prefetch: int = 0) -> Iterator[tuple[int, Window]]:
        """(shard position, window) runs of blocks covering examples [start, stop), each small enough for one
        read; shards are opened as they are reached, and the next `prefetch` ones in the background."""
        budget = self._window_bytes()
        i = start
        while i < stop:
            position = self.table.position_of(i)
            shard = self.shards[position]
            if prefetch:  # only shards this pass reaches
                coming = self.shards[position + 1 : position + 1 + prefetch]
                self.table.prefetch(s for s in coming if s.start < stop)
            state = self.table.open(shard)
            local_stop = min(stop, shard.start + shard.size) - shard.start
            for window in plan_windows(state.bounds, state.meta.block_size, i - shard.start, local_stop, budget):
                yield position, window
            i = shard.start + local_stop

    def _window_bytes(self) -> int:
        return min(self.options.max_merged_bytes, WINDOW_BYTES if self.store.remote else LOCAL_WINDOW_BYTES)

    def _head_of_first_shard(self, start: int, stop: int) -> tuple[int, Future | None]:
        """A remote pass that reads a whole shard not yet open reads its first window's bytes while the shard
        opens: they start at byte 0, whatever its index says, and the index is what the open fetches. One round
        trip is saved before the first example. (Later shards are opened ahead of the pass, so this is the only
        one that waits; with a disk cache the blocks are likely on disk, so nothing is guessed.)"""
        if start >= stop or not self.store.remote or self.blocks.disk is not None:
            return -1, None
        position = self.table.position_of(start)
        shard = self.shards[position]
        if shard.opened is not None or start != shard.start or stop < shard.start + shard.size:
            return -1, None
        return position, self.store.beside(self.store.read_head, shard.file(DATA_FILE), self._window_bytes(), "block")

    def _first_window_split(self, plan: Iterator[tuple[int, Window]]) -> Iterator[tuple[int, Window]]:
        """The plan with its first window in two parts (split_window), both served by the head already read."""
        for n, (position, window) in enumerate(plan):
            state = self.table.state(position)
            for part in split_window(window, state.bounds, state.meta.block_size) if n == 0 else (window,):
                yield position, part

    def located_slices(self, start: int = 0, stop: int | None = None) -> Iterator[tuple[BlockKey, int, list]]:
        """What `iter` hands out, a block at a time: (block, index of its first example here, its examples within
        start..stop), in order, read ahead."""
        start, stop, _ = slice(start, stop).indices(len(self))
        depth = self.options.readahead if self.store.remote else min(self.options.readahead, LOCAL_READAHEAD)
        blocks = self.blocks
        head_position, head = self._head_of_first_shard(start, stop)

        def fetch(item: tuple[int, Window]) -> dict:
            position, window = item
            keys = [(position, b) for b in range(window.block, window.stop_block)]
            return blocks.fetch_decompressed(keys, head.result() if head and position == head_position else b"")

        plan = self.windows(start, stop, depth)
        if head is not None:
            plan = self._first_window_split(plan)
        for (position, window), fetched in read_ahead(fetch, plan, depth):
            block_size = self.table.state(position).meta.block_size
            base = int(self.table.ends[position]) - int(self.table.sizes[position])
            for block in range(window.block, window.stop_block):
                key = (position, block)
                part = window.slice_of(block, block_size)
                yield key, base + block * block_size + part.start, blocks.examples_of(key, fetched[key])[part]

    # -- for passes that do not come back ------------------------------------------------------------

    def layout(self) -> Layout:
        """The shards present, their examples and block sizes: what an epoch is planned from (the manifest's, or
        every present shard's meta.json, fetched together once)."""
        if self._layout is None:
            table, manifest = self.table, self.table.manifest
            if manifest is not None and manifest.lists(table.numbers):
                self._layout = manifest.layout(table.numbers)
            else:
                self._layout = Layout.of(table.sizes, [m.block_size for m in table.load_metadata()])
        return self._layout

    def read(self, indices: Sequence[int] | np.ndarray) -> list:
        """Examples at indices (non-negative), in that order: each block fetched once, its shard opened if
        needed, and nothing kept in the memory cache (for passes that do not come back: an epoch's windows)."""
        wanted = np.asarray(indices, dtype=np.int64).ravel()
        if not len(wanted):
            return []
        if wanted.min() < 0 or wanted.max() >= len(self):
            bad = int(wanted.min()) if wanted.min() < 0 else int(wanted.max())
            raise IndexError(f"{self.url}: index {bad} out of range (the dataset has {len(self)} examples)")
        table = self.table
        positions = np.searchsorted(table.ends_array, wanted, side="right")
        present = np.unique(positions).tolist()
        table.open_many(table.shards[p] for p in present)
        blocks, slots = np.empty_like(wanted), np.empty_like(wanted)
        for p in present:
            state, mine = table.state(p), positions == p
            start = table.ends[p] - state.size
            blocks[mine], slots[mine] = np.divmod(wanted[mine] - start, state.meta.block_size)
        located = list(zip(positions.tolist(), blocks.tolist()))
        fetched = self.blocks.fetch_decompressed(list(dict.fromkeys(located)))
        examples = {key: self.blocks.examples_of(key, got) for key, got in fetched.items()}
        return [examples[key][slot] for key, slot in zip(located, slots.tolist())]

    # -- taking data out (export.py) --------------------------------------------------------------

    def rows(self, start: int = 0, stop: int | None = None) -> Iterator[dict[str, Any]]:
        """Examples start..stop as dicts (a dict example as it is, any other as {"item": example}), in order:
        what `datasets.Dataset.from_generator(ds.rows)` takes."""
        from .export import rows

        return rows(self, start, stop)

    def to_arrow(self, start: int = 0, stop: int | None = None, schema: Any = None) -> Any:
        """Examples start..stop (all by default) as a pyarrow Table: dict keys as columns (export.py)."""
        from .export import to_arrow

        return to_arrow(self, start, stop, schema)

    def to_pandas(self, start: int = 0, stop: int | None = None) -> Any:
        """Examples start..stop (all by default) as a pandas DataFrame of the examples' own values."""
        from .export import to_pandas

        return to_pandas(self, start, stop)

    def to_hf(self, start: int = 0, stop: int | None = None, **from_generator: Any) -> Any:
        """Examples start..stop (all by default) as a Hugging Face `datasets.Dataset`."""
        from .export import to_hf

        return to_hf(self, start, stop, **from_generator)

    def to_parquet(self, dest: str, storage_options: dict[str, Any] | None = None, **options: Any) -> Any:
        """Examples (start=, stop=) as one Parquet file at dest, any URL (export.to_parquet)."""
        from .export import to_parquet

        return to_parquet(self, dest, storage_options, **options)

    # -- reporting ---------------------------------------------------------------------------------

    @property
    def stats(self) -> Stats:
        """A snapshot of the requests, bytes and cache hits of this process so far."""
        stats = self.store.snapshot()  # a forked child's counts start at zero (forksafe)
        for name, n in self.blocks.counts.items():
            setattr(stats, name, n)
        return stats

    def reset_stats(self) -> None:
        self.store.reset_stats()
        self.blocks.reset_counts()

    def describe(self) -> dict[str, Any]:
        """What `atlas-remote info` reports, as data (description.py)."""
        return describe(self)

    def __repr__(self) -> str:
        return (
            f"AtlasDataset({self.url!r}, examples={len(self)}, shards={len(self.shards)}/"
            f"{len(self.table.layout.shard_sizes)}, compression_strategy={self.table.layout.compression_strategy.name})"
        )


class AtlasDatasetShard(AtlasDataset):
    """One shard folder read on its own, at any URL: the original's standalone shard reader.

    `len()` is the shard's stored_examples and `metadata` its meta.json. A shard of a dataset stored with a
    shared dictionary needs that dictionary (the root's zstd_dict.bin) as `compression_dict_bytes`.
    Every AtlasDataset setting applies.
    """

    def __init__(
        self,
        root: str | os.PathLike | None = None,
        mmap_index: bool = True,
        compression_dict_bytes: bytes | zstandard.ZstdCompressionDict | None = None,
        storage_options: dict[str, Any] | None = None,
        *,
        url: str | os.PathLike | None = None,
        **settings: Any,
    ) -> None:
        if isinstance(compression_dict_bytes, zstandard.ZstdCompressionDict):
            compression_dict_bytes = compression_dict_bytes.as_bytes()
        self.compression_dict_bytes = compression_dict_bytes
        super().__init__(location(url=url, root=root), storage_options, mmap_index=mmap_index, **settings)

    def _discover(self) -> tuple[Root, Present, bytes | None]:
        """The shard's meta.json stands in for a root: one shard, stored as the shard says."""
        try:
            raw = self.store.read(SHARD_META, "meta")
        except ObjectNotFoundError as err:
            self.store.check_bucket()
            raise DatasetNotFoundError(f"no {SHARD_META} here: not an Atlas shard folder", url=self.url) from err
        try:
            self._shard_metadata = AtlasDatasetShardMetadata.from_json(raw, SHARD_META)
        except FormatError as err:
            raise err.located(url=self.url)
        strategy = self._shard_metadata.compression_strategy
        if strategy == CompressionStrategy.SHARED_DICTIONARY_COMPRESSION and self.compression_dict_bytes is None:
            raise ValueError(
                f"{self.url}: this shard is stored with the dataset's shared dictionary: pass it as "
                f"compression_dict_bytes (the zstd_dict.bin beside the shard folders)"
            )
        layout = AtlasDatasetMetadata(self.VERSION, [self._shard_metadata.stored_examples], strategy)
        return Root(layout, None, None), Present(np.zeros(1, np.int64), [""]), self.compression_dict_bytes

    @property
    def metadata(self) -> AtlasDatasetShardMetadata:  # type: ignore[override]  # the original's shard API
        """The shard's meta.json, as the original's AtlasDatasetShardMetadata."""
        return self._shard_metadata

    def __reduce__(self):
        return (_reopen_shard, (self.url, self.compression_dict_bytes, self.storage_options, self.options))


def _reopen_shard(
    url: str, dictionary: bytes | None, storage_options: dict, options: ReaderOptions
) -> AtlasDatasetShard:
    return AtlasDatasetShard(url, options.mmap_index, dictionary, storage_options, options=options)


def _reopen(
    cls: type[AtlasDataset], url: str, storage_options: dict, options: ReaderOptions, version: Any = None
) -> AtlasDataset:
    """The dataset in another process: the version its parent opened, or DatasetChangedError (a worker started
    after an overwrite must not serve the new version to a sampler planned on the old)."""
    dataset = cls(url, storage_options, options=options)
    if version is not None and dataset.table.version != version:
        raise DatasetChangedError(
            "the dataset was rewritten after it was opened in the parent process: open it again there "
            "(ds.reopen()) to read the new version",
            url=url,
        )
    return dataset


def open(url: str, storage_options: dict[str, Any] | None = None, **settings: Any) -> AtlasDataset:
    """Open the Atlas dataset at url (any fsspec URL or local path). See ReaderOptions for the settings."""
    return AtlasDataset(url, storage_options, **settings)
