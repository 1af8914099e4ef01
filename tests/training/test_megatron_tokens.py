"""TokenStream over a Megatron corpus read in place on S3 (`atlas_remote.megatron`): uint16 and int32 files, both
header conventions, a few thousand documents; with 2 DataLoader workers it serves the rows the generic path
packs from the same documents (every token of the .bin once, outside what `dropped` states); a checkpoint
resumes at another world size; a changed corpus is refused; a 70/30 mixture with an Atlas dataset gives the
Mixture's shares; and what the .bin costs in requests and bytes, against the same tokens as an Atlas dataset."""

from __future__ import annotations

import json
import struct
import warnings
from collections import Counter

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from source_files import make_megatron

import atlas_remote as ar
from atlas_remote.training.census import TokenCounts
from atlas_remote.training.runs import Runs
from atlas_remote.training.tokens import TokenStream, packed_run

SEQ_LEN, BATCH = 127, 8
FILES = [  # name, documents, dtype, dtype code, header convention, first token (unique ids) or None
    ("web", 1400, np.uint16, 8, "entries", None),
    ("code", 900, np.int32, 4, "documents", 10**6),
    ("books", 700, np.uint16, 8, "documents", None),
]


class Documents:
    """The same documents in memory, as the generic path reads a dataset (`read`, one example at a time), under
    the corpus's own layout: the rows a TokenStream packs from it are the reference."""

    def __init__(self, docs: list[np.ndarray], layout, url: str = "reference") -> None:
        self.docs, self._layout, self.url = docs, layout, url

    def layout(self):
        return self._layout

    def __len__(self) -> int:
        return len(self.docs)

    def read(self, indices) -> list:
        return [{"tokens": self.docs[int(i)]} for i in indices]

    def iter(self, start: int, stop: int):
        return iter(self.read(range(start, stop)))


@pytest.fixture(scope="module")
def corpus_on_s3(s3_endpoint, tmp_path_factory):
    """(storage options, bucket, the corpus's glob, its documents in order): three files uploaded once."""
    import s3fs
    from conftest import unique

    options = {"endpoint_url": s3_endpoint, "key": "testing", "secret": "testing"}
    fs = s3fs.S3FileSystem(**options, skip_instance_cache=True)
    bucket = unique("megatron")
    fs.mkdir(bucket)
    local = tmp_path_factory.mktemp("megatron")
    docs: dict[str, list[np.ndarray]] = {}
    for seed, (name, n, dtype, code, counted, first) in enumerate(FILES):
        sequences = make_megatron(local / name, n, dtype, code, seed=seed, counted=counted, first_token=first)
        joined: dict[int, list[np.ndarray]] = {}
        for s in sequences:
            joined.setdefault(s["document"], []).append(s["tokens"])
        docs[name] = [np.concatenate(parts) for _, parts in sorted(joined.items())]
        for suffix in (".idx", ".bin"):
            fs.pipe(f"{bucket}/corpus/{name}_text_document{suffix}", (local / f"{name}{suffix}").read_bytes())
    ordered = [d for name in sorted(docs) for d in docs[name]]  # the glob's order: books, code, web
    return options, bucket, f"s3://{bucket}/corpus/*_text_document.idx", ordered


def rows_of(batches) -> list[bytes]:
    return [np.asarray(row, dtype=np.int64).tobytes() for batch in batches for row in batch["tokens"]]


def stream(data, **knobs) -> TokenStream:
    return TokenStream(data, SEQ_LEN, batch_size=BATCH, seed=3, window_blocks=8, **knobs)


def test_two_workers_serve_the_bins_tokens_as_the_generic_path_packs_them(corpus_on_s3):
    options, _, glob, docs = corpus_on_s3
    corpus = ar.megatron(glob, options, block_tokens=4096)
    assert len(corpus) == 3000 and [f.dtype for f in corpus.files] == [np.uint16, np.int32, np.uint16]
    tokens = stream(corpus, num_workers=2)
    served = rows_of(tokens.loader())
    reference = stream(Documents(docs, corpus.layout()), counts=TokenCounts.of(corpus))
    assert Counter(served) == Counter(rows_of(reference)), "the generic path's rows, each once"
    ((total, dropped),) = tokens.dropped
    padding = tokens.epochs.deal()[0].padding
    assert total == sum(len(d) for d in docs) and dropped / total < 0.02
    assert len(served) * (SEQ_LEN + 1) == total - dropped + padding * (SEQ_LEN + 1), "every token once, but dropped"
    unique = Counter(t for row in served for t in np.frombuffer(row, np.int64).tolist() if t >= 10**6)
    assert sum(n - 1 for n in unique.values()) <= padding * (SEQ_LEN + 1), "the int32 file's ids: none twice"


