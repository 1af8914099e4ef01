"""Parquet and Arrow in: files written by pyarrow and pandas, a folder laid out as the Hub and `save_to_disk` lay
them out, every row back exactly; damaged files and bad columns name the file; a map function on the way."""

from __future__ import annotations

import datetime
import io
import json
import os
import pickle
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.feather
import pyarrow.parquet as pq
import pytest
from helpers import crash_env, tree, tries
from hypothesis import given, settings
from hypothesis import strategies as st
from tables_maps import fail_on_seven

import atlas_remote as ar
from atlas_remote.write import pipeline

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
    with pytest.raises(ar.FormatError, match="holds the splits test, train: choose one"):  # never a silent mix
        convert(str(tmp_path / "hub"), tmp_path / "all", "parquet")
    convert(str(tmp_path / "hub" / "data" / "*.parquet"), tmp_path / "all", "parquet")  # named: read as asked
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
        cwd=Path(__file__).parents[1],  # where tables_maps.py is: --map imports from the working folder
    )
    assert done.returncode == 1 and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert "0.jsonl" in done.stderr and "example 7" in done.stderr and "nothing was committed" in done.stderr
    with pytest.raises(ar.DatasetNotFoundError):
        ar.open(str(tmp_path / "bad"))
    with pytest.raises(ValueError, match="top level of an importable module"):  # workers import it by name
        convert(src, tmp_path / "lambda", "jsonl", map=lambda example: example, workers=2)
    convert(src, tmp_path / "here", "jsonl", map=lambda example: {**example, "here": 1})  # runs in this process
    assert ar.open(str(tmp_path / "here"))[0] == {"n": 0, "i": 0, "here": 1}


def test_write_takes_any_iterable_or_a_pyarrow_table(tmp_path):
    assert ar.write(iter(ROWS[:30]), str(tmp_path / "rows"), shard_size=7, block_size=2).examples == 30
    assert ar.open(str(tmp_path / "rows"))[:] == ROWS[:30]
    assert ar.write(
        TABLE, str(tmp_path / "table"), shard_size=100, block_size=8, map=lambda r: r["id"]
    ).examples == len(ROWS)
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


# -- streaming ------------------------------------------------------------------------------------


class CountingFile(io.RawIOBase):
    """A source file that counts the bytes read from it."""

    def __init__(self, raw):
        self.raw, self.read_bytes = raw, 0

    def readinto(self, buffer):
        data = self.raw.read(len(buffer))
        buffer[: len(data)] = data
        self.read_bytes += len(data)
        return len(data)

    def seek(self, *where):
        return self.raw.seek(*where)

    def tell(self):
        return self.raw.tell()

    def readable(self):
        return True

    def seekable(self):
        return True

    def close(self):
        self.raw.close()
        super().close()


def test_parquet_is_read_a_row_group_at_a_time(tmp_path, monkeypatch):
    """pyarrow's default pre-buffering read every row group before the first row (a 218 MB file held 220 MB)."""
    from atlas_remote.importers import parquet

    groups, rows = 40, 2000
    table = pa.table({"id": range(groups * rows), "blob": [os.urandom(100) for _ in range(groups * rows)]})
    pq.write_table(table, tmp_path / "big.parquet", row_group_size=rows, compression="none")
    group_bytes = (tmp_path / "big.parquet").stat().st_size / groups
    opened = []
    real = parquet.open_source
    monkeypatch.setattr(
        parquet, "open_source", lambda *a, **k: opened.append(CountingFile(real(*a, **k))) or opened[-1]
    )
    examples = parquet.samples(str(tmp_path / "big.parquet"))
    assert next(examples) == {"id": 0, "blob": table["blob"][0].as_py()}
    assert opened[0].read_bytes < 2 * group_bytes, f"{opened[0].read_bytes / group_bytes:.1f} row groups read"
    assert sum(1 for _ in examples) == groups * rows - 1
    assert opened[0].read_bytes < 1.05 * (tmp_path / "big.parquet").stat().st_size, "each byte read once"


# -- values a default reader accepts ---------------------------------------------------------------


