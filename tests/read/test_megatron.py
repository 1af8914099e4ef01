"""A Megatron corpus read in place (`atlas_remote.megatron`): the documents the importer's sequences make, for
both dtypes and both header conventions, several files, gaps between sequences; the census from the .idx; the
requests it costs; and a .bin that does not hold what its .idx says, refused in one line.
(The hostile .idx cases are tests/hostile/test_hostile_importers.py's, run against both readers.)"""

from __future__ import annotations

import struct
import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from source_files import make_megatron

import atlas_remote as ar
from atlas_remote.training.census import block_ids


def documents_of(expected: list[dict]) -> list[np.ndarray]:
    """The importer's sequences (`{"tokens", "document"}`) joined into documents, in order."""
    docs: dict[int, list[np.ndarray]] = {}
    for sequence in expected:
        docs.setdefault(sequence["document"], []).append(sequence["tokens"])
    return [np.concatenate(parts) for _, parts in sorted(docs.items())]


def corpus_files(root: Path) -> tuple[list[str], list[np.ndarray]]:
    """Three files: uint16 and int32 ids, the header as megatron-core writes it and as some descriptions have it."""
    specs = [
        ("web", 120, np.uint16, 8, "entries"),
        ("code", 80, np.int32, 4, "documents"),
        ("books", 50, np.uint16, 8, "documents"),
    ]
    prefixes, docs = [], []
    for seed, (name, n, dtype, code, counted) in enumerate(specs):
        prefix = str(root / f"{name}_text_document")
        docs += documents_of(make_megatron(prefix, n, dtype, code, seed=seed, counted=counted))
        prefixes.append(prefix)
    return prefixes, docs


@pytest.mark.unit
def test_documents_are_the_importers_sequences_joined_in_their_dtype(tmp_path):
    prefixes, docs = corpus_files(tmp_path)
    corpus = ar.megatron([prefixes[0], f"{prefixes[1]}.idx", f"{prefixes[2]}.bin"])
    assert len(corpus) == len(docs) == 250 and list(corpus.layout().sizes) == [120, 80, 50]
    got = corpus.read(np.arange(len(corpus)))
    assert all(g["tokens"].dtype == d.dtype and np.array_equal(g["tokens"], d) for g, d in zip(got, docs))
    assert {str(g["tokens"].dtype) for g in got} == {"uint16", "int32"}
    shuffled = np.random.default_rng(0).permutation(len(docs))[:60]
    assert all(np.array_equal(g["tokens"], docs[i]) for g, i in zip(corpus.read(shuffled), shuffled))
    flat, lengths = corpus.documents(130, 40)  # the second file's documents 10..49
    assert flat.dtype == np.int32 and np.array_equal(flat, np.concatenate(docs[130:170]))
    assert lengths.tolist() == [len(d) for d in docs[130:170]]
    assert np.array_equal(corpus[-1]["tokens"], docs[-1])
    with pytest.raises(ValueError, match="cross from"):
        corpus.documents(110, 20)


@pytest.mark.unit
def test_a_glob_names_the_files_once_each_in_order(tmp_path):
    prefixes, docs = corpus_files(tmp_path)
    corpus = ar.megatron(str(tmp_path / "*_text_document.*"))  # .idx and .bin of each: one prefix each
    assert [f.name for f in corpus.files] == ["books_text_document", "code_text_document", "web_text_document"]
    assert len(corpus) == len(docs)


@pytest.mark.unit
def test_both_header_conventions_read_the_same_documents(tmp_path):
    a = documents_of(make_megatron(tmp_path / "a", 40, counted="entries"))
    b = documents_of(make_megatron(tmp_path / "b", 40, counted="documents"))
    first, second = ar.megatron(str(tmp_path / "a")), ar.megatron(str(tmp_path / "b"))
    assert len(first) == len(second) == 40
    for x, y, d in zip(first.read(range(40)), second.read(range(40)), a):
        assert np.array_equal(x["tokens"], d) and np.array_equal(y["tokens"], d)
    assert all(np.array_equal(x, y) for x, y in zip(a, b))
    assert first.layout().digest() != second.layout().digest(), "another .idx: another corpus for a checkpoint"


