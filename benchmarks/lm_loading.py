"""Language-model loading against LitData's TokensLoader, the way issue 47 measures it, side by side in one run.

    pip install -e ".[bench,obstore]"            # LitData 0.2.76 beside us
    python benchmarks/lm_loading.py              # writes the "Language-model loading" section of docs/benchmarks.md
    python benchmarks/lm_loading.py --rounds 1 --systems atlas_remote   # a quick look, nothing written

The data: 39,033 documents of about 1,280 uint16 tokens (lengths drawn log-normal, ids skewed as text's are),
50 M tokens with an end-of-document token (0) after each. Each library writes them its documented way:
atlas_remote with `write()` (shards of 10,000, blocks of 64, the defaults) and its token counts saved beside
them; LitData with `optimize(..., chunk_size=2049 * 8012, item_loader=TokensLoader())`, the end-of-document token
in the data (its recipe: the tokenizer appends it). Both are uploaded to benchmarks/s3_endpoint.py, which adds
20 ms to every request and counts requests and bytes.

Each run is a fresh process with an empty cache folder, one shuffled epoch of rows of 2,049 tokens in batches of
8 with 2 DataLoader workers, each library's LM recipe:
- LitData: `StreamingDataset(url, item_loader=TokensLoader(block_size=2049), shuffle=True)` and
  `StreamingDataLoader(batch_size=8, num_workers=2)`;
- atlas_remote: `TokenStream(ds, 2048, batch_size=8, num_workers=2, eod=0, counts=saved).loader()`, read with the
  writer's key, and again with another key (a stranger's reader: every block walked before it is loaded).

Measured in the child, from after the imports (torch and the library, which a training script has made before it
builds its loader): time to the first batch, the epoch, every gap between two batches, tokens served, the CPU
time of the whole process tree (itself, DataLoader workers, a fork server) when the last batch arrives, and the
endpoint's requests and bytes. Rounds alternate the systems; medians and ranges are reported, and the machine's
load average before and after.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

LATENCY = 0.020
DOCUMENTS = 39_033
TOKENS = 50_000_000  # end-of-document tokens included
SEQ = 2048  # rows of SEQ + 1 tokens
BATCH = 8
WORKERS = 2
EOD = 0
LITDATA_CHUNK = 2049 * 8012  # tokens a chunk: LitData's documented LM recipe
KEYS = {"writer": "11" * 32, "other": "22" * 32}
SYSTEMS = ("litdata", "atlas_remote", "atlas_remote (another key)")
ENV = {
    "AWS_ACCESS_KEY_ID": "k",
    "AWS_SECRET_ACCESS_KEY": "s",
    "AWS_DEFAULT_REGION": "us-east-1",
    "LITDATA_DISABLE_VERSION_CHECK": "1",
}


def lengths(n: int = DOCUMENTS, total: int = TOKENS) -> np.ndarray:
    """Document lengths (eod included) summing to `total`: log-normal, as text's are, at least 8 tokens."""
    raw = np.random.default_rng(47).lognormal(0.0, 1.0, n)
    out = np.maximum((raw / raw.sum() * total).astype(np.int64), 8)
    out[: total - int(out.sum())] += 1  # the rounding's remainder, a token each
    return out


def document(i: int, length: int) -> np.ndarray:
    """Document i's tokens without its eod: ids 1..50,000, skewed (zipf), so zstd has something to do."""
    return np.minimum(np.random.default_rng(i).zipf(1.3, length - 1), 50_000).astype(np.uint16)


def documents(part: tuple[int, int]):
    """LitData's input: the documents of one part, each with its eod (what its recipe's tokenizer yields)."""
    sizes = lengths()
    for i in range(*part):
        yield np.append(document(i, int(sizes[i])), np.uint16(EOD))


def write_atlas(out: str) -> None:
    import atlas_remote as ar

    sizes = lengths()
    ar.write(({"tokens": document(i, int(n))} for i, n in enumerate(sizes.tolist())), out)
    ds = ar.open(out)
    ar.TokenCounts.of(ds).save(out + ".tokens")


