"""Bad input gets a clear error naming what failed: URL, shard, block."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
from helpers import same, sample_examples

import atlas_remote as ar
from atlas_remote import CompressionStrategy as CS
from atlas_remote.format.manifest import MANIFEST
from atlas_remote.format.spec import BLOCKS_DTYPE


def make(tmp_path: Path, strategy=CS.STANDARD_COMPRESSION, n=100, shard=50, block=10, checksums=True) -> Path:
    url = tmp_path / "ds"
    with ar.AtlasDatasetWriter(str(url), shard, block, strategy, checksums=checksums) as w:
        for example in sample_examples(n):
            w.add_example(example)
    return url


def test_no_dataset_at_url(tmp_path):
    with pytest.raises(ar.DatasetNotFoundError, match="not an Atlas dataset, or not committed yet") as info:
        ar.open(str(tmp_path / "nothing"))
    assert str(tmp_path / "nothing") in str(info.value)


def test_missing_bucket_is_a_clear_error(s3):
    options, _, _ = s3
    with pytest.raises(ar.DatasetNotFoundError, match="s3://no-such-bucket-here/ds"):
        ar.open("s3://no-such-bucket-here/ds", storage_options=options)


def test_unknown_protocol(tmp_path):
    with pytest.raises(ar.StorageError, match="nosuchproto://bucket/ds"):
        ar.open("nosuchproto://bucket/ds")


def test_unsupported_version(tmp_path):
    url = make(tmp_path)
    meta = json.loads((url / "meta.json").read_text())
    (url / "meta.json").write_text(json.dumps({**meta, "version": 2}))
    with pytest.raises(ar.FormatError, match="unsupported Atlas format version 2"):
        ar.open(str(url))


def test_malformed_root_meta(tmp_path):
    url = make(tmp_path)
    (url / "meta.json").write_text("{not json")
    with pytest.raises(ar.FormatError, match="meta.json: not valid JSON"):
        ar.open(str(url))


def test_truncated_data_bin_is_found_when_the_shard_is_opened(tmp_path):
    url = make(tmp_path)
    data = url / "1" / "data.bin"
    data.write_bytes(data.read_bytes()[:-5])
    ds = ar.open(str(url))
    assert ds[0] is not None  # shard 0 is untouched
    with pytest.raises(ar.FormatError, match=r"the blocks end at byte \d+ but data.bin holds") as bad:
        ds[99]
    assert (bad.value.url, bad.value.path, bad.value.shard) == (str(url), "1/index.npy", "1")


def test_corrupt_compressed_block(tmp_path):
    url = make(tmp_path, checksums=False)
    data = url / "0" / "data.bin"
    raw = bytearray(data.read_bytes())
    start, end = np.load(url / "0" / "index.npy")[2:4]
    raw[int(start) + 10 : int(end)] = bytes(int(end) - int(start) - 10)
    data.write_bytes(bytes(raw))
    ds = ar.open(str(url))
    assert same(ds[:20], sample_examples(100)[:20])
    with pytest.raises(ar.CorruptBlockError, match=r"ds/0/data.bin: shard 0 block 2 bytes \[\d+, \d+\)"):
        ds[25]


def test_corrupt_uncompressed_block_does_not_unpickle(tmp_path):
    url = make(tmp_path, CS.NO_COMPRESSION, checksums=False)
    data = url / "0" / "data.bin"
    raw = bytearray(data.read_bytes())
    raw[3:40] = b"\xff" * 37
    data.write_bytes(bytes(raw))
    with pytest.raises(ar.CorruptBlockError, match="shard 0 block 0.*does not unpickle"):
        ar.open(str(url))[0]


# The index the reader uses: atlas_blocks.npy where the writer kept checksums, else the format's index.npy.
INDEXES = [pytest.param(True, "atlas_blocks.npy", id="atlas_blocks"), pytest.param(False, "index.npy", id="index")]


@pytest.mark.parametrize("checksums, name", INDEXES)
def test_truncated_index(tmp_path, checksums, name):
    url = make(tmp_path, checksums=checksums)
    index = url / "0" / name
    index.write_bytes(index.read_bytes()[:-3])
    with pytest.raises(ar.FormatError, match=rf"ds/0/{name}"):
        ar.open(str(url))[0]


@pytest.mark.parametrize("checksums, name", INDEXES)
def test_index_with_wrong_block_count(tmp_path, checksums, name):
    url = make(tmp_path, checksums=checksums)
    if checksums:
        np.save(url / "0" / name, np.zeros(3, dtype=BLOCKS_DTYPE))
        expected = "3 rows for 50 examples in blocks of 10 .expected 6: one per block and one more."
    else:
        np.save(url / "0" / name, np.array([0, 10, 20], dtype=np.uint8))
        expected = "3 offsets for 50 examples in blocks of 10 .expected 6."
    with pytest.raises(ar.FormatError, match=expected):
        ar.open(str(url))[0]


def test_shard_meta_disagreeing_with_root(tmp_path):
    """Without a manifest (a dataset the original wrote) a shard opens from its meta.json; with one, from the
    manifest's copy, and only `verify` reads meta.json (tests/format/test_manifest.py)."""
    url = make(tmp_path)
    (url / MANIFEST).unlink()
    meta = json.loads((url / "1" / "meta.json").read_text())
    (url / "1" / "meta.json").write_text(json.dumps({**meta, "stored_examples": 49}))
    ds = ar.open(str(url))
    with pytest.raises(ar.FormatError, match="stored_examples is 49 but the root meta.json says shard 1 holds 50"):
        ds[60]


