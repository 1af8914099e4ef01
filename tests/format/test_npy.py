""".npy headers read without `ast` (format/npy.py): what numpy writes reads as numpy reads it, and a valid header
never fails because another thread is building an AST (python/cpython#106905)."""

from __future__ import annotations

import ast
import gc
import io
import struct
import sys
import threading
import time

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import atlas_remote as ar
from atlas_remote.format.npy import HeaderError, parse_dict, read_header
from atlas_remote.format.spec import BLOCKS_DTYPE, INDEX_DTYPES, read_npy

pytestmark = pytest.mark.unit


def npy(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, array, allow_pickle=False)
    return buffer.getvalue()


def numpy_header(raw: bytes) -> tuple[tuple[int, ...], bool, np.dtype, int]:
    stream = io.BytesIO(raw)
    version = np.lib.format.read_magic(stream)
    reader = {(1, 0): np.lib.format.read_array_header_1_0, (2, 0): np.lib.format.read_array_header_2_0}[version]
    shape, fortran, dtype = reader(stream, max_header_size=1 << 20)
    return shape, fortran, dtype, stream.tell()


plain = st.sampled_from(["u1", "u2", "u4", "u8", "i1", "i2", "i4", "i8", "f2", "f4", "f8", "c16", "b1", "V16", "S7"])
ordered = st.tuples(st.sampled_from("<>"), plain).map(lambda t: np.dtype(t[0] + t[1]))
records = st.lists(
    st.tuples(st.text("abcdefghij_", min_size=1, max_size=8), ordered, st.sampled_from([(), (2,), (2, 3)])),
    min_size=1,
    max_size=4,
    unique_by=lambda field: field[0],
).map(lambda fields: np.dtype([(name, dtype, shape) for name, dtype, shape in fields]))


@settings(max_examples=300, deadline=None)
@given(
    dtype=st.one_of(ordered, records, st.just(BLOCKS_DTYPE)),
    shape=st.lists(st.integers(0, 5), max_size=3).map(tuple),
    fortran=st.booleans(),
)
def test_every_header_numpy_writes_reads_as_numpy_reads_it(dtype, shape, fortran):
    """Plain types in either byte order, records of named fields with shapes, any shape, either order."""
    raw = npy(np.zeros(shape, dtype, order="F" if fortran else "C"))
    assert read_header(raw, 4096) == numpy_header(raw)


@pytest.mark.filterwarnings("ignore:Stored array in format 2.0")
def test_a_header_past_64_kib_is_version_2_and_reads_too():
    fields = [(f"field_{i:05d}", "<u4") for i in range(3000)]
    raw = npy(np.zeros(2, fields))
    assert raw[6:8] == b"\x02\x00"
    assert read_header(raw, 1 << 20) == numpy_header(raw)


@pytest.mark.parametrize(
    "text, problem",
    [
        ("{'descr': '<u4', 'fortran_order': False, 'shape': (5,), }", None),
        ('{"descr": "<u4", "fortran_order": False, "shape": (5,)}', None),
        ("{'descr': '<u4', 'fortran_order': False}", "keys"),
        ("{'descr': '<u4', 'fortran_order': False, 'shape': (5,), 'x': 1}", "keys"),
        ("{'descr': '<u4', 'descr': '<u4', 'fortran_order': False, 'shape': (5,)}", "twice"),
        ("{'descr': '<u4', 'fortran_order': 0, 'shape': (5,)}", "fortran_order"),
        ("{'descr': '<u4', 'fortran_order': False, 'shape': [5]}", "shape"),
        ("{'descr': '<u4', 'fortran_order': False, 'shape': (5.0,)}", "unexpected"),
        ("{'descr': __import__('os'), 'fortran_order': False, 'shape': (5,)}", "unexpected"),
        ("{'descr': '<u4', 'fortran_order': False, 'shape': (5,)} + 1", "after"),
        ("{'descr': '<u4', 'fortran_order': False, 'shape': (5,)", "ends inside"),
        ("{'descr': '\\x3cu4', 'fortran_order': False, 'shape': (5,)}", "unexpected"),
        ("{'descr': [[[[[['<u4']]]]]], 'fortran_order': False, 'shape': (5,)}", "unexpected"),
        ("[" * 60_000, "unexpected"),
        ("", "ends inside"),
    ],
)
def test_the_parser_takes_the_dict_numpy_writes_and_nothing_else(text, problem):
    raw = b"\x93NUMPY\x01\x00" + struct.pack("<H", len(text) + 1) + text.encode() + b"\n"
    if problem is None:
        assert parse_dict(text) == {"descr": "<u4", "fortran_order": False, "shape": (5,)}
        assert read_header(raw, 4096) == ((5,), False, np.dtype("<u4"), len(raw))
    else:
        with pytest.raises(HeaderError, match=problem):
            read_header(raw, 1 << 20)


def test_reading_a_header_builds_no_ast(monkeypatch):
    """Not numpy's reader (ast.literal_eval)."""

    def refused(*args, **kwargs):
        raise AssertionError("an AST was built")

    monkeypatch.setattr(ast, "literal_eval", refused)
    offsets = read_npy(npy(np.arange(6, dtype=np.uint32)), "x", INDEX_DTYPES, 6)
    assert offsets.tolist() == list(range(6))


def test_a_valid_header_reads_while_another_thread_builds_asts():
    """Before: numpy's reader failed at random with `FormatError: not a valid .npy array (AST constructor
    recursion depth mismatch ...)` when another thread built an AST meanwhile (CPython 3.11 keeps that depth per
    interpreter). Made to happen often here: a collection in the reading thread lets the other thread run (as a
    finalizer that waits does), and that thread parses code at another depth of its stack."""
    raw = npy(np.arange(6, dtype=np.uint32))
    stop, reader, failures, reads = threading.Event(), [], [], [0]

    def pause(phase: str, info: dict) -> None:
        if phase == "start" and threading.get_ident() in reader:
            time.sleep(0.0002)

    def parse(depth: int) -> None:
        if depth:
            return parse(depth - 1)
        while not stop.is_set():
            try:
                ast.parse("[[[1]]]")
            except SystemError:  # the race hits this thread too; it goes on
                pass

    def read() -> None:
        reader.append(threading.get_ident())
        deadline = time.monotonic() + 1.5
        while time.monotonic() < deadline:
            try:
                read_npy(raw, "x", INDEX_DTYPES, 6)
                reads[0] += 1
            except ar.FormatError as err:
                failures.append(str(err))

    threshold = gc.get_threshold()
    gc.set_threshold(5)
    gc.callbacks.append(pause)
    parser = threading.Thread(target=parse, args=(30,))
    try:
        parser.start()
        reading = threading.Thread(target=read)
        reading.start()
        reading.join()
    finally:
        stop.set()
        parser.join()
        gc.callbacks.remove(pause)
        gc.set_threshold(*threshold)
    assert reads[0] > 100 and not failures, (reads[0], failures[:1], sys.version)
