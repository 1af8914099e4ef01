"""Issue 45, row 1 and the copies: a signature covers everything that decides what a signed block decodes to, and
its place. Each attack leaves the user's own signed dataset's blocks as they were and changes something else
around them: the shared dictionary (laid out so that a block decodes to a crash or a long hash), the order of
blocks, the shard's place (another shard number, another of the user's datasets). Each is refused on the signed
path; a copy that changes nothing reads as signed. Only the library's public face is used, so that each test
runs against the code before the fix too (where each one failed, or crashed its subprocess)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import zstandard
from helpers import same

import atlas_remote as ar

TEXT = "the quick brown fox jumps over the lazy dog and keeps running through the forest " * 3
EXAMPLES = [{"id": i % 7, "text": TEXT} for i in range(400)]  # mostly copied from the dictionary, as text is
P4 = b"\x80\x04"
# numpy.dtype('V8', False, True) whose state puts it among its own fields, hashed as a dict key: numpy's hash
# recurses without end (a segfault) on the signed path, which skips the walk that refuses it
SELF_FIELD_DTYPE = (
    P4
    + b"]}\x8c\x05numpy\x8c\x05dtype\x93\x8c\x02V8\x89\x88\x87R\x94"
    + b"(K\x03\x8c\x01|N\x8c\x01a\x85}\x8c\x01ah\x00K\x00\x86sK\x08K\x01K\x00t"
    + b"bNsa."
)
TUPLE_CHAIN = P4 + b"]}K\x01" + b"2\x86" * 30 + b"Nsa."  # a tuple whose hash visits 2^30 tuples, as a dict key


def write(url, examples=EXAMPLES, **settings) -> str:
    """The user's own dataset, written with their key and the defaults (a shared dictionary)."""
    with ar.AtlasDatasetWriter(str(url), 200, 10, **settings) as writer:
        writer.add_examples(examples)
    return str(url)


def block_zero(url: str) -> bytes:
    data = open(os.path.join(url, "0", "data.bin"), "rb").read()
    return data[: int(np.load(os.path.join(url, "0", "index.npy"))[1])]


def decompress(dictionary: bytes, block: bytes) -> bytes:
    return zstandard.ZstdDecompressor(dict_data=zstandard.ZstdCompressionDict(dictionary)).decompress(block)


def forge_dictionary(url: str, payload: bytes) -> None:
    """What the issue's stranger did: a new zstd_dict.bin with the same header and id, and other content, laid out
    so that shard 0's block 0 (untouched, as data.bin and the sidecars are) decodes to `payload` and whatever
    follows it. Which output byte each dictionary byte becomes is found by changing the dictionary a byte at a
    time; output bytes that come from the block itself stay as they are, inside a bytes value the payload pops."""
    path = os.path.join(url, "zstd_dict.bin")
    dictionary, block = open(path, "rb").read(), block_zero(url)
    plain = decompress(dictionary, block)
    source: dict[int, int] = {}  # output byte -> the dictionary byte it is copied from
    for i in range(len(dictionary)):
        changed = bytearray(dictionary)
        changed[i] ^= 0xFF
        try:
            out = decompress(bytes(changed), block)
        except zstandard.ZstdError:
            continue  # the dictionary's header or tables
        moved = [j for j in range(len(plain)) if out[j] != plain[j]]
        if moved and all(out[j] == changed[i] for j in moved):
            source.update((j, i) for j in moved)
    fixed = [j for j in range(64) if j not in source]
    cover = max(fixed, default=3) + 1 - 4  # a SHORT_BINBYTES from byte 2 holding every fixed byte, then POP
    wanted = P4 + b"C" + bytes([cover]) + plain[4 : 4 + cover] + b"0" + payload[len(P4) :]
    forged = bytearray(dictionary)
    for j, byte in enumerate(wanted):
        if j in source:
            forged[source[j]] = byte
    assert decompress(bytes(forged), block)[: len(wanted)] == wanted, "the layout did not take"
    open(path, "wb").write(bytes(forged))


def run(code: str, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code), *args], capture_output=True, text=True, timeout=timeout
    )


def cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return run("from atlas_remote.cli import main; main()", *args, timeout=timeout)


FIRST_EXAMPLE = """
    import sys, atlas_remote as ar
    try:
        print(ar.open(sys.argv[1])[0])
    except ar.CorruptBlockError as err:
        print(err)
        sys.exit(3)
"""


