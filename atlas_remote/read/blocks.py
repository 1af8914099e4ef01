"""The block loader: decoded blocks by key, from the memory cache, from a thread already fetching them, from the
disk cache, or fetched (nearby blocks in one read) and checked (length, checksum, example count).

Decoding is split in two: `decompress` (the length and checksum checks and zstd, which release the interpreter
lock) and `unpickle` (which holds it), so a sequential pass can decompress the next blocks on another core.
"""

from __future__ import annotations

import threading
import zlib
from collections import Counter
from collections.abc import Iterable
from typing import Any, NamedTuple, cast

from ..errors import AtlasError, CorruptBlockError, DatasetChangedError, FormatError, ObjectNotFoundError
from ..format.seal import DIGEST_BYTES, block_digest, block_digests
from ..format.spec import DATA_FILE, INDEX_FILE
from ..storage import forksafe
from ..storage.ranges import ByteRange
from .cache import DecodedBlock, DiskBlockCache, MemoryBlockCache
from .call_budget import OverBudget
from .shards import BlockKey, OpenShard, ShardTable

Bytes = bytes | memoryview
RawBlocks = dict[BlockKey, tuple[ByteRange, Bytes, bool]]  # range, bytes, and whether they came from the disk cache


# What a pass's read-ahead decompresses before the blocks are asked for, per window: past it, blocks wait
# compressed (a block that declares a huge size is then decompressed only when its turn comes).
DECOMPRESSED_AHEAD_BYTES = 64 * 1024 * 1024


class _Compressed(NamedTuple):
    """A block fetched and checked but left compressed (see DECOMPRESSED_AHEAD_BYTES)."""

    where: ByteRange
    raw: Bytes


class _Flight:
    """A block being fetched by one thread, which others wait for (lighter than a Future: one lock)."""

    __slots__ = ("done", "value", "error")

    def __init__(self) -> None:
        self.done = threading.Lock()
        self.done.acquire()
        self.value: list | None = None
        self.error: BaseException | None = None

    def finish(self, value: list | None = None, error: BaseException | None = None) -> None:
        self.value, self.error = value, error
        self.done.release()

    def result(self) -> Any:
        with self.done:
            pass
        if self.error is not None:
            raise self.error
        return self.value


