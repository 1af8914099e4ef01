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

import logging
import math
import warnings
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import PackingError, UsageError
from ..format.spec import Layout
from ..format.token_counts import counts_url
from ..read.megatron import MegatronCorpus
from ..read.reader import AtlasDataset
from .census import TokenCounts, block_ids, document, refuse, where
from .epochs import Sources
from .mixture import Mixture
from .plan import EpochPlan
from .runs import Runs, SizedRuns, Source
from .serving import serve
from .streams import EpochStream

log = logging.getLogger(__name__)
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

    made_of = "seq_len, eod, key or the token counts, or the datasets, their weights, window_blocks or run_blocks"

    def __init__(
        self, data: AtlasDataset | MegatronCorpus | Mixture, key: str, length: int, eod: int | None, counts: Any
    ) -> None:
        super().__init__(data)
        self.key, self.length, self.eod = key, length, eod
        warn_if_eod_twice(self.datasets, eod)
        self.counts = [self._counts(ds, layout, given) for ds, layout, given in self._given(counts)]
        self._sized: dict[int, list[SizedRuns]] = {}

    def _given(self, counts: Any) -> Iterator[tuple[AtlasDataset, Layout, Any]]:
        """Each dataset's counts: from a list in the mixture's order, a dict by the datasets' URLs, or (None, or
        a dataset a dict leaves out) found beside the dataset."""
        n = len(self.datasets)
        if isinstance(counts, Mapping):
            urls = [getattr(ds, "url", None) for ds in self.datasets]
            unknown = sorted(set(counts) - set(urls))
            if unknown:
                raise UsageError(
                    f"counts names {unknown[0]!r}, which is none of the datasets: {', '.join(map(str, urls))}"
                )
            given = [counts.get(url) for url in urls]
        elif isinstance(counts, (list, tuple)):
            given = list(counts)
        elif counts is not None and n > 1:
            raise UsageError(
                f"one counts for a mixture of {n} datasets: give each its own (a list in the mixture's order, or a "
                f"dict by dataset URL), or none: each is then found beside its dataset (<url>.tokens)"
            )
        else:
            given = [counts] * n
        if len(given) != n:
            raise UsageError(f"counts has {len(given)} entries for {n} datasets")
        yield from zip(self.datasets, self.layouts(), given)

    def _counts(self, dataset: AtlasDataset, layout: Layout, given: Any) -> TokenCounts:
        if given is None and isinstance(dataset, AtlasDataset):  # where a writer told tokens= saved them
            try:
                return TokenCounts.load(
                    counts_url(dataset.url, self.key), layout, self.key, getattr(dataset, "storage_options", None)
                )
            except PackingError as err:
                if not isinstance(err.__cause__, FileNotFoundError):
                    raise
            log.warning(
                "%s: no token counts beside it (%s): counting them in this process, one pass over the data; save "
                "them once (TokenCounts.of(ds).save(url), or write with tokens=%r)",
                dataset.url,
                counts_url(dataset.url, self.key),
                self.key,
            )
        if given is None:
            return TokenCounts.of(dataset, self.key)
        if isinstance(given, str):  # saved beside the data: read with the dataset's storage options
            return TokenCounts.load(given, layout, self.key, getattr(dataset, "storage_options", None))
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
        return SizedRuns(layout, run_blocks, self._run_tokens(layout, counts, run_blocks) // self.length)

    def _run_tokens(self, layout: Layout, counts: TokenCounts, run_blocks: int) -> np.ndarray:
        """The tokens each run packs, end-of-document tokens included."""
        runs = Runs(layout, run_blocks)
        run_of_block = np.repeat(np.arange(len(runs)), self._blocks_per_run(runs))
        tokens = np.bincount(run_of_block, weights=counts.blocks, minlength=len(runs)).astype(np.int64)
        if self.eod is not None:
            tokens += runs.spans(np.arange(len(runs)))[1]
        return tokens

    def check(self, run_blocks: int) -> None:
        """UsageError where a dataset asked for a share packs into no row: an epoch of nothing (seq_len longer
        than any run, or than the whole dataset), or a mixture's share silently left out."""
        super().check(run_blocks)
        asked = self.mixture.asked()
        for d, (layout, counts, sized) in enumerate(zip(self.layouts(), self.counts, self.sized(run_blocks))):
            if sized.size or not asked[d]:
                continue
            tokens = self._run_tokens(layout, counts, run_blocks)
            name = self.mixture.names[d]
            which = f"{name}, dataset {d} of the mixture," if len(self.datasets) > 1 else name
            raise UsageError(
                f"{which} packs into no row of seq_len + 1 = {self.length:,} tokens: its runs of {run_blocks} "
                f"blocks hold at most {int(tokens.max(initial=0)):,} tokens (the dataset {int(tokens.sum()):,}); "
                f"use a smaller seq_len{', or a larger run_blocks' if tokens.sum() >= self.length else ''}",
                url=name,
            )

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
        runs = np.unique(run).tolist()
        fetched = runs_documents(self.datasets[d], sized, runs)
        for r in runs:
            packed = self._packed(plan, d, sized, r, fetched.get(r))
            for i in ids[run == r].tolist():
                j = i - int(sized.first[r])
                rows[i] = packed[j * self.length : (j + 1) * self.length]
        return [rows[i] for i in ids.tolist()]

    def _packed(self, plan: EpochPlan, d: int, sized: SizedRuns, r: int, run: tuple | None = None) -> np.ndarray:
        """Run r's rows back to back; `run`: its documents' tokens back to back and lengths, already read."""
        dataset, layout, counts = self.datasets[d], sized.layout, self.counts[d]
        (first,), (size,) = Runs.spans(sized, np.array([r]))
        indices = np.arange(int(first), int(first) + int(size), dtype=np.int64)
        docs = run_documents(dataset, layout, self.key, indices) if run is None else []
        lengths = np.array([len(t) for t in docs], dtype=np.int64) if run is None else run[1]
        blocks = block_ids(layout, indices)[1]
        found = np.bincount(blocks - blocks[0], weights=lengths).astype(np.int64)
        expected = counts.blocks[blocks[0] : blocks[0] + len(found)].astype(np.int64)
        if not np.array_equal(found, expected):
            bad = int(np.flatnonzero(found != expected)[0])
            raise PackingError(
                f"{int(found[bad]):,} tokens under {self.key!r} where the token counts say {int(expected[bad]):,}: "
                f"the counts are stale or not this dataset's: count again with TokenCounts.of(dataset)",
                **where(dataset, layout, int(indices[np.flatnonzero(blocks - blocks[0] == bad)[0]])),
            )
        order = np.random.default_rng(np.random.SeedSequence([plan.seed, plan.epoch, d, r, 5])).permutation(
            len(lengths)
        )
        if run is not None:
            return packed_run(run[0], lengths, order, self.eod)
        if self.eod is not None:
            end = np.array([self.eod], dtype=np.min_scalar_type(self.eod))
            return np.concatenate([part for k in order.tolist() for part in (docs[k], end)] or [end[:0]])
        return np.concatenate([docs[k] for k in order.tolist()] or [np.zeros(0, np.int64)])


def runs_documents(dataset: Any, sized: SizedRuns, runs: list[int]) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    """Each run's documents' tokens back to back and their lengths, where the source serves runs of documents
    whole (a Megatron corpus: one ranged read a run, every run of a window in flight together); else nothing
    (`run_documents` reads them one by one)."""
    if not isinstance(dataset, MegatronCorpus) or not runs:
        return {}
    firsts, sizes = Runs.spans(sized, np.array(runs))
    return dict(zip(runs, dataset.runs(list(zip(firsts.tolist(), sizes.tolist())))))


def packed_run(flat: np.ndarray, lengths: np.ndarray, order: np.ndarray, eod: int | None) -> np.ndarray:
    """Documents (`flat`, cut by `lengths`) concatenated in `order`, `eod` after each if given: one gather, as
    concatenating each document's slice would give (no Python step per document: a run of 200 B documents
    holds thousands)."""
    starts = (np.cumsum(lengths) - lengths)[order]
    taken = lengths[order] + (eod is not None)
    begins = np.cumsum(taken) - taken
    total = int(taken.sum())
    at = np.repeat(starts - begins, taken) + np.arange(total, dtype=np.int64)
    if eod is None:
        return flat[at]
    ends = begins + taken - 1
    at[ends] = 0  # the eod's place: any token, written over below
    out = (flat[at] if len(flat) else np.zeros(total, flat.dtype)).astype(
        np.result_type(flat.dtype, np.min_scalar_type(eod)), copy=False
    )
    out[ends] = eod
    return out


def run_documents(dataset: Any, layout: Layout, key: str, indices: np.ndarray) -> list[np.ndarray]:
    """The token ids of a run's documents, read and checked one by one."""
    docs = []
    for k, example in zip(indices.tolist(), dataset.read(indices)):
        tokens = document(example, key)
        if isinstance(tokens, str):
            raise refuse(dataset, layout, k, tokens)
        docs.append(tokens)
    return docs


def warn_if_eod_twice(datasets: Sequence[Any], eod: int | None) -> None:
    """A Megatron corpus written with `--append-eod` ends every document with its end-of-document token already:
    eod= would put a second one after each. Said once, when the stream is made."""
    for ds in datasets:
        if eod is not None and isinstance(ds, MegatronCorpus) and ds.ends_with() == eod:
            warnings.warn(
                f"{ds.url}: its documents already end with token {eod} (written with --append-eod): eod={eod} "
                f"adds a second one after each; leave eod out for this corpus",
                stacklevel=3,
            )


class TokenStream(EpochStream):
    """Documents of token ids packed into rows, as batches `{"tokens": [batch_size, seq_len + 1]}`: a model
    reads `tokens[:, :-1]` and predicts `tokens[:, 1:]` (every token is served once, none twice).

    Over one dataset of `{key: 1-D integer array, ...}` examples (or a Megatron corpus read in place:
    `atlas_remote.megatron`, whose counts come from its .idx), or a `Mixture` of such datasets (its weights,
    repeats or counts are of sequences; each row comes from one dataset, every batch draws on all of them). Each
    run of blocks is packed on its own (documents shuffled each epoch, `eod` after each if given): what a run
    leaves over, less than a row, is dropped (`dropped`: under 1 % with the default run size).

    Packing needs each block's token count before reading: `counts` is a `TokenCounts` or a URL it was saved
    at (for a mixture: a list of either, or a dict by dataset URL); without it, the counts saved beside each
    dataset (`<url>.tokens`: what a writer given `tokens=` saves, or `TokenCounts.save`) are used, else made
    here by a pass over the data, with a warning (every rank would do it). `len`, `loader()`, `set_epoch`,
    `state_dict(batches_seen=...)`, `load_state_dict` and StatefulDataLoader work as with `ShuffledStream`:
    the order never depends on the topology, every rank yields the same number of batches, and a checkpoint
    resumes exactly at any world size and worker count; `rank` and `world_size` default to the job's, as there.
    `with_source=True` adds `"source"` (dataset index).
    """

    def __init__(
        self,
        data: AtlasDataset | MegatronCorpus | Mixture,
        seq_len: int,
        *,
        key: str = "tokens",
        batch_size: int,
        num_workers: int = 0,
        rank: int | None = None,
        world_size: int | None = None,
        seed: int = 0,
        eod: int | None = None,
        counts: TokenCounts | str | Sequence[TokenCounts | str] | Mapping[str, TokenCounts | str] | None = None,
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
