"""The manifest: every shard's metadata in one root object, never trusted for data."""

from __future__ import annotations

import numpy as np
import pytest

from atlas_remote import FormatError
from atlas_remote.format import AtlasDatasetShardMetadata, CompressionStrategy
from atlas_remote.manifest import Manifest


def meta(stored: int, block: int = 8, strategy: int = 2) -> AtlasDatasetShardMetadata:
    return AtlasDatasetShardMetadata(1, block, stored, CompressionStrategy(strategy), 3, 0.01)


ROOT = b'{"version": 1, "shard_sizes": [100, 60, 0], "compression_strategy": 2}'


def small() -> Manifest:
    return Manifest.of(
        ROOT, [(2, meta(0), 0, True, 7), (0, meta(100), 5000, True, 8), (1, meta(60, 8, 1), 3100, False, 9)]
    )


def test_a_manifest_round_trips_and_describes_its_root():
    decoded = Manifest.decode(small().encode())
    assert decoded.numbers.tolist() == [0, 1, 2] and decoded.sizes.tolist() == [100, 60, 0]
    assert decoded.strategies.tolist() == [2, 1, 2] and decoded.checksums.tolist() == [True, False, True]
    assert decoded.describes(ROOT, [100, 60, 0])
    assert not decoded.describes(ROOT.replace(b"60", b"61"), [100, 61, 0]), "another root: stale"
    assert decoded.layout([0, 2]).sizes.tolist() == [100, 0]


def test_a_shard_that_disagrees_is_named():
    manifest = small()
    assert manifest.check_shard(0, meta(100), 5000, 8) is None
    assert "block_size 16 (manifest: 8)" in manifest.check_shard(0, meta(100, 16), 5000, 8)
    assert "data.bin bytes 4999 (manifest: 5000)" in manifest.check_shard(0, meta(100), 4999, 8)
    assert "index digest 5 (manifest: 8)" in manifest.check_shard(0, meta(100), 5000, 5)
    assert "no entry" in manifest.check_shard(7, meta(100), 5000, 8)


@pytest.mark.parametrize("damage", [lambda raw: raw[: len(raw) // 2], lambda raw: b"PK" + raw[2:40], lambda raw: b""])
def test_a_damaged_manifest_is_a_format_error(damage):
    with pytest.raises(FormatError, match="atlas-remote index"):
        Manifest.decode(damage(small().encode()))


def test_a_manifest_of_a_hundred_thousand_shards_is_small():
    count = 100_000
    shards = Manifest(
        "x" * 64,
        np.arange(count),
        np.full(count, 10_000),
        np.full(count, 64),
        np.full(count, 2, np.uint8),
        np.random.default_rng(0).integers(900_000, 1_100_000, count),
        np.ones(count, bool),
        np.random.default_rng(1).integers(0, 2**32, count, dtype=np.uint32),  # digests do not compress
    )
    raw = shards.encode()
    assert len(raw) < 1_000_000, f"{len(raw):,} bytes"
    assert Manifest.decode(raw).data_bytes.tolist() == shards.data_bytes.tolist()
