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
import struct
from collections.abc import Callable
from typing import Any

from .walk_graph import (
    _CLASSES,
    ABSENT,
    AMPLIFICATION,
    BYTEARRAY,
    BYTES,
    DEPTH,
    DEQUE,
    DICT,
    FROZENSET,
    GLOBAL,
    ITEMS,
    KIND,
    LIST,
    MAKES,
    MAPPING,
    MAX_BLOCK_MULTIPLE,
    NESTED,
    SET,
    STR,
    TREE,
    TREE_FLOOR,
    TREE_PER_BYTE,
    TUPLE,
    USER,
    Refused,
    _final_graph,
    _nest,
    _node,
    _refuse_depth,
    _refuse_tree,
)
from .walk_graph import (
    MAX_DEPTH as MAX_DEPTH,  # re-exported: the bound the walk's callers quote
)
from .walk_keys import (
    _build,
    _call,
    _hashed,
    _Keys,
)
from .walk_opcodes import (
    _CHARGES,
    _FLOAT,
    _GROUPS,
    _INT4,
    _LEN4,
    _LEN8,
    _NAMES,
    MEMOIZE_CHARGE,
)


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
        # The branches that make a value a pickler memoizes (text, bytes, containers, calls) set `value` and fall
        # through to the one push below, which takes a MEMOIZE after them in the same turn; every other branch
        # ends in `continue`. Branches are tested most frequent first.
        if group == 0:  # BINGET
            value = memo[data[at + 1]]
            if value is ABSENT:
                raise KeyError(data[at + 1])
            push(value)
            at += 2
            continue
        elif group == 1:  # BININT1
            push(data[at + 1])
            at += 2
            continue
        elif group == 2:  # SHORT_BINUNICODE
            end = at + 2 + data[at + 1]
            value = data[at + 2 : end]
            charged += len(value) if value.isascii() else 4 * len(value)
            at = end
        elif group == 3:  # MARK
            marks.append(len(stack))
            at += 1
            continue
        elif group == 4:  # SETITEMS, APPENDS, ADDITEMS, APPEND, SETITEM
            if _add_items(code, stack, marks, tally, max_tree):
                stale = True
            at += 1
            continue
        elif group == 5:  # EMPTY_DICT, EMPTY_LIST, EMPTY_SET
            value = [DICT if code == 0x7D else LIST if code == 0x5D else SET, 1, 1, False, ()]
            nodes.append(value)
            at += 1
        elif group == 6:  # TUPLE1, TUPLE2, TUPLE3, TUPLE, EMPTY_TUPLE
            if code == 0x29:
                items = []
            elif code == 0x74:
                items = _mark_items(stack, marks)
            else:
                count = code - 0x84
                items = stack[-count:]
                if len(items) < count:
                    raise ValueError("a tuple of more items than the stack holds")
                del stack[-count:]
            if items:  # weighed as _nest weighs items, without its call: tuples are most of a numpy array's opcodes
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
                value = [TUPLE, depth, tree, False, items]
                nodes.append(value)
            else:
                value = ()
            at += 1
        elif group == 7:  # NONE
            push(None)
            at += 1
            continue
        elif group == 8:  # NEWTRUE, NEWFALSE
            push(code == 0x88)
            at += 1
            continue
        elif group == 9:  # BINUNICODE, BINBYTES, SHORT_BINBYTES
            if code == 0x43:
                start = at + 2
                end = start + data[at + 1]
            else:
                start = at + 5
                end = start + _LEN4(data, at + 1)[0]
            if end > size:
                raise ValueError(f"{_NAMES[code]} at byte {at} claims bytes past the block's end")
            if code == 0x58:
                value = data[start:end]
                charged += len(value) if value.isascii() else 4 * len(value)
                if len(value) >= 256:
                    value = STR
            else:
                charged += end - start
                value = data[start:end] if end - start < 256 else BYTES
            at = end
        elif group == 10:  # BININT
            push(_INT4(data, at + 1)[0])
            at += 5
            continue
        elif group == 11:  # BININT2
            push(data[at + 1] | data[at + 2] << 8)
            at += 3
            continue
        elif group == 12:  # BINFLOAT
            push(_FLOAT(data, at + 1)[0])
            at += 9
            continue
        elif group == 13:  # MEMOIZE after an opcode that does not take it
            filled = _put(memo, filled, filled, stack[-1])
            at += 1
            continue
        elif group == 14:  # REDUCE, NEWOBJ, NEWOBJ_EX
            if code == 0x92:
                stack.pop()  # keyword arguments: given to a class's __new__, which checks them
            args, function = stack.pop(), stack.pop()
            if type(args) is not tuple and (type(args) is not list or args[KIND] != TUPLE):
                raise ValueError("a call's arguments are not a tuple")
            arguments = [] if type(args) is tuple else args[ITEMS]
            value = _called(function, arguments, tally, max_tree, nodes, classes_only=code != 0x52)
            at += 1
        elif group == 15:  # BUILD
            state = stack.pop()
            if _build(stack[-1], state, max_tree):
                stale = True
            at += 1
            continue
        elif group == 16:  # BINPUT
            index = data[at + 1]
            if index >= memo_top:
                charged, memo_top = charged + 16 * (index + 1 - memo_top), index + 1
            filled = _put(memo, filled, index, stack[-1])
            at += 2
            continue
        elif group == 17:  # STACK_GLOBAL
            name, module = stack.pop(), stack.pop()
            if type(name) is not bytes or type(module) is not bytes:
                raise ValueError("STACK_GLOBAL takes a module and a name")
            value = _global(lookup(module.decode("utf-8", "surrogatepass"), name.decode("utf-8", "surrogatepass")))
            at += 1
        elif group == 18:  # LONG1, LONG4
            start, end = _span(data, at, code == 0x8A, size)
            charged += end - start
            push(int.from_bytes(data[start:end], "little", signed=True))
            at = end
            continue
        elif group == 19:  # FRAME: read into a buffer of its own
            length = _LEN8(data, at + 1)[0]
            if length > size - at - 9:
                raise ValueError(f"FRAME at byte {at} claims {length:,} bytes past the block's end")
            charged += length
            at += 9
            continue
        elif group == 20:  # PROTO
            at += 2
            continue
        elif group == 21:  # STOP
            break
        elif group == 22:  # LONG_BINPUT, PUT
            index, end = (_LEN4(data, at + 1)[0], at + 5) if code == 0x72 else _line_int(data, at)
            if not 0 <= index <= size:  # a pickler numbers its memo from 0, one entry per opcode
                raise Refused(f"memo entry {index:,} at byte {at} is past any pickler's: not a block a pickler wrote")
            if index >= memo_top:  # the C unpickler's memo is an array, doubled as it grows
                charged, memo_top = charged + 16 * (index + 1 - memo_top), index + 1
            filled = _put(memo, filled, index, stack[-1])
            at = end
            continue
        elif group == 23:  # LONG_BINGET, GET
            index, at = (_LEN4(data, at + 1)[0], at + 5) if code == 0x6A else _line_int(data, at)
            value = memo[index]
            if value is ABSENT:
                raise KeyError(index)
            push(value)
            continue
        elif group == 24:  # POP: the mark, if the stack ends at one
            if marks and marks[-1] == len(stack):
                marks.pop()
            else:
                stack.pop()
            at += 1
            continue
        elif group == 25:  # POP_MARK
            _mark_items(stack, marks)
            at += 1
            continue
        elif group == 26:  # DUP
            push(stack[-1])
            at += 1
            continue
        elif group == 27:  # BINUNICODE8, BINBYTES8, BYTEARRAY8
            start = at + 9
            end = start + _LEN8(data, at + 1)[0]
            if end > size:
                raise ValueError(f"a string at byte {at} claims bytes past the block's end")
            wide = code == 0x8D and not data[start:end].isascii()
            charged += (end - start) * (4 if wide else 1)
            push(STR if code == 0x8D else BYTES if code == 0x8E else BYTEARRAY)
            at = end
            continue
        elif group == 28:  # BINSTRING, SHORT_BINSTRING (protocols 1 and 2)
            start, end = _span(data, at, code == 0x55, size)
            charged += end - start
            push(STR)
            at = end
            continue
        elif group == 29:  # INT, LONG, FLOAT, STRING, UNICODE: a line of text
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
            continue
        elif group == 30:  # GLOBAL, INST: "module\nname\n"
            middle = data.index(b"\n", at)
            end = data.index(b"\n", middle + 1) + 1
            module, name = data[at + 1 : middle].decode("utf-8"), data[middle + 1 : end - 1].decode("utf-8")
            charged += 4 * (end - at)
            value = _global(lookup(module, name))
            if code == 0x69:
                value = _called(value, _mark_items(stack, marks), tally, max_tree, nodes, classes_only=False)
            at = end
        elif group == 31:  # OBJ
            items = _mark_items(stack, marks)
            value = _called(items[0] if items else None, items[1:], tally, max_tree, nodes, classes_only=False)
            at += 1
        elif group == 32:  # LIST, DICT, FROZENSET (from a mark)
            items = _mark_items(stack, marks)
            value = _node(LIST if code == 0x6C else DICT if code == 0x64 else FROZENSET)
            if code == 0x64:
                if len(items) % 2:
                    raise ValueError("DICT with a key and no value")
                _hashed(value, items[0::2], tally)
            elif code == 0x91:
                _hashed(value, items, tally)
            _nest(value, items, max_tree)
            nodes.append(value)
            at += 1
        elif group == 33:  # EXT1, EXT2, EXT4: a global from copyreg's registry
            width = 1 << (code - 0x82)
            found = copyreg._inverted_registry.get(int.from_bytes(data[at + 1 : at + 1 + width], "little"))  # type: ignore[attr-defined]
            if found is None:
                raise ValueError("an extension code nobody registered")
            push(_global(lookup(*found)))
            at += 1 + width
            continue
        elif group == 34:  # PERSID, BINPERSID, NEXT_BUFFER, READONLY_BUFFER
            raise ValueError(f"{_NAMES[code]} needs what a block never has")
        else:
            raise ValueError(f"byte {code:#04x} at {at} is not a pickle opcode")
        push(value)
        if data[at] == 0x94:  # MEMOIZE, taken with the opcode before it
            if filled == len(memo):
                memo.append(value)
                filled += 1
            else:
                filled = _put(memo, filled, filled, value)
            charged += MEMOIZE_CHARGE
            at += 1
    if stale:
        _final_graph(nodes, stack[-1] if stack else None, tally, max_tree)
    elif stack and type(stack[-1]) is list and stack[-1][TREE] > max_tree:
        _refuse_tree(stack[-1][TREE], max_tree)
    return charged


