"""Every error atlas_remote raises on purpose, as data.

Each error carries where it happened as attributes: `url` (the dataset, or the root a store was opened on),
`path` (the object inside it), `shard` (a shard folder's name), `block` (a block number) and `byte_range`
((start, end) of data.bin), each None where it does not apply. The message is built from them, so callers and
tests read the attributes instead of matching text. Layers below add what they know; layers above fill in the
rest with `located()`, keeping the cause.
"""

from __future__ import annotations

import re
from typing import Any

MAX_PROBLEM_CHARS = 600
S3_ERROR_XML = re.compile(r"<\?xml.*?<Code>(.*?)</Code>.*?<Message>(.*?)</Message>.*", re.S)
# What a terminal acts on rather than shows: C0 and C1 controls (ESC starts colour, cursor and title sequences),
# DEL, and the bidi overrides and isolates that make text display in another order than it reads.
_UNPRINTABLE = [*range(0x20), 0x7F, *range(0x80, 0xA0), *range(0x202A, 0x202F), *range(0x2066, 0x206A)]
_ESCAPES = {c: repr(chr(c))[1:-1] for c in _UNPRINTABLE}


def printable(text: str) -> str:
    """Text from data (an example, a file name, a server's answer) made safe to print: every character a terminal
    would act on is written as its Python escape (`\\x1b`, `\\u202e`); all other text is left as it is."""
    return text.translate(_ESCAPES)


def one_line(text: str) -> str:
    """A client's message as one line: obstore appends a multi-line Rust debug dump ("Debug source: ..."),
    aiohttp and botocore wrap lines; the first paragraph, whitespace collapsed, says what happened, with what
    would act on a terminal escaped (`printable`)."""
    text = text.split("Debug source:", 1)[0]
    xml = S3_ERROR_XML.search(text)
    if xml:  # an S3 error body quoted whole: its code and message say it
        text = text[: xml.start()] + f"{xml.group(1)}: {xml.group(2)}"
    return shortened(printable(" ".join(text.split())), MAX_PROBLEM_CHARS)


