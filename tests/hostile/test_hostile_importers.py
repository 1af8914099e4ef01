"""`convert` inputs from a stranger: every field of a Megatron index, compressed streams that inflate without end,
lines and chunks of any size, codecs that run code. Each is one FormatError naming the source file and the
record, member or line, within a small bound of memory; what is already staged is kept for `--resume`."""

from __future__ import annotations

import gzip
import io
import json
import os
import pickle
import struct
import tarfile

import pytest
from helpers import Bounded, same
from source_files import make_dolma, make_jsonl, make_megatron, make_zarr

import atlas_remote as ar
from atlas_remote.cli import main
from atlas_remote.importers import dolma, jsonl, megatron, webdataset
from atlas_remote.importers import zarr as zarr_importer

MB = 1 << 20


def refused(read, named: str, message: str, peak: int = 32 * MB) -> ar.FormatError:
    """read() raises one FormatError naming `named`, matching `message`, within `peak` bytes traced and 5 s."""
    with Bounded() as cost:
        with pytest.raises(ar.FormatError, match=message) as bad:
            read()
    assert bad.value.url == named, str(bad.value)
    assert "\n" not in str(bad.value)
    assert cost.peak < peak and cost.cpu < 5, (cost.peak, cost.cpu)
    return bad.value


# -- Megatron: every field of the index --------------------------------------------------------------------------


def megatron_index(prefix) -> tuple[bytearray, int]:
    """The .idx's bytes and the number of sequences."""
    raw = bytearray(open(f"{prefix}.idx", "rb").read())
    return raw, struct.unpack("<Q", raw[18:26])[0]


# What reads a Megatron index: `convert`'s importer (streaming it) and the in-place reader (reading it whole).
MEGATRON_READERS = {
    "convert": lambda prefix: list(megatron.samples(prefix)),
    "in place": lambda prefix: ar.megatron(prefix),
}


def field_at(name: str, sequences: int, index: int = 0) -> int:
    header = 9 + 8 + 1 + 8 + 8
    return {"lengths": header, "pointers": header + sequences * 4, "documents": header + sequences * 12}[
        name
    ] + index * (4 if name == "lengths" else 8)


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda n: [("lengths", i, "<i", -1) for i in range(n)], r"sequence 0: length -1"),
        (lambda n: [("lengths", 5, "<i", -7)], r"sequence 5: length -7"),
        (lambda n: [("pointers", 3, "<q", -8)], r"sequence 3: pointer -8 is inside the sequence before it"),
        (lambda n: [("pointers", i, "<q", 0) for i in range(n)], r"sequence 1: pointer 0 is inside the sequence"),
        (lambda n: [("pointers", 4, "<q", 2)], r"sequence 4: pointer 2 is inside the sequence before it"),
        (lambda n: [("documents", 0, "<q", 1)], r"document index 0 is 1: document indices start at 0"),
        (lambda n: [("documents", 3, "<q", 0)], r"document index 3 is 0"),
        (lambda n: [("documents", 2, "<q", 10**9)], r"document index 2 is 1000000000"),
    ],
    ids=[
        "every length -1",
        "a negative length",
        "a negative pointer",
        "every pointer 0",
        "overlapping",
        "documents not from 0",
        "documents going back",
        "a document past the sequences",
    ],
)
@pytest.mark.parametrize("reader", MEGATRON_READERS)
def test_a_megatron_index_that_does_not_describe_its_bin_is_refused(tmp_path, edit, message, reader):
    """Before: lengths of -1 made each sequence the whole .bin (419 MB out of a small .idx, exit 0)."""
    prefix = tmp_path / "corpus"
    make_megatron(prefix, documents=40)
    raw, sequences = megatron_index(prefix)
    for name, index, fmt, value in edit(sequences):
        at = field_at(name, sequences, index)
        raw[at : at + struct.calcsize(fmt)] = struct.pack(fmt, value)
    open(f"{prefix}.idx", "wb").write(bytes(raw))
    bad = refused(lambda: MEGATRON_READERS[reader](str(prefix)), f"{prefix}.idx", message)
    assert "rebuild it" in str(bad)


@pytest.mark.parametrize(
    "offset, value, message",
    [
        (17, b"\x00", "unknown dtype code 0"),
        (18, struct.pack("<Q", 2**63), r"truncated"),
        (18, struct.pack("<Q", 10**12), r"truncated"),
        (26, struct.pack("<Q", 2**40), r"truncated"),
    ],
    ids=["dtype code 0", "10^19 sequences", "10^12 sequences", "10^12 documents"],
)
@pytest.mark.parametrize("reader", MEGATRON_READERS)
def test_a_megatron_header_out_of_range_is_refused(tmp_path, offset, value, message, reader):
    prefix = tmp_path / "corpus"
    make_megatron(prefix)
    raw, _ = megatron_index(prefix)
    raw[offset : offset + len(value)] = value
    open(f"{prefix}.idx", "wb").write(bytes(raw))
    refused(lambda: MEGATRON_READERS[reader](str(prefix)), f"{prefix}.idx", message)


