"""Every code block of the README runs here as it is written, so the page cannot drift from the library: the
Python blocks as scripts and the shell blocks line by line, in the README's order, against the S3 endpoint the
tests start (given as AWS_ENDPOINT_URL, as a user's would be). Two changes only: the bucket `my-bucket` is a
fresh one, and `atlas-remote view` gets a free port (8765 may be taken on a shared machine). The set-up block
is the one `.ci/run` runs, word for word."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

from helpers import interruptible

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()
BLOCKS = re.findall(r"^```(python|bash)\n(.*?)^```", README, flags=re.M | re.S)


def test_the_readme_is_short_and_its_blocks_are_the_set_up_and_five_examples():
    assert len(README.splitlines()) <= 200
    kinds = [kind for kind, _ in BLOCKS]
    assert kinds == ["bash", "python", "python", "bash", "python", "bash"], kinds


def test_ci_runs_the_readme_set_up_commands_word_for_word():
    set_up = BLOCKS[0][1].splitlines()
    assert set_up[-1].endswith("python -m pytest")
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    for line in set_up:
        assert line in ci, f".ci/run does not run the README's {line!r}"


def test_the_five_examples_run_as_written(s3, tmp_path):
    options, bucket, fs = s3
    for i in range(3):  # what the convert example converts
        rows = "".join(json.dumps({"id": 3 * j + i, "text": f"line {j}"}) + "\n" for j in range(40))
        fs.pipe_file(f"{bucket}/raw/part-{i}.jsonl", rows.encode())
    env = {**os.environ, "AWS_ENDPOINT_URL": options["endpoint_url"]}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}"  # atlas-remote, beside this python
    said = []
    for number, (kind, code) in enumerate(BLOCKS[1:], 1):
        code = code.replace("my-bucket", bucket)
        if kind == "python":
            script = tmp_path / f"example_{number}.py"
            script.write_text(code)
            said.append(run([sys.executable, str(script)], env, tmp_path))
            continue
        for line in code.splitlines():
            if " view " in line:
                said.append(view(line.split("#")[0] + " --port 0", env, tmp_path))
            else:
                said.append(run(["bash", "-c", line], env, tmp_path))
    wrote, read, converted, trained, info, head, page = said
    assert "5,000 examples in 5 shards" in wrote
    assert read.startswith("5000 {'id': 1234, 'text': 'example number 1234', 'label': 4}")
    assert "120 examples" in converted and fs.exists(f"{bucket}/from-jsonl/meta.json")
    assert trained == ""
    assert "5,000" in info and head.count("example number") == 3
    assert "5,000 examples" in page


def run(command: list[str], env: dict, folder: Path) -> str:
    done = subprocess.run(command, env=env, cwd=folder, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"{command}: {done.stderr[-3000:]}"
    return done.stdout


def view(line: str, env: dict, folder: Path) -> str:
    """`atlas-remote view`, which serves until Ctrl-C: its first line, its page's summary, then Ctrl-C."""
    process = subprocess.Popen(
        ["bash", "-c", f"exec {line}"],
        env=env,
        cwd=folder,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=interruptible,
    )
    try:
        first = process.stdout.readline()
        address = first.split(" at ")[1].split()[0]
        with urllib.request.urlopen(address + "api/summary", timeout=60) as answer:
            summary = json.loads(answer.read())
    finally:
        process.send_signal(signal.SIGINT)
        try:
            code = process.wait(timeout=30)
        finally:
            process.kill()
    assert code == 0, process.stderr.read()[-3000:]
    return f"{first} {summary}"
