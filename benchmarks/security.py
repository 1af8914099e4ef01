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

Then the signed path beside the one it replaced (issue 45): over the same signed datasets, the check of a pass's
windows as it is (each block's SHA-256 against the digests its shard's seal binds) and as it was (each block's
HMAC-SHA256 under the user's key, cut to 16 bytes: the earlier `keys.SigningKey.sign`, copied here), alone and
in the copied pass; and a shard's open with its seal checked (the user's secret key, or an Ed25519 key) against
the same open with the seal check taken out (what an open cost before: a key id compared).

    python benchmarks/security.py --only signed   # the last table only
"""

from __future__ import annotations

import bisect
import gc
import hashlib
import hmac
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


def copied_pass(ds: ar.AtlasDataset, off: str | None = None, check=None) -> int:
    """A local pass's work, as blocks.BlockLoader does it per 512 KiB window, with protection `off` removed;
    `check(shard, first, raws)`: a window's check in place of the product's (True: it passed)."""
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
            if check is not None:
                if not check(shard, first, raws):
                    raise AssertionError("a block does not match")
            elif off != "checksum" and loader._first_unchecked(shard, first, raws) is not None:
                raise AssertionError("a block does not match")
            if off == "sizes":
                datas = list(shard.decoder._decompressor().multi_decompress_to_buffer(raws, threads=1))
            else:
                datas = shard.decoder.decompress_many(raws, checked=bool(shard.decoder.declared_sizes(raws)))
            signed = shard.signer is not None or off == "walk"
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


class EarlierSignatures:
    """The check the signed path made before issue 45, copied: every block's HMAC-SHA256 under the user's key, cut
    to 16 bytes, from the key's inner and outer states computed once (as keys.SigningKey.sign did), compared with
    the window's recorded ones at once. The recorded ones are made here, from the blocks."""

    def __init__(self, ds: ar.AtlasDataset, secret: bytes) -> None:
        padded = secret.ljust(64, b"\0")
        self.inner = hashlib.sha256(bytes(b ^ 0x36 for b in padded))
        self.outer = hashlib.sha256(bytes(b ^ 0x5C for b in padded))
        self.macs: dict[str, bytes] = {}
        for position in range(len(ds.shards)):
            shard = ds.table.state(position)
            bounds = shard.bounds.tolist()
            body = ds.store.read_range(ByteRange(shard.data_file, 0, bounds[-1]), "block")
            self.macs[shard.name] = b"".join(self.sign(body[a:b]) for a, b in zip(bounds, bounds[1:]))

    def sign(self, raw) -> bytes:
        inner = self.inner.copy()
        inner.update(raw)
        outer = self.outer.copy()
        outer.update(inner.digest())
        return outer.digest()[:16]

    def __call__(self, shard, first: int, raws: list) -> bool:
        recorded = self.macs[shard.name][first * 16 : (first + len(raws)) * 16]
        return hmac.compare_digest(b"".join(map(self.sign, raws)), recorded)


def windows(ds: ar.AtlasDataset) -> list:
    """(shard, first block, its blocks' bytes) of every 512 KiB window of a pass, read once."""
    out = []
    for position in range(len(ds.shards)):
        shard = ds.table.state(position)
        bounds = shard.bounds.tolist()
        body = ds.store.read_range(ByteRange(shard.data_file, 0, bounds[-1]), "block")
        first = 0
        while first < len(bounds) - 1:
            stop = min(max(first + 1, bisect.bisect_right(bounds, bounds[first] + (512 << 10)) - 1), len(bounds) - 1)
            out.append(
                (
                    shard,
                    first,
                    [memoryview(body)[a:b] for a, b in zip(bounds[first:stop], bounds[first + 1 : stop + 1])],
                )
            )
            first = stop
    return out


def opens(path: str, rounds: int = 40) -> float:
    """Process CPU seconds to open a dataset and every one of its shards (best of rounds)."""
    best = float("inf")
    for _ in range(rounds):
        start = time.process_time()
        ds = ar.open(path)
        for shard in ds.shards:
            ds.table.open(shard)
        best = min(best, time.process_time() - start)
    return best


