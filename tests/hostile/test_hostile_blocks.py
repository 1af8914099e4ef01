"""Blocks from someone else's bucket, written by an attacker: none runs code, forges a pointer, or makes memory or
CPU time out of a few bytes. Each gadget is an example whose pickle names an allowed global with hostile
arguments; the dataset is written with the library's own writer and read back as a user would."""

from __future__ import annotations

import collections
import fractions
import gc
import os
import pickle
import re
import struct
import subprocess
import sys
import tracemalloc
from pathlib import Path

import numpy as np
import pytest
from helpers import as_stranger, tries
from hypothesis import given, settings
from hypothesis import strategies as st

import atlas_remote as ar
from atlas_remote import CompressionStrategy as CS
from atlas_remote import UnsafePickleError
from atlas_remote.format.codec import PicklePolicy
from atlas_remote.trust.unpickler import SAFE_GLOBALS, walk
from atlas_remote.trust.walk_graph import AMPLIFICATION, Refused, limit_for

ROOT = Path(__file__).resolve().parents[2]


class Gadget:
    """An example that pickles as `function(*args)`, then optionally `.__setstate__(state)`."""

    def __init__(self, function, args, state=None):
        self.function, self.args, self.state = function, args, state

    def __reduce__(self):
        return (self.function, self.args) if self.state is None else (self.function, self.args, self.state)


def write(path: Path, examples: list, block_size: int = 1) -> str:
    """The attacker's dataset: written with their own key, so the reader takes its blocks as a stranger's."""
    with as_stranger(), ar.AtlasDatasetWriter(str(path), 100, block_size, CS.STANDARD_COMPRESSION) as writer:
        for example in examples:
            writer.add_example(example)
    return str(path)


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "atlas_remote.cli", *args], capture_output=True, text=True, timeout=120
    )


def test_a_torch_storage_cannot_load_a_pickle_that_runs_code(tmp_path):
    """torch.storage._load_from_bytes is torch.load(weights_only=False): a full pickle load. The storage bytes
    here are a pickle that would create a marker file."""
    marker = tmp_path / "ran"
    payload = pickle.dumps(Gadget(os.system, (f"touch {marker}",)))
    import torch.storage

    url = write(tmp_path / "ds", [Gadget(torch.storage._load_from_bytes, (payload,))])
    with pytest.raises(UnsafePickleError, match="posix.system|os.system"):
        ar.open(url)[0]
    for command in ("head", "verify"):
        done = run_cli(command, url)
        assert done.returncode == 1 and len(done.stderr.strip().splitlines()) <= 1, (command, done.stderr)
        assert "OK" not in done.stdout.split("\n")[-2:] or command == "head"
    assert not marker.exists(), "the payload ran"


def forged_dtype():
    """A dtype whose pickled state gives it a field: a record dtype built out of a plain one by its state."""
    return Gadget(np.dtype, ("f8", False, True), (3, "|", None, ("a",), {"a": (np.dtype("i8"), 0)}, 8, 1, 0))


@pytest.mark.parametrize(
    "gadget",
    [
        pytest.param(lambda: Gadget(np.dtype, ("O", False, True)), id="object dtype"),
        pytest.param(
            lambda: Gadget(np.dtype, ("V8", False, True), (3, "|", None, ("a",), {"a": (np.dtype("O"), 0)}, 8, 1, 0)),
            id="record with an object field flagged as none",
        ),
        pytest.param(
            lambda: Gadget(np.dtype, ("V8", False, True), (3, "|", None, ("a",), {"a": (np.dtype("i8"), 4)}, 8, 1, 0)),
            id="record field past its end",
        ),
        pytest.param(forged_dtype, id="forged fields"),
        pytest.param(
            lambda: Gadget(np._core.numeric._frombuffer, (b"A" * 8, np.dtype("O"), (1,), "C")), id="frombuffer object"
        ),
        pytest.param(
            lambda: Gadget(np._core.multiarray._reconstruct, (np.ndarray, (10**9,), b"b")), id="reconstruct size"
        ),
        pytest.param(lambda: Gadget(np._core.multiarray.scalar, (np.dtype("O"), b"A" * 8)), id="object scalar"),
    ],
)
def test_numpy_cannot_forge_pointers_or_allocate(tmp_path, gadget):
    url = write(tmp_path / "ds", [gadget()])
    with pytest.raises(UnsafePickleError):
        ar.open(url)[0]
    done = run_cli("head", url)
    assert done.returncode == 1, f"exit {done.returncode}: {done.stderr}"  # not 139: no segfault


