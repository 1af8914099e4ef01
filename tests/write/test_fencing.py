"""A writer frozen past its lease destroys nothing; a journal planted in the staging folder is never executed.

Writer A (overwrite=True, a 2 s lease) stops itself (SIGSTOP, from tests/crash_hooks) right after a step of its
commit. Its lease goes stale; a second actor works at the URL: `recover`, or writer B
that is still writing when A wakes. A is then resumed. The URL must serve one whole dataset (A's, finished by
recover, or B's), A must stop with DatasetLockedError, and a last recover must find nothing to do.
"""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import textwrap
import time

import pytest
from conftest import TESTS
from helpers import crash_env, same, sample_examples, write_dataset

import atlas_remote as ar

OLD = sample_examples(40, seed=1)
A = sample_examples(150, seed=2)
B = sample_examples(90, seed=3)
LEASE_SECONDS = 2.0

WRITER_A = textwrap.dedent("""
    import json, sys
    sys.path.insert(0, sys.argv[3])
    import atlas_remote as ar
    from helpers import sample_examples
    options = json.loads(sys.argv[2]) or None
    w = ar.AtlasDatasetWriter(sys.argv[1], 50, 5, storage_options=options, overwrite=True, lease_seconds=float(sys.argv[4]))
    for example in sample_examples(150, seed=2):
        w.add_example(example)
    try:
        w.close()
    except ar.DatasetLockedError as err:
        print("fenced:", err.problem)
        sys.exit(3)
    print("committed")
""")


def served(url, options) -> str:
    examples = ar.open(url, storage_options=options)[:]
    for name, expected in (("old", OLD), ("A", A), ("B", B)):
        if same(examples, expected):
            return name
    raise AssertionError("a reader saw a mix of datasets")


def wait_stopped(process: subprocess.Popen, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with open(f"/proc/{process.pid}/stat") as stat:
            if stat.read().rsplit(")", 1)[1].split()[0] == "T":
                return
        assert process.poll() is None, process.communicate()
        time.sleep(0.05)
    raise AssertionError("writer A never reached its step")


STEPS = ["journal-written", "old-meta-removed", "old-files-removed", "first-file-placed", "files-placed"]
STEPS += ["meta-written", "journal-removed"]


QUICK_S3_STEPS = ["journal-written", "files-placed", "journal-removed"]  # the other four on S3 are marked slow
CASES = [
    pytest.param(where, step, marks=pytest.mark.slow if where == "s3" and step not in QUICK_S3_STEPS else ())
    for where in ("local", "s3")
    for step in STEPS
]


@pytest.fixture
def location(request, tmp_path):
    if request.param == "local":
        return str(tmp_path / "place"), None
    options, bucket, _ = request.getfixturevalue("s3")
    return f"s3://{bucket}/place", options


@pytest.mark.parametrize("actor", ["recover", "writer"])
@pytest.mark.parametrize(("location", "step"), CASES, indirect=["location"])
def test_a_writer_frozen_past_its_lease_destroys_nothing(location, step, actor):
    url, options = location
    write_dataset(url, OLD, 30, 3, options)
    env = crash_env(stop_at=step)
    a = subprocess.Popen(
        [sys.executable, "-c", WRITER_A, url, json.dumps(options), str(TESTS), str(LEASE_SECONDS)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_stopped(a)
        time.sleep(LEASE_SECONDS + 0.5)  # A's lease is now stale
        if actor == "recover":
            ar.recover(url, storage_options=options)
            expected = "A"  # recover finished A's commit (or A had finished it)
        else:
            writer = ar.AtlasDatasetWriter(url, 30, 3, storage_options=options, overwrite=True)
            for example in B[:45]:
                writer.add_example(example)
        a.send_signal(signal.SIGCONT)
        out, err = a.communicate(timeout=120)
        if actor == "writer":
            for example in B[45:]:
                writer.add_example(example)
            writer.close()
            expected = "B"
    finally:
        if a.poll() is None:
            a.kill()
            a.wait()
    assert a.returncode == 3 and "fenced: this writer's lease was taken over" in out, (a.returncode, out, err)
    assert served(url, options) == expected
    assert ar.recover(url, storage_options=options).actions == []


def test_a_planted_journal_is_refused_and_touches_nothing(tmp_path):
    root = tmp_path / "bucket" / "ds"
    write_dataset(str(root), OLD, 30, 3)
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "data.bin").write_bytes(b"precious")
    staging = root / ".atlas-staging" / "t0"
    staging.mkdir(parents=True)
    journal = {
        "token": "t0",
        "shard_files": [["data.bin"], ["../../../outside_written.txt"]],
        "shared_dict": False,
        "root_meta": json.dumps({"version": 1, "shard_sizes": [1, 1], "compression_strategy": 0}),
        "shard_folders": ["../../../victim", "x"],
    }
    (staging / "commit.json").write_text(json.dumps(journal))
    before = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*"))
    with pytest.raises(ar.FormatError, match="refusing the commit journal.*not a shard file") as refused:
        ar.recover(str(root))
    assert "\n" not in str(refused.value)
    with pytest.raises(ar.FormatError, match="refusing the commit journal"):
        ar.AtlasDatasetWriter(str(root), 10, 1, overwrite=True)
    assert sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*")) == before
    assert (victim / "data.bin").read_bytes() == b"precious" and served(str(root), None) == "old"
    journal["shard_files"] = [["data.bin"], ["data.bin"]]
    (staging / "commit.json").write_text(json.dumps(journal))
    with pytest.raises(ar.FormatError, match="shard folder '../../../victim'"):
        ar.recover(str(root))
    assert sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*")) == before


def stale_lease(**fields) -> bytes:
    record = {"token": "t", "host": "elsewhere", "pid": 4242, "purpose": "a writer", "started": "then"}
    return json.dumps({**record, "renewed": 0.0, "ttl": 1.0, **fields}).encode()


@pytest.mark.parametrize(
    "lease",
    [
        pytest.param(b"[" * 100_000 + b"]" * 100_000, id="nested 100,000 deep"),
        pytest.param(stale_lease(renewed="yesterday"), id="renewed is text"),
        pytest.param(
            stale_lease(pid=10**30, host=socket.gethostname(), renewed=time.time(), ttl=3600.0),
            id="a pid os.kill cannot take",
        ),
        pytest.param(stale_lease(ttl=float("nan")), id="NaN ttl"),
        pytest.param(b"\xff\xfe not even text", id="not UTF-8"),
    ],
)
def test_an_unreadable_lease_is_a_stale_one(tmp_path, lease):
    """A lease file is data in someone's bucket: whatever it holds, recover and writers take it as stale (never a
    RecursionError or a TypeError from its fields)."""
    url = write_dataset(str(tmp_path / "ds"), OLD, 30, 3)
    (tmp_path / "ds" / ".atlas-lease").write_bytes(lease)
    report = ar.recover(url)
    assert [action for action in report.actions if "stale lease" in action], report
    (tmp_path / "ds" / ".atlas-lease").write_bytes(lease)
    write_dataset(url, A, 50, 5, overwrite=True)
    assert served(url, None) == "A"


def test_recover_says_once_that_it_cleared_a_stale_lease(tmp_path):
    """The lease module logged a warning and recover reported the same line: `atlas-remote recover` said it twice."""
    url = write_dataset(str(tmp_path / "ds"), OLD, 30, 3)
    (tmp_path / "ds" / ".atlas-lease").write_bytes(stale_lease())
    done = subprocess.run(
        [sys.executable, "-m", "atlas_remote.cli", "recover", url], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert (done.stdout + done.stderr).count("stale lease") == 1, (done.stdout, done.stderr)
