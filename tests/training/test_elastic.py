"""Training that survives change, with real DataLoaders: persistent workers reshuffle, a job resumes on another
number of workers, torchdata's StatefulDataLoader resumes, and mixtures of datasets on different stores."""

from __future__ import annotations

import json
from collections import Counter

import pytest

import atlas_remote as ar
from atlas_remote import CompressionStrategy as CS
from atlas_remote.training import ShuffledStream

N, SHARD, BLOCK = 480, 60, 6


def write(url: str, options=None, n: int = N, tag: str = "a") -> None:
    with ar.AtlasDatasetWriter(url, SHARD, BLOCK, CS.STANDARD_COMPRESSION, storage_options=options) as w:
        for i in range(n):
            w.add_example({"id": i, "tag": tag})


def ids(batches) -> list[int]:
    return [int(i) for batch in batches for i in batch["id"]]


@pytest.fixture
def s3_dataset(s3):
    options, bucket, _ = s3
    url = f"s3://{bucket}/ds"
    write(url, options)
    return url, options


def test_persistent_workers_reshuffle_every_epoch_and_resume(s3_dataset):
    """The README's loop with persistent_workers=True: three epochs, three orders, each example once per
    epoch; then a checkpoint taken mid-epoch on that loader and loaded into it serves exactly the rest."""
    url, options = s3_dataset
    stream = ShuffledStream(ar.open(url, storage_options=options), 16, num_workers=2, window_blocks=4, seed=1)
    loader = stream.loader(persistent_workers=True)
    orders = []
    for epoch in range(3):
        stream.set_epoch(epoch)
        orders.append(ids(loader))
    assert all(sorted(order) == list(range(N)) for order in orders)
    assert orders[0] != orders[1] != orders[2] != orders[0]

    stream.set_epoch(3)
    first = []
    for step, batch in enumerate(loader):
        first += batch["id"].tolist()
        if step == 4:
            saved = json.loads(json.dumps(loader.state_dict()))
            break
    assert saved["epoch"] == 3 and [deal["batches"] for deal in saved["deals"]] == [5]
    loader.load_state_dict(saved)  # the same persistent workers, told where to go on from
    rest = ids(loader)
    assert len(first) == 80 and sorted(first + rest) == list(range(N))
    stream.set_epoch(4)
    assert sorted(ids(loader)) == list(range(N)), "and the next epoch is whole again"


def test_a_job_killed_with_two_workers_resumes_with_four_exactly(s3_dataset):
    url, options = s3_dataset
    stream = ShuffledStream(ar.open(url, storage_options=options), 10, num_workers=2, window_blocks=4, seed=5)
    stream.set_epoch(2)
    loader = stream.loader()
    first = []
    for step, batch in enumerate(loader):
        first += batch["id"].tolist()
        if step == 6:
            state = json.loads(json.dumps(stream.state_dict(batches_seen=step + 1)))
            break
    del loader  # the job dies here; its workers with it
    resumed = ShuffledStream(ar.open(url, storage_options=options), 10, num_workers=4, window_blocks=4, seed=5)
    resumed.load_state_dict(state)
    rest = ids(resumed.loader())
    assert sorted(first + rest) == list(range(N)), "each example once: 410 left in 4 pieces of 102 or 103, no padding"


def test_same_workers_resume_in_the_order_an_uninterrupted_run_gives(s3_dataset):
    url, options = s3_dataset
    stream = ShuffledStream(ar.open(url, storage_options=options), 12, num_workers=2, window_blocks=4, seed=9)
    whole = ids(stream.loader())
    stream = ShuffledStream(ar.open(url, storage_options=options), 12, num_workers=2, window_blocks=4, seed=9)
    loader = stream.loader()
    for step, _ in enumerate(loader):
        if step == 6:  # 7 batches taken: an odd number, so the second worker's turn is next
            state = loader.state_dict()
            break
    again = ShuffledStream(ar.open(url, storage_options=options), 12, num_workers=2, window_blocks=4, seed=9)
    again.load_state_dict(state)
    assert ids(again.loader()) == whole[7 * 12 :]