class BlockLoader:
    def __init__(self, table: ShardTable) -> None:
        options = table.options
        self.table, self.store = table, table.store
        self.memory = MemoryBlockCache(options.cache_bytes)
        self.disk = DiskBlockCache(options.disk_cache, options.disk_cache_bytes) if options.disk_cache else None
        self.after_fork()
        forksafe.register(self)

    def after_fork(self) -> None:
        """In a forked child, fetches the parent had in flight will never finish: forget them, and the counts."""
        self._lock = threading.Lock()
        self._inflight: dict[BlockKey, _Flight] = {}
        self.counts: Counter = Counter()  # cache_hits, cache_misses, disk_hits, disk_misses

    def reset_counts(self) -> None:
        with self._lock:
            self.counts.clear()

    def _count(self, **counts: int) -> None:
        with self._lock:
            self.counts.update(counts)

    # -- random access: cached, single-flight -----------------------------------------------------------

    def get_one(self, key: BlockKey) -> list:
        """One block, for `ds[i]`: what `get` does for one key, without its per-call lists and dicts (it runs once
        per example read, so every step it skips shows in a random-access reader's speed)."""
        if self.disk is not None:
            return self.get((key,))[key]  # the disk cache takes the general path
        with self._lock:
            block = self.memory.get(key)
            flight = self._inflight.get(key) if block is None else None
            if block is None and flight is None:
                self.counts["cache_misses"] += 1
                mine = self._inflight[key] = _Flight()
            else:
                self.counts["cache_hits"] += 1
        if block is not None:
            return block.examples
        if flight is not None:
            examples = flight.result()
            return examples if examples is not None else self.get_one(key)  # None: a call past its budget let it go
        try:
            where = self.table.state(key[0]).block_range(key[1])
            try:
                raw = self.store.read_range(where, "block")
            except AtlasError as err:
                raise self._fetch_error(err, {key: where})
            block = self.decode(key, where, raw)
        except BaseException as err:
            with self._lock:
                self._inflight.pop(key).finish(error=err)
            raise
        with self._lock:
            self.memory.put(key, block)
            self._inflight.pop(key)
        mine.finish(block.examples)
        return block.examples

    def get(self, keys: Iterable[BlockKey], budget: int | None = None) -> dict[BlockKey, list]:
        """Decoded blocks for keys: from the cache, from a thread already fetching them, or fetched now. With a
        budget, blocks to decode that declare more bytes than it together are not decoded here: OverBudget hands
        their stored bytes on (call_budget.take decodes them one at a time)."""
        found: dict[BlockKey, list] = {}
        owned: list[BlockKey] = []
        waiting: dict[BlockKey, _Flight] = {}
        with self._lock:
            for key in dict.fromkeys(keys):
                cached = self.memory.get(key)
                if cached is not None:
                    found[key] = cached.examples
                elif key in self._inflight:
                    waiting[key] = self._inflight[key]
                else:
                    self._inflight[key] = _Flight()
                    owned.append(key)
            self.counts["cache_hits"] += len(found) + len(waiting)
            self.counts["cache_misses"] += len(owned)
        if owned:
            try:
                raw = self.fetch_raw(owned)
                if budget is not None and self._declared(raw) > budget:
                    with self._lock:
                        for key in owned:  # threads waiting for one of them fetch it themselves
                            self._inflight.pop(key).finish()
                    raise OverBudget(raw)
                fetched = {key: self.decode(key, where, data) for key, (where, data, _) in raw.items()}
                self._keep_on_disk(raw)
            except OverBudget:
                raise
            except BaseException as err:
                with self._lock:
                    for key in owned:
                        self._inflight.pop(key).finish(error=err)
                raise
            with self._lock:
                for key in owned:
                    self.memory.put(key, fetched[key])
                    self._inflight.pop(key).finish(fetched[key].examples)
            found.update((key, block.examples) for key, block in fetched.items())
        for key, flight in waiting.items():
            examples = flight.result()
            found[key] = examples if examples is not None else self.get([key])[key]
        return found

    def _declared(self, raw: RawBlocks) -> int:
        """What blocks fetched declare they decompress to, together (a frame without its size: max_block_bytes)."""
        state = self.table.state
        return sum(state(key[0]).decoder.declared_size(data) for key, (_, data, _) in raw.items())

    # -- a sequential pass: no cache fill, decompression off the iterating thread -----------------------

    def fetch_decompressed(self, keys: list[BlockKey], head: Bytes = b"") -> dict[BlockKey, Any]:
        """For a pass: each block's cached examples, or its shard and decompressed bytes, checked (run by
        read-ahead threads, so that only unpickling is left to the iterating thread). Blocks are not put in the
        memory cache: a scan would evict what random access needs. head: see fetch_raw. A window (consecutive
        blocks of one shard, no disk cache) is read, checked and decompressed with no Python step per block but
        its checksum or digest (`_fetch_window`)."""
        out: dict = {}
        if len(self.memory):
            for key in keys:
                block = self.memory.get(key)
                if block is not None:
                    out[key] = block.examples
        if not out and self.disk is None and _is_window(keys):
            self._count(cache_misses=len(keys))
            return self._fetch_window(keys, head)
        missing = [key for key in keys if key not in out]
        self._count(cache_hits=len(out), cache_misses=len(missing))
        raw = self.fetch_raw(missing, head)
        by_shard: dict[int, list[BlockKey]] = {}
        budget = DECOMPRESSED_AHEAD_BYTES
        for key in raw:
            self._check(key, *raw[key][:2])
            budget -= self.table.state(key[0]).decoder.declared_size(raw[key][1])
            if budget < 0 and by_shard:  # beyond the bound: left compressed, for the consumer to decompress
                out[key] = _Compressed(*raw[key][:2])
            else:
                by_shard.setdefault(key[0], []).append(key)
        for position, keys_of_shard in by_shard.items():
            shard = self.table.state(position)
            try:
                datas = shard.decoder.decompress_many([raw[key][1] for key in keys_of_shard])
            except AtlasError:  # decompress them one by one: the failing block raises, named
                datas = [self.decompress(key, *raw[key][:2]) for key in keys_of_shard]
            out.update((key, (shard, data)) for key, data in zip(keys_of_shard, datas))
        self._keep_on_disk(raw)
        return out

    def _fetch_window(self, keys: list[BlockKey], head: Bytes) -> dict[BlockKey, Any]:
        """fetch_decompressed for consecutive blocks of one shard: one read (or the head already read), the
        blocks sliced from it by the shard's offsets (so each has its index's length), every checksum or digest
        compared in one pass, the declared sizes read in one, and one decompression call."""
        position, first = keys[0]
        stop = keys[-1][1] + 1
        shard = self.table.state(position)
        offsets = shard.bounds[first : stop + 1].tolist()
        span = ByteRange(shard.data_file, offsets[0], offsets[-1])
        if span.end <= len(head):
            body: Bytes = memoryview(head)[span.start : span.end]
        else:
            try:
                body = self.store.read_range(span, "block")
            except AtlasError as err:
                raise self._fetch_error(err, {key: shard.block_range(key[1]) for key in keys})
            if len(body) != span.size:  # the store checks this; a block cut short is never handed on
                self._check(keys[0], shard.block_range(first), body)
        view, base = memoryview(body), offsets[0]
        raws = [view[a - base : b - base] for a, b in zip(offsets, offsets[1:])]
        bad = _first_unchecked(shard, first, raws)
        if bad is not None:
            self._check(keys[bad], shard.block_range(first + bad), raws[bad])  # raises, named
            raise self._located(CorruptBlockError("checksum mismatch"), shard, first, shard.block_range(first))
        decoder = shard.decoder
        try:
            sizes, checked = decoder.declared_sizes(raws), True
        except AtlasError:  # a frame that declares no size or too much: decompress() names it below
            sizes, checked = [decoder.declared_size(raw) for raw in raws], False
        ahead = _within_budget(sizes, DECOMPRESSED_AHEAD_BYTES)
        try:
            datas = decoder.decompress_many(raws[:ahead], checked=checked)
        except AtlasError:  # decompress them one by one: the failing block raises, named
            datas = [self.decompress(key, shard.block_range(key[1]), raw) for key, raw in zip(keys, raws[:ahead])]
        out: dict = {key: (shard, data) for key, data in zip(keys, datas)}
        for key, raw in zip(keys[ahead:], raws[ahead:]):  # beyond the bound: left compressed
            out[key] = _Compressed(shard.block_range(key[1]), raw)
        return out

    def examples_of(self, key: BlockKey, fetched: Any) -> list:
        """A block's examples from what fetch_decompressed gave for it (cached examples, or its shard and bytes to
        unpickle, or, past the bound on what is decompressed ahead, bytes to decompress first). One Python call
        per block on the iterating thread, and the unpickler's."""
        kind = type(fetched)
        if kind is list:
            return fetched
        if kind is _Compressed:
            return self.unpickle(key, fetched.where, self.decompress(key, *fetched))
        shard, data = fetched
        try:
            examples = shard.decoder.unpickle(data, shard.signer is not None)
            if len(examples) != shard.meta.block_size:
                _check_count(shard, key[1], examples)
        except AtlasError as err:
            raise self._located(err, shard, key[1], shard.block_range(key[1]))
        return examples

    # -- fetching and checking --------------------------------------------------------------------------

    def fetch_raw(self, keys: list[BlockKey], head: Bytes = b"") -> RawBlocks:
        """Each block's range and bytes (from the disk cache, or fetched together), and whether it was on disk.
        head: the first bytes of these blocks' data.bin, read already (a pass's first window, read while its
        shard opened); blocks lying within it are taken from it."""
        state = self.table.state
        ranges = {key: state(key[0]).block_range(key[1]) for key in keys}
        raw: RawBlocks = {}
        if self.disk is not None:
            for key in keys:
                data = self.disk.get(self._disk_key(key, ranges[key]), ranges[key].size)
                if data is not None:
                    raw[key] = (ranges[key], data, True)
            self._count(disk_hits=len(raw), disk_misses=len(keys) - len(raw))
        if head:
            view = memoryview(head)
            for key in keys:
                if key not in raw and ranges[key].end <= len(view):
                    raw[key] = (ranges[key], view[ranges[key].start : ranges[key].end], False)
        missing = [key for key in keys if key not in raw]
        try:
            if len(missing) == 1:  # the random-access path: nothing to merge
                fetched = {ranges[missing[0]]: self.store.read_range(ranges[missing[0]], "block")}
            else:
                fetched = self.store.read_ranges([ranges[key] for key in missing], "block")
        except AtlasError as err:
            raise self._fetch_error(err, {key: ranges[key] for key in missing})
        raw.update((key, (ranges[key], fetched[ranges[key]], False)) for key in missing)
        return raw

    def _fetch_error(self, err: AtlasError, ranges: dict[BlockKey, ByteRange]) -> AtlasError:
        """A failed read of these blocks, named by dataset, shard and block (or the rewrite that explains it)."""
        states = {p: self.table.state(p) for p in sorted({p for p, _ in ranges})}
        for state in states.values():
            if isinstance(err, DatasetChangedError) and err.path == state.data_file:
                return err.located(url=self.table.url, shard=state.name)
            self.raise_if_changed(state, err)
        failed = [
            key
            for key, r in ranges.items()
            if err.byte_range is None
            or r.path == err.path
            and r.start < err.byte_range[1]
            and err.byte_range[0] < r.end
        ]
        position, block = failed[0] if failed else next(iter(ranges))
        return err.located(url=self.table.url, shard=states[position].name, block=block)

    def _keep_on_disk(self, raw: RawBlocks) -> None:
        """Blocks that decoded go to the disk cache (a corrupt one is never kept)."""
        if self.disk is not None:
            for key, (where, data, on_disk) in raw.items():
                if not on_disk:
                    self.disk.put(self._disk_key(key, where), bytes(data))

    def _disk_key(self, key: BlockKey, where: ByteRange) -> tuple:
        return (self.table.state(key[0]).identity, where.start, where.end)

    def decode(self, key: BlockKey, where: ByteRange, raw: Bytes) -> DecodedBlock:
        """A block's bytes checked, decompressed and unpickled, its examples counted (one step: this is the
        random-access path)."""
        shard, block = self.table.state(key[0]), key[1]
        try:
            _check_stored(shard, block, where, raw)
            data = shard.decoder.decompress(raw)
            examples, size = shard.decoder.unpickle_sized(data, signed=shard.signer is not None)
            _check_count(shard, block, examples)
        except AtlasError as err:
            raise self._located(err, shard, block, where)
        return DecodedBlock(examples, size)

    def _check(self, key: BlockKey, where: ByteRange, raw: Bytes) -> None:
        """A block's stored bytes against its index entry (length) and its recorded checksum."""
        shard, block = self.table.state(key[0]), key[1]
        try:
            _check_stored(shard, block, where, raw)
        except AtlasError as err:
            raise self._located(err, shard, block, where)

    def decompress(self, key: BlockKey, where: ByteRange, raw: Bytes) -> Bytes:
        """A block's bytes checked (length, checksum) and decompressed."""
        shard, block = self.table.state(key[0]), key[1]
        try:
            _check_stored(shard, block, where, raw)
            return shard.decoder.decompress(raw)
        except AtlasError as err:
            raise self._located(err, shard, block, where)

    def unpickle(self, key: BlockKey, where: ByteRange, data: Bytes) -> list:
        """A decompressed block's examples, checked against the number the shard's layout promises."""
        shard, block = self.table.state(key[0]), key[1]
        try:
            examples = shard.decoder.unpickle(data, signed=shard.signer is not None)
            _check_count(shard, block, examples)
        except AtlasError as err:
            raise self._located(err, shard, block, where)
        return examples

    def _located(self, err: AtlasError, shard: OpenShard, block: int, where: ByteRange) -> AtlasError:
        if isinstance(err, CorruptBlockError):
            self.raise_if_changed(shard, err)
        return err.located(
            url=self.table.url, path=where.path, shard=shard.name, block=block, byte_range=(where.start, where.end)
        )

    def raise_if_changed(self, shard: OpenShard, error: Exception) -> None:
        """If data.bin is no longer the object this reader opened, say so: the dataset was rewritten. A shard
        opened from the manifest has no version of data.bin to compare: the root tells a rewrite, and a data.bin
        of another size than the manifest's does not match its index."""
        unversioned = not shard.identity.version
        if unversioned:
            self.table.refuse_if_rewritten(shard.name, error)
        try:
            now = self.store.identity(shard.data_file)
        except ObjectNotFoundError:
            if unversioned:
                return  # the root is the one opened, so no commit removed it: missing, as the original error says
            now = None
        except AtlasError:
            return  # cannot tell: the original error stands
        if unversioned and now is not None and now.size != shard.identity.size:
            raise FormatError(
                f"the blocks end at byte {shard.identity.size} but {DATA_FILE} holds {now.size} bytes: "
                f"index.npy does not match data.bin",
                url=self.table.url,
                path=shard.file(INDEX_FILE),
                shard=shard.name,
            ) from error
        if now is None or now.size != shard.identity.size or (not unversioned and now != shard.identity):
            raise DatasetChangedError(
                f"rewritten while this reader had it open (data.bin was {shard.identity.size} bytes, version "
                f"{shard.identity.version!r}; now {'gone' if now is None else f'{now.size} bytes, version {now.version!r}'}"
                f"); open it again (ds.reopen()) to read the new version",
                url=self.table.url,
                shard=shard.name,
            ) from error


