"""One behaviour on every store: the same assertions over local, memory://, S3, GCS and HTTP (read-only)."""

from __future__ import annotations

import pytest
from conftest import SCHEMES, on_backends
from helpers import CASES, FIXTURES, expected, params, same, sample_examples

import atlas_remote as ar
from atlas_remote import CompressionStrategy as CS


def make_dataset(
    backend, tmp_path, name, examples, shard_size=100, block_size=8, strategy=CS.SHARED_DICTIONARY_COMPRESSION
):
    """Write a dataset on the backend (through the writer where it is writable, else locally then copied)."""
    if backend.writable:
        url = backend.url(name)
        target, options = url, backend.options
    else:
        target, options = str(tmp_path / "src" / name), None
    with ar.AtlasDatasetWriter(target, shard_size, block_size, strategy, storage_options=options) as writer:
        for example in examples:
            writer.add_example(example)
    return backend.url(name) if backend.writable else backend.put_tree(tmp_path / "src" / name, name)


# on a remote store: a shared dictionary, and a missing shard (listed, or found on first touch over HTTP)
REMOTE_CASES = ["s2-mixed-600", "s3-missing-shard"]


@pytest.mark.parametrize("backend, case", on_backends(CASES, REMOTE_CASES), indirect=["backend"])
def test_reference_dataset_reads_back_exactly(backend, case):
    url = backend.put_tree(FIXTURES / case / "dataset", case)
    want, p = expected(case), params(case)
    ds = ar.open(url, storage_options=backend.options)
    if p["dropped_shard"] is not None and not backend.lists:
        # Without a listing the root's shard_sizes are all there is: the missing shard is found on first touch.
        first_missing = p["dropped_shard"] * p["shard_size"]
        assert len(ds) == p["examples"] and same(ds[:first_missing], want[:first_missing])
        with pytest.raises(ar.ObjectNotFoundError, match=f"/{p['dropped_shard']}/"):
            ds[first_missing]
        return
    assert len(ds) == len(want) == p["expected_len"]
    assert same([ds[i] for i in range(len(ds))], want)
    assert same(list(ds), want) and same(ds[-1], want[-1])


@pytest.mark.parametrize(
    "backend, strategy",
    on_backends(list(CS), [CS.SHARED_DICTIONARY_COMPRESSION], ids=lambda strategy: strategy.name),
    indirect=["backend"],
)
def test_round_trip(backend, tmp_path, strategy):
    examples = sample_examples(300, seed=int(strategy))
    url = make_dataset(backend, tmp_path, "ds", examples, strategy=strategy)
    ds = ar.open(url, storage_options=backend.options)
    assert same(ds[:], examples) and same(list(ds), examples)
    assert same(ds.get_many([299, 0, 150, 0]), [examples[i] for i in (299, 0, 150, 0)])


def test_request_pattern(backend, tmp_path):
    examples = sample_examples(300)
    url = make_dataset(backend, tmp_path, "ds", examples)
    ds = ar.open(url, storage_options=backend.options)
    # the root meta.json and the manifest, in one round trip; a store that lists is listed too, since this dataset
    # has few shards (one listing page says which are present: a copy of some shards is served as it is)
    listed = {"list": 1} if backend.lists else {}
    assert dict(ds.stats.requests) == {"meta": 1, "manifest": 1, **listed}

    ds.reset_stats()
    assert same(ds[120], examples[120])  # cold: the shard's atlas_blocks.npy (its meta.json is in the manifest)
    assert dict(ds.stats.requests) == {"index": 1, "dict": 1, "block": 1}
    assert ds.stats.bytes["block"] == ds.shards[1].block_range(2).size

    ds.reset_stats()
    assert same([ds[i] for i in range(116, 124)], examples[116:124])  # the whole of that block: no request
    assert ds.stats.total_requests == 0

    scan = ar.open(url, storage_options=backend.options, cache_bytes=0)
    scan.reset_stats()
    assert same(list(scan.iter(100, 200)), examples[100:200])  # one whole shard, in order
    shard = scan.shards[1]
    assert scan.stats.bytes["block"] == int(shard.offsets[-1]), "every byte of the shard's blocks, once"
    assert scan.stats.requests["block"] == 1 and scan.stats.requests["index"] == 1


