"""Blocks <-> bytes: pickle a list of examples, zstd with or without a dictionary, and back.

Decoding uses a restricted unpickler by default: an Atlas block is a pickle, and a plain pickle.loads of a
block from someone else's bucket would let that bucket run code on the training machine.
"""

from __future__ import annotations

import io
import pickle
import threading
from collections.abc import Iterable
from typing import Any

import zstandard

from ..errors import CorruptBlockError, UnsafePickleError
from ..trust import unpickler
from ..trust.measure import HeldBytes
from ..trust.unpickler import RestrictedUnpickler
from .seal import dictionary_digest
from .spec import CompressionStrategy

DEFAULT_MAX_BLOCK_BYTES = 1 << 30
UNSIZED_PIECE_BYTES = 1 << 20  # what a frame without a declared size is decompressed by


def _global_name(item: type | str) -> tuple[str, str]:
    if isinstance(item, str):
        module, _, name = item.rpartition(".")
        return module, name
    return item.__module__, item.__qualname__


class PicklePolicy:
    """Which globals a block may name (see unpickler.py: data, never code). `allowed_classes` adds classes of
    your own; `trusted=True` means plain pickle (for datasets you wrote yourself)."""

    def __init__(self, allowed_classes: Iterable[type | str] = (), trusted: bool = False) -> None:
        self.trusted = trusted
        self.allowed = frozenset(_global_name(c) for c in allowed_classes)
        # a subclass per policy, with the allowed names on the class: no Python-level __init__ per block
        self._unpickler = type("PolicyUnpickler", (RestrictedUnpickler,), {"user": self.allowed})

    def loads(
        self, data: bytes | memoryview, max_block_bytes: int = DEFAULT_MAX_BLOCK_BYTES, signed: bool = False
    ) -> Any:
        """A block's value; what it may build is bounded by its size and max_block_bytes (unpickler.limit_for).
        `signed`: the block carries the reader's own key's signature, so its opcodes are not walked (the globals
        it may name and their checks are the same)."""
        if self.trusted:
            return pickle.loads(data)
        return unpickler.load(self._unpickler, data, max_block_bytes, signed)


def pickle_block(examples: list) -> bytes:
    """The spec's step 2: the block's examples as one pickled list (the format's default protocol)."""
    return pickle.dumps(examples, protocol=pickle.DEFAULT_PROTOCOL)


def train_dictionary(pickled_blocks: list[Any], dict_fraction: float, level: int) -> bytes:
    """A zstd dictionary sized as the original writer sizes it: fraction of the data, at least 1 KiB."""
    total = sum(len(b) for b in pickled_blocks)
    size = max(int(dict_fraction * total) + 1, 1024)
    return zstandard.train_dictionary(size, pickled_blocks, level=level).as_bytes()


def compressor(strategy: CompressionStrategy, level: int, dictionary: bytes | None) -> zstandard.ZstdCompressor | None:
    if strategy == CompressionStrategy.NO_COMPRESSION:
        return None
    if dictionary is None:
        return zstandard.ZstdCompressor(level=level)
    return zstandard.ZstdCompressor(level=level, dict_data=zstandard.ZstdCompressionDict(dictionary))


