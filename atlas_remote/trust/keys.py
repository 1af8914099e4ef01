"""Whose datasets a reader takes for its user's own, and what a writer signs them with.

A signed dataset is read on the fast path: its blocks are checked against digests its signer vouched for, and
not walked before loading (docs/security.md, "Signed datasets"). Two kinds of key sign:

- the user's secret key: 32 random bytes, from `ATLAS_REMOTE_KEY` (64 hex digits) or the file `key` in
  `$XDG_CONFIG_HOME/atlas_remote/` (`~/.config/...`), which the first writer creates. Seals are HMAC-SHA256
  under a key derived from it. Whoever can check such a seal can also make one: one user, or machines that may
  all write.
- a private key (Ed25519), from `ATLAS_REMOTE_PRIVATE_KEY` (its 32-byte seed as 64 hex digits) or the file
  `private_key` (hex, or PEM as `openssl genpkey -algorithm ed25519` writes it), made by `atlas-remote keygen`.
  Readers trust its public key, listed in `ATLAS_REMOTE_TRUSTED_KEYS` or the file `trusted_keys`: they check
  its seals and cannot make one, so a cluster's training nodes read the writer's datasets on the fast path
  without the power to sign.

A reader trusts its secret key, its private key's public key and the public keys it lists (`Trust`); a writer
signs with its private key if it has one, else its secret key. Key files are read as key_files.py says.
The cryptography package (Ed25519) is imported when a private or public key is first used.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import re
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Protocol

from ..errors import AtlasError
from .key_files import config_path, create_secret_file, read_key_file

KEY_ENV = "ATLAS_REMOTE_KEY"
PRIVATE_KEY_ENV = "ATLAS_REMOTE_PRIVATE_KEY"
TRUSTED_KEYS_ENV = "ATLAS_REMOTE_TRUSTED_KEYS"
SEAL_BYTES = 64  # an Ed25519 signature; an HMAC-SHA256 (32 bytes) is padded with zeros
_SEALS_LABEL = b"atlas_remote seals/2"  # a key of its own: per-block MACs of earlier writers are never seals
_ID_LABEL = b"atlas_remote key id/1"
PUBLIC_KEY = re.compile(r"(?:ed25519:)?([0-9a-fA-F]{64})")

NO_SECRET = "datasets are not signed with your secret key, and those it signed are read as a stranger's"
NO_PRIVATE = "datasets are not signed with your private key"
NO_TRUSTED = "datasets signed by the keys it lists are read as a stranger's"


class Verifier(Protocol):
    """A key whose seals a reader can check."""

    @property
    def id(self) -> str: ...

    def verifies(self, statement: bytes, seal: bytes) -> bool: ...


class Signer(Verifier, Protocol):
    """A key that can seal a statement (format/seal.py says what statements are)."""

    def sign(self, statement: bytes) -> bytes: ...


@dataclass(frozen=True)
class SecretKey:
    """The user's secret key, as seals are made with it: a key derived from it, never the key itself."""

    seals: bytes
    id: str  # "secret:" and 16 bytes of another derived key, in hex: recorded beside the seals

    def sign(self, statement: bytes) -> bytes:
        return hmac.digest(self.seals, statement, hashlib.sha256).ljust(SEAL_BYTES, b"\0")

    def verifies(self, statement: bytes, seal: bytes) -> bool:
        return hmac.compare_digest(self.sign(statement), seal)


class PublicKey:
    """An Ed25519 public key: checks seals, never makes one."""

    def __init__(self, raw: bytes) -> None:
        self.raw = raw
        self.id = "ed25519:" + raw.hex()
        self._key: Any = None

    def verifies(self, statement: bytes, seal: bytes) -> bool:
        from cryptography.exceptions import InvalidSignature
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

        if self._key is None:
            self._key = Ed25519PublicKey.from_public_bytes(self.raw)
        try:
            self._key.verify(seal, statement)
        except InvalidSignature:
            return False
        return True


class PrivateKey(PublicKey):
    """An Ed25519 private key: seals, and checks as its public key does."""

    def __init__(self, key: Any) -> None:
        super().__init__(key.public_key().public_bytes_raw())
        self._private = key

    def sign(self, statement: bytes) -> bytes:
        return bytes(self._private.sign(statement))


@dataclass(frozen=True)
class Trust:
    """The keys a reader takes seals of, by id: the user's own, and public keys it lists (with their names)."""

    verifiers: dict[str, Verifier] = field(default_factory=dict)
    own: frozenset[str] = frozenset()
    names: dict[str, str] = field(default_factory=dict)

    def get(self, key_id: str | None) -> Verifier | None:
        return self.verifiers.get(key_id) if key_id is not None else None

    def name(self, key_id: str) -> str:
        """How `info` and errors name a key."""
        if key_id in self.own:
            return "your key"
        if key_id in self.verifiers:
            return f"a key you trust ({self.names[key_id]})" if self.names.get(key_id) else "a key you trust"
        return "a key you do not trust"

    @classmethod
    def of(cls, *keys: Verifier) -> Trust:
        """The user's own keys only."""
        return cls({key.id: key for key in keys}, frozenset(key.id for key in keys))


# -- the keys themselves ------------------------------------------------------------------------------------------


@lru_cache(maxsize=8)
def _secret(secret: bytes) -> SecretKey:
    key_id = hmac.digest(secret, _ID_LABEL, hashlib.sha256)[:16]
    return SecretKey(hmac.digest(secret, _SEALS_LABEL, hashlib.sha256), "secret:" + key_id.hex())


