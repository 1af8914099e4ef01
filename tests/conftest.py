"""Test session: the servers the tests need, started here on 127.0.0.1 on free ports and stopped here.

- S3: moto's server (or ATLAS_TEST_S3_ENDPOINT, e.g. a MinIO of your own; credentials from AWS_* variables).
- GCS: gcp-storage-emulator on a threading server (or ATLAS_TEST_GCS_ENDPOINT, e.g. fake-gcs-server).
- Azure Blob: Azurite, Microsoft's emulator (a pinned npm package, installed on first use into a cache folder;
  or ATLAS_TEST_AZURE_CONNECTION_STRING for an account of your own).
- HTTP: a Range-capable static file server (tests/static_server.py), read-only.
- Ray: one local session (ray_session), started by the first test that needs it.
"""

from __future__ import annotations

import fcntl
import itertools
import json
import os
import re
import secrets
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from helpers import tries, upload_tree

# Must be set before gcsfs is imported, or every call waits on a 60 s probe for hierarchical namespaces.
os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")
EXTERNAL_S3 = os.environ.get("ATLAS_TEST_S3_ENDPOINT")
EXTERNAL_GCS = os.environ.get("ATLAS_TEST_GCS_ENDPOINT")
EXTERNAL_AZURE = os.environ.get("ATLAS_TEST_AZURE_CONNECTION_STRING")
AZURITE = "azurite@3.37.0"  # pinned: the emulator the Azure tests were written against
AZURITE_ACCOUNT = "devstoreaccount1"  # Azurite's well-known development account and key (public, documented)
AZURITE_KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
CACHE = Path(os.environ.get("ATLAS_TEST_CACHE", Path.home() / ".cache" / "atlas_remote-tests"))
if not EXTERNAL_S3:  # credentials for the local endpoint only; an external one uses the caller's AWS_* variables
    os.environ.update(AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing", AWS_DEFAULT_REGION="us-east-1")
    os.environ.setdefault("AWS_CONFIG_FILE", os.devnull)
    os.environ.setdefault("AWS_SHARED_CREDENTIALS_FILE", os.devnull)

# Ray, before it is imported: a single-node session whose every server listens on 127.0.0.1 (the setting Ray
# uses on macOS; on Linux it otherwise listens on all interfaces), and no usage reports.
os.environ.update(RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0", RAY_USAGE_STATS_ENABLED="0")

# The user's signing key for the session (keys.py): writers sign with it and readers check with it, and no test
# touches ~/.config. Data written "as a stranger" uses another key (helpers.as_stranger).
os.environ.setdefault("ATLAS_REMOTE_KEY", secrets.token_hex(32))

TESTS = Path(__file__).resolve().parent


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--slow", action="store_true", help="run every tier: the quick, the slow and the wheel's")


def pytest_configure(config: pytest.Config) -> None:
    """Properties at their full count in the slow tier, with --slow and where ATLAS_TEST_PROPERTIES=full (CI), else
    a tenth: helpers.tries for the counts tests give, a profile for the rest (hypothesis's default is 100)."""
    from hypothesis import settings

    if config.getoption("slow") or re.search(r"(?<!not )\bslow\b", config.option.markexpr or ""):
        os.environ["ATLAS_TEST_PROPERTIES"] = "full"
    settings.register_profile("atlas", max_examples=tries(100))
    settings.load_profile("atlas")


LEFT_OUT = ("slow", "wheel")  # tiers `python -m pytest` leaves out: each runs when -m names it, all with --slow


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The quick tier by default: a test marked slow or wheel runs with --slow, when -m names its mark (-m slow: the
    slow tier alone), or when its id is given on the command line. So the unit tier (-m unit) never holds a slow
    test, whatever its module's mark says: it answers in seconds."""
    tiers = left_out_tiers(config)
    named = [arg.split("::", 1) for arg in config.args if "::" in arg]
    named = [(str(Path(path).resolve()), rest) for path, rest in named]

    def left_out(item: pytest.Item) -> bool:
        if not any(item.get_closest_marker(tier) for tier in tiers):
            return False
        path, test = str(item.path), item.nodeid.split("::", 1)[-1]
        return not any(path == where and test.startswith(name) for where, name in named)

    out = [item for item in items if left_out(item)]
    if out:
        config.hook.pytest_deselected(items=out)
        items[:] = [item for item in items if not left_out(item)]


def left_out_tiers(config: pytest.Config) -> list[str]:
    markexpr = config.option.markexpr or ""
    return [] if config.getoption("slow") else [tier for tier in LEFT_OUT if tier not in markexpr]


def pytest_report_header(config: pytest.Config) -> str | None:
    tiers = left_out_tiers(config)
    if not tiers:
        return None
    return f"left out: the tests marked {' and '.join(tiers)} (--slow runs every tier, -m slow the slow tier alone)"


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


def start_server(args: list[str], health_path: str, env: dict | None = None, program: str = sys.executable):
    """Start a server subprocess on a free loopback port; returns (endpoint, process)."""
    port = free_port()
    process = subprocess.Popen(
        [program, *[a.format(port=port) for a in args]],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**os.environ, **(env or {})},
    )
    endpoint = f"http://127.0.0.1:{port}"
    wait_until_up(endpoint + health_path, process)
    return endpoint, process


def stop(process: subprocess.Popen) -> None:
    process.terminate()
    try:
        process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        process.kill()


@pytest.fixture(scope="session")
def s3_endpoint():
    if EXTERNAL_S3:
        yield EXTERNAL_S3
        return
    endpoint, process = start_server(["-m", "moto.server", "-H", "127.0.0.1", "-p", "{port}"], "/moto-api/")
    yield endpoint
    stop(process)


@pytest.fixture(scope="session")
def gcs_endpoint():
    if EXTERNAL_GCS:
        yield EXTERNAL_GCS
        return
    endpoint, process = start_server([str(TESTS / "gcs_server.py"), "{port}"], "/storage/v1/b")
    yield endpoint
    stop(process)


def azurite_program() -> str:
    """Azurite's blob server, installed from the npm registry into the cache folder on first use (about a
    minute, once per machine)."""
    folder = CACHE / AZURITE.replace("@", "-")
    program = folder / "node_modules" / ".bin" / "azurite-blob"
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder.with_suffix(".lock"), "w") as lock:  # the suite's parallel workers install it once
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not program.exists():
            npm = shutil.which("npm")
            if npm is None or shutil.which("node") is None:
                pytest.skip("the Azure tests need Node.js and npm (to run Azurite, Microsoft's emulator)")
            subprocess.run(
                [npm, "install", "--no-save", "--no-audit", "--no-fund", "--prefix", str(folder), AZURITE],
                check=True,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                timeout=600,
            )
    return str(program)


