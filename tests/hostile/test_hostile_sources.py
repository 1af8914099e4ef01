"""Hostile data, round 3 (issue 45, rows 4, 6, 7, 9 and 11, and Arrow's compressed bodies): inputs of `convert` and
token-count files that claimed far more than they held and were believed. Each is refused in one line naming the
source file (and member, chunk or line) before what it claims is allocated, or read exactly within the bound
docs/security.md gives; each test failed on the code before."""

from __future__ import annotations

import gzip
import json
import tarfile
from pathlib import Path

import numpy as np
import pytest
from helpers import Bounded, same
from parquet_footer import late_dictionary
from source_files import make_dolma, make_zarr
from test_hostile_consumers import cli, one_line
from test_hostile_importers import refused

import atlas_remote as ar
from atlas_remote import TokenCounts
from atlas_remote.importers import arrow, dolma, parquet, webdataset
from atlas_remote.importers import zarr as zarr_importer

MB = 1 << 20


# -- row 4: token counts ------------------------------------------------------------------------------------------------


def tokens_dataset(url: str) -> ar.AtlasDataset:
    rng = np.random.default_rng(0)
    with ar.AtlasDatasetWriter(url, 500, 8) as writer:
        for _ in range(1000):
            writer.add_example({"tokens": rng.integers(0, 50_000, int(rng.integers(10, 500))).astype(np.int32)})
    return ar.open(url)


def test_forged_token_counts_are_refused_before_anything_is_planned(tmp_path):
    """A count file with a valid header and 4e9 tokens a block took 27 s and 5 GB (the issue: 13.5 s and 2.5 GB,
    or a 15.9 GiB np.arange) before the first block was read. Counts past what a block can hold (max_block_bytes
    tokens: each is a byte of it at least) or past what the shard's stored bytes decompress to (32,768 a byte, as
    the manifest gives data.bin's size) are refused at once; counts within that and still forged are refused by
    the first block packed, as before."""
    from atlas_remote.training import TokenStream

    ds = tokens_dataset(str(tmp_path / "ds"))
    real = TokenCounts.of(ds)
    stored = int(ds.manifest.data_bytes[0])
    per_block = len(real.blocks) // 2
    for claim, message in (
        (4_000_000_000, r"4,000,000,000 tokens claimed for block 0 of the dataset, more than a block can hold"),
        (1 << 30, None),  # within a block's bound: the shard's stored bytes refuse it
    ):
        forged = TokenCounts(real.key, real.layout, np.full(len(real.blocks), claim, dtype=np.uint32))
        url = str(tmp_path / "counts")
        forged.save(url)
        expected = message or rf"{claim * per_block:,} tokens claimed for the {stored:,} stored bytes of shard 0"
        with Bounded() as cost, pytest.raises(ar.PackingError, match=expected) as bad:
            TokenStream(ds, 1024, batch_size=8, counts=url)
        assert bad.value.url == url and cost.cpu < 2 and cost.peak < 16 * MB, (cost.cpu, cost.peak)
    with pytest.raises(ar.PackingError, match="4,000,000,000 tokens claimed"):  # given a layout, not a dataset
        TokenCounts.load(_save(tmp_path, real, 4_000_000_000), ds.layout())
    real.save(str(tmp_path / "real"))
    stream = TokenStream(ds, 64, batch_size=4, counts=str(tmp_path / "real"))
    assert next(iter(stream))["tokens"].shape == (4, 65), "counts that are the dataset's are read as before"


def _save(tmp_path: Path, real: TokenCounts, claim: int) -> str:
    url = str(tmp_path / f"counts{claim}")
    TokenCounts(real.key, real.layout, np.full(len(real.blocks), claim, dtype=np.uint32)).save(url)
    return url


# -- row 6: a sparse tar member -------------------------------------------------------------------------------------------


