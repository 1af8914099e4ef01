"""What decoded values hold in memory: the measure the memory cache bounds blocks by."""

from __future__ import annotations

import gc
import sys
import types
from typing import Any

NOT_DATA = (type, types.ModuleType, types.FunctionType, types.BuiltinFunctionType, types.MethodType, types.CodeType)


def held_in_memory(examples: list) -> int:
    """The bytes of every object reachable from a block's examples, each counted once at sys.getsizeof (classes,
    modules and functions they refer to are not theirs; a torch tensor's storage is not seen: see HeldBytes).
    Walked a level at a time with C-level calls (map, zip, set operations), not object by object; each level
    costs what it holds (what was seen is looked up, never walked again: a list nested 40,000 deep took 10 s)."""
    seen: set[int] = set()
    level: list[Any] = [examples]
    total = 0
    while level:
        fresh = dict(zip(map(id, level), level))
        new = fresh.keys() - seen if len(seen) < len(fresh) else set(fresh).difference(seen)
        seen.update(new)
        objects = list(map(fresh.__getitem__, new))
        not_data = {kind for kind in set(map(type, objects)) if issubclass(kind, NOT_DATA)}  # a few kinds a level
        if not_data:
            objects = [obj for obj in objects if type(obj) not in not_data]
        total += sum(map(sys.getsizeof, objects))
        level = gc.get_referents(*objects)
    return total


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
