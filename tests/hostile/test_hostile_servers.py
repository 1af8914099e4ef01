"""A server's answers come from whoever runs it (issue 35, row 9): a body is never read past what was asked for
(a range, or a whole object's bound), and a redirect to another origin is refused, one within the origin followed
and counted. Against real servers: the fault proxy (tests/fault_proxy.py) in front of the static file server for
HTTP, and in front of moto for S3 (both read clients). The proxy counts the body bytes it managed to send: what
the reader took in, plus what loopback's socket buffers hold."""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.request

import pytest
from conftest import TESTS, Faults, stop, unique
from helpers import same, sample_examples
from helpers import write_dataset as write

import atlas_remote as ar
from atlas_remote import storage
from atlas_remote.storage import obstore_backend as obstore_module

EXAMPLES = sample_examples(40)
MiB = 1 << 20
SLACK = 32 * MiB  # socket buffers on loopback, and one read of aiohttp's or obstore's past the bound
GiB = 1 << 30


def sent(faults: Faults) -> int:
    return sum(faults.report()["bytes_down"].values())


@pytest.fixture(scope="module")
def http_proxy(http_root):
    """(the static server's base URL, the folder it serves, a fault proxy's base URL in front of it, its Faults)."""
    base, root = http_root
    process = subprocess.Popen([sys.executable, str(TESTS / "fault_proxy.py"), base], stdout=subprocess.PIPE, text=True)
    proxy = f"http://127.0.0.1:{int(process.stdout.readline())}"
    yield base, root, proxy, Faults(proxy)
    stop(process)


@pytest.fixture
def over_http(http_proxy, tmp_path):
    """(URL of a dataset through the proxy, the static server's base URL, the dataset's path on it, Faults)."""
    base, root, proxy, faults = http_proxy
    name = unique("hostile")
    write(str(root / name), EXAMPLES, 20, 5)
    faults.set()
    yield f"{proxy}/{name}", base, f"/{name}", faults
    faults.set()


def served(base: str) -> dict:
    return json.loads(urllib.request.urlopen(f"{base}/__requests__").read())


@pytest.mark.parametrize("announced", [None, 1 << 40], ids=["chunked", "announcing 1 TiB"])
def test_a_meta_json_without_end_is_refused_at_its_bound(over_http, announced):
    """The review's server streamed meta.json without end: 2.86 GB in 5 s, until the timeout."""
    url, _, _, faults = over_http
    rule = {"method": "GET", "path": r"/meta\.json$", "fault": "flood", "times": 10}
    faults.set({**rule, "length": announced} if announced else rule)
    with pytest.raises(ar.FormatError, match=r"meta.json: longer than 67,108,864 bytes, the most a meta file"):
        ar.open(url, timeout=10)
    assert sent(faults) < (0 if announced else 64 * MiB) + SLACK


@pytest.mark.parametrize(
    "answer",
    [
        {"status": 200, "size": GiB, "length": GiB},
        {"status": 200},
        {"status": 206, "keep_range": True, "size": GiB, "length": GiB},
    ],
    ids=["200 announcing a GiB", "200 without end", "206 with a GiB"],
)
def test_a_range_answered_with_more_is_refused_within_the_range(over_http, answer):
    """A 79-byte range answered 200 with a GiB was read whole (2.16 GB) before it was refused."""
    url, _, _, faults = over_http
    ds = ar.open(url, timeout=10)
    faults.set({"method": "GET", "path": r"/0/data\.bin$", "fault": "flood", "times": 10, **answer})
    with pytest.raises(ar.RangeNotSupportedError, match="ignores Range"):
        ds[0]
    assert sent(faults) < SLACK


@pytest.mark.parametrize(
    "methods, file, action",
    [(["GET"], "0/data.bin", "read"), (["HEAD", "GET"], "0/data.bin", "inspect"), (["GET"], "meta.json", "open")],
)
def test_a_redirect_to_another_origin_is_refused(over_http, methods, file, action):
    """data.bin answered 302 to another origin: the GET, the HEAD and the whole GET there were followed. (A HEAD
    that fails is tried again as a GET by fsspec: both are redirected here.)"""
    url, other, path, faults = over_http
    ds = ar.open(url, timeout=10) if action != "open" else None
    before = served(other)
    where = f"/{file.replace('.', '[.]')}$"
    faults.set(*({"method": m, "path": where, "fault": "redirect", "to": other, "times": 10} for m in methods))
    with pytest.raises(
        ar.RedirectRefusedError, match=r"redirected to another origin \(http://127.0.0.1:\d+\): refused"
    ):
        if action == "read":
            ds[0]
        elif action == "inspect":
            ds.store.identity(file)
        else:
            ar.open(url, timeout=10)
    after = served(other)
    for method in methods:
        key = f"{method} {path}/{file}"
        assert after.get(key, 0) == before.get(key, 0), "nothing asked of the other origin"
        assert faults.report()["requests"][key] == 1, "refused, not retried"


def test_a_redirect_within_the_origin_is_followed_and_counted(over_http):
    url, _, _, faults = over_http
    ds = ar.open(url, timeout=10)
    faults.set({"method": "GET", "path": r"/0/data\.bin$", "fault": "redirect", "times": 10})
    assert same(ds[0], EXAMPLES[0])
    assert ds.stats.requests["redirect"] == 1 and ds.stats.requests["block"] == 1