@pytest.mark.parametrize("workers", [0, 2])
def test_stateful_dataloader_resumes_with_its_own_state_dict(s3_dataset, workers):
    from torchdata.stateful_dataloader import StatefulDataLoader

    url, options = s3_dataset

    def make(n_workers: int):
        stream = ShuffledStream(
            ar.open(url, storage_options=options), 8, num_workers=n_workers, window_blocks=4, seed=3, collate=list
        )
        return stream, StatefulDataLoader(stream, batch_size=None, num_workers=n_workers)

    _, loader = make(workers)
    whole = [e["id"] for batch in loader for e in batch]
    _, loader = make(workers)
    first = []
    for step, batch in enumerate(loader):
        first += [e["id"] for e in batch]
        if step == 8:
            saved = loader.state_dict()
            break
    _, again = make(workers)
    again.load_state_dict(saved)  # torchdata's own protocol: each worker gets its state back
    rest = [e["id"] for batch in again for e in batch]
    assert first + rest == whole

    if workers:  # torchdata refuses another num_workers; the stream takes the loader's state instead
        stream, wider = make(4)
        stream.load_state_dict(saved)
        more = [e["id"] for batch in wider for e in batch]
        assert sorted(first + more) == list(range(N)), "408 left in 4 pieces of 102: no padding"


def test_a_mixture_of_two_stores_in_fixed_proportions(s3, tmp_path):
    options, bucket, _ = s3
    write(f"s3://{bucket}/a", options, n=480, tag="a")
    write(str(tmp_path / "b"), n=240, tag="b")
    mixture = ar.Mixture(
        [ar.open(f"s3://{bucket}/a", storage_options=options), ar.open(str(tmp_path / "b"))], weights=[0.7, 0.3]
    )
    stream = ShuffledStream(mixture, 10, num_workers=2, window_blocks=4, seed=2, with_source=True, collate=list)
    epochs = []
    for epoch in range(2):
        stream.set_epoch(epoch)
        pairs = [pair for batch in stream.loader() for pair in batch]
        assert Counter(source for source, _ in pairs) == {0: 504, 1: 216}  # 0.7 and 0.3 of 720, exactly
        assert all(example["tag"] == "ab"[source] for source, example in pairs)
        epochs.append([(s, e["id"]) for s, e in pairs])
        seen = Counter(epochs[-1])
        assert {n for (s, _), n in seen.items() if s == 0} == {1, 2} and max(
            n for (s, _), n in seen.items() if s == 1
        ) == 1
    assert epochs[0] != epochs[1]
    repeat = ShuffledStream(
        ar.Mixture(mixture.datasets, repeat=[0.5, 2]), 10, window_blocks=4, collate=list, with_source=True
    )
    counts = Counter(source for batch in repeat.loader() for source, _ in batch)
    assert counts == {0: 240, 1: 480}
    choose = ShuffledStream(
        ar.Mixture(mixture.datasets, choose=[100, 50]), 10, window_blocks=4, collate=list, with_source=True
    )
    assert Counter(s for batch in choose.loader() for s, _ in batch) == {0: 100, 1: 50}


@pytest.mark.parametrize("workers", [0, 2])
def test_after_a_finished_epoch_every_way_of_saving_gives_the_next_epochs_start(tmp_path, workers):
    """loader.state_dict(), stream.state_dict() and stream.state_dict(batches_seen=n) with n the batches the loop
    took, and a StatefulDataLoader's own state: after the last batch, all say the next epoch's start, and
    resuming from it serves the next epoch whole, as a fresh stream does."""
    from torchdata.stateful_dataloader import StatefulDataLoader

    write(str(tmp_path / "ds"))
    ds = ar.open(str(tmp_path / "ds"))

    def make() -> ShuffledStream:
        return ShuffledStream(ds, 16, num_workers=workers, window_blocks=4, seed=2)

    stream = make()
    stream.set_epoch(1)
    loader = stream.loader()
    taken = sum(1 for _ in loader)
    states = [loader.state_dict(), stream.state_dict(), stream.state_dict(batches_seen=taken)]
    stateful = StatefulDataLoader(make(), batch_size=None, num_workers=workers)
    stateful.dataset.set_epoch(1)
    assert sum(1 for _ in stateful) == taken
    adopted = make()
    adopted.load_state_dict(stateful.state_dict())
    states.append(adopted.state_dict(batches_seen=0))
    assert all(state == states[0] for state in states), states
    assert states[0]["epoch"] == 2 and states[0]["deals"] == []
    with pytest.raises(ValueError, match="batches per rank left") as error:
        stream.state_dict(batches_seen=taken + 1)
    assert "\n" not in str(error.value)

    fresh = make()
    fresh.set_epoch(2)
    resumed = make()
    resumed.load_state_dict(json.loads(json.dumps(states[0])))
    assert ids(resumed.loader()) == ids(fresh.loader())
    assert sorted(ids(loader)) == list(range(N)), "the same loader goes on with the next epoch, whole"
    assert loader.state_dict()["epoch"] == 3


