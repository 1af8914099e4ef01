"""Signed datasets (keys.py, format/seal.py, docs/security.md): a writer holding the user's key seals every shard
(its blocks' digests, dictionary, settings and place); a reader holding the same key checks each seal and decodes
those blocks as the user's own. Every other block (the original implementation's, a stranger's, another key's)
is decoded as a stranger's, with every check. Forged dictionaries, moved shards and public keys:
test_signing_round3.py."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import stat
import subprocess
import sys
import zlib

import numpy as np
import pytest
from helpers import as_stranger, same, sample_examples

import atlas_remote as ar
from atlas_remote import CompressionStrategy as CS
from atlas_remote.format.manifest import MANIFEST, Manifest, Sidecar
from atlas_remote.format.spec import BLOCKS_DTYPE, BLOCKS_FILE, CHECKSUM_FILE, INDEX_FILE
from atlas_remote.trust.key_files import config_path
from atlas_remote.trust.keys import KEY_ENV, secret_key

AMPLIFIED = [[set() for _ in range(600_000)]]  # 1.2 MB of pickle that builds 135 MB: refused from a stranger


def write(url, examples, **settings) -> str:
    settings = {"shard_size": 100, "block_size": 10, "compression_strategy": CS.STANDARD_COMPRESSION, **settings}
    with ar.AtlasDatasetWriter(str(url), **settings) as writer:
        writer.add_examples(examples)
    return str(url)


def sidecar(url, shard: str = "0") -> np.ndarray:
    return np.load(os.path.join(url, shard, BLOCKS_FILE))


def test_the_users_own_blocks_are_signed_and_read_as_theirs(tmp_path):
    examples = sample_examples(250)
    url = write(tmp_path / "ds", examples)
    rows = sidecar(url)
    assert rows.dtype == BLOCKS_DTYPE and len(rows) == 11, "ten blocks and the end"
    data = open(os.path.join(url, "0", "data.bin"), "rb").read()
    assert rows["sha256"][0].tobytes() == hashlib.sha256(data[: rows["offset"][1]]).digest()
    assert rows["sha256"][-1].tobytes() == bytes(32), "no dictionary (standard compression)"
    assert rows["offset"][-1] == os.path.getsize(os.path.join(url, "0", "data.bin"))
    assert np.array_equal(rows["offset"], np.load(os.path.join(url, "0", INDEX_FILE))), "the original's index agrees"
    ds = ar.open(url)
    assert same(ds[:], examples) and same(list(ds), examples)
    assert all(ds.shards[i].signed for i in range(3))
    assert ds.manifest.signer == secret_key().id and len(ds.manifest.dataset) == 32, "the key's id, the dataset's"
    assert ds.describe()["signed"] == "yours" and ds.describe()["signer"] == secret_key().id


def test_a_signed_block_skips_the_checks_on_what_a_strangers_would_build(tmp_path):
    """The split itself: the same block is the user's own when their key signed it, a stranger's otherwise."""
    mine = write(tmp_path / "mine", AMPLIFIED, block_size=1)
    assert len(ar.open(mine)[0]) == 600_000
    with as_stranger():
        theirs = write(tmp_path / "theirs", AMPLIFIED, block_size=1)
    ds = ar.open(theirs)
    ds.open_shard(ds.shards[0])
    assert not ds.shards[0].signed
    with pytest.raises(ar.UnsafePickleError, match="would build more than"):
        ds[0]
    assert ds.describe()["signed"] == "another key"


class Mine:
    """A class of the user's own."""


def test_globals_are_refused_in_signed_blocks_too(tmp_path):
    """Signing vouches for the structure the user's writer built, never for code: the same globals are refused."""
    url = write(tmp_path / "ds", [{"x": Mine()}], block_size=1)
    with pytest.raises(ar.UnsafePickleError, match="Mine"):
        ar.open(url)[0]
    assert ar.open(url, allowed_classes=[Mine])[0]["x"].__class__ is Mine


def forge(url: str, shard: str, block: int, replacement: bytes) -> None:
    """An attacker who can write the dataset's files: a block replaced by another of the same length, and its
    CRC-32 in the sidecar replaced to match (CRC-32 is no defence against someone choosing the bytes)."""
    data_path, sums_path = os.path.join(url, shard, "data.bin"), os.path.join(url, shard, BLOCKS_FILE)
    rows = np.load(sums_path).copy()
    start, end = int(rows["offset"][block]), int(rows["offset"][block + 1])
    assert len(replacement) == end - start
    data = bytearray(open(data_path, "rb").read())
    data[start:end] = replacement
    open(data_path, "wb").write(bytes(data))
    rows["crc32"][block] = zlib.crc32(replacement)
    np.save(sums_path, rows)
    ar.add_manifest(url)  # the manifest digests the sidecar: rebuilt, as anyone may


