"""Train from a bucket with torchrun: every rank streams its share, rank 0 checkpoints, any restart resumes.

Two machines, two processes each (run the same line on both; the first to start hosts the rendezvous):

    torchrun --nnodes 2 --nproc-per-node 2 --rdzv-backend c10d --rdzv-endpoint HOST:29400 --rdzv-id job1 \\
        examples/torchrun_resume.py s3://bucket/train --checkpoints s3://bucket/runs/job1

Started again with the same --checkpoints, at any size (one machine of 3 processes, say), the job finds the
newest checkpoint and serves exactly the rest of the epoch. Under torchrun's elastic agent (--max-restarts) it
does the same by itself; then start torchrun with TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 (docs/multi-node.md says
why). Credentials and endpoints come from the environment (AWS_*, GOOGLE_APPLICATION_CREDENTIALS, ...), as on
any machine of a cluster. Several datasets make a Mixture (--weights). With --seq-len the examples are
documents of token ids, packed into rows by a TokenStream (count each dataset's tokens once beforehand:
`atlas_remote.TokenCounts.of(ds).save(URL + ".tokens")`; every rank loads them from there).

The model is a stand-in (a linear layer on each example's "id"): put yours in `make_model` and `train_step`, and
wrap it in DistributedDataParallel, which averages the gradients as `train_step` does here by hand (and overlaps
that with the backward pass).
"""

from __future__ import annotations

import argparse
import hashlib
import io
import os
import signal
import sys

import fsspec
import torch
import torch.distributed as dist

import atlas_remote
from atlas_remote.training import EpochStream, ShuffledStream
from atlas_remote.training.tokens import TokenStream


def arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("datasets", nargs="+", help="dataset URLs; several are mixed (see --weights)")
    parser.add_argument("--checkpoints", required=True, help="URL of a folder for the checkpoints (a bucket)")
    parser.add_argument("--weights", type=float, nargs="+", help="each dataset's share of an epoch")
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--seq-len", type=int, help="a language model's rows of tokens (TokenStream)")
    parser.add_argument("--workers", type=int, default=1, help="DataLoader workers per rank")
    parser.add_argument("--checkpoint-every", type=int, default=10, help="steps")
    parser.add_argument("--fail-at", type=int, help="a drill: at this step of the first attempt the last rank dies")
    parser.add_argument("--record", help="a folder: each rank writes there the ids it trained on, step by step")
    return parser.parse_args()


def make_model() -> torch.nn.Module:
    return torch.nn.Linear(1, 1)


def make_stream(args: argparse.Namespace, rank: int, world_size: int) -> EpochStream:
    """Every rank builds the same stream (datasets, weights, seed, batch size), with its own rank."""
    datasets = [atlas_remote.open(url) for url in args.datasets]
    data = datasets[0] if len(datasets) == 1 else atlas_remote.Mixture(datasets, weights=args.weights)
    common = {"batch_size": args.batch_size, "num_workers": args.workers, "rank": rank, "world_size": world_size}
    if args.seq_len:
        counts = [f"{url}.tokens" for url in args.datasets]
        return TokenStream(data, args.seq_len, counts=counts if len(counts) > 1 else counts[0], **common)
    return ShuffledStream(data, **common)


def examples(batch: dict) -> list[str]:
    """What the drill records of a batch: each example's id, or a digest of each row of tokens."""
    if "tokens" in batch:
        return [hashlib.blake2b(row.numpy().tobytes(), digest_size=8).hexdigest() for row in batch["tokens"]]
    return [str(i) for i in batch["id"].tolist()]


def train_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, batch: dict) -> None:
    x = (batch["tokens"][:, :1] if "tokens" in batch else batch["id"].unsqueeze(1)).float() / 1000
    loss = ((model(x) - x) ** 2).mean()
    optimizer.zero_grad()
    loss.backward()
    for parameter in model.parameters():  # the gradients averaged over every rank: ranks move in step
        dist.all_reduce(parameter.grad)
        parameter.grad /= dist.get_world_size()
    optimizer.step()


def newest_checkpoint(folder: str) -> str | None:
    """Rank 0 lists the folder and tells every rank the same name (listings need not agree across machines)."""
    name = None
    if dist.get_rank() == 0:
        fs, root = fsspec.core.url_to_fs(folder)
        found = sorted(fs.glob(f"{root}/step-*.pt"))
        name = fs.unstrip_protocol(found[-1]) if found else None
    chosen = [name]
    dist.broadcast_object_list(chosen, src=0)
    return chosen[0]


def save_checkpoint(folder: str, state: dict) -> None:
    """Written under a temporary name, then moved: a rank killed mid-write leaves no half checkpoint."""
    fs, root = fsspec.core.url_to_fs(folder)
    fs.makedirs(root, exist_ok=True)
    data = io.BytesIO()
    torch.save(state, data)
    final = f"{root}/step-{state['step']:09d}.pt"
    fs.pipe_file(final + ".partial", data.getvalue())
    fs.mv(final + ".partial", final)


def load_checkpoint(url: str) -> dict:
    with fsspec.open(url, "rb") as f:
        return torch.load(io.BytesIO(f.read()), weights_only=True)


def main() -> int:
    args = arguments()
    restarts = int(os.environ.get("TORCHELASTIC_MAX_RESTARTS", "0"))
    if restarts and os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True":
        print(
            "torchrun --max-restarts shares its store with the restarted ranks, which can then read their peers' "
            "old addresses and hang: start torchrun with --rdzv-backend c10d and TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1",
            file=sys.stderr,
        )
        return 2
    dist.init_process_group("gloo")  # torchrun's environment says where the others are
    rank, world_size = dist.get_rank(), dist.get_world_size()
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))

    stream = make_stream(args, rank, world_size)
    loader = stream.loader()
    torch.manual_seed(0)  # the same initial weights on every rank
    model = make_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)

    step = 0
    found = newest_checkpoint(args.checkpoints)
    if found:  # every rank loads the same state: the stream serves the rest of the epoch to this world size
        saved = load_checkpoint(found)
        model.load_state_dict(saved["model"])
        optimizer.load_state_dict(saved["optimizer"])
        stream.load_state_dict(saved["stream"])
        step = saved["step"]
    record = None
    if args.record:
        run = os.environ.get("TORCHELASTIC_RUN_ID", "run")
        record = open(os.path.join(args.record, f"{run}-attempt{attempt}-rank{rank}.txt"), "w")
        record.write(f"resumed {step}\n")

    for epoch in range(stream.state_dict()["epoch"], args.epochs):
        stream.set_epoch(epoch)  # keeps a loaded resume point in its epoch
        for batch in loader:
            train_step(model, optimizer, batch)
            step += 1
            if record:
                record.write(f"{step} {' '.join(examples(batch))}\n")
                record.flush()
            if rank == 0 and step % args.checkpoint_every == 0:
                # the same on every rank: every rank has taken as many batches (the all_reduce keeps them in step)
                state = {"step": step, "stream": loader.state_dict()}
                save_checkpoint(
                    args.checkpoints, {**state, "model": model.state_dict(), "optimizer": optimizer.state_dict()}
                )
            if step == args.fail_at and attempt == 0 and rank == world_size - 1:
                os.kill(os.getpid(), signal.SIGKILL)  # no cleanup, as when a machine is lost
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