def sparse_tar(path: Path, real_size: int) -> str:
    """A tar of one GNU sparse member ('S'): 512 bytes stored, the rest holes read as zeros."""
    info = tarfile.TarInfo("s0.bin")
    info.size = 512
    info.type = tarfile.GNUTYPE_SPARSE
    header = bytearray(info.tobuf(tarfile.GNU_FORMAT))

    def octal(n: int) -> bytes:
        return b"%011o\0" % n

    header[386:398], header[398:410], header[483:495] = octal(real_size - 512), octal(512), octal(real_size)
    header[148:156] = b" " * 8
    header[148:156] = b"%06o\0 " % sum(header)
    path.write_bytes(bytes(header) + b"x" * 512 + bytes(1024))
    return str(path)


def test_a_sparse_tar_member_is_refused(tmp_path):
    """A 2 KB tar whose member is sparse yielded a 2 GiB value (2.1 GB of RSS; `convert` a bare MemoryError
    traceback). WebDataset writers never write one: refused, naming the member, before its holes are read."""
    url = sparse_tar(tmp_path / "sparse.tar", 256 * MB)  # the held 2 GiB; this one what the code before read
    refused(lambda: list(webdataset.samples(url)), url, r"member 's0.bin': a sparse member \(268,435,456 bytes")
    dest = tmp_path / "out"
    one_line(*cli("convert", url, str(dest), "--from", "webdataset", "--quiet")[::2], "sparse member")
    with pytest.raises(ar.DatasetNotFoundError):
        ar.open(str(dest))


# -- row 7: zarr ----------------------------------------------------------------------------------------------------------------


def zarr_bomb(store: Path, chunks: int) -> None:
    """The store's scenes array cut in `chunks` chunks of 16 MiB of zeros, 530 bytes each stored."""
    import numcodecs

    make_zarr(store)
    path = store / "scenes" / ".zarray"
    meta = json.loads(path.read_text())
    itemsize = np.dtype([(f[0], f[1], tuple(f[2])) if len(f) == 3 else tuple(f) for f in meta["dtype"]]).itemsize
    per = (16 * MB) // itemsize
    meta.update(chunks=[per], shape=[per * chunks], compressor={"id": "zstd", "level": 19})
    path.write_text(json.dumps(meta))
    raw = numcodecs.get_codec({"id": "zstd", "level": 19}).encode(bytes(per * itemsize))
    for number in range(chunks):
        (store / "scenes" / str(number)).write_bytes(raw)


def test_a_zarr_store_has_one_inflation_budget(tmp_path):
    """A 32 KB store of 60 chunks, each 530 bytes declaring 16 MiB (each within the 16 MiB every chunk could
    inflate to, then), took 12.6 s and 2 GB before the first example: the scenes array read whole, joined
    chunk by chunk. Now the store's chunks together may decode to 16 MiB and 100 times what was read of it."""
    store = tmp_path / "scenes.zarr"
    zarr_bomb(store, 8)  # the had 60 (2 GB); 8 were read whole before
    refused(lambda: next(zarr_importer.samples(str(store))), f"{store}/scenes/1", r"decode to 33,554,\d+: more than")


def test_zarr_arrays_are_read_linearly(tmp_path, monkeypatch):
    """A window over an array joins what it reads once, not once per chunk (quadratic in the chunks read)."""
    store = tmp_path / "scenes.zarr"
    expected = make_zarr(store, frames_per_scene=(40, 30, 50), chunks=(1, 3, 1, 1))
    joins = []
    real = np.concatenate
    monkeypatch.setattr(zarr_importer.np, "concatenate", lambda parts, *a, **k: joins.append(len(parts)) or real(parts))
    assert same(list(zarr_importer.samples(str(store))), expected)
    agents = zarr_importer.ZarrArray(f"{store}/agents", None)
    joins.clear()
    window = zarr_importer.Window(agents)
    assert np.array_equal(
        window.slice(0, agents.length), np.concatenate([agents.read_chunk(i) for i in range(agents.length)])
    )
    assert joins[0] == agents.length + 1, "every chunk of the slice joined at once"


# -- row 9: Dolma attribute sets --------------------------------------------------------------------------------------------


