"""Training from a bucket: real DataLoaders (2 workers, each start method) over S3 and GCS, block-aware
shuffling, the shuffled stream with read-ahead, resumption, distributed coverage and streaming."""

from __future__ import annotations

import json
import shutil
import time
import urllib.request

import numpy as np
import pytest
import torch
from helpers import tries
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils.data import DataLoader

import atlas_remote as ar
from atlas_remote import CompressionStrategy as CS
from atlas_remote.training import (
    AtlasIterableDataset,
    BlockBatchSampler,
    BlockShuffleSampler,
    ShuffledStream,
    TensorLoader,
    collate_numpy,
)

N, SHARD, BLOCK = 480, 60, 6  # 8 shards of 10 blocks


def records(n: int = N) -> list[dict]:
    return [{"id": i, "text": f"example {i} " * (i % 7 + 1)} for i in range(n)]


def write(url: str, options=None, n: int = N) -> list[dict]:
    examples = records(n)
    with ar.AtlasDatasetWriter(url, SHARD, BLOCK, CS.SHARED_DICTIONARY_COMPRESSION, storage_options=options) as w:
        for example in examples:
            w.add_example(example)
    return examples


def ids(batches) -> list[int]:
    return [example["id"] for batch in batches for example in batch]


def planned(stream: ShuffledStream) -> list[int]:
    """The example order a DataLoader over the stream delivers: a batch from each worker's piece in turn."""
    deal, _ = stream.epochs.deal()
    per_worker = []
    for piece in deal.pieces[stream.rank * stream.workers : (stream.rank + 1) * stream.workers]:
        order = [int(e) for a, b in piece.tolist() for _, _, ex in deal.plan.examples(a, b) for e in ex]
        per_worker.append([order[i : i + stream.batch_size] for i in range(0, len(order), stream.batch_size)])
    return [i for rnd in zip(*per_worker) for batch in rnd for i in batch]


@pytest.fixture(params=["s3", "gcs"])
def remote(request):
    options, bucket, _ = request.getfixturevalue(request.param)
    url = f"{'s3' if request.param == 's3' else 'gs'}://{bucket}/ds"
    write(url, options)
    return url, options


@pytest.mark.parametrize(
    "remote, method",
    [
        *(("s3", method) for method in ("fork", "spawn", "forkserver")),
        pytest.param("gcs", "fork", marks=pytest.mark.slow),
        ("gcs", "spawn"),  # gcsfs rebuilt in a fresh interpreter: the case where a second store can differ
        pytest.param("gcs", "forkserver", marks=pytest.mark.slow),
    ],
    indirect=["remote"],
)
def test_dataloader_two_workers_every_example_once_in_sampler_order(remote, method):
    url, options = remote
    ds = ar.open(url, storage_options=options)
    batches = BlockBatchSampler(BlockShuffleSampler(ds, window_blocks=4, seed=7), batch_size=16, num_workers=2)
    loader = DataLoader(
        ds,
        batch_sampler=batches,
        num_workers=2,
        multiprocessing_context=method,
        collate_fn=list,
        persistent_workers=True,
    )
    seen = []
    for epoch in (0, 1):
        batches.set_epoch(epoch)
        got = ids(loader)
        assert got == [i for batch in batches.batches() for i in batch], "the sampler's order, exactly"
        assert sorted(got) == list(range(N)), "every example once per epoch"
        seen.append(got)
    assert seen[0] != seen[1], "a new order each epoch"
    again = BlockBatchSampler(BlockShuffleSampler(ds, window_blocks=4, seed=7), batch_size=16, num_workers=2)
    assert [i for b in again.batches() for i in b] == seen[0], "the same order for the same seed and epoch"


def test_plain_dataloader_with_default_sampler_and_workers(remote):
    url, options = remote
    ds = ar.open(url, storage_options=options)
    loader = DataLoader(ds, batch_size=32, shuffle=True, num_workers=2, collate_fn=list)
    assert sorted(ids(loader)) == list(range(N))
    assert ids(DataLoader(ds, batch_size=50, num_workers=0, collate_fn=list)) == list(range(N))