def refused(done: subprocess.CompletedProcess, code: int = 1) -> str:
    """What a process that refused the dataset said: exit `code` (never a signal: a crash), one line."""
    assert done.returncode == code, f"exit {done.returncode}: {done.stdout[-500:]} {done.stderr[-2000:]}"
    said = (done.stdout if code == 3 else done.stderr).strip()
    assert len(said.splitlines()) == 1, said
    return said


def test_a_dictionary_forged_under_signed_blocks_is_refused(tmp_path):
    """Row 1: the blocks and their sidecar untouched, the dictionary replaced: it decoded to other examples,
    `verify` said OK and `info` said signed with your key. Refused now, naming the shard and the dictionary."""
    url = write(tmp_path / "ds")
    assert same(ar.open(url)[0], EXAMPLES[0])
    forge_dictionary(url, P4 + b"]\x8c\x06forged\x94a.")
    with pytest.raises(ar.CorruptBlockError, match="zstd_dict.bin") as caught:
        ar.open(url)[0]
    assert caught.value.shard == "0" and "\n" not in str(caught.value)
    assert "is not the one they were written with" in str(caught.value)
    report = ar.verify(url)
    assert not report.ok and "shard 0" in str(report)
    assert "zstd_dict.bin" in refused(cli("info", url))


@pytest.mark.parametrize("payload", [SELF_FIELD_DTYPE, TUPLE_CHAIN], ids=["self-referencing dtype", "tuple chain"])
def test_a_dictionary_laid_out_to_crash_or_spin_is_refused_before_any_block_decodes(tmp_path, payload):
    """Row 1's worst: laid out as a self-referencing dtype, the dictionary segfaulted `ds[0]`, `head` and
    `verify` (the signed path skips the walk); as a hashed tuple chain, it spun for seconds a level. Each is
    refused at the shard's open, in one line, in a fraction of a second."""
    url = write(tmp_path / "ds")
    forge_dictionary(url, payload)
    assert "zstd_dict.bin" in refused(run(FIRST_EXAMPLE, url, timeout=30), 3)
    assert "shard 0" in refused(cli("head", url, "-n", "1", timeout=30))
    done = cli("verify", url, "--quiet", timeout=30)
    assert done.returncode == 1 and "zstd_dict.bin" in done.stdout, done.stdout + done.stderr


def test_a_dataset_signed_by_checksum_then_given_a_forged_dictionary_is_refused(tmp_path):
    """Row 1, last: a stranger's dataset in a bucket others can write, signed with `atlas-remote checksum`; its
    dictionary replaced afterwards."""
    from helpers import as_stranger

    with as_stranger():
        url = write(tmp_path / "ds")
    assert ar.add_checksums(url).ok and ar.open(url).describe()["signed"] == "yours"
    forge_dictionary(url, SELF_FIELD_DTYPE)
    assert "zstd_dict.bin" in refused(run(FIRST_EXAMPLE, url, timeout=30), 3)


# -- copies of a signed dataset ------------------------------------------------------------------------------------


def signed_copy(tmp_path, name: str = "copy") -> str:
    """A dataset of the user's, copied with `atlas-remote cp`: still theirs, shard for shard."""
    mine = write(tmp_path / "mine")
    copy = str(tmp_path / name)
    ar.copy_dataset(mine, copy)
    return copy


def swap_first_blocks(folder: str) -> None:
    """Shard `folder`'s blocks 0 and 1 swapped, with everything recorded about them (offsets, CRC-32s, signatures
    or digests: a row each of atlas_blocks.npy), index.npy to match: a consistent shard of the same blocks."""
    rows = np.load(os.path.join(folder, "atlas_blocks.npy"))
    data = open(os.path.join(folder, "data.bin"), "rb").read()
    bounds = rows["offset"].tolist()
    blocks = [data[a:b] for a, b in zip(bounds, bounds[1:])]
    assert blocks[0] != blocks[1]
    order = [1, 0, *range(2, len(blocks))]
    swapped = rows.copy()
    swapped[:-1] = rows[:-1][order]
    swapped["offset"] = np.cumsum([0] + [len(blocks[i]) for i in order])
    open(os.path.join(folder, "data.bin"), "wb").write(b"".join(blocks[i] for i in order))
    np.save(os.path.join(folder, "atlas_blocks.npy"), swapped)
    np.save(
        os.path.join(folder, "index.npy"), swapped["offset"].astype(np.load(os.path.join(folder, "index.npy")).dtype)
    )


