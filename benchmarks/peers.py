"""atlas_remote beside its peers, MosaicML Streaming and LitData, on the same examples and the same S3 endpoint.

    pip install -e ".[bench,obstore,parquet]"   # the peers, in a venv of their own; not needed by the tests
    python benchmarks/peers.py                  # writes docs/peers.md; --quick for a smaller run, --sizes 2KB for one size

The endpoint is `benchmarks/s3_endpoint.py`: moto behind a front that answers object GET/HEAD in constant time,
with 20 ms added to every request. Two example sizes, each run on its own: about 200 B and about 2 KB (an id, a
label and 80 or 1,000 uint16 tokens; the size is the pickled example's share of a block of 32). Each library
writes the same examples in its own format (zstd everywhere, 4 MB chunks/shards for the peers, blocks of 32 for
Atlas), they are uploaded, and then every measurement runs in a fresh process with its own empty cache folder.
Requests and bytes are the endpoint's own counts; cache disk is the cache folder's size when the measurement
ends. Each figure is the best of `--repeats` runs (2 by default), the systems alternated within each round; a
run that timed out is not tried again.

Access (the reader issue): time to first example; 200 random examples one at a time and as one batch; 20,000
sequential examples (atlas_remote with `ds.iter(0, 20_000)`, the peers by stopping their iterator). Before its timer starts, each process opens the dataset once with another cache folder, so
every library has made its S3 client (botocore, where a library uses it, loads its service models once per
process, about 0.3 s); the cold figure without that warm-up, import of the library included, is reported too.

Epoch (the training issue): one shuffled epoch with each library's own loader, batches of 32, with 0, 2 and 4
DataLoader workers; examples/s, first batch, requests, bytes moved, cache disk, and "near pairs": the share of
consecutive examples whose indices lie within 32 of each other (unshuffled ~1.0, uniform ~0.0006).

Mixture (the mixtures issue): the same examples as two datasets, the first 70 % and the last 30 %, read as one
epoch with weights 0.7/0.3: `ShuffledStream(Mixture([a, b], weights=[0.7, 0.3]))` against LitData's
`CombinedStreamingDataset([a, b], weights=[0.7, 0.3], iterate_over_all=False)` (LitData refuses weights with
`iterate_over_all=True`; it then stops when either dataset runs out, so it serves a little less than the whole:
the examples it served are counted, and checked to be distinct). MosaicML Streaming's `Stream(proportion=)` is not
measured: its loader does not always finish an epoch with DataLoader workers (the single-dataset table).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
LATENCY = 0.020
BATCH = 32
SIZES = {  # name: (uint16 tokens per example, examples; --quick takes a fifth)
    "200B": (80, 100_000),
    "2KB": (1_000, 50_000),
}
LABELS = {"200B": "200 B", "2KB": "2 KB"}
SEQUENTIAL = 20_000
WEIGHTS = (0.7, 0.3)
SYSTEMS = ("atlas_remote", "litdata", "streaming")
CHUNK_BYTES = 4_000_000
ATLAS_SHARD, ATLAS_BLOCK = 10_000, 32
OPTIONS_ENV = {
    "AWS_ACCESS_KEY_ID": "k",
    "AWS_SECRET_ACCESS_KEY": "s",
    "AWS_DEFAULT_REGION": "us-east-1",
    "LITDATA_DISABLE_VERSION_CHECK": "1",  # no look-up of LitData's latest version on PyPI
}


NOTES = """## Reading the tables

- **A loaded machine.** These runs shared the 2 cores with other jobs (load average between 2 and 15, highest
  during the 200 B run), so absolute figures are well below what a quiet machine gives, and DataLoader workers
  rarely had a core each. Only ratios within one table mean much; each of the summary's compares two figures
  of one run.
