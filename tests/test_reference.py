"""Compatibility with the format's original implementation, using the datasets it wrote."""

from __future__ import annotations

import filecmp
import os
import shutil
from pathlib import Path

import fsspec
import pytest

import atlas_remote as ar
from helpers import CASES, FIXTURES, expected, params, same, upload_tree


@pytest.fixture(params=["local", "memory", "s3"])
def place(request, tmp_path, memory_url):
    """Where a reference dataset is copied before a test reads it: returns (case -> (url, storage_options))."""
    kind = request.param

    def put(case: str):
        source = FIXTURES / case / "dataset"
        if kind == "local":
            target = tmp_path / case
            shutil.copytree(source, target)
            return str(target), None
        if kind == "memory":
            url = f"{memory_url}/{case}"
            upload_tree(fsspec.filesystem("memory"), source, url[len("memory://"):])
            return url, None
        options, bucket, fs = request.getfixturevalue("s3")
        upload_tree(fs, source, f"{bucket}/{case}")
        return f"s3://{bucket}/{case}", options

    return put


@pytest.mark.parametrize("case", CASES)
def test_reference_dataset_reads_back_exactly(place, case):
    url, options = place(case)
    want = expected(case)
    ds = ar.open(url, storage_options=options)
    assert len(ds) == len(want) == params(case)["expected_len"]
    assert all(same(ds[i], want[i]) for i in range(len(ds)))
    assert same(list(ds), want)
    assert same(ds[-1], want[-1])


def test_reference_fixtures_are_present():
    assert len(CASES) >= 15, f"expected the reference fixtures beside the project, found {CASES}"


@pytest.mark.parametrize("case", [c for c in CASES if params(c)["dropped_shard"] is None])
def test_writer_reproduces_reference_bytes(tmp_path, case):
    """Same examples and parameters: every file we write is byte-identical to the original writer's."""
    p = params(case)
    out = tmp_path / "ds"
    with ar.AtlasDatasetWriter(str(out), p["shard_size"], p["block_size"], p["compression_strategy"],
                               p["compression_level"], p["compression_dict_size"]) as writer:
        for example in expected(case):
            writer.add_example(example)
    reference = FIXTURES / case / "dataset"
    ours = sorted(str(f.relative_to(out)) for f in out.rglob("*") if f.is_file())
    theirs = sorted(str(f.relative_to(reference)) for f in reference.rglob("*") if f.is_file())
    assert ours == theirs
    mismatched = [name for name in ours if not filecmp.cmp(out / name, reference / name, shallow=False)]
    assert mismatched == []


def test_missing_shard_keeps_the_remaining_shards_in_order(tmp_path):
    shutil.copytree(FIXTURES / "s3-missing-shard" / "dataset", tmp_path / "ds")
    ds = ar.open(str(tmp_path / "ds"))
    assert [s.number for s in ds.shards] == [0, 1, 2, 3, 5, 6, 7, 8]
    assert len(ds.meta.shard_sizes) == 9 and len(ds) == 800