def write_litdata(out: str) -> None:
    from litdata import TokensLoader, optimize

    step = 5_000
    optimize(
        fn=documents,
        inputs=[(a, min(a + step, DOCUMENTS)) for a in range(0, DOCUMENTS, step)],
        output_dir=out,
        chunk_size=LITDATA_CHUNK,
        item_loader=TokensLoader(),
        num_workers=1,
        mode="overwrite",
        start_method="fork",
        verbose=False,
    )


# -- one run, in a fresh process ----------------------------------------------------------------------------------


def tree_cpu() -> float:
    """CPU seconds of this process and every live descendant (DataLoader workers, a fork server)."""
    parents: dict[int, int] = {}
    times: dict[int, float] = {}
    tick = os.sysconf("SC_CLK_TCK")
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parents[int(entry)] = int(fields[1])
        times[int(entry)] = (int(fields[11]) + int(fields[12])) / tick
    mine, total = {os.getpid()}, 0.0
    changed = True
    while changed:
        changed = False
        for pid, parent in parents.items():
            if parent in mine and pid not in mine:
                mine.add(pid)
                changed = True
    for pid in mine:
        total += times.get(pid, 0.0)
    return total


def stats(endpoint: str) -> tuple[int, int]:
    got = json.loads(urllib.request.urlopen(f"{endpoint}/__stats__").read())
    return sum(got["requests"].values()), sum(got["bytes"].values())


def loader(system: str, url: str, endpoint: str, cache: str):
    if system == "litdata":
        from litdata import StreamingDataLoader, StreamingDataset, TokensLoader
        from litdata.streaming import downloader

        downloader._OBSTORE_CLIENT_OPTIONS = {**downloader._OBSTORE_CLIENT_OPTIONS, "allow_http": True}
        ds = StreamingDataset(
            url,
            cache_dir=cache,
            item_loader=TokensLoader(block_size=SEQ + 1),
            shuffle=True,
            seed=0,
            storage_options={"endpoint_url": endpoint},
        )
        return StreamingDataLoader(ds, batch_size=BATCH, num_workers=WORKERS), None
    import atlas_remote as ar

    ds = ar.open(url, storage_options={"endpoint_url": endpoint, "key": "k", "secret": "s"})
    stream = ar.TokenStream(ds, SEQ, batch_size=BATCH, num_workers=WORKERS, eod=EOD, counts=url + ".tokens")
    return stream.loader(), stream


def measure(system: str, url: str, endpoint: str) -> dict:
    import torch.utils.data  # noqa: F401  (both need torch: imported before the clock, as a training script has)

    if system == "litdata":
        import litdata  # noqa: F401
    else:
        import atlas_remote.training.tokens  # noqa: F401
    scratch = tempfile.mkdtemp()
    before = stats(endpoint)
    start = time.perf_counter()
    batches, stream = loader(system, url, endpoint, f"{scratch}/cache")
    expected = len(batches)
    arrivals, tokens, cpu, dtype = [], 0, 0.0, ""
    iterator = iter(batches)
    for n, batch in enumerate(iterator, 1):
        arrivals.append(time.perf_counter() - start)
        tokens += batch.numel() if hasattr(batch, "numel") else batch["tokens"].numel()
        dtype = str(batch.dtype if hasattr(batch, "dtype") else batch["tokens"].dtype)
        if n == expected:
            cpu = tree_cpu()  # the workers still alive: counted
    seconds = time.perf_counter() - start
    after = stats(endpoint)
    cpu = cpu or tree_cpu()
    cache = sum(p.stat().st_size for p in Path(scratch).rglob("*") if p.is_file())
    shutil.rmtree(scratch, ignore_errors=True)
    gaps = np.diff(arrivals) if len(arrivals) > 1 else np.zeros(1)
    dropped = here = None
    if stream is not None:
        ((total, left),) = stream.dropped
        dropped, here = [total, left], batches.served_here
    return {
        "seconds": seconds,
        "first": arrivals[0],
        "gap": float(gaps.max()),
        "gap_at": int(np.argmax(gaps)) + 1,
        "tokens": tokens,
        "batches": len(arrivals),
        "cpu": cpu,
        "requests": after[0] - before[0],
        "bytes": after[1] - before[1],
        "cache": cache,
        "dtype": dtype,
        "dropped": dropped,
        "served_here": here,
    }