def _check_stored(shard: OpenShard, block: int, where: ByteRange, raw: Bytes) -> None:
    """A block's stored bytes against its index entry (length), and its SHA-256 where the shard passed a trusted
    seal (which binds the digests), else its recorded checksum (wherever the bytes came from: the store or the
    disk cache)."""
    if len(raw) != where.end - where.start:
        raise CorruptBlockError(
            f"the index promises {where.size} bytes, got {len(raw)}: the shard's index does not match data.bin"
        )
    sums = shard.sums
    if sums is None:
        return
    if shard.signer is not None:
        start = block * DIGEST_BYTES
        if block_digest(raw) != cast(bytes, sums.digests)[start : start + DIGEST_BYTES]:
            raise CorruptBlockError(
                "checksum mismatch (its SHA-256 is not the one its signed shard records: the block was changed "
                "after it was signed, or is damaged; copy the dataset again from a good copy)"
            )
    elif zlib.crc32(raw) != sums.crc32.item(block):
        raise CorruptBlockError(
            f"checksum mismatch (CRC-32 {zlib.crc32(raw):08x}, recorded {sums.crc32.item(block):08x})"
        )


def _is_window(keys: list[BlockKey]) -> bool:
    """Consecutive blocks of one shard, in order (what a pass's read-ahead asks for)."""
    if not keys:
        return False
    (position, first), (last_position, last) = keys[0], keys[-1]
    return (
        position == last_position
        and last - first == len(keys) - 1
        and keys == [(position, b) for b in range(first, last + 1)]
    )


