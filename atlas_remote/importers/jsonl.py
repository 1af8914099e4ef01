"""JSON lines: one example per non-blank line, from files compressed any way fsspec infers (.gz, .zst, .bz2...)."""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from typing import Any

from ..errors import AtlasError, FormatError
from .sources import files_below, open_source, source_error

MAX_LINE_BYTES = 16 << 20
SUFFIXES = tuple(
    f".{kind}{packed}" for kind in ("jsonl", "json", "ndjson") for packed in ("", ".gz", ".zst", ".bz2", ".xz")
)


def inputs(src: str | Iterable[str], storage_options: dict[str, Any] | None = None) -> list[str]:
    """Files, globs, brace patterns; a folder is every JSON-lines file below it, sorted."""
    return files_below(src, storage_options, SUFFIXES, None)


def lines(url: str, storage_options: dict[str, Any] | None, buffer: int | None = None) -> Iterator[tuple[int, str]]:
    """(line number from 1, text) of a text file, streamed and decompressed as its name says, `buffer` bytes at a
    time (sources.READ_BYTES). A line is one example, so it is at most MAX_LINE_BYTES: 64 of them, a block of the
    default size, then stay within what a reader with default settings decodes (max_block_bytes, 1 GiB)."""
    number = 0
    try:
        with open_source(url, storage_options, compression="infer", buffer=buffer) as stream:
            read: list[bytes] = []  # a line is popped as it is handed on: none stays here while the consumer has
            while True:  # it (a Dolma mix holds one of these a set, a 1 MB line each held 128 MB for 128 sets)
                read.append(stream.readline(MAX_LINE_BYTES + 1))
                if not read[0]:
                    break
                number += 1
                if len(read[0]) > MAX_LINE_BYTES and not read[0].endswith(b"\n"):
                    raise FormatError(
                        f"line {number}: longer than {MAX_LINE_BYTES:,} bytes, more than one example may hold "
                        f"(a line is one example): split it, or the file is not JSON lines"
                    )
                yield number, read.pop().decode("utf-8")
    except AtlasError as err:
        raise err.located(url=url)
    except Exception as err:  # bad UTF-8 (that line), a truncated gzip or a missing file (the line it reached)
        raise source_error(err, url, number if isinstance(err, UnicodeDecodeError) else number + 1) from err


def parse(text: str, url: str, number: int) -> Any:
    """A line's JSON value; a line that is not JSON (or nests past Python's recursion limit, or holds an integer
    of more than 4,300 digits) is a FormatError naming the file and line."""
    try:
        return json.loads(text)
    except (ValueError, RecursionError) as err:
        raise source_error(err, url, number) from err


def samples(urls: str | Iterable[str], storage_options: dict[str, Any] | None = None) -> Iterator[Any]:
    for url in inputs(urls, storage_options):
        for number, line in lines(url, storage_options):
            if line.strip():
                yield parse(line, url, number)
