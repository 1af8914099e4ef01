"""Language-model batches: documents of token ids packed into sequences of one length, as an epoch that resumes
exactly at any world size and worker count.

A position of the epoch is a packed sequence. Each run of blocks (a request's worth of documents, about 640
rows) is packed on its own: its documents, shuffled each epoch, are concatenated (an end-of-document token after each, if one is
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
from .plan import EpochPlan
from .runs import Runs, SizedRuns, Source
from .serving import Held, serve
from .streams import EpochStream

log = logging.getLogger(__name__)
RUN_SEQUENCES = 640  # runs are sized to hold this many sequences on average: what they drop is under 0.1 %


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

    def __init__(self, data: Any, key: str, length: int, eod: int | None, counts: Any, dtype: Any = np.int64) -> None:
        super().__init__(data)
        self.key, self.length, self.eod, self.dtype = key, length, eod, np.dtype(dtype)
        if eod is not None and not np.iinfo(self.dtype).min <= eod <= np.iinfo(self.dtype).max:
            raise ValueError(f"eod={eod} is not a {self.dtype} value: give a dtype that holds it")
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
            known = dataset.token_counts(self.key) if hasattr(dataset, "token_counts") else None
            return known if known is not None else TokenCounts.of(dataset, self.key)
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
        before it), as views of each run's packed tokens (each run's documents read once, checked against the
        counts, shuffled and packed): copied once, into a batch (`batch`)."""
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

    def batch(self, rows: list[np.ndarray]) -> np.ndarray:
        """Rows into one batch of the stream's dtype: the one copy of each token (values were checked to fit when
        their run was packed)."""
        return np.stack(rows).astype(self.dtype, copy=False) if rows else np.zeros((0, self.length), self.dtype)

    def _packed(self, plan: EpochPlan, d: int, sized: SizedRuns, r: int, run: tuple | None = None) -> np.ndarray:
        """Run r's documents, shuffled for this epoch and concatenated (`eod` after each), in their own dtype when
        it fits the stream's (else in the stream's, every value checked to fit). `run`: its documents' tokens back
        to back and their lengths, already read (a window's runs fetched together)."""
        layout = sized.layout
        (first,), (size,) = Runs.spans(sized, np.array([r]))
        first, size = int(first), int(size)
        flat, docs, lengths = (run[0], [], run[1]) if run is not None else self._documents(d, layout, first, size)
        self._check_counts(d, layout, first, lengths)
        order = np.random.default_rng(np.random.SeedSequence([plan.seed, plan.epoch, d, r, 5])).permutation(
            len(lengths)
        )
        dtype = self._packing_dtype(d, layout, first, [flat] if flat is not None else docs)
        if flat is not None:  # one gather, no Python step per document
            return packed_run(flat, lengths, order, self.eod).astype(dtype, copy=False)
        if self.eod is not None:
            end = np.array([self.eod], dtype=dtype)
            parts = [part for k in order.tolist() for part in (docs[k], end)]
        else:
            parts = [docs[k] for k in order.tolist()]
        return np.concatenate(parts, dtype=dtype, casting="unsafe") if parts else np.zeros(0, dtype)

    def _documents(
        self, d: int, layout: Layout, first: int, count: int
    ) -> tuple[np.ndarray | None, list[np.ndarray], np.ndarray]:
        """Documents first..first+count-1 of dataset d (one shard's) and their lengths: from a token source's
        `documents()` (one ranged read of a flat array, returned whole), else each example's array under the key."""
        dataset = self.datasets[d]
        if hasattr(dataset, "documents"):
            flat, lengths = dataset.documents(first, count)
            flat, lengths = np.asarray(flat), np.asarray(lengths, dtype=np.int64)
            if flat.ndim != 1 or flat.dtype.kind not in "iu" or lengths.shape != (count,) or lengths.sum() != len(flat):
                raise refuse(
                    dataset, layout, first, f"and the {count - 1} after it are not {count} documents of token ids"
                )
            return flat, [], lengths
        docs = run_documents(dataset, layout, self.key, np.arange(first, first + count))
        return None, docs, np.fromiter(map(len, docs), dtype=np.int64, count=len(docs))

    def _check_counts(self, d: int, layout: Layout, first: int, lengths: np.ndarray) -> None:
        blocks = block_ids(layout, np.arange(first, first + len(lengths)))[1]
        if not len(blocks):
            return
        found = np.bincount(blocks - blocks[0], weights=lengths).astype(np.int64)
        expected = self.counts[d].blocks[blocks[0] : blocks[0] + len(found)].astype(np.int64)
        if not np.array_equal(found, expected):
            bad = int(np.flatnonzero(found != expected)[0])
            raise PackingError(
                f"{int(found[bad]):,} tokens under {self.key!r} where the token counts say {int(expected[bad]):,}: "
                f"the counts are stale or not this dataset's: count again with TokenCounts.of(dataset)",
                **where(self.datasets[d], layout, first + int(np.flatnonzero(blocks - blocks[0] == bad)[0])),
            )

    def _packing_dtype(self, d: int, layout: Layout, first: int, docs: list[np.ndarray]) -> np.dtype:
        """The documents' dtype where all share one that the stream's dtype holds (the batch widens it), else the
        stream's, once every document that could hold other values is checked to fit it."""
        kinds = {doc.dtype for doc in docs}
        if len(kinds) == 1 and np.can_cast(next(iter(kinds)), self.dtype, "safe"):
            own = next(iter(kinds))
            if self.eod is None or np.iinfo(own).min <= self.eod <= np.iinfo(own).max:
                return own
        limits = np.iinfo(self.dtype)
        for k, doc in enumerate(docs):
            if doc.size and not np.can_cast(doc.dtype, self.dtype, "safe"):
                low, high = int(doc.min()), int(doc.max())
                if low < limits.min or high > limits.max:
                    raise PackingError(
                        f"example {first + k} holds token ids from {low} to {high} ({doc.dtype}), which batches "
                        f"of {self.dtype} cannot hold exactly: give TokenStream a dtype= that holds them",
                        **where(self.datasets[d], layout, first + k),
                    )
        return self.dtype