@pytest.mark.unit
def test_sequences_with_gaps_between_them_read_as_their_tokens(tmp_path):
    """An .idx may leave bytes of the .bin between sequences (the importer accepts it): each document is its
    sequences' tokens, read by ranges around the gaps."""
    docs = documents_of(make_megatron(tmp_path / "c", 30))
    raw = bytearray((tmp_path / "c.idx").read_bytes())
    sequences = struct.unpack("<Q", raw[18:26])[0]
    at = 34 + 4 * sequences
    lengths = np.frombuffer(bytes(raw[34:at]), np.int32)
    pointers = np.frombuffer(bytes(raw[at : at + 8 * sequences]), np.int64)
    data = (tmp_path / "c.bin").read_bytes()
    moved, out = [], bytearray()
    for k, (p, n) in enumerate(zip(pointers.tolist(), lengths.tolist())):
        out += b"\xee" * (k % 3) * 2  # 0, 2 or 4 bytes of nothing before each sequence
        moved.append(len(out))
        out += data[p : p + 2 * n]
    raw[at : at + 8 * sequences] = np.array(moved, np.int64).tobytes()
    (tmp_path / "c.idx").write_bytes(bytes(raw))
    (tmp_path / "c.bin").write_bytes(bytes(out))
    corpus = ar.megatron(str(tmp_path / "c"))
    assert all(np.array_equal(g["tokens"], d) for g, d in zip(corpus.read(range(30)), docs))
    flat, _ = corpus.documents(3, 20)
    assert np.array_equal(flat, np.concatenate(docs[3:23]))


@pytest.mark.unit
def test_token_counts_come_from_the_idx_and_are_the_blocks_tokens(tmp_path):
    prefixes, docs = corpus_files(tmp_path)
    corpus = ar.megatron(prefixes, block_tokens=1000)
    corpus.reset_stats()
    counts = ar.TokenCounts.of(corpus)
    assert corpus.stats.total_requests == 0, "no pass over the data"
    layout = corpus.layout()
    expected = np.bincount(block_ids(layout, np.arange(len(docs)))[1], weights=[len(d) for d in docs])
    assert counts.blocks.dtype == np.uint32 and np.array_equal(counts.blocks, expected.astype(np.uint32))
    assert counts.layout == layout.digest()
    assert all(3 <= b <= 12 for b in layout.block_sizes.tolist()), "about 1,000 tokens a block"
    with pytest.raises(ar.PackingError, match="under 'tokens', not 'ids'"):
        ar.TokenCounts.of(corpus, "ids")


@pytest.mark.unit
def test_requests_an_open_and_a_run_cost(tmp_path):
    prefixes, _ = corpus_files(tmp_path)
    corpus = ar.megatron(prefixes)
    assert dict(corpus.stats.requests) == {"idx": 3, "info": 3}, "each .idx whole in one read, each .bin's size"
    corpus.reset_stats()
    corpus.documents(0, 100)
    assert dict(corpus.stats.requests) == {"bin": 1}
    corpus.reset_stats()
    corpus.read(np.r_[5:40, 60:70, 130:140])
    assert dict(corpus.stats.requests) == {"bin": 3}, "one read a stretch of consecutive documents"


@pytest.mark.unit
def test_a_bin_shorter_than_its_idx_says_is_refused_naming_it(tmp_path):
    make_megatron(tmp_path / "short", 30)
    open(tmp_path / "short.bin", "r+b").truncate(1000)
    with pytest.raises(ar.FormatError, match="shorter than its .idx pointers") as bad:
        ar.megatron(str(tmp_path / "short"))
    assert bad.value.url == f"{tmp_path}/short.bin" and "\n" not in str(bad.value)
    with pytest.raises(ar.ObjectNotFoundError):
        ar.megatron(str(tmp_path / "missing"))


@pytest.mark.unit
def test_the_end_of_document_token_is_found_when_every_document_ends_with_it(tmp_path):
    make_megatron(tmp_path / "eod", 60, eod=0, counted="documents")
    make_megatron(tmp_path / "plain", 60)
    assert ar.megatron(str(tmp_path / "eod")).ends_with() == 0
    assert ar.megatron(str(tmp_path / "plain")).ends_with() is None


