"""A shuffled epoch from S3 at 20 ms a request against the same epoch read from a local folder (issue 47's generic
target: remote ÷ local ≥ 0.8), side by side in one run.

    python benchmarks/epoch_remote.py [--examples 20000] [--rounds 3]   # prints the table; docs/benchmarks.md quotes it

~2 KB examples (an id, a label and 1,000 uint16 tokens, as benchmarks/peers.py writes them), shards of 10,000,
blocks of 32; `ShuffledStream(ds, 32, num_workers=2).loader()`, each epoch in a fresh process (torch and
atlas_remote imported before the clock), the two alternated; medians and ranges of examples/s.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

LATENCY = 0.020
ENV = {"AWS_ACCESS_KEY_ID": "k", "AWS_SECRET_ACCESS_KEY": "s", "AWS_DEFAULT_REGION": "us-east-1"}


def measure(url: str, endpoint: str) -> dict:
    import torch.utils.data  # noqa: F401

    import atlas_remote as ar
    from atlas_remote.training import ShuffledStream

    start = time.perf_counter()
    options = {"endpoint_url": endpoint, "key": "k", "secret": "s"} if url.startswith("s3://") else None
    ds = ar.open(url, storage_options=options)
    loader = ShuffledStream(ds, 32, num_workers=2).loader()
    served = 0
    for batch in loader:
        served += len(batch["id"])
    return {"seconds": time.perf_counter() - start, "examples": served, "served_here": loader.served_here}


def child(url: str, endpoint: str) -> dict:
    args = [sys.executable, __file__, "--child", json.dumps([url, endpoint])]
    done = subprocess.run(args, capture_output=True, text=True, env={**os.environ, **ENV}, timeout=600)
    if done.returncode:
        return {"error": (done.stderr.strip().splitlines() or ["?"])[-1]}
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(measure(*json.loads(args.child))))
        return
    import s3fs
    from peers import write_atlas
    from s3_endpoint import serve

    os.environ.update(ENV)
    with tempfile.TemporaryDirectory() as tmp, serve(LATENCY) as endpoint:
        local = f"{tmp}/ds"
        write_atlas(local, range(args.examples), 1_000)
        fs = s3fs.S3FileSystem(endpoint_url=endpoint, key="k", secret="s", skip_instance_cache=True)
        fs.mkdir("bench")
        fs.put(local, "bench/ds", recursive=True)
        load = os.getloadavg()[0]
        runs: dict[str, list[dict]] = {"local": [], "s3": []}
        for r in range(args.rounds):
            for name, url in (("local", local), ("s3", "s3://bench/ds"))[:: 1 if r % 2 == 0 else -1]:
                got = child(url, endpoint)
                print(f"round {r} {name}: {json.dumps(got)}", file=sys.stderr, flush=True)
                if "error" not in got:
                    runs[name].append(got)
        load_after = os.getloadavg()[0]
    rates = {k: [g["examples"] / g["seconds"] for g in v] for k, v in runs.items()}
    ratios = [s / lo for s, lo in zip(rates["s3"], rates["local"])]

    def spread(values: list[float], fmt: str) -> str:
        return f"{format(statistics.median(values), fmt)} ({format(min(values), fmt)}–{format(max(values), fmt)})"

    print(f"load average {load:.1f} / {load_after:.1f}")
    print("| measure | target (floor) | median (range) | S3 at 20 ms | local |")
    print("| --- | --- | --- | --- | --- |")
    print(
        f"| remote shuffled epoch ÷ local, ~2 KB examples, 2 workers | ≥ 0.8 (0.7) | {spread(ratios, '.2f')} | "
        f"{spread(rates['s3'], ',.0f')} examples/s | {spread(rates['local'], ',.0f')} examples/s |"
    )


if __name__ == "__main__":
    main()