def test_a_checkpoint_resumes_at_another_world_size(corpus_on_s3):
    options, _, glob, _ = corpus_on_s3
    corpus = ar.megatron(glob, options, block_tokens=4096)
    whole = rows_of(stream(corpus))
    first, state = [], None
    for rank in range(2):  # two ranks of two workers take 5 batches each
        loader = stream(corpus, num_workers=2, rank=rank, world_size=2).loader()
        for step, batch in enumerate(loader):
            first += rows_of([batch])
            if step == 4:
                break
        state = json.loads(json.dumps(loader.state_dict()))
    rest = []
    for rank in range(3):  # three ranks finish the epoch
        resumed = stream(corpus, rank=rank, world_size=3)
        resumed.load_state_dict(state)
        rest += rows_of(resumed)
    assert Counter(first + rest) - Counter(whole) == Counter() and Counter(whole) - Counter(first + rest) == Counter()


def test_a_checkpoint_of_another_corpus_is_refused_though_its_layout_and_counts_are_the_same(tmp_path):
    """Two documents of one block trade a token (the .idx differs, the .bin is the same bytes): documents per
    file, blocks and each block's tokens are unchanged, so only the .idx's digest tells the corpora apart."""
    make_megatron(tmp_path / "a", 200)
    corpus = ar.megatron(str(tmp_path / "a"))
    state = stream(corpus).state_dict(batches_seen=3)
    raw = bytearray((tmp_path / "a.idx").read_bytes())
    n = struct.unpack("<Q", raw[18:26])[0]
    second = struct.unpack("<q", raw[34 + 12 * n + 8 : 34 + 12 * n + 16])[0]  # document 1's first sequence
    lengths = np.frombuffer(bytes(raw[34 : 34 + 4 * n]), np.int32).copy()
    pointers = np.frombuffer(bytes(raw[34 + 4 * n : 34 + 12 * n]), np.int64).copy()
    lengths[second - 1] += 1
    lengths[second] -= 1
    pointers[second] += 2
    raw[34 : 34 + 12 * n] = lengths.tobytes() + pointers.tobytes()
    (tmp_path / "a.idx").write_bytes(bytes(raw))
    changed = ar.megatron(str(tmp_path / "a"))
    assert np.array_equal(changed.layout().sizes, corpus.layout().sizes)
    assert np.array_equal(changed.layout().block_sizes, corpus.layout().block_sizes)
    assert np.array_equal(TokenCounts.of(changed).blocks, TokenCounts.of(corpus).blocks)
    with pytest.raises(ar.CheckpointError) as refused:
        stream(changed).load_state_dict(state)
    assert str(tmp_path / "a") in str(refused.value) and "\n" not in str(refused.value)


def test_a_mixture_with_an_atlas_dataset_gives_its_shares(corpus_on_s3):
    options, bucket, glob, _ = corpus_on_s3
    url = f"s3://{bucket}/atlas-docs"
    rng = np.random.default_rng(4)
    with ar.AtlasDatasetWriter(url, 300, 16, storage_options=options) as writer:
        at = 10**8
        for _ in range(1200):
            length = int(rng.integers(20, 400))
            writer.add_example({"tokens": np.arange(at, at + length, dtype=np.uint32)})
            at += length
    mixture = ar.Mixture([ar.megatron(glob, options), ar.open(url, storage_options=options)], weights=[0.7, 0.3])
    batches = list(TokenStream(mixture, 63, batch_size=32, num_workers=2, seed=1, with_source=True).loader())
    shares = np.array([float((batch["source"] == 0).float().mean()) for batch in batches[:-1]])
    assert abs(shares.mean() - 0.7) <= 0.02 and shares.std() <= 0.15, (shares.mean(), shares.std())
    for batch in batches:
        for source, row in zip(batch["source"].tolist(), batch["tokens"]):
            assert bool((row < 10**8).all()) == (source == 0), "a row comes from its source alone"