def shortened(text: str, most: int) -> str:
    """Text of at most `most` characters: cut at the last space that fits (a word is never cut in two) and
    ended with "…" where it was cut."""
    if len(text) <= most:
        return text
    cut = text[: most - 1]
    space = cut.rfind(" ")
    return (cut[:space] if space > most // 2 else cut).rstrip(" ,;:") + "…"


class AtlasError(Exception):
    """Base class of every error atlas_remote raises on purpose."""

    def __init__(
        self,
        problem: str = "",
        *,
        url: str | None = None,
        path: str | None = None,
        shard: str | None = None,
        block: int | None = None,
        byte_range: tuple[int, int] | None = None,
    ) -> None:
        problem = one_line(problem)
        super().__init__(problem)
        self.problem = problem
        self.url, self.path, self.shard, self.block, self.byte_range = url, path, shard, block, byte_range

    def located(self, **where: Any) -> AtlasError:
        """Fill in the attributes not known where the error was raised (known ones stay); returns self."""
        for name, value in where.items():
            if getattr(self, name) is None:
                setattr(self, name, value)
        return self

    @property
    def where(self) -> str:
        target = "/".join(p for p in (self.url, self.path) if p)
        parts = [
            f"shard {self.shard}" if self.shard is not None else "",
            f"block {self.block}" if self.block is not None else "",
            f"bytes [{self.byte_range[0]}, {self.byte_range[1]})" if self.byte_range else "",
        ]
        detail = " ".join(p for p in parts if p)
        return ": ".join(p for p in (target, detail) if p)

    def __str__(self) -> str:  # names come from data too (a listed file, a shard folder): escaped as the problem is
        return printable(": ".join(p for p in (self.where, self.problem) if p))

    def __reduce__(self):  # keep the attributes across processes (DataLoader workers, multiprocessing)
        return (_rebuild, (type(self), self.__dict__.copy()))


def _rebuild(cls: type[AtlasError], state: dict) -> AtlasError:
    error = cls.__new__(cls)
    Exception.__init__(error, state.get("problem", ""))
    error.__dict__.update(state)
    return error


# -- datasets --------------------------------------------------------------------------------------


class DatasetNotFoundError(AtlasError, FileNotFoundError):
    """No committed dataset at the URL (no root meta.json)."""


class DatasetExistsError(AtlasError, FileExistsError):
    """A writer was pointed at a URL that already holds a committed dataset, or other people's files."""


class DatasetLockedError(AtlasError):
    """Another writer holds the URL's lease (one writer per URL), or took it over from this one."""

    def __init__(
        self, problem: str = "", *, holder: str | None = None, started: str | None = None, **where: Any
    ) -> None:
        super().__init__(problem, **where)
        self.holder, self.started = holder, started


class CommitInterruptedError(AtlasError):
    """A commit failed after its point of no return; `recover(url)` (or the next writer) finishes it."""


class DatasetChangedError(AtlasError):
    """The dataset was rewritten while a reader had it open; mixing old and new blocks is refused."""


# -- content ---------------------------------------------------------------------------------------


class FormatError(AtlasError, ValueError):
    """A metadata file or index does not follow the Atlas v1 format."""


class CorruptBlockError(AtlasError, ValueError):
    """A block's bytes are not what the index promised, or do not decode."""


class TruncatedReadError(CorruptBlockError):
    """The store returned fewer bytes than the range asked for: never decoded, retried, then reported."""


class UnsafePickleError(AtlasError, ValueError):
    """A block refers to a global the restricted unpickler does not allow."""


class CheckpointError(AtlasError, ValueError):
    """A training state given to `load_state_dict` that no run of this stream could have written: a field of the
    wrong type, out of its bounds, or for another plan. Refused before anything is allocated from it."""


class UsageError(AtlasError, ValueError):
    """A call that cannot do what was meant: arguments that contradict each other or the job they run in (a
    rank and world size torch.distributed says otherwise of), a loader option the stream decides itself. The
    message says what to pass instead."""


class CollateError(AtlasError, TypeError):
    """Examples of a batch that cannot be made into one batch (a key missing in some, arrays of shapes or types
    that do not stack): reported by the main process, naming the key."""


class PackingError(AtlasError, ValueError):
    """Examples a TokenStream cannot pack (no such key, not a 1-D array of integer token ids), or token counts
    that are not this dataset's (another dataset's, a stale or forged file): count them again."""


class UnpicklableExampleError(AtlasError, TypeError):
    """Examples could not be pickled (found when their block was): they were dropped, the others kept, and the
    writer can go on. `example_index` is the first refused, `refused` all of them (numbers from 0)."""

    def __init__(
        self, problem: str = "", *, example_index: int | None = None, refused: list[int] | None = None, **where: Any
    ) -> None:
        super().__init__(problem, **where)
        self.example_index = example_index  # counting every add_example call from 0, refused ones included
        self.refused = refused if refused is not None else [] if example_index is None else [example_index]


class WriteEndedError(AtlasError):
    """A part of a write finished after the write had failed or been discarded; what it wrote was removed."""


class UnguardedScriptError(AtlasError, RuntimeError):
    """A write with worker processes called from a script's top level, outside `if __name__ == "__main__":`:
    every spawned worker imports the script again and would run the write again."""


class ExportError(AtlasError, ValueError):
    """Examples that do not fit what they are exported to (Arrow's columns and types, one kind of row)."""


class ExpansionError(AtlasError, ValueError):
    """An example (or the examples of one call) that would take far more memory once walked, copied or collated
    than it holds: a value referred to many times, nesting past what a consumer walks, padding, a batch read of
    blocks that decompress past the bound. Refused, named, before anything is built from it."""


# -- storage ---------------------------------------------------------------------------------------


class StorageError(AtlasError, OSError):
    """The store failed a request (network, server error)."""


class ObjectNotFoundError(StorageError, FileNotFoundError):
    """The object (or its bucket) does not exist."""


class BucketNotFoundError(DatasetNotFoundError, ObjectNotFoundError):
    """The bucket itself does not exist: no dataset can be there, and nothing can be written there."""


class LocationError(AtlasError, ValueError):
    """A location or storage options no client can use as meant: `s3:/bucket/ds` (one slash: a local path), an
    `endpoint_url` without a scheme. Refused before any client sees them."""


class ClientFailedError(StorageError):
    """The storage client failed inside itself (obstore's Rust code panicked: a BaseException, which `except
    Exception` misses): never retried; the message says what the client said."""


class AccessDeniedError(StorageError, PermissionError):
    """The store refused the credentials, or they may not read/write this object."""


class RangeNotSupportedError(StorageError):
    """The server answered a ranged read with more than the range: it ignores Range requests."""


class RedirectRefusedError(StorageError):
    """The server redirected a request to another origin (scheme, host or port): refused, never retried."""


class CacheFolderError(AtlasError, PermissionError):
    """The disk cache folder is not private to this process's user: another user could plant blocks in it."""
