"""Rank and world size from the job the stream runs in (training/ranks.py): torch.distributed's process group once
initialised, else torchrun's RANK and WORLD_SIZE, else one process; explicit arguments win where they can be
meant (a data-parallel group), and a contradiction is one clear error."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from test_tokens import Documents

import atlas_remote as ar
from atlas_remote.training import BlockShuffleSampler, ShuffledStream
from atlas_remote.training.ranks import rank_and_world
from atlas_remote.training.tokens import TokenStream


@pytest.fixture
def job(monkeypatch):
    """torchrun's environment for one rank (no process group)."""

    def place(rank: int, world: int) -> None:
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setenv("WORLD_SIZE", str(world))

    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    return place


def test_outside_a_job_one_process_serves_everything(job):
    assert rank_and_world(None, None, "x") == (0, 1)
    assert rank_and_world(2, 4, "x") == (2, 4)


def test_torchruns_environment_places_each_stream_and_sampler(job):
    docs = Documents([20] * 64, 16, 4)
    job(1, 2)
    tokens, shuffled = TokenStream(docs, 15, batch_size=2, counts=None), ShuffledStream(docs, 4)
    sampler = BlockShuffleSampler(docs)
    assert [(s.rank, s.world_size) for s in (tokens, shuffled, sampler)] == [(1, 2)] * 3
    job(0, 2)
    other = TokenStream(docs, 15, batch_size=2)
    rows = [tuple(row) for batch in tokens for row in batch["tokens"].tolist()]
    rows0 = [tuple(row) for batch in other for row in batch["tokens"].tolist()]
    assert rows and rows0 and not set(rows) & set(rows0), "the two ranks serve different rows"


@pytest.mark.parametrize(
    "given, job_place, expected",
    [
        ((None, None), (3, 4), (3, 4)),
        ((3, None), (3, 4), (3, 4)),
        ((None, 4), (3, 4), (3, 4)),
        ((3, 4), (3, 4), (3, 4)),
        ((1, 2), (3, 4), (1, 2)),  # a data-parallel group of 2 (tensor parallelism of 2): its own rank
        ((0, 1), (3, 4), (0, 1)),  # no data parallelism: every rank the same data, as asked
    ],
)
def test_explicit_arguments_win_where_they_can_be_meant(job, given, job_place, expected):
    job(*job_place)
    assert rank_and_world(*given, "ShuffledStream") == expected


@pytest.mark.parametrize(
    "given, message",
    [
        ((0, 4), r"rank=0, where torchrun's environment \(RANK, WORLD_SIZE\) says this is rank 3 of 4"),
        ((0, None), r"rank=0, where .* says this is rank 3 of 4"),
        ((None, 8), r"world_size=8, where .* says 4 ranks"),
        ((0, 3), r"world_size=3, where .* says 4 ranks: give a data-parallel group's size \(one dividing 4\)"),
        ((None, 2), r"world_size=2 \(a data-parallel group of the 4 ranks\) needs rank= too"),
        ((2, 2), r"rank must be in \[0, 2\), got 2"),
        ((True, None), r"rank must be an integer"),
    ],
)
def test_what_contradicts_the_job_is_one_clear_error(job, given, message):
    job(3, 4)
    with pytest.raises(ar.UsageError, match=message) as refused:
        rank_and_world(*given, "TokenStream")
    assert str(refused.value).startswith("TokenStream: ") and "\n" not in str(refused.value)


def test_a_broken_environment_is_named(job, monkeypatch):
    job(0, 2)
    monkeypatch.setenv("RANK", "zero")
    with pytest.raises(ar.UsageError, match="RANK='zero' and WORLD_SIZE='2' in the environment"):
        rank_and_world(None, None, "x")


RANK = textwrap.dedent(
    """
    import json, sys
    import torch.distributed as dist
    import atlas_remote as ar

    rank, init, url, out = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
    dist.init_process_group("gloo", init_method=f"file://{init}", rank=rank, world_size=2)
    stream = ar.TokenStream(ar.open(url), 16, batch_size=4, num_workers=1)  # no rank=, no world_size=
    rows = [row for batch in stream.loader() for row in batch["tokens"].tolist()]
    json.dump({"place": [stream.rank, stream.world_size], "rows": rows}, open(out, "w"))
    dist.barrier()
    dist.destroy_process_group()
    """
)


def test_two_ranks_with_a_process_group_and_no_rank_get_different_rows(tmp_path):
    """Before: both ranks served the whole epoch, the same batches (rank 0 of 1 each)."""
    url = str(tmp_path / "tokens")
    rng = np.random.default_rng(0)
    with ar.AtlasDatasetWriter(url, 50, 8) as w:
        w.add_examples({"tokens": rng.integers(1, 50_000, rng.integers(5, 100)).astype(np.uint32)} for _ in range(300))
    script = tmp_path / "rank.py"
    script.write_text(RANK)
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    ranks = [
        subprocess.Popen(
            [sys.executable, str(script), str(r), str(tmp_path / "init"), url, str(tmp_path / f"{r}.json")], env=env
        )
        for r in range(2)
    ]
    try:
        assert [p.wait(timeout=180) for p in ranks] == [0, 0]
    finally:
        for p in ranks:
            p.kill()
    got = [json.loads((tmp_path / f"{r}.json").read_text()) for r in range(2)]
    assert [g["place"] for g in got] == [[0, 2], [1, 2]]
    rows = [{tuple(row) for row in g["rows"]} for g in got]
    whole = {tuple(row) for batch in ar.TokenStream(ar.open(url), 16, batch_size=4) for row in batch["tokens"].tolist()}
    assert rows[0] and rows[1] and not rows[0] & rows[1] and rows[0] | rows[1] == whole
