"""Ray Data: read_atlas and write_atlas round trips, local and over S3, failed writes, `convert --engine ray`.

One local Ray session serves the whole run (conftest's ray_session).
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import replace

import numpy as np
import pytest
import ray
from conftest import LOCAL_QUICK
from helpers import tree
from ray.data.datasource import WriteResult
from source_files import sources
from spec_reader import SpecReader

import atlas_remote as ar
from atlas_remote.cli import main
from atlas_remote.format.codec import pickle_block
from atlas_remote.write import ray_data
from atlas_remote.write.ray_data import AtlasDatasink, AtlasDatasource, read_atlas, write_atlas
from atlas_remote.write.settings import WriteSettings

ROWS = [{"id": i, "text": f"row {i} " * (i % 7)} for i in range(5000)]


def local_copy(url: str, options: dict | None, folder) -> SpecReader:
    """The format's original reading rules (tests/spec_reader.py) need a local folder: copy the dataset there."""
    for rel, data in tree(url, options).items():
        (folder / rel).parent.mkdir(parents=True, exist_ok=True)
        (folder / rel).write_bytes(data)
    return SpecReader(folder)


@pytest.mark.parametrize(
    "place, kind",
    [("local", "dict"), ("local", "int"), ("s3", "dict"), pytest.param("s3", "int", marks=pytest.mark.slow)],
    indirect=["place"],
)
def test_read_atlas_gives_every_example_once(ray_session, place, kind):
    url, options = place
    with ar.AtlasDatasetWriter(url, 1000, 32, storage_options=options) as w:
        for i in range(5000):
            w.add_example({"id": i, "text": f"x{i}"} if kind == "dict" else i)
    rows = read_atlas(url, storage_options=options).take_all()
    assert sorted(r["id"] if kind == "dict" else r["item"] for r in rows) == list(range(5000))


def write_examples(url: str, examples: list, shard_size: int = 100) -> None:
    with ar.AtlasDatasetWriter(url, shard_size, 8) as w:
        for example in examples:
            w.add_example(example)


def test_rows_arrow_cannot_hold_are_read_through_rays_builder(ray_session, tmp_path):
    examples = [{"id": i, "tokens": np.arange(i % 5 + 1, dtype=np.int32)} for i in range(300)]  # ragged arrays
    write_examples(str(tmp_path / "arrays"), examples)
    rows = sorted(read_atlas(str(tmp_path / "arrays")).take_all(), key=lambda r: r["id"])
    assert [r["id"] for r in rows] == list(range(300))
    assert all(np.array_equal(row["tokens"], example["tokens"]) for row, example in zip(rows, examples))


def test_rows_lacking_columns_get_none(ray_session, tmp_path):
    examples = [{"id": 0, "only_here": "x"}, {"id": 1, "big": 2**70}, {"id": 2}]  # one block; an int past 64 bits
    write_examples(str(tmp_path / "mixed"), examples)
    rows = sorted(read_atlas(str(tmp_path / "mixed")).take_all(), key=lambda r: r["id"])
    assert rows == [
        {"id": 0, "only_here": "x", "big": None},
        {"id": 1, "only_here": None, "big": 2**70},
        {"id": 2, "only_here": None, "big": None},
    ]


