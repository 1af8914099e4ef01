"""Turning what a user gives (URLs, globs, brace patterns, lists of them) into an ordered list of files."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import fsspec
from braceexpand import braceexpand
from fsspec.core import split_protocol

from ..errors import AtlasError, FormatError, ObjectNotFoundError


def expand(src: str | Iterable[str], storage_options: dict[str, Any] | None = None) -> list[str]:
    """Brace patterns (`train-{000000..000099}.tar`) and globs (`*.tar`) expanded, in the order given (each glob
    sorted); plain URLs kept as they are. A pattern that matches nothing is an error, never an empty dataset."""
    urls: list[str] = []
    for item in [src] if isinstance(src, str) else list(src):
        for url in braceexpand(str(item)):
            if any(c in url for c in "*?["):
                fs, _ = fsspec.core.url_to_fs(url, **(storage_options or {}))
                protocol = split_protocol(url)[0]
                matches = sorted(fs.glob(url))
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


def files_below(src: str | Iterable[str], storage_options: dict[str, Any] | None, suffixes: tuple[str, ...], split):
    """The source's files: a folder is every file with one of the suffixes below it (sorted), one split's only
    when `split` is given (a file named `<split>-...` or in a folder named `<split>`)."""
    found: list[str] = []
    for url in expand(src, storage_options):
        fs, path = fsspec.core.url_to_fs(url, **(storage_options or {}))
        if fs.isdir(path):
            protocol = url.split("://", 1)[0] + "://" if "://" in url else ""
            below = sorted(p for p in fs.find(path) if p.endswith(suffixes))
            found += [f"{protocol}{p}" if protocol else p for p in below]
        else:
            found.append(url)
    if split is not None:
        found = [u for u in found if u.rsplit("/", 1)[-1].startswith(f"{split}-") or f"/{split}/" in u]
    if not found:
        raise FormatError(
            f"no {' or '.join(suffixes)} file here{f' for split {split!r}' if split else ''}", url=str(src)
        )
    return found