def test_missing_dataset(backend):
    url = backend.url("nothing-here")
    with pytest.raises(ar.DatasetNotFoundError, match="not an Atlas dataset, or not committed yet") as info:
        ar.open(url, storage_options=backend.options)
    assert url in str(info.value)


def test_missing_shard(backend, tmp_path):
    examples = sample_examples(300)
    url = make_dataset(backend, tmp_path, "ds", examples)
    backend.remove("ds/1")
    ds = ar.open(url, storage_options=backend.options)
    if backend.lists:  # served as the original reader serves it: the remaining shards, in order
        assert len(ds) == 200 and [s.number for s in ds.shards] == [0, 2]
        assert same(ds[:], examples[:100] + examples[200:])
    else:  # no listing: the shard is known missing when first touched, and the error says which
        assert len(ds) == 300 and same(ds[99], examples[99])
        with pytest.raises(
            ar.ObjectNotFoundError, match=r"ds/1/atlas_blocks.npy.*manifest lists shard 1.*atlas-remote index"
        ):
            ds[100]
    if backend.writable:  # re-indexed: the shards present, served in order, with the manifest's quick open
        ar.add_manifest(url, backend.options)
        again = ar.open(url, storage_options=backend.options)
        assert len(again) == 200 and same(again[:], examples[:100] + examples[200:])


def test_corrupt_and_truncated_data_are_named(backend, tmp_path):
    url = make_dataset(backend, tmp_path, "ds", sample_examples(300))
    data = f"{backend.fs_base}/ds/2/data.bin"
    raw = backend.fs.cat_file(data)
    backend.fs.pipe_file(data, raw[:-7] + bytes(7))  # same size, last block's tail zeroed
    ds = ar.open(url, storage_options=backend.options)
    with pytest.raises(ar.CorruptBlockError, match="checksum mismatch") as corrupt:
        ds[299]
    err = corrupt.value
    assert (err.url, err.path, err.shard, err.block) == (url, "2/data.bin", "2", 12)
    assert err.byte_range[1] == len(raw) and str(err).startswith(f"{url}/2/data.bin: shard 2 block 12 bytes [")
    backend.fs.pipe_file(data, raw[:-7])  # shorter than the index says
    with pytest.raises(ar.FormatError, match=f"the blocks end at byte {len(raw)} .*index.npy does not match") as bad:
        ar.open(url, storage_options=backend.options)[299]
    assert (bad.value.url, bad.value.path, bad.value.shard) == (url, "2/index.npy", "2")


@pytest.mark.parametrize("kind", ["s3", "gcs", "azure"])
def test_missing_bucket(request, kind):
    options = request.getfixturevalue(kind)[0]
    url = f"{SCHEMES[kind]}://no-such-bucket-atlas/ds"
    with pytest.raises(ar.BucketNotFoundError, match="bucket 'no-such-bucket-atlas' does not exist") as missing:
        ar.open(url, storage_options=options)
    assert isinstance(missing.value, ar.DatasetNotFoundError) and isinstance(missing.value, ar.ObjectNotFoundError)
    assert missing.value.url == url


def test_writer_refuses_a_committed_dataset_everywhere(backend, tmp_path):
    if not backend.writable:
        with pytest.raises(ar.StorageError, match="read-only"):
            ar.AtlasDatasetWriter(backend.url("ds"), 20, 5, storage_options=backend.options)
        return
    url = make_dataset(backend, tmp_path, "ds", sample_examples(50), shard_size=20, block_size=5)
    with pytest.raises(ar.DatasetExistsError):
        ar.AtlasDatasetWriter(url, 20, 5, storage_options=backend.options)
    with ar.AtlasDatasetWriter(url, 20, 5, storage_options=backend.options, overwrite=True) as writer:
        writer.add_example("only")
    assert ar.open(url, storage_options=backend.options)[:] == ["only"]
