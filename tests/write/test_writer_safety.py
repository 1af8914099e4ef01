"""The writer commits atomically: a reader sees the whole dataset or none of it, and nothing is lost."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import pytest
from helpers import same, sample_examples, tree, tries
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import atlas_remote as ar
from atlas_remote import CompressionStrategy as CS


def write(url, examples, storage_options=None, **kw):
    with ar.AtlasDatasetWriter(
        url, 50, 10, CS.SHARED_DICTIONARY_COMPRESSION, storage_options=storage_options, **kw
    ) as w:
        for example in examples:
            w.add_example(example)


def test_dataset_is_invisible_until_commit_and_exception_discards(s3):
    options, bucket, fs = s3
    url = f"s3://{bucket}/ds"
    writer = ar.AtlasDatasetWriter(url, 50, 10, storage_options=options)
    for example in sample_examples(180):
        writer.add_example(example)
    writer._part._wait_for_upload()
    assert fs.find(f"{bucket}/ds/.atlas-staging"), "finished shards leave the machine before close()"
    with pytest.raises(ar.DatasetNotFoundError):
        ar.open(url, storage_options=options)
    writer.discard()
    assert fs.find(f"{bucket}/ds") == []

    with pytest.raises(RuntimeError, match="boom"):
        with ar.AtlasDatasetWriter(url, 50, 10, storage_options=options) as w:
            for example in sample_examples(120):
                w.add_example(example)
            raise RuntimeError("boom")
    assert fs.find(f"{bucket}/ds") == []


def test_refuses_committed_dataset_unless_overwrite(tmp_path):
    url = str(tmp_path / "ds")
    old, new = sample_examples(120, seed=1), sample_examples(70, seed=2)
    write(url, old)
    with pytest.raises(ar.DatasetExistsError, match="overwrite=True"):
        ar.AtlasDatasetWriter(url, 50, 10)
    writer = ar.AtlasDatasetWriter(url, 50, 10, overwrite=True)
    for example in new:
        writer.add_example(example)
    assert same(ar.open(url)[:], old), "the old dataset stays readable until the new one commits"
    writer.close()
    ds = ar.open(url)
    assert same(ds[:], new) and [s.name for s in ds.shards] == ["0", "1"]


def test_failed_overwrite_keeps_the_old_dataset(tmp_path):
    url = str(tmp_path / "ds")
    old = sample_examples(120, seed=1)
    write(url, old)
    with pytest.raises(KeyError), ar.AtlasDatasetWriter(url, 50, 10, overwrite=True) as w:
        w.add_example(1)
        raise KeyError("interrupted")
    assert same(ar.open(url)[:], old)


def test_unpicklable_examples_are_refused_with_their_block_and_nothing_else_is_lost(memory_url):
    """Blocks are pickled once: three unpicklable examples given after example 54 are found when their block
    (50-59) fills, by the call that fills it; they are named, dropped, and the rest of the block waits."""
    examples = sample_examples(60)
    raised = []
    with ar.AtlasDatasetWriter(memory_url, 50, 10) as w:
        for i, example in enumerate(examples):
            try:
                w.add_example(example)
            except ar.UnpicklableExampleError as bad:
                raised.append((i, bad))
            if i == 54:
                for _ in range(3):
                    w.add_example(lambda: None)  # add calls 55, 56, 57
    assert [i for i, _ in raised] == [56], "the call that filled the block (example 56 is kept all the same)"
    bad = raised[0][1]
    assert (bad.url, bad.example_index, bad.refused) == (memory_url, 55, [55, 56, 57])
    assert "example #55 (and #56, #57 of the same block)" in str(bad) and "cannot be pickled" in str(bad)
    assert same(ar.open(memory_url)[:], examples)


def test_an_unpicklable_example_in_the_last_block_is_refused_by_close_and_the_writer_stays_open(tmp_path):
    url = str(tmp_path / "ds")
    writer = ar.AtlasDatasetWriter(url, 50, 10)
    writer.add_examples([1, 2, lambda: None, 3])
    with pytest.raises(ar.UnpicklableExampleError, match="example #2 ") as bad:
        writer.close()
    assert bad.value.refused == [2]
    with pytest.raises(ar.DatasetNotFoundError):
        ar.open(url)
    writer.close()  # the others
    assert ar.open(url)[:] == [1, 2, 3]
    with pytest.raises(ar.UnpicklableExampleError):  # in a with block, close() failing discards
        with ar.AtlasDatasetWriter(str(tmp_path / "other"), 50, 10) as w:
            w.add_example(lambda: None)
    with pytest.raises(ar.DatasetNotFoundError):
        ar.open(str(tmp_path / "other"))
    assert not (tmp_path / "other" / ".atlas-lease").exists()


@settings(max_examples=tries(40), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    bad=st.lists(st.booleans(), max_size=30),
    shard_size=st.integers(1, 9),
    block_size=st.integers(1, 4),
    in_bulk=st.booleans(),
)
def test_refused_examples_leave_exactly_the_dataset_of_the_others(
    tmp_path_factory, bad, shard_size, block_size, in_bulk
):
    """Whatever examples cannot be pickled, wherever they fall: each is named once, and the files are byte for
    byte those of a writer given only the others."""
    folder = tmp_path_factory.mktemp("refused")
    examples = [(lambda: None) if is_bad else n for n, is_bad in enumerate(bad)]
    refused: list[int] = []
    writer = ar.AtlasDatasetWriter(str(folder / "ds"), shard_size, block_size, CS.STANDARD_COMPRESSION, checksums=False)
    rest = iter(examples)
    while True:
        try:
            if in_bulk:
                writer.add_examples(rest)
            else:
                for example in rest:
                    writer.add_example(example)
            writer.close()
            break
        except ar.UnpicklableExampleError as error:
            refused += error.refused
    assert refused == [n for n, is_bad in enumerate(bad) if is_bad]
    good = [n for n, is_bad in enumerate(bad) if not is_bad]
    with ar.AtlasDatasetWriter(
        str(folder / "good"), shard_size, block_size, CS.STANDARD_COMPRESSION, checksums=False
    ) as w:
        w.add_examples(good)
    assert ar.open(str(folder / "ds"))[:] == good
    assert tree(str(folder / "ds")) == tree(str(folder / "good"))


def test_refuses_a_folder_that_is_not_a_dataset(tmp_path):
    (tmp_path / "ds").mkdir()
    (tmp_path / "ds" / "notes.txt").write_text("mine")
    (tmp_path / "ds" / "2023").mkdir()
    (tmp_path / "ds" / "2023" / "photo.jpg").write_text("mine")
    with pytest.raises(ar.DatasetExistsError, match="not empty"):
        ar.AtlasDatasetWriter(str(tmp_path / "ds"), 10, 2)
    assert (tmp_path / "ds" / "2023" / "photo.jpg").exists()


def test_bad_writer_arguments():
    for kwargs in (
        {"shard_size": 0, "block_size": 1},
        {"shard_size": 1, "block_size": 0},
        {"shard_size": 1, "block_size": 1, "compression_dict_size": 2.0},
    ):
        with pytest.raises(ValueError):
            ar.AtlasDatasetWriter("memory://never-created", **kwargs)


CRASHING_WRITER = textwrap.dedent("""
    import sys, time, atlas_remote as ar
    sys.path.insert(0, sys.argv[3])
    from helpers import sample_examples
    options = {"endpoint_url": sys.argv[2], "key": "testing", "secret": "testing"} if sys.argv[2] else None
    w = ar.AtlasDatasetWriter(sys.argv[1], 50, 10, storage_options=options)
    for i, example in enumerate(sample_examples(10_000)):
        w.add_example(example)
        if i == 160:
            w._part._wait_for_upload()
            print("staged", flush=True)
            time.sleep(60)