def test_read_tasks_are_runs_of_whole_blocks_with_their_row_counts(ray_session, tmp_path, monkeypatch):
    with ar.AtlasDatasetWriter(str(tmp_path / "src"), 1000, 32) as w:
        for i in range(4500):  # shards of 1000, 1000, 1000, 1000, 500
            w.add_example(i)
    source = AtlasDatasource(str(tmp_path / "src"))
    whole_shards = [(0, 1000), (1000, 2000), (2000, 3000), (3000, 4000), (4000, 4500)]
    assert source.task_ranges(200) == whole_shards, "a task is never cut below 10,000 rows, but stays in one shard"
    monkeypatch.setattr(ray_data, "MIN_ROWS_PER_TASK", 1)  # so that small shards are cut too
    for parallelism in (1, 4, 20, 200):
        tasks = source.get_read_tasks(parallelism)
        ranges = source.task_ranges(parallelism)
        assert [t.metadata.num_rows for t in tasks] == [stop - start for start, stop in ranges]
        assert [i for start, stop in ranges for i in range(start, stop)] == list(range(4500)), "each row once"
        for start, stop in ranges:
            assert start // 1000 == (stop - 1) // 1000, "within one shard"
            assert start % 1000 % 32 == 0 and (stop % 1000 % 32 == 0 or stop in (4500, start // 1000 * 1000 + 1000)), (
                "whole blocks"
            )
        assert len(tasks) >= min(parallelism, 4500 // 32), "enough tasks for the parallelism asked"


def test_the_size_estimate_is_the_first_blocks_pickled_size_per_example(ray_session, tmp_path):
    write_examples(str(tmp_path / "src"), ROWS, shard_size=1000)
    source = AtlasDatasource(str(tmp_path / "src"))
    assert source.estimate_inmemory_data_size() == len(pickle_block(ROWS[:8])) * 5000 // 8
    write_examples(str(tmp_path / "empty"), [])
    assert AtlasDatasource(str(tmp_path / "empty")).estimate_inmemory_data_size() == 0


def test_reading_a_missing_dataset_fails_at_once_naming_it(ray_session, tmp_path):
    with pytest.raises(ar.DatasetNotFoundError, match="nothing-here"):
        read_atlas(str(tmp_path / "nothing-here"))


def test_write_atlas_round_trip(ray_session, place, tmp_path):
    url, options = place
    meta = write_atlas(
        ray.data.from_items(ROWS, override_num_blocks=8), url, shard_size=1000, block_size=32, storage_options=options
    )
    assert meta.compression_strategy == ar.CompressionStrategy.SHARED_DICTIONARY_COMPRESSION, "dictionary trained"
    assert sum(meta.shard_sizes) == 5000 and all(0 < size <= 1000 for size in meta.shard_sizes)
    ds = ar.open(url, storage_options=options)
    assert list(ds) == ROWS, "shards numbered in task order"
    assert ds.manifest is not None and len(ds.manifest) == len(ds.shards) == len(meta.shard_sizes), "a manifest"
    assert local_copy(url, options, tmp_path / "copy").all() == ROWS
    assert not any(rel.startswith(".atlas") for rel in tree(url, options)), "no staging or lease left"


def test_non_dict_rows_are_their_item(ray_session, tmp_path):
    write_atlas(
        ray.data.range(300),
        str(tmp_path / "ids"),
        shard_size=100,
        block_size=8,
        compression_strategy=ar.CompressionStrategy.NO_COMPRESSION,
    )
    assert sorted(ar.open(str(tmp_path / "ids")), key=lambda r: r["id"]) == [
        {"id": i} for i in range(300)
    ]  # range's column is "id"
    write_atlas(ray.data.from_items(list(range(300))), str(tmp_path / "items"), shard_size=100, block_size=8)
    assert sorted(ar.open(str(tmp_path / "items"))) == list(range(300))  # from_items' column is "item"


def settled(url: str, options: dict | None, expected: dict, seconds: float = 60) -> bool:
    """Whether what is at url becomes `expected` once the failed write's other tasks end: Ray raises at the first
    failed task while others may still run; each of those removes what it wrote when it finds its run gone."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            if tree(url, options) == expected:
                return True
        except FileNotFoundError:  # listed, then removed by a task cleaning up before it was read: not settled
            pass
        time.sleep(0.2)
    return tree(url, options) == expected


@pytest.mark.parametrize("place", LOCAL_QUICK, indirect=True)  # S3: write/test_writer_safety.py discards there
def test_a_failed_write_leaves_nothing_and_keeps_what_was_there(ray_session, place):
    url, options = place

    def explode(row):
        if row["id"] == 3333:
            raise ValueError("bad row")
        return row

    source = ray.data.from_items([{"id": i} for i in range(5000)], override_num_blocks=8).map(explode)
    with pytest.raises(Exception, match="bad row"):
        write_atlas(
            source,
            url,
            shard_size=1000,
            block_size=32,
            storage_options=options,
            compression_strategy=ar.CompressionStrategy.STANDARD_COMPRESSION,
        )
    assert settled(url, options, {}), "nothing at the URL, no staging"

    write_atlas(ray.data.from_items(ROWS[:100]), url, shard_size=50, block_size=8, storage_options=options)
    before = tree(url, options)
    with pytest.raises(Exception, match="bad row"):
        write_atlas(source, url, shard_size=1000, block_size=32, storage_options=options, overwrite=True)
    assert settled(url, options, before), "the committed dataset untouched"
    with pytest.raises(ar.DatasetExistsError):
        write_atlas(ray.data.from_items(ROWS[:10]), url, shard_size=50, block_size=8, storage_options=options)
    assert tree(url, options) == before


def test_a_write_task_whose_worker_dies_is_retried_into_the_same_dataset(ray_session, tmp_path):
    """A worker killed mid-part (5 of its shards already staged): Ray runs the task again, which rewrites the part."""
    marker = tmp_path / "killed-once"

    def die_once(row):
        if row["id"] == 550 and not marker.exists():
            marker.touch()
            os._exit(1)  # as a node's loss looks to the task: no exception, the process is gone
        return row

    source = ray.data.from_items(ROWS, override_num_blocks=8).map(die_once)
    meta = write_atlas(source, str(tmp_path / "out"), shard_size=100, block_size=8)
    assert marker.exists(), "the worker was killed"
    assert sum(meta.shard_sizes) == 5000
    assert sorted(ar.open(str(tmp_path / "out")), key=lambda r: r["id"]) == ROWS
    assert local_copy(str(tmp_path / "out"), None, tmp_path / "copy").all() == list(ar.open(str(tmp_path / "out")))
    assert sorted(p.name for p in (tmp_path / "out").iterdir() if p.name.startswith(".")) == []


@pytest.mark.parametrize("result", ["WriteResult", "list"])
def test_both_on_write_complete_signatures(tmp_path, result):
    """Ray >= 2.41 hands on_write_complete a WriteResult; older Ray handed it the list of what tasks returned."""
    sink = AtlasDatasink(str(tmp_path / "out"), WriteSettings(10, 2, ar.CompressionStrategy.STANDARD_COMPRESSION))
    sink.on_write_start()
    returns = []
    for part in (1, 0):  # finished out of order
        manifest = replace(sink.spec, part=part).write(range(part * 15, part * 15 + 15))
        returns.append({"part": part, "examples": 15, "bytes": manifest.stored_bytes})
    sink.on_write_complete(WriteResult(30, 0, returns) if result == "WriteResult" else returns)
    assert list(ar.open(str(tmp_path / "out"))) == list(range(30))
    assert sink.metadata.shard_sizes == [10, 5, 10, 5]


@pytest.mark.parametrize("place", LOCAL_QUICK, indirect=True)  # S3 to S3: also tests/training/test_ray_cluster.py
def test_convert_with_the_ray_engine_gives_the_same_dataset(ray_session, tmp_path, place):
    base, options = place
    for source_format, (src, _expected) in sources(tmp_path).items():
        for engine in ("processes", "ray"):
            ar.convert(
                src,
                f"{base}/{source_format}-{engine}",
                source_format,
                shard_size=30,
                block_size=4,
                engine=engine,
                dest_options=options,
            )
        assert tree(f"{base}/{source_format}-ray", options) == tree(f"{base}/{source_format}-processes", options)


def test_the_ray_engine_without_ray_says_which_extra_to_install(tmp_path, monkeypatch, capsys):
    (tmp_path / "a.jsonl").write_text('{"a": 1}\n')
    monkeypatch.setitem(sys.modules, "ray", None)  # as if Ray were not installed
    monkeypatch.delitem(sys.modules, "atlas_remote.write.ray_data")
    with pytest.raises(SystemExit) as exit_:
        main(["convert", str(tmp_path / "a.jsonl"), str(tmp_path / "out"), "--from", "jsonl", "--engine", "ray"])
    assert exit_.value.code == 1
    assert "pip install 'atlas_remote[ray]'" in capsys.readouterr().err
    assert not (tmp_path / "out").exists(), "refused before any work"
