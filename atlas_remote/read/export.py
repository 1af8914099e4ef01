"""Taking data back out: rows for Hugging Face's `from_generator`, a pyarrow Table, a pandas DataFrame, a
Hugging Face `Dataset`, and Parquet on any URL (`atlas-remote convert SRC DEST --to parquet`).

Dict examples become columns, their keys the column names; any other example is one column, `item` (Ray Data's
name, as `read_atlas` gives). Which it is, the first example read decides; an example of the other kind is
refused, named. Examples are read in order with read-ahead (`ds.iter`), a chunk at a time.

Arrow types are those pyarrow gives the values (Python ints as int64, str as string, datetimes as timestamps,
1-D numpy arrays as lists), worked out from the first chunk, or exactly those of `schema=`: a Parquet file
converted into Atlas comes back out with its own schema given (`--schema-from` the source file), equal to
it, since the Parquet importer keeps every value. pandas gets the values themselves (arrays stay arrays);
a column mixing None with numbers keeps its values as objects rather than pandas' NaN.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..errors import DatasetExistsError, ExportError
from ..importers.parquet import pyarrow_modules
from ..runtime.progress import ProgressArgument, progress_bar
from ..storage import Store
from .expansion import FLOOR_BYTES, MOST_DEPTH, sizes

if TYPE_CHECKING:
    from .reader import AtlasDataset

ITEM = "item"
CHUNK = 4096  # examples made into Arrow at once
# Containers a row may nest: Arrow and Parquet nest a column's type as deep as its values (a list is two levels of
# a Parquet schema, which pyarrow reads back to 100 levels); eight columns 500 deep took 400 MB to write, and
# aborted the process under a memory limit (std::bad_alloc).
ARROW_NESTING = 32
ARROW_DEPTH = ARROW_NESTING + 2  # the row, its containers, their items (expansion.MOST_DEPTH counts levels)
ROW_GROUP_BYTES = 64 << 20  # a Parquet row group holds about this much Arrow data...
MOST_ROW_GROUP_ROWS = 1 << 20  # ...and at most this many rows


def rows(ds: AtlasDataset, start: int = 0, stop: int | None = None) -> Iterator[dict[str, Any]]:
    """Examples start..stop as dicts: a dict example as it is, any other as {"item": example} (see the module).
    `datasets.Dataset.from_generator(ds.rows)` takes it as it is. A stranger's examples are measured first, as
    every consumer that copies them does (expansion.py)."""
    return (row for _, row, _ in _sized_rows(ds, start, stop, MOST_DEPTH))


def _sized_rows(ds: AtlasDataset, start: int, stop: int | None, depth: int) -> Iterator[tuple[int, dict, int]]:
    """(index, row, what it expands to: expansion.sizes) of examples start..stop."""
    start, stop, _ = slice(start, stop).indices(len(ds))
    as_dicts: bool | None = None
    for key, first, examples in ds.located_slices(start, stop):
        for i, example, size in zip(
            range(first, first + len(examples)), examples, sizes(ds, key, first, examples, depth)
        ):
            if as_dicts is None:
                as_dicts = isinstance(example, dict)
            if as_dicts != isinstance(example, dict):
                raise ExportError(
                    f"example {i} is {'not ' * as_dicts}a dict ({type(example).__name__}) but example {start} is"
                    f"{' not' * (not as_dicts)}: rows are one kind; export a range of one kind, or map the examples "
                    f"first",
                    url=ds.url,
                )
            if as_dicts:
                if not all(isinstance(k, str) for k in example):
                    raise ExportError(f"example {i} has keys that are not strings: columns need names", url=ds.url)
                yield i, example, size
            else:
                yield i, {ITEM: example}, size


def _chunks(ds: AtlasDataset, start: int, stop: int | None) -> Iterator[tuple[int, list[dict[str, Any]]]]:
    """(index of its first example, rows) a chunk at a time: CHUNK rows, or fewer where a stranger's rows expand
    past FLOOR_BYTES together (expansion.py), so what pyarrow is handed at once stays within that."""
    chunk: list[dict[str, Any]] = []
    first = expanse = 0
    for i, row, size in _sized_rows(ds, start, stop, ARROW_DEPTH):
        if chunk and (len(chunk) == CHUNK or expanse + size > FLOOR_BYTES):
            yield first, chunk
            chunk, expanse = [], 0
        if not chunk:
            first = i
        chunk.append(row)
        expanse += size
    if chunk:
        yield first, chunk


def _table(pyarrow: Any, ds: AtlasDataset, first: int, chunk: list[dict[str, Any]], schema: Any) -> Any:
    """A chunk as a Table of `schema` (None: the types pyarrow gives them), or ExportError naming the rows."""
    where = f"examples {first:,}-{first + len(chunk) - 1:,}"
    if schema is not None:
        extra = set().union(*(row.keys() for row in chunk)) - set(schema.names)
        if extra:
            raise ExportError(
                f"{where} have columns the schema has not: {sorted(extra)[:5]} (it has {schema.names})", url=ds.url
            )
    try:
        table = pyarrow.Table.from_pylist(chunk, schema=schema)
    except (pyarrow.ArrowInvalid, pyarrow.ArrowTypeError, pyarrow.ArrowNotImplementedError, TypeError) as err:
        given = "the schema given" if schema is not None else "the types of the first rows"
        raise ExportError(
            f"{where} do not fit {given} ({err}); to_pandas() keeps any value, or give the columns' types "
            f"(schema=, or --schema-from a Parquet file)",
            url=ds.url,
        ) from None
    except MemoryError as err:  # pyarrow's ArrowMemoryError too: what the bounds above did not foresee
        raise ExportError(f"{where}: out of memory making them into Arrow ({err}): export fewer at a time", url=ds.url)
    deepest = max((_nesting(field.type) for field in table.schema), default=0)
    if deepest > ARROW_NESTING:  # your own data is not measured first (expansion.py): its types say it
        raise ExportError(
            f"{where} nest {deepest} containers deep, past the {ARROW_NESTING} a column takes here (pyarrow reads "
            f"Parquet back to about 48): flatten them, or use to_pandas()",
            url=ds.url,
        )
    return table


def _nesting(kind: Any) -> int:
    """How deep an Arrow type nests (a list, struct or map is one level), a level at a time."""
    depth, level = 0, [kind]
    while level := [k.field(i).type for k in level for i in range(k.num_fields)]:
        depth += 1
    return depth


def tables(ds: AtlasDataset, start: int = 0, stop: int | None = None, schema: Any = None) -> Iterator[Any]:
    """Examples start..stop as pyarrow Tables of CHUNK rows, all of one schema (`schema`, or the first chunk's)."""
    pyarrow = pyarrow_modules()
    for first, chunk in _chunks(ds, start, stop):
        table = _table(pyarrow, ds, first, chunk, schema)
        schema = table.schema
        yield table


def to_arrow(ds: AtlasDataset, start: int = 0, stop: int | None = None, schema: Any = None) -> Any:
    """Examples start..stop (all by default) as one pyarrow Table."""
    pyarrow = pyarrow_modules()
    parts = list(tables(ds, start, stop, schema))
    if not parts:
        return pyarrow.table({}) if schema is None else schema.empty_table()
    return pyarrow.concat_tables(parts)


def to_pandas(ds: AtlasDataset, start: int = 0, stop: int | None = None) -> Any:
    """Examples start..stop (all by default) as a pandas DataFrame whose values are the examples' own."""
    import pandas

    columns: dict[str, list[Any]] = {}
    count = 0
    for row in rows(ds, start, stop):
        for name in row:
            if name not in columns:
                columns[name] = [None] * count
        for name, values in columns.items():
            values.append(row.get(name))
        count += 1
    return pandas.DataFrame({name: _series(pandas, values) for name, values in columns.items()}, index=range(count))


def _series(pandas: Any, values: list[Any]) -> Any:
    """A column as pandas infers it, or as objects where inference would change a value (None among numbers
    becomes NaN; lists and arrays stay objects either way)."""
    if any(v is None for v in values) and not all(v is None for v in values):
        return pandas.Series(values, dtype=object)
    return pandas.Series(values)


def to_hf(ds: AtlasDataset, start: int = 0, stop: int | None = None, **from_generator: Any) -> Any:
    """Examples start..stop as a Hugging Face `datasets.Dataset` (written to its cache as Arrow; keywords go to
    `Dataset.from_generator`, e.g. `features=`, `cache_dir=`). For streaming without a copy,
    `datasets.IterableDataset.from_generator(ds.rows)`."""
    import datasets

    return datasets.Dataset.from_generator(
        _generate, gen_kwargs={"ds": ds, "start": start, "stop": stop}, **from_generator
    )


def _generate(ds: AtlasDataset, start: int, stop: int | None) -> Iterator[dict[str, Any]]:
    yield from rows(ds, start, stop)


@dataclass
class ParquetReport:
    src: str
    dest: str
    rows: int
    row_groups: int
    bytes: int

    def __str__(self) -> str:
        return (
            f"wrote {self.src} -> {self.dest}: {self.rows:,} rows in {self.row_groups} row group"
            f"{'s' * (self.row_groups != 1)}, {self.bytes:,} bytes"
        )


def schema_of(url: str, storage_options: dict[str, Any] | None = None) -> Any:
    """The Arrow schema of a Parquet file at any URL (its footer only)."""
    from ..importers.sources import open_source, source_error

    pyarrow = pyarrow_modules()
    try:
        with open_source(url, storage_options) as raw:
            return pyarrow.parquet.ParquetFile(raw).schema_arrow
    except Exception as err:
        raise source_error(err, url) from err


def to_parquet(
    ds: AtlasDataset,
    dest: str,
    storage_options: dict[str, Any] | None = None,
    *,
    start: int = 0,
    stop: int | None = None,
    schema: Any = None,
    overwrite: bool = False,
    progress: ProgressArgument = None,
) -> ParquetReport:
    """Write examples start..stop (all by default) as one Parquet file at dest (any URL), in row groups of
    about ROW_GROUP_BYTES of Arrow data (at most MOST_ROW_GROUP_ROWS rows), zstd-compressed. The file is written
    to a local temporary file first, then put at dest whole: a reader never finds half of it."""
    pyarrow = pyarrow_modules()
    folder, _, name = dest.rstrip("/").rpartition("/")
    target = Store(folder or ".", storage_options)
    target.require_writable()
    if not overwrite and target.exists(name):
        raise DatasetExistsError("a file is already there: pass overwrite=True (--overwrite) to replace it", url=dest)
    first, last, _ = slice(start, stop).indices(len(ds))
    groups = written = 0
    with tempfile.TemporaryDirectory(prefix="atlas-parquet-") as scratch:
        local = os.path.join(scratch, name)
        writer: Any = None
        pending: list[Any] = []

        def flush() -> None:
            nonlocal groups
            if pending:
                group = pyarrow.concat_tables(pending)
                writer.write_table(group, row_group_size=group.num_rows)
                groups += 1
                pending.clear()

        with progress_bar(progress, max(0, last - first), "parquet") as bar:
            for table in tables(ds, first, last, schema):
                if writer is None:
                    writer = pyarrow.parquet.ParquetWriter(local, table.schema, compression="zstd")
                pending.append(table)
                written += table.num_rows
                bar(table.num_rows, table.nbytes)
                if (
                    sum(t.nbytes for t in pending) >= ROW_GROUP_BYTES
                    or sum(len(t) for t in pending) >= MOST_ROW_GROUP_ROWS
                ):
                    flush()
            if writer is None:  # no rows: a file of the schema, or of none
                writer = pyarrow.parquet.ParquetWriter(local, schema if schema is not None else pyarrow.schema([]))
            flush()
            writer.close()
        size = os.path.getsize(local)
        target.upload(local, name)
    return ParquetReport(ds.url, dest, written, groups, size)
