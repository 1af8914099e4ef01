"""Parquet and Arrow in: files written by pyarrow and pandas, a folder laid out as the Hub and `save_to_disk` lay
them out, every row back exactly; damaged files and bad columns name the file; a map function on the way."""

from __future__ import annotations

import datetime
import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.feather
import pyarrow.parquet as pq
import pytest

import atlas_remote as ar

ROWS = [
    {
        "id": i,
        "text": "x" * (i % 7) + ("é" if i % 3 else ""),
        "big": "y" * 70_000 if i == 5 else "s",
        "blob": bytes([i % 256]) * (i % 5),
        "tokens": list(range(i % 4)),
        "nested": [[i, i + 1], []] if i % 2 else None,
        "when": datetime.datetime(2026, 1, 1, 0, 0, i % 60),
        "score": None if i % 5 == 0 else i / 3,
    }
    for i in range(250)
]
TABLE = pa.Table.from_pylist(ROWS)


def convert(src, dest, from_, **kw):
    return ar.convert(src, str(dest), from_, shard_size=40, block_size=8, **kw)


@pytest.mark.parametrize("workers", [1, 2])
def test_parquet_written_by_pyarrow_reads_back_exactly(tmp_path, workers):
    (tmp_path / "src").mkdir()
    pq.write_table(TABLE.slice(0, 100), tmp_path / "src" / "a.parquet", row_group_size=30)
    pq.write_table(TABLE.slice(100), tmp_path / "src" / "b.parquet", row_group_size=30)
    report = convert(str(tmp_path / "src" / "*.parquet"), tmp_path / "out", "parquet", workers=workers)
    assert report.inputs == 2 and report.examples == len(ROWS)
    assert ar.open(str(tmp_path / "out"))[:] == ROWS


def test_parquet_written_by_pandas_and_a_column_selection(tmp_path):
    frame = pd.DataFrame({"id": range(50), "text": [f"t{i}" for i in range(50)], "drop": [1.5] * 50})
    frame.to_parquet(tmp_path / "p.parquet")
    convert(str(tmp_path / "p.parquet"), tmp_path / "out", "parquet", source_options={"columns": ["id", "text"]})
    assert ar.open(str(tmp_path / "out"))[:] == [{"id": i, "text": f"t{i}"} for i in range(50)]


def test_a_hub_layout_and_one_split(tmp_path):
    data = tmp_path / "hub" / "data"
    data.mkdir(parents=True)
    pq.write_table(TABLE.slice(0, 60), data / "train-00000-of-00002.parquet")
    pq.write_table(TABLE.slice(60, 60), data / "train-00001-of-00002.parquet")
    pq.write_table(TABLE.slice(120, 10), data / "test-00000-of-00001.parquet")
    convert(str(tmp_path / "hub"), tmp_path / "train", "parquet", source_options={"split": "train"})
    assert ar.open(str(tmp_path / "train"))[:] == ROWS[:120]
    convert(str(tmp_path / "hub"), tmp_path / "all", "parquet")
    assert len(ar.open(str(tmp_path / "all"))) == 130


def test_arrow_files_and_a_save_to_disk_folder(tmp_path):
    pyarrow.feather.write_feather(TABLE, tmp_path / "t.feather")
    convert(str(tmp_path / "t.feather"), tmp_path / "out", "arrow")
    assert ar.open(str(tmp_path / "out"))[:] == ROWS
    # datasets.Dataset.save_to_disk: Arrow streams named in state.json, in order
    saved = tmp_path / "saved"
    saved.mkdir()
    for n, piece in enumerate((TABLE.slice(0, 200), TABLE.slice(200))):
        with pa.OSFile(str(saved / f"data-0000{n}-of-00002.arrow"), "wb") as sink:
            with pa.ipc.new_stream(sink, piece.schema) as writer:
                writer.write_table(piece, max_chunksize=64)
    state = {"_data_files": [{"filename": f"data-0000{n}-of-00002.arrow"} for n in range(2)]}
    (saved / "state.json").write_text(json.dumps(state))
    (saved / "dataset_info.json").write_text("{}")
    convert(str(saved), tmp_path / "from-disk", "arrow", source_options={"columns": ["id", "tokens"]})
    assert ar.open(str(tmp_path / "from-disk"))[:] == [{"id": r["id"], "tokens": r["tokens"]} for r in ROWS]


