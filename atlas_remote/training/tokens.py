"""Language-model batches: documents of token ids packed into sequences of one length, as an epoch that resumes
exactly at any world size and worker count.

A position of the epoch is a packed sequence. Each run of blocks (a request's worth of documents) is packed on
its own: its documents, shuffled each epoch, are concatenated (an end-of-document token after each, if one is
given) and cut into rows of `seq_len + 1` tokens, the few left over dropped. So how many sequences a run gives
is known before it is read, from the token counts of its blocks (census.py), and the plan (plan.py) shuffles
sequences as it shuffles examples: runs in a keyed permutation, sequences shuffled within windows of runs,
datasets of a mixture mixed inside batches. What a process holds beyond O(shards) is one integer per run.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import PackingError
from ..format.spec import Layout
from ..read.reader import AtlasDataset
from .census import TokenCounts, block_ids, document, refuse, where
from .epochs import Sources
from .mixture import Mixture
from .plan import EpochPlan
from .runs import Runs, SizedRuns, Source
from .serving import serve
from .streams import EpochStream

RUN_SEQUENCES = 100  # runs are sized to hold this many sequences on average: what they drop is under 1 %


@dataclass(frozen=True)
class PackedSource(Source):
    """A dataset whose items are the sequences its runs pack into (`sized`, made for one run size)."""

    sized: SizedRuns | None = None
    packing: str = ""  # what the sequences are made of: counts, row length, end-of-document token

    def runs(self, run_blocks: int) -> Runs:
        if self.sized is None or self.sized.run_blocks != run_blocks:
            raise ValueError(f"these sequences were counted for runs of {getattr(self.sized, 'run_blocks', None)}")
        return self.sized

    def digest(self) -> str:
        return f"{self.layout.digest()}:{self.count}:{self.packing}"


class PackedSources(Sources):
    """The datasets of a TokenStream, their token counts, and the sequences each run packs into."""

    def __init__(self, data: AtlasDataset | Mixture, key: str, length: int, eod: int | None, counts: Any) -> None:
        super().__init__(data)
        self.key, self.length, self.eod = key, length, eod
        self.counts = [self._counts(ds, layout, given) for ds, layout, given in self._given(counts)]
        self._sized: dict[int, list[SizedRuns]] = {}

    def _given(self, counts: Any) -> Iterator[tuple[AtlasDataset, Layout, Any]]:
        given = list(counts) if isinstance(counts, (list, tuple)) else [counts] * len(self.datasets)
        if len(given) != len(self.datasets):
            raise ValueError(f"counts has {len(given)} entries for {len(self.datasets)} datasets")
        yield from zip(self.datasets, self.layouts(), given)

    def _counts(self, dataset: AtlasDataset, layout: Layout, given: Any) -> TokenCounts:
        if given is None:
            return TokenCounts.of(dataset, self.key)
        if isinstance(given, str):  # saved beside the data: read with the dataset's storage options
            return TokenCounts.load(given, dataset, self.key, getattr(dataset, "storage_options", None))
        if not isinstance(given, TokenCounts) or given.layout != layout.digest() or given.key != self.key:
            raise PackingError(
                f"counts given are not this dataset's tokens under {self.key!r}: count them with "
                f"TokenCounts.of(dataset, {self.key!r})",
                url=getattr(dataset, "url", None),
            )
        return given

    def run_blocks(self) -> int:
        """Blocks a run takes for it to pack into RUN_SEQUENCES sequences, on average over every dataset."""
        tokens = sum(int(c.blocks.sum()) for c in self.counts)
        blocks = sum(len(c.blocks) for c in self.counts)
        documents = sum(len(layout) for layout in self.layouts()) if self.eod is not None else 0
        per_block = (tokens + documents) / max(blocks, 1)
        return max(1, min(1024, math.ceil(RUN_SEQUENCES * self.length / max(per_block, 1))))

    def sized(self, run_blocks: int) -> list[SizedRuns]:
        """Each dataset's runs, with the sequences each packs into (and so each epoch's size)."""
        if run_blocks not in self._sized:
            self._sized = {
                run_blocks: [self._pack(layout, c, run_blocks) for layout, c in zip(self.layouts(), self.counts)]
            }
        return self._sized[run_blocks]

    def _pack(self, layout: Layout, counts: TokenCounts, run_blocks: int) -> SizedRuns:
        runs = Runs(layout, run_blocks)
        run_of_block = np.repeat(np.arange(len(runs)), self._blocks_per_run(runs))
        tokens = np.bincount(run_of_block, weights=counts.blocks, minlength=len(runs)).astype(np.int64)
        if self.eod is not None:
            tokens += runs.spans(np.arange(len(runs)))[1]
        return SizedRuns(layout, run_blocks, tokens // self.length)

    @staticmethod
    def _blocks_per_run(runs: Runs) -> np.ndarray:
        """Blocks in each run, runs numbered shard after shard."""
        blocks = -(-runs.layout.sizes // runs.layout.block_sizes)
        per_shard = -(-blocks // runs.run_blocks)
        out = np.full(int(per_shard.sum()), runs.run_blocks, dtype=np.int64)
        last = np.cumsum(per_shard)[per_shard > 0] - 1
        out[last] = blocks[per_shard > 0] - (per_shard[per_shard > 0] - 1) * runs.run_blocks
        return out

    def dropped(self, run_blocks: int) -> list[tuple[int, int]]:
        """(tokens, of which left out) in one pass through each dataset, end-of-document tokens included."""
        out = []
        for layout, counts, sized in zip(self.layouts(), self.counts, self.sized(run_blocks)):
            total = int(counts.blocks.sum()) + (len(layout) if self.eod is not None else 0)
            out.append((total, total - int(sized.items.sum()) * self.length))
        return out

    def plan(self, seed: int, epoch: int, window_blocks: int, run_blocks: int, shuffle: bool = True) -> EpochPlan:
        sized = self.sized(run_blocks)
        counts = self.mixture.counts([s.size for s in sized])
        packing = [f"packed:{c.digest()}:{self.length}:{self.eod}" for c in self.counts]
        sources = [
            PackedSource(layout, count, runs, text)
            for layout, count, runs, text in zip(self.layouts(), counts, sized, packing)
        ]
        return EpochPlan(sources, seed, epoch, window_blocks, run_blocks, shuffle)

    def sequences(self, plan: EpochPlan, d: int, ids: np.ndarray) -> list[np.ndarray]:
        """The rows of sequences `ids` of dataset d (its items: sequence j of a run numbered after the runs
        before it), each run's documents read once, checked against the counts, shuffled and packed."""
        sized = self.sized(plan.run_blocks)[d]
        run = np.searchsorted(sized.first, ids, side="right") - 1
        rows: dict[int, np.ndarray] = {}
        for r in np.unique(run).tolist():
            packed = self._packed(plan, d, sized, r)
            for i in ids[run == r].tolist():
                j = i - int(sized.first[r])
                rows[i] = packed[j * self.length : (j + 1) * self.length]
        return [rows[i] for i in ids.tolist()]

    def _packed(self, plan: EpochPlan, d: int, sized: SizedRuns, r: int) -> np.ndarray:
        dataset, layout, counts = self.datasets[d], sized.layout, self.counts[d]
        (first,), (size,) = Runs.spans(sized, np.array([r]))
        indices = np.arange(int(first), int(first) + int(size), dtype=np.int64)
        docs = []
        for k, example in zip(indices.tolist(), dataset.read(indices)):
            tokens = document(example, self.key)
            if isinstance(tokens, str):
                raise refuse(dataset, layout, k, tokens)
            docs.append(tokens)
        blocks = block_ids(layout, indices)[1]
        found = np.bincount(blocks - blocks[0], weights=[len(t) for t in docs]).astype(np.int64)
        expected = counts.blocks[blocks[0] : blocks[0] + len(found)].astype(np.int64)
        if not np.array_equal(found, expected):
            bad = int(np.flatnonzero(found != expected)[0])
            raise PackingError(
                f"{int(found[bad]):,} tokens under {self.key!r} where the token counts say {int(expected[bad]):,}: "
                f"the counts are stale or not this dataset's: count again with TokenCounts.of(dataset)",
                **where(dataset, layout, int(indices[np.flatnonzero(blocks - blocks[0] == bad)[0]])),
            )
        order = np.random.default_rng(np.random.SeedSequence([plan.seed, plan.epoch, d, r, 5])).permutation(len(docs))
        if self.eod is not None:
            end = np.array([self.eod], dtype=np.min_scalar_type(self.eod))
            return np.concatenate([part for k in order.tolist() for part in (docs[k], end)] or [end[:0]])
        return np.concatenate([docs[k] for k in order.tolist()] or [np.zeros(0, np.int64)])


