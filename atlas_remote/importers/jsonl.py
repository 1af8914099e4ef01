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


def lines(url: str, storage_options: dict[str, Any] | None) -> Iterator[tuple[int, str]]:
    """(line number from 1, text) of a text file, streamed and decompressed as its name says. A line is one
    example, so it is at most MAX_LINE_BYTES: 64 of them, a block of the default size, then stay within what a
    reader with default settings decodes (max_block_bytes, 1 GiB)."""
    number = 0
    try:
        with open_source(url, storage_options, compression="infer") as stream:
            while line := stream.readline(MAX_LINE_BYTES + 1):
                number += 1
                if len(line) > MAX_LINE_BYTES and not line.endswith(b"\n"):
                    raise FormatError(
                        f"line {number}: longer than {MAX_LINE_BYTES:,} bytes, more than one example may hold "
                        f"(a line is one example): split it, or the file is not JSON lines"
                    )
                yield number, line.decode("utf-8")
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
