"""The shard table: which shards a dataset has, what each needs before its blocks can be read (fetched once per
process, when first needed), and where example i lives."""

from __future__ import annotations

import bisect
import itertools
import logging
import os
import threading
from collections import OrderedDict
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import NamedTuple, cast

import numpy as np

from . import forksafe
from .codec import BlockDecoder, PicklePolicy
from .errors import AtlasError, DatasetChangedError, DatasetNotFoundError, FormatError, ObjectNotFoundError
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
from .layout import pending_journals
from .manifest import MANIFEST, Manifest, root_digest, shard_digest
from .ranges import ByteRange
from .storage import ObjectIdentity, Store

log = logging.getLogger(__name__)
BlockKey = tuple[int, int]  # (position of the shard in the table, block number)


class OpenShard(NamedTuple):
    """What an opened shard's blocks are read with: fetched once, kept while the table's bound allows."""

    meta: AtlasDatasetShardMetadata
    offsets: np.ndarray  # the index's N+1 offsets, as loaded (a memmap when the index is memory-mapped)
    bounds: np.ndarray  # the same as an ndarray (indexing a memmap goes through Python; its ndarray view does not)
    checksums: np.ndarray | None  # CRC-32 of each stored block, when the writer recorded them
    decoder: BlockDecoder
    identity: ObjectIdentity  # of data.bin, when the shard was opened
    data_file: str
    size: int
    name: str

    def block_range(self, block: int) -> ByteRange:
        return ByteRange(self.data_file, self.bounds.item(block), self.bounds.item(block + 1))

    def examples_in_block(self, block: int) -> int:
        return min(self.meta.block_size, self.size - block * self.meta.block_size)

    @property
    def nbytes(self) -> int:
        """What keeping it open costs: its index and checksums (a dictionary of its own too), and some change."""
        own = len(self.decoder.dictionary or b"") if self.meta.compression_strategy == 3 else 0
        return 1024 + self.bounds.nbytes + (self.checksums.nbytes if self.checksums is not None else 0) + own


class Shard:
    """One shard folder of a dataset: its name, its examples, and, while it is open, what its blocks are read with
    (`opened`). A table of many shards holds little for each: the opened ones are bounded by bytes."""

    __slots__ = ("number", "name", "size", "start", "position", "meta", "opened")

    def __init__(self, number: int, name: str, size: int, start: int = 0) -> None:
        self.number = number  # the shard's number in the dataset (its folder name as an integer)
        self.name = name
        self.size = size  # from the root's shard_sizes, checked against meta.json when the shard is opened
        self.start = start  # global index of the shard's first example among the shards present
        self.position = 0  # in its table
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
    def identity(self) -> ObjectIdentity | None:
        return self.opened.identity if self.opened else None

    def block_range(self, block: int) -> ByteRange:
        return self.opened.block_range(block)

    def examples_in_block(self, block: int) -> int:
        return min(self.meta.block_size, self.size - block * self.meta.block_size)


class RootVersion(NamedTuple):
    """What tells a rewritten dataset from the one a reader opened: the bytes of its root meta.json and manifest
    (the manifest digests every shard's index and checksums), and, without a usable manifest, the root meta.json's
    object version (a rewrite with the same shapes writes the same root bytes, but a new object)."""

    root: str  # SHA-256 of the root meta.json
    manifest: str | None  # SHA-256 of the manifest, None if absent
    object: str | None  # the root meta.json's object version and time written (None with a manifest): S3's ETag
    # is the content's MD5, so a rewrite of the same bytes is told apart by its time, to the second


class Root(NamedTuple):
    """What a reader opened: the root meta.json, the manifest if usable, and its version."""

    layout: AtlasDatasetMetadata
    manifest: Manifest | None
    version: RootVersion


def read_root_meta(store: Store) -> AtlasDatasetMetadata:
    """The root meta.json, or an error that says why there is none (no bucket, an interrupted commit, ...)."""
    return read_root(store, manifest=False).layout


