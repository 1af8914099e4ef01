"""Overwrite never loses both datasets; one writer per URL; recover finishes what a crash left.

Every commit step is killed once (SIGKILL, from tests/crash_hooks), locally and on
S3: the URL then serves the old dataset or the new one exactly, or nothing until `recover`, and after recover
the new one exactly. Files that are not Atlas files are never deleted.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
import time

import fsspec
import pytest
from conftest import SCHEMES, TESTS, Faults
from helpers import crash_env, same, sample_examples, tree

import atlas_remote as ar
from atlas_remote import CompressionStrategy as CS
from atlas_remote.format.names import LEASE
from atlas_remote.storage import Store

OLD = sample_examples(120, seed=1)  # 12 shards of 10: folders 00..11, a dictionary in each
NEW = sample_examples(150, seed=2)  # 3 shards of 50: folders 0..2, one shared dictionary


def write_old(url, options=None):
    with ar.AtlasDatasetWriter(url, 10, 1, CS.DICTIONARY_COMPRESSION, storage_options=options) as w:
        for example in OLD:
            w.add_example(example)


def state(url, options=None) -> str:
    """'old', 'new' or 'none': what a reader at the URL sees (anything else fails the test)."""
    try:
        examples = ar.open(url, storage_options=options)[:]
    except ar.DatasetNotFoundError:
        return "none"
    if same(examples, OLD):
        return "old"
    assert same(examples, NEW), "a reader saw a mix of two datasets"
    return "new"


OVERWRITER = textwrap.dedent("""
    import json, sys
    sys.path.insert(0, sys.argv[3])
    import atlas_remote as ar
    from helpers import sample_examples
    options = json.loads(sys.argv[2]) or None
    with ar.AtlasDatasetWriter(sys.argv[1], 50, 5, storage_options=options, overwrite=True) as w:
        for example in sample_examples(150, seed=2):
            w.add_example(example)
    print("committed")