def dolma_sets(root: Path, sets: int, line_bytes: int) -> str:
    """A Dolma root: one document, and `sets` attribute sets whose one line is padded to `line_bytes`."""
    (root / "documents").mkdir(parents=True)
    (root / "documents" / "a.jsonl.gz").write_bytes(gzip.compress(json.dumps({"id": "d0", "text": "hi"}).encode()))
    for number in range(sets):
        folder = root / "attributes" / f"s{number}"
        folder.mkdir(parents=True)
        line = json.dumps({"id": "d0", "attributes": {f"s{number}": [[0, 2, 1.0]]}}).ljust(line_bytes)
        (folder / "a.jsonl.gz").write_bytes(gzip.compress(line.encode() + b"\n", 9))
    return str(root)


def test_dolma_attribute_sets_are_bounded(tmp_path):
    """Every attribute set's file is open at once: 2,800 sets of 1 KB files, a 1 MB line each, held 2.96 GB before
    the first document (a 1 MiB buffer a set, and each set's last line). At most 128 sets are merged (more are
    refused, naming the attributes folder), each read 64 KiB at a time and holding no line once it is parsed:
    128 sets of 1 MB lines take under 40 MB (before: 270 MB)."""
    root = dolma_sets(tmp_path / "many", 129, 100)
    refused(lambda: next(dolma.samples(root)), f"{root}/attributes", r"129 attribute sets to merge: at most 128")
    assert len(next(dolma.samples(root, attributes=[f"s{i}" for i in range(128)]))["attributes"]) == 128
    root = dolma_sets(tmp_path / "long", 128, MB)
    with Bounded() as cost:
        document = next(dolma.samples(root))
    assert len(document["attributes"]) == 128 and cost.peak < 40 * MB, cost.peak
    expected = make_dolma(tmp_path / "sound")
    assert same(list(dolma.samples(str(tmp_path / "sound"))), expected)


# -- row 11: Parquet's dictionary encoding --------------------------------------------------------------------------------


