"""What a block's pickle opcodes build, found by walking them before the C unpickler builds anything.

A block with no global at all can still crash or stall the reader inside `pickle.loads`: a tuple nested 10^6
deep hashed as a dict key overflows the C stack, 40,000 int keys with one hash take 10 s to insert, ten DUP/TUPLE2
pairs make a tuple whose hash visits 2^10 objects, a chain of deques overflows the stack when it is freed. The
dangerous steps happen inside the C unpickler's load, and bytes counts cannot tell them from text. So an untrusted
block is executed symbolically first: a stack and a memo of small records (containers as lists of their children,
constants as themselves), from which the walk knows, before anything is loaded:

- how deep containers nest (each container is one level; a cycle counts as deep as it has members), refused past
  MAX_DEPTH: CPython's hash of a tuple and free of a deque recurse in C without a check;
- how many objects a recursive walk of the block visits, shared objects counted at each reference, refused past
  TREE_PER_BYTE per byte (a DAG of shared tuples is the one way a few bytes make a long walk);
- every key hashed into a dict, set or frozenset (by opcodes, or by the wrappers that build them from a list):
  the hash work (a tuple's hash visits all of it), keys of one container with one hash (only str and bytes hashes
  are randomized; an int's is its value modulo 2^61-1), and keys whose hash the walk cannot know;
- which objects a BUILD, APPEND, SETITEM or ADDITEMS changes: never an allowed global (shared by every block),
  never a torch tensor or storage, only dicts take SETITEM (a list's slice assignment takes any iterable);
- what the opcodes allocate (`_CHARGES`, at CPython's sizes), refused past the block's limit.

Containers are complete when they are nested in the pickles a pickler writes, so depth and size are kept as they
go; a container changed after it was nested (a cycle, or a crafted block) makes the walk recompute both over the
final graph, strongly connected components weighed by their size. `docs/security.md` has the figures.
"""

from __future__ import annotations

import copyreg
import pickletools
import struct
import sys
from collections.abc import Callable
from typing import Any

from .errors import UnsafePickleError

AMPLIFICATION = 128  # what a block may build, as a multiple of its decompressed bytes (above FLOOR_BYTES)
FLOOR_BYTES = 1 << 20
MAX_BLOCK_MULTIPLE = 2  # ... and never more than this many times max_block_bytes, however large the block
MAX_DEPTH = 1000  # containers within containers (Python's own recursion limit; C code overflowed past 100,000)
TREE_PER_BYTE, TREE_FLOOR = 32, 1 << 20  # objects a recursive walk of a block may visit: per byte, plus a floor
SAME_HASH = 8  # keys of one dict or set that may share one hash
UNKNOWN_WORK = 1 << 21  # comparisons keys the walk cannot hash may cost (n keys of one container: n^2 / 2)
SMALL_INT = (1 << 61) - 1  # ints below this in size hash to themselves (but -1): no two collide

# what a container record holds, in order
KIND, DEPTH, TREE, NESTED, ITEMS, MAKES = range(6)  # ITEMS: () until it has some; MAKES: globals only
# kinds of records; every record is a list, every constant something else
LIST, DICT, SET, FROZENSET, TUPLE, DEQUE, MAPPING, GLOBAL, DTYPE, ARRAY, TENSOR, USER, OBJ, DATED = range(14)
# what calling a global makes (the allowed globals' table says which is which, `unpickler.WALK_MAKES`)
(F_LIST, F_DICT, F_TUPLE, F_SET, F_FROZENSET, F_INT, F_FLOAT, F_STR, F_BOOL, F_BYTES) = range(10)
(M_BYTEARRAY, M_OBJ, M_ODICT, M_DDICT, M_COUNTER, M_DEQUE, M_DTYPE, M_ARRAY, M_TENSOR, M_STORAGE, M_USER) = range(
    10, 21
)
C_DATED, C_OBJ, C_USER, M_NOTHING = range(21, 25)  # classes (NEWOBJ takes only these), and ndarray's token
_CLASSES = (C_DATED, C_OBJ, C_USER)
_FACTORY_KINDS = {F_LIST: LIST, F_DICT: DICT, F_SET: SET, F_FROZENSET: FROZENSET}
_FACTORY_VALUES: dict[int, Any] = {F_TUPLE: (), F_INT: 0, F_FLOAT: 0.0, F_BOOL: False}


