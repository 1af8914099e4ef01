"""What starting an epoch costs at 1,000, 10,000 and 100,000 shards, on an S3 endpoint adding 20 ms a request.

The endpoint (folder_s3.py) serves a local folder, so 100,000 shards need no upload: every shard is the same tiny
shard (1,000 blocks of one ~20-byte example: an index of realistic length), hard-linked, with a manifest for
them all. Start-up depends on the shard count, not on the bytes. Measured, each in a fresh process:

- the requests and seconds to open the dataset, with its manifest and without (listing pages then);
- a `ShuffledStream` (2 workers, batches of 32): requests and seconds to the first batch, and the resident memory
  of the training process and its workers after 1,000 batches;
- planning one epoch of 1,000,000,000 examples for one rank of 8, from metadata only;
- an epoch of a 10,000-example dataset while half of all GETs are answered 503 SlowDown for 10 s.

    python benchmarks/scale.py [--shards 1000 10000 100000] [--latency 0.02]
        # writes the "Internet scale" section of docs/benchmarks.md
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
import tracemalloc
import urllib.request
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from convert import write_section
from folder_s3 import serve

import atlas_remote as ar
from atlas_remote.checkpoint import Deal, EpochState
from atlas_remote.format import AtlasDatasetMetadata, AtlasDatasetShardMetadata, CompressionStrategy, shard_name
from atlas_remote.manifest import MANIFEST, Manifest, row_of, shard_digest
from atlas_remote.plan import EpochPlan, Layout, Source

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
    row = row_of(
        AtlasDatasetShardMetadata.from_json((shard / "meta.json").read_bytes(), "meta.json"),
        (shard / "data.bin").stat().st_size,
        True,
        digest,
    )
    (folder / MANIFEST).write_bytes(Manifest.from_rows(meta, [(n, *row) for n in range(count)]).encode())


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


def measure_planning(examples: int = 1_000_000_000, shards: int = 100_000, block: int = 32) -> tuple[float, int]:
    layout = Layout.of(np.full(shards, examples // shards), np.full(shards, block))
    tracemalloc.start()
    started = time.perf_counter()
    plan = EpochPlan([Source(layout, len(layout))], seed=1, epoch=3)
    deal = Deal(plan, EpochState(3, seed=1, plan=plan.digest()), streams=8, batch_size=32)
    seconds = time.perf_counter() - started
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert deal.per_stream * 8 >= examples
    return seconds, peak


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
    args = parser.parse_args()
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
    plan_seconds, plan_peak = measure_planning()
    report(rows, storm, plan_seconds, plan_peak, args)


def report(rows: list, storm: dict, plan_seconds: float, plan_peak: int, args: argparse.Namespace) -> None:
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
        f"Planning one epoch of 1,000,000,000 examples (100,000 shards, blocks of 32) for one rank of 8: "
        f"{plan_seconds:.2f} s, {plan_peak / mib:.0f} MiB at the peak.",
        "",
        f"An epoch of 10,000 examples (1,000 blocks, 2 workers), calm: {storm['calm']}; with half of all GETs "
        f"answered 503 SlowDown for 10 s: {storm['storm']}.",
    ]
    print("\n".join(lines))
    write_section("## Internet scale", lines)


if __name__ == "__main__":
    main()
