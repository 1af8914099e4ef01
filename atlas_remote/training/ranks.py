"""Which rank of how many this process is, for streams and samplers: what `torch.distributed` says once its process
group is initialised, else what torchrun's environment says (`RANK`, `WORLD_SIZE`), else one process.

Why: a stream built without `rank=` under torchrun served every rank the same batches, silently (LitData and
MosaicML Streaming read the distributed environment themselves). Explicit arguments still win where they can be
meant: a data-parallel group under tensor or pipeline parallelism is a smaller world that divides the job's (its
rank is the data-parallel rank, which the environment does not know). What cannot be meant is one clear error:
a world larger than the job's or not dividing it, a rank other than the environment's in a world of the same
size, a rank past its world.
"""

from __future__ import annotations

import os
import sys

from ..errors import UsageError


def distributed() -> tuple[int, int, str] | None:
    """(rank, world size, who says so) from torch.distributed's initialised process group, else from torchrun's
    environment, else None. torch is never imported here: a process group exists only where torch.distributed
    was."""
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size(), "torch.distributed"
    rank, world = os.environ.get("RANK"), os.environ.get("WORLD_SIZE")
    if rank is None or world is None:
        return None
    try:
        found = int(rank), int(world), "torchrun's environment (RANK, WORLD_SIZE)"
    except ValueError:
        raise UsageError(f"RANK={rank!r} and WORLD_SIZE={world!r} in the environment are not integers") from None
    if not 0 <= found[0] < found[1]:
        raise UsageError(f"RANK={rank} and WORLD_SIZE={world} in the environment: the rank must be below the size")
    return found


def rank_and_world(rank: int | None, world_size: int | None, what: str) -> tuple[int, int]:
    """The rank and world size `what` (a stream, a sampler) serves: the arguments where given, the environment's
    where not (see the module); UsageError in one line where they contradict it."""
    for name, value in (("rank", rank), ("world_size", world_size)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            raise UsageError(f"{what}: {name} must be an integer, got {value!r}")
    found = distributed()
    if found is None:
        rank, world_size = rank if rank is not None else 0, world_size if world_size is not None else 1
    else:
        job_rank, job_world, source = found
        given = world_size if world_size is not None else job_world
        if given > job_world or job_world % max(given, 1):
            raise UsageError(
                f"{what}: world_size={given}, where {source} says {job_world} ranks: give a data-parallel group's "
                f"size (one dividing {job_world}) or leave world_size out"
            )
        if given == job_world and rank is not None and rank != job_rank:
            raise UsageError(
                f"{what}: rank={rank}, where {source} says this is rank {job_rank} of {job_world}: leave rank and "
                f"world_size out, or give both for a data-parallel group"
            )
        if given != job_world and rank is None:
            raise UsageError(
                f"{what}: world_size={given} (a data-parallel group of the {job_world} ranks) needs rank= too: "
                f"this process's rank in that group"
            )
        rank, world_size = (rank if rank is not None else job_rank), given
    if world_size < 1 or not 0 <= rank < world_size:
        raise UsageError(f"{what}: rank must be in [0, {world_size}), got {rank}")
    return rank, world_size
