"""atlas_remote: read and write Atlas v1 datasets on any fsspec URL, one ranged read per block."""

import importlib.abc
import importlib.util
import sys
from importlib import metadata as _metadata
from importlib.machinery import ModuleSpec
from types import ModuleType

from .errors import (
    AccessDeniedError,
    AtlasError,
    BucketNotFoundError,
    CacheFolderError,
    CheckpointError,
    ClientFailedError,
    CollateError,
    CommitInterruptedError,
    CorruptBlockError,
    DatasetChangedError,
    DatasetExistsError,
    DatasetLockedError,
    DatasetNotFoundError,
    ExpansionError,
    ExportError,
    FormatError,
    LocationError,
    ObjectNotFoundError,
    PackingError,
    RangeNotSupportedError,
    RedirectRefusedError,
    StorageError,
    TruncatedReadError,
    UnguardedScriptError,
    UnpicklableExampleError,
    UnsafePickleError,
    UsageError,
    WriteEndedError,
)
from .format.codec import PicklePolicy
from .format.spec import AtlasDatasetMetadata, AtlasDatasetShardMetadata, CompressionStrategy
from .read.megatron import MegatronCorpus, megatron
from .read.options import ReaderOptions
from .read.reader import AtlasDataset, AtlasDatasetShard, open
from .storage.stats import Stats
from .training.census import TokenCounts
from .training.mixture import Mixture
from .write.build import build, write
from .write.commit import RecoverReport, recover
from .write.convert import ConvertReport, convert
from .write.copy import CopyReport, copy_dataset
from .write.pipeline import WriteReport
from .write.settings import WriteSettings
from .write.shard_writer import AtlasDatasetShardWriter
from .write.verify import ChecksumReport, IndexReport, VerifyReport, add_checksums, add_manifest, verify
from .write.writer import AtlasDatasetWriter

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
    "ClientFailedError",
    "CollateError",
    "ChecksumReport",
    "CommitInterruptedError",
    "CompressionStrategy",
    "CorruptBlockError",
    "DatasetChangedError",
    "DatasetExistsError",
    "DatasetLockedError",
    "DatasetNotFoundError",
    "ExpansionError",
    "ExportError",
    "FormatError",
    "LocationError",
    "MegatronCorpus",
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
    "UsageError",
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
    "megatron",
]


def __getattr__(name: str):
    """`atlas_remote.TokenStream`, imported when first asked for: it needs torch, and `import atlas_remote`
    never imports torch; and a module by its name before the cut (`atlas_remote.codec`: MOVED)."""
    if name == "TokenStream":
        from .training.tokens import TokenStream

        return TokenStream
    if name in MOVED:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module 'atlas_remote' has no attribute {name!r}")


# Where each module stood before the package was cut into subpackages: `import atlas_remote.plan`-style imports
# of the old names (and `atlas_remote.codec`-style attributes) still work, and give the module itself (no copy): one
# table, read by _OldNames and __getattr__. Not build, convert and verify: at the top those names are the functions,
# and a module imported under one would be set over the function on the package.
MOVED = {
    "blocks": "read.blocks",
    "cache": "read.cache",
    "cache_folder": "read.cache_folder",
    "census": "training.census",
    "checkpoint": "training.epoch_state",
    "cli_output": "cli.output",
    "codec": "format.codec",
    "collate": "training.collate",
    "commit": "write.commit",
    "copy": "write.copy",
    "description": "read.description",
    "discovery": "read.discovery",
    "epoch_state": "training.epoch_state",
    "epochs": "training.epochs",
    "export": "read.export",
    "forksafe": "storage.forksafe",
    "functions": "write.functions",
    "keys": "trust.keys",
    "layout": "format.names",
    "lease": "write.lease",
    "manifest": "format.manifest",
    "mixture": "training.mixture",
    "options": "read.options",
    "processes": "runtime.processes",
    "progress": "runtime.progress",
    "part_writer": "write.part_writer",
    "parts": "write.parts",
    "pickle_walk": "trust.walk",
    "pipeline": "write.pipeline",
    "plan": "training.plan",
    "ranges": "storage.ranges",
    "ray_data": "write.ray_data",
    "ray_tasks": "write.ray_tasks",
    "readahead": "read.readahead",
    "reader": "read.reader",
    "runs": "training.runs",
    "safe_arrays": "trust.safe_arrays",
    "safe_builtins": "trust.safe_builtins",
    "samplers": "training.samplers",
    "serving": "training.serving",
    "shard_fetch": "read.shard_fetch",
    "shard_writer": "write.shard_writer",
    "shards": "read.shards",
    "stats": "storage.stats",
    "tokens": "training.tokens",
    "unpickler": "trust.unpickler",
    "walk_graph": "trust.walk_graph",
    "walk_keys": "trust.walk_keys",
    "walk_opcodes": "trust.walk_opcodes",
    "write_settings": "write.settings",
    "writer": "write.writer",
}


class _OldNames(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds `atlas_remote.<old name>` (MOVED) and answers with the module at its new place."""

    def find_spec(self, fullname: str, path: object = None, target: object = None) -> ModuleSpec | None:
        old = fullname.removeprefix(__name__ + ".")
        return ModuleSpec(fullname, self) if old in MOVED and old != fullname else None

    def create_module(self, spec: ModuleSpec) -> ModuleType:
        module = importlib.import_module(f"{__name__}.{MOVED[spec.name.removeprefix(__name__ + '.')]}")
        spec.loader_state = module.__spec__  # the import system sets the alias's spec on it: exec_module puts it back
        return module

    def exec_module(self, module: ModuleType) -> None:
        module.__spec__ = module.__spec__.loader_state if module.__spec__ else None


if not any(isinstance(finder, _OldNames) for finder in sys.meta_path):
    sys.meta_path.append(_OldNames())


try:  # one version, the package's own metadata (pyproject.toml): what pip, `--version` and this attribute say
    __version__ = _metadata.version("atlas_remote")
except _metadata.PackageNotFoundError:  # imported from a source tree that was never installed
    __version__ = "0+unknown"
