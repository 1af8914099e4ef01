"""The language-model path, measured: TokenStream against ShuffledStream on S3 at 20 ms a request, what packing
drops, what counting tokens costs, and how a 0.7/0.3 mixture fills batches of 32.

- Throughput: documents of 5 to 300 uint16 tokens on benchmarks/s3_endpoint.py (moto behind a constant-time
  front, LATENCY added to every request), 2 DataLoader workers each. ShuffledStream yields the documents
  themselves (ragged, padded by the default collation); TokenStream packs them into rows of 2,048 tokens. The
  ratio compares tokens/s with examples/s x mean tokens per example, best of REPEATS epochs each, alternated.
- Counting tokens (TokenCounts.of: one pass, in order, with read-ahead) against one ShuffledStream epoch.
- Mixture figures, read off the plans' orders alone (no data): datasets of 200,000 and 100,000 examples in
  blocks of 64, the default windows, 2 workers, weights 0.7/0.3, batches of 32.

    python benchmarks/language_model.py [--documents 100000] [--repeats 2]
        # writes the "Language models" section of docs/benchmarks.md
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
from atlas_remote.training import ShuffledStream
from atlas_remote.training.epoch_state import Deal, intervals
from atlas_remote.training.plan import EpochPlan, Layout, Source

LATENCY = 0.02
SEQ_LEN = 2047  # rows of 2,048 tokens


def make_documents(url: str, n: int, options: dict) -> float:
    """n documents of 5 to 300 uint16 tokens (shards of 10,000, blocks of 64); their mean length."""
    rng = np.random.default_rng(0)
    lengths = rng.integers(5, 301, n)
    with ar.AtlasDatasetWriter(url, 10_000, 64, storage_options=options) as writer:
        for i, length in enumerate(lengths.tolist()):
            writer.add_example({"id": i, "tokens": rng.integers(1, 50_000, length, dtype=np.uint16)})
    return float(lengths.mean())


def epoch(loader, count) -> tuple[float, int]:
    start, served = time.perf_counter(), 0
    for batch in loader:
        served += count(batch)
    return time.perf_counter() - start, served


def throughput(documents: int, repeats: int) -> list[str]:
    import s3fs

    with serve_s3(LATENCY) as endpoint:
        options = {"endpoint_url": endpoint, "key": "k", "secret": "s"}
        s3fs.S3FileSystem(**options, skip_instance_cache=True).mkdir("bench")
        url = "s3://bench/documents"
        mean = make_documents(url, documents, options)
        ds = ar.open(url, storage_options=options)
        start = time.perf_counter()
        counts = ar.TokenCounts.of(ds)
        counting = time.perf_counter() - start
        counts.save(f"{url}.tokens", options)
        examples_s, tokens_s = [], []
        for _ in range(repeats):  # alternated, so that a busy moment of the shared machine hits both
            stream = ShuffledStream(ds, 32, num_workers=2)
            seconds, n = epoch(stream.loader(), lambda b: len(b["id"]))
            examples_s.append(n / seconds)
            tokens = ar.TokenStream(ds, SEQ_LEN, batch_size=8, num_workers=2, counts=f"{url}.tokens")
            seconds, n = epoch(tokens.loader(), lambda b: b["tokens"].numel())
            tokens_s.append(n / seconds)
        ((total, dropped),) = tokens.dropped
        shuffled_epoch = documents / max(examples_s)
    ratio = max(tokens_s) / (max(examples_s) * mean)
    return [
        "| measure | target | measured | detail |",
        "| --- | --- | --- | --- |",
        f"| TokenStream tokens/s / (ShuffledStream examples/s x mean tokens per example), S3 at "
        f"{LATENCY * 1000:.0f} ms, 2 workers | ≥ 0.9 | {ratio:.2f} | {max(tokens_s):,.0f} tokens/s vs "
        f"{max(examples_s):,.0f} examples/s x {mean:.1f}; rows of {SEQ_LEN + 1}, runs of {tokens.epochs.run_blocks} "
        f"blocks; best of {repeats} |",
        f"| tokens packing leaves out (what runs leave over after whole rows) | < 1 % | {100 * dropped / total:.2f} % "
        f"| {dropped:,} of {total:,} tokens, stated exactly by `TokenStream.dropped` |",
        f"| counting tokens once (TokenCounts.of) / one ShuffledStream epoch | | {counting / shuffled_epoch:.2f} | "
        f"{counting:.1f} s vs {shuffled_epoch:.1f} s; the counts: {len(counts.blocks) * 4:,} bytes, 4 a block |",
    ]


def shares(batches: list[list[int]]) -> tuple[float, float, float]:
    share = np.array([np.mean(np.asarray(b) == 0) for b in batches])
    return float(share.mean()), float(share.std()), float(np.mean((share == 0) | (share == 1)))


def mixture_figures() -> list[str]:
    a, b = Layout.of([10_000] * 20, [64] * 20), Layout.of([10_000] * 10, [64] * 10)
    plan = EpochPlan([Source(a, 140_000), Source(b, 60_000)], seed=0, epoch=0, window_blocks=64, run_blocks=8)
    deal = Deal(plan, intervals(), 2, 32)
    batches = []
    for piece in deal.pieces:
        order = [d for start, stop in piece.tolist() for _, d, ex in plan.examples(start, stop) for _ in ex]
        batches += [order[i : i + 32] for i in range(0, len(order) - 31, 32)]
    mean, sd, alone = shares(batches)
    rng = np.random.default_rng(0)
    independent = shares([(rng.random(32) >= 0.7).astype(int).tolist() for _ in range(len(batches))])
    return [
        "| 0.7/0.3 mixture, batches of 32 | target | mixed inside batches | independent draws | windows merged (before) |",
        "| --- | --- | --- | --- | --- |",
        f"| share of A in a batch: standard deviation | ≤ 0.15 | {sd:.3f} | {independent[1]:.3f} | 0.457 |",
        f"| batches from one dataset alone | ≤ 1 % | {100 * alone:.2f} % | {100 * independent[2]:.2f} % | 99.5 % |",
        f"| share of A: mean | 0.70 ± 0.02 | {mean:.3f} | {independent[0]:.3f} | 0.700 |",
        "",
        f'{len(batches):,} batches, blocks of {plan.mix:,} positions mixed together. "Before" is what the issue '
        "measured on the plan that merged whole windows (a window of one dataset at a time).",
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--documents", type=int, default=100_000)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory():
        rows = throughput(args.documents, args.repeats)
    lines = [
        "## Language models",
        "",
        f"Written by `python benchmarks/language_model.py` ({args.documents:,} documents of 5 to 300 uint16 tokens, "
        "on benchmarks/s3_endpoint.py adding "
        f"{LATENCY * 1000:.0f} ms a request; the machine was shared with other work, so the ratios matter, not the "
        "rates).",
        "",
        *rows,
        "",
        *mixture_figures(),
    ]
    write_section("## Language models", lines)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
