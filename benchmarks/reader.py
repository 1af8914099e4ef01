"""The reader's rows of docs/benchmarks.md (issue 38: safe at full speed), measured side by side in one run:

    python benchmarks/run.py --only reader   # these rows only, put in place of theirs in docs/benchmarks.md

Every dataset is written here at ~170 B and ~2 KB an example (text, an id and a label), blocks of 32, shards of
20,000, shared dictionary, three ways: by the user (signed with the user's key: the common case, and the figure),
by a stranger (signed with another key: its blocks are walked before loading) and as the original implementation
writes (`checksums=False`: the original's files only, unsigned, no CRC-32s). The user's key is the process's
`ATLAS_REMOTE_KEY` (one is made up for the run if it has none, so that nothing is written to ~/.config).

- pass ÷ bound: a whole `for x in ds` against one thread doing nothing but zstd and `pickle.loads` of blocks
  already in memory (run.decoding_all), alternated, best of each; wall time (the figure) and process CPU time
  (the detail: what a machine shared with other work still measures);
- random `ds[i]` (1 MiB cache) against a reader in the original's manner (tests/spec_reader.py), same indices;
- 256 random blocks in one `get_many` at 20 ms a request against one block per round trip (tests/static_server.py
  adding the latency: nginx is not needed);
- a remote pass's process CPU time (the HTTP client's work included) against a local pass's.
"""

from __future__ import annotations

import contextlib
import os
import random
import secrets
import time
from collections.abc import Callable, Iterator

from spec_reader import SpecReader
from static_server import serve

import atlas_remote as ar
from atlas_remote import CompressionStrategy

LATENCY = 0.020
SIZES = (("~170 B", 200_000, (15, 24)), ("~2 KB", 40_000, (250, 350)))
KINDS = ("yours", "a stranger's", "the original's")


@contextlib.contextmanager
def key(value: str | None) -> Iterator[None]:
    """ATLAS_REMOTE_KEY set to value (or unset) for what runs inside."""
    before = os.environ.get("ATLAS_REMOTE_KEY")
    if value is None:
        os.environ.pop("ATLAS_REMOTE_KEY", None)
    else:
        os.environ["ATLAS_REMOTE_KEY"] = value
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("ATLAS_REMOTE_KEY", None)
        else:
            os.environ["ATLAS_REMOTE_KEY"] = before


def write(path: str, examples: int, words: tuple[int, int], kind: str) -> None:
    from run import WORDS

    rng = random.Random(0)
    stranger = secrets.token_hex(32) if kind == "a stranger's" else os.environ["ATLAS_REMOTE_KEY"]
    with key(stranger):
        with ar.AtlasDatasetWriter(
            path,
            20_000,
            32,
            CompressionStrategy.SHARED_DICTIONARY_COMPRESSION,
            checksums=kind != "the original's",
        ) as w:
            for i in range(examples):
                text = " ".join(rng.choice(WORDS) for _ in range(rng.randint(*words)))
                w.add_example({"id": i, "text": text, "label": rng.randrange(10)})


def clocks(fn: Callable[[], object]) -> tuple[float, float]:
    """(wall seconds, process CPU seconds) of one call."""
    wall, cpu = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - wall, time.process_time() - cpu


def a_pass(url: str) -> tuple[float, float]:
    ds = ar.open(url)
    return clocks(lambda: sum(1 for _ in ds))


def bound(path: str) -> tuple[float, float]:
    """The decode bound (run.decoding_all: zstd and pickle.loads of every block, read before), on both clocks."""
    from run import decoding_all

    return clocks(decoding_all(path))


def best(runs: int, named: dict[str, Callable[[], tuple[float, float]]]) -> dict[str, tuple[float, float]]:
    """Each measure's best wall and best CPU time over runs, the measures taken in turns."""
    out = {name: (float("inf"), float("inf")) for name in named}
    for _ in range(runs):
        for name, fn in named.items():
            wall, cpu = fn()
            out[name] = (min(out[name][0], wall), min(out[name][1], cpu))
    return out