def test_resumed_epoch_yields_exactly_the_rest(s3):
    options, bucket, _ = s3
    url = f"s3://{bucket}/ds"
    write(url, options)
    ds = ar.open(url, storage_options=options)
    batches = BlockBatchSampler(BlockShuffleSampler(ds, window_blocks=3, seed=1), batch_size=10, num_workers=2)
    batches.set_epoch(4)
    full = [i for b in batches.batches() for i in b]
    first = []
    for k, batch in enumerate(DataLoader(ds, batch_sampler=batches, num_workers=2, collate_fn=list)):
        first += [example["id"] for example in batch]
        if k == 6:
            break
    state = batches.state_dict(batches_seen=7)  # the loop saw 7 batches; the DataLoader had drawn more
    resumed = BlockBatchSampler(
        BlockShuffleSampler(ar.open(url, storage_options=options), window_blocks=3, seed=1),
        batch_size=10,
        num_workers=2,
    )
    resumed.load_state_dict(json.loads(json.dumps(state)))
    rest = ids(DataLoader(ds, batch_sampler=resumed, num_workers=2, collate_fn=list))
    assert first + rest == full

    sampler = BlockShuffleSampler(ds, window_blocks=3, seed=1)
    sampler.set_epoch(2)
    order = list(sampler)
    it = iter(sampler)
    head = [next(it) for _ in range(123)]
    again = BlockShuffleSampler(ds, window_blocks=3, seed=1)
    again.load_state_dict(sampler.state_dict(examples_seen=123))
    assert head + list(again) == order and len(order) == N


