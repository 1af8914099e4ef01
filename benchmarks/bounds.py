"""What the bounds of issue 45 (round 3) cost a normal workload: each figure is the process CPU time of a workload
with the bound ÷ the same workload with it taken out, measured side by side in this one run (alternating, best of
several rounds), on examples of about 200 B and 2 KB. 1.00: it costs nothing.

    python benchmarks/bounds.py            # prints the table docs/security.md quotes
    python benchmarks/bounds.py --quick    # fewer examples and rounds, for a look

A bound is taken out by replacing its function for the "without" run (the measure of what an example expands to,
the call budget's declared sizes, collate's size check, the Parquet importer's dictionary count, the Arrow IPC
walk), never by an option of the product. Datasets are local, written with your key (signed: "yours") or a
stranger's ("a stranger's"), examples {"id", "text", "tokens" (int32), "lang" (one of 4)}, of about 200 B or 2 KB
pickled.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

import atlas_remote as ar
from atlas_remote.cli.output import example_line
from atlas_remote.importers import arrow as arrow_importer
from atlas_remote.importers import parquet as parquet_importer
from atlas_remote.read import expansion, export
from atlas_remote.training import collate
from atlas_remote.viewer import pages
from atlas_remote.viewer.pages import DatasetView

WORDS = ["alpha", "beta", "gamma", "delta", "epsilon", "token", "shard", "block", "remote", "bucket"]
LANGS = ["en", "fr", "de", "es"]


def example(i: int, chars: int) -> dict:
    rng = np.random.default_rng(i)
    words = " ".join(WORDS[int(k)] for k in rng.integers(0, len(WORDS), chars // 10))  # about 0.6 chars
    tokens = rng.integers(0, 50_000, int(rng.integers(chars // 80, chars // 16)), dtype=np.int32)  # 0.3 chars
    return {"id": i, "text": words, "tokens": tokens, "lang": LANGS[i % 4]}


def label(chars: int) -> str:
    """The examples' mean pickled size."""
    import pickle

    return f"~{sum(len(pickle.dumps(example(i, chars))) for i in range(200)) / 200:,.0f} B"


def write(url: str, n: int, chars: int, stranger: bool) -> str:
    from helpers import as_stranger

    with as_stranger() if stranger else contextlib.nullcontext():
        with ar.AtlasDatasetWriter(url, 10_000, 64) as writer:
            for i in range(n):
                writer.add_example(example(i, chars))
    return url


def cpu(run: Callable[[], object], clock: Callable[[], float] = time.process_time) -> float:
    start = clock()
    run()
    return clock() - start


@contextlib.contextmanager
def replaced(module: object, name: str, value: object) -> Iterator[None]:
    before = getattr(module, name)
    setattr(module, name, value)
    try:
        yield
    finally:
        setattr(module, name, before)


def side_by_side(
    with_bound: Callable[[], object], without: Callable[[], object], rounds: int, clock=time.process_time
) -> float:
    """Best CPU time (or `clock`'s) with the bound ÷ best without, alternating."""
    best_with = best_without = float("inf")
    for _ in range(rounds):
        best_with = min(best_with, cpu(with_bound, clock))
        best_without = min(best_without, cpu(without, clock))
    return best_with / best_without


def no_sizes(ds, key, first, values, most_depth=0):  # expansion.sizes taken out
    return [0] * len(values)


def get_many_unbudgeted(ds: ar.AtlasDataset, indices: list[int]) -> list:
    """AtlasDataset.get_many before the call budget (what it did, step by step)."""
    table = ds.table
    table.open_many(table.shards[p] for p in {table.position_of(i) for i in indices})
    located = [table.locate(i) for i in indices]
    blocks = ds.blocks.get([key for key, _ in located])
    return [blocks[key][slot] for key, slot in located]