def test_timestamps_durations_and_times_read_back_with_default_settings(tmp_path):
    """Time zones once came back as zoneinfo.ZoneInfo and nanoseconds as pandas.Timestamp: the conversion
    succeeded and a reader with default settings refused the dataset."""
    n = 1500
    table = pa.table(
        {
            "zoned": pa.array([i * 1_000_000 for i in range(n)], pa.timestamp("us", tz="America/New_York")),
            "ns": pa.array([i * 1_000 for i in range(n)], pa.timestamp("ns")),  # whole microseconds
            "ns_late": pa.array([i * 1_000 + (i == 1200) for i in range(n)], pa.timestamp("ns")),
            "waited": pa.array([i * 1_000 for i in range(n)], pa.duration("ns")),
            "at": pa.array([i for i in range(n)], pa.time64("ns")),  # pyarrow alone would cut these to 0
            "nested": pa.array([[i * 1_000] for i in range(n)], pa.list_(pa.timestamp("ns", tz="UTC"))),
        }
    )
    pq.write_table(table, tmp_path / "t.parquet")
    convert(str(tmp_path / "t.parquet"), tmp_path / "out", "parquet")
    got = ar.open(str(tmp_path / "out"))[:]  # default settings
    utc = datetime.timezone.utc
    epoch = datetime.datetime(1970, 1, 1)
    assert got[7]["zoned"] == datetime.datetime(1970, 1, 1, 0, 0, 7, tzinfo=utc)
    assert got[7]["zoned"].tzinfo is utc
    assert got[7]["ns"] == epoch + datetime.timedelta(microseconds=7)
    assert got[7]["nested"] == [datetime.datetime(1970, 1, 1, 0, 0, 0, 7, tzinfo=utc)]
    assert got[7]["waited"] == datetime.timedelta(microseconds=7)
    assert got[7]["at"] == 7, "nanoseconds that datetime.time cannot hold: ints"
    # a column turns to int nanoseconds from the record batch (1,024 rows) holding a fraction of a microsecond on
    assert got[1023]["ns_late"] == epoch + datetime.timedelta(microseconds=1023)
    assert [got[i]["ns_late"] for i in (1024, 1200, 1499)] == [1_024_000, 1_200_001, 1_499_000]


@settings(max_examples=tries(60), deadline=None)
@given(
    values=st.lists(st.integers(-(2**62), 2**62), min_size=1, max_size=40),
    zone=st.sampled_from([None, "UTC", "America/New_York", "+05:30"]),
    unit=st.sampled_from(["s", "ms", "us", "ns"]),
)
def test_every_timestamp_keeps_its_instant_and_loads_with_default_settings(values, zone, unit):
    import pickle

    from atlas_remote.importers.arrow_values import PlainRows

    column = pa.array(values, pa.timestamp(unit, tz=zone))
    try:
        expected = column.cast(pa.int64()).to_pylist()
        rows = PlainRows(pa)(pa.record_batch([column], names=["t"]))
    except (pa.ArrowInvalid, OverflowError, ValueError):
        return  # outside what datetime holds: pyarrow refuses to make it a datetime at all
    per_second = {"s": 1, "ms": 1_000, "us": 1_000_000, "ns": 1_000_000_000}[unit]
    for row, value in zip(rows, expected):
        got = row["t"]
        if isinstance(got, int):
            assert unit == "ns" and got == value
        else:
            aware = got if got.tzinfo else got.replace(tzinfo=datetime.timezone.utc)
            assert (zone is None) == (got.tzinfo is None) and got.tzinfo in (None, datetime.timezone.utc)
            delta = aware - datetime.datetime(1970, 1, 1, tzinfo=datetime.timezone.utc)
            assert (delta // datetime.timedelta(microseconds=1)) * per_second // 1_000_000 == value
    ar.PicklePolicy().loads(pickle.dumps(rows))


def test_a_value_readers_refuse_fails_the_conversion_early_naming_file_and_example(tmp_path):
    """Once, such a conversion committed a dataset that the default reader then refused."""
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "a.jsonl").write_text("".join(json.dumps({"i": i}) + "\n" for i in range(20)))
    with pytest.raises(ar.UnsafePickleError, match=r"a\.jsonl: example 3 holds a value that readers") as bad:
        convert(str(tmp_path / "src"), tmp_path / "out", "jsonl", map="tables_maps:a_record_at_three")
    assert "tables_maps.Record" in str(bad.value) and "nothing was committed" in str(bad.value)
    with pytest.raises(ar.DatasetNotFoundError):
        ar.open(str(tmp_path / "out"))
    convert(
        str(tmp_path / "src"),
        tmp_path / "out",
        "jsonl",
        map="tables_maps:a_record_at_three",
        allowed_classes=["tables_maps.Record"],
    )
    assert repr(ar.open(str(tmp_path / "out"), allowed_classes=["tables_maps.Record"])[3]) == "Record(3)"
    # a column pyarrow gives as a class of its own, which does not even pickle (an interval)
    table = pa.table({"gap": pa.array([(1, 2, 3)] * 4, pa.month_day_nano_interval())})
    pyarrow.feather.write_feather(table, tmp_path / "i.arrow")
    with pytest.raises(ar.UnpicklableExampleError, match=r"i\.arrow: example #0 .* cannot be pickled"):
        convert(str(tmp_path / "i.arrow"), tmp_path / "interval", "arrow")