def run_child(system: str, url: str, endpoint: str, timeout: float = 300) -> dict:
    key = KEYS["other" if "another key" in system else "writer"]
    env = {**os.environ, **ENV, "ATLAS_REMOTE_KEY": key}
    args = [sys.executable, __file__, "--child", json.dumps([system.split(" ")[0], url, endpoint])]
    child = subprocess.Popen(
        args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, start_new_session=True
    )
    try:
        out, err = child.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(child.pid, signal.SIGKILL)
        child.communicate()
        return {"error": f"did not finish in {timeout:.0f} s"}
    finally:
        try:
            os.killpg(child.pid, signal.SIGKILL)  # anything the child left (its workers, a fork server)
        except ProcessLookupError:
            pass
    if child.returncode:
        return {"error": (err.strip().splitlines() or [f"exit {child.returncode}"])[-1]}
    return json.loads(out.strip().splitlines()[-1])


# -- the table ----------------------------------------------------------------------------------------------------


def spread(values: list[float], fmt: str) -> str:
    return f"{format(statistics.median(values), fmt)} ({format(min(values), fmt)}–{format(max(values), fmt)})"


def table(runs: dict[str, list[dict]], stored: dict[str, int], total_tokens: int) -> list[str]:
    ours, theirs = runs["atlas_remote"], runs["litdata"]
    rounds = min(len(ours), len(theirs))
    ratios: dict[str, list[float]] = {k: [] for k in ("epoch", "steady", "first", "cpu", "other")}
    for a, b in zip(ours[:rounds], theirs[:rounds]):
        ratios["epoch"].append((a["tokens"] / a["seconds"]) / (b["tokens"] / b["seconds"]))
        ratios["steady"].append(steady(a) / steady(b))
        ratios["first"].append(a["first"] / b["first"])
        ratios["cpu"].append((a["cpu"] / a["tokens"]) / (b["cpu"] / b["tokens"]))
    for a, o in zip(ours, runs.get("atlas_remote (another key)", [])):
        ratios["other"].append((o["tokens"] / o["seconds"]) / (a["tokens"] / a["seconds"]))
    rows = [
        "| measure | target (floor) | atlas_remote ÷ LitData, median (range) | atlas_remote | LitData 0.2.76 |",
        "| --- | --- | --- | --- | --- |",
        f"| epoch tokens/s | ≥ 1.5× (1.0×) | {spread(ratios['epoch'], '.2f')} | "
        f"{spread([r['tokens'] / r['seconds'] / 1e6 for r in ours], '.1f')} M | "
        f"{spread([r['tokens'] / r['seconds'] / 1e6 for r in theirs], '.1f')} M |",
        f"| steady tokens/s (after the first batch) | ≥ 1.5× (1.0×) | {spread(ratios['steady'], '.2f')} | "
        f"{spread([steady(r) / 1e6 for r in ours], '.1f')} M | {spread([steady(r) / 1e6 for r in theirs], '.1f')} M |",
        f"| first batch | ≤ 0.5× (1.0×) | {spread(ratios['first'], '.2f')} | "
        f"{spread([r['first'] for r in ours], '.2f')} s | {spread([r['first'] for r in theirs], '.2f')} s |",
        f"| longest gap between batches after the first | ≤ 50 ms (200 ms) | | "
        f"{spread([1000 * r['gap'] for r in ours], '.0f')} ms | {spread([1000 * r['gap'] for r in theirs], '.0f')} ms |",
        f"| CPU seconds of the process tree per M tokens | | {spread(ratios['cpu'], '.2f')} | "
        f"{spread([r['cpu'] / r['tokens'] * 1e6 for r in ours], '.3f')} | "
        f"{spread([r['cpu'] / r['tokens'] * 1e6 for r in theirs], '.3f')} |",
        f"| requests | | | {spread([r['requests'] for r in ours], '.0f')} | "
        f"{spread([r['requests'] for r in theirs], '.0f')} |",
        f"| bytes fetched ÷ stored | ≤ 1.05 (1.1) | | {spread([r['bytes'] / stored['atlas_remote'] for r in ours], '.3f')} | "
        f"{spread([r['bytes'] / stored['litdata'] for r in theirs], '.3f')} |",
        f"| tokens of the documents served | ≥ 99.9 % (99.5 %) | | "
        f"{spread([100 * r['tokens'] / total_tokens for r in ours], '.2f')} % | "
        f"{spread([100 * r['tokens'] / total_tokens for r in theirs], '.2f')} % |",
        f"| batches the training process served before its workers took over (`served_here`) | | | "
        f"{spread([r['served_here'] for r in ours], '.0f')} of {ours[0]['batches']:,} | |",
        f"| batch dtype | | | {ours[0]['dtype']} | {theirs[0]['dtype']} |",
        f"| disk cache | | | {spread([r['cache'] / 1e6 for r in ours], '.0f')} MB | "
        f"{spread([r['cache'] / 1e6 for r in theirs], '.0f')} MB |",
    ]
    if ratios["other"]:
        rows.append(
            f"| another key's reader ÷ the writer's key (epoch tokens/s) | ≥ 0.9× | {spread(ratios['other'], '.2f')} | "
            f"{spread([r['tokens'] / r['seconds'] / 1e6 for r in runs['atlas_remote (another key)']], '.1f')} M | |"
        )
    return rows


