"""A pass's windows checked as a whole (blocks._fetch_window): the same digests, the same refusals, block by
block, as when each block was checked on its own."""

from __future__ import annotations

import pytest
from helpers import as_stranger
from hypothesis import given
from hypothesis import strategies as st

import atlas_remote as ar
from atlas_remote import CompressionStrategy as CS
from atlas_remote.read.blocks import _within_budget


@given(st.lists(st.integers(0, 100), min_size=1, max_size=50), st.integers(0, 1000))
def test_a_window_decompresses_ahead_within_its_budget_and_at_least_one_block(sizes, budget):
    ahead = _within_budget(sizes, budget)
    assert 1 <= ahead <= len(sizes)
    assert ahead == 1 or sum(sizes[:ahead]) <= budget
    assert ahead == len(sizes) or sum(sizes[: ahead + 1]) > budget


def write(path, strategy=CS.SHARED_DICTIONARY_COMPRESSION):
    with ar.AtlasDatasetWriter(str(path), 640, 32, strategy) as writer:
        writer.add_examples([{"id": i, "text": "word " * (i % 40)} for i in range(640)])


@pytest.mark.parametrize("whose", ["yours", "a stranger's"])
def test_a_damaged_block_in_the_middle_of_a_window_is_named(tmp_path, whose):
    if whose == "yours":
        write(tmp_path / "ds")
    else:
        with as_stranger():
            write(tmp_path / "ds")
    ds = ar.open(str(tmp_path / "ds"))
    start, end = ds.table.state(0).block_range(11)[1:]
    data = tmp_path / "ds" / "0" / "data.bin"
    raw = bytearray(data.read_bytes())
    raw[(start + end) // 2] ^= 0xFF
    data.write_bytes(bytes(raw))
    with pytest.raises(ar.CorruptBlockError) as caught:
        list(ar.open(str(tmp_path / "ds")))
    assert caught.value.block == 11
    assert ("SHA-256" in str(caught.value)) == (whose == "yours")


def test_a_window_of_unsized_or_uncompressed_blocks_reads_whole(tmp_path):
    write(tmp_path / "plain", CS.NO_COMPRESSION)
    assert [x["id"] for x in ar.open(str(tmp_path / "plain"))] == list(range(640))
    assert [x["id"] for x in ar.open(str(tmp_path / "plain")).iter(100, 300)] == list(range(100, 300))