# -- files written by pandas and datasets -----------------------------------------------------------


def plain(rows):
    """Rows as a default reader gives them back (time zones as UTC)."""
    return [
        {
            k: v.astimezone(datetime.timezone.utc) if isinstance(v, datetime.datetime) and v.tzinfo else v
            for k, v in r.items()
        }
        for r in rows
    ]


def test_a_pandas_frame_with_nulls_lists_and_zoned_datetimes(tmp_path):
    frame = pd.DataFrame(
        {
            "id": pd.array([1, None, 3], dtype="Int64"),
            "tags": [["a", "b"], [], None],
            "when": pd.to_datetime(["2026-01-01 10:00", "2026-07-01 10:00", None]).tz_localize("Europe/Paris"),
            "score": [0.5, float("nan"), None],
        }
    )
    frame.to_parquet(tmp_path / "f.parquet")
    convert(str(tmp_path / "f.parquet"), tmp_path / "out", "parquet")
    got = ar.open(str(tmp_path / "out"))[:]
    utc = datetime.timezone.utc
    assert [r["id"] for r in got] == [1, None, 3] and [r["tags"] for r in got] == [["a", "b"], [], None]
    assert [r["when"] for r in got] == [
        datetime.datetime(2026, 1, 1, 9, tzinfo=utc),
        datetime.datetime(2026, 7, 1, 8, tzinfo=utc),  # summer time: the instant is kept
        None,
    ]
    assert got[0]["score"] == 0.5 and got[1]["score"] is None or got[1]["score"] != got[1]["score"]


def test_large_strings_and_binaries(tmp_path):
    table = pa.table(
        {
            "text": pa.array(["é" * 70_000, "", None], pa.large_string()),
            "raw": pa.array([b"\x00" * 5, None, b"x"], pa.large_binary()),
        }
    )
    pq.write_table(table, tmp_path / "l.parquet")
    pyarrow.feather.write_feather(table, tmp_path / "l.feather")
    for name, kind in (("l.parquet", "parquet"), ("l.feather", "arrow")):
        convert(str(tmp_path / name), tmp_path / f"out-{kind}", kind)
        assert ar.open(str(tmp_path / f"out-{kind}"))[:] == table.to_pylist()


@pytest.fixture
def hf_rows():
    datasets = pytest.importorskip("datasets")
    rows = [
        {
            "id": i,
            "text": None if i % 9 == 0 else f"row {i}",
            "tokens": list(range(i % 4)),
            "when": datetime.datetime(2026, 1, 1, i % 24, tzinfo=datetime.timezone.utc),
        }
        for i in range(130)
    ]
    return datasets, rows


def test_files_written_by_datasets(tmp_path, hf_rows):
    datasets, rows = hf_rows
    dataset = datasets.Dataset.from_list(rows)
    dataset.to_parquet(str(tmp_path / "rows.parquet"), batch_size=50)
    dataset.save_to_disk(str(tmp_path / "saved"), max_shard_size="4KB")
    assert len(list((tmp_path / "saved").glob("*.arrow"))) > 1
    split = datasets.DatasetDict({"train": dataset.select(range(100)), "test": dataset.select(range(100, 130))})
    split.save_to_disk(str(tmp_path / "dict"))
    convert(str(tmp_path / "rows.parquet"), tmp_path / "from-parquet", "parquet")
    convert(str(tmp_path / "saved"), tmp_path / "from-disk", "arrow", workers=2)
    convert(str(tmp_path / "dict"), tmp_path / "test", "arrow", source_options={"split": "test"})
    for out, expected in (("from-parquet", rows), ("from-disk", rows), ("test", rows[100:])):
        assert ar.open(str(tmp_path / out))[:] == plain(expected), out
    with pytest.raises(ar.FormatError, match="holds the splits train, test: choose one"):
        convert(str(tmp_path / "dict"), tmp_path / "both", "arrow")
    with pytest.raises(ar.FormatError, match="no split 'dev'"):
        convert(str(tmp_path / "dict"), tmp_path / "dev", "arrow", source_options={"split": "dev"})


