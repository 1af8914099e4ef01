"""TokenStream: documents packed into rows of seq_len + 1 tokens, an epoch that serves no token twice and drops
only what runs leave over (stated exactly by `dropped`), resumed exactly at another world size, through real
DataLoaders, over mixtures; and the token counts it packs from, checked when loaded and when read."""

from __future__ import annotations

import json
from collections import Counter

import numpy as np
import pytest
import torch
from helpers import tries
from hypothesis import given, settings
from hypothesis import strategies as st

import atlas_remote as ar
from atlas_remote import PackingError
from atlas_remote.training.census import TokenCounts
from atlas_remote.training.plan import Layout
from atlas_remote.training.tokens import PackedSources, TokenStream


class Documents:
    """A dataset as a TokenStream sees it, in memory: token ids are unique across it, so a token served twice
    or not at all is seen. Picklable (simulated workers get copies)."""

    def __init__(self, lengths: list[int], shard_size: int, block_size: int, start: int = 0, url: str = "docs"):
        sizes = [min(shard_size, len(lengths) - k) for k in range(0, len(lengths), shard_size)] or [0]
        self._layout, self.url = Layout.of(sizes, [block_size] * len(sizes)), url
        ends = np.cumsum([0, *lengths]) + start
        self.docs = [{"id": i, "tokens": np.arange(ends[i], ends[i + 1], dtype=np.uint32)} for i in range(len(lengths))]

    def layout(self) -> Layout:
        return self._layout

    def __len__(self) -> int:
        return len(self.docs)

    def iter(self, start: int, stop: int):
        return iter(self.docs[start:stop])

    def read(self, indices) -> list:
        return [self.docs[int(i)] for i in indices]

    def tokens(self) -> set[int]:
        return {int(t) for doc in self.docs for t in doc["tokens"]}


def rows_of(stream: TokenStream, batches: int | None = None) -> list[np.ndarray]:
    out = []
    for k, batch in enumerate(stream):
        if batches is not None and k == batches:
            break
        out += list(batch["tokens"])
    return out


def flat(rows) -> list[int]:
    return [int(t) for row in rows for t in np.asarray(row)]


@settings(max_examples=tries(60), deadline=None)
@given(
    st.lists(st.integers(1, 60), min_size=1, max_size=120),
    st.integers(1, 40),
    st.integers(1, 8),
    st.integers(1, 24),
    st.sampled_from([None, 1 << 30]),
    st.integers(1, 4),
    st.integers(0, 3),
)
def test_an_epoch_serves_no_token_twice_and_drops_only_what_runs_leave(
    lengths, shard_size, block_size, seq_len, eod, ranks, epoch
):
    """For any documents, shards, blocks, row length and ranks: every rank yields the same number of batches,
    every row holds seq_len + 1 tokens, no token is served twice, and what is not served is exactly `dropped`
    (what each run leaves over after whole rows). An epoch of no row at all is refused, and only that."""
    data = Documents(lengths, shard_size, block_size)
    try:
        streams = [
            TokenStream(data, seq_len, batch_size=3, rank=r, world_size=ranks, seed=7, eod=eod, window_blocks=4)
            for r in range(ranks)
        ]
    except ar.UsageError as refused:
        sources = PackedSources(data, "tokens", seq_len + 1, eod, None)
        assert "packs into no row" in str(refused) and sources.sized(sources.run_blocks())[0].size == 0
        return
    for stream in streams:
        stream.set_epoch(epoch)
    batches = [list(stream) for stream in streams]
    assert len({len(b) for b in batches}) == 1 and len(batches[0]) == len(streams[0]), "the same batches per rank"
    rows = [row for rank in batches for batch in rank for row in batch["tokens"]]
    assert all(len(row) == seq_len + 1 for row in rows)
    deal = streams[0].epochs.deal()[0]
    ((total, dropped),) = streams[0].dropped
    assert len(rows) * (seq_len + 1) == total - dropped + deal.padding * (seq_len + 1), "every row, once"
    counts = Counter(t for t in flat(rows) if t != eod)
    assert sum(n - 1 for n in counts.values()) <= deal.padding * (seq_len + 1), "twice: a deal's padding only"
    assert set(counts) <= data.tokens() and len(data.tokens()) - len(counts) <= dropped


def test_one_epoch_serves_over_99_percent_of_its_tokens_none_twice():
    rng = np.random.default_rng(1)
    data = Documents(rng.integers(5, 301, 4000).tolist(), 500, 16)
    stream = TokenStream(data, 127, batch_size=8, seed=3)
    tokens = flat(rows_of(stream))
    ((total, dropped),) = stream.dropped
    assert len(tokens) == len(set(tokens)) == total - dropped and dropped / total < 0.01, (dropped, total)


