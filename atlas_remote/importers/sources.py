"""Turning what a user gives (URLs, globs, brace patterns, lists of them) into an ordered list of files, and
opening them: every importer reads through `Store` (retries, counters, one error vocabulary)."""

from __future__ import annotations

import io
from collections.abc import Callable, Iterable
from typing import IO, Any

from braceexpand import braceexpand
from fsspec.compression import compr
from fsspec.core import split_protocol
from fsspec.utils import infer_compression

from ..errors import AtlasError, FormatError, ObjectNotFoundError
from ..storage import Store


def source(url: str, storage_options: dict[str, Any] | None) -> Store:
    """A source file or folder, as a store whose root it is."""
    return Store(url, storage_options)


def open_source(
    url: str, storage_options: dict[str, Any] | None, compression: str | None = None, buffer: int | None = None
) -> IO[bytes]:
    """A source file to stream: as it is (compression None: pyarrow seeks in it), or decompressed as its name says
    ("infer") or as its first bytes say ("magic": gzip, bzip2, xz, as tarfile's `r|*` reads them), with what it
    may inflate to bounded by what was read of it (`Inflation`), read `buffer` bytes at a time (READ_BYTES)."""
    raw = source(url, storage_options).open_input()
    if compression is None:
        return raw
    counted = Counted(raw)
    stream = io.BufferedReader(counted, COMPRESSED_READ_BYTES)
    kind = infer_compression(url) if compression == "infer" else _by_magic(stream.peek(MAGIC_BYTES))
    if kind is None:
        return stream
    return io.BufferedReader(Inflation(compr[kind](stream, mode="rb"), counted, url), buffer or READ_BYTES)


READ_BYTES = 1 << 20
COMPRESSED_READ_BYTES = 64 << 10  # read ahead of a decompressor: counted before it is inflated, so kept small
INFLATION_FREE_BYTES = 16 << 20  # what any compressed stream may yield, whatever its size...
INFLATION_RATIO = 100  # ...and past that, per byte read of it (Apache POI's bound for zip entries: 1 to 100)
MAGIC_BYTES = 6
MAGIC = {b"\x1f\x8b": "gzip", b"BZh": "bz2", b"\xfd7zXZ\x00": "xz"}


def _by_magic(head: bytes) -> str | None:
    return next((kind for magic, kind in MAGIC.items() if head.startswith(magic)), None)


class Counted(io.RawIOBase):
    """A source file, counting the bytes read from it (what a decompressor under `Inflation` consumed)."""

    def __init__(self, raw: IO[bytes]) -> None:
        self.raw, self.count = raw, 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        data = self.raw.read(len(buffer))
        buffer[: len(data)] = data
        self.count += len(data)
        return len(data)

    def close(self) -> None:
        self.raw.close()
        super().close()


class Inflation(io.RawIOBase):
    """A decompressed stream that may yield INFLATION_FREE_BYTES, and INFLATION_RATIO bytes more per byte read
    from its file: past that it is a decompression bomb (a 522 KB tar.gz holding a 512 MiB member took 1.63 GB
    to convert), refused before more is inflated. Each read inflates at most what it asks for (gzip, bzip2, xz and
    zstd readers all bound their output), so what it holds is within the bound plus one read."""

    def __init__(self, stream: IO[bytes], counted: Counted, url: str) -> None:
        self.stream, self.counted, self.url, self.count = stream, counted, url, 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        data = self.stream.read(len(buffer))
        self.count += len(data)
        if self.count > INFLATION_FREE_BYTES + INFLATION_RATIO * self.counted.count:
            raise FormatError(
                f"it decompresses to more than {INFLATION_RATIO} times the {self.counted.count:,} compressed bytes "
                f"read of it ({self.count:,} bytes so far): a decompression bomb, or data far more repetitive than "
                f"usual; if the file is sound, decompress it first and convert the plain file",
                url=self.url,
            )
        buffer[: len(data)] = data
        return len(data)

    def close(self) -> None:
        self.stream.close()
        self.counted.close()
        super().close()


def read_small(store: Store, rel: str, limit: int) -> bytes:
    """A metadata file of a source (a .zarray, a state.json) read whole, refused past `limit` bytes unread."""
    with store.open_input(rel) as f:
        data = f.read(limit + 1)
    if len(data) > limit:
        raise FormatError(
            f"larger than {limit:,} bytes, far more than such a file holds: not one", url=store.url_of(rel)
        )
    return data


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
