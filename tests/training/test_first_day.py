"""A language-model trainer's first day (issue 46): each misuse they met is one line saying what to do, and
nothing is served silently wrong: loader options the stream decides, a checkpoint of another seq_len, seq_len
longer than any run, a mixture holding an empty dataset, a single counts file for a mixture, a missing one."""

from __future__ import annotations

import numpy as np
import pytest

import atlas_remote as ar
from atlas_remote import CompressionStrategy as CS
from atlas_remote.training import ShuffledStream
from atlas_remote.training.tokens import TokenStream


def documents(url: str, n: int = 200, seed: int = 0, longest: int = 120) -> ar.AtlasDataset:
    rng = np.random.default_rng(seed)
    with ar.AtlasDatasetWriter(url, 50, 8, CS.STANDARD_COMPRESSION) as w:
        w.add_examples(
            {"tokens": rng.integers(1, 50_000, rng.integers(5, longest)).astype(np.uint16)} for _ in range(n)
        )
    return ar.open(url)


def test_loader_options_the_stream_decides_are_one_clear_error(tmp_path):
    """Before: `loader(batch_size=16)` yielded 3-D batches [16, 8, 513] without a word (nn.Embedding takes
    them), and `loader(num_workers=4)` raised "got multiple values for keyword argument"."""
    stream = TokenStream(documents(str(tmp_path / "ds")), 32, batch_size=8)
    with pytest.raises(ar.UsageError, match=r"TokenStream makes batches of 8 itself: give batch_size to TokenStream"):
        stream.loader(batch_size=16)
    with pytest.raises(ar.UsageError, match=r"made for num_workers=0 .*give num_workers to TokenStream\(...\)"):
        stream.loader(num_workers=4)
    batch = next(iter(stream.loader(num_workers=0)))  # the stream's own value is no contradiction
    assert batch["tokens"].shape == (8, 33)


def test_a_checkpoint_of_another_seq_len_names_seq_len(tmp_path):
    ds = documents(str(tmp_path / "ds"))
    saved = TokenStream(ds, 32, batch_size=4).state_dict(batches_seen=3)
    with pytest.raises(ar.CheckpointError, match=r"another epoch plan .*: seq_len, eod, key or the token counts"):
        TokenStream(ds, 64, batch_size=4).load_state_dict(saved)


def test_seq_len_longer_than_the_dataset_is_refused_before_any_worker_starts(tmp_path):
    """Before: an epoch of 0 batches, no warning, after 4 s of worker start-up."""
    ds = documents(str(tmp_path / "ds"), n=20, longest=30)
    with pytest.raises(ar.UsageError, match=r"packs into no row of seq_len \+ 1 = 100,001 tokens.* smaller seq_len"):
        TokenStream(ds, 100_000, batch_size=4, num_workers=2)


def test_a_mixture_holding_an_empty_dataset_is_refused(tmp_path):
    """Before: the other dataset served alone, its 0.7 share silently 1.0."""
    full = documents(str(tmp_path / "full"))
    with ar.AtlasDatasetWriter(str(tmp_path / "empty"), 50, 8):
        pass
    empty = ar.open(str(tmp_path / "empty"))
    for make in (
        lambda m: ShuffledStream(m, 8),
        lambda m: TokenStream(m, 32, batch_size=8),
    ):
        with pytest.raises(ar.UsageError, match=r"empty, dataset 1 of the mixture, holds no examples") as refused:
            make(ar.Mixture([full, empty], weights=[0.7, 0.3]))
        assert refused.value.url.endswith("empty")
    assert len(ShuffledStream(ar.Mixture([full, empty], weights=[1, 0]), 8)) > 0, "weight 0: nothing asked of it"


def counted(url: str, n: int, seed: int, options=None) -> ar.AtlasDataset:
    """Documents written with their token counts saved beside them (`<url>.tokens`)."""
    rng = np.random.default_rng(seed)
    with ar.AtlasDatasetWriter(url, 50, 8, CS.STANDARD_COMPRESSION, storage_options=options, tokens="tokens") as w:
        w.add_examples({"tokens": rng.integers(1, 50_000, rng.integers(5, 120)).astype(np.uint16)} for _ in range(n))
    return ar.open(url, storage_options=options)


def test_a_mixture_finds_each_datasets_counts_beside_it_or_by_its_url(tmp_path):
    """Before: counts per dataset by hand, in the mixture's order; one URL for a mixture said "token counts for
    another dataset or key" where the fix is one file per dataset."""
    web, code = counted(str(tmp_path / "web"), 300, 1), counted(str(tmp_path / "code"), 100, 2)
    mixture = ar.Mixture([web, code], weights=[0.7, 0.3])
    found = TokenStream(mixture, 32, batch_size=8, with_source=True)
    assert [ds.stats.requests["block"] for ds in (web, code)] == [0, 0], "no counting pass"
    by_url = TokenStream(mixture, 32, batch_size=8, with_source=True, counts={code.url: f"{code.url}.tokens"})
    served = [b["tokens"].tolist() for b in found]
    assert served == [b["tokens"].tolist() for b in by_url] and served
    with pytest.raises(ar.UsageError, match=r"one counts for a mixture of 2 datasets: give each its own"):
        TokenStream(mixture, 32, batch_size=8, counts=f"{web.url}.tokens")
    with pytest.raises(ar.UsageError, match=r"counts names 'elsewhere', which is none of the datasets"):
        TokenStream(mixture, 32, batch_size=8, counts={"elsewhere": f"{web.url}.tokens"})


def test_a_missing_counts_url_is_named_whole(s3):
    """Before: a raw FileNotFoundError naming the path with its s3:// lost."""
    options, bucket, _ = s3
    ds = counted(f"s3://{bucket}/web", 60, 3, options)
    with pytest.raises(ar.PackingError, match=rf"s3://{bucket}/missing.tokens: no token counts here: count them once"):
        TokenStream(ds, 32, batch_size=8, counts=f"s3://{bucket}/missing.tokens")


def test_without_counts_anywhere_the_stream_counts_and_says_so(tmp_path, caplog):
    ds = documents(str(tmp_path / "ds"))
    with caplog.at_level("WARNING", logger="atlas_remote"):
        stream = TokenStream(ds, 32, batch_size=8)
    assert "no token counts beside it" in caplog.text and "ds.tokens" in caplog.text
    assert len(stream) > 0


def test_a_pass_with_nothing_to_serve_starts_no_worker(tmp_path, monkeypatch):
    from torch.utils.data import DataLoader

    with ar.AtlasDatasetWriter(str(tmp_path / "empty"), 50, 8):
        pass
    started = []
    iterate = DataLoader.__iter__
    monkeypatch.setattr(DataLoader, "__iter__", lambda self: started.append(1) or iterate(self))
    stream = ShuffledStream(ar.open(str(tmp_path / "empty")), 8, num_workers=2)
    assert list(stream.loader()) == [] and started == [], "no DataLoader iterator, so no worker"