def workloads(folder: str, n: int, chars: int, rounds: int) -> list[tuple[str, str, float]]:
    own = ar.open(write(f"{folder}/own-{chars}", n, chars, False), cache_bytes=0)
    theirs = ar.open(write(f"{folder}/theirs-{chars}", n, chars, True), cache_bytes=0)
    rng = np.random.default_rng(1)
    batches = [rng.integers(0, n, 256).tolist() for _ in range(8)]
    rows: list[tuple[str, str, float]] = []

    def batch_reads(ds):
        return lambda: [ds.get_many(b) for b in batches], lambda: [get_many_unbudgeted(ds, b) for b in batches]

    rows.append(("random batches of 256 (`get_many`), yours: the call budget", *batch_reads(own)))
    for name, ds in (("yours", own), ("a stranger's", theirs)):
        exporting = (lambda d=ds: d.to_arrow(), lambda d=ds: _without(export, "sizes", no_sizes, d.to_arrow))
        rows.append((f"`to_arrow`, {name}: each block's examples measured", *exporting))
    lines = (
        lambda: [example_line(i, x, True) for i, x in zip(range(n), expansion.checked_range(theirs, 0, n))],
        lambda: [example_line(i, x, True) for i, x in zip(range(n), theirs.iter(0, n))],
    )
    rows.append(("`cat --json`, a stranger's: each block's examples measured", *lines))
    view = DatasetView(theirs)
    page = (
        lambda: [view.page(s, 20) for s in range(0, min(n, 2000), 20)],
        lambda: _without(
            pages,
            "checked",
            lambda ds, i, v, *a, **k: v,
            lambda: [view.page(s, 20) for s in range(0, min(n, 2000), 20)],
        ),
    )
    rows.append(("viewer pages of 20, a stranger's: measured, and the page's budget", *page))
    examples = [example(i, chars) for i in range(256)]
    collating = (
        lambda: [collate.collate_numpy(examples) for _ in range(20)],
        lambda: _without(
            collate, "_within", lambda *a, **k: None, lambda: [collate.collate_numpy(examples) for _ in range(20)]
        ),
    )
    rows.append(("`collate_numpy` of 256 (ragged tokens padded): the batch sized first", *collating))
    out = []
    for name, with_bound, without in rows:
        out.append((name, label(chars), side_by_side(with_bound, without, rounds)))
    out += importers(folder, n, chars, rounds)
    own.close()
    theirs.close()
    return out


def _without(module: object, name: str, value: object, run: Callable[[], object]) -> object:
    with replaced(module, name, value):
        return run()


def importers(folder: str, n: int, chars: int, rounds: int) -> list[tuple[str, str, float]]:
    import pyarrow as pa
    import pyarrow.feather as feather
    import pyarrow.parquet as pq

    rows = [example(i, chars) for i in range(n)]
    table = pa.table(
        {"id": [r["id"] for r in rows], "text": [r["text"] for r in rows], "lang": [r["lang"] for r in rows]}
    )
    parquet = f"{folder}/rows-{chars}.parquet"
    pq.write_table(table, parquet, compression="zstd")  # "lang" (and "text", where it repeats) dictionary-encoded
    feather_path = f"{folder}/rows-{chars}.feather"
    feather.write_feather(table, feather_path, compression="lz4")

    distinct = f"{folder}/distinct-{chars}.parquet"  # text of distinct strings: pyarrow's dictionary falls back
    rng = np.random.default_rng(0)
    texts = [rng.bytes(len(r["text"]) // 2).hex() for r in rows]
    pq.write_table(table.set_column(1, "text", pa.array(texts)), distinct, compression="zstd")

    def read_parquet(path: str = parquet) -> list:
        return list(parquet_importer.samples(path))

    def read_parquet_plain(path: str = parquet) -> list:
        with replaced(parquet_importer, "_dictionary_columns", lambda *a: []):
            with replaced(parquet_importer, "_decoded_bytes", lambda *a: 0):
                return read_parquet(path)

    def convert() -> None:
        ar.convert(parquet, f"{folder}/converted-{chars}", "parquet", overwrite=True, progress=False)

    def convert_plain() -> None:
        with replaced(parquet_importer, "_dictionary_columns", lambda *a: []):
            with replaced(parquet_importer, "_decoded_bytes", lambda *a: 0):
                convert()

    def read_feather() -> list:
        return list(arrow_importer.samples(feather_path))

    def read_feather_unchecked() -> list:
        with replaced(arrow_importer, "check", lambda *a: None):
            return read_feather()

    return [
        (
            "Parquet importer: each row group's dictionaries probed, values counted",
            label(chars),
            side_by_side(read_parquet, read_parquet_plain, rounds),
        ),
        (
            "the same, the text distinct strings (its dictionary fallen back to plain pages)",
            label(chars),
            side_by_side(lambda: read_parquet(distinct), lambda: read_parquet_plain(distinct), rounds),
        ),
        (
            "`convert --from parquet` of that file, end to end (wall time: its worker is a process)",
            label(chars),
            side_by_side(convert, convert_plain, rounds, time.perf_counter),
        ),
        (
            "Arrow importer (Feather, LZ4): the file's messages walked first",
            label(chars),
            side_by_side(read_feather, read_feather_unchecked, rounds),
        ),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    rounds = 3 if args.quick else 7
    sizes = {48: 5_000 if args.quick else 50_000, 2300: 1_000 if args.quick else 10_000}
    with tempfile.TemporaryDirectory(prefix="atlas-bounds-") as folder:
        results = []
        for chars, n in sizes.items():
            results += workloads(folder, n, chars, rounds)
    load = os.getloadavg()[0]
    print("| workload | examples | with ÷ without |\n| --- | --- | --- |")
    for name, size, ratio in results:
        print(f"| {name} | {size} | {ratio:.2f} |")
    print(f"\nload average at the end: {load:.1f} on {os.cpu_count()} cores; best of {rounds} rounds")


if __name__ == "__main__":
    main()
