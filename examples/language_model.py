"""A language model's data on a first day: a Megatron corpus and a JSON-lines corpus on S3 -> Atlas datasets with
their token counts -> a TokenStream over a 0.7/0.3 mixture -> 2 ranks under torchrun, checkpointed -> 3 ranks
finish the epoch from the checkpoint.

    python examples/language_model.py prepare --bucket B [--endpoint-url URL]
    torchrun --nproc-per-node 2 examples/language_model.py train --bucket B [--endpoint-url URL] --steps 10
    torchrun --nproc-per-node 3 examples/language_model.py train --bucket B [--endpoint-url URL]

`prepare` writes two small stand-in corpora (`.bin` + `.idx` as megatron-core's preprocess_data.py writes them,
and JSON lines of token lists as a tokenizer's script does) under s3://B/corpora/ and converts each once, counting
its tokens as it writes; point it at your own. Each `train` resumes from the newest checkpoint under s3://B/runs/
(any number of ranks), and each rank takes its rank and the world size from torch.distributed. The test suite runs
these three commands against its S3 endpoint (tests/project/test_examples.py) and checks that the rows served are
the uninterrupted epoch's; docs/training.md quotes this file.
"""

from __future__ import annotations

import argparse
import json
import os
import struct

import fsspec
import numpy as np
import torch.distributed as dist

import atlas_remote as ar

SEQ_LEN, BATCH = 64, 8  # rows of SEQ_LEN + 1 tokens: inputs tokens[:, :-1], targets tokens[:, 1:]
EOD = 0  # both corpora end each document with it already (Megatron's --append-eod): the stream adds none


def write_megatron(prefix: str, documents: int, options: dict) -> None:
    """A stand-in Megatron IndexedDataset: prefix.bin (uint16 tokens, EOD last) and prefix.idx."""
    rng = np.random.default_rng(1)
    docs = [np.append(rng.integers(1, 50_000, n), EOD).astype(np.uint16) for n in rng.integers(5, 300, documents)]
    lengths = np.array([len(d) for d in docs])
    pointers = np.concatenate([[0], np.cumsum(lengths)[:-1]]) * 2
    header = b"MMIDIDX\x00\x00" + struct.pack("<QBQQ", 1, 8, documents, documents + 1)
    index = lengths.astype(np.int32).tobytes() + pointers.astype(np.int64).tobytes()
    with fsspec.open(f"{prefix}.idx", "wb", **options) as f:
        f.write(header + index + np.arange(documents + 1, dtype=np.int64).tobytes())
    with fsspec.open(f"{prefix}.bin", "wb", **options) as f:
        f.write(np.concatenate(docs).tobytes())


def write_jsonl(folder: str, documents: int, options: dict) -> None:
    """A stand-in tokenized JSON-lines corpus: {"text": ..., "tokens": [ids..., EOD]} a line, in two files."""
    rng = np.random.default_rng(2)
    for part in range(2):
        lines = [
            json.dumps({"text": f"file {part} line {i}", "tokens": [*rng.integers(1, 50_000, n).tolist(), EOD]})
            for i, n in enumerate(rng.integers(5, 300, documents // 2))
        ]
        with fsspec.open(f"{folder}/part-{part}.jsonl", "w", **options) as f:
            f.write("\n".join(lines) + "\n")


def prepare(bucket: str, options: dict) -> None:
    """Convert each corpus once. tokens="tokens" counts each block's tokens as it is written and saves the counts
    beside the dataset (s3://.../web.tokens), where every rank's TokenStream finds them: no counting pass.
    dtype="uint16" makes the JSON lists of token ids arrays on the way in (each id checked to fit)."""
    web, code = f"s3://{bucket}/corpora/web_text_document", f"s3://{bucket}/corpora/code"
    write_megatron(web, 700, options)
    write_jsonl(code, 300, options)
    common = {"shard_size": 200, "block_size": 16, "src_options": options, "dest_options": options}
    ar.convert(web, f"s3://{bucket}/atlas/web", "megatron", tokens="tokens", **common)
    ar.convert(code, f"s3://{bucket}/atlas/code", "jsonl", tokens="tokens", dtype="uint16", **common)


def stream(bucket: str, options: dict) -> ar.TokenStream:
    """What every rank builds: the same mixture, seed and knobs. Its rank and the world size come from
    torch.distributed, the counts from beside each dataset."""
    datasets = [ar.open(f"s3://{bucket}/atlas/{name}", storage_options=options) for name in ("web", "code")]
    return ar.TokenStream(
        ar.Mixture(datasets, weights=[0.7, 0.3]),
        SEQ_LEN,
        batch_size=BATCH,
        num_workers=2,
        seed=1234,
        with_source=True,
    )


def train(bucket: str, options: dict, steps: int | None, record: str | None) -> None:
    """One phase of a job under torchrun: resume from the newest checkpoint, take `steps` batches (None: to the
    epoch's end), and checkpoint. Every rank takes as many batches, so the state is the same on every rank."""
    dist.init_process_group("gloo")
    rank, runs = dist.get_rank(), fsspec.filesystem("s3", **options)
    tokens = stream(bucket, options)
    saved = sorted(runs.glob(f"{bucket}/runs/step-*.json"))
    if saved:  # written by a job of any size: this one serves exactly the rest of the epoch
        tokens.load_state_dict(json.loads(runs.cat_file(saved[-1])))
    loader = tokens.loader()  # 2 DataLoader workers; batches arrive as int64 tensors
    taken, rows = 0, []
    for batch in loader:
        inputs, targets = batch["tokens"][:, :-1], batch["tokens"][:, 1:]  # a model's step goes here
        assert inputs.shape == targets.shape == (len(batch["tokens"]), SEQ_LEN)
        rows += [[int(s), row.tolist()] for s, row in zip(batch["source"], batch["tokens"])]
        taken += 1
        if taken == steps:
            break
    state = loader.state_dict()  # where the job stands: JSON, a few integers a change of topology
    if rank == 0:
        done = 0 if not saved else int(saved[-1].rsplit("-", 1)[1].split(".")[0])
        runs.pipe_file(f"{bucket}/runs/step-{done + taken:09d}.json", json.dumps(state).encode())
    if record:  # what the test suite checks: the rows each rank trained on
        with open(os.path.join(record, f"rank{rank}-of-{dist.get_world_size()}.json"), "w") as f:
            json.dump(rows, f)
    print(f"rank {rank} of {dist.get_world_size()}: {taken} batches; the job stands at {json.dumps(state)}")
    dist.barrier()
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("phase", choices=["prepare", "train"])
    parser.add_argument("--bucket", required=True)
    parser.add_argument("--endpoint-url", help="an S3-compatible endpoint (MinIO, moto...); AWS itself if left out")
    parser.add_argument("--steps", type=int, help="train: batches each rank takes (default: to the epoch's end)")
    parser.add_argument("--record", help="train: a folder where each rank writes the rows it trained on")
    args = parser.parse_args()
    options = {"endpoint_url": args.endpoint_url} if args.endpoint_url else {}
    if args.phase == "prepare":
        prepare(args.bucket, options)
    else:
        train(args.bucket, options, args.steps, args.record)


if __name__ == "__main__":
    main()
