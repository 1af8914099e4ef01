"""The format: the spec's files as data (`spec`: metadata, shard folder names, `index.npy`, our sidecars, a
dataset's `Layout`), blocks to bytes and back (`codec`), our manifest (`manifest`) and the names of our files
beside the format's (`names`). No reading or writing policy lives here; see docs/architecture.md."""

from .spec import AtlasDatasetMetadata, AtlasDatasetShardMetadata, CompressionStrategy, Layout

__all__ = ["AtlasDatasetMetadata", "AtlasDatasetShardMetadata", "CompressionStrategy", "Layout"]
