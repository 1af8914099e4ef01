"""Issue 45, row 2 and item 2: key files a reader can rely on, and trust a cluster can share without the power to
sign. A key file is used only if it is a regular file its user owns, not readable (secrets) or writable (the
trusted list) by others, and opening it never waits; a writer with a private key (Ed25519) signs, readers that
list its public key read its datasets on the signed path, and a reader holding only public keys makes no seal
anyone accepts."""

from __future__ import annotations

import logging
import os
import secrets
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from helpers import as_stranger, same, sample_examples
from hypothesis import given
from hypothesis import strategies as st

import atlas_remote as ar
from atlas_remote import CompressionStrategy as CS

KEY, PRIVATE, TRUSTED = "ATLAS_REMOTE_KEY", "ATLAS_REMOTE_PRIVATE_KEY", "ATLAS_REMOTE_TRUSTED_KEYS"
AMPLIFIED = [[set() for _ in range(600_000)]]  # 1.2 MB of pickle that builds 135 MB: read only on the signed path
TESTS = Path(__file__).resolve().parents[1]


class Gadget:
    """An example that pickles as `function(*args)`, then BUILD with `state`."""

    def __init__(self, function, args, state=None):
        self.function, self.args, self.state = function, args, state

    def __reduce__(self):
        return (self.function, self.args) if self.state is None else (self.function, self.args, self.state)


def self_field_dtype() -> dict:
    """numpy.dtype('V8') whose state puts itself among its fields, as a dict key: hashing it recurses in C without
    end (a segfault) where the walk, which refuses it, is skipped: on the signed path."""
    dtype = Gadget(np.dtype, ("V8", False, True))
    dtype.state = (3, "|", None, ("a",), {"a": (dtype, 0)}, 8, 1, 0)
    return {dtype: None}


@pytest.fixture
def home(tmp_path, monkeypatch) -> Path:
    """A config folder of the test's own, and no key in the environment."""
    for name in (KEY, PRIVATE, TRUSTED):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    folder = tmp_path / "config" / "atlas_remote"
    folder.mkdir(parents=True, mode=0o700)
    return folder


def write(url, examples, env: dict[str, str] | None = None, shard_size: int = 100) -> str:
    """A dataset written with the keys in `env` (the process's own otherwise), a block an example."""
    before = {name: os.environ.get(name) for name in (env or {})}
    os.environ.update(env or {})
    try:
        with ar.AtlasDatasetWriter(str(url), shard_size, 1, CS.STANDARD_COMPRESSION) as writer:
            writer.add_examples(examples)
    finally:
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
    return str(url)


def ed25519_pair() -> tuple[str, str]:
    """(a private key's seed, its public key as a trusted list holds it), both as text."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    seed = secrets.token_bytes(32)
    public = Ed25519PrivateKey.from_private_bytes(seed).public_key().public_bytes_raw()
    return seed.hex(), f"ed25519:{public.hex()}"


FIRST_EXAMPLE = """
    import sys, atlas_remote as ar
    try:
        print(repr(ar.open(sys.argv[1])[0])[:60])
    except ar.AtlasError as err:
        print(type(err).__name__, err)
        sys.exit(3)
"""


def first_example(url: str, timeout: float = 60) -> subprocess.CompletedProcess:
    """ds[0] in a process of its own (a crash or a wait ends it, not the test), with this process's environment."""
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(FIRST_EXAMPLE), url], capture_output=True, text=True, timeout=timeout
    )


# -- row 2: key files ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["key", "private_key", "trusted_keys"])
def test_a_key_file_another_user_owns_is_not_used(home, tmp_path, name):
    """In a config folder another user can write, a file of theirs (mode 600, or 644 for a list) became the
    reader's key: their dataset then read on the signed path, where a block with a dtype in its own fields
    segfaulted. The file is not used (one warning); the block is refused by the walk, in one line."""
    seed, public = ed25519_pair()
    theirs = secrets.token_hex(32)
    env = {KEY: theirs} if name == "key" else {PRIVATE: seed}
    url = write(tmp_path / "ds", [self_field_dtype()], env)
    path = home / name
    path.write_text({"key": theirs, "private_key": seed, "trusted_keys": public}[name] + "\n")
    path.chmod(0o600 if name != "trusted_keys" else 0o644)
    os.chown(path, 65534, 65534)
    done = first_example(url)
    assert done.returncode == 3 and "a numpy dtype in it holds itself" in done.stdout, (done.returncode, done.stdout)
    assert f"{path} not used: it belongs to uid 65534, not to you" in done.stderr, done.stderr
    os.chown(path, os.geteuid(), os.getegid())
    assert ar.open(url).describe()["signed"] in ("yours", "trusted"), "owned by the user: used"