def signed_path(tmp: str) -> None:
    """The third table: the signed path's cost beside the one it replaced."""
    import reader
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey  # noqa: F401 (imported now)

    from atlas_remote.read import shard_fetch, shards

    os.environ.setdefault("ATLAS_REMOTE_KEY", secrets.token_hex(32))
    secret = bytes.fromhex(os.environ["ATLAS_REMOTE_KEY"])
    print()
    print(
        "| examples | blocks | a window's check, before: HMACs | now: SHA-256s | now ÷ before | copied pass, now ÷ before "
        "| open with its seal ÷ without: secret key | Ed25519 | a shard's open without its seal | its seal checked: "
        "secret key | Ed25519 |"
    )
    print("| --- " * 11 + "|")
    for label, examples, words in reader.SIZES:
        path = f"{tmp}/{label.strip('~ ')}-signed"
        reader.write(path, examples // 4, words, "yours")
        public = f"{tmp}/{label.strip('~ ')}-ed25519"
        os.environ["ATLAS_REMOTE_PRIVATE_KEY"] = secrets.token_hex(32)
        try:
            reader.write(public, examples // 4, words, "yours")
            ds = ar.open(path)
            earlier, pieces = EarlierSignatures(ds, secret), windows(ds)
            blocks = sum(len(raws) for _, _, raws in pieces)
            assert all(earlier(*piece) for piece in pieces)
            now = lambda: all(loader._first_unchecked(*piece) is None for piece in pieces)
            before = lambda: all(earlier(*piece) for piece in pieces)
            checks = reader.best(15, {"before": lambda: reader.clocks(before), "now": lambda: reader.clocks(now)})
            passes = reader.best(
                7,
                {
                    "before": lambda: reader.clocks(lambda: copied_pass(ds, check=earlier)),
                    "now": lambda: reader.clocks(lambda: copied_pass(ds)),
                },
            )
            sealed, seal_cost, bare = {}, {}, 0.0
            for name, where in (("secret", path), ("ed25519", public)):
                shards.signer_of = shard_fetch.signer_of
                with_seal = opens(where)
                assert all(shard.signed for shard in _opened(where))
                shards.signer_of = lambda *args: None
                without = opens(where)
                shards.signer_of = shard_fetch.signer_of
                sealed[name] = with_seal / without
                bare = max(bare, without / len(ds.shards))
                seal_cost[name] = _seal_check(where)
        finally:
            os.environ.pop("ATLAS_REMOTE_PRIVATE_KEY", None)
            shards.signer_of = shard_fetch.signer_of
        cpu_before, cpu_now = checks["before"][1], checks["now"][1]
        print(
            f"| {label} | {blocks:,} | {cpu_before / blocks * 1e6:.2f} µs a block | {cpu_now / blocks * 1e6:.2f} µs "
            f"| {cpu_now / cpu_before:.2f} | {passes['now'][1] / passes['before'][1]:.2f} | {sealed['secret']:.2f} "
            f"| {sealed['ed25519']:.2f} | {bare * 1e6:.0f} µs | {seal_cost['secret'] * 1e6:.0f} µs "
            f"| {seal_cost['ed25519'] * 1e6:.0f} µs |"
        )


def _opened(path: str) -> list:
    ds = ar.open(path)
    for shard in ds.shards:
        ds.table.open(shard)
    return list(ds.shards)


def _seal_check(path: str, calls: int = 200) -> float:
    """Process CPU seconds of one shard's seal check (shard_fetch.signer_of), best of five rounds."""
    from atlas_remote.read.shard_fetch import signer_of

    ds = ar.open(path)
    opened = ds.table.open(ds.shards[0])
    row = ds.manifest.entry(ds.shards[0].number)
    args = (ds.table.trust, ds.manifest, row, 0, opened.meta, opened.offsets, opened.sums, opened.decoder, "")
    best = float("inf")
    for _ in range(5):
        start = time.process_time()
        for _ in range(calls):
            assert signer_of(*args) is not None
        best = min(best, (time.process_time() - start) / calls)
    return best


if __name__ == "__main__":
    only_signed = sys.argv[1:] == ["--only", "signed"]
    if not only_signed:
        main()
    with tempfile.TemporaryDirectory(prefix="atlas-security-") as folder:
        if not only_signed:
            protections(folder)
        signed_path(folder)