def _hex_secret(text: str, where: str) -> bytes:
    try:
        secret = bytes.fromhex(text.strip())
    except ValueError:
        secret = b""
    if len(secret) < 16:
        raise AtlasError(f"{where} must hold a key of at least 32 hex digits (64 as written by atlas_remote)")
    return secret


def secret_key(create: bool = False) -> SecretKey | None:
    """The user's secret key, if there is one; `create`: made (readable by its owner only) if there is none yet
    (a writer's first write), None where it cannot be."""
    text = os.environ.get(KEY_ENV)
    if text:
        return _secret(_hex_secret(text, KEY_ENV))
    path = config_path("key")
    found = read_key_file(path, True, NO_SECRET)
    if found is None and create and not path.exists() and create_secret_file(path, NO_SECRET):
        found = read_key_file(path, True, NO_SECRET)
    return _secret(_hex_secret(found, str(path))) if found is not None else None


@lru_cache(maxsize=8)
def _private(text: str, where: str) -> PrivateKey:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
    from cryptography.hazmat.primitives.serialization import load_pem_private_key

    if "-----BEGIN" in text:
        try:
            key = load_pem_private_key(text.encode(), None)
        except (ValueError, TypeError) as err:
            raise AtlasError(f"{where} is not a private key PEM file can hold unencrypted ({err})") from None
        if not isinstance(key, Ed25519PrivateKey):
            raise AtlasError(f"{where} holds a {type(key).__name__}, where an Ed25519 private key is expected")
        return PrivateKey(key)
    try:
        seed = bytes.fromhex(text.strip())
    except ValueError:
        seed = b""
    if len(seed) != 32:
        raise AtlasError(f"{where} must hold an Ed25519 private key: 64 hex digits, or PEM")
    return PrivateKey(Ed25519PrivateKey.from_private_bytes(seed))


def private_key() -> PrivateKey | None:
    """The user's private key, if there is one (`atlas-remote keygen` makes one)."""
    text = os.environ.get(PRIVATE_KEY_ENV)
    if text:
        return _private(text, PRIVATE_KEY_ENV)
    path = config_path("private_key")
    found = read_key_file(path, True, NO_PRIVATE)
    return _private(found, str(path)) if found is not None else None


def create_private_key() -> tuple[PrivateKey, bool]:
    """The user's private key, made now (file `private_key`, readable by its owner only) if there is none; and
    whether it was made now."""
    found = private_key()
    if found is not None:
        return found, False
    path = config_path("private_key")
    if os.environ.get(PRIVATE_KEY_ENV) or path.exists() or not create_secret_file(path, NO_PRIVATE):
        raise AtlasError(f"no private key could be made at {path}: see the warning above")
    made = private_key()
    if made is None:
        raise AtlasError(f"{path} was made but cannot be read back: see the warning above")
    return made, True


def trusted_keys() -> dict[str, tuple[PublicKey, str]]:
    """The public keys the user trusts (ATLAS_REMOTE_TRUSTED_KEYS, then the file `trusted_keys`: a key a line, as
    `ed25519:<64 hex digits>` or the digits alone, optionally followed by a name; `#` starts a comment), by id,
    each with the name it was given."""
    found: dict[str, tuple[PublicKey, str]] = {}
    lines = [(word, "") for word in re.split(r"[\s,]+", os.environ.get(TRUSTED_KEYS_ENV, "")) if word]
    path = config_path("trusted_keys")
    for line in (read_key_file(path, False, NO_TRUSTED) or "").splitlines():
        words = line.split("#", 1)[0].split(None, 1)
        if words:
            lines.append((words[0], words[1].strip() if len(words) > 1 else ""))
    for word, name in lines:
        match = PUBLIC_KEY.fullmatch(word)
        if match is None:
            raise AtlasError(
                f"{TRUSTED_KEYS_ENV} or {path} lists {word[:80]!r}, which is not an Ed25519 public key "
                f"(ed25519: and 64 hex digits, as `atlas-remote keygen` prints it)"
            )
        key = PublicKey(bytes.fromhex(match.group(1)))
        found[key.id] = (key, name)
    return found


def reader_trust() -> Trust:
    """Every key whose seals this reader takes: its secret key, its private key's public key, the keys it lists.
    None is created by reading."""
    own = [key for key in (secret_key(), private_key()) if key is not None]
    listed = trusted_keys()
    verifiers: dict[str, Verifier] = {key_id: key for key_id, (key, _) in listed.items()}
    verifiers.update((key.id, key) for key in own)
    return Trust(verifiers, frozenset(key.id for key in own), {key_id: name for key_id, (_, name) in listed.items()})


def writer_signer(kind: str | None = None) -> Signer | None:
    """What a writer seals with: its private key if it has one, else its secret key (made at the first write);
    `kind` "private" or "secret" asks for one of them. None where there is no key to be had (a warning said
    why)."""
    if kind not in (None, "private", "secret"):
        raise ValueError(f"sign with 'private' or 'secret', not {kind!r}")
    if kind != "secret":
        found = private_key()
        if found is not None or kind == "private":
            if found is None:
                raise AtlasError(
                    f"no private key ({PRIVATE_KEY_ENV}, or {config_path('private_key')}): `atlas-remote keygen` "
                    f"makes one"
                )
            return found
    return secret_key(create=True)
