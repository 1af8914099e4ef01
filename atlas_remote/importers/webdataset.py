"""WebDataset tar shards: samples grouped exactly as `webdataset.WebDataset(urls)` groups them, no decoding.

A member's key is its directories plus its basename up to the first dot; the rest of the name, lowercased, is
its suffix. Only adjacent members with one key form a sample, and a tar file always ends one. Non-regular
members and `__*__` entries are skipped, as are names with no dot; a sparse member (GNU `--sparse`) is refused. Example:
`{"__key__": "images17/image194", "__url__": "s3://b/train-000000.tar", "left.jpg": b"...", "json": b"..."}`.
"""

from __future__ import annotations

import re
import tarfile
from collections.abc import Iterable, Iterator
from typing import Any

from ..errors import AtlasError, FormatError
from .sources import expand, open_source, source_error

KEY_AND_SUFFIX = re.compile(r"^((?:.*/|)[^.]+)[.]([^/]*)$")
META = re.compile(r"__[^/]*__($|/)")


def inputs(src: str | Iterable[str], storage_options: dict[str, Any] | None = None) -> list[str]:
    return expand(src, storage_options)


def _members(url: str, storage_options: dict[str, Any] | None) -> Iterator[tuple[str, bytes]]:
    """(name, bytes) of the regular members of one tar (plain, or gzip, bzip2 or xz as `r|*` reads them),
    streamed; decompressed by sources.open_source, so what a compressed tar inflates to is bounded."""
    with open_source(url, storage_options, compression="magic") as f:
        name = None
        try:
            with tarfile.open(fileobj=f, mode="r|") as tar:
                for member in tar:
                    name = member.name
                    if member.issparse():  # its holes read as zeros: a 2 KB tar made a 2 GiB value
                        raise FormatError(
                            f"a sparse member ({member.size:,} bytes, most of them holes): WebDataset writers never "
                            f"make one; make the tar again without --sparse",
                            url=url,
                        )
                    body = tar.extractfile(member) if member.isreg() and not META.match(name) else None
                    if body is not None:
                        yield name, body.read()
        except AtlasError as err:
            where = f"member {name!r}: " if name else ""
            err.problem = where + err.problem
            raise err.located(url=url)
        except (tarfile.TarError, EOFError, OSError, ValueError) as err:
            after = f" after member {name!r}" if name else ""
            raise FormatError(
                f"not a readable tar archive{after} ({type(err).__name__}: {err}); truncated or corrupt?", url=url
            ) from err


def samples(urls: str | Iterable[str], storage_options: dict[str, Any] | None = None) -> Iterator[dict]:
    for url in inputs(urls, storage_options):
        sample: dict | None = None
        for name, data in _members(url, storage_options):
            match = KEY_AND_SUFFIX.match(name)
            if not match:
                continue
            key, suffix = match.group(1), match.group(2).lower()
            if sample is None or key != sample["__key__"]:
                if sample is not None:
                    yield sample
                sample = {"__key__": key, "__url__": url}
            if suffix in sample:
                raise source_error(ValueError(f"member {name!r}: a second {suffix!r} in sample {key!r}"), url)
            sample[suffix] = data
        if sample is not None:
            yield sample