@pytest.mark.unit
@settings(max_examples=40, deadline=None)
@given(
    st.lists(st.lists(st.integers(0, 40), max_size=4), min_size=1, max_size=40),
    st.sampled_from(["entries", "documents"]),
    st.integers(1, 200),
    st.data(),
)
def test_any_documents_read_back_whole_and_counted(structure, counted, block_tokens, data):
    """Documents of any number of sequences (none included) of any length (0 included), either header: every
    document reads back, every run of documents is its tokens back to back, and the census sums them by block."""
    with tempfile.TemporaryDirectory() as root:
        prefix = f"{root}/p"
        lengths = [n for doc in structure for n in doc]
        tokens = np.arange(sum(lengths), dtype=np.int32)
        index = np.cumsum([0, *[len(doc) for doc in structure]])
        count = len(index) - (counted == "documents")
        with open(f"{prefix}.idx", "wb") as f:
            f.write(b"MMIDIDX\x00\x00" + struct.pack("<QBQQ", 1, 4, len(lengths), count))
            pointers = np.cumsum([0, *lengths[:-1]]) * 4 if lengths else np.zeros(0)
            f.write(np.array(lengths, np.int32).tobytes() + np.asarray(pointers, np.int64).tobytes())
            f.write(np.asarray(index, np.int64).tobytes())
        tokens.tofile(f"{prefix}.bin")
        corpus = ar.megatron(prefix, block_tokens=block_tokens)
        ends = np.cumsum([0, *[sum(doc) for doc in structure]])
        docs = [tokens[a:b] for a, b in zip(ends[:-1], ends[1:])]
        if counted == "documents" and not structure[-1]:  # its start is N, as the other convention's end is:
            docs = docs[:-1]  # a last document of no sequences is not counted (it holds no tokens)
        assert len(corpus) == len(docs)
        assert all(np.array_equal(g["tokens"], d) for g, d in zip(corpus.read(range(len(docs))), docs))
        first = data.draw(st.integers(0, max(len(docs) - 1, 0)))
        count = data.draw(st.integers(0, len(docs) - first))
        flat, got = corpus.documents(first, count)
        assert np.array_equal(flat, tokens[ends[first] : ends[first + count]])
        assert got.tolist() == [len(d) for d in docs[first : first + count]]
        blocks = ar.TokenCounts.of(corpus).blocks
        assert int(blocks.sum()) == len(tokens) and len(blocks) == -(-len(docs) // int(corpus.layout().block_sizes[0]))


def test_over_http_and_gcs_the_same_documents_in_the_same_requests(tmp_path, http_root, gcs):
    """Any URL the library reads: a static HTTP server (no listing: a prefix) and the GCS emulator (a glob)."""
    base, served = http_root
    docs = documents_of(make_megatron(served / "web_text_document", 50))
    over_http = ar.megatron(f"{base}/web_text_document")
    options, bucket, fs = gcs
    for suffix in (".idx", ".bin"):
        fs.pipe(f"{bucket}/mg/web_text_document{suffix}", (served / f"web_text_document{suffix}").read_bytes())
    over_gcs = ar.megatron(f"gs://{bucket}/mg/*.idx", options)
    for corpus, listed in ((over_http, {}), (over_gcs, {"list": 1})):  # a glob: one listing of its folder
        assert dict(corpus.stats.requests) == {"idx": 1, "info": 1, **listed}
        corpus.reset_stats()
        assert all(np.array_equal(g["tokens"], d) for g, d in zip(corpus.read(range(50)), docs))
        assert dict(corpus.stats.requests) == {"bin": 1}


def test_a_bin_rewritten_under_a_reader_is_refused_and_reopen_reads_the_new_one(s3, tmp_path):
    options, bucket, fs = s3
    docs = documents_of(make_megatron(tmp_path / "c", 40))
    for suffix in (".idx", ".bin"):
        fs.pipe(f"{bucket}/c{suffix}", (tmp_path / f"c{suffix}").read_bytes())
    corpus = ar.megatron(f"s3://{bucket}/c", options)
    assert np.array_equal(corpus[3]["tokens"], docs[3])
    flipped = np.concatenate(docs)[::-1].copy()
    fs.pipe(f"{bucket}/c.bin", flipped.tobytes())  # other tokens, the same size: the .idx still fits
    with pytest.raises(ar.DatasetChangedError) as changed:
        corpus.read([10])
    assert (changed.value.url, changed.value.path) == (f"s3://{bucket}", "c.bin") and "\n" not in str(changed.value)
    again = corpus.reopen()
    flat, _ = again.documents(0, 40)
    assert np.array_equal(flat, flipped)
