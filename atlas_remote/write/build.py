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
from itertools import chain
from typing import Any

from ..format.spec import CompressionStrategy
from ..importers.arrow_values import PlainRows
from ..importers.parquet import pyarrow_modules
from ..runtime.progress import ProgressArgument, progress_bar
from .functions import function_name, generated, label, mapped
from .parts import PartSpec
from .pipeline import Progress, WriteJob, WriteReport, run_write, shared_dictionary, workers_for
from .settings import WriteSettings

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
) -> WriteReport:
    """A dataset at url from `fn(input)` for each input, in order: fn returns or yields the input's examples.

    Each input is one part, written by one of `workers` processes (fn must then be a top-level function of an
    importable module, or its "module:function" name; with one worker, any callable). Inputs are what fn takes
    (URLs, file names, ids...); they must be picklable, and their `repr` identifies the run for `resume=True`,
    which skips the inputs an interrupted run finished. A failure in fn names the input and the example number,
    and nothing is committed. With SHARED_DICTIONARY_COMPRESSION the dictionary is trained first, on the first
    `shard_size` examples (fn runs once more on the first inputs for that).
    """
    inputs = list(inputs)
    settings = WriteSettings(
        shard_size, block_size, compression_strategy, compression_level, compression_dict_size, checksums
    )
    task = _Generate(function_name(fn) if workers > 1 else fn)
    with progress_bar(progress, len(inputs), "build", "inputs") as tell:
        dictionary, _ = shared_dictionary(settings, chain.from_iterable(task.examples(unit) for unit in inputs), tell)
        record = {"build": label(fn), "inputs": [repr(unit) for unit in inputs]}
        job = WriteJob(inputs, task.write, record, label(fn), "function", "atlas-remote build", "built")
        return _commit(
            job, dictionary, workers, tell, url, settings, storage_options, overwrite, resume, allowed_classes
        )


def write(
    examples: Any,
    url: str,
    *,
    workers: int | None = None,
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
) -> WriteReport:
    """Write examples as a dataset at url, committed once; returns its report (`.examples`: how many were
    written).

    `examples` is a pyarrow Table or a Hugging Face `datasets.Dataset` (cut into parts written by up to `workers`
    processes, one per WORKER_BYTES of rows at most, so that a worker's start always pays; None: up to one per
    CPU; `resume=True` skips the parts an interrupted run of the same rows finished), an `IterableDataset` or any
    iterable (one part, in this process; no resume). `map` as in convert(): an example, a list, or None
    for each (with workers > 1, a top-level function of an importable module or its name); its failure names
    the example, and nothing is committed.
    """
    settings = WriteSettings(
        shard_size, block_size, compression_strategy, compression_level, compression_dict_size, checksums
    )
    table, kind = _as_table(examples)
    total = table.num_rows if table is not None else len(examples) if hasattr(examples, "__len__") else 0
    with progress_bar(progress, total, "write") as tell:
        record: dict[str, Any] = {"write": kind, "map": None if map is None else label(map)}
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
            dictionary, rows = shared_dictionary(settings, rows, tell)
            units: list[Any] = [kind]
            task = _OnePass(rows)
            workers = 1
        else:
            step = shard_size * max(1, -(-table.num_rows // (shard_size * MOST_PARTS)))
            workers = workers_for(table.nbytes, workers)
            units = [(start, _part(table, start, step, workers)) for start in range(0, table.num_rows, step)] or [
                (0, table)
            ]
            task = _TableRows(function_name(map) if map is not None and workers > 1 else map, kind)
            dictionary, _ = shared_dictionary(
                settings, chain.from_iterable(task.examples(unit) for unit in units), tell
            )
            record.update(rows=table.num_rows, schema=str(table.schema), part_rows=step)
            record["fingerprint"] = getattr(examples, "_fingerprint", None)
        job = WriteJob(units, task.write, record, kind, "rows", "atlas-remote write", "wrote")
        return _commit(
            job, dictionary, workers, tell, url, settings, storage_options, overwrite, resume, allowed_classes
        )


def _commit(
    job: WriteJob,
    dictionary: bytes | None,
    workers: int,
    tell: Progress,
    url: str,
    settings: WriteSettings,
    storage_options: dict[str, Any] | None,
    overwrite: bool,
    resume: bool,
    allowed_classes: Iterable[type | str],
) -> WriteReport:
    """How build() and write() end, once they know what is written: its parts written by `workers` processes
    (one: this one) and committed once at url."""
    return run_write(
        job,
        url,
        settings,
        dictionary=dictionary,
        storage_options=storage_options,
        overwrite=overwrite,
        resume=resume,
        workers=workers,
        progress=tell,
        allowed_classes=allowed_classes,
    )


def _part(table: Any, start: int, rows: int, workers: int) -> Any:
    """Rows start..start+rows of a Table: a zero-copy slice in this process; for workers, a copy of those rows
    alone (a pickled slice carries its whole parent table: 8 MB for 1,000 rows of a million-row table)."""
    part = table.slice(start, rows)
    return part if workers <= 1 else part.take(list(range(part.num_rows)))


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