def read_root(store: Store, manifest: bool = True) -> Root:
    """The root meta.json and, fetched beside it, the manifest if there is a usable one (one round trip). A
    manifest that is damaged or was written for another root meta.json is left aside, with a warning."""
    wanted = [(ROOT_META, "meta")] + ([(MANIFEST, "manifest")] if manifest else [])
    raw, *found = store.read_many(wanted)
    if isinstance(raw, ObjectNotFoundError):
        store.check_bucket()  # a missing bucket is named as such (one more request, on this path only)
        if pending_journals(store):
            raise DatasetNotFoundError(
                f"no {ROOT_META}: a commit here was interrupted; `atlas-remote recover URL` (or the next writer) "
                f"finishes it",
                url=store.url,
            ) from raw
        raise DatasetNotFoundError(
            f"no {ROOT_META} here: not an Atlas dataset, or not committed yet", url=store.url
        ) from raw
    if isinstance(raw, AtlasError):
        raise raw from raw.__cause__
    try:
        layout = AtlasDatasetMetadata.from_json(raw, ROOT_META)
    except FormatError as err:
        raise err.located(url=store.url)
    other = found[0] if found else None
    usable = _usable_manifest(store, raw, layout, other)
    root_object = None if usable is not None else _object_version(store)
    return Root(layout, usable, RootVersion(*_digests(raw, other), root_object))


def _object_version(store: Store) -> str:
    identity = store.identity(ROOT_META)
    return f"{identity.version}@{identity.modified}"


def _digests(root: bytes, manifest: bytes | AtlasError | None) -> tuple[str, str | None]:
    return root_digest(root), root_digest(manifest) if isinstance(manifest, bytes) else None


def _usable_manifest(store: Store, root: bytes, layout: AtlasDatasetMetadata, raw: bytes | AtlasError | None):
    if raw is None or isinstance(raw, ObjectNotFoundError):
        return None
    try:
        if isinstance(raw, AtlasError):
            raise raw
        manifest = Manifest.decode(raw, MANIFEST)
    except AtlasError as err:
        log.warning("%s: %s; reading without it", store.url, err.located(url=store.url))
        return None
    if not manifest.describes(root, layout.shard_sizes):
        log.warning(
            "%s: %s was written for another %s (the dataset was rewritten by a tool that does not know "
            "manifests); reading without it: `atlas-remote index URL` rebuilds it",
            store.url,
            MANIFEST,
            ROOT_META,
        )
        return None
    return manifest


def find_shards(store: Store, layout: AtlasDatasetMetadata, names: list[str] | None = None) -> list[Shard]:
    """The shard folders present: from the root's listing (names, or one listing now), or, where the store cannot
    list, all that the root names."""
    sizes = layout.shard_sizes
    if not store.can_list:
        return [Shard(n, shard_name(n, len(sizes)), size) for n, size in enumerate(sizes)]
    shards = []
    for name in store.list_names() if names is None else names:
        number = parse_shard_name(name)
        if number is None:
            continue
        if number >= len(sizes):
            raise FormatError(
                f"shard folder {name!r} is beyond the {len(sizes)} shards listed in {ROOT_META}",
                url=store.url,
                shard=name,
            )
        if store.is_local:
            _refuse_links_out(store, name)
        shards.append(Shard(number, name, sizes[number]))
    return sorted(shards, key=lambda s: s.number)


def _refuse_links_out(store: Store, name: str) -> None:
    """A local shard folder that is a symbolic link must stay inside the dataset's root: a dataset unpacked from
    someone's archive must not make a reader (or a writer's cleanup) reach files elsewhere on the machine."""
    path = store.path(name)
    if os.path.islink(path):
        root = os.path.realpath(store.path(""))
        target = os.path.realpath(path)
        if os.path.commonpath([root, target]) != root:
            raise FormatError(
                f"shard folder {name!r} is a symbolic link to {target}, outside the dataset; copy the shard "
                f"into the dataset's folder instead",
                url=store.url,
                shard=name,
            )


MAP_FROM_BYTES = 1 << 20  # a smaller index is read: a mapping holds a file descriptor while its shard is open


