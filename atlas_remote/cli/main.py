"""The `atlas-remote` command line: its arguments (one subcommand each in commands.py), and how a run ends: one
line for an error the user can act on (`--debug` for the traceback), exit status 1; 130 on Ctrl-C; a closed pipe
quietly."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable

from .. import __version__
from ..errors import AtlasError, UnsafePickleError, one_line
from ..format.spec import CompressionStrategy
from ..importers import FORMATS
from ..read.options import ReaderOptions
from .commands import (
    UsageError,
    cat,
    checksum,
    convert_command,
    cp,
    demo,
    get,
    head,
    index,
    info,
    keygen,
    recover_command,
    verify_command,
    view_command,
)
from .output import messages_one_line_each


def _json_option(text: str | None, flag: str) -> dict | None:
    if text is None:
        return None
    try:
        value = json.loads(text)
    except json.JSONDecodeError as err:
        raise UsageError(f"{flag} is not valid JSON ({err.msg} at column {err.colno}): {text}") from None
    if not isinstance(value, dict):
        raise UsageError(f"{flag} must be a JSON object like '{{\"anon\": true}}', got: {text}")
    return value


def positive(text: str) -> int:
    """argparse's type for counts and sizes: a whole number above zero."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a whole number above 0, got {text!r}")
    return value


def parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)  # accepted before and after the subcommand
    common.add_argument(
        "--storage-options",
        metavar="JSON",
        default=argparse.SUPPRESS,
        help='fsspec options for the URL(s), e.g. \'{"anon": true}\' or \'{"endpoint_url": "..."}\'',
    )
    common.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help="show tracebacks")
    common.add_argument("--quiet", "-q", action="store_true", default=argparse.SUPPRESS, help="no progress bars")
    main = argparse.ArgumentParser(
        prog="atlas-remote",
        parents=[common],
        description=__doc__.split("\n")[0],
        epilog="S3 credentials and endpoints also come from the environment "
        "(AWS_PROFILE, AWS_ACCESS_KEY_ID, AWS_ENDPOINT_URL, ...).",
    )
    main.add_argument("--version", action="version", version=f"atlas-remote {__version__}")
    commands = main.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(name: str, run: Callable[[argparse.Namespace], int], help: str) -> argparse.ArgumentParser:
        p = commands.add_parser(name, parents=[common], help=help, description=help)
        p.set_defaults(run=run)
        return p

    p = command("demo", demo, "write a small dataset and read it back, showing the request counts")
    p.add_argument("--url", help="where to write it (default: a temporary local folder)")
    p.add_argument("--overwrite", action="store_true", help="replace a dataset already at --url")
    p = command(
        "info",
        info,
        "describe a dataset (or a Megatron corpus): examples, shards, strategy, sizes, checksums, requests",
    )
    p.add_argument("url")
    p.add_argument("--json", action="store_true", help="one JSON object")
    for name, run, help in (
        ("head", head, "print the first examples"),
        ("cat", cat, "print examples START..STOP in order (all by default)"),
        ("get", get, "print the examples at the given indices"),
    ):
        p = command(name, run, help)
        p.add_argument("url")
        if name == "head":
            p.add_argument("-n", type=positive, default=5, help="how many (default 5)")
        elif name == "cat":
            p.add_argument("--start", type=int, default=None)
            p.add_argument("--stop", type=int, default=None)
        else:
            p.add_argument("indices", nargs="+", type=int)
        p.add_argument("--json", action="store_true", help="JSON lines: bytes as base64, arrays as lists")
        p.add_argument("--trusted", action="store_true", help="unpickle without restrictions (datasets you trust)")
        p.add_argument(
            "--allow-class",
            action="append",
            default=[],
            metavar="MODULE.NAME",
            help="a class blocks may hold (repeatable)",
        )
    p = command("view", view_command, "serve a read-only web page of the dataset: examples, images, charts")
    p.add_argument("url")
    p.add_argument("--port", type=int, default=8765, help="port on 127.0.0.1 (default 8765; 0: any free one)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1: this machine only)")
    p.add_argument("--trusted", action="store_true", help="unpickle without restrictions (datasets you trust)")
    p.add_argument(
        "--allow-class", action="append", default=[], metavar="MODULE.NAME", help="a class blocks may hold (repeatable)"
    )
    p = command("verify", verify_command, "decode every block, check sizes, counts and checksums; exit 1 on problems")
    p.add_argument("url")
    p.add_argument("--trusted", action="store_true", help="unpickle without restrictions (datasets you trust)")
    p.add_argument(
        "--allow-class", action="append", default=[], metavar="MODULE.NAME", help="a class blocks may hold (repeatable)"
    )
    p = command(
        "checksum",
        checksum,
        "add block checksums and sign them with your key (other bytes untouched; see docs/security.md)",
    )
    p.add_argument("url")
    p.add_argument(
        "--with",
        dest="sign_with",
        choices=["private", "secret"],
        help="sign with your private key or your secret key (default: the private key if you have one)",
    )
    p.add_argument("--trusted", action="store_true", help="unpickle without restrictions (datasets you trust)")
    p.add_argument(
        "--allow-class", action="append", default=[], metavar="MODULE.NAME", help="a class blocks may hold (repeatable)"
    )
    command("keygen", keygen, "make your private key (Ed25519) if you have none, and print its public key")
    p = command("index", index, "write the dataset's manifest: every shard's metadata in one object, for a fast open")
    p.add_argument("url")
    p = command(
        "recover", recover_command, "finish an interrupted commit, delete dead writers' staging, clear a stale lease"
    )
    p.add_argument("url")
    p.add_argument(
        "--force", action="store_true", help="also break a lease that has not expired (its writer must be dead)"
    )
    p = command("cp", cp, "copy a dataset between any two URLs, committed atomically at DEST")
    p.add_argument("src")
    p.add_argument("dest")
    p.add_argument(
        "--overwrite", action="store_true", help="replace a dataset at DEST (it stays readable until the copy commits)"
    )
    p.add_argument("--workers", type=positive, default=8, help="shards copied at once (default 8)")
    p.add_argument("--src-storage-options", metavar="JSON", help="fsspec options for SRC (default: --storage-options)")
    p.add_argument(
        "--dest-storage-options", metavar="JSON", help="fsspec options for DEST (default: --storage-options)"
    )
    p = command(
        "convert",
        convert_command,
        "convert WebDataset, Megatron, Dolma, L5Kit zarr, JSON lines, Parquet or Arrow into Atlas, or Atlas to Parquet",
    )
    p.add_argument(
        "src", nargs="+", help="source URL(s): files, globs, brace patterns; a Dolma root; a Megatron prefix"
    )
    p.add_argument("dest")
    p.add_argument("--from", dest="source_format", choices=list(FORMATS), help="the source's format (into Atlas)")
    p.add_argument(
        "--to", dest="target_format", choices=["parquet"], help="out of Atlas: SRC is a dataset, DEST a file"
    )
    p.add_argument("--shard-size", type=positive, default=10_000, help="examples per shard (default 10,000)")
    p.add_argument("--block-size", type=positive, default=64, help="examples per block (default 64)")
    p.add_argument(
        "--compression",
        default="shared_dictionary_compression",
        choices=[c.name.lower() for c in CompressionStrategy],
        help="default: shared_dictionary_compression",
    )
    p.add_argument("--workers", type=positive, default=1, help="processes converting inputs at once (default 1)")
    p.add_argument(
        "--engine",
        choices=["processes", "ray"],
        default="processes",
        help="ray: one Ray task per input, on ray.init()'s session or RAY_ADDRESS's cluster "
        "(pip install 'atlas_remote[ray]'; --workers is then unused)",
    )
    p.add_argument(
        "--overwrite", action="store_true", help="replace a dataset at DEST (kept until the new one commits)"
    )
    p.add_argument(
        "--resume", action="store_true", help="continue an interrupted conversion: staged inputs are skipped"
    )
    p.add_argument("--attributes", help="Dolma: the attribute sets to merge, comma-separated (default: all)")
    p.add_argument("--columns", help="Parquet, Arrow: the columns to keep, comma-separated (default: all)")
    p.add_argument("--split", help="Parquet, Arrow: one split of a Hugging Face layout (train-*.parquet, train/...)")
    p.add_argument(
        "--tokens", metavar="KEY", help="count each block's tokens under KEY, saved beside DEST (DEST.tokens)"
    )
    p.add_argument("--dtype", help="with --tokens: KEY's lists of token ids become arrays of this type (uint16...)")
    p.add_argument(
        "--map", metavar="MODULE:FUNCTION", help="run on every example in the workers: an example, a list, or None"
    )
    p.add_argument("--start", type=int, help="--to parquet: the first example (default 0)")
    p.add_argument("--stop", type=int, help="--to parquet: the example to stop before (default: the end)")
    p.add_argument(
        "--schema-from",
        metavar="PARQUET_URL",
        help="--to parquet: the columns' types of this Parquet file (e.g. the one converted in): an exact round trip",
    )
    p.add_argument("--src-storage-options", metavar="JSON", help="fsspec options for SRC (default: --storage-options)")
    p.add_argument(
        "--dest-storage-options", metavar="JSON", help="fsspec options for DEST (default: --storage-options)"
    )
    return main