def test_an_unmodified_copy_of_a_signed_dataset_reads_as_signed(tmp_path):
    copy = signed_copy(tmp_path)
    ds = ar.open(copy)
    assert same(ds[:], EXAMPLES) and all(ds.shards[i].signed for i in range(2))
    assert ds.describe()["signed"] == "yours"
    ar.add_manifest(copy)  # `atlas-remote index` keeps what signs it
    assert ar.open(copy).describe()["signed"] == "yours" and ar.verify(copy).ok


def test_a_copy_streamed_between_stores_reads_as_signed(tmp_path):
    """cp between two namespaces streams data.bin through this process, checking every block; the copy's files
    are the source's byte for byte, its seals with them."""
    mine = write(tmp_path / "mine")
    ar.copy_dataset(mine, "memory://signed-copy")
    ds = ar.open("memory://signed-copy")
    assert same(ds[:], EXAMPLES) and ds.shards[1].signed and ds.describe()["signed"] == "yours"


def test_a_copy_with_a_changed_block_is_refused_naming_it(tmp_path):
    copy = signed_copy(tmp_path)
    data = os.path.join(copy, "1", "data.bin")
    raw = bytearray(open(data, "rb").read())
    raw[-3] ^= 0x01
    open(data, "wb").write(bytes(raw))
    with pytest.raises(ar.CorruptBlockError) as caught:
        ar.open(copy)[399]
    assert (caught.value.shard, caught.value.block) == ("1", 19)
    assert same(ar.open(copy)[:390], EXAMPLES[:390]), "the other blocks still read"


def test_a_copy_with_its_blocks_reordered_is_refused(tmp_path):
    """Two blocks of shard 0 swapped with everything recorded about each: each block is one the user's writer
    signed, but not in that place. It read the swapped examples."""
    copy = signed_copy(tmp_path)
    swap_first_blocks(os.path.join(copy, "0"))
    ar.add_manifest(copy)  # the manifest digests the sidecar: rebuilt, as anyone may
    with pytest.raises(ar.CorruptBlockError, match="not what was signed") as caught:
        ar.open(copy)[0]
    assert caught.value.shard == "0"
    ds = ar.open(copy)
    assert same(ds[200:], EXAMPLES[200:]) and ds.shards[1].signed, "shard 1 still reads, signed"


def test_a_copy_with_two_shards_swapped_is_refused(tmp_path):
    """Shards 0 and 1 (of the same shape, other examples) swapped, the manifest rebuilt for them: each shard is the
    user's, signed with their key, but not at that number. It read them swapped."""
    upper = [{"id": i % 7, "text": TEXT.upper()} for i in range(200)]
    url = write(tmp_path / "ds", upper + EXAMPLES[:200])
    os.rename(os.path.join(url, "0"), os.path.join(url, "swap"))
    os.rename(os.path.join(url, "1"), os.path.join(url, "0"))
    os.rename(os.path.join(url, "swap"), os.path.join(url, "1"))
    ar.add_manifest(url)
    for i, shard in ((0, "0"), (250, "1")):
        with pytest.raises(ar.CorruptBlockError, match=r"moved here from another dataset or shard") as caught:
            ar.open(url)[i]
        assert caught.value.shard == shard


def test_a_shard_moved_from_another_of_the_users_datasets_is_refused(tmp_path):
    """Shard 1 of another dataset of the user's (same shape, other examples) put in place of the copy's shard 1,
    the manifest rebuilt: every byte of it is the user's, signed with their key, at the same number. It read."""
    copy = signed_copy(tmp_path)
    other = write(tmp_path / "other", [{"id": -i, "text": TEXT.upper()} for i in range(400)])
    shutil.rmtree(os.path.join(copy, "1"))
    shutil.copytree(os.path.join(other, "1"), os.path.join(copy, "1"))
    ar.add_manifest(copy)
    with pytest.raises(ar.CorruptBlockError, match="moved here from another dataset") as caught:
        ar.open(copy)[200]
    assert caught.value.shard == "1" and "\n" not in str(caught.value)
    assert same(ar.open(copy)[:200], EXAMPLES[:200]), "shard 0 is the copy's own, and reads"
    report = ar.verify(copy)
    assert not report.ok and "shard 1" in str(report) and "200 examples decoded" in str(report)
