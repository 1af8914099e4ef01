"""What starting an epoch costs at 1,000, 10,000 and 100,000 shards, on an S3 endpoint adding 20 ms a request.

The endpoint (folder_s3.py) serves a local folder, so 100,000 shards need no upload: every shard is the same tiny
shard (1,000 blocks of one ~20-byte example: an index of realistic length), hard-linked, with a manifest for
them all. Start-up depends on the shard count, not on the bytes. Measured, each in a fresh process:

- the requests and seconds to open the dataset, with its manifest and without (listing pages then);
- a `ShuffledStream` (2 workers, batches of 32): requests and seconds to the first batch, and the resident memory
  of the training process and its workers after 1,000 batches;
- planning one epoch of 10^9 and 10^10 examples, from metadata only, in a rank's main process and in each of
  its DataLoader workers (its own section, "Planning an epoch"; `--planning` measures that alone);
- an epoch of a 10,000-example dataset while half of all GETs are answered 503 SlowDown for 10 s.

    python benchmarks/scale.py [--shards 1000 10000 100000] [--latency 0.02]
        # writes the "Internet scale" and "Planning an epoch" sections of docs/benchmarks.md
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
import urllib.request
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from convert import write_section
from folder_s3 import serve

import atlas_remote as ar
from atlas_remote.format import AtlasDatasetMetadata, CompressionStrategy, shard_name
from atlas_remote.manifest import MANIFEST, Manifest, shard_digest

BUCKET = "bench"
BLOCKS = 1000
LINKS_PER_FILE = 50_000
SHARD_FILES = ("meta.json", "index.npy", "data.bin", "block_checksums.npy")


def tiny_shards(folder: Path, count: int) -> None:
    """`count` copies (hard links) of one shard of BLOCKS one-example blocks, a root meta.json and a manifest."""
    template = folder.parent / "template"
    if not template.exists():
        with ar.AtlasDatasetWriter(str(template), BLOCKS, 1, CompressionStrategy.STANDARD_COMPRESSION) as writer:
            for i in range(BLOCKS):
                writer.add_example({"i": i, "text": "x" * 8})
    shard = template / "0"
    folder.mkdir(parents=True)
    for n in range(count):
        if n % LINKS_PER_FILE == 0:  # a file takes at most 65,000 links on ext4: a fresh copy now and then
            source = folder.parent / f"template-{folder.name}-{n}"
            shutil.copytree(shard, source)
        target = folder / shard_name(n, count)
        target.mkdir()
        for name in SHARD_FILES:
            os.link(source / name, target / name)
    meta = AtlasDatasetMetadata(1, [BLOCKS] * count, CompressionStrategy.STANDARD_COMPRESSION).to_json()
    (folder / "meta.json").write_bytes(meta)
    digest = shard_digest(np.load(shard / "index.npy"), np.load(shard / "block_checksums.npy"))
    size = (shard / "data.bin").stat().st_size
    rows = [(n, BLOCKS, 1, int(CompressionStrategy.STANDARD_COMPRESSION), size, True, digest) for n in range(count)]
    (folder / MANIFEST).write_bytes(Manifest.from_rows(meta, rows).encode())


def server_stats(endpoint: str) -> dict:
    with urllib.request.urlopen(f"{endpoint}/__stats__") as answer:
        return json.load(answer)


def requests_between(before: dict, after: dict) -> int:
    return sum(after["requests"].values()) - sum(before["requests"].values())


STREAM = textwrap.dedent("""
    import json, os, sys, time, urllib.request
    import atlas_remote as ar
    from atlas_remote.training import ShuffledStream

    url, options, endpoint, batches = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3], int(sys.argv[4])
    stats = lambda: sum(json.load(urllib.request.urlopen(endpoint + "/__stats__"))["requests"].values())

    def rss(pid):
        with open(f"/proc/{pid}/status") as status:
            return next(int(line.split()[1]) for line in status if line.startswith("VmRSS")) * 1024

    def family_rss():
        me = os.getpid()
        children = [int(p) for p in os.listdir("/proc") if p.isdigit() and open(f"/proc/{p}/stat").read().rsplit(")", 1)[1].split()[1] == str(me)]
        return rss(me) + sum(rss(c) for c in children)

    before, started = stats(), time.perf_counter()
    ds = ar.open(url, storage_options=options)
    stream = ShuffledStream(ds, 32, num_workers=2, seed=1)
    loader = iter(stream.loader(persistent_workers=True))
    next(loader)
    first = {"seconds": time.perf_counter() - started, "requests": stats() - before}
    for _ in range(batches - 1):
        next(loader)
    first["rss"] = family_rss()
    print(json.dumps(first))
