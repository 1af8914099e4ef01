"""How a dataset's shards are stored: one frozen value (as ReaderOptions is for reading) that every writer of one
dataset shares and that travels whole to worker processes, Ray tasks and the staging record."""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Any

from ..format.spec import CompressionStrategy


def check_writer_arguments(block_size: int, compression_dict_size: float) -> None:
    """ValueError, not the original's assert (which `python -O` removes)."""
    if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size <= 0:
        raise ValueError(f"block_size must be a positive integer, got {block_size!r}")
    if not 0.0 <= compression_dict_size <= 1.0:
        raise ValueError(f"compression_dict_size must be between 0 and 1, got {compression_dict_size!r}")


@dataclass(frozen=True)
class WriteSettings:
    """Shard size, block size, compression (strategy, level, dictionary size) and checksums: with checksums every
    shard gets a CRC-32 per block, signed with this machine's key, and the dataset its manifest; without, exactly
    the original writer's files. `tokens`: a key whose 1-D integer arrays are counted block by block as they are
    written, and saved beside the dataset at its commit (what a TokenStream packs from: no counting pass). The
    public functions keep these as keywords; they become one of these at once."""

    shard_size: int
    block_size: int
    compression_strategy: CompressionStrategy = CompressionStrategy.SHARED_DICTIONARY_COMPRESSION
    compression_level: int = 3
    compression_dict_size: float = 0.01
    checksums: bool = True
    tokens: str | None = None  # count each block's tokens under this key while writing (saved beside, at commit)

    def __post_init__(self) -> None:
        if isinstance(self.shard_size, bool) or not isinstance(self.shard_size, int) or self.shard_size <= 0:
            raise ValueError(f"shard_size must be a positive integer, got {self.shard_size!r}")
        check_writer_arguments(self.block_size, self.compression_dict_size)
        if self.tokens is not None and (not isinstance(self.tokens, str) or not self.tokens):
            raise ValueError(f"tokens must be the key of the examples' token ids, got {self.tokens!r}")
        object.__setattr__(self, "compression_strategy", CompressionStrategy(self.compression_strategy))

    @property
    def shared_dictionary(self) -> bool:
        return self.compression_strategy == CompressionStrategy.SHARED_DICTIONARY_COMPRESSION

    def with_dictionary(self, dictionary: bytes | None) -> WriteSettings:
        """These settings for parts given `dictionary`: without one, a shared dictionary falls back to
        STANDARD_COMPRESSION (the spec's rule for fewer than 7 blocks in the first shard)."""
        if self.shared_dictionary and dictionary is None:
            return replace(self, compression_strategy=CompressionStrategy.STANDARD_COMPRESSION)
        return self

    def record(self) -> dict[str, Any]:
        """As JSON (the staged run's record, compared on resume)."""
        return {**asdict(self), "compression_strategy": int(self.compression_strategy)}
