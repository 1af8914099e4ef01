"""An Arrow IPC file or stream's messages read before pyarrow decodes them: what its compressed buffers declare
they decompress to, against the bound every compressed source has (sources.Inflation).

pyarrow decompresses a record batch's buffers whole (LZ4 or ZSTD: Feather's default) to the length each one's
first 8 bytes declare, and those are in the body, out of reach of any pyarrow call that does not decode: a 13.5 KB
Feather file held a batch of 400 MB. So the file is walked here first, message by message (a continuation marker,
the metadata's length, the metadata, a flatbuffer, then the body), reading each batch's buffer list from its
metadata and 8 bytes at the start of each compressed buffer, seeking past the rest. A file's footer may name only
messages that walk found. The walk reads the metadata (small) and 8 bytes a buffer, not the bodies.
"""

from __future__ import annotations

import struct
from typing import IO

from ..errors import FormatError
from .sources import INFLATION_FREE_BYTES, INFLATION_RATIO

MAGIC = b"ARROW1"
CONTINUATION = 0xFFFFFFFF
MOST_METADATA = 64 << 20  # a message's flatbuffer (a schema of thousands of columns is a few MB)
RECORD_BATCH, DICTIONARY_BATCH = 3, 2  # MessageHeader's union types


class _Table:
    """A flatbuffer table: its fields by number, read within the buffer (a bad offset is a FormatError)."""

    def __init__(self, data: bytes, at: int) -> None:
        self.data, self.at = data, at
        vtable = at - _unpack("<i", data, at)
        self.vtable_size = _unpack("<H", data, vtable)
        self.vtable = vtable

    def _field(self, number: int) -> int | None:
        slot = 4 + 2 * number
        if slot + 2 > self.vtable_size:
            return None
        offset = _unpack("<H", self.data, self.vtable + slot)
        return self.at + offset if offset else None

    def scalar(self, number: int, kind: str, default: int = 0) -> int:
        at = self._field(number)
        return default if at is None else _unpack(kind, self.data, at)

    def table(self, number: int) -> _Table | None:
        at = self._field(number)
        return None if at is None else _Table(self.data, at + _unpack("<I", self.data, at))

    def structs(self, number: int, size: int, kind: str) -> list[tuple]:
        """A vector of structs of `size` bytes, each unpacked as `kind`."""
        at = self._field(number)
        if at is None:
            return []
        start = at + _unpack("<I", self.data, at)
        count = _unpack("<I", self.data, start)
        if start + 4 + count * size > len(self.data):
            raise FormatError(f"a vector of {count:,} entries past the end of its metadata")
        return [struct.unpack_from(kind, self.data, start + 4 + i * size) for i in range(count)]


def _unpack(kind: str, data: bytes, at: int) -> int:
    if not 0 <= at <= len(data) - struct.calcsize(kind):
        raise FormatError("its metadata points outside itself: not an Arrow IPC message")
    return int(struct.unpack_from(kind, data, at)[0])


def _batch_of(metadata: bytes) -> tuple[int, _Table | None]:
    """(body length, its RecordBatch table or None) of a message's metadata."""
    message = _Table(metadata, _unpack("<I", metadata, 0))
    body = message.scalar(3, "<q")
    kind = message.scalar(1, "<B")
    header = message.table(2)
    if header is not None and kind == DICTIONARY_BATCH:
        header = header.table(1)
    return body, header if kind in (RECORD_BATCH, DICTIONARY_BATCH) else None


def check(raw: IO[bytes], size: int) -> None:
    """Refuse (FormatError) a file or stream whose compressed buffers declare more than the inflation bound, or
    a file whose footer names a message not found walking it. `raw` is seekable, `size` its length."""
    raw.seek(0)
    start = 8 if raw.read(6) == MAGIC else 0
    at, found, stored, declared = start, set(), 0, 0
    while at + 8 <= size:
        raw.seek(at)
        head = raw.read(8)
        marker, length = struct.unpack("<Ii", head)
        prefix = 8
        if marker != CONTINUATION:  # the format before 0.15: the length alone
            length, prefix = struct.unpack("<i", head[:4])[0], 4
        if length == 0:
            break  # end of stream
        if not 0 < length <= MOST_METADATA or at + prefix + length > size:
            raise FormatError(f"a message at byte {at:,} declares {length:,} bytes of metadata: not Arrow IPC")
        raw.seek(at + prefix)
        metadata = raw.read(length)
        body, batch = _batch_of(metadata)
        body_at = at + prefix + length
        if body < 0 or body_at + body > size:
            raise FormatError(f"a message at byte {at:,} declares a body of {body:,} bytes past the file's end")
        found.add(at)
        stored += body
        if batch is not None and batch.table(3) is not None:  # compressed: 8 bytes of each buffer say its size
            for offset, length_ in batch.structs(2, 16, "<qq"):
                if length_ >= 8 and offset >= 0 and offset + 8 <= body:
                    raw.seek(body_at + offset)
                    size_ = struct.unpack("<q", raw.read(8))[0]
                    declared += length_ - 8 if size_ == -1 else max(size_, 0)  # -1: stored as it is
        else:
            declared += body
        if declared > INFLATION_FREE_BYTES + INFLATION_RATIO * max(stored, 1):
            raise FormatError(
                f"its record batches declare {declared:,} bytes once decompressed, from {stored:,} stored: more than "
                f"{INFLATION_RATIO} times as many (a decompression bomb?); if the file is sound, write it "
                f"uncompressed (compression='uncompressed') and convert that"
            )
        at = body_at + body
    if start:
        _check_footer(raw, size, found)


def _check_footer(raw: IO[bytes], size: int, found: set[int]) -> None:
    """A file's footer: every block it names (dictionaries and record batches) is a message walked above."""
    if size < 16:
        raise FormatError("too short for an Arrow IPC file")
    raw.seek(size - 10)
    tail = raw.read(10)
    length = struct.unpack("<i", tail[:4])[0]
    if tail[4:] != MAGIC or not 0 < length <= min(size - 18, MOST_METADATA):
        raise FormatError("no Arrow IPC footer at its end")
    raw.seek(size - 10 - length)
    footer = raw.read(length)
    table = _Table(footer, _unpack("<I", footer, 0))
    for number in (2, 3):  # dictionaries, record batches: Block {offset: long, metaDataLength: int, bodyLength: long}
        for offset, _, _ in table.structs(number, 24, "<qi4xq"):
            if offset not in found:
                raise FormatError(f"its footer names a message at byte {offset:,} that the file does not hold")