def test_records_and_subarrays_of_plain_data_read_back(tmp_path):
    """L5Kit's zarr frames are records with subarray fields: plain data, read without trusted=True."""
    record = np.dtype([("timestamp", "<i8"), ("position", "<f4", (2,)), ("nested", [("a", "u1"), ("b", "S3")])])
    frames = np.zeros(5, dtype=record)
    frames["timestamp"] = np.arange(5)
    frames["position"][:, 1] = 2.5
    frames["nested"]["b"] = b"abc"
    examples = [{"frames": frames, "one": frames[3], "raw": np.frombuffer(b"12345678", dtype="V4")}]
    got = ar.open(write(tmp_path / "ds", examples))[0]
    assert got["frames"].dtype == record and np.array_equal(got["frames"], frames)
    assert got["one"] == frames[3] and got["raw"].tobytes() == b"12345678"


def test_an_array_built_with_a_forged_dtype_is_refused_once_loaded(tmp_path):
    """The review's gadget: an array whose dtype's state claims a field; refused before anyone touches it."""
    array = np.zeros(2, dtype=np.float64)
    reduced = list(array.__reduce__())
    state = list(reduced[2])
    state[2] = forged_dtype()
    url = write(tmp_path / "ds", [Gadget(reduced[0], reduced[1], tuple(state))])
    with pytest.raises(UnsafePickleError, match="dtype"):
        ar.open(url)[0]


@pytest.mark.parametrize(
    "gadget",
    [
        pytest.param(lambda: Gadget(list, (range(50_000_000),)), id="list(range)"),
        pytest.param(lambda: Gadget(frozenset, (range(20_000_000),)), id="frozenset(range)"),
        pytest.param(lambda: Gadget(bytearray, (1_500_000_000,)), id="bytearray(size)"),
        pytest.param(lambda: Gadget(fractions.Fraction, ("1e100000000",)), id="Fraction(exponent)"),
        pytest.param(lambda: Gadget(collections.deque, (range(10**8),)), id="deque(range)"),
        pytest.param(lambda: Gadget(collections.Counter, (range(10**8),)), id="Counter(range)"),
        pytest.param(lambda: Gadget(int, ("9" * 100_000,)), id="int(text)"),
        pytest.param(lambda: Gadget(dict, (range(10**8),)), id="dict(range)"),
        pytest.param(lambda: Gadget(collections.defaultdict, (os.system,)), id="defaultdict(os.system)"),
    ],
)
def test_a_few_bytes_never_make_gigabytes_or_minutes(tmp_path, gadget):
    url = write(tmp_path / "ds", [gadget()])
    tracemalloc.start()
    with pytest.raises(UnsafePickleError):
        ar.open(url)[0]
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert peak < 50 * 1024 * 1024, f"{peak:,} bytes at the peak"


def test_copies_of_one_list_cannot_multiply_memory():
    """set(L) over and over on one memoized list: each copy is charged, and the block refused at the bound."""
    items = list(range(200_000))
    block = [Gadget(set, (items,)) for _ in range(200)]
    with pytest.raises(UnsafePickleError, match="more than"):
        PicklePolicy().loads(pickle.dumps(block, protocol=4))


def traced_peak(load, *args) -> int:
    """The most memory `load(*args)` held at once, by tracemalloc; whatever it raises is let through."""
    gc.collect()
    tracemalloc.start()
    try:
        load(*args)
    finally:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    return peak


def test_a_block_of_empty_sets_is_refused_before_it_is_built(tmp_path):
    """The review's block: empty sets, 2 bytes each (EMPTY_SET, MEMOIZE), 224 bytes each in memory. 600,000 of
    them (1.2 MB decompressed, a few hundred bytes stored) built 135 MB and were accepted; now refused with none
    of them built. What is held at the peak is the walk's own records (about 120 bytes a set, charged 312), less
    than half of what the block may build: measured on 100,000 sets, where the same shares hold (tracemalloc makes
    the walk of 600,000 fifty times slower)."""
    url = write(tmp_path / "ds", [[set() for _ in range(600_000)]])
    with pytest.raises(UnsafePickleError, match="pickle opcodes would build more than"):
        ar.open(url)[0]
    url = write(tmp_path / "smaller", [[set() for _ in range(100_000)]])
    peak = traced_peak(lambda: pytest.raises(UnsafePickleError, ar.open(url).__getitem__, 0))
    assert peak < limit_for(200_000, 1 << 30) // 2, f"{peak:,} bytes at the peak"