""")

# each step, and what a reader sees when the writer is killed right after it (before recover)
STEPS = {
    "journal-written": "old",
    "old-meta-removed": "none",
    "old-files-removed": "none",
    "first-file-placed": "none",
    "files-placed": "none",
    "meta-written": "new",
    "journal-removed": "new",
    "staging-removed": "new",
}


@pytest.fixture(params=["local", "s3", "azure"])
def writable(request, tmp_path):
    """(URL of a fresh, empty location, storage_options): a local folder, an S3 bucket, an Azure container."""
    if request.param == "local":
        return str(tmp_path / "place"), None
    options, bucket, _ = request.getfixturevalue(request.param)
    return f"{SCHEMES[request.param]}://{bucket}/place", options


QUICK_REMOTE_STEPS = ["journal-written", "files-placed", "meta-written"]  # each answer once; the rest are slow
KILLED_AT = [
    pytest.param(place, step, marks=pytest.mark.slow if place != "local" and step not in QUICK_REMOTE_STEPS else ())
    for place in ("local", "s3", "azure")
    for step in STEPS
]


@pytest.mark.parametrize("writable, step", KILLED_AT, indirect=["writable"])
def test_a_commit_killed_at_any_step_serves_old_or_new_and_recover_gives_new(writable, step):
    url, options = writable
    write_old(url, options)
    fs, root = fsspec.core.url_to_fs(url, **(options or {}))
    fs.pipe_file(f"{root}/README.txt", b"mine")
    run = subprocess.run(
        [sys.executable, "-c", OVERWRITER, url, json.dumps(options), str(TESTS)],
        env=crash_env(kill_at=step),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == -9, run.stderr  # killed by the hook, at that step
    assert state(url, options) == STEPS[step]
    report = ar.recover(url, storage_options=options)
    assert state(url, options) == "new", report
    left = tree(url, options)
    assert left.pop("README.txt") == b"mine", "files that are not Atlas files are never deleted"
    assert sorted({p.split("/")[0] for p in left}) == [
        "0",
        "1",
        "2",
        "atlas_manifest.npz",
        "meta.json",
        "zstd_dict.bin",
    ]
    assert ar.recover(url, storage_options=options).actions == []


def test_a_writer_killed_before_its_commit_leaves_the_old_dataset(writable):
    url, options = writable
    write_old(url, options)
    proc = subprocess.Popen(
        [
            sys.executable,
            "-c",
            textwrap.dedent("""
        import json, os, signal, sys
        sys.path.insert(0, sys.argv[3])
        import atlas_remote as ar
        from helpers import sample_examples
        w = ar.AtlasDatasetWriter(sys.argv[1], 50, 10, storage_options=json.loads(sys.argv[2]) or None, overwrite=True)
        for example in sample_examples(120, seed=9):
            w.add_example(example)
        w._part._wait_for_upload()
        os.kill(os.getpid(), signal.SIGKILL)
    """),
            url,
            json.dumps(options),
            str(TESTS),
        ]
    )
    assert proc.wait(timeout=120) == -9
    assert state(url, options) == "old", "the committed dataset is untouched by a writer that never committed"
    with ar.AtlasDatasetWriter(url, 50, 10, storage_options=options, overwrite=True) as w:  # recovers first
        w.add_example("after")
    assert ar.open(url, storage_options=options)[:] == ["after"]
    assert not any(p.startswith((".atlas-staging", LEASE)) for p in tree(url, options))


def test_overwrite_keeps_other_files_and_checks_before_deleting(tmp_path):
    url = str(tmp_path / "ds")
    write_old(url)
    (tmp_path / "ds" / "README.txt").write_text("mine")
    with ar.AtlasDatasetWriter(url, 50, 5, overwrite=True) as w:
        for example in NEW:
            w.add_example(example)
    assert state(url) == "new" and (tmp_path / "ds" / "README.txt").read_text() == "mine"
    assert sorted(os.listdir(url)) == ["0", "1", "2", "README.txt", "atlas_manifest.npz", "meta.json", "zstd_dict.bin"]
    with pytest.raises(ar.DatasetExistsError, match="overwrite=True") as refused:  # refused before anything changes
        ar.AtlasDatasetWriter(url, 50, 10)
    assert refused.value.url == url and state(url) == "new"


def test_copies_failing_midway_lose_nothing(s3, proxy_endpoint):
    options, bucket, fs = s3
    url, through = f"s3://{bucket}/ds", {**options, "endpoint_url": proxy_endpoint}
    write_old(url, options)
    faults = Faults(proxy_endpoint)
    faults.set({"method": "PUT", "path": r"/ds/1/", "fault": "500", "times": 1000})  # shard 1's copies fail
    try:
        with pytest.raises(ar.CommitInterruptedError) as interrupted:
            with ar.AtlasDatasetWriter(url, 50, 5, storage_options=through, overwrite=True) as w:
                for example in NEW:
                    w.add_example(example)
        assert faults.report()["injected"]["500"] >= 1
    finally:
        faults.set()
    assert interrupted.value.url == url
    assert state(url, options) == "none"
    with pytest.raises(ar.DatasetExistsError):  # the next writer finishes the commit first: the new one is there
        ar.AtlasDatasetWriter(url, 50, 10, storage_options=options)
    assert state(url, options) == "new"


# -- one writer per URL ---------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["local", "memory", "s3", "gcs", "azure"])
def test_a_second_writer_is_refused_naming_the_holder(kind, request, tmp_path):
    if kind == "local":
        url, options = str(tmp_path / "ds"), None
    elif kind == "memory":
        url, options = request.getfixturevalue("memory_url"), None
    else:
        options, bucket, _ = request.getfixturevalue(kind)
        url = f"{SCHEMES[kind]}://{bucket}/ds"
    first = ar.AtlasDatasetWriter(url, 50, 10, storage_options=options)
    first.add_example("first")
    with pytest.raises(ar.DatasetLockedError, match="another writer holds this URL") as locked:
        ar.AtlasDatasetWriter(url, 50, 10, storage_options=options)
    assert locked.value.holder == f"AtlasDatasetWriter (pid {os.getpid()} on {socket.gethostname()})"
    assert locked.value.started and locked.value.url == url
    with pytest.raises(ar.DatasetLockedError):
        ar.recover(url, storage_options=options)  # a live writer's lease is not broken without force
    first.close()  # the first writer's staging survived the refused ones
    assert ar.open(url, storage_options=options)[:] == ["first"]
    store = Store(url, options)
    assert not store.exists(LEASE)
    assert store.atomic_create and store.create("probe", b"1") and not store.create("probe", b"2")
    assert store.read("probe", "meta") == b"1"


def test_a_stale_lease_is_taken_over_and_recover_clears_it(tmp_path):
    url = str(tmp_path / "ds")
    os.makedirs(url)
    stale = {
        "token": "t",
        "host": "another-machine",
        "pid": 1,
        "purpose": "AtlasDatasetWriter",
        "started": "2026-01-01T00:00:00+00:00",
        "renewed": time.time() - 3600,
        "ttl": 600.0,
    }
    (tmp_path / "ds" / LEASE).write_text(json.dumps(stale))
    report = ar.recover(url)  # takes the stale lease over, then gives it back
    assert report.actions == [
        "cleared the stale lease of AtlasDatasetWriter (pid 1 on another-machine), since 2026-01-01T00:00:00+00:00"
    ]
    assert not (tmp_path / "ds" / LEASE).exists()
    stale["renewed"] = time.time()  # a live writer on another machine
    (tmp_path / "ds" / LEASE).write_text(json.dumps(stale))
    with pytest.raises(ar.DatasetLockedError, match="pid 1 on another-machine.* since 2026-01-01"):
        ar.AtlasDatasetWriter(url, 10, 2)
    assert ar.recover(url, force=True).actions[0].startswith("broke the writer's lease")
    with ar.AtlasDatasetWriter(url, 10, 2) as w:
        w.add_example(1)
    assert ar.open(url)[:] == [1]


def test_a_lease_taken_over_means_no_commit(tmp_path):
    url = str(tmp_path / "ds")
    w = ar.AtlasDatasetWriter(url, 10, 2)
    w.add_example(1)
    os.remove(os.path.join(url, LEASE))  # as a takeover after expiry would
    ar.AtlasDatasetWriter(url, 10, 2).discard()
    with pytest.raises(ar.DatasetLockedError, match="lease was taken over"):
        w.close()
    with pytest.raises(ar.DatasetNotFoundError):
        ar.open(url)


# -- errors a user can act on ---------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["s3", "gcs", "azure"])
def test_a_missing_bucket_is_named_before_any_work(kind, request):
    options = request.getfixturevalue(kind)[0]
    url = f"{SCHEMES[kind]}://no-such-bucket-atlas/ds"
    with pytest.raises(ar.BucketNotFoundError, match="bucket 'no-such-bucket-atlas' does not exist") as missing:
        ar.AtlasDatasetWriter(url, 10, 2, storage_options=options)
    assert missing.value.url == url


@pytest.fixture
def range_ignoring_server(tmp_path):
    """`python -m http.server` on a free loopback port: it answers every GET with the whole file."""
    from conftest import free_port, stop, wait_until_up

    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1", "--directory", str(tmp_path)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    wait_until_up(f"http://127.0.0.1:{port}/", proc)
    yield f"http://127.0.0.1:{port}", tmp_path
    stop(proc)


def test_a_server_that_ignores_range_is_named_at_once(range_ignoring_server):
    base, folder = range_ignoring_server
    with ar.AtlasDatasetWriter(str(folder / "ds"), 100, 10) as w:
        for example in sample_examples(300):
            w.add_example(example)
    ds = ar.open(f"{base}/ds", retries=4)
    with pytest.raises(ar.RangeNotSupportedError, match="this server ignores Range requests") as refused:
        ds[150]
    err = refused.value
    assert (err.url, err.path, err.shard, err.block) == (f"{base}/ds", "1/data.bin", "1", 5)
    assert ds.stats.requests["block"] == 1 and ds.stats.retries == 0, "detected on the first answer, never retried"
    with pytest.raises(ar.RangeNotSupportedError):
        ds[250]
    assert ds.stats.requests["block"] == 1, "never downloaded again"


def test_a_short_answer_says_shorter(tmp_path):
    from atlas_remote.storage.ranges import ByteRange

    (tmp_path / "obj").write_bytes(b"x" * 10)
    with pytest.raises(ar.TruncatedReadError, match="shorter than the range") as short:
        Store(str(tmp_path)).read_ranges([ByteRange("obj", 5, 20)], "block")
    assert short.value.byte_range == (5, 20) and short.value.path == "obj"


def test_demo_refuses_an_existing_dataset_unless_overwrite(tmp_path):
    url = str(tmp_path / "demo")
    command = [sys.executable, "-m", "atlas_remote.cli", "demo", "--url", url]
    assert subprocess.run(command, capture_output=True, timeout=120).returncode == 0
    refused = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert refused.returncode == 1 and "already holds a committed Atlas dataset" in refused.stderr
    assert "writing" not in refused.stdout, "refused before announcing any work"
    assert subprocess.run(command + ["--overwrite"], capture_output=True, timeout=120).returncode == 0


def test_errors_keep_their_attributes_across_processes():
    import pickle

    err = ar.CorruptBlockError(
        "checksum mismatch", url="s3://b/ds", path="0/data.bin", shard="0", block=3, byte_range=(10, 20)
    )
    back = pickle.loads(pickle.dumps(err))
    assert type(back) is ar.CorruptBlockError and back.__dict__ == err.__dict__ and str(back) == str(err)
    assert str(err) == "s3://b/ds/0/data.bin: shard 0 block 3 bytes [10, 20): checksum mismatch"