@pytest.mark.parametrize("stranger", [False, True])
def test_a_block_swapped_with_its_crc_forged_is_caught_by_its_signature(tmp_path, stranger):
    """Two blocks of equal length swapped, CRC-32s forged to match: the user's own dataset says so (its
    signatures), a stranger's cannot tell (CRC-32 is all it has) and serves the swapped examples."""
    examples = [{"i": i} for i in range(40)]  # blocks of 10 small dicts: equal lengths
    if stranger:
        with as_stranger():
            url = write(tmp_path / "ds", examples, compression_strategy=CS.NO_COMPRESSION)
    else:
        url = write(tmp_path / "ds", examples, compression_strategy=CS.NO_COMPRESSION)
    rows = sidecar(url)
    raw = open(os.path.join(url, "0", "data.bin"), "rb").read()
    second = raw[int(rows["offset"][1]) : int(rows["offset"][2])]
    forge(url, "0", 0, second)
    ds = ar.open(url)
    if stranger:
        assert ds[0] == {"i": 10}, "a stranger's dataset has no stronger check than its CRC-32s"
        return
    with pytest.raises(ar.CorruptBlockError, match="SHA-256 is not the one its signed shard records") as caught:
        ds[0]
    assert caught.value.shard == "0" and caught.value.block == 0 and "\n" not in str(caught.value)
    assert same(ds[10:40], examples[10:40]), "the other blocks still read"
    report = ar.verify(url)
    assert not report.ok and "shard 0 block 0" in str(report)


def test_a_disk_cached_block_is_checked_against_its_signature(tmp_path):
    """What comes from the disk cache is checked as what comes from the store: a cached block replaced by
    another valid block is caught by the signature, where a forged CRC-32 would pass."""
    examples = [{"i": i} for i in range(40)]
    url = write(tmp_path / "ds", examples, compression_strategy=CS.NO_COMPRESSION)
    cache = tmp_path / "cache"
    ds = ar.open(url, disk_cache=str(cache), cache_bytes=0)
    assert same(ds[:], examples)
    import diskcache

    rows = sidecar(url)
    raw = open(os.path.join(url, "0", "data.bin"), "rb").read()
    other = raw[int(rows["offset"][1]) : int(rows["offset"][2])]
    with diskcache.Cache(str(cache)) as entries:  # every block of the same length replaced by block 1
        keys = [k for k in entries.iterkeys() if len(entries[k]) == len(other)]
        assert len(keys) == 4, list(entries.iterkeys())
        for k in keys:
            entries.set(k, other)
    with pytest.raises(ar.CorruptBlockError, match="SHA-256 is not the one its signed shard records"):
        ar.open(url, disk_cache=str(cache), cache_bytes=0)[0]


def test_another_keys_blocks_are_a_strangers_until_signed_with_yours(tmp_path):
    with as_stranger():
        url = write(tmp_path / "ds", sample_examples(120))
    ds = ar.open(url)
    assert not any(ds.shards[i].signed for i in range(2)) and ds[119] == sample_examples(120)[119]
    report = ar.add_checksums(url)
    assert report.ok and report.shards_added == ["0", "1"] and "checksums and signatures" in str(report)
    ds = ar.open(url)
    ds[0], ds[119]
    assert ds.shards[0].signed and ds.shards[1].signed and ds.manifest is not None
    assert ds.manifest.checksums.tolist() == [Sidecar.BLOCKS] * 2
    assert ar.add_checksums(url).shards_already == ["0", "1"]


def test_signing_refuses_a_shard_a_stranger_could_not_read(tmp_path):
    """`atlas-remote checksum` vouches only for what passes a stranger's checks: a shard with an amplifying block
    gets no signature, and is reported."""
    with as_stranger():
        url = write(tmp_path / "ds", [*AMPLIFIED, *range(150)], block_size=1)
    report = ar.add_checksums(url)
    assert not report.ok and report.shards_added == ["1"] and "shard 0 block 0" in report.problems[0]
    with pytest.raises(ar.UnsafePickleError):
        ar.open(url)[0]


def test_the_originals_dataset_gets_signed_and_the_original_still_reads_it(tmp_path):
    from spec_reader import SpecReader

    examples = sample_examples(300)
    url = write(tmp_path / "ds", examples, checksums=False)
    assert not (tmp_path / "ds" / "0" / BLOCKS_FILE).exists(), "checksums=False: the original's files only"
    assert ar.open(url).describe()["signed"] == "none"
    assert ar.add_checksums(url).shards_added == ["0", "1", "2"]
    ds = ar.open(url)
    assert same(ds[:], examples) and ds.shards[0].signed
    assert same(SpecReader(tmp_path / "ds").all(), examples)


