"""A dataset's metadata from a stranger: the manifest, .npy sidecars, meta.json fields, shard folder names and zstd
frames. Each is read within a small bound fixed before anything is inflated or allocated, and anything else is
one FormatError (or CorruptBlockError) naming the file, never a bare exception."""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import logging
import os
import shutil
import struct
import zipfile
import zlib

import fsspec
import numpy as np
import pytest
import zstandard
from helpers import Bounded, same, sample_examples, tries
from helpers import write_dataset as write
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import atlas_remote as ar
from atlas_remote import CompressionStrategy as CS
from atlas_remote.format.manifest import MANIFEST, Manifest
from atlas_remote.format.seal import NO_DICTIONARY, block_digests
from atlas_remote.format.spec import BLOCKS_DTYPE, INDEX_DTYPES, encode_blocks, encode_checksums, encode_index, read_npy

EXAMPLES = sample_examples(60)
MB = 1 << 20


def dataset(tmp_path, strategy=CS.STANDARD_COMPRESSION) -> str:
    """60 examples in 3 shards of 20, blocks of 4, with checksums and a manifest."""
    return write(str(tmp_path / "ds"), EXAMPLES, 20, 4, compression_strategy=strategy)


def npy_header(shape: tuple, descr: str = "<i8") -> bytes:
    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(header, {"descr": descr, "fortran_order": False, "shape": shape})
    return header.getvalue()


def npy(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, array, allow_pickle=False)
    return buffer.getvalue()


# -- the manifest (row 8): bounded before anything is inflated -------------------------------------------------


def members(raw: bytes) -> dict[str, tuple[bytes, int]]:
    with zipfile.ZipFile(io.BytesIO(raw)) as zf:
        return {i.filename: (zf.read(i), i.compress_type) for i in zf.infolist()}