class BlockDecoder:
    """Decodes the blocks of every shard stored one way (one dictionary, or none).

    Shards that share a way of storage share a decoder, so there is one zstd decompressor per dictionary per
    thread (zstandard decompressors must not be used by two threads at once).
    """

    def __init__(
        self,
        compressed: bool,
        dictionary: bytes | None,
        policy: PicklePolicy,
        max_block_bytes: int = DEFAULT_MAX_BLOCK_BYTES,
    ) -> None:
        self.compressed = compressed
        self.dictionary = dictionary
        self.dictionary_digest = dictionary_digest(dictionary)  # what a shard's seal binds (seal.py)
        self.policy = policy
        self.max_block_bytes = max_block_bytes
        self.held = HeldBytes()
        self._local = threading.local()

    def _decompressor(self) -> zstandard.ZstdDecompressor:
        dctx = getattr(self._local, "dctx", None)
        if dctx is None:
            dict_data = zstandard.ZstdCompressionDict(self.dictionary) if self.dictionary is not None else None
            dctx = self._local.dctx = zstandard.ZstdDecompressor(dict_data=dict_data)
        return dctx

    def declared_size(self, raw: bytes | memoryview) -> int:
        """The bytes a stored block decompresses to, as its frame says; a frame that does not say (a streaming
        compressor's) counts as max_block_bytes, the most it may yield."""
        if not self.compressed:
            return len(raw)
        try:
            declared = zstandard.frame_content_size(raw)
        except zstandard.ZstdError:
            return 0  # decompress() names the block
        return self.max_block_bytes if declared < 0 else declared

    def declared_sizes(self, raws: list) -> list[int]:
        """What each stored block declares it decompresses to, each within max_block_bytes: refused (without
        naming the block: decompress() does) if a frame is not one, declares too much, or declares nothing (a
        frame without its size is decompressed alone, by decompress_many)."""
        if not self.compressed:
            return [len(raw) for raw in raws]
        try:
            sizes = list(map(zstandard.frame_content_size, raws))
        except zstandard.ZstdError as err:
            raise CorruptBlockError(f"not a zstd frame ({err})") from err
        if sizes and (min(sizes) < 0 or max(sizes) > self.max_block_bytes):
            raise CorruptBlockError("a block of the batch declares no size, or more than max_block_bytes")
        return sizes

    def _declared(self, raw: bytes | memoryview) -> int:
        """The frame's declared size (-1: none), refused above max_block_bytes before anything is allocated."""
        try:
            declared = zstandard.frame_content_size(raw)
        except zstandard.ZstdError as err:
            raise CorruptBlockError(f"not a zstd frame ({err})") from err
        if declared > self.max_block_bytes:
            raise CorruptBlockError(
                f"block declares {declared} decompressed bytes, above the {self.max_block_bytes} limit"
            )
        return declared

    def decompress(self, raw: bytes | memoryview) -> bytes | memoryview:
        if not self.compressed:
            return raw
        try:
            if self._declared(raw) < 0:
                return self._decompress_unsized(raw)
            return self._decompressor().decompress(raw, max_output_size=self.max_block_bytes)
        except zstandard.ZstdError as err:
            raise CorruptBlockError(f"zstd could not decompress the block ({err})") from err

    def _decompress_unsized(self, raw: bytes | memoryview) -> memoryview:
        """A frame without a content size (zstd's streaming compressors write them; the original writer does not)
        streamed out a piece at a time: never more than max_block_bytes, and allocated as it comes, not up front."""
        out = io.BytesIO()
        with self._decompressor().stream_reader(raw, read_across_frames=False) as reader:
            while piece := reader.read(UNSIZED_PIECE_BYTES):
                if out.tell() + len(piece) > self.max_block_bytes:
                    raise CorruptBlockError(
                        f"block decompresses to more than the {self.max_block_bytes} limit (its frame does not "
                        f"declare its size)"
                    )
                out.write(piece)
        return out.getbuffer()

    def decompress_many(self, raws: list, checked: bool = False) -> list:
        """Several blocks in one call that releases the interpreter lock for all of them, so a read-ahead thread
        does not queue for the lock between blocks while another thread unpickles. A block that fails makes
        this raise; `decompress` then names it. Frames without a declared size are decompressed one by one
        (multi-decompression needs the size). `checked`: declared_sizes() passed them already."""
        if not self.compressed or len(raws) < 2 or (not checked and min(self._declared(raw) for raw in raws) < 0):
            return [self.decompress(raw) for raw in raws]
        try:
            buffers: Any = self._decompressor().multi_decompress_to_buffer(raws, threads=1)
            return list(buffers)
        except (zstandard.ZstdError, ValueError) as err:
            raise CorruptBlockError(f"zstd could not decompress a block of the batch ({err})") from err

    def unpickle(self, data: bytes | memoryview, signed: bool = False) -> list:
        """A decompressed block's examples (holds the interpreter lock; decompression does not). `signed`: see
        PicklePolicy.loads."""
        try:
            examples = self.policy.loads(data, self.max_block_bytes, signed)
        except UnsafePickleError:
            raise
        except Exception as err:  # a corrupt pickle can raise almost anything
            raise CorruptBlockError(f"the block does not unpickle ({type(err).__name__}: {err})") from err
        if not isinstance(examples, list):
            raise CorruptBlockError(f"a block must hold a list of examples, got {type(examples).__name__}")
        return examples

    def unpickle_sized(self, data: bytes | memoryview, signed: bool = False) -> tuple[list, int]:
        """(a decompressed block's examples, the bytes they hold in memory, for the memory cache's bound)."""
        examples = self.unpickle(data, signed)
        return examples, self.held.of(examples, len(data))
