"""The `atlas-remote` command: a demo, and a look at any dataset."""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
from pprint import pformat

from .commit import recover
from .format import CHECKSUM_FILE, CompressionStrategy
from .reader import AtlasDataset
from .verify import NO_CHECKSUMS, add_checksums, verify
from .writer import AtlasDatasetWriter


def _options(text: str | None) -> dict | None:
    return json.loads(text) if text else None


def demo(url: str | None, storage_options: dict | None, overwrite: bool) -> None:
    """Write a small dataset, then read random examples back, printing what each step cost in requests."""
    with tempfile.TemporaryDirectory(prefix="atlas-demo-") as scratch:
        url = url or f"{scratch}/demo-dataset"
        print(f"writing 5,000 examples to {url} (shards of 1,000, blocks of 50, shared dictionary)")
        with AtlasDatasetWriter(url, shard_size=1000, block_size=50, storage_options=storage_options,
                                compression_strategy=CompressionStrategy.SHARED_DICTIONARY_COMPRESSION,
                                overwrite=overwrite) as writer:
            rng = random.Random(0)
            words = "atlas remote shard block index bucket token epoch batch cache".split()
            for i in range(5000):
                writer.add_example({"id": i, "text": " ".join(rng.choice(words) for _ in range(rng.randint(5, 40)))})
        ds = AtlasDataset(url, storage_options)
        print(f"opened: {ds!r}\n  {ds.stats}")
        print("each read below: the first in a shard also fetches that shard's metadata (meta.json, index.npy,\n"
              "checksums, data.bin's size) in one round trip; after that, one ranged read per uncached block")
        for i in random.Random(1).sample(range(len(ds)), 5):
            ds.reset_stats()
            example = ds[i]
            print(f"ds[{i}] -> id {example['id']}: {example['text'][:40]!r}...\n  {ds.stats}")
        ds.reset_stats()
        batch = ds.get_many(random.Random(2).sample(range(len(ds)), 256))
        print(f"ds.get_many(256 random indices) -> {len(batch)} examples\n  {ds.stats}")


def info(url: str, storage_options: dict | None) -> None:
    ds = AtlasDataset(url, storage_options)
    print(repr(ds))
    missing = sorted(set(range(len(ds.metadata.shard_sizes))) - {s.number for s in ds.shards})
    if missing:
        print(f"missing shards (not served): {missing}")
    names = {s.name for s in ds.shards}
    with_sums = {rel.split("/")[0] for rel in ds._store.find() if rel.endswith(f"/{CHECKSUM_FILE}")} & names
    if len(with_sums) == len(names):
        print("checksums: every shard has block checksums (CRC-32), verified on every read")
    else:
        print(f"checksums: {len(names) - len(with_sums)} of {len(names)} shards have none: {NO_CHECKSUMS}")
    print(ds.stats)


def get(url: str, indices: list[int], storage_options: dict | None, trusted: bool) -> None:
    ds = AtlasDataset(url, storage_options, trusted=trusted)
    for i, example in zip(indices, ds.get_many(indices)):
        print(f"[{i}] {pformat(example, width=120)}")
    print(ds.stats, file=sys.stderr)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="atlas-remote", description=__doc__)
    parser.add_argument("--storage-options", metavar="JSON", help='fsspec options, e.g. \'{"anon": true}\'')
    commands = parser.add_subparsers(dest="command", required=True)
    p = commands.add_parser("demo", help="write a small dataset and read it back, showing the request counts")
    p.add_argument("--url", help="where to write it (default: a temporary local folder)")
    p.add_argument("--overwrite", action="store_true", help="replace a dataset already at --url")
    p = commands.add_parser("info", help="describe the dataset at URL")
    p.add_argument("url")
    p = commands.add_parser("get", help="print examples")
    p.add_argument("url")
    p.add_argument("indices", nargs="+", type=int)
    p.add_argument("--trusted", action="store_true", help="unpickle without restrictions (datasets you trust)")
    p = commands.add_parser("verify", help="decode every block, check sizes, counts and checksums; exit 1 on problems")
    p.add_argument("url")
    p.add_argument("--trusted", action="store_true", help="unpickle without restrictions (datasets you trust)")
    p = commands.add_parser("checksum", help="add block checksums to a dataset written without them (other bytes untouched)")
    p.add_argument("url")
    p.add_argument("--trusted", action="store_true", help="unpickle without restrictions (datasets you trust)")
    p = commands.add_parser("recover", help="finish an interrupted commit, delete dead writers' staging, clear a stale lease")
    p.add_argument("url")
    p.add_argument("--force", action="store_true", help="also break a lease that has not expired (its writer must be dead)")
    args = parser.parse_args(argv)
    options = _options(args.storage_options)
    if args.command == "demo":
        demo(args.url, options, args.overwrite)
    elif args.command == "checksum":
        report = add_checksums(args.url, options, trusted=args.trusted)
        print(report)
        sys.exit(0 if report.ok else 1)
    elif args.command == "recover":
        print(recover(args.url, options, force=args.force))
    elif args.command == "info":
        info(args.url, options)
    elif args.command == "verify":
        report = verify(args.url, options, trusted=args.trusted)
        print(report)
        sys.exit(0 if report.ok else 1)
    else:
        get(args.url, args.indices, options, args.trusted)


if __name__ == "__main__":
    main()