def rezip(parts: dict[str, tuple[bytes, int]], bomb: tuple[str, int, int] | None = None) -> bytes:
    """A zip of (bytes, compression) members, and a bomb: a member (name, compression, bytes it inflates to)
    holding a .npy whose header claims those bytes and whose body is zeros, written a MiB at a time."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as zf:
        for name, (data, compression) in parts.items():
            zf.writestr(zipfile.ZipInfo(name), data, compress_type=compression)
        if bomb is not None:
            name, compression, size = bomb
            info = zipfile.ZipInfo(name)
            info.compress_type = compression
            with zf.open(info, "w") as f:
                f.write(npy_header((size // 8,)))
                for _ in range(size // MB):
                    f.write(bytes(MB))
    return buffer.getvalue()


def declaring(raw: bytes, name: str, size: int) -> bytes:
    """The zip with member `name` declaring `size` bytes (the 32-bit size field of its local header and of its
    central directory entry rewritten), whatever it holds."""
    out = bytearray(raw)
    with zipfile.ZipFile(io.BytesIO(raw)) as zf:
        local = zf.getinfo(name).header_offset
    central = out.index(b"PK\x01\x02")
    while out[central + 46 : central + 46 + len(name)] != name.encode():
        central = out.index(b"PK\x01\x02", central + 4)
    out[local + 22 : local + 26] = struct.pack("<I", size)
    out[central + 24 : central + 28] = struct.pack("<I", size)
    return bytes(out)


BOMB_BYTES = 64 * MB  # each bomb inflates to this (the to 1 GiB): inflating it whole is far past the bound


def forge(case: str, raw: bytes) -> bytes:
    """What a stranger can put in atlas_manifest.npz in place of ours (raw), by name."""
    parts = members(raw)
    others = {n: p for n, p in parts.items() if n != "sizes.npy"}
    manifest = Manifest.decode(raw, shards=3)

    def columns(**values) -> bytes:
        return dataclasses.replace(manifest, **values).encode()

    def twice() -> bytes:
        with pytest.warns(UserWarning, match="Duplicate name"):
            return _twice(parts)

    cases = {
        "deflate bomb": lambda: rezip(others, ("sizes.npy", zipfile.ZIP_DEFLATED, BOMB_BYTES)),
        "bzip2 bomb": lambda: rezip(others, ("sizes.npy", zipfile.ZIP_BZIP2, BOMB_BYTES)),
        "lzma bomb": lambda: rezip(others, ("sizes.npy", zipfile.ZIP_LZMA, BOMB_BYTES)),
        "stored, lying size": lambda: declaring(
            rezip({**others, "sizes.npy": (npy_header((1 << 27,)) + bytes(80), zipfile.ZIP_STORED)}),
            "sizes.npy",
            1 << 30,
        ),
        "deflate, lying small size": lambda: declaring(
            rezip(others, ("sizes.npy", zipfile.ZIP_DEFLATED, BOMB_BYTES)), "sizes.npy", 152
        ),
        "header claiming 10^11 rows": lambda: rezip(
            {**others, "sizes.npy": (npy_header((10**11,)) + bytes(24), zipfile.ZIP_DEFLATED)}
        ),
        "a member not ours": lambda: rezip({**parts, "extra.npy": (npy(np.arange(3)), zipfile.ZIP_DEFLATED)}),
        "40 more members": lambda: rezip({**parts, **{f"x{n}": (b"", zipfile.ZIP_STORED) for n in range(40)}}),
        "a member twice": twice,
        "a column of 10,000 rows": lambda: columns(digests=np.zeros(10_000, np.uint32)),
        "strategy 9": lambda: columns(strategies=np.array([2, 9, 2], np.uint8)),
        "float shard numbers": lambda: columns(numbers=np.array([0.0, 1.0, 2.0])),
        "a shard beyond the root's": lambda: columns(numbers=np.array([0, 1, 7])),
        "negative data.bin size": lambda: columns(data_bytes=np.array([-1, 5, 5])),
        "NaN dictionary size": lambda: columns(dict_sizes=np.array([np.nan, 0.01, 0.01])),
    }
    return cases[case]()


def _twice(parts: dict[str, tuple[bytes, int]]) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as zf:
        for name, (data, compression) in [*parts.items(), ("numbers.npy", parts["numbers.npy"])]:
            zf.writestr(zipfile.ZipInfo(name), data, compress_type=compression)
    return buffer.getvalue()


MANIFEST_CASES = [
    "deflate bomb",
    "bzip2 bomb",
    "lzma bomb",
    "stored, lying size",
    "deflate, lying small size",
    "header claiming 10^11 rows",
    "a member not ours",
    "40 more members",
    "a member twice",
    "a column of 10,000 rows",
    "strategy 9",
    "float shard numbers",
    "a shard beyond the root's",
    "negative data.bin size",
    "NaN dictionary size",
]


@pytest.mark.parametrize("case", MANIFEST_CASES)
def test_a_forged_manifest_is_refused_within_a_small_bound_and_the_dataset_still_reads(tmp_path, case, caplog):
    """Before: the bzip2 bomb (3.8 KB, claiming 1 GiB) took 3.2 GB and 30 s to open, strategy 9 was a bare
    ValueError from the first read, and unknown members, NaN, negative sizes or float numbers were taken."""
    url = dataset(tmp_path)
    path = tmp_path / "ds" / MANIFEST
    path.write_bytes(forge(case, path.read_bytes()))
    with pytest.raises(ar.FormatError, match=r"rebuild it with `atlas-remote index URL`") as refused:
        with Bounded() as cost:
            Manifest.decode(path.read_bytes(), MANIFEST, shards=3)
    assert cost.peak < 4 * MB and cost.cpu < 1, (cost.peak, cost.cpu)
    assert "\n" not in str(refused.value) and refused.value.path == MANIFEST
    with caplog.at_level(logging.WARNING, logger="atlas_remote"):
        with Bounded() as cost:
            ds = ar.open(url)
    assert cost.peak < 16 * MB and cost.cpu < 2, (cost.peak, cost.cpu)
    assert ds.manifest is None and "reading without it" in caplog.text
    assert same(ds[:], EXAMPLES) and same(list(ds), EXAMPLES)


def test_a_sound_manifest_of_a_hundred_thousand_shards_reads_within_its_bound():
    count = 100_000
    rng = np.random.default_rng(0)
    manifest = Manifest(
        "x" * 64,
        np.arange(count),
        np.full(count, 10_000),
        np.full(count, 64),
        np.full(count, 2, np.uint8),
        rng.integers(900_000, 1_100_000, count),
        np.ones(count, bool),
        rng.integers(0, 2**32, count, dtype=np.uint32),
        np.full(count, 3, np.int32),
        np.full(count, 0.01),
    )
    raw = manifest.encode()
    with Bounded() as cost:
        decoded = Manifest.decode(raw, shards=count)
    assert decoded.digests.tolist() == manifest.digests.tolist()
    assert cost.peak < 16 * MB, cost.peak  # the columns themselves are 5 MB
    with pytest.raises(ar.FormatError, match=r"more than a manifest of 1,000 shards can be"):
        Manifest.decode(raw, shards=1000)


# -- shard folder names (row 14): a shard is never counted twice, nor beyond the root's count ------------------


@pytest.mark.parametrize("shards, extra", [(1, ["00", "000"]), (3, ["00"]), (3, ["01", "002"])])
def test_shard_folders_of_another_width_are_refused(tmp_path, memory_url, shards, extra):
    """`0`, `00`, `000`: the listing took all three for shard 0, and len(ds) was 120 where the root says 40."""
    url = write(str(tmp_path / "ds"), sample_examples(40 * shards), 40, 8)
    os.remove(tmp_path / "ds" / MANIFEST)  # the listing decides: what a dataset without a manifest (or HTTP) does
    for name in extra:
        shutil.copytree(tmp_path / "ds" / str(int(name)), tmp_path / "ds" / name)
    fsspec.filesystem("memory").pipe(
        {
            f"{memory_url[9:]}/{p.relative_to(tmp_path / 'ds').as_posix()}": p.read_bytes()
            for p in (tmp_path / "ds").rglob("*")
            if p.is_file()
        }
    )
    for where in (url, memory_url):
        with pytest.raises(
            ar.FormatError, match=rf"folder '{min(extra)}' looks like a shard.*rename or remove it"
        ) as bad:
            ar.open(where)
        assert bad.value.shard == min(extra)
    for name in extra:
        shutil.rmtree(tmp_path / "ds" / name)
    assert len(ar.open(url)) == 40 * shards


def test_a_folder_that_is_not_a_number_is_not_a_shard(tmp_path):
    url = write(str(tmp_path / "ds"), EXAMPLES, 20, 4)
    os.remove(tmp_path / "ds" / MANIFEST)
    (tmp_path / "ds" / "notes").mkdir()
    (tmp_path / "ds" / "١").mkdir()  # an Arabic-Indic digit one: not ASCII, not a shard
    assert same(ar.open(url)[:], EXAMPLES)


# -- .npy sidecars (row 16): the header checked against the shard's meta.json and the bytes, before allocating --


BLOCKS_DESCR = np.lib.format.dtype_to_descr(BLOCKS_DTYPE)


def to_earlier_sidecars(root) -> None:
    """The dataset as atlas_remote wrote it before atlas_blocks.npy: block_checksums.npy, and the manifest to match."""
    for folder in (p for p in root.iterdir() if p.is_dir()):
        rows = np.load(folder / "atlas_blocks.npy")
        (folder / "block_checksums.npy").write_bytes(encode_checksums(rows["crc32"][:-1].tolist()))
        (folder / "atlas_blocks.npy").unlink()
    (root / MANIFEST).unlink()  # an earlier dataset's: no seals
    ar.add_manifest(str(root))


def lying(length: int, descr: str) -> bytes:
    """A .npy whose header claims `length` items, followed by a few real ones."""
    return npy_header((length,), descr) + bytes(64)


@pytest.mark.parametrize(
    "name, raw, message",
    [
        ("index.npy", lying(10**11, "<u8"), r"100000000000 offsets for 20 examples in blocks of 4 \(expected 6\)"),
        ("index.npy", lying(6, "<u8"), r"its header says 6 offsets for .*, 48 bytes, but 64 bytes follow"),
        ("index.npy", lying(-1, "<u8"), r"-1 offsets"),
        ("index.npy", lying(6, "<f8"), r"its items are float64, where uint8 or uint16 or uint32 or uint64"),
        ("index.npy", lying(6, "|O"), r"declares Python objects.*damaged"),
        ("index.npy", npy_header((3, 2), "<u8") + bytes(48), r"an array of shape \(3, 2\)"),
        ("index.npy", b"\x93NUMPY\x03\x00" + bytes(40), r"\.npy version 3\.0"),
        ("index.npy", b"\x93NUMPY\x01\x00\xff\xff" + b"{" * 60000, r"not a valid \.npy array"),
        ("block_checksums.npy", lying(10**11, "<u4"), r"100000000000 checksums \(expected 5\)"),
        ("block_checksums.npy", lying(2**62, "<u4"), r"checksums \(expected 5\)"),
        ("atlas_blocks.npy", lying(10**11, BLOCKS_DESCR), r"its header says 100000000000 rows, .* but 64 bytes follow"),
        ("atlas_blocks.npy", lying(6, "<u8"), r"its items are uint64, where .*offset.*is expected"),
    ],
    ids=[
        "index 10^11",
        "index short",
        "index -1",
        "index floats",
        "index objects",
        "index 2-D",
        "npy 3.0",
        "header 64 KiB",
        "checksums 10^11",
        "checksums 2^62",
        "blocks 10^11",
        "blocks of offsets",
    ],
)
def test_a_sidecar_whose_header_lies_is_refused_before_numpy_allocates(tmp_path, name, raw, message):
    """Before: an index.npy whose header claimed 10^11 entries was a 745 GiB allocation attempt, MemoryError.
    Each file on a dataset whose reader reads it: atlas_blocks.npy (what we write), index.npy (the original's
    files only), block_checksums.npy (written by atlas_remote before atlas_blocks.npy)."""
    url = write(str(tmp_path / "ds"), EXAMPLES, 20, 4, checksums=name != "index.npy")
    if name == "block_checksums.npy":
        to_earlier_sidecars(tmp_path / "ds")
    (tmp_path / "ds" / "1" / name).write_bytes(raw)
    ds = ar.open(url)
    with Bounded() as cost:
        with pytest.raises(ar.FormatError, match=message) as bad:
            ds[25]
    assert cost.peak < 4 * MB, cost.peak
    assert (bad.value.url, bad.value.shard) == (url, "1") and bad.value.path.endswith(f"1/{name}")
    assert same(ds[:20] + ds[40:], EXAMPLES[:20] + EXAMPLES[40:]), "the other shards still read"


def test_a_large_mapped_index_whose_header_lies_is_refused(tmp_path):
    """An index of 1 MiB or more is memory-mapped, not read: its header is checked as a read one's is."""
    url = write(
        str(tmp_path / "ds"), list(range(300_000)), 300_000, 1, compression_strategy=CS.NO_COMPRESSION, checksums=False
    )
    index = tmp_path / "ds" / "0" / "index.npy"
    assert index.stat().st_size >= MB
    body = index.read_bytes()[128:]
    index.write_bytes(npy_header((10**11,), "<u4") + body)
    with Bounded() as cost:
        with pytest.raises(ar.FormatError, match=r"0/index.npy.*100000000000 offsets for 300000"):
            ar.open(url)[5]
    assert cost.peak < 4 * MB, cost.peak


