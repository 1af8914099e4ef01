"""Parquet files pyarrow's writer would not write, made by rewriting a footer: Thrift's compact protocol read and
written again, as much of it as a FileMetaData needs (tests of the Parquet importer's bounds)."""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any


def _varint(data: bytes, at: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = data[at]
        at += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return value, at


def _unzigzag(n: int) -> int:
    return (n >> 1) ^ -(n & 1)


def _read_value(data: bytes, at: int, kind: int) -> tuple[Any, int]:
    if kind in (1, 2):  # booleans are in the field header
        return kind == 1, at
    if kind == 3:
        return data[at], at + 1
    if kind in (4, 5, 6):
        value, at = _varint(data, at)
        return _unzigzag(value), at
    if kind == 7:
        return data[at : at + 8], at + 8
    if kind == 8:
        size, at = _varint(data, at)
        return bytes(data[at : at + size]), at + size
    if kind in (9, 10):
        header = data[at]
        at += 1
        count, item = header >> 4, header & 15
        if count == 15:
            count, at = _varint(data, at)
        items = []
        for _ in range(count):
            if item in (1, 2):
                items.append(data[at] == 1)
                at += 1
            else:
                value, at = _read_value(data, at, item)
                items.append(value)
        return ("list", item, items), at
    if kind == 12:
        return read_struct(data, at)
    raise ValueError(f"Thrift type {kind} is not read here")


def read_struct(data: bytes, at: int) -> tuple[dict[int, tuple[int, Any]], int]:
    fields: dict[int, tuple[int, Any]] = {}
    last = 0
    while True:
        header = data[at]
        at += 1
        if header == 0:
            return fields, at
        kind, delta = header & 15, header >> 4
        if delta:
            field = last + delta
        else:
            value, at = _varint(data, at)
            field = _unzigzag(value)
        value, at = _read_value(data, at, kind)
        fields[field] = (kind, value)
        last = field


def _write_varint(n: int) -> bytes:
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _write_value(kind: int, value: Any) -> bytes:
    if kind in (1, 2):
        return b""
    if kind == 3:
        return bytes([value])
    if kind in (4, 5, 6):
        return _write_varint((value << 1) ^ (value >> 63))
    if kind == 7:
        return value
    if kind == 8:
        return _write_varint(len(value)) + value
    if kind in (9, 10):
        _, item, items = value
        out = bytes([(len(items) << 4) | item]) if len(items) < 15 else bytes([0xF0 | item]) + _write_varint(len(items))
        for one in items:
            out += bytes([1 if one else 2]) if item in (1, 2) else _write_value(item, one)
        return out
    return write_struct(value)


def write_struct(fields: dict[int, tuple[int, Any]]) -> bytes:
    out = bytearray()
    last = 0
    for field in sorted(fields):
        kind, value = fields[field]
        written = (1 if value else 2) if kind in (1, 2) else kind
        if 0 < field - last <= 15:
            out.append(((field - last) << 4) | written)
        else:
            out.append(written)
            out += _write_varint((field << 1) ^ (field >> 63))
        out += _write_value(kind, value)
        last = field
    out.append(0)
    return bytes(out)


def _footer(path: Path) -> tuple[bytes, dict[int, tuple[int, Any]]]:
    data = path.read_bytes()
    size = struct.unpack("<I", data[-8:-4])[0]
    return data, read_struct(data, len(data) - 8 - size)[0]


def _chunk(data: bytes, meta: dict[int, tuple[int, Any]]) -> tuple[dict[int, tuple[int, Any]], bytes]:
    """The only column chunk of the only row group: its ColumnMetaData and its bytes."""
    column = meta[4][1][2][0][1][1][2][0][3][1]  # row_groups[0].columns[0].meta_data
    start = min(column[9][1], column.get(11, (0, 1 << 62))[1])  # data_page_offset, dictionary_page_offset
    return column, data[start : start + column[7][1]]  # total_compressed_size


def late_dictionary(folder: Path, entry_bytes: int, rows: int) -> Path:
    """One string column whose chunk starts with a plain page of one short value, then a dictionary page of one
    entry of entry_bytes, then `rows` rows referring to it: the footer honest about sizes and encodings. pyarrow
    reads it; its first row does not show the dictionary."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    options = {"compression": "zstd", "store_schema": False, "write_statistics": False, "data_page_version": "1.0"}
    plain, coded = folder / "plain.parquet", folder / "coded.parquet"
    pq.write_table(pa.table({"s": ["a"]}), plain, use_dictionary=False, **options)
    entries = pa.DictionaryArray.from_arrays(pa.array([0] * rows, pa.int32()), pa.array(["x" * entry_bytes]))
    pq.write_table(pa.table({"s": entries}), coded, dictionary_pagesize_limit=4 * entry_bytes, **options)
    plain_column, plain_bytes = _chunk(*_footer(plain))
    data, meta = _footer(coded)
    column, coded_bytes = _chunk(data, meta)
    total = rows + 1
    column[9] = (6, 4)  # data_page_offset: the plain page, just after "PAR1"
    for field in (11, 12, 13, 16):  # dictionary_page_offset, statistics, encoding_stats, bloom filter: gone
        column.pop(field, None)
    column[5] = (6, total)  # num_values
    column[7] = (6, len(plain_bytes) + len(coded_bytes))  # total_compressed_size
    column[6] = (6, plain_column[6][1] + column[6][1])  # total_uncompressed_size
    group = meta[4][1][2][0]
    group[3] = (6, total)  # num_rows
    group[2] = (6, column[6][1])  # total_byte_size
    for field in (5, 6):  # file_offset, total_compressed_size of the row group
        group.pop(field, None)
    group[1][1][2][0][2] = (6, 4)  # the column chunk's file_offset
    meta[3] = (6, total)
    footer = write_struct(meta)
    out = folder / "late_dictionary.parquet"
    out.write_bytes(b"PAR1" + plain_bytes + coded_bytes + footer + struct.pack("<I", len(footer)) + b"PAR1")
    return out
