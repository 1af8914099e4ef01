"""atlas_remote beside its peers, MosaicML Streaming and LitData, on the same examples and the same S3 endpoint.

    pip install -e ".[bench]"      # the peers; not needed by the tests
    python benchmarks/peers.py     # writes docs/peers.md; --quick for a smaller run

The endpoint is `benchmarks/s3_endpoint.py`: moto behind a front that answers object GET/HEAD in constant time,
with 20 ms added to every request. Each library writes the same examples in its own format (zstd everywhere,
4 MB chunks/shards for the peers, blocks of 32 for Atlas), they are uploaded, and then every measurement runs in
a fresh process with its own empty cache folder. Requests and bytes are the endpoint's own counts; cache disk is
the cache folder's size when the measurement ends.

Access (the reader issue): time to first example; 200 random examples one at a time and as one batch; 20,000
sequential examples (atlas_remote with `ds.iter(0, 20_000)`, the peers by stopping their iterator). Before its timer starts, each process opens the dataset once with another cache folder, so
every library has made its S3 client (botocore, where a library uses it, loads its service models once per
process, about 0.3 s); the cold figure without that warm-up, import of the library included, is reported too.

Epoch (the training issue): one shuffled epoch with each library's own loader, batches of 32, with 0, 2 and 4
DataLoader workers; examples/s, first batch, requests, bytes moved, cache disk, and "near pairs": the share of
consecutive examples whose indices lie within 32 of each other (unshuffled ~1.0, uniform ~0.0006).
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
TOKENS = 512  # uint16 tokens: ~1.1 KB per example with the id and label
SYSTEMS = ("atlas_remote", "litdata", "streaming")
CHUNK_BYTES = 4_000_000
ATLAS_SHARD, ATLAS_BLOCK = 10_000, 32
OPTIONS_ENV = {"AWS_ACCESS_KEY_ID": "k", "AWS_SECRET_ACCESS_KEY": "s", "AWS_DEFAULT_REGION": "us-east-1"}


NOTES = """## Reading the tables

- **Where an epoch's time goes with DataLoader workers.** torch hands each tensor a worker returns to the main
  process through a shared-memory file and a file descriptor. Measured alone on 2 cores, 3,125 batches of three
  tensors took 5.6 s to cross from 2 workers, and 0.9 s as numpy arrays through the pipe. That cost, not the
  storage, dominated every library's 2- and 4-worker epochs. `ShuffledStream.loader()` and `TensorLoader`
  collate to numpy in the workers and make tensors in the main process (`torch.as_tensor`, no copy); LitData's
  and Streaming's loaders return tensors from the workers.
- **Inside a worker** (cProfile, 0 workers): before the change, `default_collate` made a tensor of each
  example's array (about 20 µs apiece, 0.4 s of a 20,000-example pass); numpy now stacks a batch's arrays at
  once. With 2 workers (py-spy, every thread sampled), a worker's threads mostly wait: decompression (about 4 %
  of samples), unpickling (3 %), `np.stack` (3 %) and sending batches (4 %) are the work; the main process used
  1.1 s of CPU in a 4.8 s epoch, mostly receiving batches and `default_convert`. The 2 cores are shared by the
  main process, the workers and the S3 endpoint, which is why 0 workers is as fast as 2 here.