@pytest.mark.parametrize("kind", ["parquet", "arrow"])
def test_parquet_and_arrow_give_the_same_dataset_with_one_worker_or_two(tmp_path, kind):
    (tmp_path / "src").mkdir()
    for n in range(3):
        piece = TABLE.slice(n * 80, 80)
        if kind == "parquet":
            pq.write_table(piece, tmp_path / "src" / f"{n}.parquet", row_group_size=25)
        else:
            pyarrow.feather.write_feather(piece, tmp_path / "src" / f"{n}.arrow", chunksize=25)
    trees = []
    for workers in (1, 2):
        convert(str(tmp_path / "src"), tmp_path / f"out{workers}", kind, workers=workers)
        trees.append(tree(str(tmp_path / f"out{workers}")))
    assert trees[0] == trees[1]
    assert ar.open(str(tmp_path / "out2"))[:] == ROWS[:240]


KILLED = textwrap.dedent("""
    import sys
    import atlas_remote as ar
    ar.convert(sys.argv[1], sys.argv[2], "parquet", shard_size=40, block_size=8)
""")


def test_a_killed_parquet_conversion_resumes_to_the_same_bytes(tmp_path):
    (tmp_path / "src").mkdir()
    for n in range(4):
        pq.write_table(TABLE.slice(n * 60, 60), tmp_path / "src" / f"{n}.parquet", row_group_size=16)
    src = str(tmp_path / "src")
    convert(src, tmp_path / "whole", "parquet")
    run = subprocess.run(
        [sys.executable, "-c", KILLED, src, str(tmp_path / "resumed")],
        env=crash_env(kill_at="part-1-staged"),
        capture_output=True,
        timeout=120,
    )
    assert run.returncode == -signal.SIGKILL, run.stderr
    with pytest.raises(ar.DatasetNotFoundError):
        ar.open(str(tmp_path / "resumed"))
    report = convert(src, tmp_path / "resumed", "parquet", resume=True)
    assert report.inputs_resumed == 2
    assert tree(str(tmp_path / "resumed")) == tree(str(tmp_path / "whole"))


# -- the Hub's layouts and hf:// --------------------------------------------------------------------


def hub_copy(root):
    """The Hub's Parquet conversion (`@~parquet`): <config>/<split>/NNNN.parquet."""
    for config, split, piece in (
        ("default", "train", TABLE.slice(0, 100)),
        ("default", "test", TABLE.slice(100, 20)),
        ("other", "train", TABLE.slice(120, 10)),
    ):
        (root / config / split).mkdir(parents=True)
        pq.write_table(piece, root / config / split / "0000.parquet")


def test_the_hubs_config_and_split_folders(tmp_path):
    hub_copy(tmp_path / "hub")
    convert(str(tmp_path / "hub" / "default"), tmp_path / "train", "parquet", source_options={"split": "train"})
    assert ar.open(str(tmp_path / "train"))[:] == ROWS[:100]
    with pytest.raises(ar.FormatError, match="holds the splits test, train"):
        convert(str(tmp_path / "hub" / "default"), tmp_path / "mixed", "parquet")
    with pytest.raises(ar.FormatError, match="holds the configs default, other: give one config's folder"):
        convert(str(tmp_path / "hub"), tmp_path / "configs", "parquet", source_options={"split": "train"})


