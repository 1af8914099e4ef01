"""atlas_remote: read and write Atlas v1 datasets on any fsspec URL, one ranged read per block."""

from .codec import PicklePolicy
from .errors import (
    AtlasError,
    CorruptBlockError,
    DatasetChangedError,
    DatasetExistsError,
    DatasetNotFoundError,
    FormatError,
    StorageError,
    UnsafePickleError,
)
from .format import CompressionStrategy
from .reader import AtlasDataset, AtlasDatasetShard, open
from .storage import AccessDeniedError, ObjectNotFoundError, Stats
from .verify import VerifyReport, verify
from .writer import AtlasDatasetShardWriter, AtlasDatasetWriter, UnpicklableExampleError

__all__ = [
    "AccessDeniedError", "AtlasDataset", "AtlasDatasetShard", "AtlasDatasetShardWriter", "AtlasDatasetWriter",
    "AtlasError", "CompressionStrategy", "CorruptBlockError", "DatasetChangedError", "DatasetExistsError",
    "DatasetNotFoundError", "FormatError", "ObjectNotFoundError", "PicklePolicy", "Stats", "StorageError",
    "UnpicklableExampleError", "UnsafePickleError", "VerifyReport", "open", "verify",
]
__version__ = "0.1.0"