- **Requests.** A shuffled epoch reads runs of 8 consecutive blocks (one request each), mixed 8 runs to a
  window of 64 blocks, 2 windows ahead. Requests per block stay well under 1 and bytes moved within a few
  percent of the stored bytes (each worker also reads the shards' index and dictionary files).
- **200 random examples in one batch** (0.31 s; 0.66 s through s3fs, measured the same way) is bound by the
  HTTP client's CPU more than by latency. s3fs/aiobotocore spends about 1.4 ms of CPU per request, so 194 block
  reads took 0.45 s at 20 ms in a side-by-side run, against 0.18 s through obstore (0.27 s and 0.05 s of CPU).
  With the `obstore` extra (installed here), every read of an `s3://` dataset (GET, HEAD, listing) goes through
  obstore; the batch also opens the 10 shards it touches (meta, index, dictionary, checksums, and a HEAD of
  data.bin each).
- **First example in a fresh process** ("cold") counts the library's import: atlas_remote's is about 0.19 s,
  mostly numpy and fsspec. A process that only reads an `s3://` dataset through obstore never imports s3fs nor
  builds botocore's client (0.35 s); before it did, atlas_remote's cold first example took 0.64 s.
- **200 random examples one at a time** cost one round trip each for atlas_remote (no read-ahead can know the
  next index). The peers download whole chunks (4 MB here) and serve the rest from their disk cache, so they
  win this row by moving the whole dataset, and keeping it on disk.
- **MosaicML Streaming with DataLoader workers** did not finish within the time limit in these runs: a worker
  waits in `_each_sample_id` for a shard whose download state another process owns (seen with py-spy). With 0
  workers it runs, slowly, at about 1,700 examples/s.
- Numbers move by 10-20 % between runs on these shared machines; compare ratios within one run.
"""


def example(i: int) -> dict:
    """A token sequence as text data looks after tokenization: skewed ids, so zstd has something to do."""
    import numpy as np

    rng = np.random.default_rng(i)
    return {"id": i, "label": i % 10, "tokens": np.minimum(rng.zipf(1.3, TOKENS), 50_000).astype(np.uint16)}


# -- writing the three datasets ------------------------------------------------------------------------------------


def write_atlas(out: str, n: int) -> None:
    import atlas_remote as ar

    with ar.AtlasDatasetWriter(
        out, ATLAS_SHARD, ATLAS_BLOCK, ar.CompressionStrategy.SHARED_DICTIONARY_COMPRESSION
    ) as w:
        for i in range(n):
            w.add_example(example(i))


def write_litdata(out: str, n: int) -> None:
    from litdata import optimize

    optimize(
        fn=example,
        inputs=list(range(n)),
        output_dir=out,
        chunk_bytes=CHUNK_BYTES,
        compression="zstd",
        num_workers=1,
        mode="overwrite",
        start_method="fork",
    )


def write_streaming(out: str, n: int) -> None:
    from streaming import MDSWriter

    columns = {"id": "int", "label": "int", "tokens": f"ndarray:uint16:{TOKENS}"}
    with MDSWriter(out=out, columns=columns, compression="zstd", size_limit=CHUNK_BYTES) as w:
        for i in range(n):
            w.write(example(i))


# -- one measurement, in a fresh process ----------------------------------------------------------------------------


def open_dataset(system: str, url: str, cache: str, endpoint: str, shuffle: bool = False):
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


def loader(system: str, ds, workers: int, dataset_url: str, endpoint: str):
    """Each library's recommended way to feed a training loop with a shuffled epoch."""
    from torch.utils.data import DataLoader

    if system == "litdata":
        from litdata import StreamingDataLoader

        return StreamingDataLoader(ds, batch_size=BATCH, num_workers=workers)
    if system == "streaming":
        return DataLoader(ds, batch_size=BATCH, num_workers=workers)
    from atlas_remote import training

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
        ds[0]
        del ds
        if kind == "streaming":
            clean_stale_shared_memory()
        if step == "epoch":  # torch and the loader's module are loaded before the clock starts, for all
            loader(system, open_dataset(kind, url, f"{scratch}/warm2", endpoint), 0, url, endpoint)
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
        examples = ds.iter(0, 20_000) if kind == "atlas_remote" else itertools.islice(iter(ds), 20_000)
        result["ids"] = [int(x["id"]) for x in examples]
    elif step == "epoch":
        ids = []
        for batch in loader(system, ds, workers, url, endpoint):
            if not ids:
                result["first"] = time.perf_counter() - start
            ids += [int(i) for i in batch["id"]]
        result["ids"] = ids
    result["seconds"] = time.perf_counter() - start
    after = served(endpoint)
    result["requests"] = sum(after["requests"].values()) - sum(before["requests"].values())
    result["bytes"] = sum(after["bytes"].values()) - sum(before["bytes"].values())
    result["cache"] = disk_bytes(cache) if os.path.exists(cache) else 0
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
        return {"error": f"did not finish in {timeout:.0f} s"}
    if child.returncode:
        return {"error": err.strip().splitlines()[-1] if err.strip() else f"exit {child.returncode}"}
    return json.loads(out.strip().splitlines()[-1])


# -- the tables -----------------------------------------------------------------------------------------------------


def near_pairs(ids: list[int]) -> float:
    return sum(abs(a - b) <= BATCH for a, b in zip(ids, ids[1:])) / max(len(ids) - 1, 1)


def mb(n: int) -> str:
    return f"{n / 1e6:.1f}"


def access_table(urls: dict, endpoint: str, n: int, needed: int, systems: list[str]) -> list[str]:
    rows = [
        "| system | first example (warm / cold) | 200 random, one at a time | 200 random, one batch | "
        "20,000 sequential: examples/s | requests (first / random / batch / seq) | MB moved (seq) | "
        "cache disk (seq) |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for system in systems:
        got = {step: run_child(system, step, urls[system], endpoint, n) for step in ("first", "random", "sequential")}
        got["cold"] = run_child(system, "first", urls[system], endpoint, n, warm=False)
        got["batch"] = (
            run_child(system, "batch", urls[system], endpoint, n)
            if system == "atlas_remote"
            else {"error": "no batch call"}
        )
        print(
            system, json.dumps({k: {x: y for x, y in v.items() if x != "ids"} for k, v in got.items()}), file=sys.stderr
        )
        seq = got["sequential"]
        if "ids" in seq and seq["ids"] != list(range(20_000)):
            seq = {"error": "sequential order is wrong"}
        got["sequential"] = seq
        secs = {step: got[step].get("error") or f"{got[step]['seconds']:.3f} s" for step in got}
        if "error" in seq:
            speed = moved = disk = seq["error"]
        else:
            speed = f"{20_000 / seq['seconds']:,.0f}"
            moved = f"{mb(seq['bytes'])} ({seq['bytes'] / needed:.2f}× the stored bytes of the examples read)"
            disk = f"{mb(seq['cache'])} MB"
        requests = " / ".join(str(got[s].get("requests", "—")) for s in ("first", "random", "batch", "sequential"))
        rows.append(
            f"| {system} | {secs['first']} / {secs['cold']} | {secs['random']} | {secs['batch']} | {speed} | "
            f"{requests} | {moved} | {disk} |"
        )
    return rows


def epoch_table(urls: dict, endpoint: str, n: int, stored: dict, blocks: int, only: list[str]) -> list[str]:
    rows = [
        "| system | workers | epoch | examples/s | first batch | requests | MB moved (÷ stored) | cache disk | "
        "near pairs |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    systems = [
        s
        for s in (
            "litdata",
            "atlas_remote",
            "atlas_remote (samplers)",
            "atlas_remote (AtlasIterableDataset)",
            "streaming",
        )
        if s.split(" ")[0] in only
    ]
    for workers in (2, 0, 4):
        for system in systems:
            got = run_child(system, "epoch", urls[system.split(" ")[0]], endpoint, n, workers, timeout=150)
            print(system, workers, json.dumps({k: v for k, v in got.items() if k != "ids"}), file=sys.stderr)
            if "error" in got:
                rows.append(f"| {system} | {workers} | {got['error']} | | | | | | |")
                continue
            if sorted(got["ids"]) != list(range(n)):
                rows.append(f"| {system} | {workers} | wrong examples: {len(got['ids'])} seen | | | | | | |")
                continue
            requests = f"{got['requests']:,}" + (
                f" ({got['requests'] / blocks:.2f}/block)" if "atlas" in system else ""
            )
            rows.append(
                f"| {system} | {workers} | {got['seconds']:.1f} s | {n / got['seconds']:,.0f} | "
                f"{got['first']:.2f} s | {requests} | {mb(got['bytes'])} "
                f"({got['bytes'] / stored[system.split(' ')[0]]:.2f}) | {mb(got['cache'])} MB | "
                f"{near_pairs(got['ids']):.3f} |"
            )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="20,000 examples instead of 100,000")
    parser.add_argument("--only", choices=("access", "epoch"), help="run one of the two tables")
    parser.add_argument("--systems", default=",".join(SYSTEMS), help="a comma-separated subset of " + ",".join(SYSTEMS))
    parser.add_argument("--out", default=str(ROOT / "docs" / "peers.md"))
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(measure(*json.loads(args.child))))
        return

    import s3fs
    from s3_endpoint import serve

    import atlas_remote as ar

    n = 20_000 if args.quick else 100_000
    systems = [s for s in args.systems.split(",") if s]
    if set(systems) - set(SYSTEMS):
        parser.error(f"--systems: unknown {sorted(set(systems) - set(SYSTEMS))}")
    with tempfile.TemporaryDirectory() as tmp, serve(LATENCY) as endpoint:
        local = {s: f"{tmp}/{s}" for s in SYSTEMS}
        for system, write in (
            ("atlas_remote", write_atlas),
            ("litdata", write_litdata),
            ("streaming", write_streaming),
        ):
            start = time.perf_counter()
            write(local[system], n)
            print(f"wrote {system} in {time.perf_counter() - start:.1f} s", file=sys.stderr)
        fs = s3fs.S3FileSystem(endpoint_url=endpoint, key="k", secret="s", skip_instance_cache=True)
        fs.mkdir("bench")
        urls = {s: f"s3://bench/{s}" for s in SYSTEMS}
        for system in SYSTEMS:
            fs.put(local[system], f"bench/{system}", recursive=True)
        stored = {s: disk_bytes(local[s]) for s in SYSTEMS}
        ds = ar.open(local["atlas_remote"])
        blocks = len(ds.block_ranges())
        seq_blocks = {ds.locate(i)[0] for i in range(20_000)}
        needed = sum(ds.shards[p].block_range(b).size for p, b in seq_blocks)

        lines = [
            "# Peers: atlas_remote, LitData, MosaicML Streaming",
            "",
            f"`python benchmarks/peers.py{' --quick' if args.quick else ''}`: {n:,} examples of about 1.1 KB "
            f"(id, label, {TOKENS} uint16 tokens), S3 endpoint with {LATENCY * 1000:.0f} ms per request, "
            f"one run. Stored: " + ", ".join(f"{s} {mb(stored[s])} MB" for s in SYSTEMS) + ".",
            "",
        ]
        if args.only != "epoch":
            lines += ["## Access", ""] + access_table(urls, endpoint, n, needed, systems) + [""]
        if args.only != "access":
            lines += (
                ["## Shuffled epoch, batches of 32", ""]
                + epoch_table(urls, endpoint, n, stored, blocks, systems)
                + [""]
            )
        lines += [NOTES, "## How it is measured", "", __doc__.split("\n\n", 2)[2]]
        Path(args.out).write_text("\n".join(lines))
        print("\n".join(lines))


if __name__ == "__main__":
    main()
