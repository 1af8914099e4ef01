"""Feeding PyTorch training loops: a shuffled epoch as a stream of batches, map-style samplers, and streaming.

An epoch's order is a plan (plan.py) made from metadata alone: runs of blocks shuffled, examples shuffled within
windows of runs, one or several datasets (a Mixture). Its progress is the deals served so far (checkpoint.py),
and what is left is dealt to the job's streams, one per (rank, DataLoader worker), in pieces that give every
stream the same number of batches. The order never depends on the topology, so a checkpoint saved on 32 ranks
with 2 workers resumes on 16 ranks with 8, every example of the epoch still served once.

Only the streams and the loaders need torch; the map-style samplers (samplers.py, re-exported here) are plain
Python objects a DataLoader accepts. TokenStream (tokens.py) is an EpochStream too.
"""

from __future__ import annotations

import ast
import dataclasses
import multiprocessing
import os
import pickle
import sys
from collections.abc import Iterator
from typing import Any

import numpy as np

from ..errors import UsageError
from ..read.reader import AtlasDataset
from ..runtime.processes import end_with_starter, quiet_resource_tracker
from .collate import collate_numpy, guarded, to_tensors
from .control import Control
from .epoch_state import MAX_STREAMS, MAX_WORKERS
from .epochs import WORKER_FORMAT, Epochs, Sources, WorkerState
from .handover import HandOver, served_then_handed_over, worker_batches
from .mixture import Mixture
from .plan import EpochPlan
from .ranks import rank_and_world
from .samplers import BlockBatchSampler, BlockShuffleSampler
from .serving import Held, serve

__all__ = [
    "AtlasIterableDataset",
    "BlockBatchSampler",
    "BlockShuffleSampler",
    "EpochStream",
    "ShuffledStream",
    "TensorLoader",
    "collate_numpy",
]

try:  # torch is optional: only the stream and the loaders need it, and the core never imports this module
    from torch.utils.data import IterableDataset as _IterableBase
except ImportError:  # pragma: no cover - exercised only without torch
    _IterableBase = object  # type: ignore[assignment,misc]


def _worker() -> tuple[int, int]:
    """(number of DataLoader workers, this worker's id) in this process; (0, 0) outside a worker."""
    from torch.utils.data import get_worker_info

    info = get_worker_info()
    return (info.num_workers, info.id) if info else (0, 0)


