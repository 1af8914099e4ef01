"""examples/megatron_in_place.py is docs/training.md's Megatron walkthrough: it runs here as a user runs it, against
the S3 endpoint the tests start, and the documentation quotes it as it is."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "megatron_in_place.py"


@pytest.mark.slow
def test_the_megatron_example_runs_against_s3(s3):
    """Two corpora on S3 read in place -> TokenStream over a 0.7/0.3 mixture with 2 workers -> a checkpoint on 2
    ranks -> the rest on 3 ranks: the script checks that the rows are the uninterrupted epoch's and exits 0."""
    options, bucket, _ = s3
    done = subprocess.run(
        [sys.executable, str(EXAMPLE), "--bucket", bucket, "--endpoint-url", options["endpoint_url"]],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert lines[0].endswith("800 documents in 2 files, opened with requests {'idx': 2, 'info': 2, 'list': 1}")
    assert lines[1].startswith("every document ends with token 0")
    assert lines[2].startswith("2 ranks took 10 batches each: 160 rows") and "on 2 then 3 ranks the same" in lines[4]
    assert "warn" not in done.stderr.lower(), "no eod= given: nothing doubled"


def test_the_documentation_quotes_the_example_as_it_is():
    docs = (EXAMPLE.parents[1] / "docs" / "training.md").read_text()
    section = docs.split("### A Megatron corpus in place, end to end", 1)[1]
    quoted = section.split("```python\n", 1)[1].split("```", 1)[0]
    assert quoted.count("\ndef ") >= 1 and quoted in EXAMPLE.read_text()