def test_dictionary_encoded_values_are_counted_before_they_are_copied(tmp_path):
    """An 887-byte file yielded 12.5 GiB of values (one string of 100 KB under many indices: its column chunk's
    sizes say 100 KB); `convert` ended in a bare MemoryError. Dictionary-encoded columns are read as they are
    stored and each batch's values counted as decoded before they are copied: refused past the bound every
    compressed source has; the same columns of a sound file read exactly, nested ones too."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = str(tmp_path / "bomb.parquet")
    column = pa.DictionaryArray.from_arrays(pa.array(np.zeros(2_000, np.int32)), pa.array(["x" * 100_000]))
    pq.write_table(pa.table({"text": column}), path, compression="zstd")
    assert Path(path).stat().st_size < 1024
    refused(lambda: list(parquet.samples(path)), path, r"its values decode to more than 102,40\d,\d+ bytes from the")
    dest = tmp_path / "out"
    one_line(*cli("convert", path, str(dest), "--from", "parquet", "--quiet")[::2], "dictionary encoding")
    sound = pa.table(
        {
            "s": pa.array(["a", "bb", None, "a"]),
            "l": pa.array([["x", "yy"], None, [], ["x"]]),
            "n": [1, 2, 3, 4],
            "st": [{"a": "q"}, {"a": "r"}, None, {"a": "q"}],
            "m": pa.array([[("k", "v")], None, [], [("k", "w")]], pa.map_(pa.string(), pa.string())),
        }
    )
    pq.write_table(sound, str(tmp_path / "sound.parquet"))
    assert list(parquet.samples(str(tmp_path / "sound.parquet"))) == sound.to_pylist()
    for name, nested in [  # the same string under a list's and a struct's indices
        ("list", pa.ListArray.from_arrays(pa.array(np.arange(0, 2_001, 10, dtype=np.int32)), column)),
        ("struct", pa.StructArray.from_arrays([column], ["a"])),
    ]:
        pq.write_table(pa.table({name: nested}), str(tmp_path / f"{name}.parquet"), compression="zstd")
        nested_path = str(tmp_path / f"{name}.parquet")
        refused(lambda at=nested_path: list(parquet.samples(at)), nested_path, "its values decode to more than")


def test_a_row_group_whose_dictionaries_cannot_inflate_is_read_decoded(tmp_path):
    """Reading a dictionary column as stored costs where pyarrow's writer let it fall back to plain pages (text
    of distinct strings: pyarrow encodes those pages into a dictionary first; 2.3 to 2.7 times the CPU of the
    whole importer on 200 B and 2 KB strings). Each row group's dictionaries are probed instead (one row read
    as stored): a batch of 1,024 rows of top-level columns holds at most 1,024 times their longest entries, and
    only a row group where that could pass 64 MiB, or whose dictionaries are nested, is read as stored. A row
    group read decoded is still counted: a bomb of shorter strings is refused a batch past the bound."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(0)
    texts = [rng.bytes(1_000).hex() for _ in range(3_000)]  # past pyarrow's 1 MiB dictionary page: it falls back
    sound = pa.table({"text": texts, "lang": [["en", "fr"][i % 2] for i in range(3_000)]})
    path = str(tmp_path / "distinct.parquet")
    pq.write_table(sound, path, row_group_size=1_000, compression="zstd")
    bomb = str(tmp_path / "bomb.parquet")
    column = pa.DictionaryArray.from_arrays(pa.array(np.zeros(2_000, np.int32)), pa.array(["x" * 100_000]))
    pq.write_table(pa.table({"text": column}), bomb, compression="zstd")

    def risks(url: str) -> list[tuple[str, ...]]:
        with open(url, "rb") as source:
            raw = parquet.Replayed(source)
            leaves = parquet._leaves(pa, pq.ParquetFile(raw))
            dictionaries = parquet._dictionary_columns(pq.ParquetFile(raw).metadata, leaves, None)
            probe = pq.ParquetFile(raw, read_dictionary=[leaves.paths[n] for n in dictionaries])
            return [
                parquet._dictionary_risk(pa, probe, raw, group, dictionaries, leaves, parquet.BATCH_ROWS)
                for group in range(probe.metadata.num_row_groups)
            ]

    assert parquet._leaves(pa, pq.ParquetFile(path)).paths == ["text", "lang"]
    assert risks(path) == [(), (), ()]
    assert risks(bomb) == [("text",)]
    assert list(parquet.samples(path)) == sound.to_pylist()
    shorter = str(tmp_path / "shorter.parquet")  # 60 KB entries: 1,024 of them are within 64 MiB
    column = pa.DictionaryArray.from_arrays(pa.array(np.zeros(20_000, np.int32)), pa.array(["y" * 60_000]))
    pq.write_table(pa.table({"text": column}), shorter, compression="zstd")
    assert risks(shorter) == [()]
    refused(lambda: list(parquet.samples(shorter)), shorter, "its values decode to more than", peak=100 * MB)
    nested = str(tmp_path / "nested.parquet")
    pq.write_table(pa.table({"l": [["a", "b"], ["a"]] * 10}), nested)
    assert risks(nested) == [("l.list.element",)]


