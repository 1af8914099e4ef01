"""Taking data back out: Parquet (DuckDB- and pyarrow-written) -> Atlas -> Parquet equal, on any URL; Arrow,
pandas and Hugging Face datasets equal to the examples; progress bars with totals where the input says them."""

from __future__ import annotations

import datetime
import decimal
import io
import json
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import atlas_remote as ar
from atlas_remote.cli import main
from atlas_remote.read import export
from atlas_remote.write.convert import convert

UTC = datetime.timezone.utc
TYPES = pa.schema(
    [
        ("i32", pa.int32()),
        ("i64", pa.int64()),
        ("f32", pa.float32()),
        ("f64", pa.float64()),
        ("text", pa.large_string()),
        ("blob", pa.binary()),
        ("flag", pa.bool_()),
        ("tokens", pa.list_(pa.int16())),
        ("point", pa.struct([("x", pa.float64()), ("label", pa.string())])),
        ("when", pa.timestamp("ns", tz="Europe/Paris")),
        ("local", pa.timestamp("us")),
        ("day", pa.date32()),
        ("price", pa.decimal128(12, 3)),
        ("tags", pa.map_(pa.string(), pa.int32())),
        ("maybe", pa.int64()),
    ]
)


def typed_table(n: int) -> pa.Table:
    """Every kind of column, nulls included; nanoseconds that are not whole microseconds too."""
    base = datetime.datetime(2024, 5, 1, tzinfo=UTC)
    return pa.table(
        {
            "i32": pa.array(range(n), pa.int32()),
            "i64": pa.array([i * 10**12 for i in range(n)], pa.int64()),
            "f32": pa.array([i / 3 for i in range(n)], pa.float32()),
            "f64": pa.array([i / 7 for i in range(n)], pa.float64()),
            "text": pa.array([f"row {i} ✓" for i in range(n)], pa.large_string()),
            "blob": pa.array([bytes([i % 256]) * (i % 5) for i in range(n)], pa.binary()),
            "flag": pa.array([i % 2 == 0 for i in range(n)]),
            "tokens": pa.array([list(range(i % 6)) for i in range(n)], pa.list_(pa.int16())),
            "point": pa.array([{"x": i * 0.5, "label": f"p{i}"} for i in range(n)], TYPES.field("point").type),
            "when": pa.array(
                [int(base.timestamp() * 1e9) + i for i in range(n)], pa.timestamp("ns", tz="Europe/Paris")
            ),
            "local": pa.array([datetime.datetime(2020, 1, 1) + datetime.timedelta(seconds=i) for i in range(n)]),
            "day": pa.array([datetime.date(2020, 1, 1) + datetime.timedelta(days=i) for i in range(n)]),
            "price": pa.array([decimal.Decimal(i) / 8 for i in range(n)], pa.decimal128(12, 3)),
            "tags": pa.array([[("a", i), ("b", -i)] for i in range(n)], TYPES.field("tags").type),
            "maybe": pa.array([None if i % 3 == 0 else i for i in range(n)], pa.int64()),
        },
        schema=TYPES,
    )


def plain_table(n: int) -> pa.Table:
    return pa.table({"n": pa.array(range(n), pa.int64()), "text": [f"row {i}" for i in range(n)]})


def run(capsys, *argv: str) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exit_:
        main(list(argv))
    out, err = capsys.readouterr()
    return exit_.value.code, out, err


def test_pyarrow_parquet_round_trips_exactly_with_its_schema(capsys, tmp_path):
    source = typed_table(300)
    pq.write_table(source, tmp_path / "in.parquet", row_group_size=70)
    convert(str(tmp_path / "in.parquet"), str(tmp_path / "atlas"), "parquet", shard_size=100, block_size=8)
    code, out, err = run(
        capsys,
        "convert",
        str(tmp_path / "atlas"),
        str(tmp_path / "out.parquet"),
        "--to",
        "parquet",
        "--schema-from",
        str(tmp_path / "in.parquet"),
    )
    assert (
        code == 0
        and err == ""
        and out.startswith(f"wrote {tmp_path / 'atlas'} -> {tmp_path / 'out.parquet'}: 300 rows")
    )
    back = pq.read_table(tmp_path / "out.parquet")
    assert back.schema == source.schema and back.equals(source)


