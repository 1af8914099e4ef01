"""The examples in examples/ are the documentation's code: each runs here, as a user runs it, against the S3
endpoint the tests start."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.mark.slow
def test_the_language_model_example_runs_against_s3(s3):
    """Megatron corpora on S3 -> convert -> token counts -> TokenStream over a mixture with 2 workers -> a
    checkpoint on 2 ranks -> the rest on 3 ranks: the script checks that the rows are the uninterrupted
    epoch's and exits 0."""
    options, bucket, _ = s3
    done = subprocess.run(
        [
            sys.executable,
            str(EXAMPLES / "language_model.py"),
            "--bucket",
            bucket,
            "--endpoint-url",
            options["endpoint_url"],
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert lines[0].startswith("2 ranks took 10 batches each: 160 rows") and "on 2 then 3 ranks the same" in lines[2]


def test_the_documentation_quotes_the_example_as_it_is():
    """docs/training.md shows the heart of examples/language_model.py: the quote is the file's text, so the
    documentation cannot drift from the script the suite runs."""
    docs = (EXAMPLES.parent / "docs" / "training.md").read_text()
    script = (EXAMPLES / "language_model.py").read_text()
    section = docs.split("### A complete example", 1)[1]
    quoted = section.split("```python\n", 1)[1].split("```", 1)[0]
    assert quoted.count("\ndef ") >= 2 and quoted in script