def test_four_ranks_then_three_serve_the_uninterrupted_epochs_tokens_once():
    """4 ranks take k batches each and checkpoint (the same state on every rank); 3 ranks load it and finish
    the epoch: the union is the uninterrupted epoch's tokens, none twice. At every k."""
    rng = np.random.default_rng(2)
    data = Documents(rng.integers(5, 120, 600).tolist(), 100, 8)

    def job(world: int) -> list[TokenStream]:
        return [
            TokenStream(data, 31, batch_size=2, rank=r, world_size=world, seed=5, window_blocks=8) for r in range(world)
        ]

    whole = set(flat(row for stream in job(4) for row in rows_of(stream)))
    steps = len(job(4)[0])
    for k in range(0, steps + 1, 3):
        first = job(4)
        served = flat(row for stream in first for row in rows_of(stream, k))
        states = [json.loads(json.dumps(stream.state_dict(batches_seen=k))) for stream in first]
        assert all(state == states[0] for state in states)
        second = job(3)
        for stream in second:
            stream.load_state_dict(states[0])
        rest = [rows_of(stream) for stream in second]
        assert len({len(rows) for rows in rest}) == 1, "every rank the same number of batches"
        if k == steps:
            assert states[0]["deals"] == [] and states[0]["epoch"] == 1
            continue
        union = served + flat(row for rows in rest for row in rows)
        assert len(union) == len(set(union)) and set(union) == whole, k


def test_a_mixture_of_token_datasets_mixes_rows_inside_batches():
    rng = np.random.default_rng(3)
    a = Documents(rng.integers(5, 200, 1400).tolist(), 200, 8, url="a")
    b = Documents(rng.integers(5, 200, 600).tolist(), 200, 8, start=10**8, url="b")
    stream = TokenStream(ar.Mixture([a, b], weights=[0.7, 0.3]), 15, batch_size=32, seed=1, with_source=True)
    batches = list(stream)
    shares = np.array([np.mean(batch["source"] == 0) for batch in batches[:-1]])
    assert abs(shares.mean() - 0.7) <= 0.02 and shares.std() <= 0.15 and np.mean((shares == 0) | (shares == 1)) <= 0.01
    for batch in batches:
        for source, row in zip(batch["source"], batch["tokens"]):
            assert (row < 10**8).all() == (source == 0), "a row comes from its source alone"
    tokens = flat(row for batch in batches for row in batch["tokens"])
    plan = stream.epochs.plan(0)
    upsampled = sum(max(0, s.count - r.size) for s, r in zip(plan.sources, plan.runs))  # rows of a second pass
    assert len(tokens) - len(set(tokens)) == upsampled * 16, "twice: only what the weights ask past a dataset"


# -- real datasets, real DataLoaders ---------------------------------------------------------------------------


def write_documents(url: str, n: int, seed: int = 0, options=None) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    docs, at = [], 0
    with ar.AtlasDatasetWriter(url, 200, 8, storage_options=options) as writer:
        for i in range(n):
            length = int(rng.integers(5, 301))
            docs.append(np.arange(at, at + length, dtype=np.uint32))
            at += length
            writer.add_example({"text": f"document {i}", "tokens": docs[-1]})
    return docs