def _span(data: bytes, at: int, short: bool, size: int) -> tuple[int, int]:
    """Where the payload of the opcode at `at` lies, after its length: one byte (`short`) or four."""
    if short:
        start = at + 2
        end = start + data[at + 1]
    else:
        start = at + 5
        end = start + (_INT4 if data[at] in b"\x8bT" else _LEN4)(data, at + 1)[0]  # LONG4, BINSTRING: signed
    if not start <= end <= size:
        raise ValueError(f"{_NAMES[data[at]]} at byte {at} claims bytes past the block's end")
    return start, end


def _line_int(data: bytes, at: int) -> tuple[int, int]:
    """The integer on the line after a protocol 0 opcode (PUT, GET), and where the line ends."""
    end = data.index(b"\n", at) + 1
    return int(data[at + 1 : end]), end


def _add_items(code: int, stack: list, marks: list, tally: _Keys, max_tree: int) -> bool:
    """Items APPEND(S), SETITEM(S) or ADDITEMS take off the stack and add to the container below them: only to a
    kind that takes them as data, its keys counted. True when the container's depth and size are now stale."""
    if code == 0x61:  # APPEND
        items = [stack.pop()]
    elif code == 0x73:  # SETITEM
        items = stack[-2:]
        del stack[-2:]
    else:  # the items since the last MARK (as _mark_items, without a call: SETITEMS is most of a record's walk)
        start = marks.pop()
        items = stack[start:]
        del stack[start:]
    target = stack[-1]
    if type(target) is not list:
        raise ValueError(f"{_NAMES[code]} adds to a constant")
    kind = target[KIND]
    if code == 0x75 or code == 0x73:  # SETITEMS, SETITEM
        if kind != DICT and kind != MAPPING and kind != USER:
            raise Refused("SETITEM on anything but a dict is not data (a list's slice assignment takes any iterable)")
        if len(items) % 2:
            raise ValueError(f"{_NAMES[code]} with a key and no value")
        keys = items[0::2]
        for key in keys:
            if type(key) is not bytes:  # str keys' hashes are randomized: nothing to count
                _hashed(target, keys, tally)
                break
    elif code == 0x90:  # ADDITEMS
        if kind != SET and kind != USER:
            raise Refused("ADDITEMS on anything but a set is not data")
        _hashed(target, items, tally)
    elif kind != LIST and kind != DEQUE and kind != USER:
        raise Refused(f"{_NAMES[code]} on anything but a list is not data")
    return bool(items) and _nest(target, items, max_tree)


def _called(function: Any, args: list, tally: _Keys, max_tree: int, nodes: list, classes_only: bool) -> Any:
    """What REDUCE, NEWOBJ, OBJ or INST makes: only an allowed global is called (by NEWOBJ, only a class)."""
    if type(function) is not list or function[KIND] != GLOBAL:
        raise ValueError("a call of something that is no global")
    if classes_only and function[MAKES] not in _CLASSES:
        raise ValueError("NEWOBJ of something that is no class")
    made = _call(function[MAKES], args, tally, max_tree)
    if type(made) is list:
        nodes.append(made)
    return made


def _put(memo: list, filled: int, index: int, value: Any) -> int:
    """Memo entry `index` set to `value`; what `filled` becomes (it counts entries set, as the C unpickler's)."""
    if index >= len(memo):
        memo.extend([ABSENT] * (index + 1 - len(memo)))
    if memo[index] is ABSENT:
        filled += 1
    memo[index] = value
    return filled
