"""What the unpickler's safeguards cost, and how close the memory cache's count is to what blocks hold.

    python benchmarks/security.py      # prints the tables docs/security.md quotes

Every figure is a ratio of two things measured side by side in this one run, on blocks of 64 examples of
several shapes (text records of about 200 B and 2 KB, the shapes the cache's count is hardest on):

- decode: the restricted unpickler (what a reader runs: the bound on what opcodes build, the wrappers' checks)
  and the opcode walk (what refusing a block costs when the bound does not clear it) against plain
  `pickle.loads` of the same block, best of several rounds;
- cache: what counting what blocks hold adds to unpickling them (a sample of one block in 32 measured object
  by object, amortized), and what a block that is counted (not measured) is counted at, against what its
  examples hold by tracemalloc, at the ratio learnt from the block measured before it.
"""

from __future__ import annotations

import gc
import pickle
import sys
import time
import tracemalloc
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from atlas_remote.cache import HeldBytes
from atlas_remote.codec import BlockDecoder, PicklePolicy
from atlas_remote.unpickler import opcode_charges

SHAPES = {
    "text, ~200 B": lambda i: {"id": i, "text": f"{i} " + "word " * 38, "label": i % 10},
    "text, ~2 KB": lambda i: {"id": i, "text": f"{i} " + "word " * 400, "label": i % 10},
    "7-character strings": lambda i: [f"{i:04d}{j:03d}" for j in range(20)],
    "ints": lambda i: [i * 1000 + j + 300 for j in range(50)],
    "floats": lambda i: [i + j / 7 for j in range(20)],
    "nested dicts": lambda i: {"a": {"b": {"c": i, "d": [i, -i]}, "e": {}}, "f": str(i)},
}
BLOCK = 64


def block(shape: str, number: int) -> bytes:
    return pickle.dumps([SHAPES[shape](number * BLOCK + i) for i in range(BLOCK)], protocol=pickle.DEFAULT_PROTOCOL)


def side_by_side(fns: list, data: bytes, rounds: int = 25, calls: int = 50) -> list[float]:
    """Best CPU seconds a call of each function (process time: a shared machine's waits are not counted), timed
    in turns."""
    best = [float("inf")] * len(fns)
    for _ in range(rounds):
        for n, fn in enumerate(fns):
            start = time.process_time()
            for _ in range(calls):
                fn(data)
            best[n] = min(best[n], (time.process_time() - start) / calls)
    return best


def held(data: bytes) -> tuple[list, int]:
    gc.collect()
    tracemalloc.start()
    value = pickle.loads(data)
    gc.collect()
    size = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    return value, size


def main() -> None:
    policy = PicklePolicy()
    columns = ["restricted ÷ pickle.loads", "walk ÷ pickle.loads", "counting ÷ restricted", "counted ÷ held"]
    print("| block of 64 | bytes | " + " | ".join(columns) + " |")
    print("| --- " * (len(columns) + 2) + "|")
    for shape in SHAPES:
        first, second = block(shape, 0), block(shape, 1)
        decoder = BlockDecoder(False, None, policy)
        fns = [pickle.loads, policy.loads, lambda d: opcode_charges(d, 1 << 40), decoder.unpickle_sized]
        plain, restricted, walk, counting = side_by_side(fns, second)
        count = HeldBytes()
        count.of(pickle.loads(first), len(first))  # the first block is measured: it sets the ratio
        value, in_memory = held(second)
        counted = count.of(value, len(second))  # the second is counted at that ratio
        figures = [restricted / plain, walk / plain, counting / restricted]
        print(
            f"| {shape} | {len(second):,} | " + " | ".join(f"{f:.2f}" for f in figures) + " | "
            f"{counted / in_memory:.2f} ({counted:,} ÷ {in_memory:,}) |"
        )


if __name__ == "__main__":
    main()