def test_what_a_probe_of_the_first_row_cannot_see_is_read_as_stored_or_refused(tmp_path):
    """Files that got past the probe, from a review of it (each in a few hundred bytes): a dictionary page after a
    plain page (pyarrow reads it; the first row's dictionary is one short value): 2.17 GB for 1 MiB entries; a
    top-level column named as a list column's leaf ("a.list.element": the list was taken for a top-level column):
    2.49 GB. And what was there before it: a top-level column named "x.y" asked for by name escaped the metadata's
    check (split at its dot: 1.0 GB from 300 MB of zeros); fixed-size binary values of 1 MiB under a dictionary, 1,024 rows a batch
    (1.13 GB: now as many rows as 64 MiB holds); two columns of one name read as one."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    late = str(late_dictionary(tmp_path, 1 << 20, 4_096))
    first = next(pq.ParquetFile(late).iter_batches(2)).column(0).to_pylist()
    assert [len(value) for value in first] == [1, 1 << 20], "pyarrow reads the late dictionary"
    refused(lambda: list(parquet.samples(late)), late, "its values decode to more than", peak=100 * MB)

    entries = pa.DictionaryArray.from_arrays(pa.array(np.zeros(25_000, np.int32)), pa.array(["x" * 60_000]))
    decoy = pa.table(
        {"a.list.element": ["d"], "a": pa.ListArray.from_arrays(pa.array([0, 25_000], pa.int32()), entries)}
    )
    confused = str(tmp_path / "confused.parquet")
    pq.write_table(decoy, confused, compression="zstd", store_schema=False)
    refused(lambda: list(parquet.samples(confused)), confused, "two leaf columns are named 'a.list.element'")

    dotted = str(tmp_path / "dotted.parquet")
    pq.write_table(pa.table({"x.y": pa.array([bytes(64 << 20)], pa.large_binary())}), dotted, compression="zstd")
    refused(lambda: list(parquet.samples(dotted, columns=["x.y"])), dotted, "more than 100 times as many")

    fixed = str(tmp_path / "fixed.parquet")  # 128 KiB values: 512 rows a batch, not 1,024
    wide = pa.DictionaryArray.from_arrays(
        pa.array(np.zeros(1_024, np.int32)), pa.array([bytes(1 << 17)], pa.binary(1 << 17))
    )
    pq.write_table(
        pa.table({"f": wide}), fixed, compression="zstd", store_schema=False, dictionary_pagesize_limit=1 << 20
    )
    refused(
        lambda: list(parquet.samples(fixed)), fixed, "its values decode to more than 67,108,864 bytes", peak=100 * MB
    )

    twice = str(tmp_path / "twice.parquet")
    pq.write_table(pa.Table.from_arrays([pa.array(["a"]), pa.array(["b"])], names=["s", "s"]), twice)
    refused(lambda: list(parquet.samples(twice)), twice, "two columns are named 's'")


# -- Arrow IPC and Feather: compressed bodies -------------------------------------------------------------------------------


def test_compressed_arrow_batches_are_bounded_before_pyarrow_decompresses_them(tmp_path):
    """A 12.7 KB Feather file held a record batch of 400 MB (438 MB of RSS to read it: pyarrow decompresses a
    batch whole, to the sizes its buffers declare). The file is walked first, reading what each compressed buffer
    declares: refused past the bound every compressed source has, file or stream, ZSTD or LZ4; the same data
    uncompressed, and a compressed file of sound data, read as before."""
    import pyarrow as pa
    import pyarrow.feather as feather
    import pyarrow.ipc as ipc

    table = pa.table({"id": [0, 1, 2], "blob": pa.array([bytes(64 * MB), b"", b""], pa.large_binary())})
    bomb = str(tmp_path / "bomb.feather")
    feather.write_feather(table, bomb, compression="zstd")
    stream = str(tmp_path / "bomb.arrows")
    with ipc.new_stream(stream, table.schema, options=ipc.IpcWriteOptions(compression="lz4")) as writer:
        writer.write_table(table)
    for url in (bomb, stream):
        refused(
            lambda u=url: list(arrow.samples(u)),
            url,
            r"its record batches declare 67,1\d\d,\d+ bytes once decompressed",
        )
    sound = pa.table({"id": list(range(1000)), "d": pa.array(["ab", "cd"] * 500).dictionary_encode()})
    for compression in ("zstd", "lz4", "uncompressed"):
        path = str(tmp_path / f"sound-{compression}.feather")
        feather.write_feather(sound, path, compression=compression)
        assert list(arrow.samples(path)) == sound.to_pylist()


def test_an_arrow_footer_naming_a_message_elsewhere_is_refused(tmp_path):
    """pyarrow reads the batches a file's footer names: one naming an offset the walk did not find (a message
    hidden past the end of stream) is refused."""
    import pyarrow as pa
    import pyarrow.feather as feather

    path = tmp_path / "f.feather"
    feather.write_feather(pa.table({"x": [1, 2, 3]}), str(path), compression="uncompressed")
    raw = bytearray(path.read_bytes())
    footer_length = int.from_bytes(raw[-10:-6], "little")
    footer = raw[-10 - footer_length : -10]
    from atlas_remote.importers.arrow_ipc import _Table

    table = _Table(bytes(footer), int.from_bytes(footer[:4], "little"))
    at = table._field(3)
    assert at is not None
    start = at + int.from_bytes(footer[at : at + 4], "little") + 4  # the first record batch's Block
    footer[start : start + 8] = (8 + 1).to_bytes(8, "little")
    raw[-10 - footer_length : -10] = footer
    path.write_bytes(bytes(raw))
    refused(lambda: list(arrow.samples(str(path))), str(path), r"its footer names a message at byte 9")
