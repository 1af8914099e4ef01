"""Datasets from Python: `write(examples, url)` for rows already at hand (any iterable, a pyarrow Table, a Hugging
Face `datasets.Dataset` or `IterableDataset`), `build(fn, inputs, url)` for sources no importer knows (LitData's
`optimize`: `fn(input)` yields each input's examples). Both run on the conversion's machinery (parts.py): parts
written by worker processes, resume, one commit.

A Table or a Dataset is cut into parts of whole shards (at most MOST_PARTS of them, whatever the number of
workers), so that the dataset does not depend on the number of workers and, without a map, is the same, byte
for byte, as one writer's given the rows in order; each part's rows reach its worker through a pipe. Their rows are read as Arrow, with the same plain values as the
Parquet importer (importers/arrow_values.py). An iterable is one part, written in this process.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from itertools import chain, islice
from typing import Any

from .convert import DICTIONARY_PHASE, ConvertReport, announce, class_names
from .format import CompressionStrategy
from .functions import function_name, generated, label, mapped
from .importers.arrow_values import PlainRows
from .importers.parquet import pyarrow_modules
from .parts import PartSpec, StagedParts, first_shard_dictionary, write_parts
from .progress import ProgressArgument, progress_bar
from .writer import ShardSettings

MOST_PARTS = 64  # a Table is cut into about this many parts (at least a shard each), however many workers


def build(
    fn: Callable[[Any], Iterable[Any]] | str,
    inputs: Sequence[Any],
    url: str,
    *,
    workers: int = 1,
    shard_size: int = 10_000,
    block_size: int = 64,
    compression_strategy: CompressionStrategy = CompressionStrategy.SHARED_DICTIONARY_COMPRESSION,
    compression_level: int = 3,
    compression_dict_size: float = 0.01,
    checksums: bool = True,
    overwrite: bool = False,
    resume: bool = False,
    storage_options: dict[str, Any] | None = None,
    progress: ProgressArgument = None,
    allowed_classes: Iterable[type | str] = (),
) -> ConvertReport:
    """A dataset at url from `fn(input)` for each input, in order: fn returns or yields the input's examples.

    Each input is one part, written by one of `workers` processes (fn must then be a top-level function of an
    importable module, or its "module:function" name; with one worker, any callable). Inputs are what fn takes
    (URLs, file names, ids...); they must be picklable, and their `repr` identifies the run for `resume=True`,
    which skips the inputs an interrupted run finished. A failure in fn names the input and the example number,
    and nothing is committed. With SHARED_DICTIONARY_COMPRESSION the dictionary is trained first, on the first
    `shard_size` examples (fn runs once more on the first inputs for that).
    """
    inputs = list(inputs)
    settings = ShardSettings(
        shard_size, block_size, compression_strategy, compression_level, compression_dict_size, checksums
    )
    task = _Generate(function_name(fn) if workers > 1 else fn)
    with progress_bar(progress, len(inputs), "build", "inputs") as progress:
        dictionary, _ = _dictionary(settings, chain.from_iterable(task.examples(unit) for unit in inputs), progress)
        job = {"build": label(fn), "inputs": [repr(unit) for unit in inputs]}
        parts = StagedParts(
            url, settings, storage_options, job=job, dictionary=dictionary, overwrite=overwrite, resume=resume
        )
        resumed = write_parts(
            parts,
            inputs,
            task.write,
            workers=workers,
            resume=resume,
            progress=progress,
            allowed_classes=class_names(allowed_classes),
        )
        meta = parts.commit(len(inputs))
    return ConvertReport(
        label(fn),
        url,
        "function",
        len(inputs),
        resumed,
        sum(meta.shard_sizes),
        len(meta.shard_sizes),
        meta.compression_strategy.name,
    )


def write(
    examples: Any,
    url: str,
    *,
    workers: int = 1,
    shard_size: int = 10_000,
    block_size: int = 64,
    compression_strategy: CompressionStrategy = CompressionStrategy.SHARED_DICTIONARY_COMPRESSION,
    compression_level: int = 3,
    compression_dict_size: float = 0.01,
    checksums: bool = True,
    overwrite: bool = False,
    resume: bool = False,
    storage_options: dict[str, Any] | None = None,
    map: Callable[[Any], Any] | str | None = None,
    progress: ProgressArgument = None,
    allowed_classes: Iterable[type | str] = (),
) -> int:
    """Write examples as a dataset at url, committed once; returns how many were written.

    `examples` is a pyarrow Table or a Hugging Face `datasets.Dataset` (cut into parts written by `workers`
    processes; `resume=True` skips the parts an interrupted run of the same rows finished), an `IterableDataset`
    or any iterable (one part, in this process; no resume). `map` as in convert(): an example, a list, or None
    for each (with workers > 1, a top-level function of an importable module or its name); its failure names
    the example, and nothing is committed.
    """
    settings = ShardSettings(
        shard_size, block_size, compression_strategy, compression_level, compression_dict_size, checksums
    )
    table, kind = _as_table(examples)
    total = table.num_rows if table is not None else len(examples) if hasattr(examples, "__len__") else 0
    with progress_bar(progress, total, "write") as progress:
        job: dict[str, Any] = {"write": kind, "map": None if map is None else label(map)}
        task: Any
        if table is None:
            if resume:
                raise ValueError(
                    f"resume=True needs rows that can be read again from any row (a pyarrow Table or a "
                    f"datasets.Dataset), not {type(examples).__name__}"
                )
            rows = _rows_of(examples)
            if map is not None:
                rows = mapped(rows, map, kind)
            dictionary, rows = _dictionary(settings, rows, progress)
            units: list[Any] = [kind]
            task = _OnePass(rows)
            workers = 1
        else:
            step = shard_size * max(1, -(-table.num_rows // (shard_size * MOST_PARTS)))
            units = [(start, _part(table, start, step, workers)) for start in range(0, table.num_rows, step)] or [
                (0, table)
            ]
            task = _TableRows(function_name(map) if map is not None and workers > 1 else map, kind)
            dictionary, _ = _dictionary(settings, chain.from_iterable(task.examples(unit) for unit in units), progress)
            job.update(rows=table.num_rows, schema=str(table.schema), part_rows=step)
            job["fingerprint"] = getattr(examples, "_fingerprint", None)
        parts = StagedParts(
            url, settings, storage_options, job=job, dictionary=dictionary, overwrite=overwrite, resume=resume
        )
        write_parts(
            parts,
            units,
            task.write,
            workers=workers,
            resume=resume,
            progress=progress,
            allowed_classes=class_names(allowed_classes),
        )
        return sum(parts.commit(len(units)).shard_sizes)


def _part(table: Any, start: int, rows: int, workers: int) -> Any:
    """Rows start..start+rows of a Table: a zero-copy slice in this process; for workers, a copy of those rows
    alone (a pickled slice carries its whole parent table: 8 MB for 1,000 rows of a million-row table)."""
    part = table.slice(start, rows)
    return part if workers <= 1 else part.take(list(range(part.num_rows)))


def _dictionary(settings: ShardSettings, examples: Iterator[Any], progress: Any) -> tuple[bytes | None, Iterator[Any]]:
    """The shared dictionary, trained first (the spec's rule: on the dataset's first shard), and the examples
    to write (those read for it given again)."""
    if settings.compression_strategy != CompressionStrategy.SHARED_DICTIONARY_COMPRESSION:
        return None, examples
    announce(progress, DICTIONARY_PHASE)
    try:
        first = list(islice(examples, settings.shard_size))
        return first_shard_dictionary(first, settings), chain(first, examples)
    finally:
        announce(progress, None)


def _as_table(examples: Any) -> tuple[Any, str]:
    """(a pyarrow Table of the rows, or None, and what the examples are, for messages)."""
    datasets = sys.modules.get("datasets")  # never imported here: a Dataset given means it is loaded
    if datasets is not None and isinstance(examples, datasets.Dataset):
        return examples.with_format("arrow")[:], "the datasets.Dataset"
    if datasets is not None and isinstance(examples, datasets.IterableDataset):
        return None, "the datasets.IterableDataset"
    pyarrow = sys.modules.get("pyarrow")
    if pyarrow is not None and isinstance(examples, pyarrow.Table):
        return examples, "the pyarrow Table"
    return None, "the examples given"


def _rows_of(examples: Any) -> Iterator[Any]:
    """An iterable's examples; an IterableDataset's rows read as Arrow (plain values, see the module)."""
    datasets = sys.modules.get("datasets")
    if datasets is not None and isinstance(examples, datasets.IterableDataset):
        return (row for table in examples.with_format("arrow").iter(batch_size=1024) for row in _table_rows(table))
    return iter(examples)


def _table_rows(table: Any) -> Iterator[Any]:
    rows = PlainRows(pyarrow_modules())
    return (row for batch in table.to_batches(max_chunksize=1024) for row in rows(batch))


@dataclass(frozen=True)
class _TableRows:
    """write()'s work for one part of a Table: (its first row, its slice) (picklable when map is a name)."""

    map: Callable[[Any], Any] | str | None
    kind: str

    def source(self, unit: tuple[int, Any]) -> str:
        start, table = unit
        return f"rows {start:,}-{start + table.num_rows - 1:,} of {self.kind}"

    def examples(self, unit: tuple[int, Any]) -> Iterator[Any]:
        rows = _table_rows(unit[1])
        return rows if self.map is None else mapped(rows, self.map, self.source(unit))

    def write(self, spec: PartSpec, unit: Any, progress: Callable[[int], None] | None = None) -> tuple[int, int]:
        manifest = spec.write(self.examples(unit), progress, source=self.source(unit))
        return manifest.examples, manifest.stored_bytes


@dataclass(frozen=True)
class _OnePass:
    """write()'s work for an iterable: one part, in this process."""

    rows: Iterator[Any]

    def write(self, spec: PartSpec, unit: str, progress: Callable[[int], None] | None = None) -> tuple[int, int]:
        manifest = spec.write(self.rows, progress, source=unit)
        return manifest.examples, manifest.stored_bytes


@dataclass(frozen=True)
class _Generate:
    """build()'s work for one input (picklable when fn is a name)."""

    fn: Callable[[Any], Iterable[Any]] | str

    def examples(self, unit: Any) -> Iterator[Any]:
        return generated(self.fn, unit, f"input {unit!r}")

    def write(self, spec: PartSpec, unit: Any, progress: Callable[[int], None] | None = None) -> tuple[int, int]:
        manifest = spec.write(self.examples(unit), progress, source=f"input {unit!r}")
        return manifest.examples, manifest.stored_bytes
