"""Parquet: one example per row, a dict of its columns, read with pyarrow (the `parquet` extra) through fsspec.

Row groups are streamed (`iter_batches`, ranged reads of the columns asked for) with pyarrow's pre-buffering off:
on, it reads every row group's columns before the first batch (a 218 MB file of 40 row groups held 220 MB), off,
about one row group is held. Values are what pyarrow's `to_pylist` gives: strings as str, binary as bytes, lists
as Python lists (not numpy: a ragged column has no one dtype, and a list pickles smaller than a small array),
nulls as None; timestamps, durations and times as arrow_values.py makes them (plain `datetime` values a default
reader accepts). A folder is every `*.parquet` below it, sorted: the Hugging Face Hub's layout
(`data/train-00000-of-00002.parquet`, or `<config>/<split>/...`) with `split=` keeping one split.
"""

from __future__ import annotations

import contextlib
import io
from collections import Counter
from collections.abc import Iterable, Iterator
from typing import Any, NamedTuple

from ..errors import AtlasError, FormatError
from .arrow_values import PlainRows
from .hub import select_split
from .sources import INFLATION_FREE_BYTES, INFLATION_RATIO, files_below, open_source, source_error

SUFFIXES = (".parquet",)


def pyarrow_modules() -> Any:
    try:
        import pyarrow
        import pyarrow.compute
        import pyarrow.ipc
        import pyarrow.parquet
    except ImportError as err:
        raise ImportError("reading Parquet and Arrow needs pyarrow: pip install 'atlas_remote[parquet]'") from err
    return pyarrow


def inputs(
    src: str | Iterable[str], storage_options: dict[str, Any] | None = None, columns=None, split=None
) -> list[str]:
    return files_below(src, storage_options, SUFFIXES, split, select_split)


def row_count(urls: list[str], storage_options: dict[str, Any] | None = None) -> int:
    """The rows of Parquet files, from their footers (read together): a conversion's total, known ahead."""
    from concurrent.futures import ThreadPoolExecutor

    pyarrow = pyarrow_modules()

    def rows(url: str) -> int:
        try:
            with open_source(url, storage_options) as raw:
                return pyarrow.parquet.ParquetFile(raw).metadata.num_rows
        except Exception as err:
            raise source_error(err, url) from err

    with ThreadPoolExecutor(min(16, max(1, len(urls))), thread_name_prefix="atlas-footers") as pool:
        return sum(pool.map(rows, urls))


def samples(
    urls: str | Iterable[str],
    storage_options: dict[str, Any] | None = None,
    columns: list[str] | None = None,
    split: str | None = None,
) -> Iterator[dict[str, Any]]:
    pyarrow = pyarrow_modules()
    for url in inputs(urls, storage_options, split=split):
        try:
            with open_source(url, storage_options) as source:
                raw = Replayed(source)
                table = pyarrow.parquet.ParquetFile(raw, pre_buffer=False)
                missing = sorted(set(columns or ()) - set(table.schema_arrow.names))
                if missing:
                    raise FormatError(f"no column {missing[0]!r} (it has {', '.join(table.schema_arrow.names)})")
                leaves = _leaves(pyarrow, table)
                stored = _check_inflation(table.metadata, leaves, columns)
                rows = PlainRows(pyarrow)
                for batch in _counted_batches(pyarrow, raw, table, leaves, columns, stored):
                    yield from rows(batch)
        except AtlasError as err:
            raise err.located(url=url)
        except Exception as err:  # a truncated file, a bad footer, a missing file
            raise source_error(err, url) from err


def _chunks_read(metadata: Any, leaves: Leaves, columns: list[str] | None) -> Iterator[tuple[int, int, Any]]:
    """(row group, leaf column, its chunk's metadata) of every chunk the columns asked for hold."""
    for group in range(metadata.num_row_groups):
        row_group = metadata.row_group(group)
        for number in range(row_group.num_columns):
            if columns is None or leaves.owners[number] in columns:
                yield group, number, row_group.column(number)


