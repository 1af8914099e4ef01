"""A language model's data, end to end: Megatron corpora on S3 -> Atlas datasets -> a TokenStream over a 0.7/0.3
mixture with 2 DataLoader workers -> a checkpoint on 2 ranks -> the rest of the epoch on 3 ranks.

    python examples/language_model.py --bucket my-bucket [--endpoint-url http://localhost:9000]

It writes two small Megatron corpora (`.bin` + `.idx`, as megatron-core's preprocess_data.py does) under
s3://BUCKET/megatron/ so that it runs anywhere; point `CORPORA` at your own. The ranks of each phase run one after
another here; under torchrun each is its own process with rank and world size from the environment, and the
code is the same. The test suite runs this file against its S3 endpoint (tests/project/test_examples.py).
"""

from __future__ import annotations

import argparse
import json
import struct
from collections import Counter

import fsspec
import numpy as np

import atlas_remote as ar

SEQ_LEN, BATCH, EOD = 64, 8, 0  # rows of SEQ_LEN + 1 tokens: inputs tokens[:, :-1], targets tokens[:, 1:]


def write_megatron(prefix: str, documents: int, seed: int, options: dict) -> None:
    """A Megatron IndexedDataset: prefix.bin (uint16 tokens) and prefix.idx (lengths, pointers, documents)."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(5, 300, documents)
    tokens = rng.integers(1, 50_000, int(lengths.sum())).astype(np.uint16)
    pointers = np.concatenate([[0], np.cumsum(lengths)[:-1]]) * 2
    header = b"MMIDIDX\x00\x00" + struct.pack("<QBQQ", 1, 8, documents, documents + 1)
    index = lengths.astype(np.int32).tobytes() + pointers.astype(np.int64).tobytes()
    with fsspec.open(f"{prefix}.idx", "wb", **options) as f:
        f.write(header + index + np.arange(documents + 1, dtype=np.int64).tobytes())
    with fsspec.open(f"{prefix}.bin", "wb", **options) as f:
        f.write(tokens.tobytes())


def prepare(bucket: str, options: dict) -> list[str]:
    """Convert each corpus once, and count its tokens once (what packing needs before it reads): every rank
    then loads the counts from beside the dataset instead of reading the data to count them."""
    urls = []
    for name, documents, seed in (("web", 700, 1), ("code", 300, 2)):
        prefix, url = f"s3://{bucket}/megatron/{name}_text_document", f"s3://{bucket}/atlas/{name}"
        write_megatron(prefix, documents, seed, options)
        ar.convert(prefix, url, "megatron", shard_size=200, block_size=16, src_options=options, dest_options=options)
        ar.TokenCounts.of(ar.open(url, storage_options=options)).save(f"{url}.tokens", options)
        urls.append(url)
    return urls


def stream(urls: list[str], options: dict, rank: int, world_size: int) -> ar.TokenStream:
    """What every rank builds: the same mixture, seed and knobs; its own rank and the job's world size."""
    datasets = [ar.open(url, storage_options=options) for url in urls]
    return ar.TokenStream(
        ar.Mixture(datasets, weights=[0.7, 0.3]),
        SEQ_LEN,
        batch_size=BATCH,
        num_workers=2,
        rank=rank,
        world_size=world_size,
        seed=1234,
        eod=EOD,
        counts=[f"{url}.tokens" for url in urls],
        with_source=True,
    )


def train(urls: list[str], options: dict, world_size: int, steps: int | None, state: dict | None):
    """One phase of a job: every rank takes `steps` batches (None: to the epoch's end). Returns the rows served
    and the checkpoint (the same on every rank, so any rank saves it)."""
    rows, saved = [], None
    for rank in range(world_size):  # one process per rank under torchrun
        tokens = stream(urls, options, rank, world_size)
        if state is not None:
            tokens.load_state_dict(state)
        loader = tokens.loader()  # 2 DataLoader workers; batches arrive as int64 tensors
        for step, batch in enumerate(loader):
            inputs, targets = batch["tokens"][:, :-1], batch["tokens"][:, 1:]  # a model's step goes here
            assert inputs.shape == targets.shape == (len(batch["tokens"]), SEQ_LEN)
            rows += [(int(s), row.numpy().tobytes()) for s, row in zip(batch["source"], batch["tokens"])]
            if steps is not None and step + 1 == steps:
                break
        saved = loader.state_dict()  # where the job stands: JSON, a few integers a change of topology
    return rows, json.loads(json.dumps(saved))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bucket", required=True)
    parser.add_argument("--endpoint-url", help="an S3-compatible endpoint (MinIO, moto...); AWS itself if left out")
    args = parser.parse_args()
    options = {"endpoint_url": args.endpoint_url} if args.endpoint_url else {}

    urls = prepare(args.bucket, options)
    first, checkpoint = train(urls, options, world_size=2, steps=10, state=None)
    print(f"2 ranks took 10 batches each: {len(first)} rows; checkpoint {json.dumps(checkpoint)}")
    rest, after = train(urls, options, world_size=3, steps=None, state=checkpoint)
    print(f"3 ranks served the rest of the epoch: {len(rest)} rows; then {json.dumps(after)}")

    whole, _ = train(urls, options, world_size=1, steps=None, state=None)  # the epoch without interruption
    assert set(first + rest) == set(whole), "the rows of the uninterrupted epoch"
    repeated = len(first + rest) - len(whole)  # where a deal makes every rank's last batches equal in number
    share = Counter(source for source, _ in whole)[0] / len(whole)
    print(f"the epoch: {len(whole)} rows of {SEQ_LEN + 1} tokens, {share:.3f} from web; on 2 then 3 ranks the same")
    print(f"rows, {repeated} served twice to give every rank as many batches")


if __name__ == "__main__":
    main()
