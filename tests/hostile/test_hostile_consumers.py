"""Hostile data, round 3 (issue 45, rows 3, 5, 8 and 10, and "also seen"): blocks the unpickler accepts, since what
they hold is within a block's bound, that its consumers then multiply: a value referred to many times copied each
time (JSON lines, the viewer, Arrow, Parquet), batch reads holding every block of a call, values nested deeper
than Arrow or JSON take, and collate padding rows. Each is refused in one line naming the example, shard and
block, or served exactly within its bound (docs/security.md, "What consumers make of examples"); each test
failed on the code before."""

from __future__ import annotations

import collections
import contextlib
import io
import os
import pickle
import resource
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from helpers import Bounded, as_stranger
from test_hostile_blocks_round2 import P4, raw_dataset

import atlas_remote as ar
from atlas_remote.cli import main
from atlas_remote.cli.output import example_line
from atlas_remote.read.expansion import FLOOR_BYTES, sizes
from atlas_remote.training.collate import collate_numpy
from atlas_remote.viewer.pages import DatasetView

MB = 1 << 20
ROOT = Path(__file__).resolve().parents[2]
VALUE = 1 * MB  # each shape refers to one value of this size 100 times: 100 MiB walked, past 64 MiB + 4 x 1 MiB


def shared(kind: str) -> list:
    """A block's one example: 100 references to one value (the pickler memoizes it: 1 MiB of zeros, stored in
    a few hundred bytes)."""
    if kind == "str":
        return [["x" * VALUE] * 100]
    if kind == "bytes with an image's signature":
        return [[b"\x89PNG\r\n\x1a\n" + bytes(VALUE)] * 100]
    if kind == "deque":
        return [collections.deque(["x" * VALUE] * 100)]
    if kind == "one level more":
        return [[["x" * (VALUE // 100)] * 100] * 100]
    if kind == "arrays of one buffer":
        return [[np.zeros(VALUE, np.uint8)] * 100]
    if kind == "dict keys":
        return [[{"k" * VALUE: 1}] * 100]
    raise AssertionError(kind)


SHAPES = ["str", "bytes with an image's signature", "deque", "one level more", "arrays of one buffer", "dict keys"]


def stranger(path: Path, examples: list, protocol: int = 4) -> str:
    """A dataset of one block holding `examples`, as a stranger writes it (raw files, unsigned)."""
    return raw_dataset(path, pickle.dumps(examples, protocol=protocol))


def cli(*argv: str) -> tuple[int, str, str]:
    """main() in this process: (exit status, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            main(list(argv))
            code = 0
        except SystemExit as done:
            code = int(done.code or 0)
    return code, out.getvalue(), err.getvalue()


def one_line(code: int, err: str, *words: str) -> str:
    lines = err.strip().splitlines()
    assert code == 1 and len(lines) == 1 and lines[0].startswith("atlas-remote: error: "), (code, err[-500:])
    assert all(word in lines[0] for word in words), lines[0]
    return lines[0]


def refused_named(error: ar.AtlasError) -> None:
    assert isinstance(error, ar.ExpansionError) and error.shard == "0" and error.block == 0, repr(error)
    assert "example 0" in str(error) and "\n" not in str(error)


# -- row 3: shared references expanded by consumers ------------------------------------------------------------------


@pytest.mark.parametrize("kind", SHAPES)
def test_a_value_referred_to_many_times_is_refused_by_every_consumer_that_copies_it(tmp_path, kind):
    """One block of 100 references to one value (323 bytes of data.bin for 8 MiB, in the issue): `head --json`
    and the viewer reached 2.2 GB, then MemoryError; to_arrow and Parquet an ArrowMemoryError. Each consumer that
    copies what it walks now measures a stranger's example first (shared values counted each time they are
    reached) and refuses it in one line, having built nothing of it."""
    url = stranger(tmp_path / "ds", shared(kind))
    assert os.path.getsize(f"{url}/0/data.bin") < 64 * 1024
    for command in (["head", url, "--json"], ["cat", url, "--json"], ["get", url, "0", "--json"]):
        with Bounded() as cost:
            code, out, err = cli(*command)
        one_line(code, err, "shard 0 block 0", "example 0", "refers to many times")
        assert out == "" and cost.peak < 48 * MB, (command, cost.peak)
    ds = ar.open(url)
    for export in (ds.to_arrow, ds.to_pandas, lambda: list(ds.rows())):
        with Bounded() as cost, pytest.raises(ar.ExpansionError) as refused:
            export()
        refused_named(refused.value)
        assert cost.peak < 48 * MB, (export, cost.peak)
    dest = tmp_path / "out.parquet"
    with pytest.raises(ar.ExpansionError) as refused:
        ds.to_parquet(str(dest))
    refused_named(refused.value)
    one_line(*cli("convert", url, str(dest), "--to", "parquet", "--quiet")[::2], "example 0")
    assert not dest.exists(), "no file, not even a part of one"
    view = DatasetView(ds)
    with Bounded() as cost:
        page = view.answer(view.page, 0, 1)
    assert "refers to many times" in page["rows"][0]["error"] and cost.peak < 48 * MB, cost.peak


def test_head_summarises_a_deque_as_it_does_a_list(tmp_path):
    """`head` printed a deque by its repr: 100 references to 8 MiB printed 839 MB. It is cut as a list is."""
    url = stranger(tmp_path / "ds", shared("deque"))
    code, out, _ = cli("head", url)
    assert code == 0 and len(out) < 4096 and out.startswith("[0] deque(['xxx") and "(8,388,608 chars)" not in out
    assert f"({VALUE:,} chars)" in out and "... (100 items)" in out


def test_the_same_values_written_by_you_or_each_held_once_are_served(tmp_path):
    """The bound is on sharing, not size: your own (signed) block of the same shape is not measured (its
    structure is your writer's, as the walk of its opcodes is skipped), and a stranger's example holding 80
    distinct values of 1 MiB (past the 64 MiB any example may expand to, but no more than it holds) is exported
    whole, as are 80 examples of 1 MiB that share one value (each within the bound, exported in chunks)."""
    own = tmp_path / "own"
    with ar.AtlasDatasetWriter(str(own), 10, 1) as writer:
        writer.add_example(shared("str")[0])
    ds = ar.open(str(own))
    assert [len(v) for v in next(ds.rows())["item"]] == [VALUE] * 100 and ds.shards[0].signed
    distinct = [f"{i:07d}" + "x" * (VALUE - 7) for i in range(80)]
    table = ar.open(stranger(tmp_path / "distinct", [distinct])).to_arrow()
    assert table.column("item").to_pylist() == [distinct]
    one = "y" * VALUE
    block = pickle.dumps([{"i": i, "v": one} for i in range(80)], protocol=4)
    ds = ar.open(raw_blocks(tmp_path / "vocabulary", [block], 80))
    rows = list(ds.rows())
    assert [r["i"] for r in rows] == list(range(80)) and all(r["v"] == one for r in rows)
    key, first, values = next(ds.located_slices())
    assert sum(sizes(ds, key, first, values)) > FLOOR_BYTES, "measured one by one: chunks are cut by it"
    assert ds.to_arrow().column("v").to_pylist() == [one] * 80


def raw_blocks(path: Path, blocks: list[bytes], block_size: int) -> str:
    """A stranger's dataset of one shard of these blocks, each of `block_size` examples."""
    import json

    import zstandard

    shard = path / "0"
    shard.mkdir(parents=True)
    stored = [zstandard.ZstdCompressor().compress(block) for block in blocks]
    n = len(blocks) * block_size
    (path / "meta.json").write_text(json.dumps({"version": 1, "shard_sizes": [n], "compression_strategy": 1}))
    meta = {"version": 1, "block_size": block_size, "stored_examples": n, "compression_strategy": 1}
    (shard / "meta.json").write_text(json.dumps({**meta, "compression_level": 3, "compression_dict_size": 0.01}))
    (shard / "data.bin").write_bytes(b"".join(stored))
    np.save(shard / "index.npy", np.cumsum([0] + [len(s) for s in stored]).astype(np.uint64))
    return str(path)


def zeros_block(size: int) -> bytes:
    """A block of one example: `size` zero bytes (a BINBYTES8), a few hundred bytes once compressed."""
    return P4 + b"]\x8e" + struct.pack("<Q", size) + bytes(size) + b"a."


# -- row 5: batch reads multiply the per-block bound -----------------------------------------------------------------


def test_a_call_holds_at_most_what_one_block_may(tmp_path):
    """Blocks of 200 MB of zeros (6.5 KB stored): ds[0] took 457 MB, ds[0:20] and a viewer page of 20 took
    2.66 GB, then MemoryError: a call decoded all its blocks before handing any out. Now a call whose blocks
    declare more than max_block_bytes together decodes them one at a time and hands back at most that (here
    blocks of 8 MiB, max_block_bytes 32 MiB): refused in one line naming the example past it."""
    url = raw_blocks(tmp_path / "ds", [zeros_block(8 * MB)] * 20, 1)
    ds = ar.open(url, max_block_bytes=32 * MB, cache_bytes=0)
    for call in (lambda: ds[0:20], lambda: ds.get_many(range(20)), lambda: ds[[0, 5, 10, 15, 19]]):
        with Bounded() as cost, pytest.raises(ar.ExpansionError, match=r"in one call hold more than 33,554,432") as bad:
            call()
        assert bad.value.shard == "0" and bad.value.block in (3, 15) and cost.peak < 3 * 32 * MB, cost.peak
    with Bounded() as cost:
        got = ds[0:3]
    assert [x.count(0) for x in got] == [8 * MB] * 3 and cost.peak < 3 * 32 * MB, cost.peak
    view = DatasetView(ds)
    with Bounded() as cost:
        rows = view.answer(view.page, 0, 20)["rows"]
    shown = [r for r in rows if "value" in r]
    assert 3 <= len(shown) <= 4 and all("show fewer at a time" in r["error"] for r in rows[len(shown) :])
    assert cost.peak < 4 * 32 * MB, cost.peak


def test_a_call_over_its_budget_that_takes_little_of_each_block_is_served(tmp_path):
    """The other side: blocks that decompress past the budget together, of which the call wants one small example
    each, are decoded one at a time and give exactly what one read at a time gives."""
    examples = [[bytes([b, k]) * (256 * 1024) for k in range(16)] for b in range(8)]  # 8 MiB a block
    url = raw_blocks(tmp_path / "ds", [pickle.dumps(block, protocol=4) for block in examples], 16)
    ds = ar.open(url, max_block_bytes=32 * MB, cache_bytes=0)
    wanted = [b * 16 + 5 for b in range(8)] + [3]
    assert ds.get_many(wanted) == [examples[i // 16][i % 16] for i in wanted]


# -- row 8: values nested deeper than Arrow and Parquet take ----------------------------------------------------------


def deep_columns(depth: int, columns: int = 8) -> bytes:
    """A block of one dict example: `columns` keys, each holding one list nested `depth` deep (50 bytes)."""
    items = b"".join(
        b"\x8c" + bytes([len(k)]) + k + ((b"]" * depth + b"a" * (depth - 1) + b"\x94") if i == 0 else b"h\x00")
        for i, k in enumerate(f"c{i}".encode() for i in range(columns))
    )
    return P4 + b"]}(" + items + b"ua."


def limited(limit: int):
    def set_limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    return set_limit


def test_deep_values_are_refused_before_pyarrow_sees_them_and_leave_nothing(tmp_path):
    """Eight columns 500 deep (50 bytes of data.bin): `convert --to parquet` died by SIGABRT (std::bad_alloc) or
    SIGSEGV under the memory limit docs/security.md recommends, leaving its temporary folder. The walk allows
    1,000 deep; a row nesting more than 32 containers (pyarrow reads Parquet back to about 48) is refused before
    pyarrow is handed it: exit 1, one line, no file, no temporary folder."""
    url = raw_dataset(tmp_path / "ds", deep_columns(500))
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    dest = tmp_path / "out.parquet"
    done = subprocess.run(
        [sys.executable, "-m", "atlas_remote.cli", "convert", url, str(dest), "--to", "parquet", "--quiet"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
        env={**os.environ, "TMPDIR": str(scratch)},
        preexec_fn=limited(800 * MB),
    )
    one_line(done.returncode, done.stderr, "shard 0 block 0", "example 0", "nest more than 32 containers")
    assert not dest.exists() and not list(scratch.iterdir())
    with pytest.raises(ar.ExpansionError, match="nest more than 32") as refused:
        ar.open(url).to_arrow()
    refused_named(refused.value)


def test_your_own_values_are_refused_past_arrows_depth_by_their_types(tmp_path):
    """Your own blocks are not measured; their Arrow types say how deep they nest, checked before a row group is
    written: 33 lists deep is refused, 32 written and read back by pyarrow as they were."""
    import pyarrow.parquet as pq

    def nest(depth: int) -> list:
        value: list = [1]
        for _ in range(depth - 1):
            value = [value]
        return value

    for depth, fits in ((32, True), (33, False)):
        url = str(tmp_path / f"own{depth}")
        with ar.AtlasDatasetWriter(url, 10, 2) as writer:
            writer.add_example({"v": nest(depth), "i": 0})
        dest = tmp_path / f"own{depth}.parquet"
        if fits:
            ar.open(url).to_parquet(str(dest))
            assert pq.read_table(dest).to_pylist() == [{"v": nest(depth), "i": 0}]
        else:
            with pytest.raises(ar.ExportError, match="nest 33 containers deep, past the 32"):
                ar.open(url).to_parquet(str(dest))
            assert not dest.exists()


# -- row 10: the default collate --------------------------------------------------------------------------------------


def test_collate_pads_and_promotes_only_within_what_the_batch_holds():
    """A 734-byte data.bin gave a 1 GiB first batch (63 short rows padded to one of 16 MiB) and one complex128
    row asked 16 GiB; 64 references to one 8 MiB array stacked to 512 MiB. The batch is sized before it is made:
    past 64 MiB, at most 4 times what its arrays hold (each buffer once), else CollateError naming the key."""
    import torch

    ragged = [{"t": np.zeros(10, np.int8)} for _ in range(63)] + [{"t": np.zeros(16 * MB, np.int8)}]
    promoted = [{"t": np.zeros(3, np.complex128)}] + ragged[1:]
    one = np.zeros(8 * MB, np.uint8)
    cases = {
        "padded": (ragged, r"64 rows padded to the longest \(16,777,216\) as int8 make 1,073,741,824 bytes"),
        "promoted": (promoted, r"as complex128 make 17,179,869,184 bytes"),
        "shared": ([{"t": one}] * 64, r"64 rows as uint8 make 536,870,912 bytes from the 8,388,608"),
        "tensors": ([{"t": torch.from_numpy(one)}] * 64, r"64 rows as torch.uint8 make 536,870,912"),
    }
    for name, (batch, message) in cases.items():
        with Bounded() as cost, pytest.raises(ar.CollateError, match=message) as bad:
            collate_numpy(batch)
        assert "key 't'" in str(bad.value) and cost.peak < 32 * MB and cost.cpu < 2, (name, cost.peak)
    nested: list = [1]
    for _ in range(300):
        nested = [nested]
    with pytest.raises(ar.CollateError, match="nest more than 200 deep"):
        collate_numpy([nested, nested])
    lengths = [1 + (i * 37) % 5000 for i in range(256)]  # ragged tokens: padded 20 times what they hold, under 64 MiB
    batch = collate_numpy([{"t": np.arange(n, dtype=np.int64)} for n in lengths])
    assert batch["t"].shape == (256, max(lengths)) and batch["t_lengths"].tolist() == lengths
    large = collate_numpy([{"t": np.full(MB, i, np.float32)} for i in range(20)])  # 80 MiB, as much as it holds
    assert large["t"].shape == (20, MB) and large["t"][7, 5] == 7


# -- also seen: one line for every failure ------------------------------------------------------------------------------


def test_head_json_of_a_deep_list_is_one_line(tmp_path):
    """`head --json` of a list 990 deep (which the walk allows) printed a bare RecursionError. A stranger's is
    refused by its depth; your own, which is not measured, is refused where JSON cannot go."""
    deep = raw_dataset(tmp_path / "deep", P4 + b"]" + b"]" * 990 + b"a" * 990 + b".")
    one_line(*cli("head", deep, "--json")[::2], "example 0", "nest more than 198 containers deep")
    assert cli("head", deep)[0] == 0
    own: list = []
    for _ in range(2000):  # deeper than a pickler writes: what JSON of your own data meets near Python's limit
        own = [own]
    with pytest.raises(ar.ExpansionError, match="example 7 nests too deep for JSON: print it without --json"):
        example_line(7, own, as_json=True)


def sweep_inputs(tmp_path: Path) -> dict[str, str]:
    """Datasets of rounds 1 to 3: blocks that crashed, stalled or blew up a reader or its consumers."""
    from test_hostile_blocks import Gadget, write
    from test_hostile_blocks_round2 import CRASH_VARIANTS, CRASHES, KINDS, nested, ring

    inputs = {name: raw_dataset(tmp_path / f"c{i}", CRASHES[name]()) for i, name in enumerate(list(CRASHES)[:2])}
    for i, (name, block) in enumerate(CRASH_VARIANTS.items()):
        inputs[name] = raw_dataset(tmp_path / f"v{i}", block)
    for kind in KINDS:
        for depth in (990, 1001):
            inputs[f"{kind} {depth} deep"] = raw_dataset(
                tmp_path / f"{kind}{depth}".replace(" ", ""), nested(kind, depth)
            )
    inputs["a ring of 600 lists"] = raw_dataset(tmp_path / "ring", ring(600))
    with as_stranger():
        inputs["list(range)"] = write(tmp_path / "g1", [Gadget(list, (range(50_000_000),))])
        inputs["an object dtype"] = write(tmp_path / "g2", [Gadget(np.dtype, ("O", False, True))])
    for kind in SHAPES:
        inputs[f"shared {kind}"] = stranger(tmp_path / f"s{SHAPES.index(kind)}", shared(kind))
    inputs["eight columns 500 deep"] = raw_dataset(tmp_path / "deep8", deep_columns(500))
    inputs["blocks of 8 MiB of zeros"] = raw_blocks(tmp_path / "zeros", [zeros_block(8 * MB)] * 3, 1)
    return inputs


COMMANDS = [["head"], ["head", "--json"], ["cat", "--json"], ["get", "0", "--json"], ["verify", "-q"], ["info"]]


def test_every_input_of_three_rounds_is_one_line_from_every_command(tmp_path):
    """Every command on every hostile input of rounds 1 to 3 prints its output, or exits 1 with one line: never a
    traceback, a bare MemoryError or RecursionError, a signal."""
    for name, url in sweep_inputs(tmp_path).items():
        for command in [*COMMANDS, ["convert", "--to", "parquet", "--quiet", "--overwrite"]]:
            argv = [command[0], url, *command[1:]]
            if command[0] == "convert":
                argv = ["convert", url, str(tmp_path / "out.parquet"), *command[1:]]
            with Bounded() as cost:
                code, out, err = cli(*argv)
            assert code in (0, 1) and len(err.strip().splitlines()) <= 1, (name, command, code, err[-800:])
            assert "Traceback" not in err and (not err or err.startswith("atlas-remote: error: ")), (name, err)
            assert len(out) < 64 * MB and cost.cpu < 30, (name, command, len(out), cost.cpu)
