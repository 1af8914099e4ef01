"""The `atlas-remote` command, run as a user runs it: output, exit status and what it leaves behind."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys

import numpy as np
import pytest
from conftest import Faults
from helpers import same, sample_examples

import atlas_remote as ar
from atlas_remote.cli import main

EXAMPLES = sample_examples(300)


def run(capsys, *argv: str) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exit_:
        main(list(argv))
    out, err = capsys.readouterr()
    return exit_.value.code, out, err


def shell(*argv: str, env: dict | None = None, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "atlas_remote.cli", *argv],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **(env or {})},
        **kwargs,
    )


def write(url, options=None, examples=EXAMPLES, **kw):
    with ar.AtlasDatasetWriter(url, 100, 10, storage_options=options, **kw) as w:
        for example in examples:
            w.add_example(example)
    return url


@pytest.fixture
def dataset(place):
    """(URL, --storage-options argument or [])"""
    url, options = place
    return write(url, options), (["--storage-options", json.dumps(options)] if options else [])


def test_info(capsys, dataset):
    url, options = dataset
    code, out, _ = run(capsys, "info", url, *options)
    assert code == 0 and out.splitlines()[0] == url
    text = dict(line.strip().split(None, 1) for line in out.splitlines()[1:] if not line.startswith("  block"))
    assert text["examples"] == "300" and text["shards"] == "3 of 3 present"
    assert "block size  10 examples" in out and "every shard (CRC-32" in out
    code, out, _ = run(capsys, *options, "info", "--json", url)  # options before the subcommand, too
    facts = json.loads(out)
    assert code == 0 and facts["examples"] == 300 and facts["block_sizes"] == [10]
    assert facts["shard_strategies"] == {"SHARED_DICTIONARY_COMPRESSION": 3} and facts["shards_with_checksums"] == 3
    assert facts["bytes_stored"] > 0 and facts["dictionary_bytes"] >= 1024 and facts["requests"]["meta"] >= 1


def test_head_cat_get(capsys, dataset):
    url, options = dataset
    code, out, _ = run(capsys, "head", url, "-n", "3", *options)
    assert code == 0 and out.splitlines()[1].startswith("[1] array(dtype=int32, shape=(")
    code, out, _ = run(capsys, "cat", url, "--start", "4", "--stop", "8", "--json", *options)
    rows = [json.loads(line) for line in out.splitlines()]
    assert [r["index"] for r in rows] == [4, 5, 6, 7]
    assert rows[0]["example"] == {"id": 4, "text": EXAMPLES[4]["text"]}
    assert rows[1]["example"] == EXAMPLES[5].tolist()  # an array, as a list
    assert base64.b64decode(rows[2]["example"]) == EXAMPLES[6]  # bytes, as base64
    assert rows[3]["example"] == [7, None, EXAMPLES[7][2], "ünïcødé ✓"]
    code, out, _ = run(capsys, "get", url, "299", "0", *options)
    assert code == 0 and [line.split()[0] for line in out.splitlines()] == ["[299]", "[0]"]


def test_long_values_are_summarised(capsys, tmp_path):
    url = write(
        str(tmp_path / "ds"),
        examples=[
            {
                "text": "x" * 5000,
                "blob": os.urandom(3000),
                "pixels": np.zeros((64, 64), np.uint8),
                "ids": list(range(100)),
            }
        ],
    )
    code, out, _ = run(capsys, "head", url)
    assert code == 0 and len(out) < 400
    assert "(5,000 chars)" in out and "<3,000 bytes:" in out and "array(dtype=uint8, shape=(64, 64)" in out
    assert "... (100 items)" in out


def test_errors_are_one_line(capsys, tmp_path):
    code, out, err = run(capsys, "info", str(tmp_path / "missing"))
    assert (
        code == 1
        and err
        == f"atlas-remote: error: {tmp_path / 'missing'}: no meta.json here: not an Atlas "
        f"dataset, or not committed yet\n"
    )
    code, _, err = run(capsys, "info", str(tmp_path), "--storage-options", "{nope")
    assert (
        code == 1
        and err.startswith("atlas-remote: error: --storage-options is not valid JSON (")
        and err.count("\n") == 1
    )
    with pytest.raises(ar.DatasetNotFoundError):  # --debug: the exception itself, with its traceback
        main(["info", str(tmp_path / "missing"), "--debug"])
    code, out, _ = run(capsys, "--version")
    assert code == 0 and out.strip() == f"atlas-remote {ar.__version__}"


def test_a_closed_pipe_ends_quietly(tmp_path):
    url = write(str(tmp_path / "ds"), examples=sample_examples(3000))
    reader = subprocess.Popen(
        [sys.executable, "-m", "atlas_remote.cli", "cat", url], stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    reader.stdout.readline()
    reader.stdout.close()  # as `| head -1` does
    assert reader.wait(timeout=60) == 0
    assert reader.stderr.read() == b""


def test_progress_only_on_a_terminal(tmp_path):
    url = write(str(tmp_path / "ds"))
    piped = shell("verify", url)
    assert piped.returncode == 0 and piped.stderr == "" and "OK" in piped.stdout
    # `script` gives the command a terminal (a sized one: tqdm draws nothing 0 columns wide)
    on_terminal = subprocess.run(
        ["script", "-qec", f"stty cols 120 rows 40; {sys.executable} -m atlas_remote.cli verify {url}", "/dev/null"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert on_terminal.returncode == 0 and "verify: 100%" in on_terminal.stdout and "MB/s" in on_terminal.stdout
    quiet = subprocess.run(
        [
            "script",
            "-qec",
            f"stty cols 120 rows 40; {sys.executable} -m atlas_remote.cli verify {url} --quiet",
            "/dev/null",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert "verify:" not in quiet.stdout and "OK" in quiet.stdout


def test_aws_endpoint_from_the_environment(s3, tmp_path):
    options, bucket, _ = s3
    url = write(f"s3://{bucket}/ds", options)
    result = shell("info", url, "--json", env={"AWS_ENDPOINT_URL": options["endpoint_url"]})
    assert result.returncode == 0, result.stderr
    facts = json.loads(result.stdout)
    assert facts["examples"] == 300 and facts["read_client"] == "obstore", "obstore finds the endpoint as botocore"


# -- cp --------------------------------------------------------------------------------------------


def test_cp_local_to_s3_and_back(capsys, s3, tmp_path):
    options, bucket, fs = s3
    src = write(str(tmp_path / "src"))
    opts = json.dumps(options)
    code, out, _ = run(capsys, "cp", src, f"s3://{bucket}/copy", "--dest-storage-options", opts)
    assert code == 0 and "streamed, 30 blocks checked" in out
    assert same(ar.open(f"s3://{bucket}/copy", storage_options=options)[:], EXAMPLES)
    assert not fs.exists(f"{bucket}/copy/.atlas-staging") and not fs.exists(f"{bucket}/copy/.atlas-lease")
    code, out, _ = run(capsys, "cp", f"s3://{bucket}/copy", str(tmp_path / "back"), "--src-storage-options", opts)
    assert code == 0
    before = {p.relative_to(tmp_path / "src"): p.read_bytes() for p in (tmp_path / "src").rglob("*") if p.is_file()}
    after = {p.relative_to(tmp_path / "back"): p.read_bytes() for p in (tmp_path / "back").rglob("*") if p.is_file()}
    assert after == before, "byte for byte"


def test_cp_within_one_store_is_server_side(capsys, s3, proxy_endpoint):
    options, bucket, _ = s3
    through = {**options, "endpoint_url": proxy_endpoint}
    write(f"s3://{bucket}/src", options)
    faults = Faults(proxy_endpoint)
    faults.set()  # resets the counters
    code, out, _ = run(
        capsys, "cp", f"s3://{bucket}/src", f"s3://{bucket}/dst", "--storage-options", json.dumps(through)
    )
    assert code == 0 and "server-side copies" in out
    report = faults.report()
    data_bytes = {k: v for k, v in {**report["bytes_down"], **report["bytes_up"]}.items() if "data.bin" in k}
    assert sum(data_bytes.values()) == 0, f"no data bytes passed the client: {data_bytes}"
    assert any(k.startswith("PUT ") and "data.bin" in k for k in report["requests"]), "copies were made"
    assert same(ar.open(f"s3://{bucket}/dst", storage_options=options)[:], EXAMPLES)


def test_cp_refuses_a_corrupt_block_and_an_existing_dataset(capsys, s3, tmp_path):
    options, bucket, fs = s3
    src = write(str(tmp_path / "src"))
    data = bytearray((tmp_path / "src" / "1" / "data.bin").read_bytes())
    data[40] ^= 0xFF
    (tmp_path / "src" / "1" / "data.bin").write_bytes(bytes(data))
    code, _, err = run(capsys, "cp", src, f"s3://{bucket}/copy", "--storage-options", json.dumps(options))
    assert code == 1 and "shard 1 block " in err and "checksum mismatch" in err
    assert fs.find(f"{bucket}/copy") == [], "nothing committed, nothing staged, no lease left"

    good = write(str(tmp_path / "good"))
    write(str(tmp_path / "there"), examples=["old"])
    code, _, err = run(capsys, "cp", good, str(tmp_path / "there"))
    assert code == 1 and "already holds a committed Atlas dataset" in err
    assert ar.open(str(tmp_path / "there"))[:] == ["old"]
    code, _, _ = run(capsys, "cp", good, str(tmp_path / "there"), "--overwrite")
    assert code == 0 and same(ar.open(str(tmp_path / "there"))[:], EXAMPLES)


def test_cp_keeps_missing_shards_missing(capsys, tmp_path):
    import shutil

    src = write(str(tmp_path / "src"))
    shutil.rmtree(tmp_path / "src" / "1")
    code, _, _ = run(capsys, "cp", src, str(tmp_path / "dst"))
    ds = ar.open(str(tmp_path / "dst"))
    assert code == 0 and [s.number for s in ds.shards] == [0, 2] and ds.metadata.shard_sizes == [100, 100, 100]
    assert same(ds[:], EXAMPLES[:100] + EXAMPLES[200:])


def test_verify_checksum_recover(capsys, dataset):
    url, options = dataset
    code, out, err = run(capsys, "verify", url, *options)
    assert code == 0 and out.startswith(
        f"{url}: OK - 3 shards, 30 blocks (30 with checksums, 30 signed with your key), 300 examples"
    )
    assert err == "", "no progress bar off a terminal"
    code, out, _ = run(capsys, "checksum", url, *options)
    assert (
        code == 0
        and out.strip() == f"{url}: checksums and signatures added to 0 shards, 3 already signed with your key"
    )
    code, out, _ = run(capsys, "recover", url, *options)
    assert code == 0 and out.strip() == f"{url}: nothing to recover"
