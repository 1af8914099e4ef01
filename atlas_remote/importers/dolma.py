"""Dolma: `ROOT/documents/**` JSON-lines files (.jsonl.gz, .json.gz, .jsonl.zst, .jsonl) and the attribute sets
`ROOT/attributes/<set>/...` that mirror their paths line by line, merged as Dolma's mixer merges them.

Documents come in sorted path order. An example is the document's JSON object, with "attributes" = the
document's own attributes updated with every selected set's attributes for that line. A set's line must carry
the document's id: a mismatch, or a file of another length, is an error naming the attribute file and line.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from ..errors import FormatError, ObjectNotFoundError
from .jsonl import lines, parse
from .sources import source

SUFFIXES = (".jsonl.gz", ".json.gz", ".jsonl.zst", ".json.zst", ".jsonl")
# Every attribute set's file is open beside its documents file, each with its buffers and decompressor: 2,800
# sets of 1 KB files, each a line of 1 MB, held 2.96 GB before the first document with a 1 MiB buffer each.
MOST_SETS = 128  # merged at once (Dolma's own mixes name a few dozen)
SET_BUFFER = 64 << 10  # read at a time from each (a longer line is read whole, as any line is)


def _root(src: str) -> str:
    return str(src).rstrip("/")


def inputs(src: str, storage_options: dict[str, Any] | None = None) -> list[str]:
    """The document files, relative to `ROOT/documents/`, in sorted path order."""
    documents = source(f"{_root(src)}/documents", storage_options)
    if not documents.is_folder():
        raise ObjectNotFoundError("no documents/ folder: not a Dolma dataset root", url=documents.url)
    return [rel for rel in documents.find() if rel.endswith(SUFFIXES)]


def attribute_sets(src: str, storage_options: dict[str, Any] | None = None) -> list[str]:
    attributes = source(f"{_root(src)}/attributes", storage_options)
    return attributes.list_names() if attributes.is_folder() else []


def samples(
    src: str,
    storage_options: dict[str, Any] | None = None,
    *,
    files: Iterable[str] | None = None,
    attributes: Iterable[str] | None = None,
) -> Iterator[dict]:
    """The documents of `files` (default: all), with the attribute sets `attributes` (default: all) merged."""
    root = _root(src)
    sets = list(attribute_sets(root, storage_options) if attributes is None else attributes)
    if len(sets) > MOST_SETS:
        raise FormatError(
            f"{len(sets):,} attribute sets to merge: at most {MOST_SETS} are read at once (each an open file with its "
            f"buffers); choose the sets to merge (--attributes, or attributes=)",
            url=f"{root}/attributes",
        )
    for rel in inputs(root, storage_options) if files is None else files:
        doc_url = f"{root}/documents/{rel}"
        streams = [
            (f"{root}/attributes/{name}/{rel}", lines(f"{root}/attributes/{name}/{rel}", storage_options, SET_BUFFER))
            for name in sets
        ]
        number = 0
        for number, line in lines(doc_url, storage_options):
            document = _object(parse(line, doc_url, number), doc_url, number, "a document")
            merged = dict(_object(document.get("attributes") or {}, doc_url, number, "its attributes"))
            for url, stream in streams:
                merged.update(_attributes(url, stream, number, document.get("id")))
            document["attributes"] = merged
            yield document
        for url, stream in streams:
            extra = next(stream, None)
            if extra is not None:
                raise FormatError(f"line {extra[0]}: more lines than its documents file ({number})", url=url)


def _attributes(url: str, stream: Iterator[tuple[int, str]], number: int, doc_id: Any) -> dict:
    row = next(stream, None)
    if row is None:
        raise FormatError(f"line {number}: the file ends before its documents file does", url=url)
    record = _object(parse(row[1], url, number), url, number, "an attribute record")
    if record.get("id") != doc_id:
        raise FormatError(
            f"line {number}: id {record.get('id')!r} where the documents file has {doc_id!r}: the "
            f"attribute file is out of step with its documents",
            url=url,
        )
    return _object(record.get("attributes") or {}, url, number, "its attributes")


def _object(value: Any, url: str, number: int, what: str) -> dict:
    """A JSON object where Dolma has one; anything else (a list, a string) is a FormatError naming the line."""
    if not isinstance(value, dict):
        raise FormatError(f"line {number}: {what} must be a JSON object, got {type(value).__name__}", url=url)
    return value