def test_hf_urls_are_read_through_their_filesystem(tmp_path, monkeypatch):
    """hf://datasets/ORG/NAME with a stand-in for huggingface_hub's filesystem: the same paths, served from a
    local copy (no network here)."""
    import fsspec
    from fsspec.implementations.dirfs import DirFileSystem

    hub_copy(tmp_path / "hub" / "datasets" / "org" / "name")

    class LocalHub(DirFileSystem):
        protocol = "hf"

        def __init__(self, **options):
            super().__init__(path=str(tmp_path / "hub"), fs=fsspec.filesystem("file"))

    monkeypatch.setitem(sys.modules["fsspec.registry"]._registry, "hf", LocalHub)
    url = "hf://datasets/org/name/default"
    convert(url, tmp_path / "out", "parquet", source_options={"split": "test"})
    assert ar.open(str(tmp_path / "out"))[:] == ROWS[100:120]
    from atlas_remote.importers import parquet

    assert parquet.inputs(url, split="train") == ["hf://datasets/org/name/default/train/0000.parquet"]


# -- build() and write() ---------------------------------------------------------------------------


def test_build_runs_a_function_over_inputs_in_workers(tmp_path):
    from tables_maps import rows_of

    expected = [row for n in range(5) for row in rows_of(n)]
    trees = []
    for workers in (1, 2):
        report = ar.build(
            "tables_maps:rows_of", range(5), str(tmp_path / f"w{workers}"), workers=workers, shard_size=8, block_size=2
        )
        assert (report.inputs, report.examples) == (5, len(expected))
        assert ar.open(str(tmp_path / f"w{workers}"))[:] == expected
        trees.append(tree(str(tmp_path / f"w{workers}")))
    assert trees[0] == trees[1], "one part per input, in input order, whatever the workers"
    counted = []
    ar.build(lambda n: [{"n": n}] * n, [3, 1], str(tmp_path / "lambda"), progress=lambda e, b: counted.append(e))
    assert ar.open(str(tmp_path / "lambda"))[:] == [{"n": 3}] * 3 + [{"n": 1}] and sum(counted) == 4


def test_a_failing_build_names_the_input_and_the_example_and_commits_nothing(tmp_path):
    for workers in (1, 2):
        with pytest.raises(
            ar.FormatError, match=r"input 2: the function .*rows_failing_at failed on example 4 "
        ) as bad:
            ar.build("tables_maps:rows_failing_at", range(4), str(tmp_path / "out"), workers=workers, shard_size=8)
        assert "the source went away" in str(bad.value) and "nothing was committed" in str(bad.value)
        with pytest.raises(ar.DatasetNotFoundError):
            ar.open(str(tmp_path / "out"))
    with pytest.raises(ar.FormatError, match="input 0: .* returned a dict, not examples"):
        ar.build("tables_maps:a_dict_not_examples", range(2), str(tmp_path / "dict"))


KILLED_BUILD = textwrap.dedent("""
    import sys
    import atlas_remote as ar
    ar.build("tables_maps:rows_of", range(5), sys.argv[1], shard_size=8, block_size=2)
""")


def test_a_killed_build_resumes_to_the_same_bytes(tmp_path):
    ar.build("tables_maps:rows_of", range(5), str(tmp_path / "whole"), shard_size=8, block_size=2)
    run = subprocess.run(
        [sys.executable, "-c", KILLED_BUILD, str(tmp_path / "resumed")],
        env=crash_env(kill_at="part-2-staged"),
        capture_output=True,
        timeout=120,
        cwd=Path(__file__).parents[1],
    )
    assert run.returncode == -signal.SIGKILL, run.stderr
    report = ar.build(
        "tables_maps:rows_of", range(5), str(tmp_path / "resumed"), shard_size=8, block_size=2, resume=True
    )
    assert report.inputs_resumed == 3
    assert tree(str(tmp_path / "resumed")) == tree(str(tmp_path / "whole"))


def written_by_the_writer(url, rows, **kw):
    with ar.AtlasDatasetWriter(url, **kw) as writer:
        writer.add_examples(rows)


def test_write_a_dataset_an_iterable_dataset_and_a_table_in_parts(tmp_path, hf_rows, monkeypatch):
    monkeypatch.setattr(pipeline, "WORKER_BYTES", 1)  # workers, however small the rows
    datasets, rows = hf_rows
    dataset = datasets.Dataset.from_list(rows)
    written_by_the_writer(str(tmp_path / "writer"), plain(rows), shard_size=40, block_size=4)
    sources = {
        "dataset": dataset,
        "table": dataset.data.table,
        "iterable": dataset.to_iterable_dataset(num_shards=3),
        "list": plain(rows),
    }
    for name, source in sources.items():
        assert ar.write(source, str(tmp_path / name), shard_size=40, block_size=4, workers=2).examples == len(rows)
        assert ar.open(str(tmp_path / name))[:] == plain(rows), name
        if name != "iterable":  # equal rows, but not the same objects shared between rows: other pickles
            assert tree(str(tmp_path / name)) == tree(str(tmp_path / "writer")), f"{name}: the one writer's bytes"


