"""atlas_remote: read and write Atlas v1 datasets on any fsspec URL, one ranged read per block."""

from importlib import metadata as _metadata

from .build import build, write
from .census import TokenCounts
from .codec import PicklePolicy
from .commit import RecoverReport, recover
from .convert import ConvertReport, convert
from .copy import CopyReport, copy_dataset
from .errors import (
    AccessDeniedError,
    AtlasError,
    BucketNotFoundError,
    CacheFolderError,
    CheckpointError,
    CollateError,
    CommitInterruptedError,
    CorruptBlockError,
    DatasetChangedError,
    DatasetExistsError,
    DatasetLockedError,
    DatasetNotFoundError,
    ExportError,
    FormatError,
    ObjectNotFoundError,
    PackingError,
    RangeNotSupportedError,
    RedirectRefusedError,
    StorageError,
    TruncatedReadError,
    UnguardedScriptError,
    UnpicklableExampleError,
    UnsafePickleError,
    WriteEndedError,
)
from .format import AtlasDatasetMetadata, AtlasDatasetShardMetadata, CompressionStrategy
from .mixture import Mixture
from .options import ReaderOptions
from .pipeline import WriteReport
from .reader import AtlasDataset, AtlasDatasetShard, open
from .shard_writer import AtlasDatasetShardWriter
from .stats import Stats
from .verify import ChecksumReport, IndexReport, VerifyReport, add_checksums, add_manifest, verify
from .write_settings import WriteSettings
from .writer import AtlasDatasetWriter

__all__ = [
    "AccessDeniedError",
    "AtlasDataset",
    "AtlasDatasetMetadata",
    "AtlasDatasetShard",
    "AtlasDatasetShardMetadata",
    "AtlasDatasetShardWriter",
    "AtlasDatasetWriter",
    "AtlasError",
    "BucketNotFoundError",
    "CacheFolderError",
    "CheckpointError",
    "CollateError",
    "ChecksumReport",
    "CommitInterruptedError",
    "CompressionStrategy",
    "CorruptBlockError",
    "DatasetChangedError",
    "DatasetExistsError",
    "DatasetLockedError",
    "DatasetNotFoundError",
    "ExportError",
    "FormatError",
    "Mixture",
    "ObjectNotFoundError",
    "PackingError",
    "PicklePolicy",
    "RangeNotSupportedError",
    "RedirectRefusedError",
    "ReaderOptions",
    "RecoverReport",
    "Stats",
    "TokenCounts",
    "StorageError",
    "TruncatedReadError",
    "UnguardedScriptError",
    "WriteEndedError",
    "UnpicklableExampleError",
    "UnsafePickleError",
    "VerifyReport",
    "WriteReport",
    "WriteSettings",
    "ConvertReport",
    "CopyReport",
    "add_checksums",
    "add_manifest",
    "IndexReport",
    "build",
    "convert",
    "write",
    "copy_dataset",
    "open",
    "recover",
    "verify",
]


def __getattr__(name: str):
    """`atlas_remote.TokenStream`, imported when first asked for: it needs torch, and `import atlas_remote`
    never imports torch."""
    if name == "TokenStream":
        from .tokens import TokenStream

        return TokenStream
    raise AttributeError(f"module 'atlas_remote' has no attribute {name!r}")


try:  # one version, the package's own metadata (pyproject.toml): what pip, `--version` and this attribute say
    __version__ = _metadata.version("atlas_remote")
except _metadata.PackageNotFoundError:  # imported from a source tree that was never installed
    __version__ = "0+unknown"