def rows(tmp: str, scale: float) -> list:
    os.environ.setdefault("ATLAS_REMOTE_KEY", secrets.token_hex(32))
    out = []
    made: dict[str, dict[str, str]] = {}
    for label, examples, words in SIZES:
        n = int(examples * scale)
        paths = made[label] = {kind: f"{tmp}/{label.strip('~ ')}-{number}" for number, kind in enumerate(KINDS)}
        for kind, path in paths.items():
            write(path, n, words, kind)
        times = best(
            3, {"bound": lambda: bound(paths["yours"]), **{k: (lambda p=p: a_pass(p)) for k, p in paths.items()}}
        )
        wall, cpu = times["bound"]
        others = "; ".join(
            f"{kind}: {wall / times[kind][0]:.2f} (CPU {cpu / times[kind][1]:.2f})" for kind in KINDS[1:]
        )
        out.append(
            (
                f"local sequential pass ÷ decode bound, {label} examples (yours: signed with your key)",
                "≥ 0.9 (floor 0.8)" if label == "~2 KB" else "≥ 0.7 (floor 0.6)",
                wall / times["yours"][0],
                f"{n / times['yours'][0]:,.0f} vs {n / wall:,.0f} examples/s; process CPU "
                f"{cpu / times['yours'][1]:.2f}; {others}",
            )
        )
    for label, paths in made.items():
        out.append(random_row(label, paths["yours"], scale))
    out += remote_rows(tmp, made["~2 KB"]["yours"], scale)
    return out


def random_row(label: str, path: str, scale: float) -> tuple:
    rng = random.Random(2)
    ds, spec = ar.open(path, cache_bytes=1 << 20), SpecReader(path)
    idx = [rng.randrange(len(ds)) for _ in range(int(20_000 * scale))]
    times = best(
        3,
        {"spec": lambda: clocks(lambda: [spec[i] for i in idx]), "ours": lambda: clocks(lambda: [ds[i] for i in idx])},
    )
    return (
        f"local random `ds[i]`, 1 MiB cache ÷ a reader in the original's manner, {label} examples",
        "≥ 0.8 (floor 0.7)",
        times["spec"][0] / times["ours"][0],
        f"{len(idx) / times['ours'][0]:,.0f} vs {len(idx) / times['spec'][0]:,.0f} examples/s; process CPU "
        f"{times['spec'][1] / times['ours'][1]:.2f}",
    )


def remote_rows(tmp: str, path: str, scale: float) -> list:
    folder, name = os.path.split(path)
    with serve(folder, latency=LATENCY) as base:
        url = f"{base}/{name}"
        ds = ar.open(url, cache_bytes=0)
        ds.get_many([shard.start for shard in ds.shards])  # every shard opened first
        rng = random.Random(4)
        blocks = {ds.locate(rng.randrange(len(ds)))[0]: None for _ in range(2000)}
        firsts = [ds.shards[p].start + b * ds.shards[p].meta.block_size for p, b in blocks]
        firsts, singles = firsts[:-16][:256], firsts[-16:]  # distinct blocks, none read before
        batch_wall, _ = clocks(lambda: ds.get_many(firsts))
        single_wall, _ = clocks(lambda: [ds[i] for i in singles])
        speedup = (len(firsts) / batch_wall) / (len(singles) / single_wall)
        times = best(3, {"local": lambda: a_pass(path), "remote": lambda: a_pass(url)})
    return [
        (
            f"256 random blocks in one batch at {LATENCY * 1000:.0f} ms ÷ one block per round trip",
            "≥ 10×",
            speedup,
            f"{len(firsts) / batch_wall:,.0f} vs {len(singles) / single_wall:,.0f} blocks/s (~2 KB examples)",
        ),
        (
            "remote sequential pass: client process CPU ÷ local pass CPU",
            "≤ 1.2 (floor 1.3)",
            times["remote"][1] / times["local"][1],
            f"{times['remote'][1]:.2f} vs {times['local'][1]:.2f} CPU-seconds (~2 KB examples; aiohttp server in "
            f"another process, {LATENCY * 1000:.0f} ms a request); wall {times['remote'][0]:.2f} vs "
            f"{times['local'][0]:.2f} s",
        ),
    ]