def _worth_mapping(path: str) -> bool:
    """Only a large index is memory-mapped: each mapping keeps a descriptor open, and a 1,500-shard dataset once
    ran out of them (ulimit -n 1024); the shard LRU's byte bound then bounds the mappings too."""
    try:
        return os.path.getsize(path) >= MAP_FROM_BYTES
    except OSError:
        return False  # missing: the read reports it


class ShardTable:
    """The shards present, opened lazily and once per process, and the map from example index to block."""

    def __init__(
        self,
        store: Store,
        layout: AtlasDatasetMetadata,
        shards: list[Shard],
        policy: PicklePolicy,
        shared_dictionary: bytes | None = None,
    ) -> None:
        self.store, self.layout, self.shards, self.policy = store, layout, shards, policy
        self.manifest: Manifest | None = None  # set by the reader when the dataset has one
        self.version: RootVersion | None = None  # of what the reader opened
        self.ends = list(itertools.accumulate(len(s) for s in shards))
        for position, (shard, end) in enumerate(zip(shards, self.ends)):
            shard.start, shard.position = end - shard.size, position
        self._decoders: dict[object, BlockDecoder] = {}
        if shared_dictionary is not None:
            self._decoders["shared"] = self._new_decoder(True, shared_dictionary)
        self._open: OrderedDict[int, int] = OrderedDict()  # position -> bytes, least recently used first
        self._open_bytes = 0
        self.after_fork()
        forksafe.register(self)

    def __len__(self) -> int:
        return self.ends[-1] if self.ends else 0

    @property
    def url(self) -> str:
        return self.store.url

    def after_fork(self) -> None:
        """Locks and threads of this process (a forked child must not wait on a lock its parent held)."""
        self._decoder_lock, self._lru_lock = threading.Lock(), threading.Lock()
        self._locks = [threading.Lock() for _ in range(64)]  # striped: a shard's open takes shard.number % 64
        self._opener: ThreadPoolExecutor | None = None

    # -- locating ------------------------------------------------------------------------------------

    def position_of(self, i: int) -> int:
        """The position in the table of the shard holding global example i (already normalised)."""
        return bisect.bisect_right(self.ends, i)

    def locate(self, i: int) -> tuple[BlockKey, int]:
        """((shard position, block), slot) of global example i (already normalised); opens the shard if needed."""
        position = bisect.bisect_right(self.ends, i)
        shard = self.shards[position]
        block, slot = divmod(i - shard.start, self.state(position).meta.block_size)
        return (position, block), slot

    def state(self, position: int) -> OpenShard:
        """The opened state of the shard at position: opened now if it is not (or was forgotten)."""
        opened = self.shards[position].opened
        if opened is None:
            return self.open(self.shards[position])
        return opened

    def block_ranges(self) -> list[tuple[int, int]]:
        """(start, stop) of every block, as global example indices, in order (needs every shard's meta.json)."""
        self.load_metadata()
        return [
            (shard.start + b * shard.meta.block_size, shard.start + min((b + 1) * shard.meta.block_size, shard.size))
            for shard in self.shards
            for b in range(shard.meta.num_blocks)
        ]

    # -- opening -------------------------------------------------------------------------------------

    def open_many(self, shards: Iterable[Shard]) -> None:
        """Open shards concurrently: one round trip in all, rather than one per shard."""
        todo = [s for s in dict.fromkeys(shards) if s.opened is None]
        if len(todo) == 1:
            self.open(todo[0])
        elif todo:
            with ThreadPoolExecutor(
                min(len(todo), self.store.options.max_concurrency), thread_name_prefix="atlas-open"
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

    def open(self, shard: Shard) -> OpenShard:
        """Fetch what a shard needs before its blocks can be read: once per process, whatever the threads, and
        again only if the table forgot it (shard_cache_bytes bounds what the open shards hold).

        One round trip: meta.json, index.npy, the checksum sidecar (if the writer left one), the shard's own
        dictionary when the root says shards have one (one that fell back to standard compression has none),
        and, beside them, data.bin's identity (size and version), which the index is checked against and
        which later tells a rewritten dataset from a corrupt one.
        """
        opened = shard.opened
        if opened is not None:
            return opened
        try:
            with self._locks[shard.number % len(self._locks)]:
                opened = shard.opened
                if opened is None:
                    opened = shard.opened = self._open_locked(shard)
                    if opened.identity.size:  # every block read must find the data.bin this open found
                        self.store.expect(opened.data_file, opened.identity)
                    self._remember(shard)
        except DatasetChangedError:
            raise
        except ObjectNotFoundError as err:
            self._refuse_if_rewritten(shard, err)
            if self.manifest is not None and not err.problem.endswith("present"):
                err.problem += (
                    "; the dataset's manifest lists this shard: if shards were removed on purpose, "
                    "`atlas-remote index URL` indexes the shards present"
                )
            raise err.located(url=self.url, shard=shard.name)
        except AtlasError as err:
            self._refuse_if_rewritten(shard, err)
            raise err.located(url=self.url, shard=shard.name)
        return opened

    def _refuse_if_rewritten(self, shard: Shard, err: AtlasError | None) -> None:
        """A shard that fails to open, or disagrees with the manifest, may belong to a newer version of the
        dataset: if the root no longer holds what the reader opened, say so rather than call the data corrupt."""
        if self.version is None:
            return
        try:
            if self.version.object is not None:  # no manifest: the root meta.json's object version tells
                changed = _object_version(self.store) != self.version.object
            else:
                root, manifest = self.store.read_many([(ROOT_META, "meta"), (MANIFEST, "manifest")])
                changed = not isinstance(root, bytes) or _digests(root, manifest) != self.version[:2]
        except ObjectNotFoundError:
            changed = True  # the root meta.json is gone: a commit is rewriting the dataset now
        except AtlasError:
            return
        if changed:
            raise DatasetChangedError(
                "the dataset was rewritten after this reader opened it (its root meta.json or manifest is not "
                "the one it opened), "
                "so this shard may be of another version: open it again (ds.reopen()) to read the new one",
                url=self.url,
                shard=shard.name,
            ) from err

    def _remember(self, shard: Shard) -> None:
        """Count the shard among the open ones, and forget the least recently opened beyond the bound (a reader
        that sweeps 100,000 shards holds a bounded amount; one that comes back opens the shard again)."""
        position = shard.position
        with self._lru_lock:
            self._open[position] = shard.opened.nbytes
            self._open.move_to_end(position)
            self._open_bytes += self._open[position]
            while self._open_bytes > self.store.options.shard_cache_bytes and len(self._open) > 1:
                victim, nbytes = self._open.popitem(last=False)
                self._open_bytes -= nbytes
                self.shards[victim].opened = None
                self.store.expect(self.shards[victim].file(DATA_FILE), None)

    @property
    def open_count(self) -> int:
        with self._lru_lock:
            return len(self._open)

    def _open_locked(self, shard: Shard) -> OpenShard:
        store = self.store
        identity = store.beside(store.identity, shard.file(DATA_FILE))
        wanted = [
            (shard.file(name), kind)
            for name, kind in ((SHARD_META, "meta"), (INDEX_FILE, "index"), (CHECKSUM_FILE, "checksums"))
        ]
        mapped = store.options.mmap_index and store.is_local and _worth_mapping(store.path(shard.file(INDEX_FILE)))
        if mapped:
            wanted.pop(1)
        if shard.meta is not None:  # already fetched by load_metadata()
            wanted.pop(0)
        strategy = self.layout.compression_strategy
        if strategy == CompressionStrategy.DICTIONARY_COMPRESSION:
            wanted.append((shard.file(DICT_FILE), "dict"))
        elif strategy == CompressionStrategy.SHARED_DICTIONARY_COMPRESSION and "shared" not in self._decoders:
            wanted.append((DICT_FILE, "dict"))  # the first shard opened brings the shared dictionary too
        root = None
        if self.manifest is None and self.version is not None and self.version.object is not None:
            root = store.beside(_object_version, store)  # no manifest to check the shard against: the root's
        bodies = store.read_many(wanted)
        if root is not None:
            try:
                unchanged = root.result() == self.version.object
            except ObjectNotFoundError:
                unchanged = False
            if not unchanged:
                self._refuse_if_rewritten(shard, None)
        meta = shard.meta or self._parse_meta(shard, bodies.pop(0))
        index_path = shard.file(INDEX_FILE)
        raw_index = store.map_array(index_path, "index") if mapped else bodies.pop(0)
        raw_sums, *raw_dict = bodies
        if isinstance(raw_index, AtlasError):
            raise raw_index
        if isinstance(raw_sums, AtlasError) and not isinstance(raw_sums, ObjectNotFoundError):
            raise raw_sums
        offsets = (
            check_index(cast(np.ndarray, raw_index), meta, index_path)
            if mapped
            else decode_index(cast(bytes, raw_index), meta, index_path)
        )
        largest = int(np.diff(offsets).max(initial=0))
        if largest > store.options.max_block_bytes:
            raise FormatError(
                f"the index gives a block of {largest:,} bytes, above max_block_bytes: index.npy is probably "
                f"damaged (if blocks really are this large, raise max_block_bytes)",
                path=index_path,
            )
        try:
            found = identity.result()
        except ObjectNotFoundError:
            if meta.stored_examples:
                raise
            found = ObjectIdentity(store.url_of(shard.file(DATA_FILE)), 0, "absent")
        if int(offsets[-1]) != found.size:
            raise FormatError(
                f"the blocks end at byte {int(offsets[-1])} but {DATA_FILE} holds {found.size} bytes: "
                f"index.npy does not match data.bin",
                path=index_path,
            )
        checksums = None
        if not isinstance(raw_sums, AtlasError):
            checksums = decode_checksums(raw_sums, meta, shard.file(CHECKSUM_FILE))
        if self.manifest is not None:
            disagreement = self.manifest.check_shard(shard.number, meta, found.size, shard_digest(offsets, checksums))
            if disagreement:
                self._refuse_if_rewritten(shard, None)
                raise FormatError(
                    f"the dataset's manifest is stale: this shard's own files say {disagreement}; "
                    f"rebuild it with `atlas-remote index URL`",
                    path=shard.file(SHARD_META),
                )
        shard.meta = meta
        decoder = self._decoder_for(shard, raw_dict[0] if raw_dict else None)
        return OpenShard(
            meta,
            offsets,
            offsets.view(np.ndarray),
            checksums,
            decoder,
            found,
            shard.file(DATA_FILE),
            shard.size,
            shard.name,
        )

    def _parse_meta(self, shard: Shard, raw: bytes | AtlasError) -> AtlasDatasetShardMetadata:
        if isinstance(raw, AtlasError):
            raise raw
        where = shard.file(SHARD_META)
        meta = AtlasDatasetShardMetadata.from_json(raw, where)
        if meta.stored_examples != shard.size:
            raise FormatError(
                f"stored_examples is {meta.stored_examples} but the root {ROOT_META} says shard "
                f"{shard.number} holds {shard.size}",
                path=where,
            )
        return meta

    def load_metadata(self) -> list[AtlasDatasetShardMetadata]:
        """Every present shard's meta.json (those not yet fetched come in one concurrent batch)."""
        todo = [shard for shard in self.shards if shard.meta is None]
        for shard, raw in zip(todo, self.store.read_many([(s.file(SHARD_META), "meta") for s in todo])):
            try:
                meta = self._parse_meta(shard, raw)
            except AtlasError as err:
                raise err.located(url=self.url, shard=shard.name)
            with self._locks[shard.number % len(self._locks)]:
                shard.meta = shard.meta or meta
        return [cast(AtlasDatasetShardMetadata, shard.meta) for shard in self.shards]

    def _new_decoder(self, compressed: bool, dictionary: bytes | None) -> BlockDecoder:
        return BlockDecoder(compressed, dictionary, self.policy, self.store.options.max_block_bytes)

    def _decoder_for(self, shard: Shard, fetched_dictionary: bytes | AtlasError | None) -> BlockDecoder:
        """The shard's decoder: its own dictionary's, or the one shared by every shard stored the same way."""
        strategy = shard.meta.compression_strategy
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
