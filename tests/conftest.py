"""Test session: an S3 endpoint (moto's server) on 127.0.0.1 on a free port, started here and stopped here."""

from __future__ import annotations

import itertools
import os
import socket
import subprocess
import sys
import time
import urllib.request

import pytest

# Credentials for the local endpoint only; set before any client reads the environment.
os.environ.update(AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing", AWS_DEFAULT_REGION="us-east-1")
os.environ.setdefault("AWS_CONFIG_FILE", os.devnull)
os.environ.setdefault("AWS_SHARED_CREDENTIALS_FILE", os.devnull)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until_up(url: str, process: subprocess.Popen, seconds: float = 60) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"test server exited early with code {process.returncode}")
        try:
            urllib.request.urlopen(url, timeout=1)
            return
        except OSError as err:
            if getattr(err, "code", None):  # an HTTP error status means the server answers
                return
            time.sleep(0.1)
    raise RuntimeError(f"test server at {url} did not start within {seconds}s")


@pytest.fixture(scope="session")
def s3_endpoint():
    """URL of a moto S3 server on loopback, for the whole session."""
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    endpoint = f"http://127.0.0.1:{port}"
    try:
        wait_until_up(f"{endpoint}/moto-api/", process)
        yield endpoint
    finally:
        process.terminate()
        process.wait(timeout=10)


_buckets = itertools.count()


@pytest.fixture
def s3(s3_endpoint):
    """(storage_options, fresh bucket name, filesystem) on the session's S3 endpoint."""
    import s3fs

    options = {"endpoint_url": s3_endpoint, "key": "testing", "secret": "testing"}
    fs = s3fs.S3FileSystem(**options, use_listings_cache=False, skip_instance_cache=True)
    bucket = f"test-{os.getpid()}-{next(_buckets)}"
    fs.mkdir(bucket)
    return options, bucket, fs


@pytest.fixture
def memory_url(request):
    """A fresh memory:// root, removed after the test."""
    import fsspec

    fs = fsspec.filesystem("memory")
    root = f"/t{os.getpid()}-{request.node.name}".replace("[", "-").replace("]", "")
    yield f"memory://{root}"
    if fs.exists(root):
        fs.rm(root, recursive=True)