def test_two_workers_persistent_resume_and_stateful_dataloader(s3):
    """From S3 with 2 DataLoader workers: counts saved once and loaded by URL; int64 rows of seq_len + 1;
    persistent workers reshuffle each epoch; a checkpoint resumes with 3 workers exactly; a StatefulDataLoader
    resumes with its own state."""
    from torchdata.stateful_dataloader import StatefulDataLoader

    options, bucket, _ = s3
    url = f"s3://{bucket}/docs"
    docs = write_documents(url, 800, options=options)
    ds = ar.open(url, storage_options=options)
    TokenCounts.of(ds).save(f"{url}-tokens", options)

    def make(workers: int) -> TokenStream:
        return TokenStream(ds, 63, batch_size=4, num_workers=workers, seed=2, counts=f"{url}-tokens", window_blocks=8)

    stream = make(2)
    loader = stream.loader(persistent_workers=True)
    epochs = []
    for epoch in range(2):
        stream.set_epoch(epoch)
        batches = list(loader)
        assert all(b["tokens"].dtype == torch.int64 and b["tokens"].shape[1] == 64 for b in batches)
        epochs.append(flat(row for b in batches for row in b["tokens"]))
    assert epochs[0] != epochs[1] and len(epochs[0]) == len(epochs[1]), "another order, as many rows"
    assert all(len(set(tokens)) == len(tokens) for tokens in epochs)

    stream = make(2)
    first = []
    for step, batch in enumerate(stream.loader()):
        first += flat(batch["tokens"])
        if step == 6:
            state = json.loads(json.dumps(stream.state_dict(batches_seen=step + 1)))
            break
    resumed = make(3)
    resumed.load_state_dict(state)
    rest = flat(row for b in resumed.loader() for row in b["tokens"])
    whole = flat(row for b in make(2).loader() for row in b["tokens"])
    assert len(first + rest) == len(set(first + rest)) and set(first + rest) == set(whole)

    stateful = StatefulDataLoader(make(2), batch_size=None, num_workers=2)
    head = []
    for step, batch in enumerate(stateful):
        head += flat(batch["tokens"])
        if step == 4:
            saved = stateful.state_dict()
            break
    again = StatefulDataLoader(make(2), batch_size=None, num_workers=2)
    again.load_state_dict(saved)
    assert head + flat(row for b in again for row in b["tokens"]) == whole
    assert {int(t) for d in docs for t in d} >= set(whole)


# -- counts: made, saved, loaded, and checked ----------------------------------------------------------------


def test_counts_round_trip_and_hostile_files_are_refused_in_one_line(tmp_path):
    write_documents(str(tmp_path / "ds"), 100)
    ds = ar.open(str(tmp_path / "ds"))
    counts = TokenCounts.of(ds)
    counts.save(str(tmp_path / "counts"))
    assert np.array_equal(TokenCounts.load(str(tmp_path / "counts"), ds).blocks, counts.blocks)
    good = counts.to_bytes()
    head, body = good.split(b"\n", 1)
    header = json.loads(head)
    hostile = {
        "other key": json.dumps({**header, "key": "ids"}).encode() + b"\n" + body,
        "other dataset": json.dumps({**header, "layout": "0" * 16}).encode() + b"\n" + body,
        "claims more blocks": json.dumps({**header, "blocks": 10**12}).encode() + b"\n" + body,
        "short": good[:-4],
        "long": good + b"\0" * 4,
        "huge": good + b"\0" * (1 << 24),
        "no header": b"x" * 10_000,
        "not json": b"{nope\n" + body,
        "a list": b"[1, 2]\n" + body,
        "deep": b"[" * 4000 + b"\n",
        "empty": b"",
    }
    for name, raw in hostile.items():
        (tmp_path / "bad").write_bytes(raw)
        with pytest.raises(PackingError) as error:
            TokenCounts.load(str(tmp_path / "bad"), ds)
        assert "\n" not in str(error.value) and "count them again" in str(error.value), name


def test_counts_that_do_not_match_the_blocks_read_are_refused_naming_the_block(tmp_path):
    write_documents(str(tmp_path / "ds"), 100)
    ds = ar.open(str(tmp_path / "ds"))
    counts = TokenCounts.of(ds)
    forged = counts.blocks.copy()
    forged[5] += 64  # one row more for its run: it would be cut from tokens that are not there
    stream = TokenStream(ds, 15, batch_size=4, counts=TokenCounts(counts.key, counts.layout, forged))
    with pytest.raises(PackingError) as error:
        list(stream)
    assert error.value.shard == "0" and error.value.block == 5 and "count again" in str(error.value)


@pytest.mark.parametrize(
    "bad, says",
    [
        ({"text": "no tokens"}, "has no 'tokens'"),
        ({"tokens": np.zeros((2, 2), np.int32)}, "shape (2, 2)"),
        ({"tokens": "abc"}, "a str"),
        ({"tokens": np.zeros(3, np.float32)}, "float32"),
    ],
)
def test_a_document_that_cannot_be_packed_is_named_in_one_line(tmp_path, bad, says):
    with ar.AtlasDatasetWriter(str(tmp_path / "ds"), 20, 4) as writer:
        for i in range(30):
            writer.add_example(bad if i == 25 else {"tokens": np.arange(i, i + 9, dtype=np.uint16)})
    ds = ar.open(str(tmp_path / "ds"))
    with pytest.raises(PackingError) as error:
        TokenStream(ds, 7, batch_size=2)
    message = str(error.value)
    assert says in message and "example 25" in message and "\n" not in message
    assert (error.value.shard, error.value.block) == ("1", 1)