npy_dtypes = st.sampled_from(["<u1", "<u2", "<u4", "<u8", ">u8", "<i8", "<f8", "|b1", "|O", "<U3", "|V8"])


@st.composite
def npy_files(draw) -> bytes:
    """.npy bytes as numpy writes them, or with their header's text, length field or body changed."""
    length = draw(st.integers(0, 12))
    dtype = np.dtype(draw(npy_dtypes))
    shape = draw(st.sampled_from([(length,), (length, 1), (), (-length,), (10 ** draw(st.integers(5, 20)),)]))
    header = io.BytesIO()
    descr = np.lib.format.dtype_to_descr(dtype)
    text = repr({"descr": descr, "fortran_order": draw(st.booleans()), "shape": shape})
    text = draw(st.sampled_from([text, text.replace("'", '"'), "{}", "[" * 80, text[: len(text) // 2]]))
    version = draw(st.sampled_from([(1, 0), (2, 0), (3, 0), (9, 9)]))
    fmt = "<H" if version == (1, 0) else "<I"
    header.write(b"\x93NUMPY" + bytes(version) + struct.pack(fmt, len(text) + 1) + text.encode("latin1") + b"\n")
    body = draw(st.binary(max_size=length * max(dtype.itemsize, 1) + 8))
    raw = header.getvalue() + body
    if draw(st.booleans()):  # some are exactly what np.save writes
        values = np.zeros(length, dtype) if not dtype.hasobject else np.zeros(length, "<u8")
        raw = npy(values)
    flips = draw(st.lists(st.tuples(st.integers(0, max(len(raw) - 1, 0)), st.integers(0, 255)), max_size=3))
    raw = bytearray(raw)
    for at, value in flips:
        if raw:
            raw[at] = value
    return bytes(raw[: draw(st.integers(0, len(raw)))] if draw(st.booleans()) else raw)


@settings(max_examples=tries(400), deadline=2000, suppress_health_check=[HealthCheck.too_slow])
@given(raw=npy_files(), length=st.one_of(st.none(), st.integers(0, 12)))
def test_read_npy_gives_a_format_error_or_the_array_numpy_would(raw, length):
    """Any header, any bytes: a FormatError, or exactly the array np.load makes of them (with the type and length
    asked for); never another exception, never an allocation beyond the bytes given."""
    with contextlib.suppress(ar.FormatError):  # once unmeasured: a first call's one-time costs (imports, caches) are
        read_npy(raw, "x.npy", INDEX_DTYPES, length)  # not the input's (hypothesis found 69 KB once, then never)
    with Bounded() as cost:
        try:
            got = read_npy(raw, "x.npy", INDEX_DTYPES, length)
        except ar.FormatError as err:
            assert err.path == "x.npy" and "\n" not in str(err)
            got = None
    assert cost.peak < 64 * 1024 + 4 * len(raw), cost.peak
    if got is not None:
        expected = np.load(io.BytesIO(raw), allow_pickle=False)
        assert got.dtype == expected.dtype and got.dtype.kind == "u" and got.ndim == 1
        assert length is None or len(got) == length
        assert np.array_equal(got, expected) and not got.flags.writeable


# -- meta.json fields (row 16): wrong types, NaN, negative, huge ------------------------------------------------


def edit_json(path, **fields) -> None:
    record = json.loads(path.read_text())
    record.update(fields)
    path.write_text(json.dumps(record))


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"shard_sizes": [20, 20, 10**30]}, "shard_sizes must be non-negative integers adding up to at most"),
        ({"shard_sizes": [2**62, 2**62, 20]}, "adding up to at most 2\\*\\*63-1"),
        ({"shard_sizes": [20, -1, 20]}, "shard_sizes must be non-negative"),
        ({"shard_sizes": [20, 20.0, 20]}, "shard_sizes must be non-negative integers"),
        ({"compression_strategy": 9}, "unknown compression_strategy 9"),
        ({"version": True}, "'version' must be int"),
    ],
)
def test_a_root_meta_json_out_of_range_is_a_format_error(tmp_path, fields, message):
    url = dataset(tmp_path)
    edit_json(tmp_path / "ds" / "meta.json", **fields)
    with pytest.raises(ar.FormatError, match=message) as bad:
        ar.open(url)
    assert bad.value.path == "meta.json"


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"block_size": 10**30}, "'block_size' must be an integer from 1 to 2\\*\\*63-1"),
        ({"block_size": 0}, "'block_size' must be an integer from 1"),
        ({"stored_examples": -5}, "'stored_examples' must be an integer from 0"),
        ({"stored_examples": 2**53 + 1, "block_size": 1}, "stored_examples is 9007199254740993 but the root"),
        ({"compression_level": 2**40}, "'compression_level' must fit in 32 bits"),
        ({"compression_dict_size": float("nan")}, "'compression_dict_size' must be a fraction from 0 to 1, got nan"),
        ({"compression_dict_size": -0.5}, "'compression_dict_size' must be a fraction"),
        ({"compression_dict_size": float("inf")}, "'compression_dict_size' must be a fraction"),
        ({"compression_strategy": "2"}, "'compression_strategy' must be int"),
    ],
)
def test_a_shard_meta_json_out_of_range_is_a_format_error(tmp_path, fields, message):
    url = dataset(tmp_path)
    os.remove(tmp_path / "ds" / MANIFEST)  # the shard's own meta.json is read
    edit_json(tmp_path / "ds" / "1" / "meta.json", **fields)
    ds = ar.open(url)
    with pytest.raises(ar.FormatError, match=message) as bad:
        ds[25]
    assert bad.value.path == "1/meta.json" and bad.value.shard == "1"


