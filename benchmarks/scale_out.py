"""Ray Data beside the single process, measured side by side in one run: conversion, writing and reading.

    python benchmarks/scale_out.py [--quick]    # writes the "Scale-out on Ray Data" section of docs/benchmarks.md

Source: 200,000 JSON-lines records (8 gzipped files of 25,000, 20-120 words each), converted to shards of
10,000 and blocks of 64 with a shared dictionary. Every measurement runs in a fresh process, alternated with
its counterpart, and keeps the better of two runs. The Ray runs start a local session of 2 CPUs first (its
start-up, until its workers have imported atlas_remote and a first Ray Data job has run, is reported, not
counted). Needs the `ray` extra.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from convert import make_jsonl, write_section

ROOT = Path(__file__).resolve().parents[1]
SECTION = "## Scale-out on Ray Data"
FILES = 8
# A single-node Ray that listens on 127.0.0.1 only, and sends no usage reports.
ENV = {**os.environ, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_USAGE_STATS_ENABLED": "0"}

PRELUDE = """
import json, sys, time
import atlas_remote as ar
src, out = sys.argv[1], sys.argv[2]
def start_ray(data=True):
    import ray
    t = time.perf_counter()
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    ray.data.DataContext.get_current().enable_progress_bars = False
    ray.data.DataContext.get_current().print_on_execution_start = False
    warm = ray.remote(num_cpus=1)(lambda: __import__("atlas_remote.write.ray_data") and None)
    ray.get([warm.remote() for _ in range(4)])  # workers that have imported atlas_remote, as on a running cluster
    if data:  # Ray Data's own actors, which its first job in a session starts (plain tasks do without them)
        ray.data.range(10).materialize()
    return time.perf_counter() - t
startup = 0.0
"""

CASES = {  # name -> the body timed; it sets `n`, the examples done
    "convert: one process": """
t = time.perf_counter(); n = ar.convert(src, out, "jsonl", shard_size=10_000, block_size=64).examples
""",
    "convert: --engine ray": """
startup = start_ray(data=False)
t = time.perf_counter(); n = ar.convert(src, out, "jsonl", shard_size=10_000, block_size=64, engine="ray").examples
""",
    "write: AtlasDatasetWriter": """
rows = list(ar.open(src))
t = time.perf_counter()
with ar.AtlasDatasetWriter(out, 10_000, 64) as w:
    for row in rows:
        w.add_example(row)
n = len(rows)
""",
    "write: write_atlas": """
startup = start_ray()
import ray
from atlas_remote.write.ray_data import write_atlas
ds = ray.data.from_items(list(ar.open(src)), override_num_blocks=8).materialize()
t = time.perf_counter(); n = sum(write_atlas(ds, out, shard_size=10_000, block_size=64).shard_sizes)
""",
    "read: for x in ds": """
t = time.perf_counter(); n = sum(1 for _ in ar.open(src))
""",
    "read: read_atlas().iter_rows()": """
startup = start_ray()
from atlas_remote.write.ray_data import read_atlas
t = time.perf_counter(); n = sum(1 for _ in read_atlas(src).iter_rows())
""",
    "read: read_atlas().iter_batches()": """
