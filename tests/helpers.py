"""Shared test helpers: exact comparison of examples, reference fixtures, sample data."""

from __future__ import annotations

import contextlib
import json
import os
import pickle
import random
import secrets
from collections.abc import Iterator
from pathlib import Path

import numpy as np

# Written by the format's original implementation; see fixtures/reference/README.md. Part of the repository, so
# a bare clone runs every test: a missing fixture is an error here, never an empty parameter list.
FIXTURES = Path(__file__).resolve().parent / "fixtures" / "reference"
CASES = sorted(p.name for p in FIXTURES.iterdir() if (p / "expected.pkl").exists())
assert len(CASES) == 15, f"expected 15 reference cases in {FIXTURES}, found {len(CASES)}"


@contextlib.contextmanager
def as_stranger() -> Iterator[None]:
    """Write as someone else would: with a key of their own, so the session's readers take what is written as a
    stranger's blocks (checked before loading), as a dataset from someone else's bucket is."""
    mine = os.environ.get("ATLAS_REMOTE_KEY")
    os.environ["ATLAS_REMOTE_KEY"] = secrets.token_hex(32)
    try:
        yield
    finally:
        if mine is None:
            del os.environ["ATLAS_REMOTE_KEY"]
        else:
            os.environ["ATLAS_REMOTE_KEY"] = mine


def same(a, b) -> bool:
    """Exact equality, types included, through containers and numpy arrays."""
    if type(a) is not type(b):
        return False
    if isinstance(a, np.ndarray):
        return a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b)
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, float) and a != a:
        return b != b
    return a == b


def tries(n: int) -> int:
    """How many examples a property tries: its full n with --slow and in CI (ATLAS_TEST_PROPERTIES=full), a
    tenth (at least 10) in a quick run. Hypothesis keeps every failure it finds in .hypothesis/ and tries it first
    the next time, so a quick run repeats what a long one found."""
    return n if os.environ.get("ATLAS_TEST_PROPERTIES") == "full" else max(10, n // 10)


def expected(case: str) -> list:
    with open(FIXTURES / case / "expected.pkl", "rb") as f:
        return pickle.load(f)


def params(case: str) -> dict:
    return json.loads((FIXTURES / case / "params.json").read_text())


def upload_tree(fs, local: Path, remote: str) -> None:
    """Copy a local folder to a remote path, objects in flight together (fsspec's put would nest folders)."""
    fs.pipe({f"{remote}/{p.relative_to(local).as_posix()}": p.read_bytes() for p in local.rglob("*") if p.is_file()})


def tree(url: str, options: dict | None = None) -> dict[str, bytes]:
    """Every object below a URL and its bytes, by path relative to it."""
    import fsspec

    fs, root = fsspec.core.url_to_fs(url, **(options or {}))
    fs.invalidate_cache()  # a listing cached by an earlier call may name what is gone
    return {p[len(root) + 1 :]: fs.cat_file(p) for p in fs.find(root)}


WORDS = [
    "atlas",
    "block",
    "shard",
    "index",
    "remote",
    "bucket",
    "read",
    "write",
    "example",
    "token",
    "cache",
    "epoch",
    "batch",
]


def sample_examples(n: int, seed: int = 0) -> list:
    """Varied examples: text records, token arrays, raw bytes, nested tuples."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        kind = i % 4
        if kind == 0:
            out.append({"id": i, "text": " ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 30)))})
        elif kind == 1:
            out.append(np.array([rng.randrange(50000) for _ in range(rng.randint(1, 64))], dtype=np.int32))
        elif kind == 2:
            out.append(bytes(rng.randrange(256) for _ in range(rng.randint(0, 40))))
        else:
            out.append((i, None, rng.random(), "ünïcødé ✓"))
    return out


def write_dataset(url: str, examples: list, shard_size: int = 100, block_size: int = 10, options=None, **kw) -> str:
    """Write examples as a dataset at url (committed when this returns); the url back."""
    import atlas_remote as ar

    with ar.AtlasDatasetWriter(url, shard_size, block_size, storage_options=options, **kw) as writer:
        for example in examples:
            writer.add_example(example)
    return url


CRASH_HOOKS = Path(__file__).resolve().parent / "crash_hooks"  # its sitecustomize crashes a process at a step


def crash_env(*, kill_at: str | None = None, stop_at: str | None = None) -> dict[str, str]:
    """The environment of a process (and its spawned workers) that SIGKILLs itself after commit step `kill_at`,
    or SIGSTOPs itself after `stop_at` (tests/crash_hooks/sitecustomize.py)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(CRASH_HOOKS), env.get("PYTHONPATH")]))
    if kill_at is not None:
        env["ATLAS_REMOTE_TEST_KILL_AT"] = kill_at
    if stop_at is not None:
        env["ATLAS_REMOTE_TEST_STOP_AT"] = stop_at
    return env


def interruptible() -> None:
    """A child's Ctrl-C as a terminal gives it: SIGINT at its default, whatever the pytest worker had at the
    moment of the fork. In full runs the children of the Ctrl-C tests were seen with SIGINT and SIGQUIT ignored
    (what C's system() sets in its caller while it runs, e.g. from another thread), so they never stopped."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_DFL)


class Bounded:
    """Peak traced memory and CPU time of what runs inside it (numpy's allocations are traced too)."""

    def __enter__(self) -> Bounded:
        import time
        import tracemalloc

        tracemalloc.start()
        self.cpu = time.process_time()
        return self

    def __exit__(self, *exc: object) -> None:
        import time
        import tracemalloc

        self.peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        self.cpu = time.process_time() - self.cpu
