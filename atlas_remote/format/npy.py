"""A .npy file's header read by a small strict parser of its one dict, without `ast`.

numpy reads the header with `ast.literal_eval`, and CPython 3.11 keeps the AST constructor's recursion depth per
interpreter, not per thread (python/cpython#106905): when another thread builds an AST at the same moment (a
parser, a framework compiling code, a finalizer), a valid header fails with `SystemError: AST constructor
recursion depth mismatch`, at random. The header is a dict of three keys that numpy writes in one form, so a
parser of exactly that form is short, never shares state between threads, and takes nothing else.
"""

from __future__ import annotations

import re
import struct
from typing import Any, cast

import numpy as np

MAGIC = b"\x93NUMPY"
LENGTH_FIELDS = {(1, 0): "<H", (2, 0): "<I"}  # numpy writes 1.0, or 2.0 for a header past 64 KiB
KEYS = {"descr", "fortran_order", "shape"}
Buffer = bytes | memoryview | np.ndarray  # a file's bytes, or the file memory-mapped (uint8)
DEPTH = 4  # a record type's field with a shape: [( 'name', '<u4', (2,) )] is three deep in the dict
TOKEN = re.compile(
    r"""\s*(?:(?P<text>'[^'\\\n]*'|"[^"\\\n]*")|(?P<number>-?\d+)|(?P<word>True|False)|(?P<mark>[{}()\[\],:]))"""
)


class HeaderError(ValueError):
    """The header is not the dict numpy writes: what is wrong, in words (`spec.read_npy` names the file)."""


def read_header(raw: Buffer, most: int) -> tuple[tuple[int, ...], bool, np.dtype, int]:
    """(shape, fortran_order, dtype, where the data starts) of .npy bytes whose header is at most `most` bytes."""
    head = bytes(raw[:10])
    if len(head) < 8 or head[:6] != MAGIC:
        raise HeaderError("it does not start with the .npy magic string")
    version = (head[6], head[7])
    if version not in LENGTH_FIELDS:
        raise HeaderError(f".npy version {version[0]}.{version[1]}, where numpy writes 1.0 or 2.0 for it")
    field = LENGTH_FIELDS[version]
    start = 8 + struct.calcsize(field)
    if len(raw) < start:
        raise HeaderError("the file ends inside its header's length")
    (length,) = struct.unpack(field, bytes(raw[8:start]))
    if length > most:
        raise HeaderError(f"a header of {length:,} bytes, where numpy writes a few hundred (at most {most:,} read)")
    if len(raw) < start + length:
        raise HeaderError(f"the file ends inside its header ({length:,} bytes announced)")
    text = bytes(raw[start : start + length]).decode("latin1")
    header = parse_dict(text)
    return _shape(header["shape"]), _order(header["fortran_order"]), _dtype(header["descr"]), start + length


def parse_dict(text: str) -> dict[str, Any]:
    """The header's dict: string keys, values that are strings, integers, True/False, tuples and lists."""
    tokens = _Tokens(text)
    value = tokens.value(0)
    tokens.end()
    if not isinstance(value, dict):
        raise HeaderError(f"the header is a {type(value).__name__}, not a dict")
    if set(value) != KEYS:
        raise HeaderError(f"the header's keys are {sorted(value)}, where numpy writes {sorted(KEYS)}")
    return value


class _Tokens:
    """The header's text, a token at a time."""

    def __init__(self, text: str) -> None:
        self.text, self.at = text, 0

    def next(self) -> tuple[str, str]:
        match = TOKEN.match(self.text, self.at)
        if match is None:
            shown = self.text[self.at : self.at + 20].strip()
            if not shown:
                raise HeaderError("the header ends inside its dict")
            raise HeaderError(f"unexpected {shown!r} in the header, at character {self.at}")
        self.at = match.end()
        kind = match.lastgroup
        assert kind is not None
        return kind, match.group(kind)

    def end(self) -> None:
        if self.text[self.at :].strip():
            raise HeaderError(f"text after the header's dict, at character {self.at}")

    def value(self, depth: int) -> Any:
        kind, token = self.next()
        if kind == "text":
            return token[1:-1]
        if kind == "number":
            return int(token)
        if kind == "word":
            return token == "True"
        if depth >= DEPTH or token not in "{([":
            raise HeaderError(f"unexpected {token!r} in the header, at character {self.at - 1}")
        closing = {"{": "}", "(": ")", "[": "]"}[token]
        items: list[Any] = []
        keys: list[Any] = []
        while True:
            if self._closes(closing):
                break
            if token == "{":
                key = self.value(depth + 1)
                if not isinstance(key, str) or self.next() != ("mark", ":"):
                    raise HeaderError(f"a key of the header's dict is not a string followed by ':' ({key!r})")
                keys.append(key)
            items.append(self.value(depth + 1))
            if self._closes(closing):
                break
            if self.next() != ("mark", ","):
                raise HeaderError(f"expected ',' or {closing!r} in the header, at character {self.at - 1}")
        if token == "{":
            if len(set(keys)) != len(keys):
                raise HeaderError("a key of the header's dict is given twice")
            return dict(zip(keys, items))
        return tuple(items) if token == "(" else items

    def _closes(self, closing: str) -> bool:
        match = TOKEN.match(self.text, self.at)
        if match is not None and match.group("mark") == closing:
            self.at = match.end()
            return True
        return False


def _shape(value: Any) -> tuple[int, ...]:
    if not isinstance(value, tuple) or not all(type(n) is int for n in value):
        raise HeaderError(f"shape is not a tuple of integers: {value!r}")
    return value


def _order(value: Any) -> bool:
    if type(value) is not bool:
        raise HeaderError(f"fortran_order is not True or False: {value!r}")
    return value


def _dtype(descr: Any) -> np.dtype:
    """The type a descr names: a type string, or a record's list of (name, type string[, shape]) fields."""
    if not isinstance(descr, (str, list)):
        raise HeaderError(f"descr is not a type string or a list of fields: {descr!r}")
    if isinstance(descr, list):
        for field in descr:
            plain = isinstance(field, tuple) and 2 <= len(field) <= 3 and all(isinstance(x, str) for x in field[:2])
            if not plain or (len(field) == 3 and not isinstance(field[2], tuple)):
                raise HeaderError(f"a field of descr is not (name, type string[, shape]): {field!r}")
    try:
        return np.lib.format.descr_to_dtype(cast(Any, descr))
    except Exception as err:  # numpy's words for a type it does not know vary: any is a refusal
        raise HeaderError(f"descr {descr!r} is not a type numpy knows ({err})") from None