def test_shards_with_the_earlier_sidecar_still_read_and_are_checked(tmp_path):
    """A dataset atlas_remote wrote before signing: index.npy, block_checksums.npy and a /2 manifest."""
    examples = sample_examples(200)
    url = write(tmp_path / "ds", examples)
    for shard in "01":
        folder = tmp_path / "ds" / shard
        rows = np.load(folder / BLOCKS_FILE)
        np.save(folder / CHECKSUM_FILE, rows["crc32"][:-1].copy())
        (folder / BLOCKS_FILE).unlink()
    ar.add_manifest(url)
    manifest = Manifest.decode((tmp_path / "ds" / MANIFEST).read_bytes(), shards=2)
    assert manifest.checksums.tolist() == [Sidecar.CHECKSUMS] * 2
    older = older_manifest(manifest)
    (tmp_path / "ds" / MANIFEST).write_bytes(older)
    ds = ar.open(url)
    assert ds.manifest is not None and same(ds[:], examples) and not ds.shards[0].signed
    assert dict(ds.stats.requests)["checksums"] == 2
    data = tmp_path / "ds" / "1" / "data.bin"
    raw = bytearray(data.read_bytes())
    raw[-5] ^= 1
    data.write_bytes(bytes(raw))
    with pytest.raises(ar.CorruptBlockError, match="checksum mismatch .CRC-32"):
        ar.open(url)[199]


def older_manifest(manifest: Manifest) -> bytes:
    """The manifest as atlas_remote wrote it before signing: format /2, `checksums` a flag."""
    import io

    header = json.dumps({"format": "atlas_remote.manifest/2", "root_sha256": manifest.root_sha256}).encode()
    buffer = io.BytesIO()
    columns = {name: getattr(manifest, name) for name in ("numbers", "sizes", "block_sizes", "strategies")}
    np.savez_compressed(
        buffer,
        header=np.frombuffer(header, np.uint8),
        **columns,
        data_bytes=manifest.data_bytes,
        checksums=manifest.checksums.astype(bool),
        digests=manifest.digests,
        levels=manifest.levels,
        dict_sizes=manifest.dict_sizes,
    )
    return buffer.getvalue()


def test_an_index_that_disagrees_with_the_sidecar_is_reported_by_verify(tmp_path):
    """atlas_remote reads offsets from atlas_blocks.npy, the original reader from index.npy: verify reads both."""
    url = write(tmp_path / "ds", sample_examples(100))
    index = np.load(tmp_path / "ds" / "0" / INDEX_FILE)
    index[3] += 1
    np.save(tmp_path / "ds" / "0" / INDEX_FILE, index)
    assert same(ar.open(url)[:], sample_examples(100)), "this reader uses the sidecar"
    report = ar.verify(url)
    assert not report.ok and "0/index.npy" in str(report) and "original reader would read other bytes" in str(report)


# -- the key ---------------------------------------------------------------------------------------------------


@pytest.fixture
def no_key(tmp_path, monkeypatch):
    """No ATLAS_REMOTE_KEY, and a config folder of the test's own."""
    monkeypatch.delenv(KEY_ENV, raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    return tmp_path / "config" / "atlas_remote" / "key"


def test_the_first_writer_creates_a_key_only_its_owner_can_read(no_key, tmp_path):
    assert secret_key() is None and not no_key.exists()
    url = write(tmp_path / "ds", sample_examples(20))
    assert config_path("key") == no_key and stat.S_IMODE(no_key.stat().st_mode) == 0o600
    assert stat.S_IMODE(no_key.parent.stat().st_mode) == 0o700
    assert len(bytes.fromhex(no_key.read_text())) == 32
    assert ar.open(url).describe()["signed"] == "yours"
    assert secret_key(create=True) == secret_key(), "made once"


def test_a_key_file_others_can_read_is_not_used(no_key, tmp_path, caplog):
    no_key.parent.mkdir(parents=True)
    no_key.write_text("ab" * 32)
    no_key.chmod(0o644)
    with caplog.at_level(logging.WARNING, logger="atlas_remote.trust.key_files"):
        assert secret_key() is None and secret_key(create=True) is None
    assert "others can read it" in caplog.text and "chmod 600" in caplog.text
    url = write(tmp_path / "ds", sample_examples(20))
    assert ar.open(url).manifest.signer is None and len(sidecar(url)) == 3, "written unsigned, with its sums"
    no_key.chmod(0o600)
    assert secret_key() is not None and ar.open(url).describe()["signed"] == "none"


def test_a_malformed_key_is_one_line(tmp_path, monkeypatch):
    monkeypatch.setenv(KEY_ENV, "not hex")
    with pytest.raises(ar.AtlasError, match="ATLAS_REMOTE_KEY must hold a key of at least 32 hex digits"):
        write(tmp_path / "ds", sample_examples(5))
    done = subprocess.run(
        [sys.executable, "-m", "atlas_remote.cli", "demo", "--url", str(tmp_path / "demo")],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, KEY_ENV: "12"},
    )
    assert done.returncode == 1 and "ATLAS_REMOTE_KEY must hold" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
