"""Reading an Atlas dataset from any fsspec URL: one ranged read per uncached block, never a whole data.bin.

open:    root meta.json (1 request) + one listing of the root (1 request); shard sizes come from the root.
ds[i]:   shard's meta.json + index.npy (+ dictionary) the first time the shard is touched, then one ranged
         read of the block, decoded once and kept in a bytes-bounded LRU.
batches: grouped by block, deduplicated, missing blocks fetched together (nearby ones merged into one read).
"""

from __future__ import annotations

import bisect
import itertools
import os
import threading
import zlib
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Iterable, Iterator, Sequence

import numpy as np
import zstandard

from .cache import DecodedBlock, DiskBlockCache, MemoryBlockCache
from .codec import DEFAULT_MAX_BLOCK_BYTES, BlockDecoder, PicklePolicy
from .errors import AtlasError, CorruptBlockError, DatasetChangedError, DatasetNotFoundError, FormatError
from .format import (
    CHECKSUM_FILE,
    DATA_FILE,
    DICT_FILE,
    INDEX_FILE,
    ROOT_META,
    SHARD_META,
    AtlasDatasetMetadata,
    AtlasDatasetShardMetadata,
    CompressionStrategy,
    check_index,
    decode_checksums,
    decode_index,
    parse_shard_name,
    shard_name,
)
from .commit import pending_journals
from .errors import ObjectNotFoundError
from .storage import ByteRange, ObjectIdentity, Stats, Store, location

BlockKey = tuple[int, int]  # (position of the shard in ds.shards, block number)
RawBlocks = dict[BlockKey, tuple[ByteRange, bytes, bool]]  # range, bytes, and whether they came from the disk cache
# Read-ahead windows this small start arriving soon, yet are large enough that the request latency is amortised.
READAHEAD_WINDOW_BYTES = 2 * 1024 * 1024


class Shard:
    """A dataset's record of one shard folder. Its meta.json, index.npy and dictionary are fetched once, when
    first needed. (`AtlasDatasetShard`, below, is the original's standalone reader of one shard folder.)"""

    def __init__(self, number: int, name: str, size: int) -> None:
        self.number = number  # the shard's number in the dataset (its folder name as an integer)
        self.name = name
        self.size = size  # from the root's shard_sizes, checked against meta.json when the shard is opened
        self.meta: AtlasDatasetShardMetadata | None = None
        self.offsets: np.ndarray | None = None
        self.decoder: BlockDecoder | None = None
        self.identity: ObjectIdentity | None = None  # of data.bin, when the shard was opened
        self.checksums: np.ndarray | None = None  # CRC-32 of each stored block, when the writer recorded them
        self.lock = threading.Lock()

    def __len__(self) -> int:
        return self.size

    def __repr__(self) -> str:
        return f"Shard({self.name!r}, examples={self.size})"

    def file(self, name: str) -> str:
        """The path of one of the shard's files, relative to the store's root (a lone shard is the root)."""
        return f"{self.name}/{name}" if self.name else name

    def block_range(self, block: int) -> ByteRange:
        return ByteRange(self.file(DATA_FILE), int(self.offsets[block]), int(self.offsets[block + 1]))

    def examples_in_block(self, block: int) -> int:
        return min(self.meta.block_size, self.size - block * self.meta.block_size)