class EpochStream(_IterableBase):
    """What ShuffledStream and TokenStream share: an epoch's order (plan.py) dealt to the job's streams (one
    per rank and DataLoader worker), its state (checkpoint.py), and the protocol with DataLoader workers:
    persistent ones told of `set_epoch` and `load_state_dict` through shared memory, a StatefulDataLoader's
    per-worker states, the batches the loop took. A subclass says what a position of the epoch is (an example,
    a packed sequence) and how a piece of positions becomes batches (`_serve`)."""

    def __init__(
        self,
        sources: Any,
        batch_size: int,
        num_workers: int,
        window_blocks: int,
        run_blocks: int,
        prefetch: int,
        seed: int,
        rank: int | None,
        world_size: int | None,
        drop_last: bool,
    ) -> None:
        if _IterableBase is object:
            raise ImportError(f"{type(self).__name__} needs torch: pip install 'atlas_remote[torch]'")
        if prefetch < 0 or batch_size < 1 or num_workers < 0:
            raise ValueError(
                f"prefetch and num_workers must be >= 0 and batch_size >= 1, got {prefetch}, "
                f"{num_workers} and {batch_size}"
            )
        rank, world_size = rank_and_world(rank, world_size, type(self).__name__)
        if num_workers > MAX_WORKERS or world_size * max(num_workers, 1) > MAX_STREAMS:
            raise ValueError(
                f"{world_size} ranks x {num_workers} workers: a stream serves at most {MAX_WORKERS} workers a rank "
                f"and {MAX_STREAMS:,} streams in all"
            )
        super().__init__()
        self._owner = os.getpid()  # the training process: its DataLoader workers end with it (processes.py)
        self.num_workers, self.prefetch = num_workers, prefetch
        self.rank, self.world_size, self.batch_size = rank, world_size, batch_size
        self.workers = max(num_workers, 1)
        streams = world_size * self.workers
        self.epochs = Epochs(
            sources, seed, window_blocks, run_blocks, True, streams, self.workers, batch_size, drop_last
        )
        self.epochs.sources.check(run_blocks)
        self._control = Control() if num_workers > 0 else None
        self._generation = 0  # of the control block, as this copy of the stream last saw it
        self._serving: WorkerState | None = None  # a worker's pass: where it began, its deal and batches yielded
        self._resume_batches = 0  # a worker resumed by a StatefulDataLoader: batches it had yielded this pass
        self._taken = 0  # batches the loop took in this pass, as far as this process knows (see state_dict)
        self._finished = False  # the pass was served to its end: the next one starts the next epoch
        self._worker_pass = False  # this copy serves a DataLoader worker's pass
        self._handover: HandOver | None = None  # a worker's first pass: taken over from the training process
        self._served_here = 0  # batches of the last pass the training process served (handover.py)

    def _start_fork_server(self) -> None:
        """Where workers will start from a fork server, start it now (a subclass's last step): its interpreter
        imports torch while this process goes on (the first batch, served here, does not wait for it)."""
        if self.num_workers:
            worker_context(self.datasets, self)

    @property
    def datasets(self) -> list[AtlasDataset]:
        return self.epochs.sources.datasets

    def loader(self, **options: Any) -> TensorLoader:
        """The DataLoader for this stream (its num_workers, one batch per item); other options pass through.
        Its workers read through obstore where this process does (see `worker_context`), unless
        `multiprocessing_context` is given."""
        name = type(self).__name__
        if options.get("batch_size") is not None:  # a DataLoader would stack the stream's batches into 3-D ones
            raise UsageError(
                f"{name} makes batches of {self.batch_size} itself: give batch_size to {name}(...), not to loader()"
            )
        if options.setdefault("num_workers", self.num_workers) != self.num_workers:
            raise UsageError(
                f"{name} was made for num_workers={self.num_workers} (its epoch is dealt to them): give "
                f"num_workers to {name}(...), not to loader()"
            )
        if self.num_workers and "multiprocessing_context" not in options:
            options["multiprocessing_context"] = worker_context(self.datasets, (self, options))
        return TensorLoader(self, **options)

    def set_epoch(self, epoch: int) -> None:
        self._begin(None)
        self.epochs.set_epoch(epoch)
        self._publish()

    def __len__(self) -> int:
        """Batches this rank yields in the next pass (what is left of the current epoch, or once a pass has
        been served to its end, the whole next epoch)."""
        start = self.epochs.state
        if self._finished:
            self.epochs.state = self.epochs.after(self._taken)
        try:
            deal, taken = self.epochs.deal()
            return deal.batches_per_stream * self.workers - taken
        finally:
            self.epochs.state = start

    def state_dict(self, batches_seen: int | None = None) -> dict[str, Any]:
        """Where the epoch stands, JSON-ready and the same on every rank, once every rank took `batches_seen`
        batches of the current pass (the one last begun: after a pass served to its end, its batch count gives
        the next epoch's start, as `loader().state_dict()` does). Without it: in a DataLoader worker, that
        worker's own state (what a StatefulDataLoader asks for); in the training process, the batches this
        process saw taken (by `loader()`, or by the loop itself without workers)."""
        if batches_seen is None and self._serving is not None and self._worker_pass:
            return self._serving.to_dict()
        return self.epochs.after(self._taken if batches_seen is None else batches_seen).to_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume from a state of any topology. A worker's own state, as a StatefulDataLoader hands it back to
        the same worker, resumes that worker where it was."""
        workers, worker = _worker()
        if workers and isinstance(state, dict) and state.get("format") == WORKER_FORMAT:
            own = WorkerState.from_dict(state)
            if own.shape == self.epochs.shape and own.worker == worker:
                self.epochs.load(own.state)
                self._resume_batches = own.batches
                return
        self._begin(None)
        self.epochs.load(state)
        self._publish()

    def _begin(self, finished: bool | None) -> None:
        """A new pass: if the last one was served to its end (and nothing was set since), the next epoch."""
        if finished and self._finished:
            self.epochs.state = self.epochs.after(self._taken)
            self._publish()
        self._taken, self._finished, self._resume_batches = 0, False, 0

    def _publish(self) -> None:
        if self._control is not None:
            self._generation = self._control.write(self.epochs.state)

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        if multiprocessing.parent_process() is None and not _spawning():
            state["_control"] = state["_handover"] = None  # shared memory crosses only to the processes started
        state["_serving"] = None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        end_with_starter(self._owner)  # a DataLoader worker ends with the training process, from its first moment

    def __iter__(self) -> Iterator[Any]:
        workers, worker = _worker()
        if workers:  # a forked one too (nothing unpickled)
            end_with_starter(self._owner)
        if workers != self.num_workers:
            raise ValueError(
                f"this {type(self).__name__} was made for num_workers={self.num_workers}, the DataLoader "
                f"has {workers}: pass the same number to both (stream.loader() does)"
            )
        if not workers:  # this process serves the pass itself
            self._begin(True)
        generation, shared = self._control.read() if self._control is not None else (0, None)
        if shared is not None and generation != self._generation:  # set_epoch or load_state_dict in the parent
            self.epochs.state, self._resume_batches, self._generation = shared, 0, generation
        deal, taken = self.epochs.deal()
        turn, skip = deal.resume_point(self.workers, taken, worker)
        own, self._resume_batches = self._resume_batches, 0
        stream, handover, self._handover = self.rank * self.workers + turn, self._handover, None

        def serve(batches: int, prefetch: int = self.prefetch) -> Iterator[Any]:
            return self._serve(deal.plan, deal.rest(stream, skip + own + batches), prefetch)

        if handover is not None and workers and handover.generation != generation:
            taken_over, batches = 0, iter(())  # a pass the training process served whole (and then moved on)
        elif handover is not None and workers:  # the training process serves this pass's first rounds
            taken_over, batches = worker_batches(handover, worker, serve)
        else:
            taken_over, batches = 0, serve(0)
        self._worker_pass = bool(workers)
        self._serving = WorkerState(self.epochs.state, self.epochs.shape, worker, own + taken_over)
        return self._counted(batches, self._serving, in_process=not workers)

    def _counted(self, batches: Iterator[Any], serving: WorkerState, in_process: bool) -> Iterator[Any]:
        """The pass's batches, counted for this worker's state (and, served in this process, for the loop's)."""
        for batch in batches:
            serving = self._serving = dataclasses.replace(serving, batches=serving.batches + 1)
            if in_process:
                self._taken += 1
            yield batch

    def _serve(self, plan: EpochPlan, piece: np.ndarray, prefetch: int, held: Held | None = None) -> Iterator[Any]:
        raise NotImplementedError


class ShuffledStream(EpochStream):
    """A shuffled epoch as a stream of batches, for one dataset or a `Mixture`: `for batch in
    ShuffledStream(ds, 32, num_workers=2).loader(): ...`.

    Each stream (one per rank and DataLoader worker) serves its piece of the epoch, keeping the next `prefetch`
    windows of blocks in flight; each run of blocks is one request, and a block is read by one stream, once
    (where a piece's edge cuts a window, by the two streams sharing it). Every rank yields the same number of
    batches, resumed or not; a stream's last batch may be one example smaller than another's, and only where
    that cannot make the counts equal is one example repeated per shorter stream (or, with `drop_last`, what
    does not fill whole batches on every stream left out).

    Resumable anywhere: `state_dict(batches_seen=n)` after every rank took n batches (the same on every rank),
    or `loader().state_dict()`, or a torchdata StatefulDataLoader's own state_dict; `load_state_dict` on a
    stream of any world size and worker count serves exactly the rest of the epoch. `set_epoch(e)` starts epoch
    e; both reach persistent workers. `with_source=True` yields (dataset index, example) pairs. `rank` and
    `world_size` default to the job's: torch.distributed's once initialised, else torchrun's RANK and WORLD_SIZE
    (ranks.py; give both for a data-parallel group).
    """

    def __init__(
        self,
        data: AtlasDataset | Mixture,
        batch_size: int,
        num_workers: int = 0,
        window_blocks: int = 64,
        run_blocks: int = 8,
        prefetch: int = 2,
        seed: int = 0,
        rank: int | None = None,
        world_size: int | None = None,
        drop_last: bool = False,
        collate: Any = None,
        with_source: bool = False,
    ) -> None:
        super().__init__(
            Sources(data),
            batch_size,
            num_workers,
            window_blocks,
            run_blocks,
            prefetch,
            seed,
            rank,
            world_size,
            drop_last,
        )
        self.collate, self.with_source = collate, with_source
        self._start_fork_server()

    def _serve(self, plan: EpochPlan, piece: np.ndarray, prefetch: int, held: Held | None = None) -> Iterator[Any]:
        """Batches cut from the piece's positions in order, with the next `prefetch` windows in flight (none
        beginning past `until()`: serving.py)."""
        collate, size, datasets = guarded(self.collate or collate_numpy), self.batch_size, self.datasets

        def fetch(d: int, indices: np.ndarray) -> list:
            examples = datasets[d].read(indices)
            return [(d, e) for e in examples] if self.with_source else examples

        pending: list = []
        for items in serve(plan, piece, fetch, prefetch, held):
            pending += items
            while len(pending) >= size:
                batch, pending = pending[:size], pending[size:]
                yield collate(batch)
        if pending:
            yield collate(pending)


WORKER_PRELOAD = [
    "atlas_remote.runtime.processes",  # the server ends with the process that started it (imported there: processes.py)
    "atlas_remote.training.streams",
    "atlas_remote.training.tokens",
    "obstore.store",
]


def worker_context(datasets: list[AtlasDataset], handed: Any) -> Any:
    """How DataLoader workers start: from a fork server (a fresh interpreter, started now so that it imports
    torch and atlas_remote while this process goes on) where a dataset reads through obstore here, so that the
    workers read through it too: obstore's runtime does not survive a fork, and a worker forked from this
    process reads through s3fs instead (`ds.store.read_client` says which). A worker started so runs the main
    script again up to its `if __name__ == "__main__":` guard and unpickles what it is handed; where the script
    has no such guard, or what is handed cannot cross to a fresh interpreter, workers are forked (None: the
    DataLoader's default) and read through s3fs."""
    clients = [getattr(getattr(d, "store", None), "read_client", None) for d in datasets]
    if "obstore" not in clients or not _fresh_workers_can_start(handed):
        return None
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(WORKER_PRELOAD)
    from multiprocessing import forkserver

    quiet_resource_tracker()
    forkserver.ensure_running()
    return context


def _fresh_workers_can_start(handed: Any) -> bool:
    """Whether a fresh interpreter can run a worker: the main script (if any) is guarded, and what the worker is
    handed pickles, naming nothing of `__main__` where there is no script to define it again."""
    path = getattr(sys.modules.get("__main__"), "__file__", None)
    try:
        blob = pickle.dumps(handed)
    except Exception:  # a lambda, a local function: only a forked worker has them
        return False
    if path is None:
        return b"__main__" not in blob
    try:
        with open(path, "rb") as file:
            tree = ast.parse(file.read())
    except (OSError, SyntaxError, ValueError, SystemError):  # SystemError: another thread's AST (cpython#106905)
        return False
    return any(_is_main_guard(node) for node in tree.body)


def _is_main_guard(node: ast.stmt) -> bool:
    """`if __name__ == "__main__":` (either way round)."""
    if not isinstance(node, ast.If) or not isinstance(node.test, ast.Compare) or len(node.test.comparators) != 1:
        return False
    sides = [node.test.left, node.test.comparators[0]]
    names = {s.id for s in sides if isinstance(s, ast.Name)}
    values = {s.value for s in sides if isinstance(s, ast.Constant)}
    return isinstance(node.test.ops[0], ast.Eq) and names == {"__name__"} and values == {"__main__"}


def _spawning() -> bool:
    from multiprocessing import context

    return context.get_spawning_popen() is not None


class AtlasIterableDataset(_IterableBase):
    """Streaming: shards split across ranks, then across the DataLoader workers of each rank; each worker
    reads its shards in order with read-ahead. Shards are the unit, so balance needs many more shards than
    ranks x workers."""

    def __init__(self, dataset: AtlasDataset, rank: int | None = None, world_size: int | None = None) -> None:
        if _IterableBase is object:
            raise ImportError("AtlasIterableDataset needs torch: pip install 'atlas_remote[torch]'")
        rank, world_size = rank_and_world(rank, world_size, "AtlasIterableDataset")
        super().__init__()
        self.dataset, self.rank, self.world_size = dataset, rank, world_size
        self._owner = os.getpid()

    def __iter__(self) -> Iterator[Any]:
        workers, worker = _worker()
        if workers:
            end_with_starter(self._owner)
        workers = max(workers, 1)
        return self.dataset.iter_shards(self.rank * workers + worker, self.world_size * workers)


class TensorLoader:
    """A DataLoader whose workers hand batches over as numpy arrays, made tensors in the main process (torch's
    own hand-over of tensors from workers costs several times more on a few cores; see docs/peers.md). Every
    DataLoader option passes through (`batch_sampler` too). Batches are collated by `collate_numpy` (ragged 1-D
    arrays padded, `<key>_lengths` beside them); unsigned integers wider than a byte arrive as int64, or as
    `dtypes` says per key; a batch that cannot be collated raises `CollateError` here, in one line.

    Over a `ShuffledStream` it counts the batches the loop took, so `state_dict()` is where the loop stands
    (batches prefetched by workers and never taken are not counted), and `load_state_dict()` resumes there.
    While its workers start (a fresh interpreter takes a second or more), this process serves the workers'
    batches itself, round by round in the DataLoader's order, until every worker has its next batch ready; they
    take over there (handover.py: no gap, nothing read twice but the window each is in). `served_here` says how
    many batches of the last pass this process served.
    """

    def __init__(
        self,
        dataset: Any,
        batch_size: int | None = None,
        num_workers: int = 0,
        collate: Any = None,
        dtypes: dict[str, Any] | None = None,
        **options: Any,
    ) -> None:
        from torch.utils.data import DataLoader

        if options.get("in_order") is False:
            raise ValueError(
                "in_order=False changes which worker's batch comes next: a stream's checkpoints "
                "need the DataLoader's own order"
            )
        batched = batch_size is not None or options.get("batch_sampler") is not None
        collate = guarded(collate or collate_numpy) if batched else _unchanged
        if options.get("batch_sampler") is None:
            options["batch_size"] = batch_size
        self.dataset, self.dtypes = dataset, dtypes
        self.dataloader = DataLoader(dataset, num_workers=num_workers, collate_fn=collate, **options)
        self.batches_seen = 0
        self.handover: HandOver | None = None  # of the last pass that began with this process serving
        self._workers_up = False  # persistent workers started by an earlier pass

    def __iter__(self) -> Iterator[Any]:
        stream = self.dataset if isinstance(self.dataset, EpochStream) else None
        if stream is not None:  # a pass begins: after one served to its end, the next epoch
            stream._begin(True)
        self.batches_seen = 0
        if self.handover is not None:  # the last pass's workers, if still starting, are up before this one
            self.handover.started()
        if stream is not None:
            stream._served_here = 0
        loader = self.dataloader
        if stream is not None and loader.num_workers and not len(stream):  # nothing to serve: no worker started
            stream._finished = True
            return
        head_start = stream is not None and bool(loader.num_workers) and not loader.pin_memory
        head_start = head_start and not self._workers_up
        self._workers_up = loader.persistent_workers and loader.num_workers > 0
        if stream is None or not head_start:
            batches: Iterator[Any] = iter(loader)
        else:
            stream.epochs.deal()  # worked out once, before the workers' copies are made
            self.handover = HandOver(loader.num_workers, 0, stream._generation)
            batches = served_then_handed_over(loader, stream, self.handover)
        for batch in batches:
            self.batches_seen += 1
            if stream is not None:
                stream._taken = self.batches_seen
            yield to_tensors(batch, self.dtypes)
        if stream is not None:
            stream._finished = True

    def __len__(self) -> int:
        return len(self.dataloader)

    @property
    def served_here(self) -> int:
        """Batches of the last pass this process served while the workers started (the rest were theirs)."""
        return getattr(self.dataset, "_served_here", 0)

    def state_dict(self) -> dict[str, Any]:
        if not isinstance(self.dataset, EpochStream):
            raise TypeError("state_dict() is for a loader over a ShuffledStream or a TokenStream")
        return self.dataset.state_dict(batches_seen=self.batches_seen)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.dataset.load_state_dict(state)
        self.batches_seen = 0


def _unchanged(batch: Any) -> Any:
    return batch