@pytest.fixture(params=["obstore", "fsspec"])
def over_s3(request, s3, proxy_endpoint, monkeypatch):
    """(URL of a dataset on S3, options through the fault proxy, Faults), read by obstore, then by s3fs."""
    if request.param == "fsspec":
        monkeypatch.setattr(obstore_module, "obstore_backend", lambda *args: None)
    options, bucket, _ = s3
    write(f"s3://{bucket}/ds", EXAMPLES, 20, 5, options=options)
    through_proxy = {**options, "endpoint_url": proxy_endpoint}
    assert storage.Store(f"s3://{bucket}/ds", through_proxy).read_client == request.param
    faults = Faults(proxy_endpoint)
    faults.set()
    yield f"s3://{bucket}/ds", through_proxy, faults
    faults.set()


def test_s3_a_meta_json_without_end_is_refused(over_s3):
    """s3fs read it until the timeout (1.4 GB in 5 s); obstore refuses a body without a length itself."""
    url, options, faults = over_s3
    faults.set({"method": "GET", "path": r"/ds/meta\.json$", "fault": "flood", "times": 10})
    with pytest.raises((ar.FormatError, ar.StorageError), match="meta.json"):
        ar.open(url, storage_options=options, timeout=10, retries=0)
    assert sent(faults) < 64 * MiB + SLACK


# The peak from /proc (VmHWM): getrusage's ru_maxrss keeps, across exec, the peak of the process that forked.
OPEN_IN_A_CHILD = """
import json, sys
import atlas_remote as ar
try:
    ar.open(sys.argv[1], storage_options=json.loads(sys.argv[2]), timeout=10, retries=0)
    print("opened")
except ar.AtlasError as err:
    print(type(err).__name__)
peak = [line for line in open("/proc/self/status") if line.startswith("VmHWM:")][0]
print(int(peak.split()[1]) // 1024)
"""


@pytest.mark.parametrize("client", ["obstore", "fsspec"])
def test_s3_a_meta_json_announcing_a_tib_is_refused_unread(s3, proxy_endpoint, client):
    """obstore allocates what Content-Length announces before reading: 1 TiB announced aborted the process
    (run in a child here for that reason); s3fs read the body until the timeout."""
    options, bucket, _ = s3
    write(f"s3://{bucket}/ds", EXAMPLES, 20, 5, options=options)
    through_proxy = {**options, "endpoint_url": proxy_endpoint}
    if client == "fsspec":  # an option obstore does not map: s3fs reads
        through_proxy["config_kwargs"] = {"max_pool_connections": 10}
    faults = Faults(proxy_endpoint)
    faults.set({"method": "GET", "path": r"/ds/meta\.json$", "fault": "flood", "length": 1 << 40, "times": 10})
    try:
        child = subprocess.run(
            [sys.executable, "-c", OPEN_IN_A_CHILD, f"s3://{bucket}/ds", json.dumps(through_proxy)],
            capture_output=True,
            text=True,
            timeout=120,
        )
        said = child.stdout.split()
        assert child.returncode == 0 and said[0] == "FormatError", child.stderr[-2000:]
        assert int(said[1]) < 400, "MiB at the peak"
        assert sent(faults) < SLACK
    finally:
        faults.set()


@pytest.mark.parametrize(
    "answer",
    [
        {"status": 200, "size": GiB, "length": GiB},
        {"status": 206, "keep_range": True, "size": GiB, "length": GiB},
    ],
    ids=["200 announcing a GiB", "206 with a GiB"],
)
def test_s3_a_range_answered_with_more_is_refused_within_the_range(over_s3, answer):
    """s3fs and obstore read a GiB for a ranged read answered 206 with one; s3fs one answered 200 too."""
    url, options, faults = over_s3
    ds = ar.open(url, storage_options=options, timeout=10, retries=0)
    faults.set({"method": "GET", "path": r"/0/data\.bin$", "fault": "flood", "times": 10, **answer})
    with pytest.raises(ar.StorageError, match="Range|non-partial"):
        ds[0]
    assert sent(faults) < SLACK


def test_s3fs_refuses_a_redirect_to_another_origin(s3, proxy_endpoint, s3_endpoint, monkeypatch):
    """aiobotocore lets aiohttp follow redirects, to any origin: s3fs's GET and HEAD went to the other server.
    (obstore follows them too, and cannot be told not to: docs/security.md.)"""
    monkeypatch.setattr(obstore_module, "obstore_backend", lambda *args: None)
    options, bucket, _ = s3
    write(f"s3://{bucket}/ds", EXAMPLES, 20, 5, options=options)
    other = subprocess.Popen(
        [sys.executable, str(TESTS / "fault_proxy.py"), s3_endpoint], stdout=subprocess.PIPE, text=True
    )
    try:
        elsewhere = f"http://127.0.0.1:{int(other.stdout.readline())}"
        faults = Faults(proxy_endpoint)
        ds = ar.open(f"s3://{bucket}/ds", storage_options={**options, "endpoint_url": proxy_endpoint}, retries=0)
        faults.set({"path": r"/0/data\.bin$", "fault": "redirect", "to": elsewhere, "times": 10})
        with pytest.raises(ar.RedirectRefusedError, match="redirected to another origin"):
            ds[0]
        with pytest.raises(ar.RedirectRefusedError):
            ds.store.identity("0/data.bin")
        assert Faults(elsewhere).report()["requests"] == {}
        faults.set({"method": "GET", "path": r"/0/data\.bin$", "fault": "redirect", "times": 10})
        assert same(ds[0], EXAMPLES[0]) and ds.stats.requests["redirect"] == 1
    finally:
        Faults(proxy_endpoint).set()
        stop(other)
