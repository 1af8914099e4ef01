"""The shard table: which shards a dataset has (decided when it is opened), what each needs before its blocks can
be read (fetched once per process, when first needed, and forgotten past a byte bound), and where example i
lives."""

from __future__ import annotations

import bisect
import logging
import threading
import weakref
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import cast, overload

import cachetools
import numpy as np

from ..errors import AtlasError, DatasetChangedError, FormatError, ObjectNotFoundError
from ..format.codec import BlockDecoder, PicklePolicy
from ..format.manifest import MANIFEST, Manifest, shard_digest
from ..format.spec import (
    DATA_FILE,
    DICT_FILE,
    ROOT_META,
    SHARD_META,
    AtlasDatasetMetadata,
    AtlasDatasetShardMetadata,
    CompressionStrategy,
    shard_name,
)
from ..storage import ObjectIdentity, Store, forksafe
from ..storage.ranges import ByteRange
from ..trust.keys import reader_trust
from .discovery import Present, RootVersion, digests, object_version
from .options import ReaderOptions
from .shard_fetch import (
    OpenShard,
    check_block_bound,
    check_data_size,
    offsets_and_sums,
    parse_meta,
    plan_fetch,
    signer_of,
)

log = logging.getLogger(__name__)
BlockKey = tuple[int, int]  # (position of the shard in the table, block number)


class Shard:
    """One shard folder of a dataset: its name, its examples, and, while it is open, what its blocks are read with
    (`opened`). The table makes one when it is asked for and keeps it while it is open: a table of 100,000
    shards holds arrays, not 100,000 of these."""

    __slots__ = ("number", "name", "size", "start", "position", "meta", "opened", "__weakref__")

    def __init__(self, number: int, name: str, size: int, start: int = 0, position: int = 0) -> None:
        self.number = number  # the shard's number in the dataset (its folder name as an integer)
        self.name = name
        self.size = size  # from the root's shard_sizes, checked against meta.json when the shard is opened
        self.start = start  # global index of the shard's first example among the shards present
        self.position = position  # in its table
        self.meta: AtlasDatasetShardMetadata | None = None
        self.opened: OpenShard | None = None

    def __len__(self) -> int:
        return self.size

    def __repr__(self) -> str:
        return f"Shard({self.name!r}, examples={self.size})"

    def file(self, name: str) -> str:
        """The path of one of the shard's files, relative to the store's root (a lone shard is the root)."""
        return f"{self.name}/{name}" if self.name else name

    # What the opened shard holds, for callers that open a shard and then use it at once (verify, cp); the
    # read paths take the OpenShard itself, which stays whole if the table forgets the shard meanwhile.
    @property
    def offsets(self) -> np.ndarray | None:
        return self.opened.offsets if self.opened else None

    @property
    def decoder(self) -> BlockDecoder | None:
        return self.opened.decoder if self.opened else None

    @property
    def checksums(self) -> np.ndarray | None:
        return self.opened.checksums if self.opened else None

    @property
    def signed(self) -> bool:
        """Whether it passed the seal of a key the reader trusts (decoded as the user's own: docs/security.md)."""
        return self.opened is not None and self.opened.signer is not None

    @property
    def identity(self) -> ObjectIdentity | None:
        return self.opened.identity if self.opened else None

    @property
    def known_meta(self) -> AtlasDatasetShardMetadata:
        """Its meta.json, once the shard has been opened (kept when the table forgets the rest)."""
        if self.meta is None:
            raise RuntimeError(f"shard {self.name!r} is used before it was opened (ShardTable.open)")
        return self.meta

    def block_range(self, block: int) -> ByteRange:
        if self.opened is None:
            raise RuntimeError(f"shard {self.name!r} is read before it was opened (ShardTable.open)")
        return self.opened.block_range(block)

    def examples_in_block(self, block: int) -> int:
        return min(self.known_meta.block_size, self.size - block * self.known_meta.block_size)