def batch_dtype(dtype: Any) -> np.dtype:
    """A batch's integer dtype from a torch or numpy one (None: int64, what nn.Embedding and indexing take)."""
    if dtype is None:
        return np.dtype(np.int64)
    if type(dtype).__module__ == "torch":
        import torch

        dtype = torch.empty(0, dtype=dtype).numpy().dtype
    try:
        found = np.dtype(dtype)
    except TypeError:
        found = None
    if found is None or found.kind not in "iu":
        raise ValueError(f"dtype must be an integer dtype (torch.int32, torch.int64, ...), got {dtype!r}")
    return found


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
    leaves over, less than a row, is dropped (`dropped`: under 0.1 % with the default run size). Batches are
    int64, or `dtype` (torch.int32 halves what crosses from the workers); an id the dtype cannot hold is a
    PackingError naming its example.

    A dataset here is an AtlasDataset or any token source offering `layout()` (a `format.spec.Layout`:
    documents per file as its shards, documents per block), `url`, `read(indices)` (examples as
    `{key: 1-D int array}`), `token_counts(key)` (a TokenCounts known without a pass, or None) and
    `documents(first, count)`: documents first..first+count-1, consecutive within one shard, as
    `(flat 1-D int array, lengths)` from one read, which packing uses where a source has it (docs/training.md,
    "Token sources").

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
        data: Any,
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
        window_blocks: int | None = None,
        run_blocks: int | None = None,
        prefetch: int = 2,
        drop_last: bool = False,
        with_source: bool = False,
        dtype: Any = None,
    ) -> None:
        if not isinstance(seq_len, int) or seq_len < 1:
            raise ValueError(f"seq_len must be an integer >= 1, got {seq_len!r}")
        if eod is not None and (not isinstance(eod, int) or eod < 0):
            raise ValueError(f"eod must be a token id (an integer >= 0) or None, got {eod!r}")
        sources = PackedSources(data, key, seq_len + 1, eod, counts, batch_dtype(dtype))
        run_blocks = run_blocks or sources.run_blocks()
        window_blocks = window_blocks or run_blocks  # a window a run: what is read twice where streams meet is small
        super().__init__(
            sources, batch_size, num_workers, window_blocks, run_blocks, prefetch, seed, rank, world_size, drop_last
        )
        self.seq_len, self.key, self.eod, self.with_source = seq_len, key, eod, with_source
        self.packed = sources
        self._start_fork_server()

    @property
    def dropped(self) -> list[tuple[int, int]]:
        """(tokens, of which no row holds) in one pass through each dataset, end-of-document tokens included:
        what packing runs on their own leaves out, exact, from the counts."""
        return self.packed.dropped(self.epochs.run_blocks)

    def _serve(self, plan: EpochPlan, piece: np.ndarray, prefetch: int, held: Held | None = None) -> Iterator[Any]:
        sources, size = self.packed, self.batch_size

        def fetch(d: int, ids: np.ndarray) -> list:
            return [(d, row) for row in sources.sequences(plan, d, ids)]

        pending: list = []
        for items in serve(plan, piece, fetch, prefetch, held):
            pending += items
            while len(pending) >= size:
                batch, pending = pending[:size], pending[size:]
                yield self._batch(batch)
        if pending:
            yield self._batch(pending)

    def _batch(self, rows: list[tuple[int, np.ndarray]]) -> dict[str, np.ndarray]:
        batch = {"tokens": self.packed.batch([row for _, row in rows])}
        if self.with_source:
            batch["source"] = np.array([d for d, _ in rows], dtype=np.int64)
        return batch