def steady(run: dict) -> float:
    """Tokens/s after the first batch."""
    per_batch = run["tokens"] / run["batches"]
    return per_batch * (run["batches"] - 1) / (run["seconds"] - run["first"])


def loadavg() -> str:
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


NOTES = """- **Where the epoch goes.** `loader()` serves the workers' batches from the training process, round by round
  in the DataLoader's order, until every worker (started from a fork server that imports torch: 1.6 CPU-seconds,
  several seconds of wall time on a shared machine) has claimed a round; they take over there
  (`training/handover.py`). `served_here` in the log says how many batches the training process served. On a
  busy machine an epoch of 50 M tokens can end before the workers are up: the training process alone then
  serves it, fetching two windows ahead for each worker's stream.
- **First batch.** The open (meta.json and the manifest), the token counts (one GET through obstore, not s3fs:
  botocore's import and client were a second of the first batch) and one run of the first stream. LitData's
  first batch waits for its first 32 MB chunk and its forked workers.
- **Longest gap.** The second-long stall of the hand-over (the training process stopped, workers fetching their
  first window again) is gone: the workers' batches are ready when the loop reaches them, and every stream's
  first window is fetched at once. The gaps left are the training process's own while it serves alone, at a
  window's grain: a loop that takes no time drains the 640 rows of a window in a few milliseconds and then
  waits for the next window's fetch, decompression and unpickling (the GIL, beside the loop). Measured on
  this machine on 10 M tokens: a window of about 680 rows took 0.3-0.4 s from request to rows with the load
  average at 30, and windows of about 300 rows 45-100 ms with it near 8; the largest gap follows the load.
  LitData's loop gets tensors from two worker processes item by item, and waits in small steps.
- **Bytes.** The training process fetches nothing past the round the workers take over at, and a window it has
  fetched is served before the hand-over (the round is pushed to where its windows reach); what is read twice is
  the window where two workers' pieces meet, and the window each worker's piece is in at the hand-over (a window
  is one run, about 640 rows: 1.3 MB here). The rest is the shards' `atlas_blocks.npy`, read by each process.
- **Tokens.** Runs of about 640 rows (was 100) drop half a row each on average: under 0.1 %; `stream.dropped`
  is exact. Carrying a run's leftover into the next run a stream reads is not exact under resume at another
  topology without reading part of that run twice.
- **Another key.** A reader without the writer's key walks every block before loading it (trust/walk.py, a
  pure-Python pass over about 1,100 opcodes a block of 64 documents: 3-4 ms), on the training process while it
  serves alone. Issue 45's trusted public keys put such a reader on the signed path.
- **Earlier figures.** The "Language models" section (benchmarks/language_model.py) was measured before issue 47,
  with runs of about 100 rows (0.52 % dropped there); run it again for today's run size.
- **CPU.** The process tree's CPU from the clock's start to the last batch: the training process, the fork
  server (its torch import) and the workers for us; the training process and its forked workers for LitData.
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--systems", default=",".join(SYSTEMS))
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(measure(*json.loads(args.child))))
        return
    from s3_endpoint import serve

    systems = [s for s in args.systems.split(",") if s]
    runs: dict[str, list[dict]] = {s: [] for s in systems}
    os.environ.update(ENV)
    os.environ["ATLAS_REMOTE_KEY"] = KEYS["writer"]
    with tempfile.TemporaryDirectory() as tmp, serve(LATENCY) as endpoint:
        import s3fs

        fs = s3fs.S3FileSystem(endpoint_url=endpoint, key="k", secret="s", skip_instance_cache=True)
        fs.mkdir("bench")
        stored, urls = {}, {}
        for name, write in (("atlas_remote", write_atlas), ("litdata", write_litdata)):
            if not any(s.startswith(name) for s in systems):
                continue
            local = f"{tmp}/{name}"
            began = time.perf_counter()
            write(local)
            stored[name] = sum(p.stat().st_size for p in Path(local).rglob("*") if p.is_file())
            fs.put(local, f"bench/{name}", recursive=True)
            if name == "atlas_remote":
                fs.put(local + ".tokens", f"bench/{name}.tokens")
            urls[name] = f"s3://bench/{name}"
            print(f"wrote {name}: {stored[name] / 1e6:.1f} MB in {time.perf_counter() - began:.0f} s", file=sys.stderr)
        load_before = loadavg()
        for r in range(args.rounds):
            for system in systems if r % 2 == 0 else systems[::-1]:
                got = run_child(system, urls[system.split(" ")[0]], endpoint)
                print(f"round {r} {system}: {json.dumps(got)}", file=sys.stderr, flush=True)
                if "error" not in got:
                    runs[system].append(got)
        load_after = loadavg()
    total = int(lengths().sum())
    print(json.dumps({"runs": runs, "stored": stored, "load": [load_before, load_after]}))
    if "atlas_remote" not in runs or "litdata" not in runs or not runs["atlas_remote"] or not runs["litdata"]:
        return
    lines = [
        "## Language-model loading beside LitData",
        "",
        f"Written by `python benchmarks/lm_loading.py --rounds {args.rounds}`: {DOCUMENTS:,} documents, "
        f"{total / 1e6:.0f} M uint16 tokens with an end-of-document token after each, on benchmarks/s3_endpoint.py "
        f"adding {LATENCY * 1000:.0f} ms a request; rows of {SEQ + 1:,}, batches of {BATCH}, {WORKERS} DataLoader "
        f"workers, shuffled; a fresh process and an empty cache folder per run; {args.rounds} rounds alternating the "
        f"systems, medians (ranges). Load average before / after: {load_before} / {load_after} (2 cores, shared).",
        "",
        *table(runs, stored, total),
        "",
        NOTES,
    ]
    if args.rounds >= 3 and set(SYSTEMS) <= set(systems):
        from convert import write_section

        write_section("## Language-model loading beside LitData", lines)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