PROTOCOL = b"\x80\x04"
MEMO = b"".join(b"M" + (1000 + i).to_bytes(2, "little") + b"\x94" for i in range(256))  # 256 distinct ints
_text = st.text(max_size=40).map(lambda t: t.encode("utf-8", "surrogatepass")[:255])
_item = st.one_of(  # a run of opcodes that pushes exactly one value, valid after MEMO
    st.sampled_from([b"\x8f", b"}", b"]", b")", b"N", b"\x88", b"(\x91", b"(l", b"(d", b"(t", b"(Nt"]),
    st.sampled_from([b"N\x85", b"NN\x86", b"NNN\x87", b"h\x01\x94", b"N2\x86", b"Nq\xff"]),
    st.binary(min_size=1, max_size=1).map(lambda b: b"K" + b),
    st.binary(min_size=2, max_size=2).map(lambda b: b"M" + b),
    st.binary(min_size=4, max_size=4).map(lambda b: b"J" + b),
    st.floats().map(lambda f: b"G" + struct.pack(">d", f)),
    _text.map(lambda t: b"\x8c" + bytes([len(t)]) + t + b"\x94"),
    st.binary(max_size=40).map(lambda b: b"C" + bytes([len(b)]) + b),
    st.integers(0, 255).map(lambda i: b"h" + bytes([i])),
    st.integers(1, 300).map(lambda n: b"\x8f(" + b"".join(b"h" + bytes([i % 256]) for i in range(n)) + b"\x90"),
    st.integers(1, 300).map(lambda n: b"(" + b"".join(b"h" + bytes([i % 256]) for i in range(n)) + b"\x91"),
    st.integers(1, 300).map(lambda n: b"}(" + b"".join(b"h" + bytes([i % 256]) + b"N" for i in range(n)) + b"u"),
)
_stream = st.lists(st.tuples(_item, st.integers(1, 3000)), min_size=1, max_size=6).map(
    lambda runs: PROTOCOL + MEMO + b"](" + b"".join(item * count for item, count in runs) + b"e."
)


@pytest.mark.slow
@settings(max_examples=tries(120), deadline=None)
@given(_stream, st.booleans())
def test_what_opcodes_build_never_exceeds_their_bound(data, into_a_list):
    """For any run of opcodes (here: containers, memo references, numbers, strings and bytes, densely repeated):
    what the C unpickler holds at its peak is within the walk's charges."""
    if not into_a_list:  # left on the unpickler's stack instead
        data = data[: len(PROTOCOL + MEMO)] + data[len(PROTOCOL + MEMO) + 2 : -2] + b"N."
    charged, slack = walk(data, 1 << 40), 64 * 1024  # slack: the unpickler object itself, its first stack and memo
    assert traced_peak(pickle.loads, data) <= charged + slack
    assert traced_peak(walk, data, 1 << 40) <= charged + slack  # the walk's own records too


@settings(max_examples=tries(100), deadline=None)
@given(
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=30) | st.binary(),
        lambda inner: (
            st.lists(inner)
            | st.tuples(inner, inner)
            | st.dictionaries(st.text(max_size=8), inner)
            | st.frozensets(st.integers() | st.text(max_size=8))
        ),
        max_leaves=40,
    ),
    st.integers(0, pickle.HIGHEST_PROTOCOL),
)
def test_the_walk_reads_every_pickle_a_pickler_writes(value, protocol):
    """Pickles of any data, at every protocol, are walked to their STOP without complaint, and within the charges
    (before protocol 3, bytes and sets are pickled through globals the restricted unpickler does not name)."""
    data = pickle.dumps([value], protocol=protocol)
    try:
        charged = walk(data, 1 << 40)
    except UnsafePickleError as refused:
        assert protocol < 3 and "refused to unpickle global" in str(refused)
        return
    assert traced_peak(pickle.loads, data) <= charged + 64 * 1024
    assert PicklePolicy().loads(data) == [value]


