"""The `atlas-remote` command: convert, look at, check, copy and repair Atlas datasets on any URL.

Errors print one line (`atlas-remote: error: ...`, exit status 1; `--debug` shows the traceback), options go
before or after the subcommand, progress bars appear on a terminal only, and a closed pipe ends quietly.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile

from ..errors import DatasetNotFoundError
from ..format.spec import CompressionStrategy
from ..read.megatron import BLOCK_TOKENS, MegatronCorpus, is_megatron
from ..read.reader import AtlasDataset
from ..runtime.progress import Progress
from ..trust.key_files import config_path
from ..trust.keys import PRIVATE_KEY_ENV, TRUSTED_KEYS_ENV, create_private_key
from ..write.commit import recover
from ..write.copy import copy_dataset
from ..write.verify import NO_CHECKSUMS, add_checksums, add_manifest, verify
from ..write.writer import AtlasDatasetWriter
from .output import print_examples, print_range, say

# -- commands ----------------------------------------------------------------------------------------


def demo(args: argparse.Namespace) -> int:
    """Write a small dataset, then read random examples back, printing what each step cost in requests."""
    with tempfile.TemporaryDirectory(prefix="atlas-demo-") as scratch:
        url = args.url or f"{scratch}/demo-dataset"
        with AtlasDatasetWriter(  # refuses an existing dataset (without --overwrite) before saying anything
            url,
            shard_size=1000,
            block_size=50,
            storage_options=args.options,
            compression_strategy=CompressionStrategy.SHARED_DICTIONARY_COMPRESSION,
            overwrite=args.overwrite,
        ) as writer:
            print(f"writing 5,000 examples to {url} (shards of 1,000, blocks of 50, shared dictionary)")
            rng = random.Random(0)
            words = ["atlas", "remote", "shard", "block", "index", "bucket", "token", "epoch", "batch", "cache"]
            for i in range(5000):
                writer.add_example({"id": i, "text": " ".join(rng.choice(words) for _ in range(rng.randint(5, 40)))})
        ds = AtlasDataset(url, args.options)
        print(f"opened: {ds!r}\n  {ds.stats}")
        print(
            "each read below: the first in a shard also fetches that shard's atlas_blocks.npy (its blocks'\n"
            "offsets, CRC-32s and SHA-256s; its seal is in the manifest); after that, one ranged read per\n"
            "uncached block, checked against its SHA-256, which the seal signs"
        )
        for i in random.Random(1).sample(range(len(ds)), 5):
            ds.reset_stats()
            example = ds[i]
            print(f"ds[{i}] -> id {example['id']}: {example['text'][:40]!r}...\n  {ds.stats}")
        ds.reset_stats()
        batch = ds.get_many(random.Random(2).sample(range(len(ds)), 256))
        print(f"ds.get_many(256 random indices) -> {len(batch)} examples\n  {ds.stats}")
    return 0


def opened(args: argparse.Namespace) -> AtlasDataset | MegatronCorpus:
    """The dataset at the URL, or the Megatron corpus it names: an .idx or .bin, a glob of them, or a prefix with
    an .idx beside it where there is no dataset."""
    url = args.url
    if url.endswith((".idx", ".bin")) or any(c in url for c in "*?[{"):
        return MegatronCorpus(url, args.options, options=args.reader)
    try:
        return AtlasDataset(url, args.options, options=args.reader)
    except DatasetNotFoundError:
        if is_megatron(url, args.options):
            return MegatronCorpus(url, args.options, options=args.reader)
        raise


def info(args: argparse.Namespace) -> int:
    ds = opened(args)
    facts = ds.describe()
    if args.json:
        say(json.dumps(facts))
        return 0
    if isinstance(ds, MegatronCorpus):
        return corpus_info(facts)
    missing = facts["shards_missing"]
    sums = facts["shards_with_checksums"]
    lines = [
        (
            "examples",
            f"{facts['examples']:,}"
            + (f" of {facts['examples_in_root']:,} (shards {missing} missing)" if missing else ""),
        ),
        ("shards", f"{facts['shards_present']} of {facts['shards']} present"),
        (
            "strategy",
            f"{facts['compression_strategy']} (shards: "
            + ", ".join(f"{n} {k}" for k, n in facts["shard_strategies"].items())
            + ")",
        ),
        ("block size", ", ".join(map(str, facts["block_sizes"])) + " examples"),
        (
            "stored",
            f"{facts['bytes_stored']:,} bytes in data.bin"
            + (f", {facts['bytes_per_example']:,} per example" if facts["bytes_per_example"] else ""),
        ),
        (
            "dictionary",
            f"{facts['dictionary_bytes']:,} bytes"
            if isinstance(facts["dictionary_bytes"], int)
            else (f"{len(facts['dictionary_bytes'])} of them" if facts["dictionary_bytes"] else "none"),
        ),
        (
            "checksums",
            "every shard (CRC-32 per block, checked on every read)"
            if sums == facts["shards_present"]
            else f"{facts['shards_present'] - sums} of {facts['shards_present']} shards have none: {NO_CHECKSUMS}",
        ),
        ("signed", _signed(facts)),
        ("reads via", facts["read_client"]),
        (
            "requests",
            f"{sum(facts['requests'].values())} to describe it "
            + "("
            + ", ".join(f"{k} {v}" for k, v in sorted(facts["requests"].items()))
            + ")"
            + f", {facts['bytes_fetched']:,} bytes",
        ),
    ]
    say(facts["url"])
    for name, value in lines:
        say(f"  {name:<11} {value}")
    return 0


def corpus_info(facts: dict) -> int:
    end = facts["ends_with"]
    lines = [
        ("format", f"Megatron IndexedDataset, read in place ({len(facts['files'])} file(s))"),
        ("documents", f"{facts['documents']:,} ({facts['sequences']:,} sequences)"),
        (
            "tokens",
            f"{facts['tokens']:,} ({', '.join(facts['dtype'])})"
            + (f", {facts['tokens_per_document']:,} a document" if facts["tokens_per_document"] else ""),
        ),
        ("stored", f"{facts['bytes_stored']:,} bytes in .bin files"),
        (
            "ends with",
            f"token {end} in every document sampled (written with --append-eod: give TokenStream no eod)"
            if end is not None
            else "no one token (TokenStream's eod= adds one after each document)",
        ),
        ("blocks", ", ".join(map(str, facts["block_documents"])) + f" documents (about {BLOCK_TOKENS:,} tokens)"),
        ("reads via", facts["read_client"]),
        (
            "requests",
            f"{sum(facts['requests'].values())} to describe it ("
            + ", ".join(f"{k} {v}" for k, v in sorted(facts["requests"].items()))
            + f"), {facts['bytes_fetched']:,} bytes",
        ),
    ]
    say(facts["url"])
    for name, value in lines:
        say(f"  {name:<11} {value}")
    return 0


def _signed(facts: dict) -> str:
    """Whose key signed the dataset, and what follows for reading it."""
    signer, name = facts["signer"], facts["signer_name"]
    return {
        "yours": f"with your key {signer}: its blocks are read as your own (docs/security.md)",
        "trusted": f"with {name}, {signer}: its blocks are read as your own (docs/security.md)",
        "another key": f"with a key you do not trust, {signer}: its blocks are read as a stranger's, checked before "
        "loading (trust its public key, or `atlas-remote checksum URL` signs them with yours)",
        "earlier": "with this library's earlier signatures, which left its dictionary out: its blocks are read as a "
        "stranger's, checked before loading (`atlas-remote checksum URL` signs them again)",
        "none": "no: its blocks are read as a stranger's, checked before loading "
        "(`atlas-remote checksum URL` signs them with your key)",
    }[facts["signed"]]


def head(args: argparse.Namespace) -> int:
    ds = opened(args)
    print_examples(ds, range(min(args.n, len(ds))), args.json)
    return 0


def cat(args: argparse.Namespace) -> int:
    ds = opened(args)
    start, stop, _ = slice(args.start, args.stop).indices(len(ds))
    print_range(ds, start, stop, args.json)
    return 0


def get(args: argparse.Namespace) -> int:
    ds = opened(args)
    outside = [i for i in args.indices if not -len(ds) <= i < len(ds)]
    if outside:
        raise UsageError(f"{ds.url}: index {outside[0]} is out of range (the dataset has {len(ds):,} examples)")
    print_examples(ds, args.indices, args.json)
    return 0


def view_command(args: argparse.Namespace) -> int:
    from ..viewer import ViewerServer

    ds = opened(args)
    server = ViewerServer(ds, args.host, args.port)
    print(f"{ds.url}: {len(ds):,} examples, read-only at {server.url} (Ctrl-C stops)", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
        ds.close()  # its pools' threads end here, not in the interpreter's exit
    return 0


def verify_command(args: argparse.Namespace) -> int:
    total = sum(AtlasDataset(args.url, args.options, options=args.reader).metadata.shard_sizes)
    with Progress(total, "verify", args.quiet) as bar:
        report = verify(args.url, args.options, options=args.reader, progress=bar.update)
    say(report)
    return 0 if report.ok else 1


def checksum(args: argparse.Namespace) -> int:
    report = add_checksums(
        args.url, args.options, options=args.reader, progress=False if args.quiet else None, sign_with=args.sign_with
    )
    say(report)
    return 0 if report.ok else 1


def keygen(args: argparse.Namespace) -> int:
    key, made = create_private_key()
    where = "made" if made else "you have one already"
    say(
        f"{key.id}\n  your private key: {where} ({PRIVATE_KEY_ENV} or {config_path('private_key')}); writers sign with it"
    )
    say(f"  readers that trust it: add the line above to {TRUSTED_KEYS_ENV} or {config_path('trusted_keys')}")
    return 0


def index(args: argparse.Namespace) -> int:
    say(add_manifest(args.url, args.options))
    return 0


def recover_command(args: argparse.Namespace) -> int:
    say(recover(args.url, args.options, force=args.force))
    return 0


def cp(args: argparse.Namespace) -> int:
    src_options = args.src_options if args.src_options is not None else args.options
    dest_options = args.dest_options if args.dest_options is not None else args.options
    total = sum(AtlasDataset(args.src, src_options).metadata.shard_sizes)
    with Progress(total, "cp", args.quiet) as bar:
        report = copy_dataset(
            args.src,
            args.dest,
            src_options=src_options,
            dest_options=dest_options,
            overwrite=args.overwrite,
            workers=args.workers,
            progress=bar.update,
        )
    say(report)
    return 0


def convert_command(args: argparse.Namespace) -> int:
    from ..write.convert import convert, resolve_function

    src_options = args.src_options if args.src_options is not None else args.options
    dest_options = args.dest_options if args.dest_options is not None else args.options
    if (args.source_format is None) == (args.target_format is None):
        raise UsageError("convert needs --from FORMAT (into Atlas) or --to parquet (out of Atlas), one of them")
    if args.target_format is not None:
        return export_command(args, src_options, dest_options)
    source_options: dict = {"attributes": args.attributes.split(",")} if args.attributes else {}
    if args.columns:
        source_options["columns"] = args.columns.split(",")
    if args.split:
        source_options["split"] = args.split
    if args.map:
        if os.getcwd() not in sys.path:
            sys.path.insert(0, os.getcwd())  # --map module:function finds modules where it is run, as `python -m` does
        try:
            resolve_function(args.map)
        except ValueError as err:
            raise UsageError(f"--map: {err}") from None
    report = convert(
        args.src if len(args.src) > 1 else args.src[0],
        args.dest,
        args.source_format,
        shard_size=args.shard_size,
        block_size=args.block_size,
        compression_strategy=CompressionStrategy[args.compression.upper()],
        workers=args.workers,
        engine=args.engine,
        overwrite=args.overwrite,
        resume=args.resume,
        src_options=src_options,
        dest_options=dest_options,
        source_options=source_options,
        progress=False if args.quiet else None,
        map=args.map,
        tokens=args.tokens,
        dtype=args.dtype,
    )
    say(report)
    return 0


def export_command(args: argparse.Namespace, src_options: dict | None, dest_options: dict | None) -> int:
    """convert SRC DEST --to parquet: one Atlas dataset out to one Parquet file."""
    from ..read.export import schema_of, to_parquet

    if len(args.src) != 1:
        raise UsageError(f"--to parquet takes one dataset, not {len(args.src)}")
    schema = schema_of(args.schema_from, src_options) if args.schema_from else None
    ds = AtlasDataset(args.src[0], src_options, options=args.reader)
    report = to_parquet(
        ds,
        args.dest,
        dest_options,
        start=args.start or 0,
        stop=args.stop,
        schema=schema,
        overwrite=args.overwrite,
        progress=False if args.quiet else None,
    )
    say(report)
    return 0


class UsageError(Exception):
    """A command line that cannot be run as given."""
