"""What the `atlas-remote` command prints: examples in one line each (or JSON), data escaped before it reaches a
terminal, and log messages one line each."""

from __future__ import annotations

import base64
import json
import logging
import warnings
from collections import deque
from itertools import islice
from typing import Any

import numpy as np

from ..errors import ExpansionError, one_line, printable
from ..read.expansion import checked, checked_range
from ..read.megatron import MegatronCorpus
from ..read.reader import AtlasDataset

# -- examples --------------------------------------------------------------------------------

TEXT_CHARS, ITEMS = 80, 8


def summary(value: Any, depth: int = 0) -> str:
    """A readable one-line form of an example: long strings, bytes, arrays and containers cut short."""
    if isinstance(value, str):
        return repr(value) if len(value) <= TEXT_CHARS else f"{value[:TEXT_CHARS]!r}... ({len(value):,} chars)"
    if isinstance(value, (bytes, bytearray)):
        head = bytes(value[:16])
        return repr(bytes(value)) if len(value) <= 16 else f"<{len(value):,} bytes: {head!r}...>"
    if isinstance(value, np.ndarray):
        flat = value.ravel()
        values = ", ".join(str(v) for v in flat[:ITEMS].tolist()) + (", ..." if flat.size > ITEMS else "")
        return f"array(dtype={value.dtype}, shape={value.shape}, [{values}])"
    if depth > 3:
        return "..."
    if isinstance(value, dict):
        items = [f"{summary(k, depth + 1)}: {summary(v, depth + 1)}" for k, v in islice(value.items(), ITEMS * 2)]
        more = f", ... ({len(value)} keys)" if len(value) > ITEMS * 2 else ""
        return "{" + ", ".join(items) + more + "}"
    if isinstance(value, (list, tuple, set, frozenset, deque)):  # a deque's repr is all of it (839 MB once)
        items = [summary(v, depth + 1) for v in islice(value, ITEMS)]
        more = f", ... ({len(value)} items)" if len(value) > ITEMS else ""
        opening, closing = {list: ("[", "]"), tuple: ("(", ")"), deque: ("deque([", "])")}.get(type(value), ("{", "}"))
        return opening + ", ".join(items) + more + closing
    text = repr(value)
    return text if len(text) <= TEXT_CHARS * 4 else text[: TEXT_CHARS * 4] + "..."


def jsonable(value: Any) -> Any:
    """JSON-ready form: bytes as base64, arrays as lists, numpy scalars as numbers, keys as strings."""
    if isinstance(value, (bytes, bytearray)):
        return base64.b64encode(value).decode()
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, dict):
        return {k if isinstance(k, str) else str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [jsonable(v) for v in value]
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return repr(value)


def say(text: object) -> None:
    """Print what came from data (examples, file names, reports quoting errors): each line with what would act on
    a terminal escaped (errors.printable). JSON lines come out of json.dumps, which escapes all of it already."""
    print("\n".join(printable(line) for line in str(text).split("\n")))


def example_line(i: int, example: Any, as_json: bool) -> str:
    """One example as its line: JSON (whole: measured first by read/expansion.py) or a summary (cut short)."""
    if not as_json:
        return f"[{i}] {summary(example)}"
    try:
        return json.dumps({"index": i, "example": jsonable(example)})
    except RecursionError:  # a dataset of your own nesting near Python's limit (a stranger's is measured first)
        raise ExpansionError(f"example {i:,} nests too deep for JSON: print it without --json") from None


def print_examples(ds: AtlasDataset | MegatronCorpus, indices: range | list[int], as_json: bool) -> None:
    """A dataset's examples measured before JSON walks them; a corpus's are token arrays the .bin bounds."""
    for i in indices:
        example = ds[i]
        if as_json and isinstance(ds, AtlasDataset):
            example = checked(ds, i, example)
        say(example_line(i, example, as_json))


def print_range(ds: AtlasDataset | MegatronCorpus, start: int, stop: int, as_json: bool) -> None:
    """Examples start..stop in order, read ahead (`cat`)."""
    if as_json and isinstance(ds, AtlasDataset):
        examples = checked_range(ds, start, stop)
    else:
        examples = ds.iter(start, stop)
    for i, example in zip(range(start, stop), examples):
        say(example_line(i, example, as_json))


class _OneLine(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        return f"atlas-remote: {record.levelname.lower()}: {one_line(record.getMessage())}"


def messages_one_line_each(debug: bool) -> None:
    """Our warnings as one line each; the storage clients' own logs and warnings (their retries, tracebacks,
    deprecations) are for --debug, not for every run's terminal."""
    if debug:
        logging.basicConfig(level=logging.DEBUG)
        return
    ours = logging.getLogger("atlas_remote")
    if not any(isinstance(h.formatter, _OneLine) for h in ours.handlers):  # main() may run again in one process
        handler = logging.StreamHandler()
        handler.setFormatter(_OneLine())
        ours.addHandler(handler)
    ours.setLevel(logging.WARNING)
    ours.propagate = False
    logging.getLogger().addHandler(logging.NullHandler())  # others: no last-resort printing to stderr
    warnings.simplefilter("ignore")
