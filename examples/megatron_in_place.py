"""Train on Megatron corpora where they lie: `.bin` + `.idx` files on S3 -> a TokenStream over a 0.7/0.3 mixture of
two corpora with 2 DataLoader workers -> a checkpoint on 2 ranks -> the rest of the epoch on 3 ranks. No
conversion, no counting pass: each .idx is read once, and it says how many tokens every block of documents holds.

    python examples/megatron_in_place.py --bucket my-bucket [--endpoint-url http://localhost:9000]

It writes two small corpora (as megatron-core's preprocess_data.py does with --append-eod) under
s3://BUCKET/megatron/ so that it runs anywhere; point `CORPORA` at your own. The ranks of each phase run one after
another here; under torchrun each is its own process with rank and world size from the environment, and the
code is the same. The test suite runs this file against its S3 endpoint (tests/project/test_megatron_example.py).
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
CORPORA = ["s3://{bucket}/megatron/web_*.idx", "s3://{bucket}/megatron/code_*.idx"]  # globs of .idx files


def write_megatron(prefix: str, documents: int, seed: int, options: dict) -> None:
    """prefix.bin (uint16 token ids, EOD ending each document) and prefix.idx, as megatron-core writes them."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(5, 300, documents)
    tokens = rng.integers(1, 50_000, int(lengths.sum())).astype(np.uint16)
    tokens[np.cumsum(lengths) - 1] = EOD  # --append-eod
    pointers = np.concatenate([[0], np.cumsum(lengths)[:-1]]) * 2
    header = b"MMIDIDX\x00\x00" + struct.pack("<QBQQ", 1, 8, documents, documents + 1)
    index = lengths.astype(np.int32).tobytes() + pointers.astype(np.int64).tobytes()
    with fsspec.open(f"{prefix}.idx", "wb", **options) as f:
        f.write(header + index + np.arange(documents + 1, dtype=np.int64).tobytes())
    with fsspec.open(f"{prefix}.bin", "wb", **options) as f:
        f.write(tokens.tobytes())


def stream(corpora: list[str], options: dict, rank: int, world_size: int) -> ar.TokenStream:
    """What every rank builds: the same corpora, mixture, seed and knobs; its own rank and the job's world size.
    No eod=: the documents already end with one (a second would be warned of)."""
    sources = [ar.megatron(glob, options) for glob in corpora]  # each .idx read once, whole
    return ar.TokenStream(
        ar.Mixture(sources, weights=[0.7, 0.3]),
        SEQ_LEN,
        batch_size=BATCH,
        num_workers=2,
        rank=rank,
        world_size=world_size,
        seed=1234,
        with_source=True,
    )


def train(corpora: list[str], options: dict, world_size: int, steps: int | None, state: dict | None):
    """One phase of a job: every rank takes `steps` batches (None: to the epoch's end). Returns the rows served
    and the checkpoint (the same on every rank, so any rank saves it)."""
    rows, saved = [], None
    for rank in range(world_size):  # one process per rank under torchrun
        tokens = stream(corpora, options, rank, world_size)
        if state is not None:
            tokens.load_state_dict(state)  # refused if a corpus's .idx is not the one it was saved with
        loader = tokens.loader()  # 2 DataLoader workers; each reads a run of documents in one ranged read
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

    for name, files, documents in (("web", 2, 400), ("code", 1, 300)):
        for k in range(files):
            write_megatron(
                f"s3://{args.bucket}/megatron/{name}_{k}_text_document", documents, 7 * k + len(name), options
            )
    corpora = [glob.format(bucket=args.bucket) for glob in CORPORA]
    web = ar.megatron(corpora[0], options)
    opening = dict(sorted(web.stats.requests.items()))  # the folder listed, each .bin's size, each .idx whole
    print(f"{web.url}: {len(web)} documents in {len(web.files)} files, opened with requests {opening}")
    print(f"every document ends with token {web.ends_with()} (--append-eod): no eod= for the TokenStream")

    first, checkpoint = train(corpora, options, world_size=2, steps=10, state=None)
    print(f"2 ranks took 10 batches each: {len(first)} rows; checkpoint {json.dumps(checkpoint)}")
    rest, _ = train(corpora, options, world_size=3, steps=None, state=checkpoint)
    print(f"3 ranks served the rest of the epoch: {len(rest)} rows")

    whole, _ = train(corpora, options, world_size=1, steps=None, state=None)  # the epoch without interruption
    assert set(first + rest) == set(whole), "the rows of the uninterrupted epoch"
    share = Counter(source for source, _ in whole)[0] / len(whole)
    print(f"the epoch: {len(whole)} rows of {SEQ_LEN + 1} tokens, {share:.3f} from web; on 2 then 3 ranks the same")


if __name__ == "__main__":
    main()