def test_a_bad_input_keeps_what_was_staged_for_resume(tmp_path):
    """A conversion stopped by a bad input keeps the parts already staged: fixed and resumed, only the bad input
    is read again, and the dataset is the one an uninterrupted run gives."""
    good, bad = tmp_path / "a", tmp_path / "b"
    expected = make_megatron(good) + make_megatron(bad, documents=10)
    sound = open(f"{bad}.idx", "rb").read()
    raw, sequences = megatron_index(bad)
    raw[field_at("lengths", sequences, 2) : field_at("lengths", sequences, 3)] = struct.pack("<i", -1)
    open(f"{bad}.idx", "wb").write(bytes(raw))
    dest = str(tmp_path / "out")
    with pytest.raises(ar.FormatError, match="sequence 2: length -1"):
        ar.convert([str(good), str(bad)], dest, "megatron", shard_size=50, block_size=8)
    open(f"{bad}.idx", "wb").write(sound)
    report = ar.convert([str(good), str(bad)], dest, "megatron", shard_size=50, block_size=8, resume=True)
    assert report.inputs_resumed == 1
    assert same(ar.open(dest)[:], expected)


# -- compressed streams: what they inflate to is bounded by what was read of them ------------------------------


class Zeros(io.RawIOBase):
    def __init__(self, size: int) -> None:
        self.left = size

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        n = min(len(buffer), self.left)
        buffer[:n] = bytes(n)
        self.left -= n
        return n


def tar_with(path, size: int, mode: str = "w|gz", pax: bool = False) -> str:
    """A compressed tar holding one member of `size` zero bytes (or, with pax, a pax header of that size)."""
    with tarfile.open(str(path), mode, format=tarfile.PAX_FORMAT) as tar:
        info = tarfile.TarInfo("sample0.bin")
        if pax:
            info.pax_headers = {"comment": "x" * size}
            info.size = 0
            tar.addfile(info)
        else:
            info.size = size
            tar.addfile(info, io.BufferedReader(Zeros(size), MB))
    return str(path)


@pytest.mark.parametrize(
    "mode, size, pax",
    [("w|gz", 512 * MB, False), ("w|bz2", 128 * MB, False), ("w|xz", 128 * MB, False), ("w|gz", 256 * MB, True)],
    ids=["gzip, the issue's 512 MiB member", "bzip2", "xz", "a pax header of 256 MiB"],
)
def test_a_compressed_tar_that_inflates_without_bound_is_refused(tmp_path, mode, size, pax):
    """Before: a 522 KB tar.gz holding a 512 MiB member took 1.63 GB RSS to convert (1 GB traced)."""
    url = tar_with(tmp_path / "bomb.tar", size, mode, pax)
    assert os.path.getsize(url) < 2 * MB
    bad = refused(lambda: list(webdataset.samples(url)), url, r"decompresses to more than 100 times")
    assert "decompress it first" in str(bad)


def test_a_plain_tar_is_not_held_to_a_ratio(tmp_path):
    url = tar_with(tmp_path / "plain.tar", 40 * MB, "w|")
    (sample,) = webdataset.samples(url)
    assert sample["bin"] == bytes(40 * MB)


