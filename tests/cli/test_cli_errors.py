"""Every error that reaches the command line is one line naming the URL and what to do, whichever client raised
it: bad credentials (moto with authentication enforced), an unknown storage option, an unreachable endpoint."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request

import pytest
from test_cli import shell

import atlas_remote as ar


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def strict_moto():
    """A moto server that checks every request's signature against its IAM users (it has none)."""
    port = free_port()
    env = {**os.environ, "INITIAL_NO_AUTH_ACTION_COUNT": "0"}
    server = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/moto-api/", timeout=1)
                break
            except OSError:
                assert time.monotonic() < deadline and server.poll() is None, "moto did not start"
                time.sleep(0.2)
        yield f"http://127.0.0.1:{port}"
    finally:
        server.terminate()
        server.wait(timeout=10)


def one_line_error(done: subprocess.CompletedProcess) -> str:
    assert done.returncode == 1, (done.returncode, done.stdout, done.stderr)
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("atlas-remote: error: "), done.stderr
    return lines[0]


# s3:// reads go through obstore where it serves the options; an option it is not told about leaves them to s3fs
CLIENTS = {"obstore": {}, "s3fs": {"version_aware": False}}


@pytest.mark.parametrize("client", CLIENTS)
def test_bad_credentials_are_one_line_that_says_so(client):
    with strict_moto() as endpoint:
        options = json.dumps({"endpoint_url": endpoint, "key": "wrong", "secret": "wrong", **CLIENTS[client]})
        line = one_line_error(shell("info", "s3://some-bucket/ds", "--storage-options", options))
    assert "s3://some-bucket/ds" in line and "Access Key Id" in line and "check the credentials" in line
    assert "<Error>" not in line


def test_an_unknown_storage_option_names_the_nearest_one(s3):
    options, bucket, _ = s3
    bad = json.dumps({**options, "endpoint": "http://127.0.0.1:1"})
    line = one_line_error(shell("info", f"s3://{bucket}/ds", "--storage-options", bad))
    assert "unknown storage option 'endpoint'" in line and "'endpoint_url'" in line, line


@pytest.mark.parametrize("client", CLIENTS)
def test_an_unreachable_endpoint_is_one_message_whichever_client(client):
    url = "s3://bucket/ds"
    options = {"endpoint_url": f"http://127.0.0.1:{free_port()}", "key": "k", "secret": "s", **CLIENTS[client]}
    line = one_line_error(shell("info", url, "--storage-options", json.dumps(options)))
    assert url in line and "cannot reach the storage server" in line and "endpoint URL" in line, line


def test_a_dataset_of_custom_classes_names_the_flag_and_verify_does_not_call_it_damaged(tmp_path):
    """The CLI used to say `allowed_classes=[...]` (a Python argument) and verify reported "3 problem(s)"."""
    url = str(tmp_path / "ds")
    write = (
        "import sys; sys.path.insert(0, sys.argv[2]); import atlas_remote as ar; from tables_maps import Record\n"
        "with ar.AtlasDatasetWriter(sys.argv[1], 10, 2) as w:\n"
        "    [w.add_example(Record(i)) for i in range(6)]\n"
    )
    tests = os.path.dirname(os.path.dirname(__file__))
    subprocess.run([sys.executable, "-c", write, url, tests], check=True, timeout=120)
    env = {"PYTHONPATH": tests}
    line = one_line_error(shell("head", url, env=env))
    assert "tables_maps.Record" in line and "--allow-class" in line, line
    done = shell("head", url, "--allow-class", "tables_maps.Record", env=env)
    assert done.returncode == 0 and "Record" in done.stdout, done.stderr
    checked = shell("verify", url, env=env)
    assert checked.returncode == 1 and "problem" not in checked.stdout, checked.stdout
    assert "3 block(s) hold classes the restricted unpickler refuses, which is not damage" in checked.stdout
    assert shell("verify", url, "--allow-class", "tables_maps.Record", env=env).returncode == 0


def test_an_unreachable_gcs_or_azure_endpoint_is_one_line_soon():
    """gcsfs once logged 500 lines of tracebacks over three minutes (its own six tries with backoff, under ours)."""
    port = free_port()
    for url, options in (
        ("gs://bucket/ds", {"endpoint_url": f"http://127.0.0.1:{port}", "token": "anon"}),
        (
            "az://container/ds",
            {
                "connection_string": f"DefaultEndpointsProtocol=http;AccountName=acct;AccountKey=a2V5;"
                f"BlobEndpoint=http://127.0.0.1:{port}/acct;"
            },
        ),
    ):
        started = time.monotonic()
        line = one_line_error(shell("info", url, "--storage-options", json.dumps(options)))
        assert url in line and "cannot reach the storage server" in line, line
        assert time.monotonic() - started < 60, "our retries only, not a client's beneath them"


def test_missing_objects_are_one_line_whichever_store(s3, tmp_path, http_root):
    """A missing data.bin read through obstore (once 25 lines of Rust debug output), an HTTP 404, and a Megatron
    source with no .idx (once printed as a bare path, its s3:// dropped)."""
    options, bucket, fs = s3
    url = f"s3://{bucket}/ds"
    with ar.AtlasDatasetWriter(url, 10, 2, storage_options=options) as w:
        for i in range(30):
            w.add_example(i)
    fs.rm(f"{bucket}/ds/1/data.bin")
    line = one_line_error(shell("get", url, "15", "--storage-options", json.dumps(options)))
    assert f"{url}/1/data.bin" in line and "shard 1" in line and "not found" in line, line
    base, _ = http_root
    line = one_line_error(shell("info", f"{base}/no-such-dataset"))
    assert "no-such-dataset" in line and "not an Atlas dataset" in line, line
    fs.pipe_file(f"{bucket}/corpus/c.bin", b"\0" * 8)
    source = f"s3://{bucket}/corpus/c"
    line = one_line_error(
        shell("convert", source, str(tmp_path / "out"), "--from", "megatron", "--storage-options", json.dumps(options))
    )
    assert f"{source}.idx" in line and "not found" in line, line


@pytest.mark.parametrize(
    "options",
    [{"endpoint_url": "127.0.0.1:9"}, {"client_kwargs": {"endpoint_url": "127.0.0.1:9"}}],
    ids=["endpoint_url", "client_kwargs"],
)
@pytest.mark.parametrize("client", CLIENTS)
def test_an_endpoint_without_a_scheme_is_one_line_that_says_what_to_write(client, options):
    """Before: with obstore, `pyo3_runtime.PanicException` (a BaseException) and two Rust backtraces, 174 lines."""
    given = json.dumps({**options, "key": "k", "secret": "s", **CLIENTS[client]})
    line = one_line_error(shell("info", "s3://bucket/ds", "--storage-options", given))
    assert "s3://bucket/ds" in line and "'127.0.0.1:9' has no scheme" in line and "'http://127.0.0.1:9'" in line, line


def test_a_url_with_one_slash_says_it_was_read_as_a_local_path(tmp_path):
    """`s3:/bucket/ds` is a local path (a folder named `s3:`): said so, with the URL meant."""
    line = one_line_error(shell("info", "s3:/bucket/ds", cwd=tmp_path))
    assert "read as a local path" in line and "s3://bucket/ds" in line, line
    with pytest.raises(ar.LocationError, match="s3://bucket/ds"):
        ar.AtlasDatasetWriter("s3:/bucket/ds", 10, 2)
