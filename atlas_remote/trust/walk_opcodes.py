"""The pickle opcodes as the walk sees them: what each is charged (what it makes at CPython's sizes, its stack
slot, what it can make a container grow by), and which branch of the walk's loop takes it."""

from __future__ import annotations

import pickletools
import struct
import sys

SLOT = 16  # a reference on the unpickler's stack, with the stack's growth
ITEM = 100  # what one more item can make its container grow by (a set's table grows to 6.7 slots of 16 bytes an item)
OPCODE_BYTES = 80  # the most an opcode of a fixed length builds per byte it takes, but the two below (measured)
SET_BYTES = sys.getsizeof(set()) + SLOT  # an empty set or frozenset from one byte (EMPTY_SET, FROZENSET)
RECORD_BYTES = 120  # the walk's record of an empty list or dict: a list of five, its slots in the walk's lists
_TEXT = frozenset(
    {"STRING", "BINSTRING", "SHORT_BINSTRING", "UNICODE", "BINUNICODE", "SHORT_BINUNICODE", "BINUNICODE8"}
)
_INTS = frozenset({"INT", "BININT", "BININT1", "BININT2", "LONG", "LONG1", "LONG4"})
_REFS = frozenset({"NONE", "NEWTRUE", "NEWFALSE", "EMPTY_TUPLE", "GET", "BINGET", "LONG_BINGET", "DUP"})
_CALLS = frozenset({"GLOBAL", "STACK_GLOBAL", "INST", "OBJ", "NEWOBJ", "NEWOBJ_EX", "REDUCE", "EXT1", "EXT2", "EXT4"})
_MADE = {  # what each opcode that pushes a new value makes, at CPython's sizes (sys.getsizeof of the empty value)
    **dict.fromkeys(_REFS, 0),
    **dict.fromkeys(_INTS, sys.getsizeof(2**40)),
    **dict.fromkeys(("FLOAT", "BINFLOAT"), sys.getsizeof(0.0)),
    **dict.fromkeys(_TEXT, sys.getsizeof("\U0001f600")),  # the header of the widest kind; characters charged apart
    **dict.fromkeys(("BINBYTES", "SHORT_BINBYTES", "BINBYTES8"), sys.getsizeof(b"")),
    "BYTEARRAY8": sys.getsizeof(bytearray()),
    **dict.fromkeys(("NEXT_BUFFER", "READONLY_BUFFER", "PERSID", "BINPERSID"), sys.getsizeof(memoryview(b""))),
    **dict.fromkeys(("EMPTY_LIST", "LIST"), sys.getsizeof([])),
    **dict.fromkeys(("EMPTY_DICT", "DICT"), sys.getsizeof({})),
    **dict.fromkeys(("EMPTY_SET", "FROZENSET"), sys.getsizeof(set())),
    **dict.fromkeys(("TUPLE", "TUPLE1", "TUPLE2", "TUPLE3"), sys.getsizeof((0, 0, 0))),
    **dict.fromkeys(_CALLS, 64),  # wrappers charge what they allocate themselves
}


def _charges() -> list[int]:
    """What each opcode is charged before its payload (0 for a byte that is no opcode: the walk refuses it): what
    it makes, its stack slot and what it can make a container grow by; for an opcode of a fixed length, no more
    than OPCODE_BYTES a byte it takes (SET_BYTES for the set opcodes), which bounds dense runs of them, but never
    less than the walk's own record of a container it makes (RECORD_BYTES; a tuple's, with its items, at cost)."""
    charges = [0] * 256
    for op in pickletools.opcodes:
        code, exact = op.code.encode("latin-1")[0], _MADE.get(op.name, 0) + SLOT + ITEM
        if op.name in ("EMPTY_SET", "FROZENSET"):
            exact = SET_BYTES
        elif op.name in ("EMPTY_LIST", "EMPTY_DICT", "LIST", "DICT"):
            exact = RECORD_BYTES
        elif (op.arg is None or op.arg.n >= 0) and not op.name.startswith("TUPLE"):
            exact = min(exact, OPCODE_BYTES * (1 + op.arg.n if op.arg else 1))
        charges[code] = exact
    return charges


_CHARGES = _charges()
MEMOIZE_CHARGE = _CHARGES[0x94]
# the opcodes of each branch of the walk, in the order the walk tests them (the most frequent first; MEMOIZE
# mostly comes with the opcode before it, in the same turn)
_BRANCHES = [
    *(b"h", b"K", b"\x8c", b"(", b"ue\x90as", b"}]\x8f", b"\x85\x86\x87t)", b"N", b"\x88\x89", b"XBC", b"J"),
    *(b"M", b"G", b"\x94", b"R\x81\x92", b"b", b"q", b"\x93", b"\x8a\x8b", b"\x95", b"\x80", b".", b"rp", b"jg", b"0"),
    *(b"1", b"2", b"\x8d\x8e\x96", b"TU", b"ILFSV", b"ci", b"o", b"ld\x91", b"\x82\x83\x84", b"PQ\x97\x98"),
]
_GROUPS = [len(_BRANCHES)] * 256  # a byte that is no opcode: the last branch refuses it
for _group, _codes in enumerate(_BRANCHES):
    for _code in _codes:
        _GROUPS[_code] = _group
_NAMES = {op.code.encode("latin-1")[0]: op.name for op in pickletools.opcodes}
_FLOAT = struct.Struct(">d").unpack_from
_LEN4 = struct.Struct("<I").unpack_from
_INT4 = struct.Struct("<i").unpack_from
_LEN8 = struct.Struct("<Q").unpack_from
