"""The examples in examples/ are the documentation's code: each runs here, as a user runs it, against the S3
endpoint the tests start."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import uuid
from collections import Counter
from pathlib import Path

import pytest

import atlas_remote as ar

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
TAG = "ATLAS_REMOTE_TEST_EXAMPLE"


def run(command: list[str], tag: str, seconds: float = 600) -> subprocess.CompletedProcess:
    """A command of the walkthrough, as a user types it; whatever of it is left afterwards (torchrun starts each
    rank in a session of its own) found by a tag in its environment and killed."""
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    package_parent = str(Path(ar.__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join([package_parent, *filter(None, [env.get("PYTHONPATH")])])
    try:
        return subprocess.run(command, env={**env, TAG: tag}, capture_output=True, text=True, timeout=seconds)
    finally:
        for entry in Path("/proc").iterdir():
            try:
                if entry.name.isdigit() and f"{TAG}={tag}".encode() in (entry / "environ").read_bytes().split(b"\0"):
                    os.kill(int(entry.name), signal.SIGKILL)
            except OSError:  # gone, or not ours
                pass


@pytest.mark.slow
def test_the_language_model_walkthrough_runs_as_written(s3, tmp_path):
    """docs/training.md's three commands against the suite's S3 endpoint: Megatron and JSON lines converted with
    their token counts; 2 ranks under torchrun (rank and world size from torch.distributed, counts found beside
    each dataset) take 10 batches of a 0.7/0.3 mixture with 2 workers each and checkpoint; 3 ranks finish the
    epoch from it. The rows served are the uninterrupted epoch's, each once but for the deal's padding."""
    options, bucket, _ = s3
    tag, script = uuid.uuid4().hex, str(EXAMPLES / "language_model.py")
    where = ["--bucket", bucket, "--endpoint-url", options["endpoint_url"]]
    done = run([sys.executable, script, "prepare", *where], tag)
    assert done.returncode == 0, done.stderr[-3000:]
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    records = []
    for ranks, steps in ((2, ["--steps", "10"]), (3, [])):
        records.append(tmp_path / f"job{ranks}")
        records[-1].mkdir()
        command = [*torchrun, "--nproc-per-node", str(ranks), script, "train", *where, *steps]
        done = run([*command, "--record", str(records[-1])], tag)
        assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
        assert "no token counts beside" not in done.stderr, "the counts saved by convert were found"
    rows = [[tuple(r[1]) for r in json.loads(p.read_text())] for record in records for p in record.glob("*.json")]
    first = [row for ranks in rows[:2] for row in ranks]
    assert len(first) == 2 * 10 * 8, "2 ranks took 10 batches of 8 each"
    served = [row for ranks in rows for row in ranks]
    datasets = [ar.open(f"s3://{bucket}/atlas/{name}", storage_options=options) for name in ("web", "code")]
    mixture = ar.Mixture(datasets, weights=[0.7, 0.3])
    whole = [tuple(row) for b in ar.TokenStream(mixture, 64, batch_size=8, seed=1234) for row in b["tokens"].tolist()]
    assert len(whole) > 1000 and not Counter(whole) - Counter(served), "every row of the uninterrupted epoch"
    assert sum((Counter(served) - Counter(whole)).values()) < 3 * 2, "no other row, none more but a deal's padding"


def test_the_documentation_quotes_the_example_as_it_is():
    """docs/training.md's walkthrough is examples/language_model.py: its code blocks are the file's text and its
    commands the file's own, so the documentation cannot drift from the script the suite runs."""
    docs = (EXAMPLES.parent / "docs" / "training.md").read_text()
    script = (EXAMPLES / "language_model.py").read_text()
    section = docs.split("### A first day, step by step", 1)[1].split("\n### ", 1)[0]
    quoted = [block.split("```", 1)[0] for block in section.split("```python\n")[1:]]
    assert len(quoted) == 3 and all(block.startswith("def ") and block in script for block in quoted)
    commands = section.split("```bash\n")[2].split("```", 1)[0].strip().splitlines()
    assert len(commands) == 3 and all(f"    {command}" in script for command in commands)