@pytest.mark.parametrize(
    ("data", "error"),
    [
        pytest.param(PROTOCOL + b"Nr\x00\xe1\xf5\x050N.", Refused, id="LONG_BINPUT 100,000,000"),
        pytest.param(PROTOCOL + b"Np99999999\n0N.", Refused, id="PUT 99,999,999"),
        pytest.param(PROTOCOL + b"\x8e" + (1 << 40).to_bytes(8, "little") + b"x.", ValueError, id="BINBYTES8 1 TB"),
        pytest.param(PROTOCOL + b"X\xff\xff\xff\x7fabc.", ValueError, id="BINUNICODE past the end"),
        pytest.param(PROTOCOL + b"\x95" + (1 << 30).to_bytes(8, "little") + b"N.", ValueError, id="FRAME 1 GB"),
        pytest.param(PROTOCOL + b"N\xff.", ValueError, id="not an opcode"),
        pytest.param(PROTOCOL + b"N", ValueError, id="no STOP"),
    ],
)
def test_the_walk_refuses_what_no_pickler_writes(data, error):
    """A memo index past the block's end makes CPython's C unpickler allocate 16 bytes per index before it fails
    (a 9-byte block took 1.6 GB); a length past the end, the bytes it claims. The walk refuses both unbuilt."""
    peak = traced_peak(lambda: pytest.raises(error, walk, data, 1 << 40))
    assert peak < 1024 * 1024


def test_a_block_larger_than_its_bound_allows_is_walked():
    """A block whose size alone could build more than twice max_block_bytes is refused by the walk's charges: 2 MB
    of empty dicts (72 bytes each in memory) are refused against a 16 MiB cap, unbuilt; 10 MB of bytes pass."""
    data = PROTOCOL + b"](" + b"}" * 2_000_000 + b"e."
    with pytest.raises(Refused, match="at most 2x max_block_bytes"):
        PicklePolicy().loads(data, max_block_bytes=8 << 20)
    assert traced_peak(lambda: pytest.raises(Refused, PicklePolicy().loads, data, 8 << 20)) < 16 << 20  # the walk's
    payload = [bytes(5_000_000), b"x" * 5_000_000]
    assert PicklePolicy().loads(pickle.dumps(payload, protocol=4), max_block_bytes=32 << 20) == payload


def test_legitimate_data_still_decodes(tmp_path):
    import datetime
    import decimal
    import uuid

    examples = [
        {
            "id": 1,
            "text": "ok",
            "blob": b"\x00\x01",
            "ba": bytearray(b"xy"),
            "c": complex(1, 2),
            "s": {1, 2},
            "fs": frozenset({3}),
            "t": (1, [2]),
            "sl": slice(1, 5, 2),
            "r": range(3),
        },
        {
            "od": collections.OrderedDict(a=1),
            "dd": collections.defaultdict(list, a=[1]),
            "dq": collections.deque([1, 2], 5),
            "ct": collections.Counter("aab"),
            "dt": datetime.datetime(2020, 1, 2, tzinfo=datetime.timezone.utc),
            "td": datetime.timedelta(3),
            "dec": decimal.Decimal("1.25"),
            "fr": fractions.Fraction(3, 4),
            "u": uuid.UUID(int=5),
        },
        {
            "a": np.arange(6, dtype=">i4").reshape(2, 3),
            "b": np.array(["x", "yz"]),
            "f": np.float32(1.5),
            "m": np.datetime64("2020-01-01"),
            "e": np.zeros(0),
            "bool": np.bool_(True),
        },
    ]
    ds = ar.open(write(tmp_path / "ds", examples))
    for got, want in zip(ds, pickle.loads(pickle.dumps(examples))):  # as plain pickle gives them
        assert got.keys() == want.keys()
        for key in want:
            if isinstance(want[key], np.ndarray):
                assert got[key].dtype == want[key].dtype and np.array_equal(got[key], want[key]), key
            else:
                assert got[key] == want[key] and type(got[key]) is type(want[key]), key
    assert ds[1]["dd"].default_factory is list


@settings(max_examples=tries(200), deadline=None)
@given(
    st.sampled_from(sorted(SAFE_GLOBALS)),
    st.lists(
        st.one_of(
            st.integers(-(10**6), 10**9),
            st.just(10**10000),
            st.text(max_size=20),
            st.just("1e99999999"),
            st.binary(max_size=16),
            st.just(range(10**9)),
            st.just([0] * 100),
            st.none(),
            st.just(np.dtype("O")),
            st.just(pickle.dumps(Gadget(os.system, ("true",)))),  # a pickle, for a storage to load
            st.just((10**9,)),  # a size, a stride
            st.just(collections.OrderedDict(a=1)),  # backward hooks
        ),
        max_size=6,
    ),
)
def test_every_allowed_global_with_hostile_arguments_stays_bounded(name, args):
    """Whatever a block passes to an allowed global: data of bounded size, or a refusal; never a crash."""
    import importlib

    module = importlib.import_module(name[0])
    function = getattr(module, name[1], None)
    if function is None:  # numpy.core.* under numpy 2, or the other way round
        return
    try:
        data = pickle.dumps([Gadget(function, tuple(args))], protocol=4)
    except Exception:
        return  # not something a pickle can hold
    gc.collect()
    tracemalloc.start()
    try:
        PicklePolicy().loads(data)
    except (
        UnsafePickleError,
        ar.CorruptBlockError,
        TypeError,
        ValueError,
        OverflowError,
        AttributeError,
        ArithmeticError,
        IndexError,
        KeyError,
        RuntimeError,  # torch's own refusals
    ):
        pass
    finally:
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    assert peak < AMPLIFICATION * len(data) + 8 * 1024 * 1024, f"{name}{tuple(args)!r}: {peak:,} bytes"