@pytest.mark.parametrize("name", ["key", "private_key", "trusted_keys"])
def test_a_fifo_named_as_a_key_file_never_blocks_an_open(home, tmp_path, name):
    """A FIFO named `key` blocked `open()` of any dataset (reading a key waited for a writer to the FIFO)."""
    url = write(tmp_path / "ds", sample_examples(20), {KEY: secrets.token_hex(32)})
    os.mkfifo(home / name, 0o600)
    done = first_example(url, timeout=30)
    assert done.returncode == 0 and done.stdout.strip(), done.stderr
    assert f"{home / name} not used: it is not a regular file" in done.stderr


@pytest.mark.parametrize(
    "name, mode, used",
    [
        ("key", 0o640, False),
        ("key", 0o604, False),
        ("private_key", 0o640, False),
        ("private_key", 0o600, True),
        ("trusted_keys", 0o664, False),
        ("trusted_keys", 0o646, False),
        ("trusted_keys", 0o644, True),
    ],
)
def test_a_key_file_others_can_read_or_change_is_not_used(home, name, mode, used, caplog):
    """A secret others can read is not a secret; a trusted list others can write names whom they like."""
    from atlas_remote.trust.keys import private_key, secret_key, trusted_keys

    seed, public = ed25519_pair()
    (home / name).write_text({"key": secrets.token_hex(32), "private_key": seed, "trusted_keys": public}[name] + "\n")
    (home / name).chmod(mode)
    with caplog.at_level(logging.WARNING, logger="atlas_remote.trust.key_files"):
        found = {"key": secret_key, "private_key": private_key, "trusted_keys": trusted_keys}[name]()
    assert bool(found) == used
    if not used:
        assert ("others can read it (chmod 600" if name != "trusted_keys" else "others can change it") in caplog.text


def test_a_linked_key_file_is_not_used(home, tmp_path):
    """Held from round 2: a key file that is a symbolic link (to a file of anyone's) is not followed."""
    from atlas_remote.trust.keys import secret_key

    target = tmp_path / "elsewhere"
    target.write_text(secrets.token_hex(32))
    target.chmod(0o600)
    (home / "key").symlink_to(target)
    assert secret_key() is None


# -- item 2: public keys -------------------------------------------------------------------------------------------


def test_a_reader_trusting_the_writers_public_key_reads_on_the_signed_path(home, tmp_path, monkeypatch):
    """The writer holds the private key; a training node lists its public key (the environment, or the file with
    a name) and reads its datasets as the user's own (a block only the signed path reads, here); a node that does
    not list it reads them as a stranger's."""
    seed, public = ed25519_pair()
    url = write(tmp_path / "ds", AMPLIFIED + sample_examples(30), {PRIVATE: seed})
    ds = ar.open(url)
    with pytest.raises(ar.UnsafePickleError, match="would build more than"):
        ds[0]
    facts = ds.describe()
    assert facts["signed"] == "another key" and facts["signer"] == public and not ds.shards[0].signed
    monkeypatch.setenv(TRUSTED, f"ed25519:{'0' * 64}, {public}")
    ds = ar.open(url)
    assert len(ds[0]) == 600_000 and same(ds[1:], sample_examples(30)) and ds.shards[0].signed
    assert ds.describe()["signed"] == "trusted" and ar.verify(url).ok
    monkeypatch.delenv(TRUSTED)
    (home / "trusted_keys").write_text(f"# the writer of the cluster's datasets\n{public}  the writer node\n")
    facts = ar.open(url).describe()
    assert facts["signed"] == "trusted" and facts["signer_name"] == "a key you trust (the writer node)"
    done = subprocess.run(
        [sys.executable, "-m", "atlas_remote.cli", "info", url], capture_output=True, text=True, timeout=60
    )
    assert (
        f"signed      with a key you trust (the writer node), {public}: its blocks are read as your own" in done.stdout
    )


