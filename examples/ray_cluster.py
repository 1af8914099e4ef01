"""Atlas datasets on a Ray cluster: read tasks on every node, a rewrite committed once, all through the bucket.

    ray start --head --port 6379                       # on one machine
    ray start --address HEAD:6379                      # on each of the others
    RAY_ADDRESS=HEAD:6379 python examples/ray_cluster.py s3://bucket/train s3://bucket/train-clean

Reads the dataset with `read_atlas` (each task whole blocks of one shard, spread over the nodes) and says how
many rows each node read; writes every row through `clean` with `write_atlas` (each write task stages its part in
the bucket from its own node, and the driver commits them once); reads the result back and checks it. Examples
are dicts with an "id" and a "text", as `atlas-remote demo` writes them.

Every node needs atlas_remote and the bucket: credentials from each node's environment, or `--storage-options`
(they travel with the tasks). The destination must be shared storage, never a node's local disk.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from typing import Any

import ray

import atlas_remote
from atlas_remote.write.ray_data import read_atlas, write_atlas


def with_node(batch: dict) -> dict:
    """Each row tagged with the node that read it (Ray fuses this into the read task)."""
    batch["node"] = [ray.get_runtime_context().get_node_id()] * len(batch["id"])
    return batch


def rows_by_node(url: str, storage_options: dict | None = None) -> tuple[Counter, list[int]]:
    """Rows read on each node, and every id read."""
    rows = read_atlas(url, storage_options=storage_options).map_batches(with_node).take_all()
    return Counter(row["node"] for row in rows), [row["id"] for row in rows]


def clean(row: dict[str, Any]) -> dict[str, Any]:
    return {"id": row["id"], "text": " ".join(row["text"].split()).lower()}


def rewrite(src: str, dest: str, storage_options: dict | None = None) -> atlas_remote.AtlasDatasetMetadata:
    rows = read_atlas(src, storage_options=storage_options).map(clean)
    return write_atlas(rows, dest, shard_size=1000, block_size=50, storage_options=storage_options)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("src")
    parser.add_argument("dest")
    parser.add_argument("--storage-options", type=json.loads, help="JSON, for every node (default: their environment)")
    args = parser.parse_args(argv)
    if not ray.is_initialized():
        ray.init()  # RAY_ADDRESS's cluster, or a local one

    per_node, ids = rows_by_node(args.src, args.storage_options)
    for node, rows in sorted(per_node.items()):
        print(f"node {node[:12]} read {rows:,} rows")
    source = atlas_remote.open(args.src, storage_options=args.storage_options)
    if sorted(ids) != sorted(example["id"] for example in source):
        sys.exit(f"{args.src}: the rows read are not the dataset's, each once")

    meta = rewrite(args.src, args.dest, args.storage_options)
    written = atlas_remote.open(args.dest, storage_options=args.storage_options)
    if sorted(written, key=lambda x: x["id"]) != sorted(map(clean, source), key=lambda x: x["id"]):
        sys.exit(f"{args.dest}: the rows written are not the source's, cleaned")
    print(f"wrote {sum(meta.shard_sizes):,} rows in {len(meta.shard_sizes)} shards to {args.dest}, read back exact")
    return {"rows_by_node": dict(per_node), "written": sum(meta.shard_sizes)}


if __name__ == "__main__":
    main()