# -- zstd frames without a content size (row 16): decoded on every path, bounded by max_block_bytes -------------


def unsized(data: bytes) -> bytes:
    """A zstd frame as a streaming compressor writes it: no content size in its header."""
    buffer = io.BytesIO()
    with zstandard.ZstdCompressor().stream_writer(buffer, closefd=False) as writer:
        writer.write(data)
    frame = buffer.getvalue()
    assert zstandard.frame_content_size(frame) == -1
    return frame


def restream(root, replace: dict[tuple[str, int], bytes] | None = None) -> None:
    """Every block of a STANDARD_COMPRESSION dataset recompressed without a content size (or replaced), with its
    index, checksums and manifest made to match (unsigned: read as a stranger's)."""
    for folder in sorted(p for p in root.iterdir() if p.is_dir()):
        offsets = np.load(folder / "index.npy").tolist()
        data = (folder / "data.bin").read_bytes()
        blocks = [
            (replace or {}).get((folder.name, b)) or unsized(zstandard.decompress(data[start:end]))
            for b, (start, end) in enumerate(zip(offsets, offsets[1:]))
        ]
        (folder / "data.bin").write_bytes(b"".join(blocks))
        offsets = [0, *np.cumsum([len(b) for b in blocks]).tolist()]
        (folder / "index.npy").write_bytes(encode_index(offsets))
        sums = [zlib.crc32(b) for b in blocks]
        (folder / "atlas_blocks.npy").write_bytes(encode_blocks(offsets, sums, block_digests(blocks), NO_DICTIONARY))
    (root / MANIFEST).unlink()  # its seals are the blocks' before: written anew, unsigned, as anyone may
    ar.add_manifest(str(root))