@pytest.mark.parametrize("drop_last", [False, True])
def test_distributed_ranks_are_disjoint_and_complete(tmp_path, drop_last):
    url = str(tmp_path / "ds")
    total = N - 5  # a short last block, so the ranks' shares differ
    write(url, n=total)
    ds = ar.open(url)
    ranks = [
        BlockShuffleSampler(ds, window_blocks=4, seed=3, rank=r, world_size=2, drop_last=drop_last) for r in (0, 1)
    ]
    orders = [list(sampler) for sampler in ranks]
    assert len(orders[0]) == len(orders[1]) == len(ranks[0]), "equal lengths per rank"
    assert not set(orders[0]) & set(orders[1]), "no example on both ranks"
    shared = {i // BLOCK for i in orders[0]} & {i // BLOCK for i in orders[1]}
    assert len(shared) <= 4, "blocks read by both ranks: only the window their pieces' edge cuts"
    if drop_last:
        assert all(len(o) == len(set(o)) for o in orders) and len(orders[0]) < total / 2
    else:  # the shorter rank repeats some of its own examples
        assert set(orders[0]) | set(orders[1]) == set(range(total))
        assert sum(len(o) - len(set(o)) for o in orders) == 2 * len(orders[0]) - total


def test_missing_shards_on_a_node(tmp_path):
    url = tmp_path / "ds"
    write(str(url))
    shutil.rmtree(url / "3")
    ds = ar.open(str(url))
    order = list(BlockShuffleSampler(ds, window_blocks=2, seed=0))
    assert sorted(order) == list(range(len(ds))) and len(ds) == N - SHARD
    assert sorted(ds[i]["id"] for i in order) == [i for i in range(N) if not 180 <= i < 240]


def test_streaming_splits_shards_across_ranks_and_workers(s3):
    options, bucket, _ = s3
    url = f"s3://{bucket}/ds"
    write(url, options)
    ds = ar.open(url, storage_options=options)
    per_rank = []
    for rank in (0, 1):
        loader = DataLoader(AtlasIterableDataset(ds, rank=rank, world_size=2), batch_size=None, num_workers=2)
        per_rank.append([example["id"] for example in loader])
    assert not set(per_rank[0]) & set(per_rank[1]) and sorted(per_rank[0] + per_rank[1]) == list(range(N))
    for got in per_rank:  # each shard arrives whole and in order
        by_shard = {}
        for i in got:
            by_shard.setdefault(i // SHARD, []).append(i)
        assert all(v == list(range(k * SHARD, (k + 1) * SHARD)) for k, v in by_shard.items())


def test_block_aware_batches_fetch_each_block_about_once(tmp_path):
    """Counted at the server, across both worker processes: requests for data.bin per block touched."""
    from static_server import serve

    write(str(tmp_path / "ds"))
    with serve(str(tmp_path)) as base:
        ds = ar.open(f"{base}/ds", cache_bytes=1 << 20)
        batches = BlockBatchSampler(BlockShuffleSampler(ds, window_blocks=4, seed=5), batch_size=16, num_workers=2)
        assert sorted(ids(DataLoader(ds, batch_sampler=batches, num_workers=2, collate_fn=list))) == list(range(N))
        served = json.loads(urllib.request.urlopen(f"{base}/__requests__").read())
    block_gets = sum(n for path, n in served.items() if path.startswith("GET") and path.endswith("/data.bin"))
    assert block_gets <= 1.1 * (N // BLOCK), f"{block_gets} data.bin requests for {N // BLOCK} blocks"


def test_torch_tensors_decode_with_the_safe_unpickler(memory_url):
    import torch

    tensors = [torch.arange(i + 1, dtype=torch.int64) for i in range(20)] + [torch.ones(2, 3, dtype=torch.float16)]
    with ar.AtlasDatasetWriter(memory_url, 10, 4, CS.STANDARD_COMPRESSION) as w:
        for tensor in tensors:
            w.add_example({"tokens": tensor})
    ds = ar.open(memory_url)  # default policy: restricted, yet tensors are allowed as weights_only allows them
    assert all(torch.equal(ds[i]["tokens"], t) and ds[i]["tokens"].dtype == t.dtype for i, t in enumerate(tensors))


@pytest.mark.parametrize("workers", [0, 2])
def test_shuffled_stream_serves_every_example_once_in_the_planned_order(s3, workers):
    options, bucket, _ = s3
    url = f"s3://{bucket}/ds"
    write(url, options)
    ds = ar.open(url, storage_options=options)
    stream = ShuffledStream(ds, 16, num_workers=workers, window_blocks=8, run_blocks=2, collate=list)
    stream.set_epoch(3)
    got = ids(DataLoader(stream, batch_size=None, num_workers=workers))
    assert got == planned(stream), "the planned order, exactly"
    assert sorted(got) == list(range(N)) and len(stream) == -(-N // 16 // max(workers, 1)) * max(workers, 1)
    with pytest.raises(ValueError, match="num_workers=3"):
        list(DataLoader(ShuffledStream(ds, 16, num_workers=3), batch_size=None, num_workers=workers))


def test_runs_of_blocks_stay_together_within_a_shard(tmp_path):
    write(str(tmp_path / "ds"))
    ds = ar.open(str(tmp_path / "ds"))
    sampler = BlockShuffleSampler(ds, window_blocks=4, run_blocks=2, seed=9)
    plan = sampler.epochs.plan(0)
    windows = [plan.window(w)[1].tolist() for w in range(len(plan))]
    assert sorted(i for w in windows for i in w) == list(range(N)) == sorted(sampler)
    for window in windows:
        blocks = {i // BLOCK for i in window}
        assert len(blocks) == 4 and all(b ^ 1 in blocks for b in blocks), "pairs (2k, 2k+1) of one shard"
    assert len(plan) == N // BLOCK // 4


def test_shuffled_stream_keeps_the_next_windows_in_flight_and_no_more(tmp_path):
    """With prefetch=2, the blocks of the next two windows arrive while the consumer holds the first batch."""
    write(str(tmp_path / "ds"))
    ds = ar.open(str(tmp_path / "ds"))
    stream = ShuffledStream(ds, 8, window_blocks=4, run_blocks=2, prefetch=2, collate=list)  # 3 batches a window
    batches = iter(stream)

    def blocks_read_once_settled(at_least: int) -> int:
        deadline = time.monotonic() + 30
        while ds.stats.cache_misses < at_least and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.2)
        return ds.stats.cache_misses

    next(batches)
    assert blocks_read_once_settled(12) == 12, "3 windows of 4 blocks: the current one and the next two"
    for _ in range(3):  # into the second window: the fourth is asked for, and nothing beyond it
        next(batches)
    assert blocks_read_once_settled(16) == 16
    assert len(ds.blocks.memory) == 0, "an epoch does not fill the memory cache"


def test_shuffled_stream_fetches_each_run_once_across_workers(tmp_path):
    from static_server import serve

    write(str(tmp_path / "ds"))
    with serve(str(tmp_path)) as base:
        ds = ar.open(f"{base}/ds", cache_bytes=1 << 20)
        stream = ShuffledStream(ds, 16, num_workers=2, window_blocks=8, run_blocks=2, collate=list)
        assert sorted(ids(DataLoader(stream, batch_size=None, num_workers=2))) == list(range(N))
        served = json.loads(urllib.request.urlopen(f"{base}/__requests__").read())
    block_gets = sum(n for path, n in served.items() if path.startswith("GET") and path.endswith("/data.bin"))
    runs = N // BLOCK // 2  # adjacent runs that land in one window are merged into one request
    assert runs // 2 < block_gets <= runs, f"{block_gets} data.bin requests for {runs} runs of 2 blocks"
    index_gets = sum(n for path, n in served.items() if path.startswith("GET") and path.endswith("/index.npy"))
    assert index_gets <= 2 * (N // SHARD), "a worker opens the shards its piece reaches, once"


def test_shuffled_stream_resumes_with_the_rest_of_the_epoch(s3):
    options, bucket, _ = s3
    url = f"s3://{bucket}/ds"
    write(url, options)
    ds = ar.open(url, storage_options=options)
    stream = ShuffledStream(ds, 10, num_workers=2, window_blocks=4, collate=list, seed=5)
    first = []
    for k, batch in enumerate(DataLoader(stream, batch_size=None, num_workers=2)):
        first += [example["id"] for example in batch]
        if k == 6:
            break
    state = json.loads(json.dumps(stream.state_dict(batches_seen=7)))
    resumed = ShuffledStream(
        ar.open(url, storage_options=options), 10, num_workers=2, window_blocks=4, collate=list, seed=5
    )
    resumed.load_state_dict(state)
    rest = ids(DataLoader(resumed, batch_size=None, num_workers=2))
    assert len(first) == 70 and sorted(first + rest) == list(range(N)), "each example once"
    elastic = ShuffledStream(
        ar.open(url, storage_options=options), 10, num_workers=4, window_blocks=4, collate=list, seed=5
    )
    elastic.load_state_dict(state)  # 2 workers -> 4: the rest is re-dealt
    served = first + ids(DataLoader(elastic, batch_size=None, num_workers=4))
    assert sorted(served) == list(range(N)), "each example once: 410 left in 4 pieces of 102 or 103, no padding"
    with pytest.raises(ValueError, match="another epoch plan"):
        ShuffledStream(ds, 10, num_workers=2, window_blocks=8, seed=5).load_state_dict(state)


def test_numpy_collation_then_conversion_gives_what_default_collate_gives():
    from torch.utils.data import default_collate, default_convert

    batch = [
        {
            "x": np.full((3, 2), i, dtype=np.float32),
            "n": i,
            "f": i / 2,
            "s": f"e{i}",
            "t": np.arange(i, i + 4),
            "w": torch.ones(2) * i,
        }
        for i in range(5)
    ]
    ours, theirs = default_convert(collate_numpy(batch)), default_collate(batch)
    assert ours.keys() == theirs.keys() and ours["s"] == theirs["s"]
    for key in ("x", "n", "f", "t", "w"):
        assert ours[key].dtype == theirs[key].dtype and ours[key].equal(theirs[key]), key


@pytest.mark.parametrize("workers", [0, 2])
def test_tensor_loader_gives_tensor_batches(tmp_path, workers):
    write(str(tmp_path / "ds"), n=100)
    ds = ar.open(str(tmp_path / "ds"))
    ids_seen = []
    for batch in ShuffledStream(ds, 16, num_workers=workers, window_blocks=4).loader():
        assert isinstance(batch["id"], torch.Tensor) and batch["id"].dtype == torch.int64
        ids_seen += batch["id"].tolist()
    assert sorted(ids_seen) == list(range(100))
    streamed = TensorLoader(AtlasIterableDataset(ds), batch_size=16, num_workers=workers)
    assert sorted(i for batch in streamed for i in batch["id"].tolist()) == list(range(100))


# -- ragged tokens through the default loaders ------------------------------------------------------------------


def token_documents(n: int, dtype, seed: int = 0) -> list[dict]:
    rng = np.random.default_rng(seed)
    high = 50_000 if dtype == np.uint16 else 4_000_000_000
    return [
        {"id": i, "text": f"document {i}", "tokens": rng.integers(1, high, size=int(rng.integers(5, 301)), dtype=dtype)}
        for i in range(n)
    ]


@pytest.mark.parametrize("dtype, dtypes, expected", [(np.uint16, None, torch.int64), (np.uint32, "int32", torch.int32)])
def test_ragged_token_arrays_collate_in_the_default_loader(tmp_path, dtype, dtypes, expected):
    """The issue's case: documents of 5 to 300 uint16 tokens through ShuffledStream(...).loader() with 2 workers
    (it raised `Trying to resize storage that is not resizable` in worker 0). Every row equals its example, padded
    with 0; `tokens_lengths` says each row's length; uint16 arrives as int64 (nn.Embedding takes it), uint32 as
    int32 when dtypes asks (its values would not fit int32 otherwise: they are kept below 2^31 here)."""
    docs = token_documents(400, dtype)
    if dtypes:
        for doc in docs:
            doc["tokens"] = doc["tokens"] % (1 << 31)
    url = str(tmp_path / "ds")
    write_documents(url, docs)
    stream = ShuffledStream(ar.open(url), 8, num_workers=2, window_blocks=4, seed=1)
    options = {"dtypes": {"tokens": getattr(torch, dtypes)}} if dtypes else {}
    seen = []
    for batch in stream.loader(**options):
        tokens, lengths = batch["tokens"], batch["tokens_lengths"]
        assert tokens.dtype == expected and lengths.dtype == torch.int64 and tokens.shape[1] == int(lengths.max())
        for row, length, i in zip(tokens, lengths.tolist(), batch["id"].tolist()):
            assert row[:length].tolist() == docs[i]["tokens"].tolist() and not row[length:].any()
            seen.append(i)
        assert batch["text"] == [docs[i]["text"] for i in batch["id"].tolist()]
    assert sorted(seen) == list(range(400))
    embedding = torch.nn.Embedding(1 << 16, 4)
    if expected == torch.int64:
        embedding(tokens)  # what refused torch.uint16


def write_documents(url: str, docs: list, options=None) -> None:
    with ar.AtlasDatasetWriter(url, 100, 10, CS.STANDARD_COMPRESSION, storage_options=options) as w:
        for doc in docs:
            w.add_example(doc)


def test_ragged_arrays_collate_in_the_map_style_loader(tmp_path):
    docs = token_documents(120, np.uint16, seed=3)
    write_documents(str(tmp_path / "ds"), docs)
    ds = ar.open(str(tmp_path / "ds"))
    batches = BlockBatchSampler(BlockShuffleSampler(ds, window_blocks=2, seed=1), batch_size=8, num_workers=2)
    seen = []
    for batch in TensorLoader(ds, batch_sampler=batches, num_workers=2):
        assert batch["tokens"].dtype == torch.int64
        for row, length, i in zip(batch["tokens"], batch["tokens_lengths"].tolist(), batch["id"].tolist()):
            assert row[:length].tolist() == docs[i]["tokens"].tolist()
            seen.append(i)
    assert sorted(seen) == list(range(120))


@pytest.mark.parametrize(
    "bad, says",
    [
        ({"tokens": np.zeros((2, 3), np.int32)}, "key 'tokens'"),  # 2-D arrays of two shapes
        ({"other": 1}, "'tokens'"),  # a key missing in some examples
        ({"tokens": "text"}, "key 'tokens'"),  # a string where the others hold arrays
    ],
)
def test_what_cannot_be_collated_is_one_line_from_the_training_process(tmp_path, bad, says):
    from atlas_remote import CollateError

    docs = [{"id": i, "tokens": np.zeros((3, 3), np.int32)} for i in range(20)]
    docs[7] = {"id": 7, **bad}
    write_documents(str(tmp_path / "ds"), docs)
    stream = ShuffledStream(ar.open(str(tmp_path / "ds")), 20, num_workers=2, window_blocks=4)
    with pytest.raises(CollateError) as error:
        list(stream.loader())
    message = str(error.value)
    assert says in message and "\n" not in message and "Traceback" not in message and "worker" not in message
    with pytest.raises(CollateError):
        next(iter(DataLoader(stream, batch_size=None, num_workers=2)))["tokens"]  # a plain DataLoader: at first use


@settings(max_examples=tries(100), deadline=None)
@given(
    st.lists(st.lists(st.integers(0, 2**16 - 1), max_size=12), min_size=1, max_size=9),
    st.sampled_from([np.uint16, np.int32, np.float32]),
    st.integers(-1, 3),
)
def test_padding_keeps_every_row_and_says_its_length(rows, dtype, pad):
    from atlas_remote import CollateError

    batch = [{"x": np.array(row, dtype=dtype), "n": k} for k, row in enumerate(rows)]
    lengths = [len(row) for row in rows]
    if pad < 0 and dtype == np.uint16 and len(set(lengths)) > 1:
        with pytest.raises(CollateError, match="pad value -1 is not a uint16"):
            collate_numpy(batch, pad=pad)
        return
    out = collate_numpy(batch, pad=pad)
    if len(set(lengths)) == 1:
        assert "x_lengths" not in out and out["x"].shape == (len(rows), lengths[0])
    else:
        assert out["x_lengths"].tolist() == lengths and out["x"].shape == (len(rows), max(lengths))
    for got, row in zip(out["x"], rows):
        assert got[: len(row)].tolist() == np.array(row, dtype=dtype).tolist()
        assert (got[len(row) :] == pad).all()
    assert out["x"].dtype == dtype and out["n"].tolist() == list(range(len(rows)))


def client_and_ids(batch: list) -> dict:
    """A collate: which client the worker that made the batch reads through ("parent" outside a worker), and the
    batch's ids."""
    from torch.utils.data import get_worker_info

    info = get_worker_info()
    client = info.dataset.datasets[0].store.read_client if info else "parent"
    return {"client": client, "ids": [e["id"] for e in batch]}


@pytest.mark.slow
def test_loader_workers_read_through_obstore_and_forked_workers_through_s3fs(s3):
    """obstore's runtime does not survive a fork: loader() starts its workers from a fork server, so they read
    through obstore as this process does, and serves the workers' batches itself while they start (a loop slow
    enough for them to take over); a plain DataLoader's forked workers still read, through s3fs. The order is
    the planned one either way."""
    pytest.importorskip("obstore")
    options, bucket, _ = s3
    url = f"s3://{bucket}/ds"
    write(url, options, n=4 * N)
    ds = ar.open(url, storage_options=options)
    ds[0]  # obstore's runtime runs in this process
    assert ds.store.read_client == "obstore"
    stream = ShuffledStream(ds, 16, num_workers=2, window_blocks=8, run_blocks=2, collate=client_and_ids, seed=4)
    loader = stream.loader()
    ds.reset_stats()
    batches = [next(iter_loader := iter(loader))]
    # the first batch cost this process one window a worker's stream (fetched at once, so that the second batch
    # does not wait for its own): a request per run (4 runs of 2 blocks each) and per shard opened, and nothing
    # fetched ahead
    assert 1 <= ds.stats.requests["block"] <= 2 * 4 and ds.stats.requests["index"] <= 2 * 4
    assert set(ds.stats.requests) <= {"block", "index"}
    waited = time.monotonic()
    while not loader.handover.claimed() and time.monotonic() - waited < 120:
        time.sleep(0.05)  # a long first training step: the workers start meanwhile, and claim a round
    batches += list(iter_loader)
    here = loader.served_here
    assert 2 <= here < len(batches), "the workers took over"
    assert {b["client"] for b in batches[:here]} == {"parent"}
    assert {b["client"] for b in batches[here:]} == {"obstore"} and loader.batches_seen == len(batches) == len(stream)
    assert [i for b in batches for i in b["ids"]] == planned(stream)
    forked = list(DataLoader(stream, batch_size=None, num_workers=2, multiprocessing_context="fork"))
    assert {b["client"] for b in forked} == {"fsspec"}
    assert [i for b in forked for i in b["ids"]] == planned(stream)


SCRIPT = """
import json, sys
import atlas_remote as ar
from atlas_remote.training import ShuffledStream

ds = ar.open(sys.argv[1], storage_options=json.loads(sys.argv[2]))

def client(batch):
    from torch.utils.data import get_worker_info

    info = get_worker_info()
    return {{"client": info.dataset.datasets[0].store.read_client if info else "parent", "n": len(batch)}}

{body}
"""
LOOP = """import time
stream = ShuffledStream(ds, 16, num_workers=2, window_blocks=8, run_blocks=2, collate=client)
loader = stream.loader()
batches = [next(iter_loader := iter(loader))]
waited = time.monotonic()
while not loader.handover.claimed() and time.monotonic() - waited < 120:
    time.sleep(0.05)  # a long first training step: the workers start meanwhile, and claim a round
batches += list(iter_loader)
print(json.dumps([sorted({b["client"] for b in batches}), sum(int(b["n"]) for b in batches)]))"""


@pytest.mark.slow
@pytest.mark.parametrize(("guarded", "client"), [(True, "obstore"), (False, "fsspec")])
def test_a_script_without_the_main_guard_gets_forked_workers(s3, tmp_path, guarded, client):
    """A fresh worker runs the main script again: only a guarded script gets them; one without the guard keeps
    forked workers (on s3fs) rather than running its loop again in every worker."""
    pytest.importorskip("obstore")
    import subprocess
    import sys
    import textwrap

    options, bucket, _ = s3
    url = f"s3://{bucket}/ds"
    write(url, options, n=4 * N)
    body = 'if __name__ == "__main__":\n' + textwrap.indent(LOOP, "    ") if guarded else LOOP
    script = tmp_path / "train.py"
    script.write_text(SCRIPT.format(body=body))
    done = subprocess.run(
        [sys.executable, str(script), url, json.dumps(options)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout.splitlines()[-1]) == [[client, "parent"], 4 * N]


def test_a_start_up_storm_against_a_rate_limit_gets_every_first_batch(s3, proxy_endpoint):
    """Eight streams start at once (about 190 requests) against an endpoint that answers 503 SlowDown beyond 30
    requests a second: every one serves its first batch, none fails, and each 503 is one retry counted in its
    dataset's stats."""
    from concurrent.futures import ThreadPoolExecutor

    from conftest import Faults

    options, bucket, _ = s3
    url = f"s3://{bucket}/ds"
    write(url, options)
    through_proxy = {**options, "endpoint_url": proxy_endpoint}
    faults = Faults(proxy_endpoint)
    faults.set({"path": "/", "fault": "503", "times": 10**6, "per_second": 30})
    try:

        def first_batch(seed: int) -> tuple[list, ar.AtlasDataset]:
            ds = ar.open(url, storage_options=through_proxy)
            stream = ShuffledStream(ds, 16, window_blocks=8, run_blocks=2, collate=list, seed=seed)
            return next(iter(stream)), ds

        with ThreadPoolExecutor(8) as pool:
            started = list(pool.map(first_batch, range(8)))
        injected = faults.report()["injected"]["503"]
    finally:
        faults.set()
    assert [len(batch) for batch, _ in started] == [16] * 8
    assert injected > 0 and sum(ds.stats.retries for _, ds in started) == injected


def test_a_stream_fetches_its_first_window_alone_then_keeps_prefetch_ahead(tmp_path):
    """A job whose streams all start at once sends one window's requests a stream, not prefetch + 1 windows'."""
    import itertools

    from atlas_remote.training.serving import serve

    write(str(tmp_path / "ds"))
    ds = ar.open(str(tmp_path / "ds"))
    stream = ShuffledStream(ds, 8, window_blocks=4, run_blocks=2, prefetch=2, collate=list)
    deal, _ = stream.epochs.deal()
    events = []

    def fetch(source: int, examples: np.ndarray) -> list:
        events.append(1)
        time.sleep(0.05)
        events.append(-1)
        return ds.read(examples)

    served = [e["id"] for items in serve(deal.plan, deal.rest(0, 0), fetch, 2) for e in items]
    assert events[:3] == [1, -1, 1], "the first window alone, then the next ones"
    assert max(itertools.accumulate(events)) == 2, "then prefetch windows in flight at once"
    assert sorted(served) == list(range(N))
