"""Conversion throughput for each source format, one worker against two, measured side by side in one run.

    python benchmarks/convert.py [--quick]      # writes the "Conversion" section of docs/benchmarks.md

Each conversion runs in a fresh process (so its peak RSS is its own): examples/s, source MB/s, and the peak
RSS of the converting process and of its largest worker. Sources are generated locally, four inputs per format
(two stores for zarr), shards of 10,000 examples, blocks of 64, shared dictionary. JSON lines, Parquet and Arrow
hold the same kind of records (an id and 20-120 words), so their rows compare the readers; Parquet and Arrow
need the `parquet` extra. `benchmarks/convert_peers.py` puts the same conversion beside LitData and Streaming.
"""

from __future__ import annotations

import argparse
import gzip
import io
import json
import struct
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
REPORT = ROOT / "docs" / "benchmarks.md"
SECTION = "## Conversion"


def folder_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


WORDS = np.array(
    ["atlas", "remote", "shard", "block", "index", "bucket", "token", "epoch", "batch", "cache", "tensor", "sample"]
)


def words(rng: np.random.Generator, n: int) -> str:
    return " ".join(WORDS[rng.integers(0, len(WORDS), n)])


def make_jsonl(folder: Path, files: int, lines: int, rng: np.random.Generator) -> str:
    """`files` gzipped JSON-lines files of `lines` records {"id", "text"} (20-120 words); their glob."""
    folder.mkdir()
    for f in range(files):
        records = (json.dumps({"id": i, "text": words(rng, int(rng.integers(20, 120)))}) for i in range(lines))
        (folder / f"{f}.jsonl.gz").write_bytes(gzip.compress("\n".join(records).encode()))
    return str(folder / "*.jsonl.gz")


def make_tables(base: Path, files: int, rows: int, rng: np.random.Generator) -> None:
    """The same `files` × `rows` records {"id", "text"} (20-120 words) as Parquet files (row groups of 10,000) in
    base/parquet and as Arrow IPC files (record batches of 10,000) in base/arrow."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    (base / "parquet").mkdir()
    (base / "arrow").mkdir()
    for f in range(files):
        texts = [words(rng, int(rng.integers(20, 120))) for _ in range(rows)]
        table = pa.table({"id": pa.array(range(rows), pa.int64()), "text": pa.array(texts, pa.string())})
        pq.write_table(table, base / "parquet" / f"train-{f:05d}-of-{files:05d}.parquet", row_group_size=10_000)
        with pa.ipc.new_file(base / "arrow" / f"data-{f:05d}-of-{files:05d}.arrow", table.schema) as out:
            out.write_table(table, max_chunksize=10_000)


def write_section(heading: str, lines: list[str]) -> None:
    """Replace (or add) one `## ` section of docs/benchmarks.md, keeping the others."""
    text = REPORT.read_text() if REPORT.exists() else ""
    before, found, after = text.partition(heading + "\n")
    rest = after[after.find("\n## ") + 1 :] if found and "\n## " in after else ""
    head = before.rstrip() + "\n\n" if before.strip() else ""
    REPORT.write_text(head + "\n".join(lines).rstrip() + "\n" + ("\n" + rest if rest else ""))


def make_sources(base: Path, scale: int) -> dict[str, str]:
    rng = np.random.default_rng(0)
    text = lambda n: words(rng, n)
    make_jsonl(base / "jsonl", 4, scale, rng)
    make_tables(base, 4, scale, rng)
    (base / "wds").mkdir()
    for f in range(4):
        with tarfile.open(base / "wds" / f"train-{f:06d}.tar", "w") as tar:
            for i in range(scale // 4):
                for suffix, data in (("jpg", rng.bytes(1000)), ("cls", str(i % 10).encode())):
                    info = tarfile.TarInfo(f"s{f}{i:07d}.{suffix}")
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
    (base / "mega").mkdir()
    for f in range(4):
        lengths = rng.integers(50, 400, scale // 2)
        docs = np.concatenate([[0], np.arange(2, len(lengths), 2), [len(lengths)]])
        pointers = np.concatenate([[0], np.cumsum(lengths)[:-1]]) * 2
        with open(base / "mega" / f"c{f}.idx", "wb") as out:
            out.write(b"MMIDIDX\x00\x00" + struct.pack("<QBQQ", 1, 8, len(lengths), len(docs)))
            out.write(lengths.astype(np.int32).tobytes() + pointers.astype(np.int64).tobytes())
            out.write(docs.astype(np.int64).tobytes())
        rng.integers(0, 50000, int(lengths.sum())).astype(np.uint16).tofile(base / "mega" / f"c{f}.bin")
    for sub in ("documents", "attributes/tox", "attributes/lang"):
        (base / "dolma" / sub).mkdir(parents=True)
    for f in range(4):
        ids = [f"{f}-{i}" for i in range(scale // 2)]
        docs = (json.dumps({"id": d, "text": text(int(rng.integers(50, 200))), "source": "b"}) for d in ids)
        (base / "dolma" / "documents" / f"{f}.jsonl.gz").write_bytes(gzip.compress("\n".join(docs).encode()))
        for name in ("tox", "lang"):
            rows = (json.dumps({"id": d, "attributes": {name: 0.5}}) for d in ids)
            (base / "dolma" / "attributes" / name / f"{f}.jsonl.gz").write_bytes(
                gzip.compress("\n".join(rows).encode())
            )
    sys.path.insert(0, str(ROOT / "tests"))
    from test_importers import make_zarr  # an L5Kit-shaped store with L5Kit's dtypes

    for f in range(2):
        make_zarr(base / f"scenes{f}.zarr", frames_per_scene=[scale // 40] * 10, chunks=(10, 1000, 5000, 2000))
    return {
        "jsonl": str(base / "jsonl" / "*.jsonl.gz"),
        "parquet": str(base / "parquet"),
        "arrow": str(base / "arrow" / "*.arrow"),
        "webdataset": str(base / "wds" / "*.tar"),
        "megatron": str(base / "mega" / "*.idx"),
        "dolma": str(base / "dolma"),
        "zarr": str(base / "scenes*.zarr"),
    }


# The process's own peak is VmHWM: getrusage's ru_maxrss survives exec, so it would report this benchmark's own
# peak (it makes the sources) for every conversion. A spawned worker's figure starts at its parent's.
RUN = """
import json, re, resource, sys, time
import atlas_remote as ar
start = time.perf_counter()
report = ar.convert(sys.argv[1], sys.argv[2], sys.argv[3], shard_size=10_000, block_size=64, workers=int(sys.argv[4]))
seconds = time.perf_counter() - start
peak = int(re.search(r"VmHWM:\\s+(\\d+) kB", open("/proc/self/status").read()).group(1))
print(json.dumps({"seconds": seconds, "examples": report.examples, "rss": peak,
                  "worker_rss": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss}))
