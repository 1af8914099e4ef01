"""What the unpickler's safeguards cost, and how close the memory cache's count is to what blocks hold.

    python benchmarks/security.py      # prints the table docs/security.md quotes

Every figure is a ratio of two things measured side by side in this one run (process CPU time, best of several
rounds), on blocks of the shapes a reader decodes: 32 text records of about 170 B and 2 KB and 32 token arrays
(numpy uint16, 5 to 300 tokens: the language-model path), then 64 examples of the shapes the cache's count is
hardest on:

- unsigned: what a reader runs on a block not signed by its key (the walk of its opcodes, then the restricted
  unpickler), against plain `pickle.loads` of the same block; walk: the walk alone;
- signed: what a reader runs on a block its own key signed (the restricted unpickler, no walk);
- cache: what counting what blocks hold adds to unpickling them (a sample of one block in 32 measured object
  by object, amortized), and what a block that is counted (not measured) is counted at, against what its
  examples hold by tracemalloc, at the ratio learnt from the block measured before it.

Then a local pass with each protection turned off, one at a time, in a copy of the pass's code path made here
(`copied_pass`: what blocks.BlockLoader._fetch_window and examples_of do, on one thread), never an option of the
product: over datasets of ~170 B and ~2 KB examples written with your key (signed) and with a stranger's, each
figure the copy's process CPU time with everything on ÷ with that protection off (1.00: it costs nothing).
"""

from __future__ import annotations

import bisect
import gc
import os
import pickle
import secrets
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests"), str(ROOT / "benchmarks")]

import atlas_remote as ar
from atlas_remote.format.codec import BlockDecoder, PicklePolicy
from atlas_remote.read import blocks as loader
from atlas_remote.storage.ranges import ByteRange
from atlas_remote.trust import unpickler
from atlas_remote.trust.measure import HeldBytes
from atlas_remote.trust.unpickler import limit_for, walk

WORDS = ["alpha", "beta", "gamma", "delta", "epsilon", "token", "shard", "block"]