def azurite_connection(endpoint: str) -> str:
    """A connection string to Azurite's development account at an endpoint (Azurite itself, or a proxy)."""
    return (
        f"DefaultEndpointsProtocol=http;AccountName={AZURITE_ACCOUNT};AccountKey={AZURITE_KEY};"
        f"BlobEndpoint={endpoint}/{AZURITE_ACCOUNT};"
    )


@pytest.fixture(scope="session")
def azure_endpoint(tmp_path_factory):
    """Azurite's blob service on a free loopback port (None with ATLAS_TEST_AZURE_CONNECTION_STRING)."""
    if EXTERNAL_AZURE:
        yield None
        return
    location = tmp_path_factory.mktemp("azurite")
    args = ["--blobHost", "127.0.0.1", "--blobPort", "{port}", "--location", str(location), "--silent", "--loose"]
    endpoint, process = start_server(
        [*args, "--skipApiVersionCheck"],  # the SDK may be newer than the pinned emulator
        f"/{AZURITE_ACCOUNT}?comp=list",
        program=azurite_program(),
    )
    yield endpoint
    stop(process)


@pytest.fixture(scope="session")
def azure_connection(azure_endpoint):
    """A connection string to the Azure account the tests use."""
    return EXTERNAL_AZURE or azurite_connection(azure_endpoint)


