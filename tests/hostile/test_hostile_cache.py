"""The disk cache folder (issue 35, row 1): another local user who can write it must not run code, delete files or
have forged blocks served. The folder must be private (checked at open, created 0700), and even a row planted in a
private folder, as an attacker writes one with sqlite3, is inert: never unpickled, never a file outside the
folder opened or removed. Tests run as root here: the owner check is tested with folders chown'ed to another
user, the mode check with group- and other-writable folders."""

from __future__ import annotations

import os
import pickle
import random
import sqlite3
import stat
import string
import struct
import zlib

import pytest
from helpers import same, tries
from helpers import write_dataset as write
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import atlas_remote as ar
from atlas_remote import CompressionStrategy as CS

MODE_BINARY, MODE_PICKLE = 2, 4  # diskcache's row modes
NOT_PRIVATE = "the disk cache folder is not private to this user"


def text(rng: random.Random, n: int) -> str:
    return "".join(rng.choice(string.ascii_letters) for _ in range(n))


@pytest.fixture
def dataset(tmp_path):
    """A local dataset of 8 blocks: long strings in even blocks, short ones in odd blocks (so that an odd block
    fits, padded, in the place of an even one); (url, examples)."""
    rng = random.Random(5)
    examples = [text(rng, 300 if (i // 5) % 2 == 0 else 12) for i in range(40)]
    return write(str(tmp_path / "ds"), examples, 20, 5, compression_strategy=CS.STANDARD_COMPRESSION), examples


def cached(url: str, folder, examples) -> None:
    """Read the blocks of these first examples through the disk cache at folder, filling it."""
    ds = ar.open(url, disk_cache=str(folder))
    assert same(ds[: len(examples)], examples) and ds.stats.disk_misses == len(examples) // 5


def database(folder) -> sqlite3.Connection:
    return sqlite3.connect(folder / "cache.db", isolation_level=None)


def snapshot(folder) -> dict:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


class Opens:
    """An attacker's pickle: unpickling it opens (creates) a file."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


def test_a_row_that_says_pickle_is_never_unpickled(dataset, tmp_path):
    """diskcache pickle.load-ed a row whose mode says pickle: the attacker's code ran in the reader."""
    url, examples = dataset
    folder, marker = tmp_path / "cache", tmp_path / "code-ran"
    cached(url, folder, examples)
    with database(folder) as db:
        db.execute(
            "UPDATE Cache SET mode = ?, value = ?, filename = NULL", (MODE_PICKLE, pickle.dumps(Opens(str(marker))))
        )
    ds = ar.open(url, disk_cache=str(folder))
    assert same(ds[:], examples)
    assert not marker.exists() and ds.stats.disk_hits == 0


@pytest.mark.parametrize("absolute", [False, True], ids=["../victim/sub/f", "absolute"])
def test_an_expired_row_never_removes_a_file_outside(dataset, tmp_path, absolute):
    """A planted expired row named '../victim/sub/f': the reader's next cache write deleted that file (and the
    folders it emptied)."""
    url, examples = dataset
    folder, victim = tmp_path / "cache", tmp_path / "victim" / "sub" / "f"
    victim.parent.mkdir(parents=True)
    victim.write_bytes(b"precious")
    cached(url, folder, examples[:20])  # shard 0 only: shard 1's blocks are still to be written
    name = str(victim) if absolute else "../victim/sub/f"
    with database(folder) as db:
        db.execute(
            "INSERT INTO Cache (key, raw, store_time, expire_time, access_time, access_count, size, mode, filename)"
            " VALUES ('planted', 1, 0, 1, 0, 0, 8, ?, ?)",
            (MODE_BINARY, name),
        )
    ds = ar.open(url, disk_cache=str(folder))
    assert same(ds[20:], examples[20:])
    assert victim.read_bytes() == b"precious"
    with database(folder) as db:
        assert db.execute("SELECT count(*) FROM Cache WHERE key = 'planted'").fetchone() == (0,), "culled all the same"


def test_a_row_naming_a_file_outside_is_never_read(dataset, tmp_path):
    """A row naming '../outside/block' was read as the block (here garbage: a checksum mismatch, not the data)."""
    url, examples = dataset
    folder, outside = tmp_path / "cache", tmp_path / "outside" / "block"
    outside.parent.mkdir()
    outside.write_bytes(os.urandom(4096))
    cached(url, folder, examples)
    with database(folder) as db:
        db.execute("UPDATE Cache SET mode = ?, filename = ?, value = NULL", (MODE_BINARY, "../outside/block"))
    ds = ar.open(url, disk_cache=str(folder))
    assert same(ds[:], examples) and ds.stats.disk_hits == 0


def crc_forged(data: bytes, target: int) -> bytes:
    """Four bytes that, appended to data, give the CRC-32 target (the classic inversion of the CRC table)."""
    table = []
    for n in range(256):
        c = n
        for _ in range(8):
            c = (c >> 1) ^ 0xEDB88320 if c & 1 else c >> 1
        table.append(c)
    top = {table[n] >> 24: n for n in range(256)}
    register, indices = target ^ 0xFFFFFFFF, []
    for _ in range(4):
        index = top[register >> 24]
        indices.append(index)
        register = ((register ^ table[index]) << 8) & 0xFFFFFFFF
    register, out = zlib.crc32(data) ^ 0xFFFFFFFF, bytearray()
    for index in reversed(indices):
        out.append((register ^ index) & 0xFF)
        register = (register >> 8) ^ table[index]
    assert zlib.crc32(data + bytes(out)) == target
    return bytes(out)


def swapped_block_served(url: str, folder) -> list:
    """Fill the cache, swap block 0's entry for block 1's bytes padded with a zstd skippable frame whose last
    four bytes forge block 0's CRC-32, and read block 0 again: what the reader serves."""
    ds = ar.open(url, disk_cache=str(folder))
    ds[:]
    with database(folder) as db:
        (first, second) = db.execute("SELECT rowid, value FROM Cache ORDER BY rowid LIMIT 2").fetchall()
        a, b = bytes(first[1]), bytes(second[1])
        padding = len(a) - len(b) - 8
        frame = b + struct.pack("<II", 0x184D2A50, padding) + bytes(padding - 4)
        db.execute("UPDATE Cache SET value = ? WHERE rowid = ?", (frame + crc_forged(frame, zlib.crc32(a)), first[0]))
    return ar.open(url, disk_cache=str(folder))[0:5]


def test_a_folder_others_can_write_is_refused_so_no_forged_block_is_served(dataset, tmp_path):
    """In a folder others could write, block 0's entry swapped for block 1's with its CRC-32 forged was served:
    the wrong examples, silently. Such a folder is now refused when the reader opens."""
    url, examples = dataset
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    with pytest.raises(ar.CacheFolderError, match=NOT_PRIVATE + r" \(group or others may write it \(mode 777\)\)"):
        served = swapped_block_served(url, shared)
        pytest.fail(f"another user's forged block was served: {served[0][:20]!r}, not {examples[0][:20]!r}")


def other_users(path) -> None:
    """Give path to another user (nobody): the suite runs as root, which may."""
    os.chown(path, 65534, 65534)


@pytest.mark.parametrize(
    "make, problem",
    [
        (lambda f: (f.mkdir(), f.chmod(0o770)), r"group or others may write it \(mode 770\)"),
        (lambda f: (f.mkdir(), f.chmod(0o707)), r"group or others may write it \(mode 707\)"),
        (lambda f: (f.mkdir(), other_users(f)), "it belongs to user 65534"),
        (lambda f: ((f.parent / "real").mkdir(mode=0o700), f.symlink_to(f.parent / "real")), "it is a symbolic link"),
        (lambda f: (f.mkdir(mode=0o700), (f / "cache.db").write_bytes(b""), other_users(f / "cache.db")), "cache.db"),
        (lambda f: (f.mkdir(mode=0o700), (f / "cache.db").write_bytes(b""), (f / "cache.db").chmod(0o666)), "cache.db"),
        (lambda f: (f.parent.chmod(0o777), f.mkdir(mode=0o700)), "may rename what is in .*, above it"),
    ],
    ids=[
        "group-writable",
        "other-writable",
        "another user's",
        "a link",
        "another user's cache.db",
        "shared cache.db",
        "open parent",
    ],
)
def test_a_folder_another_user_could_write_is_refused_at_open(dataset, tmp_path, make, problem):
    url, _ = dataset
    parent = tmp_path / "p"
    parent.mkdir()
    folder = parent / "cache"
    make(folder)
    with pytest.raises(ar.CacheFolderError, match=problem) as refused:
        ar.open(url, disk_cache=str(folder))
    assert "\n" not in str(refused.value) and str(folder) in str(refused.value)


def test_a_new_folder_is_made_private_and_a_sticky_parent_is_fine(dataset, tmp_path):
    url, examples = dataset
    shared_tmp = tmp_path / "tmp"
    shared_tmp.mkdir()
    shared_tmp.chmod(0o1777)  # like /tmp: others may make folders in it, not rename ours
    folder = shared_tmp / "mine" / "cache"
    ds = ar.open(url, disk_cache=str(folder))
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    assert same(ds[:], examples) and same(ar.open(url, disk_cache=str(folder))[:], examples)


@pytest.mark.parametrize(
    "plant, problem",
    [
        (
            "CREATE TRIGGER evil AFTER INSERT ON Cache BEGIN UPDATE Cache SET value = x'00' WHERE rowid = NEW.rowid; END",
            "trigger evil",
        ),
        ("INSERT INTO Settings VALUES ('disk__directory', '{outside}')", "setting 'disk__directory'"),
        ("UPDATE Settings SET value = 'off; --' WHERE key = 'sqlite_journal_mode'", "setting 'sqlite_journal_mode'"),
        ("CREATE VIEW spy AS SELECT * FROM Cache", "view spy"),
    ],
    ids=["a trigger", "a disk setting", "a pragma", "a view"],
)
def test_a_database_diskcache_did_not_write_is_refused_before_it_is_opened(tmp_path, plant, problem):
    """Settings rows become attributes (disk__directory moved the value files outside) and PRAGMAs; triggers
    run with every write. Blocks of 40 KB are kept as files, not rows."""
    url = write(
        str(tmp_path / "ds"), [os.urandom(40_000) for _ in range(4)], 4, 1, compression_strategy=CS.NO_COMPRESSION
    )
    folder, outside = tmp_path / "cache", tmp_path / "outside"
    outside.mkdir()
    ar.open(url, disk_cache=str(folder))[0]
    with database(folder) as db:
        db.execute(plant.format(outside=outside))
    with pytest.raises(ar.CacheFolderError, match=f"cache.db of the disk cache was not made by diskcache .*{problem}"):
        ar.open(url, disk_cache=str(folder))[:]
    assert snapshot(outside) == {}


def test_a_cache_db_that_is_not_sqlite_is_one_line(dataset, tmp_path):
    url, _ = dataset
    folder = tmp_path / "cache"
    folder.mkdir(mode=0o700)
    (folder / "cache.db").write_bytes(b"not a database, " * 100)
    with pytest.raises(ar.CacheFolderError, match="cannot be read as SQLite"):
        ar.open(url, disk_cache=str(folder))[0]


OUTSIDE_NAMES = ["../outside/f", "../outside", "../../outside/f", "{outside}/f", "/", "..", "ab/cd/../../../outside/f"]


@settings(max_examples=tries(40), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    planted=st.lists(
        st.tuples(
            st.sampled_from([0, 1, 2, 3, 4, 5, -1]),
            st.one_of(st.none(), st.sampled_from(OUTSIDE_NAMES), st.text(max_size=40)),
            st.one_of(
                st.none(),
                st.binary(max_size=64),
                st.text(max_size=16),
                st.integers(-(2**63), 2**63 - 1),
                st.just("pickle"),
            ),
            st.booleans(),
        ),
        max_size=6,
    )
)
def test_planted_rows_are_inert_whatever_they_hold(dataset, tmp_path, planted):
    """Rows of every mode, file name and value, expired or not, over our keys or beside them: the reader serves
    the dataset's examples, runs nothing, and changes nothing outside the folder."""
    url, examples = dataset
    folder, outside, marker = tmp_path / "cache", tmp_path / "outside", tmp_path / "code-ran"
    (outside / "sub").mkdir(parents=True, exist_ok=True)
    (outside / "f").write_bytes(b"precious")
    (outside / "sub" / "g").write_bytes(b"precious too")
    before = snapshot(outside)
    ar.open(url, disk_cache=str(folder))[:]
    with database(folder) as db:
        keys = [k for (k,) in db.execute("SELECT key FROM Cache").fetchall()]
        for n, (mode, name, value, expired) in enumerate(planted):
            name = name.format(outside=outside) if name in OUTSIDE_NAMES else name
            value = pickle.dumps(Opens(str(marker))) if value == "pickle" else value
            fields = (1.0 if expired else None, mode, name, value)
            if n < len(keys):  # over one of ours
                db.execute(
                    "UPDATE Cache SET expire_time = ?, mode = ?, filename = ?, value = ? WHERE key = ?",
                    (*fields, keys[n]),
                )
            else:
                db.execute(
                    "INSERT INTO Cache (key, raw, store_time, expire_time, access_time, mode, filename, value)"
                    " VALUES (?, ?, 0, ?, 0, ?, ?, ?)",
                    (f"planted-{n}", n % 2, *fields),
                )
    ds = ar.open(url, disk_cache=str(folder))
    assert same(ds[:], examples) and same([ds[i] for i in range(0, 40, 7)], examples[0:40:7])
    assert snapshot(outside) == before and not marker.exists()