""")


@pytest.mark.parametrize("where", ["local", "s3"])
def test_killed_writer_leaves_nothing_openable_and_a_rerun_cleans_up(tmp_path, where, request):
    if where == "s3":
        options, bucket, fs = request.getfixturevalue("s3")
        url, endpoint = f"s3://{bucket}/ds", options["endpoint_url"]
    else:
        options, url, endpoint = None, str(tmp_path / "ds"), ""
    tests_dir = os.path.dirname(os.path.dirname(__file__))
    proc = subprocess.Popen(
        [sys.executable, "-c", CRASHING_WRITER, url, endpoint, tests_dir], stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout.readline().strip() == "staged"
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    with pytest.raises(ar.DatasetNotFoundError):
        ar.open(url, storage_options=options)
    examples = sample_examples(75)
    write(url, examples, storage_options=options)
    ds = ar.open(url, storage_options=options)
    assert same(ds[:], examples)
    import fsspec

    fs, root = fsspec.core.url_to_fs(url, **(options or {}))
    names = sorted(p.rstrip("/").rsplit("/", 1)[-1] for p in fs.ls(root, detail=False, refresh=True))
    assert names == [
        "0",
        "1",
        "atlas_manifest.npz",
        "meta.json",
    ]  # 5 blocks in shard 0: standard compression, no dictionary
