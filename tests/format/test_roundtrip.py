"""Write then read: every strategy, the FAQ's edge cases, and a layout the original reader accepts."""

from __future__ import annotations

import json
import pickle
import threading

import numpy as np
import pytest
import zstandard
from helpers import same, sample_examples
from spec_reader import SpecReader

import atlas_remote as ar
from atlas_remote import CompressionStrategy as CS

EDGE_CASES = {
    # name: (examples, shard_size, block_size)
    "one-example": (1, 10, 4),
    "block-size-1": (23, 10, 1),
    "shard-smaller-than-block": (9, 3, 8),
    "fewer-than-7-blocks": (30, 30, 8),
    "exactly-7-blocks": (56, 56, 8),
    "many-shards": (257, 2, 1),
    "full-last-shard": (40, 20, 5),
}


def write(url, examples, shard_size, block_size, strategy, storage_options=None, **kw):
    with ar.AtlasDatasetWriter(url, shard_size, block_size, strategy, storage_options=storage_options, **kw) as w:
        for example in examples:
            w.add_example(example)


@pytest.mark.parametrize("strategy", list(CS))
@pytest.mark.parametrize("case", list(EDGE_CASES))
def test_round_trip_local(tmp_path, strategy, case):
    n, shard_size, block_size = EDGE_CASES[case]
    examples = sample_examples(n, seed=n)
    url = str(tmp_path / "ds")
    write(url, examples, shard_size, block_size, strategy)
    ds = ar.open(url)
    assert len(ds) == n
    assert same(ds[:], examples)
    assert same([ds[i] for i in range(-1, -n - 1, -1)], examples[::-1])
    assert same(SpecReader(url).all(), examples), "the original algorithm must read what we wrote"


@pytest.mark.parametrize("strategy", list(CS))
def test_round_trip_memory(memory_url, strategy):
    examples = sample_examples(300, seed=7)
    write(memory_url, examples, 100, 8, strategy)
    assert same(list(ar.open(memory_url)), examples)


@pytest.mark.parametrize("strategy", list(CS))
def test_round_trip_s3(s3, strategy):
    options, bucket, fs = s3
    examples = sample_examples(300, seed=8)
    url = f"s3://{bucket}/ds"
    write(url, examples, 100, 8, strategy, storage_options=options)
    ds = ar.open(url, storage_options=options)
    assert same(ds[:], examples)
    assert not fs.exists(f"{bucket}/ds/.atlas-staging"), "staging must be gone after commit"


def test_strategies_and_fallbacks_are_recorded_as_the_spec_says(tmp_path):
    examples = sample_examples(200, seed=1)
    url = tmp_path / "ds"
    write(str(url), examples, 64, 8, CS.DICTIONARY_COMPRESSION)  # shards of 8, 8, 8 and 1 block
    metas = [json.loads((url / name / "meta.json").read_text()) for name in ("0", "1", "2", "3")]
    assert [m["compression_strategy"] for m in metas] == [3, 3, 3, 1]
    assert [(url / name / "zstd_dict.bin").exists() for name in ("0", "1", "2", "3")] == [True, True, True, False]
    assert json.loads((url / "meta.json").read_text())["compression_strategy"] == 3

    shared = tmp_path / "shared"
    write(str(shared), examples, 64, 8, CS.SHARED_DICTIONARY_COMPRESSION)
    assert (shared / "zstd_dict.bin").stat().st_size >= 1024
    assert not any((shared / n / "zstd_dict.bin").exists() for n in ("0", "1", "2", "3"))
    assert {json.loads((shared / n / "meta.json").read_text())["compression_strategy"] for n in "0123"} == {2}

    fallback = tmp_path / "fallback"
    write(str(fallback), examples, 48, 8, CS.SHARED_DICTIONARY_COMPRESSION)  # first shard: 6 blocks
    assert json.loads((fallback / "meta.json").read_text())["compression_strategy"] == 1
    assert not (fallback / "zstd_dict.bin").exists()


def test_layout_keys_widths_and_index_dtype(tmp_path):
    url = tmp_path / "ds"
    write(str(url), [b"x" * 300] * 11, 1, 1, CS.NO_COMPRESSION)
    names = sorted(p.name for p in url.iterdir() if p.is_dir())
    assert names == [f"{i:02d}" for i in range(11)]
    root = json.loads((url / "meta.json").read_text())
    assert set(root) == {"version", "shard_sizes", "compression_strategy"} and root["shard_sizes"] == [1] * 11
    shard = json.loads((url / "00" / "meta.json").read_text())
    assert set(shard) == {
        "version",
        "block_size",
        "stored_examples",
        "compression_strategy",
        "compression_level",
        "compression_dict_size",
    }
    index = np.load(url / "00" / "index.npy")
    assert index.dtype == np.uint16 and list(index) == [0, (url / "00" / "data.bin").stat().st_size]


def test_index_uses_smallest_unsigned_dtype():
    import io

    from atlas_remote.format.spec import encode_index

    for last, dtype in [
        (0, np.uint8),
        (255, np.uint8),
        (256, np.uint16),
        (65535, np.uint16),
        (65536, np.uint32),
        (2**32, np.uint64),
    ]:
        assert np.load(io.BytesIO(encode_index([0, last]))).dtype == dtype


def test_empty_dataset(tmp_path):
    url = str(tmp_path / "ds")
    write(url, [], 10, 4, CS.STANDARD_COMPRESSION)
    ds = ar.open(url)
    assert len(ds) == 0 and list(ds) == [] and ds[:] == []
    with pytest.raises(IndexError):
        ds[0]


@pytest.mark.parametrize("strategy", [CS.STANDARD_COMPRESSION, CS.SHARED_DICTIONARY_COMPRESSION])
def test_blocks_compressed_in_batches_land_in_order_byte_for_byte(tmp_path, strategy, monkeypatch):
    """Blocks are compressed in batches, each by one zstd call on threads of its own (batches small here, so
    that there are many, and a last one cut short): data.bin holds exactly what compressing each block in turn
    gives."""
    from atlas_remote.write import shard_writer

    monkeypatch.setattr(shard_writer, "BATCH_BYTES", 1000)
    examples, block_size = sample_examples(900), 3
    assert len(pickle.dumps(examples)) > 50 * shard_writer.BATCH_BYTES
    write(str(tmp_path / "ds"), examples, 450, block_size, strategy)
    for number, start in enumerate((0, 450)):
        shard = tmp_path / "ds" / str(number)
        dictionary = (
            (tmp_path / "ds" / "zstd_dict.bin").read_bytes() if strategy == CS.SHARED_DICTIONARY_COMPRESSION else None
        )
        cctx = zstandard.ZstdCompressor(
            level=3, dict_data=zstandard.ZstdCompressionDict(dictionary) if dictionary else None
        )
        blocks = [pickle.dumps(examples[i : i + block_size]) for i in range(start, start + 450, block_size)]
        assert (shard / "data.bin").read_bytes() == b"".join(cctx.compress(b) for b in blocks)


def test_a_writer_that_fails_while_blocks_are_compressing_leaves_nothing(tmp_path):
    with pytest.raises(RuntimeError, match="stop"):
        with ar.AtlasDatasetWriter(str(tmp_path / "ds"), 1000, 2, CS.STANDARD_COMPRESSION) as w:
            for example in sample_examples(300):
                w.add_example(example)
            raise RuntimeError("stop")
    assert not (tmp_path / "ds").exists() or not any((tmp_path / "ds").iterdir())
    assert not [t for t in threading.enumerate() if t.name.startswith(("atlas-upload", "atlas-write"))], "let go"
