"""Importers: the formats our users' data lives in before it becomes Atlas, each read by hand, streaming, from
any fsspec URL. Every importer module has the same two functions:

- `inputs(src, storage_options=None, **options) -> list[str]`: the source expanded into its input units
  (tar files, .idx/.bin prefixes, document files, zarr stores, JSON-lines, Parquet or Arrow files), in order. A conversion
  writes one part per input unit, so it is also the unit of parallel work and of resuming.
- `samples(inputs, storage_options=None, **options) -> Iterator`: the examples of those inputs, in order.
"""

from __future__ import annotations

from importlib import import_module
from types import ModuleType

FORMATS = ("webdataset", "megatron", "dolma", "zarr", "jsonl", "parquet", "arrow")


def importer(name: str) -> ModuleType:
    """The importer module for a format name."""
    if name not in FORMATS:
        raise ValueError(f"unknown source format {name!r}: choose one of {', '.join(FORMATS)}")
    return import_module(f"{__name__}.{name}")