def _first_unchecked(shard: OpenShard, first: int, raws: list) -> int | None:
    """The index of the first of a window's blocks (numbered from `first`) whose SHA-256 (where the shard passed a
    trusted seal) or else CRC-32 does not match what the shard records, or None. Digests are compared all at
    once, each computed by one call."""
    sums = shard.sums
    if sums is None:
        return None
    if shard.signer is not None:
        size = DIGEST_BYTES
        recorded = cast(bytes, sums.digests)[first * size : (first + len(raws)) * size]
        digests = block_digests(raws)
        if digests == recorded:
            return None
        return next(
            (i for i in range(len(raws)) if digests[i * size : (i + 1) * size] != recorded[i * size : (i + 1) * size]),
            0,
        )
    recorded = sums.crc32[first : first + len(raws)].tolist()
    computed = list(map(zlib.crc32, raws))
    if computed == recorded:
        return None
    return next((i for i, (a, b) in enumerate(zip(computed, recorded)) if a != b), 0)


def _within_budget(sizes: list[int], budget: int) -> int:
    """How many of a window's blocks, of these declared sizes, to decompress ahead: within budget, at least one."""
    total = 0
    for n, size in enumerate(sizes):
        total += size
        if total > budget and n:
            return n
    return len(sizes)


def _check_count(shard: OpenShard, block: int, examples: list) -> None:
    """A block's examples against the number the shard's layout promises."""
    if len(examples) != shard.examples_in_block(block):
        raise CorruptBlockError(f"block holds {len(examples)} examples, expected {shard.examples_in_block(block)}")