def test_a_reader_holding_only_public_keys_makes_no_seal_others_accept(home, tmp_path, monkeypatch):
    """Training nodes hold the writer's public key only. Asked to sign with a private key, one says it has none;
    signing anyway, it signs with a secret key of its own, which no other node takes; and a seal it forges in the
    writer's name (with the public key as an HMAC key, or another Ed25519 key) is refused."""
    import dataclasses

    from atlas_remote.format.manifest import MANIFEST, Manifest
    from atlas_remote.format.seal import content_digest, placed
    from atlas_remote.format.spec import AtlasDatasetShardMetadata, decode_blocks
    from atlas_remote.trust.keys import PrivateKey, SecretKey

    seed, public = ed25519_pair()
    monkeypatch.setenv(TRUSTED, public)
    with as_stranger():
        url = write(tmp_path / "ds", sample_examples(40))
    with pytest.raises(ar.AtlasError, match="no private key"):
        ar.add_checksums(url, sign_with="private")
    assert ar.add_checksums(url).ok, "signed with a secret key of its own, made now"
    assert ar.open(url).describe()["signed"] == "yours"
    other = {**os.environ, "XDG_CONFIG_HOME": str(tmp_path / "another node")}
    node = subprocess.run(
        [sys.executable, "-m", "atlas_remote.cli", "info", "--json", url], env=other, capture_output=True, text=True
    )
    assert '"signed": "another key"' in node.stdout, node.stdout + node.stderr

    signed = write(tmp_path / "signed", sample_examples(40), {PRIVATE: seed})
    raw = open(os.path.join(signed, MANIFEST), "rb").read()
    manifest = Manifest.decode(raw, shards=1)
    meta = AtlasDatasetShardMetadata.from_json(open(os.path.join(signed, "0", "meta.json"), "rb").read(), "m")
    offsets, sums = decode_blocks(open(os.path.join(signed, "0", "atlas_blocks.npy"), "rb").read(), meta, "b")
    content = content_digest(meta, bytes(32), offsets, sums.digests)
    statement = placed(manifest.dataset, 0, content)
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    forgers = [SecretKey(bytes.fromhex(public.split(":")[1]), public), PrivateKey(Ed25519PrivateKey.generate())]
    assert ar.open(signed).shards[0] and ar.verify(signed).ok
    for forger in forgers:
        forged = dataclasses.replace(manifest, signer=public, seals=np.frombuffer(forger.sign(statement), "V64"))
        open(os.path.join(signed, MANIFEST), "wb").write(forged.encode())
        with pytest.raises(ar.CorruptBlockError, match="does not match it"):
            ar.open(signed)[0]


def test_checksum_signs_with_either_key(home, tmp_path, monkeypatch):
    """`atlas-remote checksum --with secret|private`; by default the private key where there is one. `info`
    names the key."""
    from atlas_remote.trust.keys import secret_key

    seed, public = ed25519_pair()
    monkeypatch.setenv(PRIVATE, seed)
    monkeypatch.setenv(KEY, secrets.token_hex(32))
    with as_stranger():
        url = write(tmp_path / "ds", sample_examples(40))
    cli = lambda *args: subprocess.run(
        [sys.executable, "-m", "atlas_remote.cli", *args], capture_output=True, text=True, timeout=120
    )
    assert cli("checksum", url, "--with", "secret", "-q").returncode == 0
    assert ar.open(url).describe()["signer"] == secret_key().id
    assert f"with your key {secret_key().id}" in cli("info", url).stdout
    assert cli("checksum", url, "-q").returncode == 0, "signed again, with the private key"
    assert ar.open(url).describe()["signer"] == public
    assert f"with your key {public}" in cli("info", url).stdout
    done = cli("checksum", url, "--with", "private", "-q")
    assert done.returncode == 0 and "added to 0 shards, 1 already signed" in done.stdout