@pytest.fixture
def azure(azure_connection):
    """(storage_options, fresh container name, filesystem) on the session's Azure endpoint."""
    import adlfs

    options = {"connection_string": azure_connection}
    fs = adlfs.AzureBlobFileSystem(**options, skip_instance_cache=True)
    container = unique("test")
    fs.mkdir(container)
    return options, container, fs


@pytest.fixture(scope="module")
def ray_session():
    """A local Ray session for the module's tests, on loopback, no dashboard, no usage reports; shut down after
    them: Ray's threads must not be in the process when later tests fork DataLoader workers (a forked worker's
    parent once crashed with a segfault while a session was up)."""
    import ray  # the [ray] extra, part of [test]

    # "local": a session of its own even when another pytest worker's session is up (without it, ray.init joins
    # that one through /tmp/ray/ray_current_cluster and refuses num_cpus)
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    assert ray.util.get_node_ip_address() == "127.0.0.1"
    yield ray
    ray.shutdown()


@pytest.fixture(scope="session")
def proxy_endpoint(s3_endpoint):
    process = subprocess.Popen(
        [sys.executable, str(TESTS / "fault_proxy.py"), s3_endpoint], stdout=subprocess.PIPE, text=True
    )
    port = int(process.stdout.readline())
    yield f"http://127.0.0.1:{port}"
    stop(process)


@pytest.fixture(scope="session")
def azure_proxy_endpoint(azure_endpoint):
    """A fault proxy in front of Azurite (None with an Azure account of your own)."""
    if azure_endpoint is None:
        yield None
        return
    process = subprocess.Popen(
        [sys.executable, str(TESTS / "fault_proxy.py"), azure_endpoint], stdout=subprocess.PIPE, text=True
    )
    yield f"http://127.0.0.1:{int(process.stdout.readline())}"
    stop(process)


class Faults:
    """Sets and reads the fault proxy's rules (see fault_proxy.py)."""

    def __init__(self, endpoint: str) -> None:
        self.endpoint = endpoint

    def set(self, *rules: dict) -> None:
        request = urllib.request.Request(
            f"{self.endpoint}/__faults__",
            data=json.dumps({"rules": list(rules)}).encode(),
            method="POST",
            headers={"Content-Type": "application/json"},
        )
        urllib.request.urlopen(request).read()

    def report(self) -> dict:
        return json.loads(urllib.request.urlopen(f"{self.endpoint}/__faults__").read())


@pytest.fixture(scope="session")
def http_root(tmp_path_factory):
    """(base URL, local folder it serves): a static server over a folder that tests fill."""
    from static_server import serve

    root = tmp_path_factory.mktemp("http-root")
    with serve(str(root)) as base:
        yield base, root


_names = itertools.count()


def unique(prefix: str) -> str:
    return f"{prefix}-{os.getpid()}-{next(_names)}"


@pytest.fixture
def s3(s3_endpoint):
    """(storage_options, fresh bucket name, filesystem) on the session's S3 endpoint."""
    import s3fs

    options = {"endpoint_url": s3_endpoint}
    if not EXTERNAL_S3:
        options.update(key="testing", secret="testing")
    fs = s3fs.S3FileSystem(**options, use_listings_cache=False, skip_instance_cache=True)
    bucket = unique("test")
    fs.mkdir(bucket)
    return options, bucket, fs


@pytest.fixture
def gcs(gcs_endpoint):
    """(storage_options, fresh bucket name, filesystem) on the session's GCS endpoint."""
    import gcsfs

    options = {"endpoint_url": gcs_endpoint, "token": "anon", "project": "atlas-test"}
    fs = gcsfs.GCSFileSystem(**options, use_listings_cache=False, skip_instance_cache=True)
    bucket = unique("test")
    fs.mkdir(bucket)
    return options, bucket, fs


