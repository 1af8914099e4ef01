"""A training job's bookkeeping simulated in one process: ranks and DataLoader workers taking deals, saving and resuming."""

from __future__ import annotations

import json

import numpy as np
from hypothesis import strategies as st

from atlas_remote.training.epoch_state import EpochState
from atlas_remote.training.epochs import Epochs
from atlas_remote.training.plan import Layout


class Stand:
    """A dataset as a plan sees it (its layout), whose examples are their own indices: where only the order
    matters, a stand-in for AtlasDataset (picklable, so a stream over it goes to simulated workers)."""

    def __init__(self, layout: Layout, url: str = "stand") -> None:
        self._layout, self.url = layout, url

    def layout(self) -> Layout:
        return self._layout

    def __len__(self) -> int:
        return len(self._layout)

    def read(self, indices) -> list[int]:
        return [int(i) for i in indices]


def layouts(max_shards: int = 5, max_size: int = 40):
    return st.lists(st.tuples(st.integers(0, max_size), st.integers(1, 7)), min_size=1, max_size=max_shards).map(
        lambda shards: Layout.of([n for n, _ in shards], [b for _, b in shards])
    )


def positions(spans) -> list[int]:
    return [p for a, b in np.asarray(spans).reshape(-1, 2).tolist() for p in range(a, b)]


def json_round_trip(state: EpochState) -> dict:
    return json.loads(json.dumps(state.to_dict()))


class Job:
    """`ranks` ranks x `workers` DataLoader workers (0: none) on an epoch, through `Epochs`."""

    def __init__(self, data, knob, ranks: int, workers: int, batch: int, drop_last: bool) -> None:
        window_blocks, run_blocks, seed = knob
        self.ranks, self.workers = ranks, max(workers, 1)
        self.epochs = Epochs(
            data, seed, window_blocks, run_blocks, True, ranks * self.workers, self.workers, batch, drop_last
        )

    def streams(self) -> list[list[list[int]]]:
        """What each stream of the current deal yields from here on, batch by batch (positions)."""
        deal, taken = self.epochs.deal()
        out = []
        for rank in range(self.ranks):
            for worker in range(self.workers):
                turn, skip = deal.resume_point(self.workers, taken, worker)
                served = positions(deal.rest(rank * self.workers + turn, skip))
                out.append([served[i : i + deal.batch_size] for i in range(0, len(served), deal.batch_size)])
        return out

    def rank_batches(self) -> list[list[list[int]]]:
        """Each rank's batches from here on, in the order its DataLoader delivers them: a batch from each
        worker in turn (worker 0 first: the workers were turned to make that so)."""
        streams, out = self.streams(), []
        for rank in range(self.ranks):
            mine = streams[rank * self.workers : (rank + 1) * self.workers]
            out.append([s[i] for i in range(max(map(len, mine))) for s in mine if i < len(s)])
        return out

    def take(self, steps: int | None = None) -> tuple[list[int], EpochState]:
        """Every rank takes `steps` batches (None: the rest of the epoch). Returns the positions served, and
        the job's state after."""
        batches = self.rank_batches()
        lengths = {len(b) for b in batches}
        deal, taken = self.epochs.deal()
        assert lengths == {deal.batches_per_stream * self.workers - taken}, "every rank the same number of batches"
        steps = len(batches[0]) if steps is None else min(steps, len(batches[0]))
        served = [p for rank in batches for batch in rank[:steps] for p in batch]
        return served, self.epochs.after(steps)

    def load(self, state: EpochState) -> Job:
        self.epochs.load(json_round_trip(state))
        return self