class OpenShards(cachetools.LRUCache):
    """The open shards by position, within a byte bound (cachetools' LRU, as the block cache): past it the least
    recently opened is forgotten (`forget`), and opened again if it is needed again. The newest always stays,
    however large. Not thread-safe: the table holds a lock around changes."""

    def __init__(self, max_bytes: int, forget: Callable[[Shard], None]) -> None:
        super().__init__(maxsize=max(max_bytes, 1), getsizeof=lambda held: min(held[1], self.maxsize))
        self.forget = forget

    def peek(self, position: int) -> Shard | None:
        """The open shard at position, without counting a use (the read paths ask on every example)."""
        try:
            return cachetools.Cache.__getitem__(self, position)[0]
        except KeyError:
            return None

    def popitem(self) -> tuple[int, tuple[Shard, int]]:
        position, held = super().popitem()
        self.forget(held[0])
        return position, held


class ShardList(Sequence[Shard]):
    """`ds.shards`: the shards present, in order, each made when asked for (see `ShardTable.shard`)."""

    def __init__(self, table: ShardTable) -> None:
        self._table = table

    def __len__(self) -> int:
        return len(self._table.numbers)

    @overload
    def __getitem__(self, index: int) -> Shard: ...

    @overload
    def __getitem__(self, index: slice) -> list[Shard]: ...

    def __getitem__(self, index: int | slice) -> Shard | list[Shard]:
        if isinstance(index, slice):
            return [self._table.shard(p) for p in range(*index.indices(len(self)))]
        position = index + len(self) if index < 0 else index
        if not 0 <= position < len(self):
            raise IndexError(f"shard position {index} out of range ({len(self)} shards present)")
        return self._table.shard(position)

    def __iter__(self) -> Iterator[Shard]:
        return (self._table.shard(p) for p in range(len(self)))

    def __repr__(self) -> str:
        return f"<{len(self)} shards of {self._table.url}>"