def text(i: int, chars: int) -> str:
    words = [WORDS[(i * 7 + j * 3) % len(WORDS)] for j in range(chars // 6)]
    return " ".join(words)


def tokens(i: int):
    import numpy as np

    return np.arange(5 + (i * 37) % 296, dtype=np.uint16)


SHAPES = {
    "32 records of ~170 B": lambda i: {"id": i, "text": text(i, 130), "label": i % 10},
    "32 records of ~2 KB": lambda i: {"id": i, "text": text(i, 1950), "label": i % 10},
    "32 token arrays": tokens,
    "text, ~200 B": lambda i: {"id": i, "text": f"{i} " + "word " * 38, "label": i % 10},
    "text, ~2 KB": lambda i: {"id": i, "text": f"{i} " + "word " * 400, "label": i % 10},
    "7-character strings": lambda i: [f"{i:04d}{j:03d}" for j in range(20)],
    "ints": lambda i: [i * 1000 + j + 300 for j in range(50)],
    "floats": lambda i: [i + j / 7 for j in range(20)],
    "nested dicts": lambda i: {"a": {"b": {"c": i, "d": [i, -i]}, "e": {}}, "f": str(i)},
}


def block(shape: str, number: int) -> bytes:
    size = 32 if shape.startswith("32 ") else 64
    return pickle.dumps([SHAPES[shape](number * size + i) for i in range(size)], protocol=pickle.DEFAULT_PROTOCOL)


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
    columns = ["unsigned ÷ pickle.loads", "walk ÷ pickle.loads", "signed ÷ pickle.loads", "counting ÷ signed"]
    print("| block | bytes | pickle.loads | " + " | ".join(columns) + " | counted ÷ held |")
    print("| --- " * (len(columns) + 4) + "|")
    for shape in SHAPES:
        first, second = block(shape, 0), block(shape, 1)
        decoder = BlockDecoder(False, None, policy)
        limit = limit_for(len(second), 1 << 30)
        fns = [
            pickle.loads,
            policy.loads,
            lambda d: walk(d, limit),
            lambda d: policy.loads(d, signed=True),
            lambda d: decoder.unpickle_sized(d, signed=True),
        ]
        plain, unsigned, walked, signed, counting = side_by_side(fns, second)
        figures = [unsigned / plain, walked / plain, signed / plain, counting / signed]
        if shape.startswith("32 "):
            held_figure = "-"
        else:
            count = HeldBytes()
            count.of(pickle.loads(first), len(first))  # the first block is measured: it sets the ratio
            value, in_memory = held(second)
            counted = count.of(value, len(second))  # the second is counted at that ratio
            held_figure = f"{counted / in_memory:.2f} ({counted:,} ÷ {in_memory:,})"
        print(
            f"| {shape} | {len(second):,} | {plain * 1e6:.1f} µs | "
            + " | ".join(f"{f:.2f}" for f in figures)
            + f" | {held_figure} |"
        )


PROTECTIONS = {
    "checksum": "signature (yours) or CRC-32 (a stranger's) of every block",
    "sizes": "declared sizes within max_block_bytes",
    "unpickler": "restricted unpickler (globals, wrappers, numpy checks)",
    "walk": "the walk of the opcodes (a stranger's blocks only)",
    "count": "examples counted against the layout",
}


def copied_pass(ds: ar.AtlasDataset, off: str | None = None) -> int:
    """A local pass's work, as blocks.BlockLoader does it per 512 KiB window, with protection `off` removed."""
    seen = 0
    for position in range(len(ds.shards)):
        shard = ds.table.state(position)
        bounds = shard.bounds.tolist()
        blocks_of = len(bounds) - 1
        first = 0
        while first < blocks_of:
            stop = max(first + 1, bisect.bisect_right(bounds, bounds[first] + (512 << 10)) - 1)
            stop = min(stop, blocks_of)
            offsets = bounds[first : stop + 1]
            body = ds.store.read_range(ByteRange(shard.data_file, offsets[0], offsets[-1]), "block")
            view, base = memoryview(body), offsets[0]
            raws = [view[a - base : b - base] for a, b in zip(offsets, offsets[1:])]
            if off != "checksum" and loader._first_unchecked(shard, first, raws) is not None:
                raise AssertionError("a block does not match")
            if off == "sizes":
                datas = list(shard.decoder._decompressor().multi_decompress_to_buffer(raws, threads=1))
            else:
                datas = shard.decoder.decompress_many(raws, checked=bool(shard.decoder.declared_sizes(raws)))
            signed = shard.key is not None or off == "walk"
            for block, data in enumerate(datas, first):
                if off == "unpickler":  # the walk kept for a stranger's blocks: only the globals' checks go
                    if not signed:
                        walk(bytes(data), limit_for(len(data), 1 << 30))
                    examples = pickle.loads(data)
                else:
                    examples = unpickler.load(shard.decoder.policy._unpickler, data, 1 << 30, signed)
                if off != "count" and len(examples) != shard.examples_in_block(block):
                    raise AssertionError("a block holds fewer examples")
                seen += len(examples)
            first = stop
    return seen


def protections(tmp: str) -> None:
    """The second table: each protection's cost in a pass, from a copy of the pass with it turned off."""
    import reader

    os.environ.setdefault("ATLAS_REMOTE_KEY", secrets.token_hex(32))
    print()
    print(
        "| examples | written by | copied pass ÷ pass | " + " | ".join(f"{v} off" for v in PROTECTIONS.values()) + " |"
    )
    print("| --- " * (len(PROTECTIONS) + 3) + "|")
    for label, examples, words in reader.SIZES:
        for kind in reader.KINDS[:2]:
            path = f"{tmp}/{label.strip('~ ')}-{kind[:3]}"
            reader.write(path, examples // 4, words, kind)
            ds = ar.open(path)
            named = {"pass": lambda: reader.a_pass(path), "on": lambda: reader.clocks(lambda: copied_pass(ds))}
            for name in PROTECTIONS:
                if name != "walk" or kind != "yours":
                    named[name] = lambda name=name: reader.clocks(lambda: copied_pass(ds, name))
            times = reader.best(7, named)
            on = times["on"][1]
            cells = [f"{on / times[name][1]:.2f}" if name in times else "-" for name in PROTECTIONS]
            print(f"| {label} | {kind} | {times['on'][1] / times['pass'][1]:.2f} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
    with tempfile.TemporaryDirectory(prefix="atlas-security-") as folder:
        protections(folder)
