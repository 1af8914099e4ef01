"""The format document's own reading algorithm on a local path, written from the spec.

It behaves as the original reader does where that matters for compatibility: metadata records are built
from exactly the spec's keys (an extra key is an error), shard folders are every sub-folder in sorted order,
the shared dictionary comes from the root, and only the last decoded block of each shard is kept.
Tests use it to show the original reader can read what we write; benchmarks use it as the spec baseline.
"""

from __future__ import annotations

import bisect
import itertools
import json
import pickle
from pathlib import Path
from typing import NamedTuple

import numpy as np
import zstandard


class RootMeta(NamedTuple):
    version: int
    shard_sizes: list
    compression_strategy: int


class ShardMeta(NamedTuple):
    version: int
    block_size: int
    stored_examples: int
    compression_strategy: int
    compression_level: int
    compression_dict_size: float


class SpecShard:
    def __init__(self, folder: Path, shared_dict: bytes | None) -> None:
        self.meta = ShardMeta(**json.loads((folder / "meta.json").read_text()))
        self.index = np.load(folder / "index.npy", mmap_mode="r")
        self.data = open(folder / "data.bin", "rb")
        strategy = self.meta.compression_strategy
        dict_bytes = (
            (folder / "zstd_dict.bin").read_bytes() if strategy == 3 else shared_dict if strategy == 2 else None
        )
        self.dctx = None
        if strategy:
            data = zstandard.ZstdCompressionDict(dict_bytes) if dict_bytes else None
            self.dctx = zstandard.ZstdDecompressor(dict_data=data)
        self.last = (None, None)

    def __getitem__(self, i: int):
        block, slot = divmod(i, self.meta.block_size)
        if self.last[0] != block:
            start, end = self.index[block : block + 2]
            self.data.seek(int(start))
            raw = self.data.read(int(end - start))
            self.last = (block, pickle.loads(self.dctx.decompress(raw) if self.dctx else raw))
        return self.last[1][slot]


class SpecReader:
    def __init__(self, root: str | Path) -> None:
        root = Path(root)
        self.meta = RootMeta(**json.loads((root / "meta.json").read_text()))
        shared = (root / "zstd_dict.bin").read_bytes() if self.meta.compression_strategy == 2 else None
        self.shards = [SpecShard(p, shared) for p in sorted(p for p in root.iterdir() if p.is_dir())]
        self.ends = list(itertools.accumulate(s.meta.stored_examples for s in self.shards))

    def __len__(self) -> int:
        return self.ends[-1] if self.ends else 0

    def __getitem__(self, i: int):
        shard = bisect.bisect_right(self.ends, i)
        return self.shards[shard][i - (self.ends[shard - 1] if shard else 0)]

    def all(self) -> list:
        return [self[i] for i in range(len(self))]