- **Where an epoch's time goes with DataLoader workers.** torch hands each tensor a worker returns to the main
  process through a shared-memory file and a file descriptor. Measured alone on 2 cores, 3,125 batches of three
  tensors took 5.6 s to cross from 2 workers, and 0.9 s as numpy arrays through the pipe. `ShuffledStream.loader()`
  and `TensorLoader` collate to numpy in the workers and make tensors in the main process (`torch.as_tensor`,
  no copy); LitData's and Streaming's loaders return tensors from the workers.
- **Workers read through s3fs.** A DataLoader worker is forked from a process where obstore has already run
  (opening the dataset reads through it), and obstore's runtime does not survive a fork, so atlas_remote's
  workers read with s3fs: about five times obstore's CPU per request, and s3fs and botocore imported in each
  worker (not measured apart here; it may be part of the first batch's wait). The 0-worker rows read through
  obstore.
- **Small examples.** At about 200 B an example, an epoch is bound by work per example (unpickling, collating)
  more than by bytes, in every library; atlas_remote's 0-worker epoch is then close to LitData's, and its
  streaming pass (`AtlasIterableDataset`, no shuffle) is no faster than its shuffled one, so the shuffle is not
  what costs.
- **Requests.** A shuffled epoch reads runs of 8 consecutive blocks (one request each), mixed 8 runs to a
  window of 64 blocks, 2 windows ahead. Requests per block stay well under 1; bytes moved are within a few
  percent of the stored bytes without workers, and more with them: each worker also reads the shards' index
  and dictionary files, and a window cut by the edge of a worker's share is read by both. On 100,000 examples
  of 200 B (49 windows) 4 workers moved 13-15 % more; on 10,000 examples of 2 KB (5 windows), two thirds more.
- **Mixtures.** atlas_remote serves exactly each dataset's share of the epoch (0.700 here) with every example
  once. LitData's `CombinedStreamingDataset` draws each example's dataset at random with the weights and (with
  weights given) stops when either dataset runs out, so it serves a little less than the whole; its examples/s
  count what it served.
- **200 random examples in one batch** is bound by the HTTP client's CPU more than by latency: every read of an
  `s3://` dataset goes through obstore (the `obstore` extra, installed here), about a fifth of s3fs's CPU per
  request; the batch also opens the 10 shards it touches (meta, index, dictionary, checksums, and a HEAD of
  data.bin each).
- **First example in a fresh process** ("cold") counts the library's import. A process that only reads an
  `s3://` dataset through obstore never imports s3fs nor builds botocore's client.
- **200 random examples one at a time** cost one round trip each for atlas_remote (no read-ahead can know the
  next index). The peers download whole chunks (4 MB here) and serve the rest from their disk cache, so they
  win this row by moving the whole dataset, and keeping it on disk.
- **MosaicML Streaming with DataLoader workers** sometimes does not finish an epoch within the time limit: a
  worker waits in `_each_sample_id` for a shard whose download state another process owns (seen with py-spy in
  an earlier run). In these runs it finished some epochs with workers and not others.
"""


def example(i: int, tokens: int) -> dict:
    """A token sequence as text data looks after tokenization: skewed ids, so zstd has something to do."""
    import numpy as np

    rng = np.random.default_rng(i)
    return {"id": i, "label": i % 10, "tokens": np.minimum(rng.zipf(1.3, tokens), 50_000).astype(np.uint16)}


def examples(ids: tuple[int, int, int]):
    """The examples start..stop-1 of `tokens` tokens each: one input of LitData's `optimize`."""
    start, stop, tokens = ids
    for i in range(start, stop):
        yield example(i, tokens)


# -- writing the datasets ---------------------------------------------------------------------------------------------


def write_atlas(out: str, ids: range, tokens: int) -> None:
    import atlas_remote as ar

    with ar.AtlasDatasetWriter(
        out, ATLAS_SHARD, ATLAS_BLOCK, ar.CompressionStrategy.SHARED_DICTIONARY_COMPRESSION
    ) as w:
        for i in ids:
            w.add_example(example(i, tokens))


def write_litdata(out: str, ids: range, tokens: int) -> None:
    from litdata import optimize

    step = 10_000  # inputs of 10,000 examples each: one call of `examples` per input, in order with one worker
    optimize(
        fn=examples,
        inputs=[(a, min(a + step, ids.stop), tokens) for a in range(ids.start, ids.stop, step)],
        output_dir=out,
        chunk_bytes=CHUNK_BYTES,
        compression="zstd",
        num_workers=1,
        mode="overwrite",
        start_method="fork",
        verbose=False,
    )


def write_streaming(out: str, ids: range, tokens: int) -> None:
    from streaming import MDSWriter

    columns = {"id": "int", "label": "int", "tokens": f"ndarray:uint16:{tokens}"}
    with MDSWriter(out=out, columns=columns, compression="zstd", size_limit=CHUNK_BYTES) as w:
        for i in ids:
            w.write(example(i, tokens))


WRITERS = {"atlas_remote": write_atlas, "litdata": write_litdata, "streaming": write_streaming}


# -- one measurement, in a fresh process ----------------------------------------------------------------------------


def open_dataset(system: str, url: str, cache: str, endpoint: str, shuffle: bool = False):
    """One dataset, or for a mixture ("a|b" URLs) the list of its datasets."""
    if "|" in url:
        return [open_dataset(system, u, f"{cache}/{k}", endpoint, shuffle) for k, u in enumerate(url.split("|"))]
    if system == "atlas_remote":
        import atlas_remote as ar

        return ar.open(url, storage_options={"endpoint_url": endpoint, "key": "k", "secret": "s"})
    if system == "litdata":
        from litdata import StreamingDataset
        from litdata.streaming import downloader

        # LitData fetches chunks with obstore (its fastest path), which refuses http:// unless told
        downloader._OBSTORE_CLIENT_OPTIONS = {**downloader._OBSTORE_CLIENT_OPTIONS, "allow_http": True}

        return StreamingDataset(
            url, cache_dir=cache, shuffle=shuffle, seed=0, storage_options={"endpoint_url": endpoint}
        )
    from streaming import StreamingDataset

    return StreamingDataset(remote=url, local=cache, shuffle=shuffle, shuffle_seed=0, batch_size=BATCH)


def loader(system: str, ds, workers: int):
    """Each library's recommended way to feed a training loop with a shuffled epoch."""
    from torch.utils.data import DataLoader

    if system == "litdata (mixture)":
        from litdata import CombinedStreamingDataset, StreamingDataLoader

        combined = CombinedStreamingDataset(ds, seed=0, weights=list(WEIGHTS), iterate_over_all=False)
        return StreamingDataLoader(combined, batch_size=BATCH, num_workers=workers)
    if system == "litdata":
        from litdata import StreamingDataLoader

        return StreamingDataLoader(ds, batch_size=BATCH, num_workers=workers)
    if system == "streaming":
        return DataLoader(ds, batch_size=BATCH, num_workers=workers)
    import atlas_remote as ar
    from atlas_remote.training import streams as training

    if system == "atlas_remote (mixture)":
        return training.ShuffledStream(ar.Mixture(ds, weights=list(WEIGHTS)), BATCH, workers).loader()
    if system == "atlas_remote":
        return training.ShuffledStream(ds, BATCH, workers).loader()
    if system == "atlas_remote (samplers)":
        sampler = training.BlockBatchSampler(training.BlockShuffleSampler(ds, window_blocks=16), BATCH, workers)
        return DataLoader(ds, batch_sampler=sampler, num_workers=workers)
    return training.TensorLoader(training.AtlasIterableDataset(ds), BATCH, workers)  # streaming order, unshuffled


def served(endpoint: str) -> dict:
    return json.loads(urllib.request.urlopen(f"{endpoint}/__stats__").read())


def disk_bytes(folder: str) -> int:
    return sum(p.stat().st_size for p in Path(folder).rglob("*") if p.is_file())


def measure(system: str, step: str, url: str, endpoint: str, n: int, workers: int, warm: bool) -> dict:
    """Runs in the child process; returns seconds, counts and the ids seen."""
    kind = system.split(" ")[0]
    if kind == "streaming":
        from streaming.base.util import clean_stale_shared_memory

        clean_stale_shared_memory()
    scratch = tempfile.mkdtemp()
    if warm:  # the S3 client made once in this process, as in any process that has read before
        ds = open_dataset(kind, url, f"{scratch}/warm", endpoint)
        for one in ds if isinstance(ds, list) else [ds]:
            one[0]
        del ds
        if kind == "streaming":
            clean_stale_shared_memory()
        if step == "epoch":  # torch and the loader's module are loaded before the clock starts, for all
            loader(system, open_dataset(kind, url, f"{scratch}/warm2", endpoint), 0)
    cache = f"{scratch}/cache"
    rng = random.Random(1)
    picks = [rng.randrange(n) for _ in range(200)]
    before = served(endpoint)
    start = time.perf_counter()
    result: dict = {}
    ds = open_dataset(kind, url, cache, endpoint, shuffle=step == "epoch")
    if step == "first":
        ds[picks[0]]
    elif step == "random":
        for i in picks:
            ds[i]
    elif step == "batch":
        ds.get_many(picks)
    elif step == "sequential":
        count = min(SEQUENTIAL, n)
        got = ds.iter(0, count) if kind == "atlas_remote" else itertools.islice(iter(ds), count)
        result["ids"] = [int(x["id"]) for x in got]
    elif step == "epoch":
        ids = []
        for batch in loader(system, ds, workers):
            if not ids:
                result["first"] = time.perf_counter() - start
            ids += [int(i) for i in batch["id"]]
        result["ids"] = ids
    result["seconds"] = time.perf_counter() - start
    after = served(endpoint)
    result["requests"] = sum(after["requests"].values()) - sum(before["requests"].values())
    result["bytes"] = sum(after["bytes"].values()) - sum(before["bytes"].values())
    result["cache"] = disk_bytes(cache) if os.path.exists(cache) else 0
    if "ids" in result:  # what the tables check, in the log too
        ids = result["ids"]
        result.update(
            served=len(ids),
            distinct=len(set(ids)),
            near=near_pairs(ids),
            first_share=sum(i < int(WEIGHTS[0] * n) for i in ids) / max(len(ids), 1),
        )
    shutil.rmtree(scratch, ignore_errors=True)
    return result


def run_child(
    system: str, step: str, url: str, endpoint: str, n: int, workers: int = 0, warm: bool = True, timeout: float = 300
) -> dict:
    env = {**os.environ, **OPTIONS_ENV, "S3_ENDPOINT_URL": endpoint, "AWS_ENDPOINT_URL": endpoint}
    args = [sys.executable, __file__, "--child", json.dumps([system, step, url, endpoint, n, workers, warm])]
    child = subprocess.Popen(
        args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, start_new_session=True
    )  # its DataLoader workers are stopped with it
    try:
        out, err = child.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(child.pid, signal.SIGKILL)
        child.communicate()
        return {"error": f"did not finish in {timeout:.0f} s", "timeout": True}
    if child.returncode:
        return {"error": err.strip().splitlines()[-1] if err.strip() else f"exit {child.returncode}"}
    return json.loads(out.strip().splitlines()[-1])


def better(old: dict | None, new: dict) -> dict:
    """The faster of two runs of one measurement; a run that failed counts only when no run succeeded."""
    if old is None or ("error" in old and "error" not in new):
        return new
    if "error" in new or new["seconds"] >= old["seconds"]:
        return old
    return new


def best_of(runs: list[tuple], repeats: int, log: str) -> dict:
    """Each run (key, child arguments) `repeats` times, the runs alternated within each round; the best of each
    key. A key whose run timed out is not run again."""
    best: dict = {}
    for _ in range(repeats):
        for key, args, kwargs in runs:
            if best.get(key, {}).get("timeout"):
                continue
            got = run_child(*args, **kwargs)
            print(log, key, json.dumps({k: v for k, v in got.items() if k != "ids"}), file=sys.stderr, flush=True)
            best[key] = better(best.get(key), got)
    return best


# -- the tables -----------------------------------------------------------------------------------------------------


def near_pairs(ids: list[int]) -> float:
    return sum(abs(a - b) <= BATCH for a, b in zip(ids, ids[1:])) / max(len(ids) - 1, 1)


def mb(n: int) -> str:
    return f"{n / 1e6:.1f}"


def access_table(urls: dict, endpoint: str, n: int, needed: int, systems: list[str], repeats: int) -> list[str]:
    count = min(SEQUENTIAL, n)
    rows = [
        "| system | first example (warm / cold) | 200 random, one at a time | 200 random, one batch | "
        f"{count:,} sequential: examples/s | requests (first / random / batch / seq) | MB moved (seq) | "
        "cache disk (seq) |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    runs = []
    for system in systems:
        steps = ["first", "random", "sequential", "cold"] + (["batch"] if system == "atlas_remote" else [])
        for step in steps:
            warm = step != "cold"
            runs.append(
                ((system, step), (system, step.replace("cold", "first"), urls[system], endpoint, n), {"warm": warm})
            )
    best = best_of(runs, repeats, "access")
    for system in systems:
        got = {
            step: best.get((system, step), {"error": "no batch call"})
            for step in ("first", "random", "sequential", "cold", "batch")
        }
        seq = got["sequential"]
        if "ids" in seq and seq["ids"] != list(range(count)):
            seq = {"error": "sequential order is wrong"}
        got["sequential"] = seq
        secs = {step: got[step].get("error") or f"{got[step]['seconds']:.3f} s" for step in got}
        if "error" in seq:
            speed = moved = disk = seq["error"]
        else:
            speed = f"{count / seq['seconds']:,.0f}"
            moved = f"{mb(seq['bytes'])} ({seq['bytes'] / needed:.2f}× the stored bytes of the examples read)"
            disk = f"{mb(seq['cache'])} MB"
        requests = " / ".join(str(got[s].get("requests", "—")) for s in ("first", "random", "batch", "sequential"))
        rows.append(
            f"| {system} | {secs['first']} / {secs['cold']} | {secs['random']} | {secs['batch']} | {speed} | "
            f"{requests} | {moved} | {disk} |"
        )
    return rows


EPOCH_SYSTEMS = (
    "litdata",
    "atlas_remote",
    "atlas_remote (samplers)",
    "atlas_remote (AtlasIterableDataset)",
    "streaming",
)
MIXTURE_SYSTEMS = ("litdata (mixture)", "atlas_remote (mixture)")
WORKERS = (2, 0, 4)


def epochs(urls: dict, endpoint: str, n: int, systems: list[str], repeats: int) -> dict:
    """The best epoch of every system (single and mixed) and worker count, keyed (system, workers)."""
    runs = [
        ((system, workers), (system, "epoch", urls[system], endpoint, n, workers), {"timeout": 240})
        for workers in WORKERS
        for system in EPOCH_SYSTEMS + MIXTURE_SYSTEMS
        if system.split(" ")[0] in systems
    ]
    return best_of(runs, repeats, "epoch")


def epoch_rows(best: dict, systems: tuple, n: int, stored: dict, blocks: int, mixture: bool) -> list[str]:
    rows = [
        "| system | workers | epoch | "
        + ("examples served (first dataset's share) | " if mixture else "")
        + "examples/s | first batch | requests | MB moved (÷ stored) | cache disk | near pairs |",
        "| --- | --- | --- | " + ("--- | " if mixture else "") + "--- | --- | --- | --- | --- | --- |",
    ]
    blank = "| " * (8 if mixture else 7)
    for workers in WORKERS:
        for system in systems:
            if (system, workers) not in best:
                continue
            got = best[system, workers]
            if "error" in got:
                rows.append(f"| {system} | {workers} | {got['error']} {blank}")
                continue
            ids = got["ids"]
            wrong = len(set(ids)) != len(ids) or not set(ids) <= set(range(n))
            if wrong or (sorted(ids) != list(range(n)) and not system.startswith("litdata (mixture)")):
                rows.append(
                    f"| {system} | {workers} | wrong examples: {len(ids):,} seen, {len(set(ids)):,} distinct {blank}"
                )
                continue
            requests = f"{got['requests']:,}" + (
                f" ({got['requests'] / blocks:.2f}/block)" if "atlas" in system else ""
            )
            share = sum(i < int(WEIGHTS[0] * n) for i in ids) / len(ids)
            rows.append(
                f"| {system} | {workers} | {got['seconds']:.1f} s | "
                + (f"{len(ids):,} ({share:.3f}) | " if mixture else "")
                + f"{len(ids) / got['seconds']:,.0f} | {got['first']:.2f} s | {requests} | {mb(got['bytes'])} "
                f"({got['bytes'] / stored[system]:.2f}) | {mb(got['cache'])} MB | {near_pairs(ids):.3f} |"
            )
    return rows


def speed(got: dict | None) -> float | None:
    return None if got is None or "error" in got else len(got["ids"]) / got["seconds"]


def summary_rows(results: dict) -> list[str]:
    """Ours ÷ LitData's examples/s, per size, loader and worker count: the figure the issues' targets name."""
    rows = [
        "| examples | workers | one dataset: atlas_remote ÷ LitData | mixture 0.7/0.3: atlas_remote ÷ LitData |",
        "| --- | --- | --- | --- |",
    ]
    for size, best in results.items():
        for workers in WORKERS:
            cells = []
            for ours, theirs in (("atlas_remote", "litdata"), ("atlas_remote (mixture)", "litdata (mixture)")):
                a, b = speed(best.get((ours, workers))), speed(best.get((theirs, workers)))
                cells.append(f"{a / b:.2f} ({a:,.0f} vs {b:,.0f} examples/s)" if a and b else "—")
            rows.append(f"| {size} | {workers} | {cells[0]} | {cells[1]} |")
    return rows


def prepare(tmp: str, size: str, n: int, tokens: int, endpoint: str) -> tuple[dict, dict, int, int]:
    """Every library's datasets of one size, written locally and uploaded: their URLs, stored bytes, the Atlas
    dataset's block count and the stored bytes of the blocks the sequential read touches."""
    import s3fs

    import atlas_remote as ar

    split = int(WEIGHTS[0] * n)
    parts = {"": range(n), "-a": range(split), "-b": range(split, n)}
    fs = s3fs.S3FileSystem(endpoint_url=endpoint, key="k", secret="s", skip_instance_cache=True)
    if not fs.exists("bench"):
        fs.mkdir("bench")
    urls, stored = {}, {}
    for system, write in WRITERS.items():
        for suffix, ids in parts.items():
            if suffix and system == "streaming":
                continue
            local = f"{tmp}/{size}/{system}{suffix}"
            start = time.perf_counter()
            write(local, ids, tokens)
            print(f"{size}: wrote {system}{suffix} in {time.perf_counter() - start:.1f} s", file=sys.stderr)
            fs.put(local, f"bench/{size}/{system}{suffix}", recursive=True)
            stored[system + suffix] = disk_bytes(local)
        urls[system] = f"s3://bench/{size}/{system}"
        if system != "streaming":
            urls[f"{system} (mixture)"] = f"{urls[system]}-a|{urls[system]}-b"
            stored[f"{system} (mixture)"] = stored[f"{system}-a"] + stored[f"{system}-b"]
    for variant in ("samplers", "AtlasIterableDataset"):
        urls[f"atlas_remote ({variant})"] = urls["atlas_remote"]
        stored[f"atlas_remote ({variant})"] = stored["atlas_remote"]
    ds = ar.open(f"{tmp}/{size}/atlas_remote")
    blocks = len(ds.block_ranges())
    seq_blocks = {ds.locate(i)[0] for i in range(min(SEQUENTIAL, n))}
    needed = sum(ds.shards[p].block_range(b).size for p, b in seq_blocks)
    shutil.rmtree(f"{tmp}/{size}")
    return urls, stored, blocks, needed


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="a fifth of the examples")
    parser.add_argument("--only", choices=("access", "epoch"), help="run one of the two kinds of table")
    parser.add_argument("--systems", default=",".join(SYSTEMS), help="a comma-separated subset of " + ",".join(SYSTEMS))
    parser.add_argument("--sizes", default=",".join(SIZES), help="a comma-separated subset of " + ",".join(SIZES))
    parser.add_argument("--repeats", type=int, default=2, help="runs of each measurement; the best is reported")
    parser.add_argument("--out", default=str(ROOT / "docs" / "peers.md"))
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(measure(*json.loads(args.child))))
        return

    from s3_endpoint import serve

    systems = [s for s in args.systems.split(",") if s]
    sizes = [s for s in args.sizes.split(",") if s]
    if set(systems) - set(SYSTEMS):
        parser.error(f"--systems: unknown {sorted(set(systems) - set(SYSTEMS))}")
    if set(sizes) - set(SIZES):
        parser.error(f"--sizes: unknown {sorted(set(sizes) - set(SIZES))}")
    command = "python benchmarks/peers.py" + "".join(
        f" {flag}"
        for flag, given in (
            ("--quick", args.quick),
            (f"--only {args.only}", args.only),
            (f"--systems {args.systems}", args.systems != ",".join(SYSTEMS)),
            (f"--sizes {args.sizes}", args.sizes != ",".join(SIZES)),
            (f"--repeats {args.repeats}", args.repeats != 2),
        )
        if given
    )
    sections, results = [], {}
    with tempfile.TemporaryDirectory() as tmp, serve(LATENCY) as endpoint:
        for size in sizes:
            tokens, n = SIZES[size]
            n = n // 5 if args.quick else n
            urls, stored, blocks, needed = prepare(tmp, size, n, tokens, endpoint)
            lines = [
                f"## Examples of about {LABELS[size]}",
                "",
                f"{n:,} examples (id, label, {tokens:,} uint16 tokens). Stored: "
                + ", ".join(f"{s} {mb(stored[s])} MB" for s in SYSTEMS if s in systems)
                + ".",
                "",
            ]
            if args.only != "epoch":
                lines += ["### Access", ""] + access_table(urls, endpoint, n, needed, systems, args.repeats) + [""]
            if args.only != "access":
                best = results[size] = epochs(urls, endpoint, n, systems, args.repeats)
                lines += ["### Shuffled epoch, batches of 32", ""]
                lines += epoch_rows(best, EPOCH_SYSTEMS, n, stored, blocks, mixture=False) + [""]
                lines += [f"### Mixture of two datasets, weights {WEIGHTS[0]}/{WEIGHTS[1]}, batches of 32", ""]
                lines += epoch_rows(best, MIXTURE_SYSTEMS, n, stored, blocks, mixture=True) + [""]
            sections += lines
            write_page(args.out, command, args.repeats, results, sections)  # after each size: a stopped run keeps it
    print(Path(args.out).read_text())


def write_page(out: str, command: str, repeats: int, results: dict, sections: list[str]) -> None:
    page = [
        "# Peers: atlas_remote, LitData, MosaicML Streaming",
        "",
        f"`{command}` (atlas_remote with the `obstore` extra): S3 endpoint with {LATENCY * 1000:.0f} ms per "
        f"request; each figure the best of {repeats} runs, alternated. Ratios within one run are what to "
        "compare; the raw figures move by 10-20 % between runs on this shared 2-core machine.",
        "",
    ]
    if results:
        page += ["## Summary: shuffled epoch, examples/s", ""] + summary_rows(results) + [""]
    page += sections + [NOTES, "## How it is measured", "", __doc__.split("\n\n", 2)[2]]
    Path(out).write_text("\n".join(page))


if __name__ == "__main__":
    main()