def main(argv: list[str] | None = None) -> None:
    args = parser().parse_args(argv)
    debug = getattr(args, "debug", False)
    messages_one_line_each(debug)
    args.quiet = getattr(args, "quiet", False)
    try:
        args.options = _json_option(getattr(args, "storage_options", None), "--storage-options")
        args.reader = ReaderOptions(
            trusted=getattr(args, "trusted", False), allowed_classes=tuple(getattr(args, "allow_class", ()))
        )
        args.src_options = _json_option(getattr(args, "src_storage_options", None), "--src-storage-options")
        args.dest_options = _json_option(getattr(args, "dest_storage_options", None), "--dest-storage-options")
        code = args.run(args)
        sys.stdout.flush()
    except BrokenPipeError:  # `atlas-remote cat URL | head`: the reader left, nothing is wrong
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(0)
    except KeyboardInterrupt:
        if getattr(args, "run", None) is convert_command:
            print("atlas-remote: interrupted; the same command with --resume continues it", file=sys.stderr)
        sys.exit(130)
    except (AtlasError, UsageError, OSError, ImportError, MemoryError, RecursionError) as err:  # ours, the machine's
        if debug:  # (a full disk, an extra, memory), or Python's stack: one line each, --debug for the traceback
            raise
        message = one_line(str(err))
        if isinstance(err, UnsafePickleError):
            message += " (on the command line: --allow-class MODULE.NAME, or --trusted)"
        elif isinstance(err, (MemoryError, RecursionError)):  # pyarrow's ArrowMemoryError is a MemoryError
            what = "out of memory" if isinstance(err, MemoryError) else "nested too deep for Python"
            message = (
                f"{what} ({type(err).__name__}: {message or 'no details'}); docs/security.md says what data may "
                f"make: if a bound should have held, --debug shows where"
            )
        print(f"atlas-remote: error: {message}", file=sys.stderr)
        sys.exit(1)
    sys.exit(code)