def test_an_eod_the_documents_already_end_with_is_warned_of(tmp_path):
    make_megatron(tmp_path / "eod", 60, eod=0)
    corpus = ar.megatron(str(tmp_path / "eod"))
    with pytest.warns(UserWarning, match="already end with token 0"):
        TokenStream(corpus, 31, batch_size=2, eod=0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        TokenStream(corpus, 31, batch_size=2)
        TokenStream(corpus, 31, batch_size=2, eod=7)


def fetched(report: dict, bucket: str, marker: str) -> tuple[int, int]:
    """(GET requests, bytes) of the objects under `bucket` whose path holds `marker`, from the proxy's report."""
    keys = [k for k in report["requests"] if k.startswith(f"GET /{bucket}/") and marker in k]
    return sum(report["requests"][k] for k in keys), sum(report["bytes_down"].get(k, 0) for k in keys)


def test_a_bin_byte_is_read_once_a_stream_and_requests_per_row_are_the_atlas_paths(corpus_on_s3, proxy_endpoint):
    """Through the fault proxy (it counts every process's requests and bytes): one stream reads each run with rows
    once, in one request at most, and no other byte of the .bin; with 2 workers a run is read again only where the Atlas
    path reads its blocks again (windows two streams share, the head start), and requests per row are no more."""
    from conftest import Faults

    options, bucket, glob, docs = corpus_on_s3
    through = {**options, "endpoint_url": proxy_endpoint}
    url = f"s3://{bucket}/atlas-copy"
    with ar.AtlasDatasetWriter(url, 10_000, 64, storage_options=options) as writer:  # convert's defaults
        for doc in docs:
            writer.add_example({"tokens": doc})
    TokenCounts.of(ar.open(url, storage_options=options)).save(f"{url}.tokens", options)
    faults = Faults(proxy_endpoint)
    corpus = ar.megatron(glob, through)
    faults.set()
    alone = stream(corpus)
    rows = len(rows_of(alone))
    sized = alone.packed.sized(alone.epochs.run_blocks)[0]
    with_rows = np.flatnonzero(sized.items > 0)
    starts, counts = Runs.spans(sized, with_rows)
    expected = 0
    for first, count in zip(starts.tolist(), counts.tolist()):
        file, lo = corpus.locate(first, count)
        expected += sum(r.size for r in file.spans(lo, lo + count))
    requests, nbytes = fetched(faults.report(), bucket, ".bin")
    assert nbytes == expected, "each run with rows, its bytes once, and no other byte"
    assert requests <= len(with_rows), "a request a run at most (runs that touch, read together, are merged)"

    ratios = {}
    for name, data, counts_url, marker in (
        ("megatron", corpus, None, ".bin"),
        ("atlas", ar.open(url, storage_options=through), f"{url}.tokens", "/atlas-copy/"),
    ):
        faults.set()
        served = rows_of(stream(data, num_workers=2, counts=counts_url).loader())
        requests, nbytes = fetched(faults.report(), bucket, marker)
        ratios[name] = (requests / len(served), nbytes)
        assert abs(len(served) - rows) <= rows // 100, "the same tokens, packed from other runs"
    assert ratios["megatron"][0] <= ratios["atlas"][0], ratios


def test_a_shuffled_stream_serves_every_document_once(tmp_path):
    """ShuffledStream takes a corpus as a dataset too: every document once an epoch, ragged token arrays padded."""
    from atlas_remote.training import ShuffledStream

    docs = make_megatron(tmp_path / "a", 120, np.int32, 4, first_token=0)
    corpus = ar.megatron(str(tmp_path / "a"), block_tokens=500)
    seen = []
    for batch in ShuffledStream(corpus, 16, seed=2):
        for row, length in zip(batch["tokens"], batch["tokens_lengths"]):
            seen.append(tuple(row[:length].tolist()))
    expected = {}
    for s in docs:
        expected.setdefault(s["document"], []).extend(s["tokens"].tolist())
    assert sorted(seen) == sorted(tuple(d) for d in expected.values())


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.integers(0, 30), max_size=40),
    st.sampled_from([None, 0, 7, 70_000]),
    st.sampled_from([np.uint16, np.int32]),
    st.randoms(use_true_random=False),
)
def test_a_run_packed_from_one_read_is_its_documents_concatenated(lengths, eod, dtype, rng):
    """packed_run (one gather over a run's tokens back to back) gives what concatenating each document's slice
    in the order, an eod after each, gives: values and dtype, for any lengths (0 included)."""
    lengths = np.array(lengths, dtype=np.int64)
    flat = np.arange(int(lengths.sum()), dtype=dtype) + 1
    order = np.array(rng.sample(range(len(lengths)), len(lengths)), dtype=np.int64)
    docs = np.split(flat, np.cumsum(lengths)[:-1]) if len(lengths) else []
    parts = [
        part
        for k in order.tolist()
        for part in ([docs[k]] + ([np.array([eod], np.min_scalar_type(eod))] if eod is not None else []))
    ]
    expected = np.concatenate(parts) if parts else flat[:0]
    got = packed_run(flat, lengths, order, eod)
    assert np.array_equal(got, expected) and (got.dtype == expected.dtype or not len(got))