def test_duckdb_parquet_round_trips_on_s3_either_side(capsys, s3, tmp_path):
    import duckdb

    options, bucket, fs = s3
    written = tmp_path / "duck.parquet"
    duckdb.sql(
        "COPY (SELECT i::INTEGER AS i, 'row ' || i AS s, i * 0.5 AS d, [i, i + 1] AS l, {'a': i, 'b': 'x'} AS st, "
        "TIMESTAMP '2020-01-01' + INTERVAL (i) SECOND AS t, CASE WHEN i % 3 = 0 THEN NULL ELSE i END AS n, "
        "DATE '2020-01-01' + i::INTEGER AS day, (i / 7)::DECIMAL(10, 2) AS dec FROM range(1000) tbl(i)) "
        f"TO '{written}'"
    )
    fs.put(str(written), f"{bucket}/in/duck.parquet")
    opts = json.dumps(options)
    code, _, _ = run(
        capsys,
        "convert",
        f"s3://{bucket}/in/duck.parquet",
        f"s3://{bucket}/atlas",
        "--from",
        "parquet",
        "--storage-options",
        opts,
    )
    assert code == 0
    code, out, err = run(
        capsys,
        "convert",
        f"s3://{bucket}/atlas",
        f"s3://{bucket}/out/duck.parquet",
        "--to",
        "parquet",
        "--schema-from",
        f"s3://{bucket}/in/duck.parquet",
        "--storage-options",
        opts,
    )
    assert code == 0 and err == "", err
    back = pq.read_table(io.BytesIO(fs.cat_file(f"{bucket}/out/duck.parquet")))
    assert back.equals(pq.read_table(written))


def test_without_a_schema_plain_types_round_trip(tmp_path):
    source = pa.table(
        {
            "n": pa.array(range(50), pa.int64()),
            "x": pa.array([i / 4 for i in range(50)]),
            "s": [f"s{i}" for i in range(50)],
            "b": [bytes([i]) for i in range(50)],
            "l": [[i, i] for i in range(50)],
            "st": [{"k": i} for i in range(50)],
            "t": pa.array([datetime.datetime(2021, 1, 1, 0, 0, i) for i in range(50)], pa.timestamp("us")),
        }
    )
    ar.write(source, str(tmp_path / "atlas"), shard_size=20, block_size=4)
    ds = ar.open(str(tmp_path / "atlas"))
    assert ds.to_arrow().equals(source) and ds.to_arrow(10, 20).equals(source.slice(10, 10))
    report = ds.to_parquet(str(tmp_path / "out.parquet"))
    assert report.rows == 50 and report.row_groups == 1 and pq.read_table(tmp_path / "out.parquet").equals(source)


def test_row_groups_are_sized_by_bytes(tmp_path, monkeypatch):
    examples = [{"i": i, "text": "x" * 1000} for i in range(3000)]
    ar.write(examples, str(tmp_path / "atlas"), shard_size=1000, block_size=50)
    monkeypatch.setattr(export, "CHUNK", 100)
    monkeypatch.setattr(export, "ROW_GROUP_BYTES", 250_000)  # about 250 rows of 1 KB
    ar.open(str(tmp_path / "atlas")).to_parquet(str(tmp_path / "out.parquet"))
    meta = pq.ParquetFile(tmp_path / "out.parquet").metadata
    sizes = [meta.row_group(g).num_rows for g in range(meta.num_row_groups)]
    assert sizes == [300] * 10, "whole chunks, until a group holds about ROW_GROUP_BYTES"
    assert meta.row_group(0).column(0).compression == "ZSTD"
    assert pq.read_table(tmp_path / "out.parquet").to_pylist() == examples


EXAMPLES = [
    {"id": i, "text": f"t{i}", "score": None if i % 4 == 0 else i * 1.5, "tokens": np.arange(i % 5, dtype=np.int32)}
    for i in range(40)
]


def test_to_pandas_is_the_examples(tmp_path):
    ds = ar.open(_written(tmp_path / "ds", EXAMPLES))
    frame = ds.to_pandas()
    assert list(frame.columns) == ["id", "text", "score", "tokens"] and len(frame) == 40
    assert str(frame["id"].dtype) == "int64"
    records = frame.to_dict("records")
    for got, want in zip(records, EXAMPLES):
        assert got.keys() == want.keys() and got["id"] == want["id"] and got["text"] == want["text"]
        assert got["score"] is None if want["score"] is None else got["score"] == want["score"]
        assert got["tokens"].dtype == np.int32 and np.array_equal(got["tokens"], want["tokens"])
    plain = ar.open(_written(tmp_path / "plain", ["a", ("b", 1), None]))
    assert plain.to_pandas()["item"].tolist() == ["a", ("b", 1), None], "other examples: one column"
    assert ds.to_pandas(5, 7)["id"].tolist() == [5, 6] and ds.to_pandas(5, 7).index.tolist() == [0, 1]


def test_to_hf_and_from_generator_give_the_examples(tmp_path):
    import datasets

    ds = ar.open(_written(tmp_path / "ds", EXAMPLES))
    hf = ds.to_hf(cache_dir=str(tmp_path / "hf"))
    assert hf.column_names == ["id", "text", "score", "tokens"] and len(hf) == 40
    assert hf[7]["text"] == "t7" and hf[4]["score"] is None and hf[3]["tokens"] == [0, 1, 2]
    streamed = list(datasets.IterableDataset.from_generator(ds.rows))
    assert [row["id"] for row in streamed] == list(range(40))