def test_the_workers_of_a_write_sign_with_the_writers_private_key(home, tmp_path, monkeypatch):
    """Each worker process seals its shards as staged; the committing process seals them in place with the same
    key, after checking the staged seals."""
    seed, public = ed25519_pair()
    script = tmp_path / "build.py"
    script.write_text(
        "import sys\nimport atlas_remote as ar\nif __name__ == '__main__':\n"
        "    ar.build('tables_maps:rows_of', [3, 4, 5], sys.argv[1], workers=2, shard_size=5, block_size=2)\n"
    )
    env = {**os.environ, PRIVATE: seed, "PYTHONPATH": str(TESTS)}
    done = subprocess.run(
        [sys.executable, str(script), str(tmp_path / "ds")], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    monkeypatch.setenv(TRUSTED, public)
    ds = ar.open(str(tmp_path / "ds"))
    ds[:]
    assert len(ds.shards) > 2 and all(shard.signed for shard in ds.shards)


def test_a_part_staged_with_another_key_is_not_signed(home, tmp_path, monkeypatch, caplog):
    """The committer vouches only for shards its own key sealed as staged: a part written with another key (or
    whose staged record someone changed) is committed unsigned, read as a stranger's, and a warning says so."""
    from atlas_remote.write import parts

    url = str(tmp_path / "ds")
    monkeypatch.setenv(KEY, secrets.token_hex(32))
    staged = parts.StagedParts(url, ar.WriteSettings(10, 5), holder="a test")
    written = [staged.spec(0).write(sample_examples(20))]
    monkeypatch.setenv(KEY, secrets.token_hex(32))  # the committer's, and the other parts'
    written += [staged.spec(n).write(sample_examples(20, seed=n)) for n in (1, 2)]
    written[1].seals[0][0] = "00" * 32  # a staged content digest changed: the staged seal no longer holds
    with caplog.at_level(logging.WARNING, logger="atlas_remote.write.parts"):
        staged.commit(written)
    ds = ar.open(url)
    ds[:]
    assert [shard.signed for shard in ds.shards] == [False, False, False, True, True, True]
    assert "3 of 6 shards are not signed" in caplog.text


# -- what a seal binds ---------------------------------------------------------------------------------------------


@given(
    st.tuples(st.integers(1, 1000), st.integers(0, 10**6), st.sampled_from(list(CS))),
    st.binary(min_size=32, max_size=32),
    st.lists(st.binary(min_size=32, max_size=32), min_size=1, max_size=4),
    st.binary(min_size=16, max_size=16),
    st.integers(0, 2**40),
    st.data(),
)
def test_a_seal_holds_for_its_shard_only(settings, dictionary, digests, dataset, number, data):
    """Change any one input of what a seal binds (a setting, the dictionary, an offset, a block's digest, the
    dataset, the shard's number) and the seal no longer holds, whichever key made it."""
    from atlas_remote.format.seal import content_digest, placed
    from atlas_remote.format.spec import VERSION, AtlasDatasetShardMetadata
    from atlas_remote.trust.keys import _secret

    block_size, stored, strategy = settings
    meta = AtlasDatasetShardMetadata(VERSION, block_size, stored, strategy, 3, 0.01)
    offsets = np.cumsum([0, *range(1, len(digests) + 1)]).astype(np.uint64)
    key = _secret(b"k" * 32)
    inputs = (meta, dictionary, offsets, b"".join(digests), dataset, number)
    seal = key.sign(placed(dataset, number, content_digest(*inputs[:4])))
    changed = list(inputs)
    which = data.draw(st.integers(0, 5))
    if which == 0:
        changed[0] = meta._replace(**{data.draw(st.sampled_from(["block_size", "stored_examples"])): stored + 1001})
    elif which == 2:
        changed[2] = offsets.copy()
        changed[2][data.draw(st.integers(0, len(offsets) - 1))] += 1
    elif which == 5:
        changed[5] = number + 1
    else:
        raw = bytearray(changed[which])
        raw[data.draw(st.integers(0, len(raw) - 1))] ^= 1
        changed[which] = bytes(raw)
    statement = placed(changed[4], changed[5], content_digest(*changed[:4]))
    assert key.verifies(placed(dataset, number, content_digest(*inputs[:4])), seal)
    assert not key.verifies(statement, seal)


# -- earlier datasets ----------------------------------------------------------------------------------------------


def test_a_dataset_signed_before_reads_as_a_strangers(tmp_path):
    """Shards this library signed before (a 16-byte HMAC per block in atlas_blocks.npy, which left the dictionary
    out) read, and their examples are right, but as a stranger's: checked before loading, a block laid out
    through a dictionary to crash is refused rather than run."""
    from atlas_remote.format.manifest import MANIFEST
    from atlas_remote.format.spec import EARLIER_BLOCKS_DTYPE

    examples = sample_examples(40)
    url = write(tmp_path / "ds", examples, shard_size=20)
    for shard in ("0",):
        path = tmp_path / "ds" / shard / "atlas_blocks.npy"
        rows = np.load(path)
        earlier = np.zeros(len(rows), EARLIER_BLOCKS_DTYPE)
        earlier["offset"], earlier["crc32"] = rows["offset"], rows["crc32"]
        earlier["mac"] = np.frombuffer(secrets.token_bytes(16 * len(rows)), "V16")
        np.save(path, earlier)
    (tmp_path / "ds" / MANIFEST).unlink()
    ar.add_manifest(url)
    ds = ar.open(url)
    assert same(ds[:], examples) and not ds.shards[0].signed
    assert ds.describe()["signed"] == "earlier"


def test_two_first_writers_at_once_get_one_whole_key(home, monkeypatch):
    """The first writer made the key file, then wrote it: a second writer starting then read it empty (a
    "must hold a key" error). The key is written beside its name and linked to it whole."""
    import threading

    from atlas_remote.trust import key_files
    from atlas_remote.trust.keys import secret_key

    first_waits, real = threading.Event(), secrets.token_hex
    calls = []

    def token_hex(n):
        calls.append(n)
        if len(calls) == 1:
            assert first_waits.wait(10)  # the first writer, stopped between making the file and writing it
        return real(n)

    monkeypatch.setattr(key_files.secrets, "token_hex", token_hex)
    made = []
    first = threading.Thread(target=lambda: made.append(secret_key(create=True)))
    first.start()
    while not calls:
        first.join(0.01)
    second = secret_key(create=True)
    first_waits.set()
    first.join()
    assert second is not None and made == [second], "one key, whole, for both"
