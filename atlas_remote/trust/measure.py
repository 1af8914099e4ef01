"""What decoded values hold in memory, and what they expand to when a consumer walks them: one walk, two counts.

`held_in_memory` counts each object once (what the memory cache bounds blocks by); `expanded` counts a shared
object each time it is reached, as a consumer that copies what it walks (JSON, Arrow, a batch, a page) does:
one block of 100 references to one 8 MiB string holds 8 MiB and expands to 800 MiB.
"""

from __future__ import annotations

import gc
import sys
import types
from itertools import chain
from operator import length_hint
from typing import Any, NamedTuple

import numpy as np

NOT_DATA = (type, types.ModuleType, types.FunctionType, types.BuiltinFunctionType, types.MethodType, types.CodeType)
UNBOUNDED = sys.maxsize


class Expanse(NamedTuple):
    """What a walk of a value reached: `bytes`, `depth` in levels of references (a value that
    refers to nothing is 1 deep, a list of numbers 2); `whole` is False when the walk stopped past its limits (the
    figures are then what it had reached)."""

    bytes: int
    depth: int
    whole: bool


SKIP, MAPPING, ARRAY, TENSOR = 1, 2, 4, 8  # what a kind of object is to the walk
_KINDS: dict[type, int] = {}
REFERENCE = 16  # what `expanded` counts each object reached at, beside its length (chars, bytes, items)


def _kind(kind: type) -> int:
    found = _KINDS.get(kind)
    if found is None:
        tensor = kind.__module__.startswith("torch") and kind.__name__ in ("Tensor", "Parameter")
        found = _KINDS[kind] = (
            SKIP * issubclass(kind, NOT_DATA)
            + MAPPING * issubclass(kind, dict)
            + ARRAY * issubclass(kind, np.ndarray)
            + TENSOR * tensor
        )
    return found


def _walk(value: Any, once: bool, limit: int, most_depth: int) -> Expanse:
    """Walked a level at a time with C-level calls (map, gc.get_referents, set operations), not object by object:
    each level costs what it holds (a list nested 40,000 deep once took 10 s when each level re-walked what was
    seen). A dict's keys and values are taken from it (its traversal skips str keys). Counted once (`once`): each
    object at sys.getsizeof, a numpy view with the data it shows (an array unpickled from protocol 3 or 4 is a view
    of the block's bytes). Counted as reached: each object at REFERENCE bytes plus its length (a str's characters,
    a bytes' bytes, a container's items: what a copy of it takes), an array or tensor at its data's bytes; about
    three times cheaper than sys.getsizeof. Stops past `limit` bytes or `most_depth` levels, before the next level
    is made."""
    seen: set[int] = set()
    level: list[Any] = [value]
    total = depth = 0
    while level:
        if depth == most_depth:
            return Expanse(total, depth + 1, False)
        depth += 1
        if once:
            fresh = dict(zip(map(id, level), level))
            new = fresh.keys() - seen if len(seen) < len(fresh) else set(fresh).difference(seen)
            seen.update(new)
            level = list(map(fresh.__getitem__, new))
        kinds = set(map(type, level))  # a few kinds a level
        flags = 0
        for kind in kinds:
            flags |= _KINDS.get(kind) or _kind(kind)
        if flags & SKIP:
            level = [obj for obj in level if not _kind(type(obj)) & SKIP]
        if once:
            total += sum(map(sys.getsizeof, level))
            if flags & ARRAY:  # a view's size leaves out the data it shows
                total += sum(a.nbytes for a in level if isinstance(a, np.ndarray) and not a.flags.owndata)
        else:
            total += sum(map(length_hint, level)) + REFERENCE * len(level)
            if flags & (ARRAY | TENSOR):
                total += sum(map(_data_bytes, level))
        if total > limit:
            return Expanse(total, depth, False)
        if not flags & MAPPING:
            level = gc.get_referents(*level)
            continue
        mappings = [obj for obj in level if isinstance(obj, dict)] if len(kinds) > 1 else level
        below = [*chain.from_iterable(mappings), *chain.from_iterable(map(dict.values, mappings))]
        if len(kinds) > 1:
            below += gc.get_referents(*[obj for obj in level if not isinstance(obj, dict)])
        level = below
    return Expanse(total, depth, True)


def _data_bytes(obj: Any) -> int:
    if isinstance(obj, np.ndarray):
        return obj.nbytes
    if _kind(type(obj)) & TENSOR:
        return int(obj.nelement() * obj.element_size())
    return 0


def held_in_memory(examples: list) -> int:
    """The bytes of every object reachable from a block's examples, each counted once at sys.getsizeof (classes,
    modules and functions they refer to are not theirs; a torch tensor's storage is not seen: see HeldBytes)."""
    return _walk(examples, True, UNBOUNDED, UNBOUNDED).bytes


def expanded(value: Any, limit: int = UNBOUNDED, most_depth: int = UNBOUNDED) -> Expanse:
    """What a consumer that copies all it walks makes of `value` (JSON, Arrow, a page, a batch): every object
    reached, a shared one each time it is reached, at REFERENCE bytes plus its length; stopped past `limit` bytes
    or `most_depth` levels."""
    return _walk(value, False, limit, most_depth)


class HeldBytes:
    """What decoded blocks hold in memory, for the memory cache's bound. Counting every object of every block
    would cost several times what unpickling it does, and a pickle's bytes alone say little (a 7-character string
    takes 10 bytes in a block and 56 in memory, an int in a list 3 and 36). So the first block, and every
    MEASURE_EVERY-th after it, is measured: SAMPLE of its examples, spread across it, object by object
    (held_in_memory), scaled to all of them. The others are counted at the largest ratio of memory to
    decompressed bytes measured so far, and never below their decompressed size."""

    MEASURE_EVERY = 32
    SAMPLE = 8

    def __init__(self) -> None:
        self.ratio = 0.0
        self.blocks = 0

    def of(self, examples: list, size: int) -> int:
        """The bytes a block of `size` decompressed bytes holds once unpickled into `examples`."""
        self.blocks += 1
        if self.ratio and self.blocks % self.MEASURE_EVERY:
            return int(size * self.ratio)
        sample = examples[:: max(1, len(examples) // self.SAMPLE)]
        scaled = held_in_memory(sample) * len(examples) // max(len(sample), 1)
        held = max(sys.getsizeof(examples) + scaled, size)
        self.ratio = max(self.ratio, held / max(size, 1))
        return held