def test_what_does_not_fit_is_refused_in_one_line(capsys, tmp_path):
    mixed = ar.open(_written(tmp_path / "mixed", [{"a": 1}, {"a": 2}, "not a dict"]))
    with pytest.raises(ar.ExportError, match=r"example 2 is not a dict \(str\) but example 0 is: rows are one kind"):
        mixed.to_arrow()
    images = ar.open(_written(tmp_path / "images", [{"image": np.zeros((2, 2), np.uint8)}]))
    with pytest.raises(ar.ExportError, match=r"examples 0-0 do not fit .*to_pandas\(\) keeps any value"):
        images.to_arrow()
    assert images.to_pandas()["image"][0].shape == (2, 2), "pandas keeps what Arrow cannot hold"
    with pytest.raises(ar.ExportError, match=r"have columns the schema has not: \['a'\]"):
        mixed.to_arrow(0, 2, schema=pa.schema([("b", pa.int64())]))
    mixed.to_parquet(str(tmp_path / "out.parquet"), stop=2)
    code, _, err = run(capsys, "convert", str(tmp_path / "mixed"), str(tmp_path / "out.parquet"), "--to", "parquet")
    assert code == 1 and err.count("\n") == 1 and "already there: pass overwrite=True (--overwrite)" in err
    code, _, err = run(capsys, "convert", str(tmp_path / "mixed"), str(tmp_path / "o2.parquet"), "--to", "parquet")
    assert code == 1 and err.startswith("atlas-remote: error: ") and "example 2 is not a dict" in err
    with pytest.raises(ar.ExportError, match=r"example 1 is a dict \(dict\) but example 0 is not"):
        ar.open(_written(tmp_path / "other", ["text", {"a": 1}])).to_pandas()
    code, _, err = run(capsys, "convert", str(tmp_path / "mixed"), str(tmp_path / "o3.parquet"))
    assert code == 1 and "--from FORMAT (into Atlas) or --to parquet" in err


def _written(path, examples) -> str:
    with ar.AtlasDatasetWriter(str(path), 16, 4) as writer:
        for example in examples:
            writer.add_example(example)
    return str(path)


# -- progress ---------------------------------------------------------------------------------------


class Terminal(io.StringIO):
    def isatty(self):
        return True


def test_python_calls_show_totals_on_a_terminal_and_nothing_when_asked(tmp_path, monkeypatch):
    pq.write_table(plain_table(250), tmp_path / "t.parquet", row_group_size=50)
    screen = Terminal()
    monkeypatch.setattr(sys, "stderr", screen)
    convert(str(tmp_path / "t.parquet"), str(tmp_path / "a"), "parquet", shard_size=100, block_size=8)
    shown = screen.getvalue()
    assert "250/250" in shown and "<00:00" in shown, "the Parquet row count is the total: a bar with an ETA"
    for call, name in (
        (lambda p: ar.verify(str(tmp_path / "a"), progress=p), "verify"),
        (lambda p: ar.add_checksums(str(tmp_path / "a"), progress=p), "checksum"),
        (lambda p: ar.copy_dataset(str(tmp_path / "a"), str(tmp_path / f"copy-{p}"), progress=p), "cp"),
        (lambda p: ar.open(str(tmp_path / "a")).to_parquet(str(tmp_path / f"{p}.parquet"), progress=p), "parquet"),
        (lambda p: ar.write(list(range(300)), str(tmp_path / f"w-{p}"), progress=p), "write"),
    ):
        screen.seek(0), screen.truncate()
        call(None)
        assert f"{name}: 100%" in screen.getvalue() and (
            "250/250" in screen.getvalue() or "300/300" in screen.getvalue()
        )
        screen.seek(0), screen.truncate()
        call(False)
        assert screen.getvalue() == "", f"{name}: progress=False is quiet"
    screen.seek(0), screen.truncate()
    ar.build(_inputs, [1, 2, 3], str(tmp_path / "built"), progress=True)
    assert "build: 100%" in screen.getvalue() and "3/3" in screen.getvalue(), "build counts its inputs"


def test_no_byte_rate_before_bytes_are_counted(monkeypatch):
    """The Parquet conversion's bar read "0.0 MB/s" until its first part was done (bytes come at a part's end)."""
    from atlas_remote.runtime.progress import Progress

    screen = Terminal()
    monkeypatch.setattr(sys, "stderr", screen)
    with Progress(100, "convert") as bar:
        bar.update(50, 0)
        bar._bar.refresh()
        assert "50.0/100" in screen.getvalue() and "MB/s" not in screen.getvalue()
        bar.update(50, 3_000_000)
        bar._bar.refresh()
        assert "MB/s" in screen.getvalue().rsplit("\r", 1)[-1]


def _inputs(n: int) -> list:
    return [{"n": n}] * n


def test_no_bar_off_a_terminal(tmp_path):
    pq.write_table(plain_table(20), tmp_path / "t.parquet")
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "atlas_remote.cli",
            "convert",
            str(tmp_path / "t.parquet"),
            str(tmp_path / "a"),
            "--from",
            "parquet",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0 and done.stderr == ""
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "atlas_remote.cli",
            "convert",
            str(tmp_path / "a"),
            str(tmp_path / "o.parquet"),
            "--to",
            "parquet",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0 and done.stderr == "" and "20 rows" in done.stdout