startup = start_ray()
from atlas_remote.write.ray_data import read_atlas
t = time.perf_counter(); n = sum(len(b["id"]) for b in read_atlas(src).iter_batches(batch_size=4096))
""",
}
EPILOGUE = """
print(json.dumps({"seconds": time.perf_counter() - t, "examples": n, "startup": startup}))
"""

PAIRS = [  # (measure, ours on Ray, its single-process counterpart, what the counterpart reads)
    ("convert the JSON lines, 8 inputs", "convert: --engine ray", "convert: one process", "source"),
    ("write the rows, already in memory", "write: write_atlas", "write: AtlasDatasetWriter", "atlas"),
    ("read every example, rows", "read: read_atlas().iter_rows()", "read: for x in ds", "atlas"),
    ("read every example, batches of 4,096", "read: read_atlas().iter_batches()", "read: for x in ds", "atlas"),
]


def run(case: str, src: str, out: Path) -> dict:
    done = subprocess.run(
        [sys.executable, "-c", PRELUDE + CASES[case] + EPILOGUE, src, str(out)],
        env=ENV,
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=1800,
    )
    if done.returncode:
        raise SystemExit(f"{case} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    lines_per_file = 2_500 if args.quick else 25_000
    best: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="atlas-scale-out-") as scratch:
        base = Path(scratch)
        source = make_jsonl(base / "jsonl", FILES, lines_per_file, np.random.default_rng(0))
        atlas = str(base / "atlas")
        run("convert: one process", source, Path(atlas))
        outputs = (base / f"out-{n}" for n in itertools.count())
        for attempt in range(2):
            for _, ray_case, single_case, reads in PAIRS:
                for case in (single_case, ray_case) if attempt == 0 else (ray_case, single_case):
                    result = run(case, source if reads == "source" else atlas, next(outputs))
                    print(case, result, flush=True)
                    if case not in best or result["seconds"] < best[case]["seconds"]:
                        best[case] = result
    report(best, FILES * lines_per_file, args.quick)


def report(best: dict[str, dict], examples: int, quick: bool) -> None:
    startups = [r["startup"] for r in best.values() if r["startup"]]
    lines = [
        SECTION,
        "",
        "Written by `python benchmarks/scale_out.py`" + (" --quick" if quick else "") + f": {examples:,} "
        f"JSON-lines records ({FILES} gzipped files), converted to shards of 10,000 and blocks of 64 with a shared "
        "dictionary; then that Atlas dataset (local) written again and read. Each figure is the better of two "
        "runs in fresh processes, alternated with its counterpart. Ray runs in a local session of 2 CPUs on "
        f"the same two cores; its start-up ({min(startups):.1f}-{max(startups):.1f} s, until workers have imported "
        "atlas_remote and, for Ray Data, its first job has started its actors, as on a running cluster) is not "
        "counted.",
        "",
        "| measure | Ray Data | one process | ratio (Ray ÷ one process, examples/s) | bound on 2 CPUs |",
        "| --- | --- | --- | --- | --- |",
    ]
    for measure, ray_case, single_case, _ in PAIRS:
        ours, single = best[ray_case], best[single_case]
        r_ours, r_single = ours["examples"] / ours["seconds"], single["examples"] / single["seconds"]
        lines.append(
            f"| {measure} | {r_ours:,.0f} examples/s ({ours['seconds']:.2f} s) | {r_single:,.0f} "
            f"examples/s ({single['seconds']:.2f} s) | {r_ours / r_single:.2f} | 2.00 |"
        )
    lines += ["", NOTES]
    write_section(SECTION, lines)
    print("\n".join(lines))


NOTES = """**What scales with nodes, and why.**

- **Conversion (`--engine ray`)** is one task per input file, and tasks share nothing but the staging folder:
  each reads its input and writes its part's shards straight to the destination URL. Adding nodes adds
  throughput until the inputs run out (one task each) or the bucket's request rate is reached. The driver does
  two serial things: it trains the shared dictionary on the first shard's examples (read once more for that,
  a fixed cost per conversion), then commits (one server-side copy per staged file, concurrent). On 2 CPUs the
  bound is 2× the single process; the driver's own work, Ray's scheduler and its object store share those
  same two cores.
- **`write_atlas`** is the same: every write task compresses and uploads its own shards, and the driver only
  trains the dictionary first and commits last. On 2 CPUs it is slower than the single-process writer. Two
  parts of the gap were measured apart: it runs two Ray jobs (the dictionary's sample, then the write; a
  trivial job costs about 0.1 s in a warm session), and turning Arrow rows back into Python dicts costs 17 ms
  per 25,000 rows. The rest is Ray's scheduling and object-store reads on the same two cores, not broken down
  further.
- **`read_atlas`** cuts the dataset into tasks of whole blocks (10,000 to 100,000 rows, within one shard), and
  each task reads its range with one ranged read per run of blocks, so reading scales with nodes as long as
  there are tasks. On one machine it cannot compete with `for x in ds`, which only unpickles: a task's reading
  is about 17 ms per 10,000 rows, and Ray's scheduling of the task and its blocks costs more than that. The
  datasource tells Ray the data's size (the first block's pickled size per example, times the examples):
  without it Ray asks for 200 blocks and splits the tasks' output to match, which took 1.7 s instead of 1.2 s
  for these 200,000 rows, measured apart. Ray's read pays off when the
  consumer is itself a distributed Ray job (a `map_batches` over many nodes, Ray Train), not one process
  iterating."""


if __name__ == "__main__":
    main()