def test_a_line_longer_than_an_example_may_be_is_refused(tmp_path):
    """Before: read whole, however long (and a compressed one inflated whole first)."""
    plain = tmp_path / "long.jsonl"
    plain.write_bytes(b'{"a": 1}\n' + b'{"text": "' + b"x" * (16 * MB) + b'"}\n')
    refused(lambda: list(jsonl.samples(str(plain))), str(plain), r"line 2: longer than 16,777,216 bytes", 48 * MB)
    packed = tmp_path / "long.jsonl.gz"
    with gzip.open(packed, "wb") as f:
        f.write(b'{"a": 1}\n[')
        for _ in range(1024):
            f.write(b"0," * (MB // 2))
    refused(lambda: list(jsonl.samples(str(packed))), str(packed), r"line 2: longer than", 48 * MB)


def test_a_compressed_json_lines_file_that_inflates_without_bound_is_refused(tmp_path):
    packed = tmp_path / "rows.jsonl.gz"
    with gzip.open(packed, "wb") as f:
        for _ in range(512):
            f.write(b" " * (MB - 2) + b"0\n")
    assert packed.stat().st_size < 2 * MB
    refused(lambda: sum(1 for _ in jsonl.samples(str(packed))), str(packed), r"decompresses to more than 100 times")


@pytest.mark.parametrize(
    "line, message",
    [
        ("[" * 100_000 + "]" * 100_000, "line 2: RecursionError"),
        ('{"n": ' + "9" * 5000 + "}", "line 2: ValueError: Exceeds the limit"),
        ('{"a": \x00}', "line 2: JSONDecodeError"),
    ],
    ids=["nested 100,000 deep", "a 5,000-digit integer", "not JSON"],
)
def test_a_json_line_python_cannot_parse_is_named(tmp_path, line, message):
    """Before: a nested or huge-number line was a bare RecursionError or ValueError."""
    path = tmp_path / "rows.jsonl"
    path.write_text('{"ok": 1}\n' + line + "\n")
    refused(lambda: list(jsonl.samples(str(path))), str(path), message)


def test_a_line_that_is_not_utf8_is_named(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_bytes(b'{"ok": 1}\n{"a": "\xff"}\n')
    refused(lambda: list(jsonl.samples(str(path))), str(path), "line 2: UnicodeDecodeError")


@pytest.mark.parametrize(
    "document, message",
    [
        ([1, 2], "line 3: a document must be a JSON object, got list"),
        ({"id": "x", "attributes": [1]}, "line 3: its attributes must be a JSON object, got list"),
    ],
)
def test_a_dolma_line_that_is_not_a_document_is_named(tmp_path, document, message):
    """Before: a bare AttributeError (`list` has no `get`)."""
    make_dolma(tmp_path / "dolma")
    path = tmp_path / "dolma" / "documents" / "2019-09" / "0933_uk.jsonl.gz"
    rows = gzip.decompress(path.read_bytes()).decode().splitlines()
    rows[2] = json.dumps(document)
    path.write_bytes(gzip.compress(("\n".join(rows) + "\n").encode()))
    refused(lambda: list(dolma.samples(str(tmp_path / "dolma"), attributes=[])), str(path), message)


def test_sound_sources_still_read(tmp_path):
    expected = make_jsonl(tmp_path)
    assert same(list(jsonl.samples(str(tmp_path))), expected)


# -- zarr: codecs and chunk sizes from a stranger's .zarray ------------------------------------------------------


class Marker:
    """Unpickling this creates a file: proof that code ran."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


def edit_zarray(store, name: str, **fields) -> None:
    path = store / name / ".zarray"
    meta = json.loads(path.read_text())
    meta.update(fields)
    path.write_text(json.dumps(meta))


def test_a_zarr_codec_that_would_run_code_is_refused(tmp_path):
    """numcodecs' registry decodes `pickle` with pickle.loads: before, a chunk ran code when converted."""
    store = tmp_path / "scenes.zarr"
    make_zarr(store)
    marker = tmp_path / "ran"
    edit_zarray(store, "frames", compressor={"id": "pickle"})
    (store / "frames" / "0").write_bytes(pickle.dumps(Marker(str(marker))))
    refused(lambda: list(zarr_importer.samples(str(store))), f"{store}/frames", r"compressor .*pickle.*only blosc")
    edit_zarray(store, "frames", compressor=None, filters=[{"id": "pickle"}])
    refused(lambda: list(zarr_importer.samples(str(store))), f"{store}/frames", r"filters .*pickle")
    assert not marker.exists()


@pytest.mark.parametrize(
    "name, fields, message",
    [
        ("agents", {"chunks": [10**9]}, r"a chunk of 1,000,000,000 elements .* rechunk"),
        ("agents", {"chunks": [0]}, r"chunks must be one whole number above 0"),
        ("agents", {"chunks": [True]}, r"chunks must be one whole number above 0"),
        ("agents", {"shape": [-5]}, r"expected a 1-D zarr v2 array"),
        ("agents", {"dtype": "|O"}, r"does not hold plain data"),
        ("agents", {"dtype": [["a", "<f8", [10**10]]]}, r"is not a numpy dtype"),
        ("frames", {"dtype": [["timestamp", "<i8"]]}, r"no field 'agent_index_interval' of two integers"),
    ],
    ids=[
        "a chunk of 10^9",
        "a chunk of 0",
        "a chunk of True",
        "a negative shape",
        "objects",
        "a huge field",
        "no intervals",
    ],
)
def test_a_zarray_out_of_range_is_refused(tmp_path, name, fields, message):
    store = tmp_path / "scenes.zarr"
    make_zarr(store)
    edit_zarray(store, name, **fields)
    refused(lambda: list(zarr_importer.samples(str(store))), f"{store}/{name}", message)


def recompress(store, name: str, number: int, compressor: dict, data: bytes) -> None:
    import numcodecs

    edit_zarray(store, name, compressor=compressor)
    for chunk in sorted(p for p in (store / name).iterdir() if p.name.isdigit()):
        raw = data if int(chunk.name) == number else None
        if raw is None:
            decoded = numcodecs.get_codec({"id": "blosc"}).decode(chunk.read_bytes())
            raw = bytes(decoded)
        chunk.write_bytes(numcodecs.get_codec(compressor).encode(raw))


@pytest.mark.parametrize("codec", ["zstd", "zlib", "gzip", "bz2", "lz4", "blosc"])
def test_a_zarr_chunk_decoding_to_another_size_is_refused_unbuilt(tmp_path, codec):
    """A chunk must decode to exactly its elements' bytes: a bomb of 64 MiB in a chunk of 7 agents is refused
    after at most its expected bytes are inflated (blosc and lz4: their header's size is checked first)."""
    store = tmp_path / "scenes.zarr"
    make_zarr(store)
    recompress(store, "agents", 1, {"id": codec}, bytes(64 * MB))
    message = r"chunk (decodes to|does not decode|does not decode .*declares)|compressed bytes for a chunk"
    refused(lambda: list(zarr_importer.samples(str(store))), f"{store}/agents/1", message, 8 * MB)


@pytest.mark.parametrize("codec", ["zstd", "zlib", "gzip", "bz2", "lz4", "blosc"])
def test_zarr_chunks_of_every_compressor_read(tmp_path, codec):
    store = tmp_path / "scenes.zarr"
    expected = make_zarr(store)
    for name in ("scenes", "frames", "agents", "traffic_light_faces"):
        recompress(store, name, -1, {"id": codec}, b"")
    assert same(list(zarr_importer.samples(str(store))), expected)


def test_overlapping_zarr_intervals_are_refused(tmp_path):
    """Every frame naming all the agents made each example the whole agents array."""
    import zarr

    store = tmp_path / "scenes.zarr"
    make_zarr(store)
    frames = zarr.open_array(str(store / "frames"), mode="r+")
    values = frames[:]
    values["agent_index_interval"][:] = [0, 20]
    frames[:] = values
    refused(
        lambda: list(zarr_importer.samples(str(store))), f"{store}/agents", r"interval \[0, 20\) after one ending at 20"
    )


# -- Parquet and Arrow ------------------------------------------------------------------------------------------


def test_a_parquet_page_bomb_is_refused_from_its_metadata(tmp_path):
    """One zstd page of 400 MB of zeros in a 13 KB file: pyarrow decompresses a page whole (450 MB to read the
    first rows before). Its column chunk's metadata declares the ratio, checked before anything is read."""
    pyarrow = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    path = str(tmp_path / "bomb.parquet")
    table = pyarrow.table(
        {"id": list(range(3)), "blob": pyarrow.array([bytes(400 * MB), b"", b""], pyarrow.large_binary())}
    )
    pq.write_table(table, path, compression="zstd", use_dictionary=False)
    assert os.path.getsize(path) < MB
    from atlas_remote.importers import parquet

    refused(lambda: list(parquet.samples(path)), path, r"row group 0, column 'blob': .* more than 100 times")
    assert [row["id"] for row in parquet.samples(path, columns=["id"])] == [0, 1, 2], "other columns still read"


def test_a_save_to_disk_state_naming_files_elsewhere_is_refused(tmp_path):
    pytest.importorskip("pyarrow")
    import pyarrow
    import pyarrow.ipc

    secret = tmp_path / "secret.arrow"
    with pyarrow.ipc.new_stream(str(secret), pyarrow.schema([("x", pyarrow.int64())])) as writer:
        writer.write_table(pyarrow.table({"x": [42]}))
    folder = tmp_path / "saved"
    folder.mkdir()
    (folder / "state.json").write_text(json.dumps({"_data_files": [{"filename": "../secret.arrow"}]}))
    from atlas_remote.importers import arrow

    with pytest.raises(ar.FormatError, match=r"names '../secret.arrow', not a file of its folder") as bad:
        arrow.inputs(str(folder))
    assert bad.value.url == str(folder)


def test_convert_of_a_bomb_exits_1_with_one_line_and_commits_nothing(tmp_path, capsys):
    url = tar_with(tmp_path / "bomb.tar.gz", 64 * MB)
    dest = tmp_path / "out"
    with pytest.raises(SystemExit) as done:
        main(["convert", url, str(dest), "--from", "webdataset", "--quiet"])
    assert done.value.code == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "member 'sample0.bin': it decompresses to more than 100 times" in err
    with pytest.raises(ar.DatasetNotFoundError):
        ar.open(str(dest))