def test_missing_shard_meta(tmp_path):
    url = make(tmp_path)
    (url / MANIFEST).unlink()
    (url / "1" / "meta.json").unlink()
    with pytest.raises(ar.ObjectNotFoundError, match="ds/1/meta.json"):
        ar.open(str(url))[60]


def test_index_errors_and_types(tmp_path):
    ds = ar.open(str(make(tmp_path)))
    with pytest.raises(IndexError, match="index 100 out of range"):
        ds[100]
    with pytest.raises(IndexError):
        ds[-101]
    with pytest.raises(TypeError):
        ds["3"]
    assert same(ds[np.int64(3)], ds[3]) and same(ds[-100], ds[0])


class Exploit:
    def __reduce__(self):
        return (os.system, ("touch pwned-by-atlas-block",))


def test_block_that_would_run_a_command_is_refused(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    url = tmp_path / "evil"
    with ar.AtlasDatasetWriter(str(url), 10, 10, CS.NO_COMPRESSION) as w:
        w.add_example(Exploit())
    with pytest.raises(ar.UnsafePickleError, match=r"(posix|os)\.system.*allowed_classes"):
        ar.open(str(url))[0]
    assert not (tmp_path / "pwned-by-atlas-block").exists()


class Point:
    def __init__(self, x):
        self.x = x

    def __eq__(self, other):
        return type(other) is Point and other.x == self.x


def test_allowed_classes_and_trusted(tmp_path):
    url = tmp_path / "points"
    with ar.AtlasDatasetWriter(str(url), 10, 10, CS.STANDARD_COMPRESSION) as w:
        w.add_example(Point(3))
    with pytest.raises(ar.UnsafePickleError, match="Point"):
        ar.open(str(url))[0]
    assert ar.open(str(url), allowed_classes=[Point])[0] == Point(3)
    assert ar.open(str(url), trusted=True)[0] == Point(3)


def test_a_missing_data_bin_read_through_obstore_is_one_line(s3):
    """obstore's message carried a ~25-line Rust debug dump; every error prints one line."""
    from helpers import write_dataset

    options, bucket, fs = s3
    url = write_dataset(f"s3://{bucket}/gone", sample_examples(40), 20, 5, options)
    fs.rm(f"{bucket}/gone/0/data.bin")
    ds = ar.open(url, storage_options=options)
    assert ds.store.read_client == "obstore"
    with pytest.raises(ar.AtlasError) as info:
        ds[0]
    message = str(info.value)
    assert "\n" not in message and "Debug source" not in message and len(message) < 600, message
    assert "gone" in message and "data.bin" in message


@pytest.mark.parametrize("checksums, name", INDEXES)
def test_an_index_declaring_objects_is_damaged_not_to_be_loaded_unsafely(tmp_path, checksums, name):
    url = make(tmp_path, checksums=checksums)
    np.save(url / "1" / name, np.array([0, None], dtype=object), allow_pickle=True)
    with pytest.raises(ar.FormatError, match="declares Python objects.*damaged|expected a 1-D array of") as info:
        ar.open(str(url))[60]
    assert "allow_pickle" not in str(info.value) and f"1/{name}" in str(info.value)
