"""Compatibility with the format's original implementation, using the datasets it wrote.

That each of them reads back exactly, on every backend, is in storage/test_conformance.py.
"""

from __future__ import annotations

import filecmp
import shutil

import pytest
from helpers import CASES, FIXTURES, expected, params

import atlas_remote as ar


def test_reference_fixtures_are_present():
    assert len(CASES) >= 15, f"expected the reference fixtures beside the project, found {CASES}"


@pytest.mark.parametrize("case", [c for c in CASES if params(c)["dropped_shard"] is None])
def test_writer_reproduces_reference_bytes(tmp_path, case):
    """Same examples and parameters: every file we write is byte-identical to the original writer's."""
    p = params(case)
    out = tmp_path / "ds"
    with ar.AtlasDatasetWriter(
        str(out),
        p["shard_size"],
        p["block_size"],
        p["compression_strategy"],
        p["compression_level"],
        p["compression_dict_size"],
        checksums=False,
    ) as writer:
        for example in expected(case):
            writer.add_example(example)
    reference = FIXTURES / case / "dataset"
    ours = sorted(str(f.relative_to(out)) for f in out.rglob("*") if f.is_file())
    theirs = sorted(str(f.relative_to(reference)) for f in reference.rglob("*") if f.is_file())
    assert ours == theirs
    mismatched = [name for name in ours if not filecmp.cmp(out / name, reference / name, shallow=False)]
    assert mismatched == []


def test_checksums_add_one_sidecar_file_per_shard_and_one_manifest_and_nothing_else(tmp_path):
    p = params("s2-text-1025")
    out = tmp_path / "ds"
    with ar.AtlasDatasetWriter(str(out), p["shard_size"], p["block_size"], p["compression_strategy"]) as writer:
        for example in expected("s2-text-1025"):
            writer.add_example(example)
    reference = FIXTURES / "s2-text-1025" / "dataset"
    ours = {str(f.relative_to(out)) for f in out.rglob("*") if f.is_file()}
    theirs = {str(f.relative_to(reference)) for f in reference.rglob("*") if f.is_file()}
    sidecars = {f"{d.name}/atlas_blocks.npy" for d in reference.iterdir() if d.is_dir()}
    assert ours - theirs == sidecars | {"atlas_manifest.npz"}
    assert theirs <= ours and all(filecmp.cmp(out / n, reference / n, shallow=False) for n in theirs)


def test_missing_shard_keeps_the_remaining_shards_in_order(tmp_path):
    shutil.copytree(FIXTURES / "s3-missing-shard" / "dataset", tmp_path / "ds")
    ds = ar.open(str(tmp_path / "ds"))
    assert [s.number for s in ds.shards] == [0, 1, 2, 3, 5, 6, 7, 8]
    assert len(ds.metadata.shard_sizes) == 9 and len(ds) == 800


@pytest.mark.parametrize("strategy", [0, 1, 2, 3])
def test_an_empty_dataset_is_byte_identical_to_the_original_writers(tmp_path, strategy):
    """The original writer leaves one shard with no data.bin (it opens the file with the first block), an index
    holding one uint8 offset, and, for dictionary strategies, standard compression (no block to train on)."""
    import io
    import json

    import numpy as np

    out = tmp_path / "ds"
    with ar.AtlasDatasetWriter(str(out), 10, 2, strategy, checksums=False):
        pass
    fallback = 1 if strategy in (2, 3) else strategy
    index = io.BytesIO()
    np.save(index, np.array([0], dtype=np.uint8), allow_pickle=False)
    shard_meta = {
        "version": 1,
        "block_size": 2,
        "stored_examples": 0,
        "compression_strategy": fallback,
        "compression_level": 3,
        "compression_dict_size": 0.01,
    }
    root_meta = {"version": 1, "shard_sizes": [0], "compression_strategy": 3 if strategy == 3 else fallback}
    assert {str(f.relative_to(out)): f.read_bytes() for f in out.rglob("*") if f.is_file()} == {
        "meta.json": json.dumps(root_meta, indent=4).encode(),
        "0/meta.json": json.dumps(shard_meta, indent=4).encode(),
        "0/index.npy": index.getvalue(),
    }
    ds = ar.open(str(out))
    assert len(ds) == 0 and ds[:] == [] and ar.verify(str(out)).ok
