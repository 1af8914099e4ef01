"""No process of ours outlives the process that started it, however it dies: SIGKILLed (an OOM kill, a lost
machine), a training process reading from S3 through obstore with 2 DataLoader workers, a `convert --workers 2`
and `atlas-remote view` leave nothing behind 10 s later, and the pipe they wrote to ends (`python train.py | cat`
returns), as processes/docs/multi-node.md promise. Every process of a run is found by a tag in its environment and
killed in a `finally`, whatever the test found."""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import numpy as np
import pytest

import atlas_remote as ar
from atlas_remote import CompressionStrategy as CS

TAG = "ATLAS_REMOTE_TEST_LIFETIME"
GONE_WITHIN = 10.0  # seconds after the SIGKILL

TRAIN = textwrap.dedent(
    """
    import json, os, signal, sys
    import atlas_remote as ar
    from atlas_remote.training.tokens import TokenStream

    def main():
        url, options, context = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3]
        ds = ar.open(url, storage_options=options)
        print("client", ds.store.read_client, flush=True)
        stream = TokenStream(ds, 32, batch_size=4, num_workers=2)
        loader = stream.loader(**({"multiprocessing_context": context} if context != "default" else {}))
        for step, batch in enumerate(loader):
            if step == 6:  # the workers serve by now (the first batches come from this process)
                print("killing", flush=True)
                os.kill(os.getpid(), signal.SIGKILL)

    if __name__ == "__main__":
        main()
    """
)


def tagged(tag: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and f"{TAG}={tag}".encode() in (entry / "environ").read_bytes().split(b"\0"):
                found.append(int(entry.name))
        except OSError:  # gone, or not ours
            pass
    return found


def killed_leaves_nothing(command: list[str], ready, kill_it: bool, cwd: str | None = None) -> str:
    """Run `command` writing to a pipe; once `ready(output, tag)`, SIGKILL it (or wait for it to SIGKILL itself,
    saying "killing"); assert that the pipe ends and that no process of the run is left within GONE_WITHIN.
    Returns what it printed."""
    tag = uuid.uuid4().hex
    process = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env={**os.environ, TAG: tag}, cwd=cwd
    )
    output, killed, ended = b"", None, None
    try:
        deadline = time.monotonic() + 180
        while ended is None and time.monotonic() < (killed + GONE_WITHIN if killed else deadline):
            readable, _, _ = select.select([process.stdout], [], [], 0.1)
            if readable:
                chunk = os.read(process.stdout.fileno(), 65536)
                if not chunk:
                    ended = time.monotonic()
                output += chunk
            if killed is None and kill_it and ready(output.decode(errors="replace"), tag):
                process.kill()
                killed = time.monotonic()
            elif killed is None and not kill_it and b"killing" in output:
                killed = time.monotonic()
        text = output.decode(errors="replace")
        assert killed is not None, f"never ready to be killed: {text[-2000:]}"
        assert ended is not None, f"the pipe was still open {GONE_WITHIN} s after the kill: {tagged(tag)}"
        while tagged(tag) and time.monotonic() < killed + GONE_WITHIN:
            time.sleep(0.1)
        left = tagged(tag)
        assert not left, (
            f"alive {GONE_WITHIN} s after the kill: {[Path(f'/proc/{p}/cmdline').read_bytes() for p in left]}"
        )
        return text
    finally:
        for pid in [process.pid, *tagged(tag)]:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        process.wait()


@pytest.fixture
def tokens_on_s3(s3):
    options, bucket, _ = s3
    url = f"s3://{bucket}/tokens"
    rng = np.random.default_rng(0)
    with ar.AtlasDatasetWriter(url, 100, 8, CS.STANDARD_COMPRESSION, storage_options=options) as w:
        w.add_examples({"tokens": rng.integers(1, 50_000, rng.integers(5, 200)).astype(np.uint16)} for _ in range(1000))
    return url, options


@pytest.mark.parametrize("context", ["default", "fork"])
def test_a_training_process_killed_leaves_no_worker_server_or_tracker(tokens_on_s3, tmp_path, context):
    """Before: its fork server, its 2 DataLoader workers (children of the server, watching the server) and the
    resource tracker lived on for 20+ minutes, holding the pipe (`default`: workers from a fork server, so that
    they read through obstore too). With forked workers the pipe was released after 7.8 s (torch's watchdog)."""
    url, options = tokens_on_s3
    script = tmp_path / "train.py"
    script.write_text(TRAIN)
    command = [sys.executable, str(script), url, json.dumps(options), context]
    printed = killed_leaves_nothing(command, None, kill_it=False)
    assert "client obstore" in printed, printed


def test_a_killed_conversion_with_workers_closes_its_pipe(tmp_path):
    folder = tmp_path / "src"
    folder.mkdir()
    for n in range(4):
        (folder / f"{n}.jsonl").write_text("".join(json.dumps({"n": n, "i": i}) + "\n" for i in range(2500)))
    command = [sys.executable, "-m", "atlas_remote.cli", "convert", str(folder), str(tmp_path / "out")]
    command += ["--from", "jsonl", "--workers", "2", "--map", "tables_maps:slowly"]  # 1 ms an example
    tests = str(Path(__file__).resolve().parents[1])
    killed_leaves_nothing(command, lambda output, tag: len(tagged(tag)) >= 4, kill_it=True, cwd=tests)


def test_a_killed_viewer_closes_its_pipe(tmp_path):
    url = str(tmp_path / "ds")
    with ar.AtlasDatasetWriter(url, 10, 2) as w:
        w.add_examples({"text": f"example {i}"} for i in range(30))
    command = [sys.executable, "-m", "atlas_remote.cli", "view", url, "--port", "0"]
    killed_leaves_nothing(command, lambda output, tag: "read-only at" in output, kill_it=True)