def test_the_cache_counts_what_its_blocks_hold(tmp_path):
    """12 blocks of 20,000 small containers each (about 1.4 MB in memory from 40 KB): a 1 MiB cache keeps none
    of them, where counting decompressed bytes kept them all (17 MB, against the 8 MiB asserted)."""
    examples = [[{} for _ in range(20_000)] for _ in range(12)]
    ds = ar.open(write(tmp_path / "ds", examples), cache_bytes=1 << 20)
    gc.collect()
    tracemalloc.start()
    for i in range(12):
        ds[i]
    gc.collect()
    held, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert ds.blocks.memory.current_bytes <= 1 << 20
    assert held < 8 * 1024 * 1024, f"{held:,} bytes still held"


CACHE_SHAPES = {
    "7-character strings": lambda i: [f"{i:04d}{j:03d}" for j in range(20)],
    "ints": lambda i: [i * 1000 + j + 300 for j in range(50)],
    "nested dicts": lambda i: {"a": {"b": {"c": i, "d": [i, -i]}, "e": {}}, "f": str(i)},
    "floats": lambda i: [i + j / 7 for j in range(20)],
    "text, 200 B": lambda i: {"id": i, "text": f"{i} " + "word " * 40},
    "text, 2 KB": lambda i: {"id": i, "text": f"{i} " + "word " * 400},
}
CACHE_FACTOR = 1.25  # docs/security.md, "What the cache counts"


@pytest.mark.parametrize("shape", CACHE_SHAPES)
def test_the_memory_cache_holds_about_what_it_is_allowed(tmp_path, shape):
    """Blocks of small strings, ints, nested dicts, floats and text, read one example each with cache_bytes=1 MiB:
    what the cache holds, by tracemalloc, stays within CACHE_FACTOR of 1 MiB. Counting decompressed bytes and
    containers, blocks of 7-character strings held 3.7 MiB. 64 blocks: what they all hold is at least 1.8 MiB in
    every shape, so a cache that kept more than it may is seen."""
    make = CACHE_SHAPES[shape]
    url = write(tmp_path / "ds", [make(i) for i in range(64 * 64)], block_size=64)
    ds = ar.open(url, cache_bytes=1 << 20)
    ds[0]
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    for i in range(64, len(ds), 64):
        ds[i]
    gc.collect()
    held = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    assert ds.blocks.memory.current_bytes <= 1 << 20
    assert held <= CACHE_FACTOR * (1 << 20), f"{held:,} bytes held"


def test_a_pass_does_not_decompress_far_ahead_of_its_reader(tmp_path):
    """Blocks that each declare 100 MB: a pass holds a bounded number of them decompressed, not every one its
    read-ahead has fetched (peak resident memory of a fresh process, which sees zstd's own buffers too)."""
    big = b"\0" * (100 * 1024 * 1024)
    url = write(tmp_path / "ds", [{"i": i, "pad": big} for i in range(8)])
    del big
    script = (
        "import resource, atlas_remote as ar\n"
        "before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
        f"for i, x in enumerate(ar.open({url!r}, readahead=4)):\n"
        "    assert x['i'] == i\n"
        "    del x\n"
        "print((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) // 1024)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert int(done.stdout) < 500, f"{done.stdout.strip()} MiB more resident at the peak"


def test_every_allowed_global_is_in_the_security_policy():
    """A global added to the table without a line in docs/security.md fails here."""
    policy = (ROOT / "docs" / "security.md").read_text()
    documented = set(re.findall(r"^\| `([\w.]+)` \|", policy, flags=re.M))
    missing = {f"{m}.{n}" for m, n in SAFE_GLOBALS} - documented
    assert not missing, f"allowed but not in docs/security.md: {sorted(missing)}"
