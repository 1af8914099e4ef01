"""Turning what a user gives (URLs, globs, brace patterns, lists of them) into an ordered list of files, and
opening them: every importer reads through `Store` (retries, counters, one error vocabulary)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import IO, Any

from braceexpand import braceexpand
from fsspec.core import split_protocol

from ..errors import AtlasError, FormatError, ObjectNotFoundError
from ..storage import Store


def source(url: str, storage_options: dict[str, Any] | None) -> Store:
    """A source file or folder, as a store whose root it is."""
    return Store(url, storage_options)


def open_source(url: str, storage_options: dict[str, Any] | None, compression: str | None = None) -> IO[bytes]:
    """A source file to stream (compression "infer": by its name)."""
    return source(url, storage_options).open_input(compression=compression)


def expand(src: str | Iterable[str], storage_options: dict[str, Any] | None = None) -> list[str]:
    """Brace patterns (`train-{000000..000099}.tar`) and globs (`*.tar`) expanded, in the order given (each glob
    sorted); plain URLs kept as they are. A pattern that matches nothing is an error, never an empty dataset."""
    urls: list[str] = []
    for item in [src] if isinstance(src, str) else list(src):
        for url in braceexpand(str(item)):
            if any(c in url for c in "*?["):
                protocol = split_protocol(url)[0]
                matches = source(url, storage_options).glob()
                if not matches:
                    raise ObjectNotFoundError("no file matches this pattern", url=url)
                urls += [f"{protocol}://{m}" if protocol and "://" not in m else m for m in matches]
            else:
                urls.append(url)
    return urls


def where(url: str, line: int | None = None) -> str:
    """How a source position is named in errors: the file, and the line where one applies."""
    return f"{url} line {line}" if line is not None else url


def source_error(err: Exception, url: str, line: int | None = None) -> AtlasError:
    """A malformed source as a FormatError naming the file (and line); our own errors keep their class."""
    if isinstance(err, AtlasError):
        return err.located(url=url)
    if isinstance(err, FileNotFoundError):
        return ObjectNotFoundError(f"{type(err).__name__}: {err}", url=url)
    return FormatError(f"{'line ' + str(line) + ': ' if line is not None else ''}{type(err).__name__}: {err}", url=url)


def files_below(
    src: str | Iterable[str],
    storage_options: dict[str, Any] | None,
    suffixes: tuple[str, ...],
    split: str | None = None,
    select: Callable[[str, list[str], str | None], list[str]] | None = None,
) -> list[str]:
    """The source's files: a folder is every file with one of the suffixes below it (sorted). With `select`
    (hub.select_split), a folder's files are those of one split (`split`, or its only one), and files named
    one by one or by a pattern are kept when they belong to `split`."""
    found: list[str] = []
    for url in expand(src, storage_options):
        folder = source(url, storage_options)
        if folder.is_folder():
            rels = [rel for rel in folder.find() if rel.endswith(suffixes)]
            if select is not None:
                rels = select(url, rels, split)
            found += [folder.url_of(rel) for rel in rels]
        elif select is None or split is None or select(url, [url.split("://")[-1]], split):
            found.append(url)
    if not found:
        raise FormatError(
            f"no {' or '.join(suffixes)} file here{f' for split {split!r}' if split else ''}", url=str(src)
        )
    return found