def test_each_worker_is_sent_its_rows_not_the_whole_table(tmp_path, monkeypatch):
    """A pickled slice carries its parent table: 64 parts of a large table sent it 64 times to the workers."""
    monkeypatch.setattr(pipeline, "WORKER_BYTES", 1)  # workers, however small the table
    table = pa.table({"n": list(range(200_000))})
    sent = []

    def spy(parts, units, task, **kw):
        sent.extend(len(pickle.dumps(unit)) for unit in units)
        return real(parts, units, task, **kw)

    real = pipeline.write_parts
    monkeypatch.setattr(pipeline, "write_parts", spy)
    assert ar.write(table, str(tmp_path / "ds"), shard_size=10_000, workers=2).examples == 200_000
    assert len(sent) == 20 and max(sent) < table.nbytes / 10, sent
    assert ar.open(str(tmp_path / "ds"))[123_456] == {"n": 123_456}


def test_write_names_the_example_a_map_fails_on_and_takes_the_writers_settings(tmp_path, monkeypatch):
    monkeypatch.setattr(pipeline, "WORKER_BYTES", 1)  # the map fails in a worker
    url = str(tmp_path / "out")
    with pytest.raises(ar.FormatError, match="failed on example 7 of this input") as bad:
        ar.write(({"i": i} for i in range(20)), url, map=fail_on_seven)
    assert url not in str(bad.value) and "the examples given" in str(bad.value)
    with pytest.raises(ar.FormatError, match=r"rows 0-9 of the pyarrow Table: the map .* example 7 "):
        ar.write(pa.table({"i": range(40)}), url, shard_size=10, map=fail_on_seven, workers=2)
    with pytest.raises(ar.DatasetNotFoundError):
        ar.open(url)
    ar.write(TABLE, url, shard_size=100, compression_level=19, checksums=False)
    assert not list((tmp_path / "out").rglob("block_checksums.npy"))
    assert json.loads((tmp_path / "out" / "0" / "meta.json").read_text())["compression_level"] == 19
    with pytest.raises(ValueError, match="resume=True needs rows that can be read again"):
        ar.write(iter(ROWS), str(tmp_path / "again"), resume=True)


KILLED_WRITE = textwrap.dedent("""
    import sys
    import pyarrow as pa
    import atlas_remote as ar
    ar.write(pa.table({"i": range(500), "s": [str(i) * 3 for i in range(500)]}), sys.argv[1], shard_size=20, block_size=4)
""")


def test_a_killed_write_of_a_table_resumes_to_the_same_bytes(tmp_path):
    table = pa.table({"i": range(500), "s": [str(i) * 3 for i in range(500)]})
    ar.write(table, str(tmp_path / "whole"), shard_size=20, block_size=4)
    run = subprocess.run(
        [sys.executable, "-c", KILLED_WRITE, str(tmp_path / "resumed")],
        env=crash_env(kill_at="part-3-staged"),
        capture_output=True,
        timeout=120,
    )
    assert run.returncode == -signal.SIGKILL, run.stderr
    ar.write(table, str(tmp_path / "resumed"), shard_size=20, block_size=4, resume=True, workers=2)
    assert tree(str(tmp_path / "resumed")) == tree(str(tmp_path / "whole"))


# -- progress ---------------------------------------------------------------------------------------


def test_progress_says_what_runs_before_the_first_example(tmp_path, monkeypatch):
    """The bar once sat at '0.00 ex' for seconds while the shared dictionary was trained."""
    from atlas_remote.runtime.progress import Progress

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    screen = Terminal()
    monkeypatch.setattr(sys, "stderr", screen)
    pq.write_table(TABLE, tmp_path / "t.parquet")
    with Progress(0, "convert") as bar:
        convert(str(tmp_path / "t.parquet"), tmp_path / "out", "parquet", progress=bar)
    shown = screen.getvalue()
    assert "convert (reading the first shard to train the shared dictionary)" in shown
    assert "250" in shown.split("dictionary)")[-1], "then the examples, counted from 0 again"