def _check_inflation(metadata: Any, leaves: Leaves, columns: list[str] | None) -> int:
    """Each column chunk read decodes to what its metadata declares within the bound every compressed source has
    (sources.Inflation): pyarrow decompresses a whole page at once, and a 12.7 KB file of one zstd page of zeros
    took 450 MB to read its first rows. What a page header declares beyond its column chunk's metadata is
    pyarrow's to check (docs/security.md). Returns the stored bytes of the columns read."""
    stored = 0
    for group, _, chunk in _chunks_read(metadata, leaves, columns):
        stored += chunk.total_compressed_size
        if chunk.total_uncompressed_size > INFLATION_FREE_BYTES + INFLATION_RATIO * chunk.total_compressed_size:
            raise FormatError(
                f"row group {group}, column {chunk.path_in_schema!r}: {chunk.total_compressed_size:,} stored bytes "
                f"declare {chunk.total_uncompressed_size:,} decoded, more than {INFLATION_RATIO} times as many "
                f"(a decompression bomb?); if the file is sound, rewrite it uncompressed and convert that"
            )
    return stored


class Leaves(NamedTuple):
    """The file's leaf columns, in the order of its column chunks: each one's path, the top-level column it
    belongs to (from the schema's shape, not its dotted path: a top-level column may be named "a.list.element"),
    whether it repeats (a list's or a map's: a row may hold any number of its values), and a fixed-size binary
    column's size of each value (0 otherwise)."""

    paths: list[str]
    owners: list[str]
    repeated: list[bool]
    fixed: list[int]


def _leaves(pyarrow: Any, file: Any) -> Leaves:
    schema = file.metadata.schema
    columns = [schema.column(n) for n in range(len(schema))]
    paths = [column.path for column in columns]
    for kind, names in (("columns", file.schema_arrow.names), ("leaf columns", paths)):
        twice = [name for name, count in Counter(names).items() if count > 1]
        if twice:
            raise FormatError(f"two {kind} are named {twice[0]!r}: pyarrow cannot tell them apart; rename one")
    owners = [field.name for field in file.schema_arrow for _ in range(_leaf_count(pyarrow, field.type))]
    if len(owners) != len(paths):
        raise FormatError(
            f"its Arrow schema has {len(owners):,} leaf columns where its Parquet schema has {len(paths):,}"
        )
    return Leaves(
        paths,
        owners,
        [column.max_repetition_level > 0 for column in columns],
        [column.length if column.physical_type == "FIXED_LEN_BYTE_ARRAY" else 0 for column in columns],
    )


def _leaf_count(pyarrow: Any, kind: Any) -> int:
    """The Parquet leaf columns an Arrow type is stored as."""
    types = pyarrow.types
    if isinstance(kind, pyarrow.ExtensionType):
        return _leaf_count(pyarrow, kind.storage_type)
    if types.is_struct(kind):
        return sum(_leaf_count(pyarrow, kind.field(n).type) for n in range(kind.num_fields))
    if types.is_map(kind):
        return _leaf_count(pyarrow, kind.key_type) + _leaf_count(pyarrow, kind.item_type)
    if types.is_list(kind) or types.is_large_list(kind) or types.is_fixed_size_list(kind):
        return _leaf_count(pyarrow, kind.value_type)
    return 1


DICTIONARY_ENCODINGS = {"PLAIN_DICTIONARY", "RLE_DICTIONARY"}


def _dictionary_columns(metadata: Any, leaves: Leaves, columns: list[str] | None) -> list[int]:
    """The byte-array leaf columns (nested ones too) some row group stores dictionary-encoded: decoded, their
    values are one a row or more, each as long as its dictionary entry, and an 887-byte file of one 100 KB string
    under 200,000 indices decoded to 20 GB (the column chunk's sizes say 100 KB: the check above passes it)."""
    found: dict[int, None] = {}
    for _, number, chunk in _chunks_read(metadata, leaves, columns):
        if chunk.physical_type == "BYTE_ARRAY" and DICTIONARY_ENCODINGS & set(chunk.encodings):
            found[number] = None
    return list(found)


