"""The one write pipeline: the lease names what is writing, every write reports the same way, a script without
`if __name__ == "__main__":` is refused before its workers re-run it, and workers only where the rows pay."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pyarrow as pa
import pytest
from helpers import tree
from hypothesis import given
from hypothesis import strategies as st

import atlas_remote as ar
from atlas_remote import CompressionStrategy as CS
from atlas_remote.write import parts, pipeline

TESTS = Path(__file__).resolve().parents[1]
HOLDER = f"(pid {os.getpid()} on {socket.gethostname()})"


def holder_while_writing(url: str, examples: int = 20):
    """Examples that, halfway, try a second writer at url and keep the holder its DatasetLockedError names."""
    seen: list[str | None] = []

    def rows():
        for i in range(examples):
            if i == examples // 2:
                with pytest.raises(ar.DatasetLockedError) as locked:
                    ar.AtlasDatasetWriter(url, 10, 2)
                seen.append(locked.value.holder)
            yield {"i": i}

    return rows, seen


def test_the_lease_names_what_is_writing(tmp_path):
    url = str(tmp_path / "w")
    rows, seen = holder_while_writing(url)
    report = ar.write(rows(), url, shard_size=10, block_size=2, compression_strategy=CS.STANDARD_COMPRESSION)
    assert seen == [f"atlas-remote write {HOLDER}"]
    assert isinstance(report, ar.WriteReport) and report.examples == 20 and report.shards == 2

    url = str(tmp_path / "b")
    rows, seen = holder_while_writing(url)
    report = ar.build(
        lambda unit: rows(), ["one"], url, shard_size=10, block_size=2, compression_strategy=CS.STANDARD_COMPRESSION
    )
    assert seen == [f"atlas-remote build {HOLDER}"]
    assert isinstance(report, ar.WriteReport) and report.examples == 20


def test_convert_and_copy_name_themselves_too(tmp_path, monkeypatch):
    (tmp_path / "a.jsonl").write_text("".join(f'{{"i": {i}}}\n' for i in range(30)))
    held = []
    real = parts.StagedParts.__init__

    def spy(self, *args, **kw):
        real(self, *args, **kw)
        held.append(self.lease.record.purpose)

    monkeypatch.setattr(parts.StagedParts, "__init__", spy)
    report = ar.convert(str(tmp_path / "a.jsonl"), str(tmp_path / "c"), "jsonl", shard_size=10, block_size=2)
    ar.copy_dataset(str(tmp_path / "c"), str(tmp_path / "copy"))
    assert held == ["atlas-remote convert", "atlas-remote cp"]
    assert isinstance(report, ar.ConvertReport) and report.examples == 30


UNGUARDED = """
import sys
import atlas_remote as ar
ar.build("tables_maps:rows_of", [3, 4], sys.argv[1], workers=2, shard_size=5, block_size=2)
print("wrote")
"""


@pytest.mark.parametrize("guarded", [False, True])
def test_a_script_writing_with_workers_needs_the_main_guard(tmp_path, guarded):
    body = UNGUARDED if not guarded else "if __name__ == '__main__':\n" + textwrap.indent(UNGUARDED, "    ")
    script = tmp_path / "script.py"
    script.write_text(body)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(TESTS), os.environ.get("PYTHONPATH")]))}
    run = subprocess.run(
        [sys.executable, str(script), str(tmp_path / "ds")], env=env, capture_output=True, text=True, timeout=120
    )
    if guarded:
        assert run.returncode == 0 and run.stdout.count("wrote") == 1, run.stderr
        assert len(ar.open(str(tmp_path / "ds"))) == 21
        return
    assert run.returncode == 1 and "wrote" not in run.stdout
    last = run.stderr.strip().splitlines()[-1]
    assert last.startswith("atlas_remote.errors.UnguardedScriptError:"), run.stderr
    assert f"{script}, line 4" in last and 'if __name__ == "__main__":' in last
    assert not (tmp_path / "ds").exists(), "refused before the lease was taken"


@given(st.integers(0, 1 << 40), st.one_of(st.none(), st.integers(1, 64)))
def test_workers_never_exceed_what_the_rows_pay_for(input_bytes, workers):
    chosen = pipeline.workers_for(input_bytes, workers)
    assert 1 <= chosen <= (workers or os.cpu_count() or 1)
    assert chosen == 1 or chosen * pipeline.WORKER_BYTES <= input_bytes


def test_a_small_table_is_written_in_this_process_whatever_the_workers(tmp_path, monkeypatch):
    started = []
    monkeypatch.setattr(pipeline, "quiet_resource_tracker", lambda: started.append("pool"))
    table = pa.table({"i": range(1000)})
    assert ar.write(table, str(tmp_path / "ds"), shard_size=100, workers=2).examples == 1000
    assert started == [], "no process pool for 8 KB of rows"


def test_a_part_that_finishes_after_its_write_ended_keeps_nothing(place):
    """A part still being written when its run is discarded (a Ray task running on after another task failed)
    used to write its shards and manifest back under the deleted staging folder (locally: a bare
    FileNotFoundError or files left behind); now it removes what it wrote and says why in one line."""
    url, options = place
    staged = parts.StagedParts(url, ar.WriteSettings(100, 10), options, holder="a test")
    spec = staged.spec(0)
    staged.discard()
    with pytest.raises(ar.WriteEndedError, match="part 0 finished after its write had ended"):
        spec.write([{"i": i} for i in range(250)])
    assert tree(url, options) == {}, "nothing staged, nothing committed"
