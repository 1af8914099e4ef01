"""Requests and bytes, per backend, for one cold example and for one full shard scan.

python benchmarks/backends.py      # prints a Markdown table (servers started on 127.0.0.1, then stopped)
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]
os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")
os.environ.update(AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing", AWS_DEFAULT_REGION="us-east-1")

from conftest import start_server, stop
from helpers import sample_examples
from static_server import serve

import atlas_remote as ar


def measure(url: str, options: dict | None) -> str:
    ds = ar.open(url, storage_options=options)
    opened = ds.stats
    ds[150]
    cold = ds.stats
    scan = ar.open(url, storage_options=options, cache_bytes=0)
    scan.reset_stats()
    for _ in scan.iter(100, 200):
        pass
    full = scan.stats
    kinds = lambda st: ", ".join(f"{k} {v}" for k, v in sorted(st.requests.items()))
    return (
        f"{opened.total_requests} ({kinds(opened)}) | {cold.total_requests - opened.total_requests} "
        f"({kinds(cold)} incl. open) / {cold.total_bytes - opened.total_bytes:,} B | "
        f"{full.total_requests} ({kinds(full)}) / {full.total_bytes:,} B"
    )


def main() -> None:
    import gcsfs
    import s3fs

    examples = sample_examples(300)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        local = f"{tmp}/ds"
        with ar.AtlasDatasetWriter(local, 100, 8) as w:
            for example in examples:
                w.add_example(example)
        rows.append(("local", measure(local, None)))
        s3_ep, s3_proc = start_server(["-m", "moto.server", "-H", "127.0.0.1", "-p", "{port}"], "/moto-api/")
        gcs_ep, gcs_proc = start_server([str(ROOT / "tests" / "gcs_server.py"), "{port}"], "/storage/v1/b")
        try:
            for name, fs, options, scheme in (
                ("s3", s3fs.S3FileSystem(endpoint_url=s3_ep), {"endpoint_url": s3_ep}, "s3"),
                (
                    "gcs",
                    gcsfs.GCSFileSystem(endpoint_url=gcs_ep, token="anon"),
                    {"endpoint_url": gcs_ep, "token": "anon"},
                    "gs",
                ),
            ):
                fs.mkdir("figures")
                for path in Path(local).rglob("*"):
                    if path.is_file():
                        fs.pipe_file(f"figures/ds/{path.relative_to(local).as_posix()}", path.read_bytes())
                rows.append((name, measure(f"{scheme}://figures/ds", options)))
        finally:
            stop(s3_proc)
            stop(gcs_proc)
        with serve(tmp) as base:
            rows.append(("http", measure(f"{base}/ds", None)))
    print("300 examples, shards of 100, blocks of 8, shared dictionary.\n")
    print(
        "| backend | open: requests | one cold example: requests / bytes | one full shard scan (100 examples, 13 blocks): requests / bytes |"
    )
    print("| --- | --- | --- | --- |")
    for name, row in rows:
        print(f"| {name} | {row} |")


if __name__ == "__main__":
    main()