def _counted_batches(
    pyarrow: Any, raw: Replayed, table: Any, leaves: Leaves, columns: list[str] | None, stored: int
) -> Iterator[Any]:
    """The file's record batches, what their values decode to counted before they are handed on and refused past
    the inflation bound of the `stored` bytes read, a row group at a time. A row group whose dictionaries could
    decode past the bound (`_dictionary_risk`) has those columns read as they are stored (see
    `_dictionary_columns`), counted at each index, then decoded (one cast: `to_pylist` of a dictionary array
    boxes each value, several times slower). Every other row group is read decoded, as pyarrow reads it fastest:
    read as stored, a column pyarrow's writer let fall back from its dictionary to plain pages (text of mostly
    distinct values) is encoded into a dictionary by pyarrow first, 28 times slower on 2 KB strings."""
    metadata = table.metadata
    dictionaries = _dictionary_columns(metadata, leaves, columns)
    decoded, bound = 0, INFLATION_FREE_BYTES + INFLATION_RATIO * stored
    read = [n for n, owner in enumerate(leaves.owners) if columns is None or owner in columns]
    fixed = sum(leaves.fixed[n] for n in read)  # fixed-size values: a row of them is this wide, whatever it says
    rows = max(1, min(BATCH_ROWS, PLAIN_BATCH_BYTES // fixed)) if fixed else BATCH_ROWS
    probe = None
    if dictionaries:
        paths = [leaves.paths[n] for n in dictionaries]
        probe = pyarrow.parquet.ParquetFile(raw, pre_buffer=False, metadata=metadata, read_dictionary=paths)
    readers: dict[tuple[str, ...], Any] = {(): table}
    plain: dict[Any, list[Any]] = {}  # a schema: each column's type without dictionaries (None: as it is)
    for group in range(metadata.num_row_groups):
        risky: tuple[str, ...] = ()
        if probe is not None:
            with raw.kept():  # what the probe reads, the row group's read takes again from memory
                risky = _dictionary_risk(pyarrow, probe, raw, group, dictionaries, leaves, rows)
        if risky not in readers:
            readers[risky] = pyarrow.parquet.ParquetFile(
                raw, pre_buffer=False, metadata=metadata, read_dictionary=list(risky)
            )
        for batch in readers[risky].iter_batches(rows, row_groups=[group], columns=columns):
            decoded += batch.nbytes
            if batch.schema not in plain:
                plain[batch.schema] = [_plain(pyarrow, kind) for kind in batch.schema.types]
            casts = plain[batch.schema]
            for column, cast in zip(batch.columns, casts):
                if cast is not None:
                    decoded += _decoded_bytes(pyarrow, column) - column.nbytes
            if decoded > bound:
                raise FormatError(
                    f"its values decode to more than {decoded:,} bytes from the {stored:,} stored of the columns "
                    f"read: more than {INFLATION_RATIO} times as many (dictionary encoding repeats one value for "
                    f"many rows: a decompression bomb?); if the file is sound, convert the columns you need "
                    f"(--columns)"
                )
            if any(cast is not None for cast in casts):
                columns_ = [c if cast is None else c.cast(cast) for c, cast in zip(batch.columns, casts)]
                batch = pyarrow.RecordBatch.from_arrays(columns_, names=batch.schema.names)
            yield batch


class Replayed(io.RawIOBase):
    """A source file that keeps what is read from it while `kept()` is open and serves each kept range once more
    from memory: the probe of a row group's dictionaries reads their column chunks whole, and the row group's
    read then takes them from here, so each byte is fetched once. What is kept is one row group's dictionary
    columns (what pyarrow holds to read them anyway), dropped once read again or at the next probe."""

    def __init__(self, raw: Any) -> None:
        self.raw, self.position, self.keeping = raw, 0, False
        self.ranges: dict[tuple[int, int], bytes] = {}

    @contextlib.contextmanager
    def kept(self) -> Iterator[None]:
        self.ranges.clear()
        self.keeping = True
        try:
            yield
        finally:
            self.keeping = False

    def readinto(self, buffer: Any) -> int:
        data = self.ranges.pop((self.position, len(buffer)), None)
        if data is None:
            self.raw.seek(self.position)
            data = self.raw.read(len(buffer))
            if self.keeping:
                self.ranges[(self.position, len(buffer))] = data
        buffer[: len(data)] = data
        self.position += len(data)
        return len(data)

    def seek(self, offset: int, whence: int = 0) -> int:
        if whence == 0:
            self.position = offset
        elif whence == 1:
            self.position += offset
        else:
            self.position = self.raw.seek(offset, 2)
        return self.position

    def tell(self) -> int:
        return self.position

    def starts_with_dictionary(self, chunk: Any) -> bool:
        """Whether a column chunk's first page, where pyarrow starts reading it, is a dictionary page: its Thrift
        header's first field (the page type, an i32 in the compact protocol: 0x15) is DICTIONARY_PAGE (2, as a
        zigzag varint: 0x04)."""
        start = chunk.data_page_offset
        if chunk.has_dictionary_page and 0 < chunk.dictionary_page_offset < start:
            start = chunk.dictionary_page_offset
        self.raw.seek(start)
        return bytes(self.raw.read(2)) == b"\x15\x04"

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True


PLAIN_BATCH_BYTES = 64 << 20  # what a batch read decoded may hold of the values its dictionaries serve
BATCH_ROWS = 1024


def _dictionary_risk(
    pyarrow: Any, probe: Any, raw: Replayed, group: int, dictionaries: list[int], leaves: Leaves, rows: int
) -> tuple[str, ...]:
    """The dictionary columns of row group `group` to read as stored: all of them unless no batch of `rows` rows
    read decoded can hold more than PLAIN_BATCH_BYTES of dictionary values. That is known for columns that do not
    repeat, a value a row, each at most its dictionary's longest entry, where each chunk starts with its
    dictionary page (pyarrow takes one after data pages too, which a probe of the first row would not see): the
    probe reads one row with the dictionaries as stored (each dictionary page whole, and the first data pages). A
    repeated column's row may hold any number of values: read as stored. Batches read decoded are counted as
    before, so the file's bound refuses them, a batch at most past it."""
    row_group = probe.metadata.row_group(group)
    encoded = [n for n in dictionaries if DICTIONARY_ENCODINGS & set(row_group.column(n).encodings)]
    if not encoded:
        return ()
    risky = tuple(leaves.paths[n] for n in dictionaries)
    if any(leaves.repeated[n] or not raw.starts_with_dictionary(row_group.column(n)) for n in encoded):
        return risky
    owners = list(dict.fromkeys(leaves.owners[n] for n in encoded))
    first = next(probe.iter_batches(1, row_groups=[group], columns=owners), None)
    longest = sum(_longest_entry(pyarrow, column) for column in first.columns) if first is not None else 0
    return risky if rows * longest > PLAIN_BATCH_BYTES else ()


def _longest_entry(pyarrow: Any, array: Any) -> int:
    """The longest value of any dictionary an Arrow array holds (nested ones too), in bytes; 0 if none."""
    kind = array.type
    if pyarrow.types.is_dictionary(kind):
        if not len(array.dictionary):
            return 0
        return int(pyarrow.compute.max(pyarrow.compute.binary_length(array.dictionary)).as_py() or 0)
    if pyarrow.types.is_struct(kind):
        return max((_longest_entry(pyarrow, field) for field in array.flatten()), default=0)
    if pyarrow.types.is_map(kind):
        return max(_longest_entry(pyarrow, array.keys), _longest_entry(pyarrow, array.items))
    if kind.num_fields:  # lists: their values
        return _longest_entry(pyarrow, array.flatten())
    return 0


def _decoded_bytes(pyarrow: Any, array: Any) -> int:
    """The bytes an Arrow array's values take once decoded: a dictionary's values counted at each index that
    refers to them, nested arrays by their children (what `to_pylist` then makes)."""
    kind = array.type
    if pyarrow.types.is_dictionary(kind):
        lengths = pyarrow.compute.binary_length(array.dictionary).fill_null(0).cast(pyarrow.int64())
        taken = pyarrow.compute.sum(lengths.take(array.indices)).as_py() or 0
        return int(taken) + array.indices.nbytes
    if pyarrow.types.is_struct(kind):
        return sum(_decoded_bytes(pyarrow, field) for field in array.flatten()) + len(array)
    if pyarrow.types.is_map(kind):
        return _decoded_bytes(pyarrow, array.keys) + _decoded_bytes(pyarrow, array.items) + len(array) * 8
    if kind.num_fields:  # lists: their values
        return _decoded_bytes(pyarrow, array.flatten()) + len(array) * 8
    return int(array.nbytes)


def _plain(pyarrow: Any, kind: Any) -> Any:
    """The type with every dictionary replaced by the type of its values, or None if it holds none."""
    types = pyarrow.types
    if types.is_dictionary(kind):
        return kind.value_type
    if types.is_list(kind) or types.is_large_list(kind) or types.is_fixed_size_list(kind):
        item = _plain(pyarrow, kind.value_type)
        if item is None:
            return None
        field = kind.value_field.with_type(item)
        if types.is_fixed_size_list(kind):
            return pyarrow.list_(field, kind.list_size)
        return pyarrow.list_(field) if types.is_list(kind) else pyarrow.large_list(field)
    if types.is_struct(kind):
        fields = [_plain(pyarrow, field.type) for field in kind]
        if all(f is None for f in fields):
            return None
        return pyarrow.struct([f.with_type(t or f.type) for f, t in zip(kind, fields)])
    if types.is_map(kind):
        key, item = _plain(pyarrow, kind.key_type), _plain(pyarrow, kind.item_type)
        if key is None and item is None:
            return None
        return pyarrow.map_(
            kind.key_field.with_type(key or kind.key_type), kind.item_field.with_type(item or kind.item_type)
        )
    return None
