"""What starting an epoch costs at 1,000, 10,000 and 100,000 shards, on an S3 endpoint adding 20 ms a request.

The endpoint (folder_s3.py) serves a local folder, so 100,000 shards need no upload: every shard is the same tiny
shard (1,000 blocks of one ~20-byte example: an index of realistic length), hard-linked, with a manifest for
them all. Start-up depends on the shard count, not on the bytes. Measured, each in a fresh process:

- the requests and seconds to open the dataset, with its manifest and without (listing pages then);
- a `ShuffledStream` (2 workers, batches of 32): requests (by object) and seconds to the first batch, and the
  resident memory of the training process and its workers after 1,000 batches; the same first batch without
  workers, and with windows of one shard;
- planning one epoch of 10^9 and 10^10 examples, from metadata only, in a rank's main process and in each of
  its DataLoader workers (its own section, "Planning an epoch"; `--planning` measures that alone);
- an epoch of a 10,000-example dataset while half of all GETs are answered 503 SlowDown for 10 s.

    python benchmarks/scale.py [--shards 1000 10000 100000] [--latency 0.02] [--repeats 3]
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

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from convert import write_section
from folder_s3 import serve

import atlas_remote as ar
from atlas_remote.format.manifest import MANIFEST, Manifest, Sidecar, row_of, shard_digest
from atlas_remote.format.spec import (
    AtlasDatasetMetadata,
    AtlasDatasetShardMetadata,
    CompressionStrategy,
    decode_blocks,
    shard_name,
)

BUCKET = "bench"
BLOCKS = 1000
LINKS_PER_FILE = 50_000
SHARD_FILES = ("meta.json", "index.npy", "data.bin", "atlas_blocks.npy")


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
    shard_meta = AtlasDatasetShardMetadata.from_json((shard / "meta.json").read_bytes(), "meta.json")
    offsets, sums = decode_blocks((shard / "atlas_blocks.npy").read_bytes(), shard_meta, "atlas_blocks.npy")
    row = row_of(shard_meta, (shard / "data.bin").stat().st_size, Sidecar.BLOCKS, shard_digest(offsets, sums))
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

    url, options, endpoint = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3]
    batches, workers, window, run = (int(a) for a in sys.argv[4:8])
    context = {"multiprocessing_context": sys.argv[8]} if sys.argv[8] else {}
    stats = lambda: json.load(urllib.request.urlopen(endpoint + "/__stats__"))

    def rss(pid):
        try:
            with open(f"/proc/{pid}/status") as status:
                return next(int(line.split()[1]) for line in status if line.startswith("VmRSS")) * 1024
        except OSError:  # gone meanwhile
            return 0

    def parents():
        out = {}
        for p in filter(str.isdigit, os.listdir("/proc")):
            try:
                out[int(p)] = int(open(f"/proc/{p}/stat").read().rsplit(")", 1)[1].split()[1])
            except OSError:  # gone meanwhile
                pass
        return out

    def family_rss():  # this process and its descendants (workers started by a fork server are grandchildren)
        of, family = parents(), [os.getpid()]
        for pid in family:
            family += [c for c, parent in of.items() if parent == pid]
        return sum(rss(p) for p in family)

    before, started = stats(), time.perf_counter()
    ds = ar.open(url, storage_options=options)
    stream = ShuffledStream(ds, 32, num_workers=workers, seed=1, window_blocks=window, run_blocks=run)
    loader = iter(stream.loader(persistent_workers=workers > 0, **context))
    next(loader)
    seconds, after = time.perf_counter() - started, stats()
    kinds = {k: n - before["objects"].get(k, 0) for k, n in after["objects"].items()}
    kinds["list"] = after["requests"].get("list", 0) - before["requests"].get("list", 0)
    first = {"seconds": seconds, "requests": sum(after["requests"].values()) - sum(before["requests"].values())}
    first["retries"] = ds.stats.retries
    first["kinds"] = {k: n for k, n in kinds.items() if n}
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


def measure_stream(
    url: str,
    options: dict,
    endpoint: str,
    batches: int,
    workers: int = 2,
    window: int = 64,
    run: int = 8,
    context: str = "",
) -> dict:
    """A stream's first batch (requests, by object, and seconds from before the open) and the resident memory of
    the process and its workers after `batches` batches, in a fresh process; workers started as `loader()` starts
    them, or by `context` ("fork")."""
    settings = [str(n) for n in (batches, workers, window, run)] + [context]
    done = subprocess.run(
        [sys.executable, "-c", STREAM, url, json.dumps(options), endpoint, *settings],
        capture_output=True,
        text=True,
        check=True,
        timeout=1800,
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


PLANNING = textwrap.dedent("""
    import json, sys, time, tracemalloc
    import numpy as np
    from atlas_remote.training.epoch_state import Deal, intervals
    from atlas_remote.training.plan import EpochPlan, Layout, Source

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


