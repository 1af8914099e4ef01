"""atlas_remote as a drop-in for the format's original implementation (torch-atlas-ds).

Every call here is written as code for the original is written, with its keyword names, imported from
`torch_atlas_ds`, which in this suite is a package whose whole body is `from atlas_remote import *`.
The cases follow the original's own tests (`test_write_then_read.py`, `test_writer_shard.py`).
"""

from __future__ import annotations

import json
import pickle
import random

import numpy as np
import pytest
import zstandard
from torch_atlas_ds import (
    AtlasDataset,
    AtlasDatasetMetadata,
    AtlasDatasetShard,
    AtlasDatasetShardMetadata,
    AtlasDatasetShardWriter,
    AtlasDatasetWriter,
    CompressionStrategy,
)

import atlas_remote

SENTENCES = [
    "The sun rises in the east.",
    "Cats move gracefully.",
    "She reads in her free time.",
    "A quick brown fox jumps over the lazy dog.",
    "The park was full of children.",
    "He prefers tea over coffee.",
    "The train arrived on time.",
    "Winter is the coldest season.",
]


def sentences(n: int) -> list[str]:
    rng = random.Random(117)
    out = SENTENCES * (n // len(SENTENCES) + 1)
    rng.shuffle(out)
    return out[:n]


def shared_dictionary() -> zstandard.ZstdCompressionDict:
    return zstandard.train_dictionary(dict_size=1024, samples=[s.encode() for s in SENTENCES * 4])


@pytest.mark.parametrize(
    "num_examples,strategy,level,dict_size,shard_size,block_size,mmap_index",
    [
        (1, 0, 3, 0.01, 64, 8, True),
        (1, 2, 3, 0.01, 64, 8, True),
        (64 * 7, 2, 3, 0.01, 64, 8, True),
        (64 * 7 + 1, 3, 3, 0.01, 64, 8, True),  # 7-block boundary, one more
        (55, 2, 3, 0.01, 64, 8, True),
        (56, 3, 3, 0.01, 64, 8, True),  # fewer than 7 blocks: standard compression
        *[(1025, s, 3, 0.01, 64, 8, m) for s in range(4) for m in (True, False)],
        (1025, 3, 5, 0.0, 100, 1, True),
    ],
)
def test_write_then_read(tmp_path, num_examples, strategy, level, dict_size, shard_size, block_size, mmap_index):
    path = tmp_path / "atlas_ds"
    writer = AtlasDatasetWriter(
        path=path,
        shard_size=shard_size,
        block_size=block_size,
        compression_strategy=strategy,
        compression_level=level,
        compression_dict_size=dict_size,
    )
    samples = sentences(num_examples)
    for sample in samples:
        writer.add_example(sample)
    writer.close()
    reader = AtlasDataset(root=path, mmap_index=mmap_index)
    assert len(reader) == len(samples)
    assert [reader[i] for i in range(len(reader))] == samples
    assert isinstance(reader.metadata, AtlasDatasetMetadata) and reader.metadata.shard_sizes[0] == min(
        shard_size, num_examples
    )


def test_mmap_index_is_honoured_on_local_paths(tmp_path, monkeypatch):
    from atlas_remote.read import shard_fetch

    monkeypatch.setattr(shard_fetch, "MAP_FROM_BYTES", 0)  # only an index of 1 MiB or more is mapped: these are tiny
    path = tmp_path / "ds"
    with AtlasDatasetWriter(path, shard_size=100, block_size=10, checksums=False) as writer:  # the original's files
        for sample in sentences(250):
            writer.add_example(sample)
    for mmap_index, mapped in ((True, True), (False, False)):
        reader = AtlasDataset(path, mmap_index=mmap_index)
        assert reader[199] == sentences(250)[199]
        assert isinstance(reader.shards[1].offsets, np.memmap) is mapped
        # index.npy, mapped or read, counted like any other read; and without a manifest, a look for the
        # shard's atlas_blocks.npy (in the same round trip)
        assert reader.stats.requests["index"] == 2


@pytest.mark.parametrize("strategy,expect_compressor", [(0, False), (1, True), (2, True), (3, False)])
def test_shard_writer_instantiation(tmp_path, strategy, expect_compressor):
    shard_path = tmp_path / "shard"
    dictionary = shared_dictionary() if strategy == CompressionStrategy.SHARED_DICTIONARY_COMPRESSION else None
    writer = AtlasDatasetShardWriter(
        path=shard_path, block_size=32, compression_strategy=strategy, compression_dict=dictionary
    )
    assert writer.path == shard_path and shard_path.is_dir()
    assert isinstance(writer.metadata, AtlasDatasetShardMetadata)
    assert (
        writer.metadata.version,
        writer.metadata.block_size,
        writer.metadata.compression_strategy,
        writer.metadata.compression_level,
        writer.metadata.compression_dict_size,
    ) == (1, 32, strategy, 3, 0.01)
    assert writer.stored_examples == 0 and len(writer) == 0
    assert (writer.compressor is not None) == expect_compressor


@pytest.mark.parametrize(
    "block_size,strategy,dict_size", [(0, 3, 0.1), (-1, 3, 0.1), (32, 3, -0.1), (32, 3, 1.1), (32, 2, 0.1)]
)
def test_bad_shard_writer_arguments_raise_value_error_not_assertion(tmp_path, block_size, strategy, dict_size):
    with pytest.raises(ValueError):  # the original asserts; `python -O` would drop its checks
        AtlasDatasetShardWriter(
            tmp_path / "shard", block_size=block_size, compression_strategy=strategy, compression_dict_size=dict_size
        )
    if strategy != CompressionStrategy.SHARED_DICTIONARY_COMPRESSION:  # a dataset writer trains its own
        with pytest.raises(ValueError):
            AtlasDatasetWriter(
                path=tmp_path / "ds", shard_size=10, block_size=block_size, compression_dict_size=dict_size
            )


@pytest.mark.parametrize(
    "num_examples,strategy,expected_strategy,block_size,level,dict_size",
    [
        (1, 0, 0, 32, 3, 0.1),
        (1, 1, 1, 32, 3, 0.1),
        (1, 2, 2, 32, 3, 0.1),
        (1, 3, 1, 32, 3, 0.1),
        (225, 3, 3, 32, 3, 0.1),
        (192, 3, 1, 32, 3, 0.1),
        (225, 3, 3, 32, 6, 0.0),
        (5000, 2, 2, 32, 3, 0.1),
    ],
)
def test_shard_writer_add_examples_and_close(
    tmp_path, num_examples, strategy, expected_strategy, block_size, level, dict_size
):
    shard_path = tmp_path / "shard"
    dictionary = shared_dictionary() if strategy == CompressionStrategy.SHARED_DICTIONARY_COMPRESSION else None
    samples = sentences(num_examples)
    with AtlasDatasetShardWriter(
        path=shard_path,
        block_size=block_size,
        compression_strategy=strategy,
        compression_level=level,
        compression_dict=dictionary,
        compression_dict_size=dict_size,
    ) as writer:
        for i, sample in enumerate(samples):
            assert writer.stored_examples == i
            writer.add_example(sample)
    assert writer.stored_examples == num_examples
    assert json.loads((shard_path / "meta.json").read_text()) == {
        "version": AtlasDatasetShardWriter.VERSION,
        "block_size": block_size,
        "stored_examples": num_examples,
        "compression_strategy": expected_strategy,
        "compression_level": level,
        "compression_dict_size": dict_size,
    }
    index, data = np.load(shard_path / "index.npy"), (shard_path / "data.bin").read_bytes()
    blocks = -(-num_examples // block_size)
    assert len(index) == blocks + 1 and index[0] == 0 and index[-1] == len(data)
    dict_file = shard_path / "zstd_dict.bin"
    assert dict_file.is_file() == (expected_strategy == CompressionStrategy.DICTIONARY_COMPRESSION)
    dctx = {
        0: None,
        1: zstandard.ZstdDecompressor(),
        2: zstandard.ZstdDecompressor(dict_data=dictionary),
        3: dict_file.is_file()
        and zstandard.ZstdDecompressor(dict_data=zstandard.ZstdCompressionDict(dict_file.read_bytes())),
    }[expected_strategy]
    decoded = []
    for b in range(blocks):
        raw = data[index[b] : index[b + 1]]
        decoded += pickle.loads(dctx.decompress(raw) if dctx else raw)
    assert decoded == samples
    # the standalone shard reader, with the shared dictionary as bytes where it needs one
    shard = AtlasDatasetShard(shard_path, compression_dict_bytes=dictionary.as_bytes() if dictionary else None)
    assert len(shard) == num_examples and shard.metadata == writer.metadata
    assert [shard[i] for i in range(len(shard))] == samples and shard[-1] == samples[-1]


def test_a_shard_writer_left_by_an_exception_leaves_nothing(tmp_path):
    with pytest.raises(KeyError), AtlasDatasetShardWriter(tmp_path / "shard", block_size=4) as writer:
        writer.add_example("one")
        raise KeyError("interrupted")
    assert not (tmp_path / "shard").exists()


def test_a_standalone_shard_reader_on_a_bucket(s3, tmp_path):
    options, bucket, fs = s3
    url = f"s3://{bucket}/ds"
    samples = sentences(300)
    with AtlasDatasetWriter(url, shard_size=100, block_size=10, storage_options=options) as writer:
        for sample in samples:
            writer.add_example(sample)
    dictionary = fs.cat_file(f"{bucket}/ds/zstd_dict.bin")
    shard = AtlasDatasetShard(f"{url}/1", compression_dict_bytes=dictionary, storage_options=options)
    assert [shard[i] for i in range(len(shard))] == samples[100:200]
    assert pickle.loads(pickle.dumps(shard))[5] == samples[105], "pickles to its URL, options and dictionary"
    with pytest.raises(ValueError, match="shared dictionary"):
        AtlasDatasetShard(root=f"{url}/1", storage_options=options)
    with pytest.raises(atlas_remote.DatasetNotFoundError, match="not an Atlas shard folder"):
        AtlasDatasetShard(root=f"{url}/9", storage_options=options)


def test_one_location_under_any_of_its_names(tmp_path):
    with AtlasDatasetWriter(path=str(tmp_path / "ds"), shard_size=10, block_size=2) as writer:
        writer.add_example(1)
    assert AtlasDataset(root=tmp_path / "ds")[0] == AtlasDataset(url=str(tmp_path / "ds"))[0] == 1
    assert atlas_remote.open(str(tmp_path / "ds"))[0] == 1
    with pytest.raises(TypeError, match="location once"):
        AtlasDataset(str(tmp_path / "ds"), root=tmp_path / "ds")
    with pytest.raises(TypeError, match="location once"):
        AtlasDatasetWriter(shard_size=10, block_size=2)


def test_the_original_names_are_all_exported():
    import torch_atlas_ds

    for name in (
        "AtlasDataset",
        "AtlasDatasetShard",
        "CompressionStrategy",
        "AtlasDatasetMetadata",
        "AtlasDatasetShardMetadata",
        "AtlasDatasetWriter",
        "AtlasDatasetShardWriter",
    ):
        assert getattr(torch_atlas_ds, name) is getattr(atlas_remote, name)
    assert AtlasDatasetShardMetadata._fields == (
        "version",
        "block_size",
        "stored_examples",
        "compression_strategy",
        "compression_level",
        "compression_dict_size",
    )
    assert AtlasDatasetMetadata._fields == ("version", "shard_sizes", "compression_strategy")
    assert AtlasDataset.VERSION == AtlasDatasetWriter.VERSION == AtlasDatasetShardWriter.VERSION == 1
