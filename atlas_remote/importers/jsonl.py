"""JSON lines: one example per non-blank line, from files compressed any way fsspec infers (.gz, .zst, .bz2...)."""

from __future__ import annotations

import io
import json
from collections.abc import Iterable, Iterator
from typing import Any

from ..errors import AtlasError
from .sources import files_below, open_source, source_error

SUFFIXES = tuple(
    f".{kind}{packed}" for kind in ("jsonl", "json", "ndjson") for packed in ("", ".gz", ".zst", ".bz2", ".xz")
)


def inputs(src: str | Iterable[str], storage_options: dict[str, Any] | None = None) -> list[str]:
    """Files, globs, brace patterns; a folder is every JSON-lines file below it, sorted."""
    return files_below(src, storage_options, SUFFIXES, None)


def lines(url: str, storage_options: dict[str, Any] | None) -> Iterator[tuple[int, str]]:
    """(line number from 1, text) of a text file, streamed and decompressed as its name says."""
    try:
        with open_source(url, storage_options, compression="infer") as raw:
            yield from enumerate(io.TextIOWrapper(raw, encoding="utf-8"), start=1)
    except AtlasError:
        raise
    except Exception as err:  # a truncated gzip, bad UTF-8, a missing file
        raise source_error(err, url) from err


def samples(urls: str | Iterable[str], storage_options: dict[str, Any] | None = None) -> Iterator[Any]:
    for url in inputs(urls, storage_options):
        for number, line in lines(url, storage_options):
            if line.strip():
                try:
                    yield json.loads(line)
                except json.JSONDecodeError as err:
                    raise source_error(err, url, number) from err