def test_frames_without_a_content_size_decode_on_every_path(tmp_path):
    """Before: `ds[i]` read them, a pass raised ValueError from multi_decompress_to_buffer."""
    url = dataset(tmp_path)
    restream(tmp_path / "ds")
    ds = ar.open(url)
    assert same(ds[:], EXAMPLES) and same(ds[7], EXAMPLES[7])
    assert same(list(ds), EXAMPLES) and same(list(ar.open(url, readahead=0)), EXAMPLES)
    assert same(ds.get_many([59, 3, 30]), [EXAMPLES[59], EXAMPLES[3], EXAMPLES[30]])
    assert ar.verify(url).ok


@pytest.mark.parametrize("path", ["ds[i]", "a pass"])
def test_a_frame_without_a_content_size_is_never_decoded_past_max_block_bytes(tmp_path, path):
    url = dataset(tmp_path)
    restream(tmp_path / "ds", {("1", 2): unsized(bytes(64 * MB))})
    ds = ar.open(url, max_block_bytes=4 * MB)
    with Bounded() as cost:
        with pytest.raises(
            ar.CorruptBlockError, match=r"more than the 4194304 limit .its frame does not declare"
        ) as bad:
            ds[30] if path == "ds[i]" else list(ds)
    assert (bad.value.shard, bad.value.block) == ("1", 2)
    assert cost.peak < 16 * MB and cost.cpu < 2, (cost.peak, cost.cpu)