# `@pytest.mark.parametrize("place", LOCAL_QUICK, indirect=True)`: on S3 in the slow tier only, where what a test
# proves of S3 another quick test proves too
LOCAL_QUICK = ["local", pytest.param("s3", marks=pytest.mark.slow)]


@pytest.fixture(params=["local", "s3"])
def place(request, tmp_path):
    """(URL of a fresh, empty location, storage_options): a local folder, then an S3 bucket."""
    if request.param == "local":
        return str(tmp_path / "place"), None
    options, bucket, _ = request.getfixturevalue("s3")
    return f"s3://{bucket}/place", options


@pytest.fixture
def memory_url(request):
    """A fresh memory:// root, removed after the test."""
    import fsspec

    fs = fsspec.filesystem("memory")
    root = "/" + unique("t")
    yield f"memory://{root}"
    if fs.exists(root):
        fs.rm(root, recursive=True)


@dataclass
class Backend:
    """A place datasets live: a URL for each name, storage_options, and a way to put or change objects."""

    name: str
    base: str  # URL prefix
    options: dict[str, Any] | None
    fs: Any  # fsspec filesystem for direct manipulation (for http: the local folder's)
    fs_base: str  # the same prefix as a path on fs
    writable: bool = True
    lists: bool = True
    extra: dict = field(default_factory=dict)

    def url(self, name: str) -> str:
        return f"{self.base}/{name}"

    def put_tree(self, local: Path, name: str) -> str:
        """Copy a local dataset folder here, object by object; returns its URL."""
        if self.name in ("local", "http"):
            for folder in [local, *(p for p in local.rglob("*") if p.is_dir())]:
                (Path(self.fs_base) / name / folder.relative_to(local)).mkdir(parents=True, exist_ok=True)
        upload_tree(self.fs, local, f"{self.fs_base}/{name}")
        return self.url(name)

    def remove(self, name: str) -> None:
        self.fs.rm(f"{self.fs_base}/{name}", recursive=True)


BACKENDS = ["local", "memory", "s3", "gcs", "azure", "http"]
IN_PROCESS = ("local", "memory")  # no server: every case of a per-backend test runs on these in the quick tier


def on_backends(cases: list, quick_remote: list, ids=None) -> list:
    """(backend, case) params for `@pytest.mark.parametrize("backend, case", ..., indirect=["backend"])`: every
    case on every backend, those that are not `quick_remote` marked slow on the remote stores (the contract
    class, tests/storage/test_store_contract.py, holds each store to the same answers in the quick tier)."""
    return [
        pytest.param(
            name,
            case,
            marks=() if name in IN_PROCESS or case in quick_remote else pytest.mark.slow,
            id=f"{name}-{ids(case) if ids else case}",
        )
        for name in BACKENDS
        for case in cases
    ]


SCHEMES = {"s3": "s3", "gcs": "gs", "azure": "az"}


@pytest.fixture(params=BACKENDS)
def backend(request, tmp_path, memory_url) -> Backend:
    import fsspec

    kind = request.param
    if kind == "local":
        return Backend(kind, str(tmp_path), None, fsspec.filesystem("file"), str(tmp_path))
    if kind == "memory":
        return Backend(kind, memory_url, None, fsspec.filesystem("memory"), memory_url[len("memory://") :])
    if kind == "http":
        base, root = request.getfixturevalue("http_root")
        folder = unique("h")
        (root / folder).mkdir()
        return Backend(
            kind, f"{base}/{folder}", None, fsspec.filesystem("file"), str(root / folder), writable=False, lists=False
        )
    options, bucket, fs = request.getfixturevalue(kind)
    return Backend(kind, f"{SCHEMES[kind]}://{bucket}", options, fs, bucket)