"""


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    scale = 4_000 if args.quick else 40_000
    rows = []
    with tempfile.TemporaryDirectory(prefix="atlas-convert-bench-") as scratch:
        base = Path(scratch)
        sources = make_sources(base, scale)
        for name, src in sources.items():
            source_dir = {"webdataset": "wds", "megatron": "mega"}.get(name, name) if name != "zarr" else None
            size = folder_bytes(base / source_dir) if source_dir else sum(folder_bytes(p) for p in base.glob("scenes*"))
            results = {}
            for workers in (1, 2, 1, 2):  # alternated: each figure is the better of two runs
                out = base / f"out-{name}-{workers}-{len(results)}"
                done = subprocess.run(
                    [sys.executable, "-c", RUN, src, str(out), name, str(workers)],
                    capture_output=True,
                    text=True,
                    check=True,
                    cwd=ROOT,
                )
                result = json.loads(done.stdout.strip().splitlines()[-1])
                best = results.get(workers)
                if best is None or result["seconds"] < best["seconds"]:
                    results[workers] = result
            one, two = results[1], results[2]
            rows.append((name, one["examples"], size, one, two))
            print(name, one, two, flush=True)
    write(rows, args.quick)


def write(rows: list, quick: bool) -> None:
    lines = [
        SECTION,
        "",
        "Written by `python benchmarks/convert.py`" + (" --quick" if quick else "") + ": each source format "
        "converted to a local Atlas dataset (shards of 10,000, blocks of 64, shared dictionary) by one worker and "
        "by two, alternated, best of two runs each, in fresh processes. Four inputs per format (two stores for "
        "zarr), generated locally; JSON lines, Parquet and Arrow hold the same kind of records (an id and 20-120 "
        "words). MB/s counts the source's bytes; RSS is the peak of the converting process and, with two workers, "
        "of the largest worker (a spawned worker's figure starts at its parent's: Linux keeps the mark across exec).",
        "",
        "| format | examples | source MB | 1 worker: examples/s | MB/s | peak RSS | 2 workers: examples/s | "
        "ratio 2 ÷ 1 | peak RSS (parent / worker) |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for name, examples, size, one, two in rows:
        r1, r2 = examples / one["seconds"], examples / two["seconds"]
        lines.append(
            f"| {name} | {examples:,} | {size / 1e6:.1f} | {r1:,.0f} | {size / 1e6 / one['seconds']:.1f} | "
            f"{one['rss'] / 1024:.0f} MiB | {r2:,.0f} | {r2 / r1:.2f} | {two['rss'] / 1024:.0f} / "
            f"{two['worker_rss'] / 1024:.0f} MiB |"
        )
    lines += [
        "",
        "Two workers help as far as two cores allow: the machine has two, and with shared-dictionary "
        "compression the parent first reads the first shard's examples once more to train the dictionary. "
        "Memory does not grow with the input: it is bounded by one shard (dictionary compression holds a "
        "shard's pickled blocks until the shard is closed) plus the importer's chunk (8 MiB ranges for "
        "Megatron, one zarr chunk per array). Parquet and Arrow are decoded by pyarrow in C, so a worker's "
        "start (a spawned interpreter importing atlas_remote and pyarrow) weighs more against their short "
        "conversions: on a busy machine two workers can be slower than one.",
        "",
    ]
    write_section(SECTION, lines)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