def test_a_mixture_is_as_long_as_one_epoch(tmp_path):
    write(str(tmp_path / "a"), n=480)
    write(str(tmp_path / "b"), n=240)
    a, b = ar.open(str(tmp_path / "a")), ar.open(str(tmp_path / "b"))
    assert len(ar.Mixture([a, b], weights=[0.7, 0.3])) == 720
    assert len(ar.Mixture([a, b], weights=[0.7, 0.3], epoch_size=100)) == 100
    assert len(ar.Mixture([a, b], repeat=[0.5, 2])) == 720
    assert len(ar.Mixture([a, b], choose=[10, 20])) == 30
    stream = ShuffledStream(ar.Mixture([a, b], choose=[10, 20]), 4, window_blocks=4, collate=list)
    assert sum(len(batch) for batch in stream) == 30


def batch_shares(sources_per_batch: list[list[int]]) -> tuple[float, float, float]:
    """(share of dataset 0: mean, standard deviation; fraction of batches from one dataset alone)."""
    import numpy as np

    shares = np.array([np.mean(np.asarray(b) == 0) for b in sources_per_batch])
    return float(shares.mean()), float(shares.std()), float(np.mean((shares == 0) | (shares == 1)))


def test_a_mixture_is_mixed_inside_every_batch(tmp_path):
    """0.7/0.3, batches of 32, a real DataLoader with 2 workers: no batch of one dataset alone (it was 99.5 %),
    the share of A in a batch spread at most as independent draws spread it (sd 0.08; it was 0.457), its mean
    0.7 within 0.02; and the epoch holds each dataset's count exactly."""
    write(str(tmp_path / "a"), n=2240, tag="a")
    write(str(tmp_path / "b"), n=960, tag="b")
    mixture = ar.Mixture([ar.open(str(tmp_path / "a")), ar.open(str(tmp_path / "b"))], weights=[0.7, 0.3])
    stream = ShuffledStream(mixture, 32, num_workers=2, window_blocks=8, seed=4, with_source=True, collate=list)
    batches = [[source for source, _ in batch] for batch in stream.loader()]
    mean, sd, alone = batch_shares(batches)
    assert alone <= 0.01 and sd <= 0.15 and abs(mean - 0.7) <= 0.02, (mean, sd, alone)
    assert Counter(s for b in batches for s in b) == {0: 2240, 1: 960}
    assert all(len(b) == 32 for b in batches)


def test_at_full_windows_a_batch_draws_as_independent_draws_would():
    """Windows of 64 blocks of 64 examples (the defaults, as the benchmark's datasets): the share of A in a
    batch of 32 has the spread of 32 independent draws of p = 0.7 (sd sqrt(0.21 / 32) = 0.081), read off the
    plan's order alone (no data)."""
    import numpy as np

    from atlas_remote.training.epoch_state import Deal, intervals
    from atlas_remote.training.plan import EpochPlan, Layout, Source

    a, b = Layout.of([64 * 640] * 7, [64] * 7), Layout.of([64 * 640] * 3, [64] * 3)
    plan = EpochPlan([Source(a, len(a)), Source(b, len(b))], seed=3, epoch=1, window_blocks=64, run_blocks=8)
    deal = Deal(plan, intervals(), 2, 32)
    batches = []
    for piece in deal.pieces:
        order = [d for start, stop in piece.tolist() for _, d, ex in plan.examples(start, stop) for _ in ex]
        batches += [order[i : i + 32] for i in range(0, len(order) - 31, 32)]
    mean, sd, alone = batch_shares(batches)
    assert abs(sd - np.sqrt(0.21 / 32)) <= 0.01 and alone == 0 and abs(mean - 0.7) <= 0.005, (mean, sd, alone)