def measure_start_storm(url: str, options: dict, endpoint: str, processes: int, per_second: int) -> dict:
    """`processes` training processes of 2 workers started at once against an endpoint answering 503 beyond
    `per_second` GETs a second: each one's time to its first batch (from before its open), whether every one got
    it, and the requests answered 503."""
    post = urllib.request.Request(endpoint + "/__rate__", data=json.dumps({"per_second": per_second}).encode())
    urllib.request.urlopen(post).read()
    before = server_stats(endpoint)
    try:
        started = [
            subprocess.Popen(
                [sys.executable, "-c", STREAM, url, json.dumps(options), endpoint, "1", "2", "64", "8", ""],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for _ in range(processes)
        ]
        answers = [p.communicate(timeout=1800) for p in started]
    finally:
        lift = urllib.request.Request(endpoint + "/__rate__", data=json.dumps({"per_second": 0}).encode())
        urllib.request.urlopen(lift).read()
    after = server_stats(endpoint)
    firsts = [json.loads(out.strip().splitlines()[-1]) for (out, _), p in zip(answers, started) if p.returncode == 0]
    return {
        "processes": processes,
        "per_second": per_second,
        "ok": len(firsts),
        "seconds": sorted(f["seconds"] for f in firsts),
        "retries": sum(f["retries"] for f in firsts),
        "throttled": after["requests"].get("throttled", 0) - before["requests"].get("throttled", 0),
        "errors": [err.strip().splitlines()[-1] for (_, err), p in zip(answers, started) if p.returncode != 0],
    }


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


MEASURES = {  # name: (workers, window_blocks, run_blocks, batches, start method)
    "stream": (2, 64, 8, 0, ""),  # the defaults; batches: --batches
    "forked": (2, 64, 8, 1, "fork"),  # the same, workers forked (they read through s3fs)
    "in_process": (0, 64, 8, 1, ""),  # the same first batch without DataLoader workers
    "one_shard_windows": (2, 64, 64, 1, ""),  # a window is one run of one shard
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shards", type=int, nargs="+", default=[1000, 10_000, 100_000])
    parser.add_argument("--latency", type=float, default=0.02)
    parser.add_argument("--batches", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=3, help="rounds, each over every shard count (best taken)")
    parser.add_argument("--planning", action="store_true", help="only the planning section")
    parser.add_argument("--no-planning", action="store_true", help="leave the planning section as it is")
    args = parser.parse_args()
    if not args.no_planning:
        planning = planning_report()
        print("\n".join(planning))
        write_section("## Planning an epoch", planning)
    if args.planning:
        return
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / BUCKET
        for count in args.shards:
            started = time.perf_counter()
            tiny_shards(folder / f"s{count}", count)
            print(f"{count:,} shards made in {time.perf_counter() - started:.1f} s", flush=True)
        runs: dict[int, list] = {count: [] for count in args.shards}
        with serve(tmp, args.latency) as endpoint:
            options = {"endpoint_url": endpoint, "key": "bench", "secret": "bench"}
            for _ in range(args.repeats):  # alternated: each round measures every shard count, on a busy machine
                for count in args.shards:
                    url = f"s3://{BUCKET}/s{count}"
                    run = {"with_manifest": measure_open(url, options, endpoint)}
                    os.rename(folder / f"s{count}" / MANIFEST, folder / f"s{count}" / "aside")
                    try:
                        run["without"] = measure_open(url, options, endpoint)
                    finally:
                        os.rename(folder / f"s{count}" / "aside", folder / f"s{count}" / MANIFEST)
                    for name, (workers, window, run_blocks, batches, context) in MEASURES.items():
                        run[name] = measure_stream(
                            url, options, endpoint, batches or args.batches, workers, window, run_blocks, context
                        )
                    runs[count].append(run)
                    print(count, run, flush=True)
            storm = measure_storm(folder, endpoint, options)
            print(storm, flush=True)
            count = args.shards[min(1, len(args.shards) - 1)]
            storm["start"] = measure_start_storm(f"s3://{BUCKET}/s{count}", options, endpoint, 8, 200)
            storm["start"]["shards"] = count
            print(storm["start"], flush=True)
    report(runs, storm, args)


def best(runs: list, name: str, key: str = "seconds") -> dict:
    """The run with the least of key (time is only ever added by a busy machine)."""
    return min((r[name] for r in runs), key=lambda m: m[key])


def opened(runs: list, name: str) -> str:
    requests, seconds = min(runs, key=lambda r: r[name][1])[name]
    return f"{requests} / {seconds:.2f}"


def first_batch(runs: list, name: str) -> str:
    """Requests (the range over the runs) and the best time to the first batch."""
    counts = sorted(r[name]["requests"] for r in runs)
    spread = f"{counts[0]}" if counts[0] == counts[-1] else f"{counts[0]}–{counts[-1]}"
    return f"{spread} / {best(runs, name)['seconds']:.2f}"


def by_kind(measure: dict) -> str:
    kinds = measure["kinds"]
    shard_objects = sum(
        n for k, n in kinds.items() if k.endswith(("index.npy", "block_checksums.npy", "atlas_blocks.npy"))
    )
    blocks = kinds.get("get data.bin", 0)
    rest = measure["requests"] - shard_objects - blocks
    return f"{shard_objects} + {blocks} + {rest}"


def epoch(result: dict) -> str:
    if "error" in result:
        return f"failed ({result['error'].strip().splitlines()[-1]})"
    exact = "every example once" if result["exact"] else "NOT every example once"
    return f"{result['seconds']:.1f} s, {exact}, {result['throttled']} requests answered 503"


def start_storm(result: dict) -> str:
    seconds = result["seconds"]
    times = f"first batches after {seconds[0]:.2f}–{seconds[-1]:.2f} s" if seconds else "no first batch"
    failed = f"; failed: {result['errors'][0]}" if result["errors"] else ", no error"
    return (
        f"A start-up storm: {result['processes']} training processes of 2 workers started at once on "
        f"{result['shards']:,} shards, the endpoint answering 503 SlowDown beyond {result['per_second']} GETs a "
        f"second: {result['ok']} of {result['processes']} got their first batch, {times}{failed}; "
        f"{result['throttled']} requests answered 503, {result['retries']} retries counted in the training "
        "processes' `ds.stats` (their workers' not included)."
    )


def report(runs: dict, storm: dict, args: argparse.Namespace) -> None:
    mib = 1024 * 1024
    counts = list(runs)
    base_rss = min(r["stream"]["rss"] for r in runs[counts[0]])
    lines = [
        "## Internet scale",
        "",
        f"`python benchmarks/scale.py`: an S3 endpoint over a local folder adding {args.latency * 1000:.0f} ms a "
        "request (benchmarks/folder_s3.py); tiny shards of 1,000 one-example blocks, hard-linked; each measure in "
        f"a fresh process, {args.repeats} rounds alternating over the shard counts, the best time of each. "
        "Requests are counted by the endpoint (the stream's workers included). A stream is `ShuffledStream` with "
        "batches of 32 and its defaults (`window_blocks=64`, `run_blocks=8`, `prefetch=2`); its first batch is "
        "timed from before the open.",
        "",
        "| shards | open, manifest: requests / s | open, no manifest: requests / s | first batch, 2 workers: "
        "requests / s | of which shard index + checksums, blocks, other | first batch, 2 workers forked: "
        "requests / s | first batch in-process: requests / s "
        f"| first batch, 2 workers, one shard a window: requests / s | RSS after {args.batches:,} batches "
        f"(× {counts[0]:,} shards) |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for count in counts:
        rs = runs[count]
        rss = min(r["stream"]["rss"] for r in rs)
        lines.append(
            f"| {count:,} | {opened(rs, 'with_manifest')} | {opened(rs, 'without')} | {first_batch(rs, 'stream')} "
            f"| {by_kind(best(rs, 'stream'))} | {first_batch(rs, 'forked')} | {first_batch(rs, 'in_process')} "
            f"| {first_batch(rs, 'one_shard_windows')} | {rss / mib:,.0f} MiB ({rss / base_rss:.2f}×) |"
        )
    lines += [
        "",
        f"An epoch of 10,000 examples (1,000 blocks, 2 workers), calm: {epoch(storm['calm'])}; with half of all "
        f"GETs answered 503 SlowDown for 10 s: {epoch(storm['storm'])}.",
        "",
        start_storm(storm["start"]),
    ]
    print("\n".join(lines))
    write_section("## Internet scale", lines)


if __name__ == "__main__":
    main()