def limit_for(size: int, max_block_bytes: int) -> int:
    """The most a block of `size` decompressed bytes may build."""
    return min(AMPLIFICATION * size + FLOOR_BYTES, MAX_BLOCK_MULTIPLE * max_block_bytes)


class Refused(UnsafePickleError):
    """A block that builds what data never needs (a size, an iterable, a tuple nested a million deep...)."""


class _Marker:
    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return self.name


STR, BYTES, BYTEARRAY, UNKNOWN_HASH, ABSENT = (
    _Marker(n) for n in ("STR", "BYTES", "BYTEARRAY", "UNKNOWN_HASH", "ABSENT")
)
# short str and bytes constants are kept as slices of the block (a module's name, a key's model)

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
# the opcodes of each branch of the walk, in the order the walk tests them (the most frequent first)
_BRANCHES = [
    *(b"\x94", b"h", b"K", b"\x8c", b"(", b"ue\x90", b"}]\x8f", b"\x85\x86\x87t)", b"N", b"\x88\x89", b"XBC", b"J"),
    *(b"M", b"G", b"R\x81\x92", b"b", b"q", b"\x93", b"as", b"\x8a\x8b", b"\x95", b"\x80", b".", b"rp", b"jg", b"0"),
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


def _refuse_depth(depth: int) -> None:
    raise Refused(
        f"its containers nest {depth:,} deep, past the {MAX_DEPTH:,} a pickler writes (CPython's hash and free of "
        f"such nesting overflow the C stack): read it only if you trust it (trusted=True)"
    )


def _refuse_tree(tree: int, bound: int) -> None:
    raise Refused(
        f"it shares containers so that walking it visits more than {bound:,} objects ({TREE_PER_BYTE} per byte of "
        f"the block): read it only if you trust it (trusted=True)"
    )


def _node(kind: int) -> list:
    return [kind, 1, 1, False, ()]


def _nest(parent: list, items: list, max_tree: int) -> bool:
    """Adds items to a container; True when the container was already inside another (its depth and size there
    are now stale: the walk recomputes them over the final graph) or is one of the items (a cycle)."""
    stale = parent[NESTED]
    depth, tree = parent[DEPTH], parent[TREE] + len(items)
    for item in items:
        if type(item) is list:
            if item[DEPTH] >= depth:
                depth = item[DEPTH] + 1
            tree += item[TREE] - 1
            item[NESTED] = True
            if item is parent:
                stale = True
    if parent[ITEMS]:
        parent[ITEMS] += items
    else:
        parent[ITEMS] = items  # the callers' lists are their own
    parent[DEPTH], parent[TREE] = depth, tree
    if depth > MAX_DEPTH:
        _refuse_depth(depth)
    if tree > max_tree:
        _refuse_tree(tree, max_tree)
    return stale


def _made(items: list, kind: int, max_tree: int) -> list:
    node = [kind, 1, 1, False, ()]
    _nest(node, items, max_tree)
    return node


class _Keys:
    """What the keys hashed so far cost: hash work (objects visited) and comparisons among unknown hashes."""

    def __init__(self, bound: int) -> None:
        self.bound, self.work, self.unknown = bound, 0, 0
        self.nodes: list = []  # keys that are containers, for a recount over the final graph
        self.models: dict[int, Any] = {}  # id of a key that is a container -> its model
        self.counts: dict[int, dict[int, int]] = {}  # id of a container -> hash -> keys with it
        self.unknowns: dict[int, int] = {}  # id of a container -> keys whose hash the walk cannot know


def _model(key: Any, models: dict[int, Any], depth: int = 0) -> Any:
    """A value whose hash collides with another's when the keys' hashes do (the key itself for numbers; tuples
    and frozensets of models; str and bytes by their bytes), or UNKNOWN_HASH."""
    if type(key) is not list:
        return key
    model = models.get(id(key))
    if model is not None:
        return model
    kind = key[KIND]
    if kind in (TUPLE, FROZENSET, DATED) and depth < 64:
        parts = [_model(item, models, depth + 1) for item in key[ITEMS]]
        if any(part is UNKNOWN_HASH for part in parts):
            model = UNKNOWN_HASH
        elif kind == FROZENSET:
            model = frozenset(parts)
        else:
            model = (kind, *parts) if kind == DATED else tuple(parts)
    elif kind in (GLOBAL, TENSOR):
        model = (GLOBAL, id(key))  # hashed by identity
    else:
        model = UNKNOWN_HASH
    models[id(key)] = model
    return model


def _hashed(container: list, keys: list, tally: _Keys) -> None:
    """Keys about to be hashed into `container` (a dict, set or frozenset)."""
    counts = tally.counts.get(id(container))
    for key in keys:
        kind = type(key)
        if kind is bytes or key is STR or key is BYTES or key is None or kind is bool:
            continue
        if kind is int:
            if -SMALL_INT < key < SMALL_INT and key != -1:
                continue
            tally.work += key.bit_length() // 30 + 1  # an int's hash is not cached
        elif kind is list:
            if key[KIND] == GLOBAL or key[KIND] == TENSOR:
                continue  # hashed by identity
            tally.work += key[TREE]  # a tuple's hash is not cached: it visits all of it
            tally.nodes.append(key)
        if tally.work > tally.bound:
            raise Refused(
                f"hashing its keys would visit more than {tally.bound:,} objects: read it only if you trust it "
                f"(trusted=True)"
            )
        model = _model(key, tally.models)
        if model is UNKNOWN_HASH:
            unknown = tally.unknowns[id(container)] = tally.unknowns.get(id(container), 0) + 1
            tally.unknown += unknown
            if tally.unknown > UNKNOWN_WORK:
                raise Refused(
                    f"it has more keys whose hash the walk cannot know ({unknown:,} in one container) than keys of "
                    f"data need: read it only if you trust it (trusted=True)"
                )
            continue
        if counts is None:
            counts = tally.counts[id(container)] = {}
        digest = hash(model)
        same = counts[digest] = counts.get(digest, 0) + 1
        if same > SAME_HASH:
            raise Refused(
                f"{same} of the keys of one dict or set share one hash, which makes inserting them quadratic "
                f"(no data needs more than {SAME_HASH}): read it only if you trust it (trusted=True)"
            )


def _pairs_keys(items: Any, counter: bool) -> list:
    """The keys an OrderedDict, defaultdict or Counter made from `items` (a dict, or a list of pairs) hashes."""
    if type(items) is not list:
        return []
    if items[KIND] in (DICT, MAPPING):
        return items[ITEMS][0::2]
    if counter:
        return items[ITEMS]
    return [pair[ITEMS][0] for pair in items[ITEMS] if type(pair) is list and pair[ITEMS]]


def _call(makes: int, args: list, tally: _Keys, max_tree: int) -> Any:
    """What calling an allowed global with `args` makes, as the walk keeps it (its wrapper checks the arguments)."""
    if makes in _FACTORY_KINDS:
        kind = _FACTORY_KINDS[makes]
        if not args:
            return _node(kind)
        node = _made(args[:1], kind, max_tree)  # set(list): the list's items, one level deeper
        if kind in (SET, FROZENSET) and type(args[0]) is list:
            _hashed(node, args[0][ITEMS], tally)
        return node
    if makes in _FACTORY_VALUES:
        return _FACTORY_VALUES[makes]
    if makes == F_STR:
        return STR
    if makes == F_BYTES:
        return BYTES
    if makes == M_BYTEARRAY:
        return BYTEARRAY
    if makes in (M_ODICT, M_DDICT, M_COUNTER):
        node = _made(list(args), MAPPING, max_tree)
        if makes == M_DDICT:
            items = args[1] if len(args) > 1 else None
        else:
            items = args[0] if args else None
        _hashed(node, _pairs_keys(items, makes == M_COUNTER), tally)
        return node
    if makes == M_NOTHING:
        raise ValueError("numpy.ndarray is not called by a numpy pickle")
    kind = {
        M_DEQUE: DEQUE,
        M_DTYPE: DTYPE,
        M_ARRAY: ARRAY,
        M_TENSOR: TENSOR,
        M_STORAGE: TENSOR,
        M_USER: USER,
        C_USER: USER,
        C_DATED: DATED,
    }.get(makes, OBJ)
    return _made(list(args), kind, max_tree)


def _build(target: Any, state: Any, max_tree: int) -> bool:
    """BUILD (`__setstate__`, or attributes set) on `target`: refused where it would change what outlives the
    block or set a tensor's storage; True when the target was already nested (see _nest)."""
    if type(target) is not list:
        raise ValueError("BUILD on a constant")
    kind = target[KIND]
    if kind == GLOBAL:
        raise Refused(
            "it sets the state of an allowed global (BUILD), which would change it for every block read after: "
            "not data, refused"
        )
    if kind == TENSOR:
        raise Refused("it sets the state of a torch tensor or storage (BUILD), which can resize it: not data, refused")
    if kind == ARRAY:
        raw = state[ITEMS][-1] if type(state) is list and state[KIND] == TUPLE and state[ITEMS] else None
        if type(raw) is not bytes and raw is not BYTES:
            raise Refused("a numpy array's state holds its data as bytes; this one holds objects: refused")
    return _nest(target, [state], max_tree)


def _mark_items(stack: list, marks: list) -> list:
    start = marks.pop()
    items = stack[start:]
    del stack[start:]
    return items


def _global(makes: int) -> list:
    return [GLOBAL, 0, 1, False, (), makes]


def walk(data: bytes, limit: int, lookup: Callable[[str, str], int]) -> int:
    """What a block's opcodes allocate (charged at CPython's sizes, an upper bound tested against tracemalloc),
    after refusing (`Refused`) what would crash, stall or outlive the load: see the module's docstring.
    `lookup(module, name)` says what a global makes (`M_...`), or raises for a global that is not allowed. A block
    that is no pickle raises ValueError."""
    try:
        return _walk(data, limit, lookup)
    except (IndexError, KeyError, struct.error) as err:
        raise ValueError(f"not a pickle: {type(err).__name__} {err} while walking it") from err


def _walk(data: bytes, limit: int, lookup: Callable[[str, str], int]) -> int:
    size = len(data)
    max_tree = TREE_PER_BYTE * size + TREE_FLOOR
    tally = _Keys(max_tree)
    stack: list = []
    marks: list[int] = []
    memo: list = []  # as the C unpickler's: entries by index, ABSENT where none was put
    filled = memo_top = charged = at = 0  # filled: entries put (where MEMOIZE puts the next one)
    stale = False
    nodes: list = []  # every container made, for a recount when one changed after it was nested
    charges, groups = _CHARGES, _GROUPS
    push = stack.append
    while True:
        code = data[at]
        group = groups[code]
        charged += charges[code]
        if charged > limit:
            raise Refused(
                f"its pickle opcodes would build more than {limit:,} bytes from {size:,} ({AMPLIFICATION}x, and at "
                f"most {MAX_BLOCK_MULTIPLE}x max_block_bytes): not data a block holds"
            )
        if group == 0:  # MEMOIZE
            if filled == len(memo):
                memo.append(stack[-1])
                filled += 1
            else:
                filled = _put(memo, filled, filled, stack[-1])
            at += 1
        elif group == 1:  # BINGET
            value = memo[data[at + 1]]
            if value is ABSENT:
                raise KeyError(data[at + 1])
            push(value)
            at += 2
        elif group == 2:  # BININT1
            push(data[at + 1])
            at += 2
        elif group == 3:  # SHORT_BINUNICODE
            end = at + 2 + data[at + 1]
            text = data[at + 2 : end]
            charged += len(text) if text.isascii() else 4 * len(text)
            push(text)
            if data[end] == 0x94:  # MEMOIZE, taken with the opcode before it
                if filled == len(memo):
                    memo.append(text)
                    filled += 1
                else:
                    filled = _put(memo, filled, filled, text)
                charged += MEMOIZE_CHARGE
                end += 1
            at = end
        elif group == 4:  # MARK
            marks.append(len(stack))
            at += 1
        elif group == 5:  # SETITEMS, APPENDS, ADDITEMS
            start = marks.pop()
            items = stack[start:]
            del stack[start:]
            target = stack[-1]
            if type(target) is not list:
                raise ValueError("items added to a constant")
            kind = target[KIND]
            if code == 0x75:
                if kind != DICT and kind != MAPPING and kind != USER:
                    _refuse_setitem()
                if len(items) % 2:
                    raise ValueError("SETITEMS with a key and no value")
                for key in items[0::2]:
                    if type(key) is not bytes:  # str keys' hashes are randomized: nothing to count
                        _hashed(target, items[0::2], tally)
                        break
            elif code == 0x90:
                if kind not in (SET, USER):
                    raise Refused("ADDITEMS on anything but a set is not data")
                _hashed(target, items, tally)
            elif kind not in (LIST, DEQUE, USER):
                raise Refused("APPENDS on anything but a list is not data")
            if items and _nest(target, items, max_tree):
                stale = True
            at += 1
        elif group == 6:  # EMPTY_DICT, EMPTY_LIST, EMPTY_SET
            node = [DICT if code == 0x7D else LIST if code == 0x5D else SET, 1, 1, False, ()]
            nodes.append(node)
            push(node)
            at += 1
            if data[at] == 0x94:  # MEMOIZE, taken with the opcode before it
                if filled == len(memo):
                    memo.append(node)
                    filled += 1
                else:
                    filled = _put(memo, filled, filled, node)
                charged += MEMOIZE_CHARGE
                at += 1
        elif group == 7:  # TUPLE1, TUPLE2, TUPLE3, TUPLE, EMPTY_TUPLE
            if code == 0x29:
                push(())
            else:
                if code == 0x74:
                    items = _mark_items(stack, marks)
                else:
                    count = code - 0x84
                    items = stack[-count:]
                    if len(items) < count:
                        raise ValueError("a tuple of more items than the stack holds")
                    del stack[-count:]
                if items:
                    depth, tree = 1, 1 + len(items)
                    for item in items:
                        if type(item) is list:
                            if item[DEPTH] >= depth:
                                depth = item[DEPTH] + 1
                            tree += item[TREE] - 1
                            item[NESTED] = True
                    if depth > MAX_DEPTH:
                        _refuse_depth(depth)
                    if tree > max_tree:
                        _refuse_tree(tree, max_tree)
                    node = [TUPLE, depth, tree, False, items]
                    nodes.append(node)
                    push(node)
                else:
                    push(())
            at += 1
            if data[at] == 0x94:  # MEMOIZE, taken with the opcode before it
                if filled == len(memo):
                    memo.append(stack[-1])
                    filled += 1
                else:
                    filled = _put(memo, filled, filled, stack[-1])
                charged += MEMOIZE_CHARGE
                at += 1
        elif group == 8:  # NONE
            push(None)
            at += 1
        elif group == 9:  # NEWTRUE, NEWFALSE
            push(code == 0x88)
            at += 1
        elif group == 10:  # BINUNICODE, BINBYTES, SHORT_BINBYTES
            if code == 0x43:
                start = at + 2
                end = start + data[at + 1]
            else:
                start = at + 5
                end = start + _LEN4(data, at + 1)[0]
                if end > size:
                    raise ValueError(f"a string at byte {at} claims bytes past the block's end")
            if code == 0x58:
                text = data[start:end]
                charged += len(text) if text.isascii() else 4 * len(text)
                value = text if len(text) < 256 else STR
            else:
                charged += end - start
                value = data[start:end] if end - start < 256 else BYTES
            push(value)
            if data[end] == 0x94:  # MEMOIZE, taken with the opcode before it
                if filled == len(memo):
                    memo.append(value)
                    filled += 1
                else:
                    filled = _put(memo, filled, filled, value)
                charged += MEMOIZE_CHARGE
                end += 1
            at = end
        elif group == 11:  # BININT
            push(_INT4(data, at + 1)[0])
            at += 5
        elif group == 12:  # BININT2
            push(data[at + 1] | data[at + 2] << 8)
            at += 3
        elif group == 13:  # BINFLOAT
            push(_FLOAT(data, at + 1)[0])
            at += 9
        elif group == 14:  # REDUCE, NEWOBJ, NEWOBJ_EX
            if code == 0x92:
                stack.pop()  # keyword arguments: given to a class's __new__, which checks them
            args, function = stack.pop(), stack.pop()
            if type(function) is not list or function[KIND] != GLOBAL:
                raise ValueError("a call of something that is no global")
            if code != 0x52 and function[MAKES] not in _CLASSES:
                raise ValueError("NEWOBJ of something that is no class")
            arguments = (
                [] if type(args) is tuple else args[ITEMS] if type(args) is list and args[KIND] == TUPLE else None
            )
            if arguments is None:
                raise ValueError("a call's arguments are not a tuple")
            made = _call(function[MAKES], arguments, tally, max_tree)
            if type(made) is list:
                nodes.append(made)
            push(made)
            at += 1
            if data[at] == 0x94:  # MEMOIZE, taken with the opcode before it
                if filled == len(memo):
                    memo.append(made)
                    filled += 1
                else:
                    filled = _put(memo, filled, filled, made)
                charged += MEMOIZE_CHARGE
                at += 1
        elif group == 15:  # BUILD
            state = stack.pop()
            if _build(stack[-1], state, max_tree):
                stale = True
            at += 1
        elif group == 16:  # BINPUT
            index = data[at + 1]
            if index >= memo_top:
                charged, memo_top = charged + 16 * (index + 1 - memo_top), index + 1
            filled = _put(memo, filled, index, stack[-1])
            at += 2
        elif group == 17:  # STACK_GLOBAL
            name, module = stack.pop(), stack.pop()
            if type(name) is not bytes or type(module) is not bytes:
                raise ValueError("STACK_GLOBAL takes a module and a name")
            push(_global(lookup(module.decode("utf-8", "surrogatepass"), name.decode("utf-8", "surrogatepass"))))
            at += 1
        elif group == 18:  # APPEND, SETITEM
            items = [stack.pop()] if code == 0x61 else [*stack[-2:]]
            if code == 0x73:
                if len(items) < 2:
                    raise ValueError("SETITEM with a key and no value")
                del stack[-2:]
            target = stack[-1]
            if type(target) is not list:
                raise ValueError("an item added to a constant")
            if code == 0x73:
                if target[KIND] not in (DICT, MAPPING, USER):
                    _refuse_setitem()
                _hashed(target, items[:1], tally)
            elif target[KIND] not in (LIST, DEQUE, USER):
                raise Refused("APPEND on anything but a list is not data")
            if _nest(target, items, max_tree):
                stale = True
            at += 1
        elif group == 19:  # LONG1, LONG4
            if code == 0x8A:
                start = at + 2
                end = start + data[at + 1]
            else:
                start = at + 5
                end = start + _INT4(data, at + 1)[0]
                if not start <= end <= size:
                    raise ValueError(f"LONG4 at byte {at} claims bytes past the block's end")
            charged += end - start
            push(int.from_bytes(data[start:end], "little", signed=True))
            at = end
        elif group == 20:  # FRAME: read into a buffer of its own
            length = _LEN8(data, at + 1)[0]
            if length > size - at - 9:
                raise ValueError(f"FRAME at byte {at} claims {length:,} bytes past the block's end")
            charged += length
            at += 9
        elif group == 21:  # PROTO
            at += 2
        elif group == 22:  # STOP
            break
        elif group == 23:  # LONG_BINPUT, PUT
            if code == 0x72:
                index, end = _LEN4(data, at + 1)[0], at + 5
            else:
                end = data.index(b"\n", at) + 1
                index = int(data[at + 1 : end])
            if not 0 <= index <= size:  # a pickler numbers its memo from 0, one entry per opcode
                raise Refused(f"memo entry {index:,} at byte {at} is past any pickler's: not a block a pickler wrote")
            if index >= memo_top:  # the C unpickler's memo is an array, doubled as it grows
                charged, memo_top = charged + 16 * (index + 1 - memo_top), index + 1
            filled = _put(memo, filled, index, stack[-1])
            at = end
        elif group == 24:  # LONG_BINGET, GET
            if code == 0x6A:
                index, at = _LEN4(data, at + 1)[0], at + 5
            else:
                end = data.index(b"\n", at) + 1
                index, at = int(data[at + 1 : end]), end
            value = memo[index]
            if value is ABSENT:
                raise KeyError(index)
            push(value)
        elif group == 25:  # POP: the mark, if the stack ends at one
            if marks and marks[-1] == len(stack):
                marks.pop()
            else:
                stack.pop()
            at += 1
        elif group == 26:  # POP_MARK
            _mark_items(stack, marks)
            at += 1
        elif group == 27:  # DUP
            push(stack[-1])
            at += 1
        elif group == 28:  # BINUNICODE8, BINBYTES8, BYTEARRAY8
            start = at + 9
            end = start + _LEN8(data, at + 1)[0]
            if end > size:
                raise ValueError(f"a string at byte {at} claims bytes past the block's end")
            wide = code == 0x8D and not data[start:end].isascii()
            charged += (end - start) * (4 if wide else 1)
            push(STR if code == 0x8D else BYTES if code == 0x8E else BYTEARRAY)
            at = end
        elif group == 29:  # BINSTRING, SHORT_BINSTRING (protocols 1 and 2)
            if code == 0x55:
                start = at + 2
                end = start + data[at + 1]
            else:
                start = at + 5
                end = start + _INT4(data, at + 1)[0]
                if not start <= end <= size:
                    raise ValueError(f"BINSTRING at byte {at} claims bytes past the block's end")
            charged += end - start
            push(STR)
            at = end
        elif group == 30:  # INT, LONG, FLOAT, STRING, UNICODE: a line of text
            end = data.index(b"\n", at) + 1
            line = data[at + 1 : end - 1]
            charged += 4 * len(line)
            if code == 0x49:
                push(True if line == b"01" else False if line == b"00" else int(line))
            elif code == 0x4C:
                push(int(line[:-1] if line.endswith(b"L") else line))
            elif code == 0x46:
                push(float(line))
            else:
                push(STR)
            at = end
        elif group == 31:  # GLOBAL, INST: "module\nname\n"
            middle = data.index(b"\n", at)
            end = data.index(b"\n", middle + 1) + 1
            module, name = data[at + 1 : middle].decode("ascii"), data[middle + 1 : end - 1].decode("ascii")
            charged += 4 * (end - at)
            function = _global(lookup(module, name))
            if code == 0x63:
                push(function)
            else:
                made = _call(function[MAKES], _mark_items(stack, marks), tally, max_tree)
                if type(made) is list:
                    nodes.append(made)
                push(made)
            at = end
        elif group == 32:  # OBJ
            items = _mark_items(stack, marks)
            if not items or type(items[0]) is not list or items[0][KIND] != GLOBAL:
                raise ValueError("OBJ of something that is no global")
            made = _call(items[0][MAKES], items[1:], tally, max_tree)
            if type(made) is list:
                nodes.append(made)
            push(made)
            at += 1
        elif group == 33:  # LIST, DICT, FROZENSET (from a mark)
            items = _mark_items(stack, marks)
            kind = LIST if code == 0x6C else DICT if code == 0x64 else FROZENSET
            node = _node(kind)
            if code == 0x64:
                if len(items) % 2:
                    raise ValueError("DICT with a key and no value")
                _hashed(node, items[0::2], tally)
            elif code == 0x91:
                _hashed(node, items, tally)
            _nest(node, items, max_tree)
            nodes.append(node)
            push(node)
            at += 1
        elif group == 34:  # EXT1, EXT2, EXT4: a global from copyreg's registry
            width = 1 << (code - 0x82)
            found = copyreg._inverted_registry.get(int.from_bytes(data[at + 1 : at + 1 + width], "little"))  # type: ignore[attr-defined]
            if found is None:
                raise ValueError("an extension code nobody registered")
            push(_global(lookup(*found)))
            at += 1 + width
        elif group == 35:  # PERSID, BINPERSID, NEXT_BUFFER, READONLY_BUFFER
            raise ValueError(f"{_NAMES[code]} needs what a block never has")
        else:
            raise ValueError(f"byte {code:#04x} at {at} is not a pickle opcode")
    if stale:
        _final_graph(nodes, stack[-1] if stack else None, tally, max_tree)
    elif stack and type(stack[-1]) is list and stack[-1][TREE] > max_tree:
        _refuse_tree(stack[-1][TREE], max_tree)
    return charged


def _put(memo: list, filled: int, index: int, value: Any) -> int:
    """Memo entry `index` set to `value`; what `filled` becomes (it counts entries set, as the C unpickler's)."""
    if index >= len(memo):
        memo.extend([ABSENT] * (index + 1 - len(memo)))
    if memo[index] is ABSENT:
        filled += 1
    memo[index] = value
    return filled


def _refuse_setitem() -> None:
    raise Refused("SETITEM on anything but a dict is not data (a list's slice assignment takes any iterable)")


def _final_graph(nodes: list, root: Any, tally: _Keys, max_tree: int) -> None:
    """Depth and size over the final graph, once a container changed after it was nested: strongly connected
    components (Tarjan's, iterative) count as deep as they have members; a numpy dtype in a cycle is refused (its
    hash recurses without end). Its own memory stays under what the walk charged for the nodes."""
    number: dict[int, int] = {}  # id of a node -> its number, by which the lists below are indexed
    low: list[int] = []
    depth: list[int] = []  # of each node's component, once weighed
    tree: list[int] = []
    on_path: list[bool] = []
    path: list = []
    for start in nodes:
        if id(start) in number:
            continue
        number[id(start)] = len(low)
        _grow(low, depth, tree, on_path)
        path.append(start)
        work = [(start, iter(start[ITEMS]))]
        while work:
            node, children = work[-1]
            here = number[id(node)]
            for child in children:
                if type(child) is not list:
                    continue
                seen = number.get(id(child))
                if seen is None:
                    number[id(child)] = len(low)
                    _grow(low, depth, tree, on_path)
                    path.append(child)
                    work.append((child, iter(child[ITEMS])))
                    break
                if on_path[seen] and seen < low[here]:
                    low[here] = seen
            else:
                work.pop()
                if work:
                    parent = number[id(work[-1][0])]
                    low[parent] = min(low[parent], low[here])
                if low[here] == here:
                    component = []
                    while True:
                        member = path.pop()
                        on_path[number[id(member)]] = False
                        component.append(member)
                        if member is node:
                            break
                    _weigh(component, number, depth, tree, max_tree)
    if type(root) is list and tree[number[id(root)]] > max_tree:
        _refuse_tree(tree[number[id(root)]], max_tree)
    if sum(tree[number[id(key)]] for key in tally.nodes) > tally.bound:
        raise Refused(f"hashing its keys would visit more than {tally.bound:,} objects: read it only if you trust it")


def _grow(low: list[int], depth: list[int], tree: list[int], on_path: list[bool]) -> None:
    low.append(len(low))
    depth.append(0)
    tree.append(0)
    on_path.append(True)


def _weigh(component: list, number: dict[int, int], depth: list[int], tree: list[int], max_tree: int) -> None:
    """Depth and size of one strongly connected component, every component it reaches weighed already."""
    members = {id(m) for m in component}
    deepest, size, cyclic = 0, 0, len(component) > 1
    for member in component:
        for item in member[ITEMS]:
            if type(item) is not list:
                size += 1
            elif id(item) in members:
                cyclic = True
            else:
                deepest = max(deepest, depth[number[id(item)]])
                size += tree[number[id(item)]]
        size += 1
    total = len(component) + deepest
    if total > MAX_DEPTH:
        _refuse_depth(total)
    if cyclic and any(m[KIND] == DTYPE for m in component):
        raise Refused("a numpy dtype in it holds itself (its hash would recurse without end): refused")
    size = min(size, max_tree + 1)
    for member in component:
        depth[number[id(member)]], tree[number[id(member)]] = total, size
