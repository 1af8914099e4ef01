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

from collections.abc import Iterable, Iterator
from typing import Any

from ..errors import AtlasError, FormatError
from .arrow_values import PlainRows
from .hub import select_split
from .sources import INFLATION_FREE_BYTES, INFLATION_RATIO, files_below, open_source, source_error

SUFFIXES = (".parquet",)


def pyarrow_modules() -> Any:
    try:
        import pyarrow
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
            with open_source(url, storage_options) as raw:
                table = pyarrow.parquet.ParquetFile(raw, pre_buffer=False)
                missing = sorted(set(columns or ()) - set(table.schema_arrow.names))
                if missing:
                    raise FormatError(f"no column {missing[0]!r} (it has {', '.join(table.schema_arrow.names)})")
                _check_inflation(table.metadata, columns)
                rows = PlainRows(pyarrow)
                for batch in table.iter_batches(batch_size=1024, columns=columns):
                    yield from rows(batch)
        except AtlasError as err:
            raise err.located(url=url)
        except Exception as err:  # a truncated file, a bad footer, a missing file
            raise source_error(err, url) from err


def _check_inflation(metadata: Any, columns: list[str] | None) -> None:
    """Each column chunk read decodes to what its metadata declares within the bound every compressed source has
    (sources.Inflation): pyarrow decompresses a whole page at once, and a 12.7 KB file of one zstd page of zeros
    took 450 MB to read its first rows. What a page header declares beyond its column chunk's metadata is
    pyarrow's to check (docs/security.md)."""
    for group in range(metadata.num_row_groups):
        row_group = metadata.row_group(group)
        for number in range(row_group.num_columns):
            chunk = row_group.column(number)
            if columns is not None and chunk.path_in_schema.split(".")[0] not in columns:
                continue
            if chunk.total_uncompressed_size > INFLATION_FREE_BYTES + INFLATION_RATIO * chunk.total_compressed_size:
                raise FormatError(
                    f"row group {group}, column {chunk.path_in_schema!r}: {chunk.total_compressed_size:,} stored bytes "
                    f"declare {chunk.total_uncompressed_size:,} decoded, more than {INFLATION_RATIO} times as many "
                    f"(a decompression bomb?); if the file is sound, rewrite it uncompressed and convert that"
                )