class TokenStream(EpochStream):
    """Documents of token ids packed into rows, as batches `{"tokens": [batch_size, seq_len + 1]}`: a model
    reads `tokens[:, :-1]` and predicts `tokens[:, 1:]` (every token is served once, none twice).

    Over one dataset of `{key: 1-D integer array, ...}` examples, or a `Mixture` of such datasets (its weights,
    repeats or counts are of sequences; each row comes from one dataset, every batch draws on all of them). Each
    run of blocks is packed on its own (documents shuffled each epoch, `eod` after each if given): what a run
    leaves over, less than a row, is dropped (`dropped`: under 1 % with the default run size).

    Packing needs each block's token count before reading: `counts` is a `TokenCounts` (or a URL it was saved
    at, or a list of either for a mixture); without it the counts are made here, by a pass over the data
    (do that once, save them, and give every rank the URL). `len`, `loader()`, `set_epoch`,
    `state_dict(batches_seen=...)`, `load_state_dict` and StatefulDataLoader work as with `ShuffledStream`:
    the order never depends on the topology, every rank yields the same number of batches, and a checkpoint
    resumes exactly at any world size and worker count. `with_source=True` adds `"source"` (dataset index).
    """

    def __init__(
        self,
        data: AtlasDataset | Mixture,
        seq_len: int,
        *,
        key: str = "tokens",
        batch_size: int,
        num_workers: int = 0,
        rank: int = 0,
        world_size: int = 1,
        seed: int = 0,
        eod: int | None = None,
        counts: TokenCounts | str | Sequence[TokenCounts | str] | None = None,
        window_blocks: int = 64,
        run_blocks: int | None = None,
        prefetch: int = 2,
        drop_last: bool = False,
        with_source: bool = False,
    ) -> None:
        if not isinstance(seq_len, int) or seq_len < 1:
            raise ValueError(f"seq_len must be an integer >= 1, got {seq_len!r}")
        if eod is not None and (not isinstance(eod, int) or eod < 0):
            raise ValueError(f"eod must be a token id (an integer >= 0) or None, got {eod!r}")
        sources = PackedSources(data, key, seq_len + 1, eod, counts)
        run_blocks = run_blocks or sources.run_blocks()
        super().__init__(
            sources, batch_size, num_workers, window_blocks, run_blocks, prefetch, seed, rank, world_size, drop_last
        )
        self.seq_len, self.key, self.eod, self.with_source = seq_len, key, eod, with_source
        self.packed = sources

    @property
    def dropped(self) -> list[tuple[int, int]]:
        """(tokens, of which no row holds) in one pass through each dataset, end-of-document tokens included:
        what packing runs on their own leaves out, exact, from the counts."""
        return self.packed.dropped(self.epochs.run_blocks)

    def _serve(self, plan: EpochPlan, piece: np.ndarray, prefetch: int) -> Iterator[Any]:
        sources, size = self.packed, self.batch_size

        def fetch(d: int, ids: np.ndarray) -> list:
            return [(d, row) for row in sources.sequences(plan, d, ids)]

        pending: list = []
        for items in serve(plan, piece, fetch, prefetch):
            pending += items
            while len(pending) >= size:
                batch, pending = pending[:size], pending[size:]
                yield self._batch(batch)
        if pending:
            yield self._batch(pending)

    def _batch(self, rows: list[tuple[int, np.ndarray]]) -> dict[str, np.ndarray]:
        batch = {"tokens": np.stack([row for _, row in rows])}
        if self.with_source:
            batch["source"] = np.array([d for d, _ in rows], dtype=np.int64)
        return batch
