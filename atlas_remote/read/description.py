"""`AtlasDataset.describe`: what `atlas-remote info` reports of a dataset, as data."""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING, Any

from ..format.spec import BLOCKS_FILE, CHECKSUM_FILE, DATA_FILE, DICT_FILE, CompressionStrategy

if TYPE_CHECKING:
    from .reader import AtlasDataset


def describe(ds: AtlasDataset) -> dict[str, Any]:
    """What `atlas-remote info` reports, as data: examples and shards present, strategies, block sizes, bytes
    stored, checksums, whose key signed it (its first shard's: yours, trusted, another key, earlier (a seal this
    version no longer takes) or none, and the key's id), the dictionary, and what describing it cost (a
    listing, the shards' meta.json files where the manifest does not have them, the first shard's sidecar)."""
    metas = ds.load_shard_metadata()
    sizes = ds.store.find()
    present = {s.number for s in ds.shards}
    stored = sum(sizes.get(s.file(DATA_FILE), 0) for s in ds.shards)
    with_sums = [s.name for s in ds.shards if s.file(BLOCKS_FILE) in sizes or s.file(CHECKSUM_FILE) in sizes]
    dictionaries = [sizes[rel] for rel in sizes if rel == DICT_FILE or rel.endswith(f"/{DICT_FILE}")]
    strategies = Counter(CompressionStrategy(meta.compression_strategy).name for meta in metas)
    signature, signer = "none", None
    if len(ds.shards):  # the first shard's, which opening it tells (one request)
        opened = ds.table.open(ds.shards[0])
        manifest = ds.manifest
        row = manifest.entry(ds.shards[0].number) if manifest is not None else None
        if opened.signer is not None:
            signer = opened.signer
            signature = "yours" if signer in ds.table.trust.own else "trusted"
        elif manifest is not None and row is not None and manifest.signer is not None and manifest.seal(row):
            signer, signature = manifest.signer, "another key"
        elif opened.sums is not None and opened.sums.earlier:
            signature = "earlier"
    stats = ds.stats
    return {
        "url": ds.url,
        "examples": len(ds),
        "examples_in_root": sum(ds.metadata.shard_sizes),
        "shards": len(ds.metadata.shard_sizes),
        "shards_present": len(ds.shards),
        "shards_missing": [n for n in range(len(ds.metadata.shard_sizes)) if n not in present],
        "compression_strategy": ds.metadata.compression_strategy.name,
        "shard_strategies": dict(strategies),
        "block_sizes": sorted({m.block_size for m in metas}),
        "bytes_stored": stored,
        "bytes_per_example": round(stored / len(ds), 1) if len(ds) else None,
        "shards_with_checksums": len(with_sums),
        "signed": signature,
        "signer": signer,
        "signer_name": ds.table.trust.name(signer) if signer is not None else None,
        "dictionary_bytes": dictionaries[0] if len(set(dictionaries)) == 1 else dictionaries,
        "read_client": ds.store.read_client,
        "requests": dict(stats.requests),
        "bytes_fetched": stats.total_bytes,
    }