class AtlasDataset:
    """A read-only, random-access view of an Atlas v1 dataset at any fsspec URL.

    Settings:
        cache_bytes: bound of the in-memory LRU of decoded blocks (decompressed size).
        max_concurrency: requests in flight at once for a batch or a read-ahead window.
        readahead: windows of consecutive blocks kept in flight while iterating.
        max_gap_bytes, max_merged_bytes: block reads are merged into one request when the gap between them is
            at most max_gap_bytes (0: only blocks that touch, so no byte is fetched in vain) and the merged read
            stays within max_merged_bytes. A larger gap trades bytes for fewer requests.
        allowed_classes, trusted: the pickle policy (see `codec.PicklePolicy`).
        disk_cache, disk_cache_bytes: a local folder for raw block bytes, shared by every process that names
            it (DataLoader workers, several jobs on one node), and its bound in bytes. Off by default.
        retries, timeout: each request to a remote store is tried up to retries + 1 times (transient
            failures only, with jittered backoff); timeout bounds one request in seconds (S3 and HTTP; gcsfs
            applies its own).
        mmap_index: on a local path, index.npy files are memory-mapped rather than read (the original's option).

    The location is the first argument; `root=` (the original's name) is accepted for it too.
    """

    VERSION = 1  # the format version this reader reads (the original's class attribute)

    def __init__(
        self,
        url: str | os.PathLike | None = None,
        storage_options: dict[str, Any] | None = None,
        *,
        root: str | os.PathLike | None = None,
        mmap_index: bool = True,
        cache_bytes: int = 256 * 1024 * 1024,
        max_concurrency: int = 32,
        readahead: int = 4,
        max_gap_bytes: int = 0,
        max_merged_bytes: int = 8 * 1024 * 1024,
        allowed_classes: Iterable[type | str] = (),
        trusted: bool = False,
        max_block_bytes: int = DEFAULT_MAX_BLOCK_BYTES,
        disk_cache: str | None = None,
        disk_cache_bytes: int = 10 * 1024**3,
        retries: int = 4,
        timeout: float = 60.0,
    ) -> None:
        if readahead < 0 or max_concurrency < 1:
            raise ValueError("readahead must be >= 0 and max_concurrency >= 1")
        self._settings = dict(
            mmap_index=mmap_index, cache_bytes=cache_bytes, max_concurrency=max_concurrency, readahead=readahead,
            max_gap_bytes=max_gap_bytes, max_merged_bytes=max_merged_bytes,
            allowed_classes=tuple(allowed_classes), trusted=trusted, max_block_bytes=max_block_bytes,
            disk_cache=disk_cache, disk_cache_bytes=disk_cache_bytes, retries=retries, timeout=timeout,
        )
        self.url = url = location(url=url, root=root)
        self.storage_options = dict(storage_options or {})
        self._store = Store(url, storage_options, max_concurrency=max_concurrency, max_gap_bytes=max_gap_bytes,
                            max_merged_bytes=max_merged_bytes, retries=retries, timeout=timeout)
        self._policy = PicklePolicy(allowed_classes, trusted)
        self._cache = MemoryBlockCache(cache_bytes)
        self._disk = DiskBlockCache(disk_cache, disk_cache_bytes) if disk_cache else None
        self._lock = threading.Lock()
        self._inflight: dict[BlockKey, Future] = {}
        self._pid = os.getpid()
        self._decoders: dict[Any, BlockDecoder] = {}
        self._dictionary_lock = threading.Lock()
        self._layout = self._read_root_meta()  # the root meta.json: shard sizes and the dataset's strategy
        self.shards = self._find_shards()
        self._ends = list(itertools.accumulate(len(s) for s in self.shards))

    # -- pickling: URL, options and settings only; everything else is rebuilt in the new process --------

    def __reduce__(self):
        return (_reopen, (type(self), self.url, self.storage_options, self._settings))

    @property
    def metadata(self) -> AtlasDatasetMetadata:
        """The root meta.json, as the original's AtlasDatasetMetadata."""
        return self._layout

    @property
    def store(self) -> Store:
        """The Store this dataset reads through (its requests are what `stats` counts)."""
        return self._store

    # -- opening ---------------------------------------------------------------------------------

    def _read_root_meta(self) -> AtlasDatasetMetadata:
        try:
            raw = self._store.read(ROOT_META, "meta")
        except ObjectNotFoundError as err:
            self._store.check_bucket()  # a missing bucket is named as such (one more request, on this path only)
            if pending_journals(self._store):
                raise DatasetNotFoundError(
                    f"no {ROOT_META}: a commit here was interrupted; `atlas-remote recover URL` (or the next "
                    f"writer) finishes it", url=self.url) from err
            raise DatasetNotFoundError(f"no {ROOT_META} here: not an Atlas dataset, or not committed yet",
                                       url=self.url) from err
        try:
            return AtlasDatasetMetadata.from_json(raw, ROOT_META)
        except FormatError as err:
            raise err.located(url=self.url)

    def _find_shards(self) -> list[Shard]:
        """The shard folders present: one listing, or, where the store cannot list, all that the root names."""
        sizes = self._layout.shard_sizes
        if not self._store.can_list:
            return [Shard(n, shard_name(n, len(sizes)), size) for n, size in enumerate(sizes)]
        shards = []
        for name in self._store.list_names():
            number = parse_shard_name(name)
            if number is None:
                continue
            if number >= len(sizes):
                raise FormatError(f"shard folder {name!r} is beyond the {len(sizes)} shards listed in {ROOT_META}",
                                  url=self.url, shard=name)
            shards.append(Shard(number, name, sizes[number]))
        return sorted(shards, key=lambda s: s.number)

    def open_shard(self, shard: Shard) -> None:
        """Fetch what a shard needs before its blocks can be read (meta, offsets, checksums, decoder): once per
        process, whatever the threads.

        One round trip: meta.json, index.npy, the checksum sidecar (if the writer left one), the shard's own
        dictionary when the root says shards have one (one that fell back to standard compression has none),
        and, beside them, data.bin's identity (size and version), which the index is checked against and
        which later tells a rewritten dataset from a corrupt one.
        """
        if shard.decoder is not None:
            return
        self._after_fork()
        try:
            with shard.lock:
                if shard.decoder is None:
                    self._open_shard_locked(shard)
        except AtlasError as err:
            raise err.located(url=self.url, shard=shard.name)

    def _open_shard_locked(self, shard: Shard) -> None:
        identity = self._store.beside(self._store.identity, shard.file(DATA_FILE))
        wanted = [(shard.file(name), kind) for name, kind in
                  ((SHARD_META, "meta"), (INDEX_FILE, "index"), (CHECKSUM_FILE, "checksums"))]
        mapped = self._settings["mmap_index"] and self._store.is_local
        if mapped:
            wanted.pop(1)
        if shard.meta is not None:  # already fetched by block_ranges()
            wanted.pop(0)
        if self._layout.compression_strategy == CompressionStrategy.DICTIONARY_COMPRESSION:
            wanted.append((shard.file(DICT_FILE), "dict"))
        elif self._layout.compression_strategy == CompressionStrategy.SHARED_DICTIONARY_COMPRESSION \
                and "shared" not in self._decoders:
            wanted.append((DICT_FILE, "dict"))  # the first shard opened brings the shared dictionary too
        bodies = self._store.read_many(wanted)
        meta = shard.meta or self._parse_shard_meta(shard, bodies.pop(0))
        index_path = shard.file(INDEX_FILE)
        raw_index = self._store.map_array(index_path, "index") if mapped else bodies.pop(0)
        raw_sums, *raw_dict = bodies
        if isinstance(raw_index, AtlasError):
            raise raw_index
        if isinstance(raw_sums, AtlasError) and not isinstance(raw_sums, ObjectNotFoundError):
            raise raw_sums
        offsets = check_index(raw_index, meta, index_path) if mapped else decode_index(raw_index, meta, index_path)
        largest = int(np.diff(offsets).max(initial=0))
        if largest > self._settings["max_block_bytes"]:
            raise FormatError(f"a block of {largest} bytes is above the max_block_bytes limit", path=index_path)
        try:
            shard.identity = identity.result()
        except ObjectNotFoundError:
            if meta.stored_examples:
                raise
            shard.identity = ObjectIdentity(self._store.url_of(shard.file(DATA_FILE)), 0, "absent")
        if int(offsets[-1]) != shard.identity.size:
            raise FormatError(
                f"the blocks end at byte {int(offsets[-1])} but {DATA_FILE} holds {shard.identity.size} bytes: "
                f"index.npy does not match data.bin", path=index_path)
        if not isinstance(raw_sums, AtlasError):
            shard.checksums = decode_checksums(raw_sums, meta, shard.file(CHECKSUM_FILE))
        shard.offsets, shard.meta = offsets, meta
        shard.decoder = self._decoder_for(shard, raw_dict[0] if raw_dict else None)

    def _parse_shard_meta(self, shard: Shard, raw: bytes | AtlasError) -> AtlasDatasetShardMetadata:
        if isinstance(raw, AtlasError):
            raise raw
        where = shard.file(SHARD_META)
        meta = AtlasDatasetShardMetadata.from_json(raw, where)
        if meta.stored_examples != shard.size:
            raise FormatError(f"stored_examples is {meta.stored_examples} but the root {ROOT_META} says shard "
                              f"{shard.number} holds {shard.size}", path=where)
        return meta

    def load_shard_metadata(self) -> list[AtlasDatasetShardMetadata]:
        """Every present shard's meta.json (those not yet fetched come in one concurrent batch)."""
        todo = [shard for shard in self.shards if shard.meta is None]
        for shard, raw in zip(todo, self._store.read_many([(s.file(SHARD_META), "meta") for s in todo])):
            try:
                meta = self._parse_shard_meta(shard, raw)
            except AtlasError as err:
                raise err.located(url=self.url, shard=shard.name)
            with shard.lock:
                shard.meta = shard.meta or meta
        return [shard.meta for shard in self.shards]

    def block_ranges(self) -> list[tuple[int, int]]:
        """(start, stop) of every block, as global example indices, in order: what block-aware samplers shuffle.

        Needs every shard's meta.json (for its block size).
        """
        self.load_shard_metadata()
        ranges = []
        for position, shard in enumerate(self.shards):
            base, block_size = (self._ends[position - 1] if position else 0), shard.meta.block_size
            ranges += [(base + b * block_size, base + min((b + 1) * block_size, shard.size))
                       for b in range(shard.meta.num_blocks)]
        return ranges

    def iter_shards(self, rank: int = 0, world_size: int = 1) -> Iterator[Any]:
        """Streaming: the examples of shards rank, rank + world_size, ... in order, with read-ahead."""
        if not 0 <= rank < world_size:
            raise ValueError(f"rank must be in [0, {world_size}), got {rank}")
        for position in range(rank, len(self.shards), world_size):
            yield from self.iter(self._ends[position - 1] if position else 0, self._ends[position])

    def _decoder_for(self, shard: Shard, fetched_dictionary: bytes | AtlasError | None) -> BlockDecoder:
        """The shard's decoder: its own dictionary's, or the one shared by every shard stored the same way."""
        strategy = shard.meta.compression_strategy
        if strategy == CompressionStrategy.DICTIONARY_COMPRESSION:
            if fetched_dictionary is None:
                fetched_dictionary = self._store.read_many([(shard.file(DICT_FILE), "dict")])[0]
            if isinstance(fetched_dictionary, AtlasError):
                raise fetched_dictionary
            return BlockDecoder(True, fetched_dictionary, self._policy, self._settings["max_block_bytes"])
        key = "shared" if strategy == CompressionStrategy.SHARED_DICTIONARY_COMPRESSION else strategy
        with self._dictionary_lock:  # one fetch of the shared dictionary, however many threads open shards
            decoder = self._decoders.get(key)
            if decoder is None:
                dictionary = None
                if key == "shared":
                    dictionary = fetched_dictionary if fetched_dictionary is not None else self._store.read(DICT_FILE, "dict")
                    if isinstance(dictionary, AtlasError):
                        raise dictionary
                decoder = self._decoders[key] = BlockDecoder(
                    strategy != CompressionStrategy.NO_COMPRESSION, dictionary, self._policy,
                    self._settings["max_block_bytes"],
                )
        return decoder

    # -- locating ----------------------------------------------------------------------------------

    def __len__(self) -> int:
        return self._ends[-1] if self._ends else 0

    def _normalize(self, index: Any) -> int:
        try:
            i = int(index) if not isinstance(index, bool) and isinstance(index, (int, np.integer)) else None
        except TypeError:
            i = None
        if i is None:
            raise TypeError(f"dataset indices must be integers, slices or sequences of integers, not {type(index).__name__}")
        n = len(self)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError(f"{self.url}: index {index} out of range (the dataset has {n} examples)")
        return i

    def _locate(self, i: int) -> tuple[BlockKey, int]:
        """((shard position, block), slot) of global example i (already normalised)."""
        position = bisect.bisect_right(self._ends, i)
        shard = self.shards[position]
        self.open_shard(shard)
        local = i - (self._ends[position - 1] if position else 0)
        block, slot = divmod(local, shard.meta.block_size)
        return (position, block), slot

    # -- access ----------------------------------------------------------------------------------

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, slice):
            return self.get_many(range(*index.indices(len(self))))
        if isinstance(index, (list, tuple, np.ndarray)):
            return self.get_many(index)
        key, slot = self._locate(self._normalize(index))
        return self._load_blocks([key])[key][slot]

    def __getitems__(self, indices: Sequence[int]) -> list:
        """What torch's DataLoader calls for a whole batch: one round of concurrent block reads."""
        return self.get_many(indices)

    def get_many(self, indices: Iterable[int]) -> list:
        """Examples in the order asked; each block touched is fetched at most once, all of them together."""
        located = [self._locate(self._normalize(i)) for i in indices]
        blocks = self._load_blocks([key for key, _ in located])
        return [blocks[key][slot] for key, slot in located]

    def __iter__(self) -> Iterator[Any]:
        return self.iter()

    def iter(self, start: int = 0, stop: int | None = None) -> Iterator[Any]:
        """Examples start..stop in order, with the next windows of blocks already in flight."""
        # Python code runs once per block; the examples of each block are handed out at C speed.
        return itertools.chain.from_iterable(self._block_slices(start, stop))

    def _block_slices(self, start: int, stop: int | None) -> Iterator[list]:
        start, stop, _ = slice(start, stop).indices(len(self))
        if start >= stop:
            return
        windows = self._windows(start, stop)
        depth = self._settings["readahead"] if self._store.remote else 0  # a local read has no latency to hide
        if depth == 0:
            for keys, first, end in windows:
                blocks = self._scan_decode(self._scan_fetch(keys))
                yield from (blocks[key][self._window_slice(key, first, end)] for key in keys)
            return
        last_shard = bisect.bisect_right(self._ends, stop - 1)
        next_to_open = bisect.bisect_right(self._ends, start)
        with ThreadPoolExecutor(max_workers=depth, thread_name_prefix="atlas-readahead") as pool:

            def submit(window):
                nonlocal next_to_open
                while next_to_open <= min(window[0][0][0] + depth, last_shard):  # metadata of coming shards early
                    pool.submit(self.open_shard, self.shards[next_to_open])
                    next_to_open += 1
                return window, pool.submit(self._scan_fetch, window[0])

            pending = deque(submit(w) for w in itertools.islice(windows, depth))
            try:
                while pending:
                    (keys, first, end), future = pending.popleft()
                    nxt = next(windows, None)
                    if nxt is not None:
                        pending.append(submit(nxt))
                    blocks = self._scan_decode(future.result())
                    yield from (blocks[key][self._window_slice(key, first, end)] for key in keys)
            finally:
                for _, future in pending:
                    future.cancel()

    def _windows(self, start: int, stop: int) -> Iterator[tuple[list[BlockKey], int, int]]:
        """Runs of consecutive blocks of one shard, each small enough for one merged read.

        Yields (block keys, first, end): the examples first..end (shard-local) that the run covers.
        """
        budget = min(self._settings["max_merged_bytes"], READAHEAD_WINDOW_BYTES)
        i = start
        while i < stop:
            position = bisect.bisect_right(self._ends, i)
            shard = self.shards[position]
            self.open_shard(shard)
            base = self._ends[position - 1] if position else 0
            first, shard_stop = i - base, min(stop, self._ends[position]) - base
            block_size = shard.meta.block_size
            block, last = first // block_size, (shard_stop - 1) // block_size
            # the furthest block ending within the budget from this one's start (always at least this one)
            within = int(np.searchsorted(shard.offsets, int(shard.offsets[block]) + budget, side="right")) - 2
            stop_block = min(max(within, block), last) + 1
            end = min(stop_block * block_size, shard_stop)
            yield [(position, b) for b in range(block, stop_block)], first, end
            i = base + end

    def _window_slice(self, key: BlockKey, first: int, end: int) -> slice:
        """The part of a block that the shard-local examples first..end cover."""
        base = key[1] * self.shards[key[0]].meta.block_size
        return slice(max(first - base, 0), end - base)

    # -- blocks ----------------------------------------------------------------------------------

    def _load_blocks(self, keys: Iterable[BlockKey]) -> dict[BlockKey, list]:
        """Decoded blocks for keys: from the cache, from a thread already fetching them, or fetched now."""
        self._after_fork()
        found: dict[BlockKey, list] = {}
        owned: list[BlockKey] = []
        waiting: dict[BlockKey, Future] = {}
        with self._lock:
            for key in dict.fromkeys(keys):
                cached = self._cache.get(key)
                if cached is not None:
                    found[key] = cached.examples
                elif key in self._inflight:
                    waiting[key] = self._inflight[key]
                else:
                    self._inflight[key] = Future()
                    owned.append(key)
        self._store.count_cache(cache_hits=len(found) + len(waiting), cache_misses=len(owned))
        if owned:
            try:
                fetched = self._fetch(owned)
            except BaseException as err:
                with self._lock:
                    for key in owned:
                        self._inflight.pop(key).set_exception(err)
                raise
            with self._lock:
                for key in owned:
                    self._cache.put(key, fetched[key])
                    self._inflight.pop(key).set_result(fetched[key].examples)
            found.update((key, block.examples) for key, block in fetched.items())
        for key, future in waiting.items():
            found[key] = future.result()
        return found

    def _scan_fetch(self, keys: list[BlockKey]) -> tuple[dict[BlockKey, list], RawBlocks]:
        """For a sequential pass: the cached blocks, and the raw bytes of the rest (fetched, not decoded,
        so read-ahead threads only wait on I/O and the iterating thread does all the decoding)."""
        self._after_fork()
        cached: dict[BlockKey, list] = {}
        for key in keys:
            block = self._cache.get(key)
            if block is not None:
                cached[key] = block.examples
        missing = [key for key in keys if key not in cached]
        self._store.count_cache(cache_hits=len(cached), cache_misses=len(missing))
        return cached, self._fetch_raw(missing)

    def _scan_decode(self, fetched: tuple[dict[BlockKey, list], RawBlocks]) -> dict[BlockKey, list]:
        """The blocks of a pass, decoded but not put in the cache (a scan would evict what random access
        needs), and without single-flight bookkeeping (a pass does not ask twice for what it reads ahead)."""
        cached, raw = fetched
        return {**cached, **{key: block.examples for key, block in self._decode_all(raw).items()}}

    def _after_fork(self) -> None:
        """In a forked child, fetches the parent had in flight will never finish: forget them."""
        if self._pid != os.getpid():
            self._pid = os.getpid()
            self._lock, self._dictionary_lock = threading.Lock(), threading.Lock()
            self._inflight = {}
            self._cache.after_fork()
            self._store.fs  # noqa: B018  (resets the store's lock and counters in this process)
            for shard in self.shards:
                shard.lock = threading.Lock()

    def _fetch(self, keys: list[BlockKey]) -> dict[BlockKey, DecodedBlock]:
        return self._decode_all(self._fetch_raw(keys))

    def _fetch_raw(self, keys: list[BlockKey]) -> RawBlocks:
        """Each block's range and bytes (from the disk cache, or fetched together), and whether it was on disk."""
        ranges = {key: self.shards[key[0]].block_range(key[1]) for key in keys}
        raw: RawBlocks = {}
        if self._disk is not None:
            for key in keys:
                data = self._disk.get(self._disk_key(key, ranges[key]))
                if data is not None:
                    raw[key] = (ranges[key], data, True)
            self._store.count_cache(disk_hits=len(raw), disk_misses=len(keys) - len(raw))
        missing = [key for key in keys if key not in raw]
        try:
            fetched = self._store.read_ranges([ranges[key] for key in missing], "block")
        except AtlasError as err:
            for position in sorted({p for p, _ in missing}):
                self._raise_if_changed(self.shards[position], err)
            failed = [key for key in missing if err.byte_range is None or ranges[key].path == err.path
                      and ranges[key].start < err.byte_range[1] and err.byte_range[0] < ranges[key].end]
            position, block = failed[0] if failed else missing[0]
            raise err.located(url=self.url, shard=self.shards[position].name, block=block)
        raw.update((key, (ranges[key], fetched[ranges[key]], False)) for key in missing)
        return raw

    def _decode_all(self, raw: RawBlocks) -> dict[BlockKey, DecodedBlock]:
        decoded = {key: self._decode(key, where, data) for key, (where, data, _) in raw.items()}
        if self._disk is not None:  # only blocks that decoded are kept
            for key, (where, data, on_disk) in raw.items():
                if not on_disk:
                    self._disk.put(self._disk_key(key, where), data)
        return decoded

    def _raise_if_changed(self, shard: Shard, error: Exception) -> None:
        """If data.bin is no longer the object this reader opened, say so: the dataset was rewritten."""
        try:
            now = self._store.identity(shard.file(DATA_FILE))
        except ObjectNotFoundError:
            now = None
        except AtlasError:
            return  # cannot tell: the original error stands
        if now != shard.identity:
            raise DatasetChangedError(
                f"rewritten while this reader had it open (data.bin was {shard.identity.size} bytes, version "
                f"{shard.identity.version!r}; now {'gone' if now is None else f'{now.size} bytes, version {now.version!r}'}"
                f"); open the dataset again", url=self.url, shard=shard.name) from error

    def _disk_key(self, key: BlockKey, where: ByteRange) -> tuple:
        return (self.shards[key[0]].identity, where.start, where.end)

    def _decode(self, key: BlockKey, where: ByteRange, raw: bytes) -> DecodedBlock:
        """Check a block's bytes (length, checksum) before decoding them, and its example count after."""
        shard, block = self.shards[key[0]], key[1]
        try:
            if len(raw) != where.size:
                raise CorruptBlockError(f"the index promises {where.size} bytes, got {len(raw)}: index.npy does not match data.bin")
            if shard.checksums is not None and zlib.crc32(raw) != int(shard.checksums[block]):
                raise CorruptBlockError(f"checksum mismatch (CRC-32 {zlib.crc32(raw):08x}, recorded {int(shard.checksums[block]):08x})")
            examples, nbytes = shard.decoder.decode(raw)
            if len(examples) != shard.examples_in_block(block):
                raise CorruptBlockError(f"block holds {len(examples)} examples, expected {shard.examples_in_block(block)}")
        except AtlasError as err:
            if isinstance(err, CorruptBlockError):
                self._raise_if_changed(shard, err)
            raise err.located(url=self.url, path=where.path, shard=shard.name, block=block,
                              byte_range=(where.start, where.end))
        return DecodedBlock(examples, nbytes)

    # -- reporting -------------------------------------------------------------------------------

    @property
    def stats(self) -> Stats:
        """A snapshot of the requests, bytes and cache hits of this process so far."""
        return self._store.snapshot()

    def reset_stats(self) -> None:
        self._store.reset_stats()

    def __repr__(self) -> str:
        return (
            f"AtlasDataset({self.url!r}, examples={len(self)}, shards={len(self.shards)}/"
            f"{len(self._layout.shard_sizes)}, compression_strategy={self._layout.compression_strategy.name})"
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
        if compression_dict_bytes is not None:
            self._decoders["shared"] = BlockDecoder(True, compression_dict_bytes, self._policy,
                                                    self._settings["max_block_bytes"])

    def _read_root_meta(self) -> AtlasDatasetMetadata:
        """The shard's meta.json stands in for a root: one shard, stored as the shard says."""
        try:
            raw = self._store.read(SHARD_META, "meta")
        except ObjectNotFoundError as err:
            self._store.check_bucket()
            raise DatasetNotFoundError(f"no {SHARD_META} here: not an Atlas shard folder", url=self.url) from err
        try:
            self._shard_metadata = AtlasDatasetShardMetadata.from_json(raw, SHARD_META)
        except FormatError as err:
            raise err.located(url=self.url)
        strategy = self._shard_metadata.compression_strategy
        if strategy == CompressionStrategy.SHARED_DICTIONARY_COMPRESSION and self.compression_dict_bytes is None:
            raise ValueError(f"{self.url}: this shard is stored with the dataset's shared dictionary: pass it as "
                             f"compression_dict_bytes (the zstd_dict.bin beside the shard folders)")
        return AtlasDatasetMetadata(self.VERSION, [self._shard_metadata.stored_examples], strategy)

    def _find_shards(self) -> list[Shard]:
        return [Shard(0, "", self._shard_metadata.stored_examples)]

    @property
    def metadata(self) -> AtlasDatasetShardMetadata:
        """The shard's meta.json, as the original's AtlasDatasetShardMetadata."""
        return self._shard_metadata

    def __reduce__(self):
        return (_reopen_shard, (self.url, self.compression_dict_bytes, self.storage_options, self._settings))


def _reopen_shard(url: str, dictionary: bytes | None, storage_options: dict, settings: dict) -> AtlasDatasetShard:
    return AtlasDatasetShard(url, compression_dict_bytes=dictionary, storage_options=storage_options, **settings)


def _reopen(cls: type[AtlasDataset], url: str, storage_options: dict, settings: dict) -> AtlasDataset:
    return cls(url, storage_options, **settings)


def open(url: str, storage_options: dict[str, Any] | None = None, **settings: Any) -> AtlasDataset:  # noqa: A001
    """Open the Atlas dataset at url (any fsspec URL or local path). See AtlasDataset for the settings."""
    return AtlasDataset(url, storage_options, **settings)