""")


def measure_open(url: str, options: dict, endpoint: str) -> tuple[int, float]:
    before, started = server_stats(endpoint), time.perf_counter()
    ds = ar.open(url, storage_options=options)
    seconds = time.perf_counter() - started
    assert len(ds) > 0
    return requests_between(before, server_stats(endpoint)), seconds


def measure_stream(url: str, options: dict, endpoint: str, batches: int) -> dict:
    done = subprocess.run(
        [sys.executable, "-c", STREAM, url, json.dumps(options), endpoint, str(batches)],
        capture_output=True,
        text=True,
        check=True,
        timeout=1800,
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


PLANNING = textwrap.dedent("""
    import json, sys, time, tracemalloc
    import numpy as np
    from atlas_remote.checkpoint import Deal, intervals
    from atlas_remote.plan import EpochPlan, Layout, Source

    examples, shards, block, streams, worker = (int(a) for a in sys.argv[1:6])
    layout = Layout.of(np.full(shards, examples // shards), np.full(shards, block))  # the manifest's, held anyway

    def plan_and_deal(layout, worker):
        plan = EpochPlan([Source(layout, len(layout))], seed=1, epoch=3)
        deal = Deal(plan, intervals(), streams, 32)
        if worker:  # a DataLoader worker: the plan, the deal, and the first batch of its piece located
            start = int(deal.rest(streams // 2, 0)[0, 0])
            assert sum(len(e) for _, _, e in plan.examples(start, start + 32)) == 32
        return plan, deal

    plan_and_deal(Layout.of([10_000] * 64, [block] * 64), True)  # what a first plan imports, out of the way
    tracemalloc.start()
    started = time.perf_counter()
    plan, deal = plan_and_deal(layout, worker)
    seconds = time.perf_counter() - started
    held, peak = tracemalloc.get_traced_memory()
    assert plan.size == examples and deal.batches_per_stream * streams * 32 >= examples
    print(json.dumps({"seconds": seconds, "held": held, "peak": peak, "windows": len(plan)}))
""")
PLANNING_SIZES = [  # (examples, shards, examples a block): the target, and the million-shard job on paper
    (1_000_000_000, 100_000, 32),
    (10_000_000_000, 1_000_000, 10),
]
RANKS, WORKERS = 8, 8


def measure_planning(examples: int, shards: int, block: int, worker: bool) -> dict:
    """Planning an epoch in a fresh process (a rank's main process, or one of its DataLoader workers), for a job
    of RANKS ranks x WORKERS workers: seconds, and bytes held and at the peak (tracemalloc)."""
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            PLANNING,
            str(examples),
            str(shards),
            str(block),
            str(RANKS * WORKERS),
            str(int(worker)),
        ],
        capture_output=True,
        text=True,
        check=True,
        timeout=1800,
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def planning_report() -> list[str]:
    mib = 1024 * 1024
    lines = [
        "## Planning an epoch",
        "",
        f"`python benchmarks/scale.py --planning`: one epoch's plan and the deal of it to {RANKS} ranks × "
        f"{WORKERS} DataLoader workers, from the layout alone (no data), each measure in a fresh process; memory "
        "by tracemalloc, beyond the layout itself (the manifest's arrays, which the reader holds anyway). A "
        "worker also locates and reads off its first batch. A rank is its main process and its workers.",
        "",
        "| examples | shards | blocks | windows | main process: s / held / peak | a worker: s / held / peak "
        "| a rank: held |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for examples, shards, block in PLANNING_SIZES:
        main, worker = (measure_planning(examples, shards, block, w) for w in (False, True))
        print(examples, main, worker, flush=True)
        lines.append(
            f"| {examples:,} | {shards:,} | {examples // block:,} | {main['windows']:,} "
            f"| {main['seconds']:.2f} / {main['held'] / mib:.1f} / {main['peak'] / mib:.0f} MiB "
            f"| {worker['seconds']:.2f} / {worker['held'] / mib:.1f} / {worker['peak'] / mib:.0f} MiB "
            f"| {(main['held'] + WORKERS * worker['held']) / mib:.0f} MiB |"
        )
    return lines


STORM_EPOCH = textwrap.dedent("""
    import json, sys, time, urllib.request
    import atlas_remote as ar
    from atlas_remote.training import ShuffledStream

    url, options, endpoint, storm = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3], sys.argv[4] == "storm"
    ds = ar.open(url, storage_options=options)
    stream = ShuffledStream(ds, 50, num_workers=2, seed=2, window_blocks=8, run_blocks=1)
    if storm:
        body = json.dumps({"every": 2, "seconds": 10}).encode()
        urllib.request.urlopen(urllib.request.Request(endpoint + "/__storm__", data=body, method="POST"))
    started = time.perf_counter()
    seen = [int(i) for batch in stream.loader() for i in batch["i"]]
    print(json.dumps({"seconds": time.perf_counter() - started, "exact": sorted(seen) == list(range(len(ds)))}))
""")


def measure_storm(folder: Path, endpoint: str, options: dict) -> dict:
    storm = folder / "storm"
    if not storm.exists():
        with ar.AtlasDatasetWriter(str(storm), 100, 10, CompressionStrategy.STANDARD_COMPRESSION) as writer:
            for i in range(10_000):
                writer.add_example({"i": i, "text": "y" * 16})
    out = {}
    for mode in ("calm", "storm"):
        before = server_stats(endpoint)
        done = subprocess.run(
            [sys.executable, "-c", STORM_EPOCH, f"s3://{BUCKET}/storm", json.dumps(options), endpoint, mode],
            capture_output=True,
            text=True,
            timeout=1800,
        )
        after = server_stats(endpoint)
        result = (
            json.loads(done.stdout.strip().splitlines()[-1]) if done.returncode == 0 else {"error": done.stderr[-300:]}
        )
        result["throttled"] = after["requests"].get("throttled", 0) - before["requests"].get("throttled", 0)
        out[mode] = result
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shards", type=int, nargs="+", default=[1000, 10_000, 100_000])
    parser.add_argument("--latency", type=float, default=0.02)
    parser.add_argument("--batches", type=int, default=1000)
    parser.add_argument("--planning", action="store_true", help="only the planning section")
    args = parser.parse_args()
    planning = planning_report()
    print("\n".join(planning))
    write_section("## Planning an epoch", planning)
    if args.planning:
        return
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / BUCKET
        rows = []
        for count in args.shards:
            started = time.perf_counter()
            tiny_shards(folder / f"s{count}", count)
            print(f"{count:,} shards made in {time.perf_counter() - started:.1f} s", flush=True)
        with serve(tmp, args.latency) as endpoint:
            options = {"endpoint_url": endpoint, "key": "bench", "secret": "bench"}
            for count in args.shards:
                url = f"s3://{BUCKET}/s{count}"
                with_manifest = measure_open(url, options, endpoint)
                os.rename(folder / f"s{count}" / MANIFEST, folder / f"s{count}" / "aside")
                try:
                    without = measure_open(url, options, endpoint)
                finally:
                    os.rename(folder / f"s{count}" / "aside", folder / f"s{count}" / MANIFEST)
                stream = measure_stream(url, options, endpoint, args.batches)
                rows.append((count, with_manifest, without, stream))
                print(rows[-1], flush=True)
            storm = measure_storm(folder, endpoint, options)
            print(storm, flush=True)
    report(rows, storm, args)


def report(rows: list, storm: dict, args: argparse.Namespace) -> None:
    mib = 1024 * 1024
    base_rss = rows[0][3]["rss"]
    lines = [
        "## Internet scale",
        "",
        f"`python benchmarks/scale.py`: an S3 endpoint over a local folder adding {args.latency * 1000:.0f} ms a "
        "request (benchmarks/folder_s3.py); tiny shards of 1,000 one-example blocks, hard-linked; each measure in "
        "a fresh process. Requests are counted by the endpoint (the stream's workers included).",
        "",
        "| shards | open, manifest: requests / s | open, no manifest: requests / s | first batch: requests / s "
        f"| RSS after {args.batches:,} batches (× {rows[0][0]:,} shards) |",
        "| ---: | ---: | ---: | ---: | ---: |",
    ]
    for count, (r1, s1), (r2, s2), stream in rows:
        lines.append(
            f"| {count:,} | {r1} / {s1:.2f} | {r2} / {s2:.2f} | {stream['requests']} / {stream['seconds']:.2f} "
            f"| {stream['rss'] / mib:,.0f} MiB ({stream['rss'] / base_rss:.2f}×) |"
        )
    lines += [
        "",
        f"An epoch of 10,000 examples (1,000 blocks, 2 workers), calm: {storm['calm']}; with half of all GETs "
        f"answered 503 SlowDown for 10 s: {storm['storm']}.",
    ]
    print("\n".join(lines))
    write_section("## Internet scale", lines)


if __name__ == "__main__":
    main()