def test_a_truncated_file_and_a_bad_column_name_the_file(tmp_path):
    pq.write_table(TABLE, tmp_path / "good.parquet")
    raw = (tmp_path / "good.parquet").read_bytes()
    (tmp_path / "cut.parquet").write_bytes(raw[: len(raw) // 2])
    with pytest.raises(ar.FormatError, match=r"cut\.parquet"):
        convert(str(tmp_path / "cut.parquet"), tmp_path / "out1", "parquet")
    with pytest.raises(ar.FormatError, match=r"good\.parquet.*no column 'nope'"):
        convert(str(tmp_path / "good.parquet"), tmp_path / "out2", "parquet", source_options={"columns": ["nope"]})
    for out in ("out1", "out2"):
        with pytest.raises(ar.DatasetNotFoundError):
            ar.open(str(tmp_path / out))


def test_a_map_function_runs_in_the_workers_and_its_failure_commits_nothing(tmp_path):
    (tmp_path / "src").mkdir()
    for n in range(2):
        (tmp_path / "src" / f"{n}.jsonl").write_text("".join(json.dumps({"n": n, "i": i}) + "\n" for i in range(30)))
    src = str(tmp_path / "src" / "*.jsonl")
    convert(src, tmp_path / "out", "jsonl", workers=2, map="tables_maps:double_the_even")
    got = ar.open(str(tmp_path / "out"))[:]
    expected = [{"n": n, "i": i, "copy": c} for n in range(2) for i in range(0, 30, 2) for c in (0, 1)]
    assert got == expected
    command = [sys.executable, "-m", "atlas_remote.cli", "convert", src, str(tmp_path / "bad"), "--from", "jsonl"]
    done = subprocess.run(
        [*command, "--map", "tables_maps:fail_on_seven", "--quiet"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=Path(__file__).parent,  # where tables_maps.py is: --map imports from the working folder
    )
    assert done.returncode == 1 and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert "0.jsonl" in done.stderr and "example 7" in done.stderr and "nothing was committed" in done.stderr
    with pytest.raises(ar.DatasetNotFoundError):
        ar.open(str(tmp_path / "bad"))
    with pytest.raises(ValueError, match="top level of an importable module"):
        convert(src, tmp_path / "lambda", "jsonl", map=lambda example: example)


def test_write_takes_any_iterable_or_a_pyarrow_table(tmp_path):
    assert ar.write(iter(ROWS[:30]), str(tmp_path / "rows"), shard_size=7, block_size=2) == 30
    assert ar.open(str(tmp_path / "rows"))[:] == ROWS[:30]
    assert ar.write(TABLE, str(tmp_path / "table"), shard_size=100, block_size=8, map=lambda r: r["id"]) == len(ROWS)
    assert ar.open(str(tmp_path / "table"))[:] == [r["id"] for r in ROWS]


def test_a_folder_of_json_lines_is_a_source(tmp_path):
    """`IsADirectoryError` once: a Dolma root is a folder, so is this."""
    (tmp_path / "src" / "more").mkdir(parents=True)
    (tmp_path / "src" / "a.jsonl").write_text('{"i": 0}\n{"i": 1}\n')
    (tmp_path / "src" / "more" / "b.jsonl").write_text('{"i": 2}\n')
    (tmp_path / "src" / "notes.txt").write_text("not data")
    report = convert(str(tmp_path / "src"), tmp_path / "out", "jsonl")
    assert ar.open(str(tmp_path / "out"))[:] == [{"i": 0}, {"i": 1}, {"i": 2}]
    assert str(report).count("2 inputs") == 1
    one = convert(str(tmp_path / "src" / "a.jsonl"), tmp_path / "one", "jsonl")
    assert "(jsonl, 1 input)" in str(one)
