"""Small epochs: 0 against 2 DataLoader workers on a corpus of about 1 M tokens, a first day's size.

A worker costs its start: a fresh interpreter from the fork server (where the training process reads through
obstore) or a fork, then its copy of the stream. On an epoch of a few seconds that start is most of the time. This
measures one pass of a `TokenStream` (rows of 512 tokens, batches of 8) from the loader's first call to its last
batch, the stream made before the clock starts (and with persistent workers, a later epoch's pass: their start
paid by the first), on S3 at 20 ms a request (benchmarks/s3_endpoint.py) and on a
local disk, for documents of about 100 uint16 tokens (about 200 B an example) and about 1,000 (about 2 KB): the
same 1 M tokens either way. Each configuration runs REPEATS times, alternated, so that a busy moment of the shared
machine hits all of them; the best is kept and the ratio is of the best.

    python benchmarks/small_epochs.py [--repeats 3]     # writes the "Small epochs" section of docs/benchmarks.md
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from convert import write_section
from s3_endpoint import serve as serve_s3

import atlas_remote as ar

LATENCY = 0.02
TOKENS = 1_000_000
SEQ_LEN, BATCH = 511, 8
SIZES = {"about 200 B": 100, "about 2 KB": 1_000}  # mean tokens a document (uint16: 2 bytes a token)


def corpus(url: str, mean: int, options: dict | None) -> None:
    """About TOKENS tokens in documents of mean +- half tokens, counted as they are written."""
    rng = np.random.default_rng(0)
    lengths = rng.integers(mean // 2, mean * 3 // 2 + 1, TOKENS // mean)
    with ar.AtlasDatasetWriter(url, 10_000, 64, storage_options=options, tokens="tokens") as writer:
        writer.add_examples({"tokens": rng.integers(1, 50_000, n).astype(np.uint16)} for n in lengths.tolist())


def one_pass(url: str, options: dict | None, workers: int, persistent: bool = False) -> float:
    """Seconds of one pass from the loader's first call; `persistent`: a later epoch's pass, its workers up."""
    stream = ar.TokenStream(ar.open(url, storage_options=options), SEQ_LEN, batch_size=BATCH, num_workers=workers)
    loader = stream.loader(persistent_workers=True) if persistent else stream.loader()
    if persistent:
        for _ in loader:  # the first epoch starts the workers
            pass
    start = time.perf_counter()
    rows = sum(len(batch["tokens"]) for batch in loader)
    seconds = time.perf_counter() - start
    assert rows > 0
    return seconds


def measure(repeats: int) -> list[str]:
    import s3fs

    lines = [
        "| store | documents | 0 workers | 2 workers | 2 workers ÷ 0 | 2 persistent workers, a later epoch | ÷ 0 |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    with serve_s3(LATENCY) as endpoint, tempfile.TemporaryDirectory() as folder:
        options = {"endpoint_url": endpoint, "key": "k", "secret": "s"}
        s3fs.S3FileSystem(**options, skip_instance_cache=True).mkdir("bench")
        places = {
            f"S3, {LATENCY * 1000:.0f} ms a request": (lambda name: f"s3://bench/{name}", options),
            "local disk": (lambda name: f"{folder}/{name}", None),
        }
        for store, (place, opts) in places.items():
            for label, mean in SIZES.items():
                url = place(f"tokens-{mean}")
                corpus(url, mean, opts)
                best = {"0": float("inf"), "2": float("inf"), "2p": float("inf")}
                for _ in range(repeats):
                    for key in best:
                        seconds = one_pass(url, opts, int(key[0]), persistent=key == "2p")
                        best[key] = min(best[key], seconds)
                lines.append(
                    f"| {store} | {label} ({TOKENS // mean:,} of {mean:,} tokens) | {best['0']:.2f} s | "
                    f"{best['2']:.2f} s | {best['2'] / best['0']:.1f} | {best['2p']:.2f} s | {best['2p'] / best['0']:.1f} |"
                )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    lines = measure(args.repeats)
    print("\n".join(lines))
    write_section(
        "## Small epochs: 0 or 2 DataLoader workers",
        [
            "## Small epochs: 0 or 2 DataLoader workers",
            "",
            f"Written by `python benchmarks/small_epochs.py` (one pass of a TokenStream over about {TOKENS:,} tokens, "
            f"rows of {SEQ_LEN + 1}, batches of {BATCH}; best of {args.repeats}, alternated; the loader's first call "
            "to its last batch). The machine is shared and has 2 cores: the ratios matter, not the rates.",
            "",
            *lines,
            "",
            'What to choose: docs/training.md, "How many workers".',
        ],
    )


if __name__ == "__main__":
    main()
