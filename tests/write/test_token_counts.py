"""Token counts recorded while writing (`tokens=`, `convert --tokens KEY [--dtype uint16]`): saved beside the
dataset at its commit, byte for byte what a counting pass would save, found there by a TokenStream with no pass;
lists of token ids (JSON lines) made arrays on the way in, each id checked to fit. And the writer's and convert's
other first-day traps: a default shard size, a map from the user's own script, more workers than inputs."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from source_files import make_megatron

import atlas_remote as ar
from atlas_remote.training.census import TokenCounts
from atlas_remote.training.tokens import TokenStream


def jsonl_corpus(folder, files: int = 3, documents: int = 40, seed: int = 0, top: int = 50_000) -> list[list[int]]:
    """JSON lines of {"text", "tokens": [ids]} as a tokenizer's script writes them; returns the token lists."""
    folder.mkdir()
    rng, out = np.random.default_rng(seed), []
    for n in range(files):
        docs = [rng.integers(1, top, rng.integers(3, 90)).tolist() for _ in range(documents)]
        lines = [json.dumps({"text": f"document {n}.{i}", "tokens": d}) for i, d in enumerate(docs)]
        (folder / f"{n}.jsonl").write_text("\n".join(lines) + "\n")
        out += docs
    return out


def test_a_writer_told_tokens_saves_the_counts_a_pass_would(tmp_path):
    url = str(tmp_path / "ds")
    rng = np.random.default_rng(1)
    with ar.AtlasDatasetWriter(url, 30, 4, tokens="tokens") as w:  # shards of 30: blocks cut at shard ends
        w.add_examples({"tokens": rng.integers(0, 1000, rng.integers(1, 60)).astype(np.uint32)} for _ in range(100))
    ds = ar.open(url)
    saved = (tmp_path / "ds.tokens").read_bytes()
    assert saved == TokenCounts.of(ds).to_bytes()
    stream = TokenStream(ar.open(url), 16, batch_size=4)  # finds them beside the dataset: no pass over it
    assert stream.packed.counts[0].to_bytes() == saved and stream.datasets[0].stats.requests["block"] == 0


def test_a_writer_needs_no_shard_size(tmp_path):
    """Before: AtlasDatasetWriter(url) raised where convert defaults shard_size to 10,000 (block_size 64)."""
    with ar.AtlasDatasetWriter(str(tmp_path / "ds")) as w:
        w.add_examples({"i": i} for i in range(100))
    assert ar.open(str(tmp_path / "ds")).metadata.shard_sizes == [100]
    assert json.loads((tmp_path / "ds" / "0" / "meta.json").read_text())["block_size"] == 64


@pytest.mark.parametrize("workers", [1, 2])
def test_convert_jsonl_lists_into_arrays_and_counts_in_one_command(tmp_path, workers):
    """Before: a JSONL corpus of token lists needed a --map of one's own to become arrays, then a counting pass."""
    docs = jsonl_corpus(tmp_path / "src")
    dest = str(tmp_path / "ds")
    ar.convert(str(tmp_path / "src"), dest, "jsonl", shard_size=25, block_size=8, tokens="tokens", dtype="uint16",
               workers=workers)  # fmt: skip
    ds = ar.open(dest)
    got = ds[:]
    assert [e["tokens"].tolist() for e in got] == docs and {e["tokens"].dtype for e in got} == {np.dtype(np.uint16)}
    assert (tmp_path / "ds.tokens").read_bytes() == TokenCounts.of(ds).to_bytes()
    rows = [row for batch in TokenStream(ds, 32, batch_size=4) for row in batch["tokens"]]
    assert rows and all(len(row) == 33 for row in rows)


def test_the_command_line_does_it_too(tmp_path):
    jsonl_corpus(tmp_path / "src")
    dest = str(tmp_path / "ds")
    command = [sys.executable, "-m", "atlas_remote.cli", "convert", str(tmp_path / "src"), dest, "--from", "jsonl"]
    done = subprocess.run(
        [*command, "--tokens", "tokens", "--dtype", "uint16", "--quiet"], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "ds.tokens").read_bytes() == TokenCounts.of(ar.open(dest)).to_bytes()


@pytest.mark.parametrize(
    "top, dtype, message",
    [
        (70_000, "uint16", r"token ids from \d+ to \d+ do not fit uint16 \(give a wider --dtype\)"),
        (100, "float32", r"dtype must be an integer type"),
    ],
)
def test_ids_that_do_not_fit_are_refused_naming_the_input_and_example(tmp_path, top, dtype, message):
    """numpy would wrap 70,000 into a uint16 silently."""
    jsonl_corpus(tmp_path / "src", files=1, top=top)
    with pytest.raises((ar.FormatError, ValueError), match=message):
        ar.convert(str(tmp_path / "src"), str(tmp_path / "ds"), "jsonl", tokens="tokens", dtype=dtype)
    assert not (tmp_path / "ds.tokens").exists()


def test_lists_without_dtype_are_written_and_the_counts_left_out_with_a_word(tmp_path, caplog):
    jsonl_corpus(tmp_path / "src", files=1)
    with caplog.at_level(logging.WARNING, logger="atlas_remote"):
        ar.convert(str(tmp_path / "src"), str(tmp_path / "ds"), "jsonl", tokens="tokens")
    assert len(ar.open(str(tmp_path / "ds"))) == 40 and not (tmp_path / "ds.tokens").exists()
    assert "no token counts saved (example 0" in caplog.text and "dtype=" in caplog.text, caplog.text


MAP_IN_SCRIPT = textwrap.dedent(
    """
    import sys
    import atlas_remote as ar

    def lengths(example):  # defined in the user's own script
        return {**example, "length": len(example["tokens"])}

    if __name__ == "__main__":
        report = ar.convert(sys.argv[1], sys.argv[2], "jsonl", map=lengths)
        print(ar.open(sys.argv[2])[0]["length"], report.examples)
    """
)


def test_convert_takes_a_map_from_the_users_script_with_one_worker(tmp_path):
    """Before: refused ("must be a function defined at the top level of an importable module") even with
    workers=1, where build() and write(map=) accept it."""
    docs = jsonl_corpus(tmp_path / "src", files=2)
    script = tmp_path / "convert_it.py"
    script.write_text(MAP_IN_SCRIPT)
    done = subprocess.run(
        [sys.executable, str(script), str(tmp_path / "src"), str(tmp_path / "ds")], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [str(len(docs[0])), "80"]


def test_more_workers_than_inputs_says_so(tmp_path):
    """Before: `--workers 2` on one Megatron prefix converted on one worker and said nothing."""
    make_megatron(tmp_path / "corpus")
    done = subprocess.run(
        [sys.executable, "-m", "atlas_remote.cli", "convert", str(tmp_path / "corpus"), str(tmp_path / "ds")]
        + ["--from", "megatron", "--workers", "2", "--quiet"],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    assert "warning: " in done.stderr and "1 input (megatron) for 2 workers: converted by 1" in done.stderr
