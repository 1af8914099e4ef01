"""The library's error types: one base class, each subclass a kind of failure a caller can act on."""

from __future__ import annotations


class AtlasError(Exception):
    """Base class of every error atlas_remote raises on purpose."""


class DatasetNotFoundError(AtlasError, FileNotFoundError):
    """No committed dataset at the URL (no root meta.json)."""


class DatasetExistsError(AtlasError, FileExistsError):
    """A writer was pointed at a URL that already holds a committed dataset."""


class FormatError(AtlasError, ValueError):
    """A metadata file or index does not follow the Atlas v1 format."""


class CorruptBlockError(AtlasError, ValueError):
    """A block's bytes are not what the index promised, or do not decode."""


class UnsafePickleError(AtlasError, ValueError):
    """A block refers to a global the restricted unpickler does not allow."""


class StorageError(AtlasError, OSError):
    """The store failed a request (missing object, denied access, network)."""


class DatasetChangedError(AtlasError):
    """The dataset was rewritten while a reader had it open; mixing old and new blocks is refused."""
