"""Multi-node, shown: examples/torchrun_resume.py run by real torchrun launchers against the suite's S3 endpoint.

Two launchers on this machine stand for two nodes (c10d rendezvous on 127.0.0.1), each rank a process with a
gloo process group and a DataLoader worker; a rank SIGKILLs itself and the job dies, then a job of another size
resumes from the checkpoint. And torchrun's elastic agent restarting the workers itself. Every job has a timeout
and every process of it (launchers, ranks in their own sessions, DataLoader workers) is killed in a `finally`.
"""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
import uuid
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from conftest import free_port

import atlas_remote as ar
from atlas_remote import CompressionStrategy as CS

SLOW = pytest.mark.slow  # a job imports torch in 3 to 6 processes (about 3 CPU-seconds each): about 60 CPU-s a test
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "torchrun_resume.py"
BATCH, EVERY, FAIL_AT = 16, 10, 25  # the last rank dies at step 25; the newest checkpoint is step 20
SEQ_LEN = 32
JOB_SECONDS = 180
JOB_TAG = "ATLAS_REMOTE_TEST_TORCHRUN_JOB"


def example():
    """The example as a module: the test records examples as it does."""
    spec = importlib.util.spec_from_file_location("torchrun_resume", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def write(url: str, options: dict, ids: range) -> None:
    with ar.AtlasDatasetWriter(url, 500, 16, CS.STANDARD_COMPRESSION, storage_options=options) as w:
        w.add_examples({"id": i} for i in ids)


def environment(options: dict) -> dict:
    """The children's environment: the suite's (its signing key too), the S3 endpoint and credentials as a
    node's environment gives them, and this atlas_remote first on the path."""
    env = dict(os.environ)
    env["AWS_ENDPOINT_URL"] = options["endpoint_url"]
    if "key" in options:
        env.update(AWS_ACCESS_KEY_ID=options["key"], AWS_SECRET_ACCESS_KEY=options["secret"])
    package_parent = str(Path(ar.__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join([package_parent, *filter(None, [env.get("PYTHONPATH")])])
    return env


def torchrun(launchers: list[list[str]], script_args: list[str], env: dict, logs: Path) -> list[int]:
    """Start one torchrun per launcher, wait for all of them, and return their exit codes; then kill whatever
    is left of the job. torchrun starts each rank in a session of its own (a rank outlives a killed launcher,
    and hung ranks did), so the job's processes are found by a tag in their environment."""
    tag = uuid.uuid4().hex
    processes = []
    try:
        for arguments in launchers:
            log = open(logs / f"launcher{len(list(logs.glob('launcher*')))}.log", "w")
            command = [sys.executable, "-m", "torch.distributed.run", *arguments, str(EXAMPLE), *script_args]
            processes.append(
                subprocess.Popen(
                    command, env={**env, JOB_TAG: tag}, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
                )
            )
        return [p.wait(timeout=JOB_SECONDS) for p in processes]
    finally:
        for p in processes:
            kill_group(p.pid)
        for pid in tagged(tag):
            kill_group(pid)
        for p in processes:
            p.wait()


def kill_group(pid: int) -> None:
    try:
        os.killpg(os.getpgid(pid), signal.SIGKILL)
    except ProcessLookupError:
        pass


def tagged(tag: str) -> list[int]:
    """This user's processes whose environment holds the job's tag: its launchers, ranks and their workers."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and f"{JOB_TAG}={tag}".encode() in (entry / "environ").read_bytes().split(b"\0"):
                found.append(int(entry.name))
        except OSError:  # gone, or not ours
            pass
    return found


def served(records: Path, attempts: list[tuple[str, int]]) -> tuple[Counter, list[int]]:
    """Ids trained on across the attempts in order, each attempt counted up to the step the next resumed
    from (the steps after a checkpoint are trained again); and the step each attempt resumed from."""
    resumed = []
    steps: list[dict[int, list[int]]] = []
    for run, attempt in attempts:
        by_step: dict[int, list[str]] = {}
        starts = set()
        for path in sorted(records.glob(f"{run}-attempt{attempt}-rank*.txt")):
            lines = path.read_text().splitlines()
            starts.add(int(lines[0].split()[1]))
            for line in lines[1:]:
                step, *ids = line.split()
                by_step.setdefault(int(step), []).extend(ids)
        assert len(starts) == 1, f"every rank of {run} attempt {attempt} resumed from the same step: {starts}"
        resumed.append(starts.pop())
        steps.append(by_step)
    ids: Counter = Counter()
    for i, by_step in enumerate(steps):
        until = resumed[i + 1] if i + 1 < len(steps) else float("inf")
        ids.update(x for step, batch in by_step.items() if step <= until for x in batch)
    return ids, resumed


def check_epoch(ids: Counter, expected: set[str], left: int, streams: int) -> None:
    """Every example served, none foreign, and exactly as many twice as docs/training.md ("Who serves what")
    says the final deal pads: `left` positions over `streams`, pieces of q or q + 1; only when q is whole
    batches and some are left over does each shorter piece get one position more."""
    q, r = divmod(left, streams)
    padding = streams - r if r and q % BATCH == 0 else 0
    missing = expected - set(ids)
    assert not missing, f"{len(missing)} examples never served"
    assert set(ids) <= expected, "only the dataset's examples"
    assert sum(count - 1 for count in ids.values()) == padding, f"repeated: the documented padding is {padding}"


@pytest.fixture
def bucket(s3, tmp_path):
    options, name, _ = s3
    records = tmp_path / "records"
    records.mkdir()
    return options, f"s3://{name}", records, environment(options)


def launcher(run: str, nodes: str, processes: int, port: int, host: bool, *more: str) -> list[str]:
    """torchrun's arguments for one node of a c10d rendezvous on 127.0.0.1 (is_host: which launcher hosts it,
    as matching the endpoint's hostname decides on real machines; last_call_timeout: no wait for more nodes
    once the minimum has joined)."""
    return [
        *("--nnodes", nodes, "--nproc-per-node", str(processes), *more),
        *("--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", run),
        *("--rdzv-conf", f"is_host={int(host)},last_call_timeout=1"),
    ]


def datasets(kind: str, base: str, options: dict) -> tuple[list[str], set[str]]:
    """The example's dataset arguments for one kind of data, and the examples of the whole epoch (their ids,
    or for rows of tokens their digests, from the uninterrupted epoch read here by one stream)."""
    if kind == "plain":
        write(f"{base}/ds", options, range(4000))
        return [f"{base}/ds"], {str(i) for i in range(4000)}
    if kind == "mixture":  # 3,000 + 1,000 examples at 0.75 / 0.25: an epoch serves each example once
        write(f"{base}/a", options, range(3000))
        write(f"{base}/b", options, range(10_000, 11_000))
        return [f"{base}/a", f"{base}/b", "--weights", "0.75", "0.25"], {
            *map(str, range(3000)),
            *map(str, range(10_000, 11_000)),
        }
    rng = np.random.default_rng(0)  # documents of 5 to 200 tokens packed into rows of SEQ_LEN + 1
    with ar.AtlasDatasetWriter(f"{base}/tokens", 100, 8, CS.STANDARD_COMPRESSION, storage_options=options) as w:
        w.add_examples({"tokens": rng.integers(1, 50_000, rng.integers(5, 200))} for _ in range(1000))
    data = ar.open(f"{base}/tokens", storage_options=options)
    counts = ar.TokenCounts.of(data)
    counts.save(f"{base}/tokens.tokens", options)  # once, where every rank finds them
    whole = ar.TokenStream(data, SEQ_LEN, batch_size=BATCH, counts=counts)
    rows = [key for batch in whole.loader() for key in example().examples(batch)]
    assert len(rows) == len(set(rows)) > 4 * BATCH * FAIL_AT, "rows told apart by their digests, for 25+ steps"
    return [f"{base}/tokens", "--seq-len", str(SEQ_LEN)], set(rows)


@SLOW
@pytest.mark.parametrize("kind", ["plain", "mixture", "tokens"])
def test_two_nodes_of_two_ranks_killed_resume_on_one_node_of_three(bucket, tmp_path, kind):
    """2 nodes x 2 ranks read the data (one dataset, a Mixture, or documents packed by a TokenStream), each rank
    with a DataLoader worker; the last rank dies at step 25; one node of 3 ranks resumes from step 20."""
    options, base, records, env = bucket
    data, expected = datasets(kind, base, options)
    common = [*data, "--checkpoints", f"{base}/checkpoints", "--batch-size", str(BATCH), "--record", str(records)]

    port = free_port()
    nodes = [launcher("job1", "2", 2, port, host=node == 0) for node in (0, 1)]
    codes = torchrun(nodes, [*common, "--fail-at", str(FAIL_AT)], env, tmp_path)
    assert all(code != 0 for code in codes), f"the job died with its killed rank: {codes}"

    codes = torchrun([launcher("job2", "1", 3, free_port(), host=True)], common, env, tmp_path)
    assert codes == [0], (tmp_path / "launcher2.log").read_text()[-3000:]
    ids, resumed = served(records, [("job1", 0), ("job2", 0)])
    assert resumed == [0, FAIL_AT // EVERY * EVERY], "the new job resumed from the newest checkpoint"
    check_epoch(ids, expected, left=len(expected) - resumed[1] * 4 * BATCH, streams=3)  # 3 ranks x 1 worker


@SLOW
def test_the_elastic_agent_restarts_a_killed_rank_and_the_epoch_completes(bucket, tmp_path):
    options, base, records, env = bucket
    data, expected = datasets("plain", base, options)
    args = [*data, "--checkpoints", f"{base}/checkpoints", "--batch-size", str(BATCH), "--record", str(records)]
    env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"  # see docs/multi-node.md: torch's shared store and restarts
    elastic = launcher("elastic", "1:2", 2, free_port(), True, "--max-restarts", "1")
    codes = torchrun([elastic], [*args, "--fail-at", str(FAIL_AT)], env, tmp_path)
    assert codes == [0], (tmp_path / "launcher0.log").read_text()[-3000:]
    log = (tmp_path / "launcher0.log").read_text()
    assert "exitcode: -9" in log, "the agent saw the rank killed, and restarted the workers"
    ids, resumed = served(records, [("elastic", 0), ("elastic", 1)])
    assert resumed == [0, FAIL_AT // EVERY * EVERY], "the restarted ranks found the newest checkpoint"
    check_epoch(ids, expected, left=len(expected), streams=2)  # the same shape: the first deal goes on


def test_the_example_refuses_torchruns_shared_store_under_restarts(tmp_path):
    """torch 2.13 shares its agent's store with the ranks it restarts, where they can read their peers' addresses
    from the attempt before (docs/multi-node.md): the example says what to set instead of hanging."""
    env = {**environment({"endpoint_url": "http://127.0.0.1:9"}), "TORCHELASTIC_MAX_RESTARTS": "1"}
    env["TORCHELASTIC_USE_AGENT_STORE"] = "True"  # what torchrun's agent sets unless told not to share
    done = subprocess.run(
        [sys.executable, str(EXAMPLE), "s3://bucket/ds", "--checkpoints", str(tmp_path)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2 and done.stderr.strip().endswith("TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1"), done.stderr


def test_the_documentation_quotes_the_examples_as_they_are():
    """Every Python block of docs/multi-node.md is the text of an example the suite runs, so the page cannot
    drift from the scripts."""
    docs = (EXAMPLE.parent.parent / "docs" / "multi-node.md").read_text()
    scripts = [path.read_text() for path in EXAMPLE.parent.glob("*.py")]
    quoted = [block.split("```", 1)[0] for block in docs.split("```python\n")[1:]]
    assert len(quoted) >= 4 and sum(block.count("\ndef ") + block.startswith("def ") for block in quoted) >= 6
    for block in quoted:
        assert any(block in script for script in scripts), block[:200]
