"""TokenStream's inputs beyond an AtlasDataset, and its batches' dtype: a token source that hands over documents
as one flat array (the seam a Megatron corpus read in place plugs into) packs the same rows as the dataset of the
same documents, in a Mixture too; batches come in the dtype asked for, every token id exactly, and documents whose
ids that dtype cannot hold are refused in one line."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import atlas_remote as ar
from atlas_remote import PackingError
from atlas_remote.training.census import TokenCounts, blocks_of
from atlas_remote.training.plan import Layout
from atlas_remote.training.tokens import TokenStream

pytestmark = pytest.mark.unit


class FlatSource:
    """A token source: documents as one flat array per shard, read a run at a time (`documents`), their counts
    known without a pass (`token_counts`). Counts how it was read."""

    def __init__(self, lengths: list[int], shard_size: int, block_size: int, dtype=np.uint32, url: str = "flat"):
        sizes = [min(shard_size, len(lengths) - k) for k in range(0, len(lengths), shard_size)] or [0]
        self._layout, self.url = Layout.of(sizes, [block_size] * len(sizes)), url
        self.lengths = np.asarray(lengths, dtype=np.int64)
        self.flat = np.arange(int(self.lengths.sum()), dtype=dtype)
        self.ends = np.cumsum(self.lengths)
        self.calls = {"documents": 0, "read": 0}

    def layout(self) -> Layout:
        return self._layout

    def __len__(self) -> int:
        return len(self.lengths)

    def read(self, indices) -> list:
        self.calls["read"] += 1
        return [{"tokens": self.flat[self.ends[i] - self.lengths[i] : self.ends[i]]} for i in np.asarray(indices)]

    def iter(self, start: int, stop: int):
        return iter(self.read(range(start, stop)))

    def documents(self, first: int, count: int) -> tuple[np.ndarray, np.ndarray]:
        self.calls["documents"] += 1
        shard = int(np.searchsorted(np.cumsum(self._layout.sizes), first, side="right"))
        assert first + count <= int(np.cumsum(self._layout.sizes)[shard]), "a run stays within one shard"
        begin = int(self.ends[first] - self.lengths[first]) if count else 0
        lengths = self.lengths[first : first + count]
        return self.flat[begin : begin + int(lengths.sum())], lengths

    def token_counts(self, key: str) -> TokenCounts:
        blocks = np.zeros(int(blocks_of(self._layout).sum()), dtype=np.int64)
        from atlas_remote.training.census import block_ids

        np.add.at(blocks, block_ids(self._layout, np.arange(len(self.lengths)))[1], self.lengths)
        return TokenCounts(key, self._layout.digest(), blocks.astype(np.uint32))


class PerExample(FlatSource):
    """The same documents without `documents`: read an example at a time, as an AtlasDataset is."""

    documents = None  # type: ignore[assignment]

    def __getattribute__(self, name: str):
        if name == "documents":
            raise AttributeError(name)
        return super().__getattribute__(name)


def rows(stream: TokenStream) -> list[list[int]]:
    return [row.tolist() for batch in stream for row in batch["tokens"]]


@settings(max_examples=25, deadline=None)
@given(
    st.lists(st.integers(1, 50), min_size=1, max_size=80),
    st.integers(1, 30),
    st.integers(1, 6),
    st.integers(1, 20),
    st.sampled_from([None, 0]),
)
def test_a_token_source_packs_the_rows_of_the_same_documents_read_one_by_one(
    lengths, shard_size, block_size, seq_len, eod
):
    flat, per_example = FlatSource(lengths, shard_size, block_size), PerExample(lengths, shard_size, block_size)
    try:
        a = TokenStream(flat, seq_len, batch_size=3, seed=2, eod=eod)
    except ar.UsageError:  # too few tokens for one row: refused the same way read one by one
        with pytest.raises(ar.UsageError):
            TokenStream(per_example, seq_len, batch_size=3, seed=2, eod=eod)
        return
    b = TokenStream(per_example, seq_len, batch_size=3, seed=2, eod=eod)
    assert rows(a) == rows(b)
    assert flat.calls["read"] == 0 and (flat.calls["documents"] > 0 or not rows(b))
    assert a.dropped == b.dropped


def test_a_mixture_takes_token_sources_and_datasets_together(tmp_path):
    lengths = [int(n) for n in np.random.default_rng(1).integers(5, 60, 200)]
    source = FlatSource(lengths, 50, 8)
    with ar.AtlasDatasetWriter(str(tmp_path / "ds"), 50, 8) as writer:
        for doc in source.read(range(len(lengths))):
            writer.add_example(doc)
    ds = ar.open(str(tmp_path / "ds"))
    source.calls["read"] = 0
    mixed = TokenStream(ar.Mixture([source, ds], weights=[0.5, 0.5]), 31, batch_size=4, with_source=True, eod=0)
    batches = list(mixed)
    sources = np.concatenate([b["source"] for b in batches])
    assert set(sources.tolist()) == {0, 1}
    assert source.calls["documents"] > 0 and source.calls["read"] == 0


@pytest.mark.parametrize(("dtype", "expected"), [(None, torch.int64), (torch.int32, torch.int32)])
def test_batches_come_in_the_dtype_asked_for_through_the_loader(dtype, expected):
    source = FlatSource([40] * 60, 20, 4, dtype=np.uint16)
    stream = TokenStream(source, 15, batch_size=4, dtype=dtype, eod=7)
    batches = list(stream.loader())
    assert {b["tokens"].dtype for b in batches} == {expected}
    assert rows(TokenStream(source, 15, batch_size=4, eod=7)) == [r.tolist() for b in batches for r in b["tokens"]]
    torch.nn.Embedding(2400, 4)(batches[0]["tokens"])  # what nn.Embedding takes


def test_int64_and_uint64_documents_are_served_exactly(tmp_path):
    """Issue 45, row 12: one document of int64 ids, one of uint64, in one stream: batches were float64 and
    2^53 + 1 came back as 2^53."""
    big = (1 << 53) + 1
    with ar.AtlasDatasetWriter(str(tmp_path / "ds"), 10, 2) as writer:
        writer.add_example({"tokens": np.array([big, 1, 2, 3], dtype=np.int64)})
        writer.add_example({"tokens": np.array([big + 2, 4, 5, 6], dtype=np.uint64)})
    ds = ar.open(str(tmp_path / "ds"))
    served = [t for b in TokenStream(ds, 3, batch_size=2, seed=0) for row in b["tokens"] for t in row.tolist()]
    assert sorted(served) == sorted([big, 1, 2, 3, big + 2, 4, 5, 6])
    assert {b["tokens"].dtype for b in TokenStream(ds, 3, batch_size=2)} == {np.dtype(np.int64)}


@pytest.mark.parametrize(
    ("docs", "dtype", "says"),
    [
        ([np.array([1, 2, 3], np.int64), np.array([2**63, 1, 2], np.uint64)], None, "9223372036854775808"),
        ([np.array([1, 2, 3], np.int64), np.array([1 << 40, 1, 2], np.int64)], torch.int32, "1099511627776"),
        ([np.array([-(1 << 40), 1, 2], np.int64)], np.int32, "-1099511627776"),
    ],
)
def test_ids_the_batch_dtype_cannot_hold_are_refused_in_one_line(tmp_path, docs, dtype, says):
    with ar.AtlasDatasetWriter(str(tmp_path / "ds"), 10, 2) as writer:
        for doc in docs:
            writer.add_example({"tokens": doc})
    ds = ar.open(str(tmp_path / "ds"))
    with pytest.raises(PackingError) as error:
        list(TokenStream(ds, 2, batch_size=2, dtype=dtype))
    message = str(error.value)
    assert says in message and "dtype=" in message and "\n" not in message
    assert error.value.shard == "0" and error.value.block == (len(docs) - 1) // 2


def test_a_dtype_that_is_not_an_integer_or_cannot_hold_eod_is_refused():
    source = FlatSource([10] * 10, 10, 2)
    with pytest.raises(ValueError, match="integer dtype"):
        TokenStream(source, 7, batch_size=2, dtype=torch.float32)
    with pytest.raises(ValueError, match="eod=70000"):
        TokenStream(source, 7, batch_size=2, dtype=np.int16, eod=70_000)