class ShardTable:
    """The shards present, opened lazily and once per process, and the map from example index to block.

    The shards are arrays (numbers, sizes, ends); a `Shard` is made when asked for and lives while someone holds
    it, the open ones held by the table within `shard_cache_bytes`, so what the table holds grows with the shards
    in use, not with the dataset."""

    def __init__(
        self,
        store: Store,
        layout: AtlasDatasetMetadata,
        present: Present,
        policy: PicklePolicy,
        shared_dictionary: bytes | None = None,
        manifest: Manifest | None = None,
        version: RootVersion | None = None,
        options: ReaderOptions | None = None,
    ) -> None:
        self.store, self.layout, self.policy = store, layout, policy
        self.options = options or ReaderOptions()
        self.trust = reader_trust()  # shards sealed with these keys are read as the user's own (keys.py)
        self.manifest = manifest  # the dataset's, when it has a usable one
        self.version = version  # Root.version of what the reader opened
        self.numbers, self.names = np.asarray(present.numbers, dtype=np.int64), present.names
        self.sizes = np.asarray(layout.shard_sizes, dtype=np.int64)[self.numbers]
        self.ends_array = np.cumsum(self.sizes)
        self.ends = self.ends_array.data  # a memoryview: ints for bisect (ds[i]'s way to its shard), no copy
        self.shards = ShardList(self)
        self._made: weakref.WeakValueDictionary[int, Shard] = weakref.WeakValueDictionary()
        self._metas: list[AtlasDatasetShardMetadata] | None = None  # every shard's, once load_metadata ran
        self._decoders: dict[object, BlockDecoder] = {}
        if shared_dictionary is not None:
            self._decoders["shared"] = self._new_decoder(True, shared_dictionary)
        self._open = OpenShards(self.options.shard_cache_bytes, self._forget)
        self.after_fork()
        forksafe.register(self)

    def __len__(self) -> int:
        return self.ends[-1] if self.ends else 0

    @property
    def url(self) -> str:
        return self.store.url

    def after_fork(self) -> None:
        """Locks and threads of this process (a forked child must not wait on a lock its parent held)."""
        self._decoder_lock, self._lru_lock, self._made_lock = threading.Lock(), threading.Lock(), threading.Lock()
        self._locks = [threading.Lock() for _ in range(64)]  # striped: a shard's open takes shard.number % 64
        self._opener: ThreadPoolExecutor | None = None

    def close(self) -> None:
        """Shut the thread that opens shards ahead of a pass (made again if the table is used after)."""
        opener, self._opener = self._opener, None
        if opener is not None:
            opener.shutdown(wait=True, cancel_futures=True)

    def shard(self, position: int) -> Shard:
        """The shard at a position in the table: the one in use if there is one (it holds what was opened)."""
        shard = self._made.get(position)
        if shard is None:
            with self._made_lock:
                shard = self._made.get(position)
                if shard is None:
                    number, size = int(self.numbers[position]), int(self.sizes[position])
                    name = self.names[position] if self.names is not None else shard_name(number, self._count)
                    shard = Shard(number, name, size, self.ends[position] - size, position)
                    if self._metas is not None:
                        shard.meta = self._metas[position]
                    self._made[position] = shard
        return shard

    @property
    def _count(self) -> int:
        return len(self.layout.shard_sizes)

    # -- locating ------------------------------------------------------------------------------------

    def position_of(self, i: int) -> int:
        """The position in the table of the shard holding global example i (already normalised)."""
        return bisect.bisect_right(self.ends, i)

    def locate(self, i: int) -> tuple[BlockKey, int]:
        """((shard position, block), slot) of global example i (already normalised); opens the shard if needed."""
        position = bisect.bisect_right(self.ends, i)
        opened = self.state(position)
        block, slot = divmod(i - (self.ends[position] - opened.size), opened.meta.block_size)
        return (position, block), slot

    def state(self, position: int) -> OpenShard:
        """The opened state of the shard at position: opened now if it is not (or was forgotten)."""
        held = self._open.peek(position)
        opened = held.opened if held is not None else None
        return opened if opened is not None else self.open(self.shard(position))

    def block_ranges(self) -> list[tuple[int, int]]:
        """(start, stop) of every block, as global example indices, in order (needs every shard's meta.json)."""
        metas = self.load_metadata()
        starts = (self.ends_array - self.sizes).tolist()
        return [
            (start + b * meta.block_size, start + min((b + 1) * meta.block_size, size))
            for start, size, meta in zip(starts, self.sizes.tolist(), metas)
            for b in range(meta.num_blocks)
        ]

    # -- opening -------------------------------------------------------------------------------------

    def open_many(self, shards: Iterable[Shard]) -> None:
        """Open shards concurrently: one round trip in all, rather than one per shard."""
        todo = [s for s in dict.fromkeys(shards) if s.opened is None]
        if len(todo) == 1:
            self.open(todo[0])
        elif todo:
            with ThreadPoolExecutor(
                min(len(todo), self.options.max_concurrency), thread_name_prefix="atlas-open"
            ) as pool:
                for future in [pool.submit(self.open, s) for s in todo]:
                    future.result()

    def prefetch(self, shards: Iterable[Shard]) -> None:
        """Start opening shards in the background (a pass about to reach them); a failure is left for the open
        that needs the shard to raise."""
        todo = [s for s in shards if s.opened is None]
        if todo:
            if self._opener is None:
                self._opener = ThreadPoolExecutor(2, thread_name_prefix="atlas-open")
            for shard in todo:
                self._opener.submit(self.open, shard)

    def open(self, shard: Shard, every_file: bool = False) -> OpenShard:
        """Fetch what a shard needs before its blocks can be read: once per process, whatever the threads, and
        again only if the table forgot it (shard_cache_bytes bounds what the open shards hold).

        One round trip. A shard the manifest describes: its index.npy and block_checksums.npy (if the manifest
        says it has one), checked against the manifest's digest. Any other, or with `every_file` (verify looks
        at every file): its meta.json (checked against the root and the manifest), index.npy, the checksum
        sidecar if there is one, and data.bin's identity (size and version), which the index is checked against
        and which later tells a rewritten dataset from a corrupt one. Either way, the shard's own dictionary
        when it has one (one that fell back to standard compression has none).
        """
        opened = shard.opened
        if opened is not None:
            return opened
        try:
            with self._locks[shard.number % len(self._locks)]:
                opened = shard.opened
                if opened is None:
                    opened = shard.opened = self._open_locked(shard, every_file)
                    if opened.identity.size:  # every block read must find the data.bin this open found
                        self.store.expect(opened.data_file, opened.identity)
                    self._remember(shard)
        except DatasetChangedError:
            raise
        except ObjectNotFoundError as err:
            self.refuse_if_rewritten(shard.name, err)
            if self.manifest is not None and self.manifest.entry(shard.number) is not None:
                err.problem += (
                    f"; the dataset's manifest lists shard {shard.number}, so its examples are counted: if shards "
                    f"were removed on purpose, `atlas-remote index URL` indexes the shards present"
                )
            raise err.located(url=self.url, shard=shard.name)
        except AtlasError as err:
            self.refuse_if_rewritten(shard.name, err)
            raise err.located(url=self.url, shard=shard.name)
        return opened

    def refuse_if_rewritten(self, shard: str, err: BaseException | None) -> None:
        """A shard that fails to open or to read, or disagrees with the manifest, may belong to a newer version
        of the dataset: if the root no longer holds what the reader opened, say so rather than call the data
        corrupt (2 requests, on this path only)."""
        if self.version is None:
            return
        try:
            if self.version.object is not None:  # no manifest: the root meta.json's object version tells
                changed = object_version(self.store) != self.version.object
            else:
                root, manifest = self.store.read_many([(ROOT_META, "meta"), (MANIFEST, "manifest")])
                changed = not isinstance(root, bytes) or digests(root, manifest) != self.version[:2]
        except ObjectNotFoundError:
            changed = True  # the root meta.json is gone: a commit is rewriting the dataset now
        except AtlasError:
            return
        if changed:
            raise DatasetChangedError(
                "the dataset was rewritten after this reader opened it (its root meta.json or manifest is not "
                "the one it opened), so this shard may be of another version: open it again (ds.reopen()) to "
                "read the new one",
                url=self.url,
                shard=shard,
            ) from err

    def _remember(self, shard: Shard) -> None:
        """Count the shard among the open ones, and forget the least recently opened beyond the bound (a reader
        that sweeps 100,000 shards holds a bounded amount; one that comes back opens the shard again)."""
        if shard.opened is not None:
            with self._lru_lock:
                self._open[shard.position] = (shard, shard.opened.nbytes)

    def _forget(self, shard: Shard) -> None:
        shard.opened = None
        self.store.expect(shard.file(DATA_FILE), None)

    @property
    def open_count(self) -> int:
        with self._lru_lock:
            return len(self._open)

    def _open_locked(self, shard: Shard, every_file: bool) -> OpenShard:
        try:
            return self._fetch(shard, every_file)
        except FormatError:
            if every_file or self.manifest is None or self.manifest.entry(shard.number) is None:
                raise
            # the shard does not fit the manifest: its own files say how (a stale manifest, or what is damaged)
            return self._fetch(shard, True)

    def _fetch(self, shard: Shard, every_file: bool) -> OpenShard:
        """One round trip for the files the plan names (shard_fetch.plan_fetch), then their checks."""
        store, manifest = self.store, self.manifest
        shared = "shared" in self._decoders
        plan = plan_fetch(shard, manifest, self.layout.compression_strategy, self.options, store, every_file, shared)
        identity = store.beside(store.identity, plan.data_file) if plan.need_identity else None
        root = None
        if manifest is None and self.version is not None and self.version.object is not None:
            root = store.beside(object_version, store)  # no manifest to check the shard against: the root's
        got = dict(zip(plan.wanted, store.read_many(list(plan.wanted.values()))))
        if root is not None and self.version is not None:
            try:
                unchanged = root.result() == self.version.object
            except ObjectNotFoundError:
                unchanged = False
            if not unchanged:
                self.refuse_if_rewritten(shard.name, None)
        meta = plan.meta or parse_meta(shard.file(SHARD_META), shard.number, shard.size, got["meta"])
        offsets, sums, sidecar = offsets_and_sums(shard.file, meta, got, plan.mapped, store)
        check_block_bound(offsets, self.options.max_block_bytes, shard.file, sidecar)
        if identity is None:  # the manifest's size; no version (a block that fails to check asks again)
            assert manifest is not None and plan.row is not None  # the plan asks for data.bin's identity otherwise
            found = ObjectIdentity(store.url_of(plan.data_file), int(manifest.data_bytes[plan.row]), "")
        else:
            try:
                found = identity.result()
            except ObjectNotFoundError:
                if meta.stored_examples:
                    raise
                found = ObjectIdentity(store.url_of(plan.data_file), 0, "absent")
        check_data_size(offsets, found.size, shard.file, sidecar)
        if manifest is not None and plan.row is not None:
            disagreement = manifest.check_shard(shard.number, meta, found.size, shard_digest(offsets, sums), sidecar)
            if disagreement:
                self.refuse_if_rewritten(shard.name, None)
                raise FormatError(
                    f"the dataset's manifest is stale: this shard's own files say {disagreement}; "
                    f"rebuild it with `atlas-remote index URL`",
                    path=shard.file(SHARD_META),
                )
        shard.meta = meta
        decoder = self._decoder_for(shard, got.get("dict"))
        own = meta.compression_strategy == CompressionStrategy.DICTIONARY_COMPRESSION
        dictionary_file = shard.file(DICT_FILE) if own else DICT_FILE
        signer = signer_of(self.trust, manifest, plan.row, shard.number, meta, offsets, sums, decoder, dictionary_file)
        view = offsets.view(np.ndarray)
        return OpenShard(
            meta, offsets, view, sums, signer, sidecar, decoder, found, plan.data_file, shard.size, shard.name
        )

    def load_metadata(self) -> list[AtlasDatasetShardMetadata]:
        """Every present shard's meta.json: the manifest's copy where it describes the shard (checked when the
        shard is opened), the rest fetched in one concurrent batch; kept, so that opens skip them."""
        if self._metas is not None:
            return self._metas
        metas: list[AtlasDatasetShardMetadata | None] = [None] * len(self.numbers)
        manifest = self.manifest
        if manifest is not None:
            for position, number in enumerate(self.numbers.tolist()):
                row = manifest.entry(number)
                metas[position] = manifest.meta(row) if row is not None else None
        todo = [self.shard(p) for p, meta in enumerate(metas) if meta is None]
        for shard, raw in zip(todo, self.store.read_many([(s.file(SHARD_META), "meta") for s in todo])):
            try:
                metas[shard.position] = parse_meta(shard.file(SHARD_META), shard.number, shard.size, raw)
            except AtlasError as err:
                raise err.located(url=self.url, shard=shard.name)
        self._metas = cast(list[AtlasDatasetShardMetadata], metas)
        return self._metas

    def _new_decoder(self, compressed: bool, dictionary: bytes | None) -> BlockDecoder:
        return BlockDecoder(compressed, dictionary, self.policy, self.options.max_block_bytes)

    def _decoder_for(self, shard: Shard, fetched_dictionary: bytes | AtlasError | None) -> BlockDecoder:
        """The shard's decoder: its own dictionary's, or the one shared by every shard stored the same way."""
        strategy = shard.known_meta.compression_strategy
        if strategy == CompressionStrategy.DICTIONARY_COMPRESSION:
            if fetched_dictionary is None:
                fetched_dictionary = self.store.read_many([(shard.file(DICT_FILE), "dict")])[0]
            if isinstance(fetched_dictionary, AtlasError):
                raise fetched_dictionary
            return self._new_decoder(True, fetched_dictionary)
        key = "shared" if strategy == CompressionStrategy.SHARED_DICTIONARY_COMPRESSION else strategy
        with self._decoder_lock:  # one fetch of the shared dictionary, however many threads open shards
            decoder = self._decoders.get(key)
            if decoder is None:
                dictionary = None
                if key == "shared":
                    dictionary = (
                        fetched_dictionary if fetched_dictionary is not None else self.store.read(DICT_FILE, "dict")
                    )
                    if isinstance(dictionary, AtlasError):
                        raise dictionary
                decoder = self._decoders[key] = self._new_decoder(
                    strategy != CompressionStrategy.NO_COMPRESSION, cast(bytes | None, dictionary)
                )
        return decoder
