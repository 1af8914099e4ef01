"""The viewer without a browser: how values are rendered, what each answer costs in requests, the server's
headers and refusals, and `atlas-remote view` itself (cli/test_viewer_browser.py drives the page in Chromium)."""

from __future__ import annotations

import json
import math
import signal
import struct
import subprocess
import sys
import urllib.error
import urllib.request
import zlib

import numpy as np
import pytest
from helpers import interruptible, tries
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import atlas_remote as ar
from atlas_remote.viewer import view
from atlas_remote.viewer.pages import ORIGINAL_WRITER, DatasetView
from atlas_remote.viewer.server import POLICY
from atlas_remote.viewer.values import DEPTH, ITEMS, TEXT_CHARS, image_type, png, render


def decode_png(data: bytes) -> np.ndarray:
    """A PNG of 8-bit samples, unfiltered rows (what png() writes), read back by hand, every CRC checked."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    at, chunks = 8, {}
    while at < len(data):
        (length,) = struct.unpack(">I", data[at : at + 4])
        kind, body = data[at + 4 : at + 8], data[at + 8 : at + 8 + length]
        assert struct.unpack(">I", data[at + 8 + length : at + 12 + length])[0] == zlib.crc32(kind + body)
        chunks[kind] = chunks.get(kind, b"") + body
        at += 12 + length
    width, height, depth, color = struct.unpack(">IIBB", chunks[b"IHDR"][:10])
    channels = {0: 1, 4: 2, 2: 3, 6: 4}[color]
    rows = np.frombuffer(zlib.decompress(chunks[b"IDAT"]), np.uint8).reshape(height, 1 + width * channels)
    assert depth == 8 and not rows[:, 0].any(), "filter type 0 on every row"
    return rows[:, 1:].reshape(height, width, channels)


@settings(max_examples=tries(60), deadline=None)
@given(hnp.arrays(np.uint8, st.tuples(st.integers(1, 40), st.integers(1, 40), st.sampled_from([1, 3, 4]))))
def test_png_holds_the_array_exactly(image):
    assert np.array_equal(decode_png(png(image)), image)


leaves = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats()
    | st.text(max_size=50)
    | st.binary(max_size=50)
    | hnp.arrays(hnp.scalar_dtypes(), hnp.array_shapes(max_dims=3, max_side=5))
)
values = st.recursive(
    leaves,
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.tuples(inner, inner)
        | st.dictionaries(st.text(max_size=8) | st.integers(), inner, max_size=4)
    ),
    max_leaves=20,
)


@settings(max_examples=tries(300), deadline=None)
@given(values)
def test_every_value_renders_as_strict_json(value):
    node = render(value)
    json.dumps(node, allow_nan=False)  # no NaN, no bytes, no object: what the page's JSON.parse takes
    assert node["kind"] in {"none", "bool", "int", "float", "str", "bytes", "array", "dict", "list", "other"}


def test_values_are_rendered_as_people_look_at_them():
    assert render(2**80) == {"kind": "int", "text": str(2**80), "type": "int"}, "no precision lost in JavaScript"
    assert render(math.nan)["text"] == "nan" and render(np.float32(1.5))["type"] == "numpy.float32"
    long = render("x" * (TEXT_CHARS + 10))
    assert long["length"] == TEXT_CHARS + 10 and len(long["text"]) == TEXT_CHARS
    tokens = render(np.arange(1000, dtype=np.int32))
    assert tokens["tokens"] and tokens["values"][:3] == ["0", "1", "2"] and tokens["shape"] == [1000]
    floats = render(np.linspace(0, 1, 100).reshape(10, 10))
    assert not floats["tokens"] and len(floats["values"]) == 32 and "image" not in floats
    hwc, chw = np.zeros((6, 9, 3), np.uint8), np.zeros((3, 6, 9), np.uint8)
    assert decode_png(_from_url(render(hwc)["image"])).shape == (6, 9, 3)
    assert decode_png(_from_url(render(chw)["image"])).shape == (6, 9, 3), "channels first, as torch keeps images"
    assert "image" not in render(np.zeros((4, 4), np.uint8)), "a tiny 2-D array is numbers, not a picture"
    big = render(np.zeros((3000, 10, 3), np.uint8))
    assert big["subsampled"] == 3 and decode_png(_from_url(big["image"])).shape == (1000, 4, 3)
    nested = render({1: [[[[[[[[[["deep"]]]]]]]]]], "k": list(range(ITEMS + 5))})
    assert nested["items"][0][0] == "1", "a key that is not a string is shown as its repr"
    assert nested["items"][1][1]["length"] == ITEMS + 5 and len(nested["items"][1][1]["items"]) == ITEMS
    node = nested["items"][0][1]
    for _ in range(DEPTH - 1):
        node = node["items"][0]
    assert node["kind"] == "other" and "nested too deep" in node["text"]


def test_torch_tensors_render_like_arrays():
    import torch

    node = render(torch.arange(6, dtype=torch.int64))
    assert (
        node["type"] == "torch.Tensor" and node["dtype"] == "int64" and node["values"] == ["0", "1", "2", "3", "4", "5"]
    )
    assert render(torch.ones(2, 2, dtype=torch.bfloat16))["dtype"] == "bfloat16"
    assert "image" in render(torch.zeros(3, 8, 8, dtype=torch.uint8))


def test_only_image_signatures_become_images():
    png_bytes = png(np.zeros((2, 2, 3), np.uint8))
    assert render(png_bytes)["image"].startswith("data:image/png;base64,")
    assert image_type(b"\xff\xd8\xff\xe0rest") == "image/jpeg" and image_type(b"RIFF\0\0\0\0WEBPVP8 ") == "image/webp"
    for other in (b'<svg onload="alert(1)"/>', b"GIF89a", b"<html><script>", b"RIFF\0\0\0\0WAVE"):
        assert "image" not in render(other) and "mime" not in render(other)


def _from_url(url: str) -> bytes:
    import base64

    assert url.startswith("data:image/png;base64,")
    return base64.b64decode(url.split(",", 1)[1])


# -- answers and what they cost ---------------------------------------------------------------------


class Opaque:
    """A class no reader allows by default."""


def write(url: str, examples: list, options=None, **kw) -> str:
    with ar.AtlasDatasetWriter(url, 20, 4, storage_options=options, **kw) as writer:
        for example in examples:
            writer.add_example(example)
    return url


@pytest.fixture
def on_s3(s3):
    options, bucket, _ = s3
    rows = [{"i": i, "text": f"row {i}"} for i in range(200)]
    return ar.open(write(f"s3://{bucket}/ds", rows, options), options), rows


def test_a_page_costs_the_reads_of_its_blocks(on_s3):
    ds, rows = on_s3
    viewer = DatasetView(ds)
    opened = ds.stats.total_requests
    summary = viewer.answer(viewer.summary)
    assert summary["cost"]["requests"] == 0, "the manifest read at open says it all"
    assert summary["examples"] == 200 and summary["shards_present"] == 10 and summary["written_by"] == "atlas_remote"
    assert summary["bytes_stored"] == sum(ds.manifest.data_bytes) and summary["block_sizes"] == [4]
    page = viewer.answer(viewer.page, 0, 20)
    assert page["columns"] == ["i", "text"] and [r["index"] for r in page["rows"]] == list(range(20))
    assert page["rows"][7]["cells"][1] == {"kind": "str", "text": "row 7", "length": 5}
    assert page["cost"]["by_kind"] == {"index": 1, "block": 1}, "a shard's table, then one read"
    assert opened + page["cost"]["requests"] <= 10, "opening and the first page"
    deep = viewer.answer(viewer.page, 187, 1)
    assert deep["cost"]["by_kind"] == {"index": 1, "block": 1} and deep["rows"][0]["cells"][0]["text"] == "187"
    again = viewer.answer(viewer.page, 185, 2)
    assert again["cost"]["requests"] == 0, "blocks shown once are cached"
    assert again["cost"]["total_requests"] == ds.stats.total_requests


def test_the_sample_says_what_it_read(on_s3):
    ds, _ = on_s3
    viewer = DatasetView(ds)
    sample = viewer.answer(viewer.sample)
    assert sample["shards_sampled"] == 10 and len(sample["blocks"]) == 10 and sample["errors"] == []
    assert sample["examples_sampled"] == 40 and sum(sample["histogram"]["counts"]) == 40
    assert sample["cost"]["by_kind"]["block"] == 10, "one block of each shard sampled"
    stored = sum(b["stored"] for b in sample["blocks"])
    assert sample["ratio"] == round(sum(b["decoded"] for b in sample["blocks"]) / stored, 3)
    assert viewer.summary()["decoded_estimate"] == sample["decoded_estimate"] > 0


def test_a_refused_block_stands_as_its_error(tmp_path):
    rows = [{"i": i} for i in range(40)]
    rows[9] = {"i": 9, "odd": Opaque()}  # block 2 of shard 0 (blocks of 4)
    viewer = DatasetView(ar.open(write(str(tmp_path / "ds"), rows)))
    page = viewer.page(0, 20)
    with pytest.raises(ar.UnsafePickleError) as refusal:
        ar.open(str(tmp_path / "ds"))[9]
    errors = [r["index"] for r in page["rows"] if "error" in r]
    assert errors == [8, 9, 10, 11] and all(r["error"] == str(refusal.value) for r in page["rows"] if "error" in r)
    assert [r["cells"][0]["text"] for r in page["rows"] if "cells" in r] == [
        str(i) for i in range(20) if i not in errors
    ]
    sample = viewer.sample()  # the middle block of each shard: block 2 of shard 0 is the refused one
    assert sample["errors"] == [str(refusal.value)] and [b["shard"] for b in sample["blocks"]] == [1]


def test_a_dataset_without_manifest_is_described_from_a_listing(tmp_path):
    url = write(str(tmp_path / "ds"), list(range(50)), checksums=False)
    viewer = DatasetView(ar.open(url))
    summary = viewer.summary()
    data = sum((tmp_path / "ds" / s / "data.bin").stat().st_size for s in ("0", "1", "2"))
    assert summary["manifest"] is False and summary["written_by"] == ORIGINAL_WRITER
    assert summary["bytes_stored"] == data and summary["shards_with_checksums"] == 0 and summary["block_sizes"] == [4]
    assert viewer.shards()["examples"] == [20, 20, 10]
    page = viewer.page(48, 5)
    assert page["columns"] is None and [r["value"]["text"] for r in page["rows"]] == ["48", "49"]


# -- the server ---------------------------------------------------------------------------------------


@pytest.fixture
def server(tmp_path):
    served = view(write(str(tmp_path / "ds"), [{"text": f"t{i}"} for i in range(30)]))
    yield served
    served.shutdown()
    served.server_close()


def get(url: str, host: str | None = None) -> tuple[int, dict, bytes]:
    request = urllib.request.Request(url, headers={"Host": host} if host else {})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, dict(response.headers), response.read()
    except urllib.error.HTTPError as err:
        return err.code, dict(err.headers), err.read()


def test_every_response_forbids_script_from_anywhere_else(server):
    for path in ("", "static/viewer.js", "static/uPlot.iife.min.js", "api/summary", "api/examples?start=0&count=5"):
        status, headers, _ = get(server.url + path)
        assert (
            status == 200
            and headers["Content-Security-Policy"] == POLICY
            and headers["X-Content-Type-Options"] == "nosniff"
        )
    assert "script-src 'self'" in POLICY and "unsafe" not in POLICY
    status, _, body = get(server.url + "api/examples?start=0&count=5")
    assert [r["cells"][0]["text"] for r in json.loads(body)["rows"]] == ["t0", "t1", "t2", "t3", "t4"]


def test_the_server_refuses_what_it_does_not_serve(server):
    assert get(server.url + "static/../pages.py")[0] == 404 and get(server.url + "static/index.html")[0] == 404
    status, _, body = get(server.url + "api/examples?start=30&count=5")
    assert status == 400 and "start must be in [0, 30)" in json.loads(body)["error"]
    assert get(server.url + "api/examples?start=0&count=5000")[0] == 400
    assert get(server.url + "api/nothing")[0] == 404
    status, _, body = get(server.url, host="attacker.example:80")
    assert status == 403, "a name rebound to 127.0.0.1 is refused"
    assert get(server.url, host=f"localhost:{server.port}")[0] == 200


def test_a_browser_that_leaves_mid_answer_prints_nothing(server, capsys):
    """socketserver printed a BrokenPipeError traceback when a page was left while its charts were loading."""
    try:
        raise BrokenPipeError(32, "Broken pipe")
    except BrokenPipeError:
        server.handle_error(None, ("127.0.0.1", 1))
    assert capsys.readouterr().err == ""


def test_the_view_command_serves_until_interrupted(tmp_path):
    url = write(str(tmp_path / "ds"), ["a", "b"])
    process = subprocess.Popen(
        [sys.executable, "-m", "atlas_remote.cli", "view", url, "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=interruptible,  # see helpers.interruptible
    )
    try:
        line = process.stdout.readline()
        assert line.startswith(f"{url}: 2 examples, read-only at http://127.0.0.1:"), line
        address = line.split(" at ")[1].split()[0]
        status, _, body = get(address + "api/examples?start=0&count=2")
        assert status == 200 and [r["value"]["text"] for r in json.loads(body)["rows"]] == ["a", "b"]
    finally:
        process.send_signal(signal.SIGINT)
        try:
            code = process.wait(timeout=30)
        finally:
            process.kill()  # nothing left behind if it did not stop
        assert code == 0 and process.stderr.read() == ""


def test_the_view_command_reports_a_missing_dataset_in_one_line(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "atlas_remote.cli", "view", str(tmp_path / "none"), "--port", "0"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 1 and result.stderr.count("\n") == 1 and "no meta.json here" in result.stderr


def test_shards_with_checksums_are_counted_not_summed(on_s3):
    """Before: "checksums 2 of 1 shards" (the manifest's column says which sidecar a shard has: 2, atlas_blocks)."""
    ds, _ = on_s3
    summary = DatasetView(ds).summary()
    assert summary["shards_with_checksums"] == summary["shards_present"] == 10


def test_a_token_dataset_gets_its_document_lengths(tmp_path):
    rng = np.random.default_rng(0)
    lengths = rng.integers(5, 400, 120)
    rows = [
        {"text": f"document {i}", "tokens": rng.integers(0, 50_000, n).astype(np.uint16)} for i, n in enumerate(lengths)
    ]
    viewer = DatasetView(ar.open(write(str(tmp_path / "ds"), rows)))
    sample = viewer.sample()
    documents = sample["documents"]
    assert documents["key"] == "tokens" and sum(documents["histogram"]["counts"]) == sample["examples_sampled"] > 0
    sampled = [len(r["tokens"]) for b in sample["blocks"] for r in rows[b["shard"] * 20 + b["block"] * 4 :][:4]]
    assert documents["tokens"]["min"] == min(sampled) and documents["tokens"]["max"] == max(sampled)
    assert DatasetView(ar.open(write(str(tmp_path / "plain"), list(range(40))))).sample()["documents"] is None
