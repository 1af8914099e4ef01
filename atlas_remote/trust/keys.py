"""The user's signing key: what tells a dataset the user's own writer wrote from one a stranger wrote.

A writer holding a key records a keyed digest (HMAC-SHA256, 16 bytes) of every stored block; a reader holding the
same key checks it and then knows the block is the user's own, so the checks on what a stranger's pickle could
build are not needed for it (docs/security.md, "Signed blocks"). Every other block (the original implementation's,
a stranger's, or one signed by another key) is decoded as a stranger's.

The key is 32 random bytes, from `ATLAS_REMOTE_KEY` (64 hex digits: set it on every machine of a cluster, or in a
secret) or else from `$XDG_CONFIG_HOME/atlas_remote/key` (`~/.config/...`), which the first writer creates,
readable by its owner only. A key file others can read is not used: anyone who can read it can sign.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import secrets
from functools import lru_cache
from pathlib import Path
from typing import Any, NamedTuple

from ..errors import AtlasError

log = logging.getLogger(__name__)

KEY_ENV = "ATLAS_REMOTE_KEY"
MAC_BYTES = 16  # a block's HMAC-SHA256, truncated: 2^-128 of forging one
_BLOCKS_LABEL = b"atlas_remote blocks/1"
_ID_LABEL = b"atlas_remote key id/1"


class SigningKey(NamedTuple):
    """What blocks are signed with (derived from the user's key, never the key itself) and the key's public id."""

    blocks: bytes
    id: bytes  # MAC_BYTES: recorded beside the signatures, so a reader tells "another key" from "altered"

    def sign(self, stored_block: bytes | memoryview) -> bytes:
        """The block's HMAC-SHA256 under `blocks`, cut to MAC_BYTES: the same digest as `hmac.digest`, from the
        key's inner and outer SHA-256 states computed once (hmac.digest sets up a context per call: a few
        microseconds, more than a small block's hashing)."""
        inner, outer = _pads(self.blocks)
        inner = inner.copy()
        inner.update(stored_block)
        outer = outer.copy()
        outer.update(inner.digest())
        return outer.digest()[:MAC_BYTES]

    def signs(self, stored_block: bytes | memoryview, mac: bytes) -> bool:
        return hmac.compare_digest(self.sign(stored_block), mac)


@lru_cache(maxsize=8)
def _pads(key: bytes) -> tuple[Any, Any]:
    """HMAC's inner and outer SHA-256 states after the key's padded block (RFC 2104), to copy per message."""
    padded = key.ljust(64, b"\0") if len(key) <= 64 else hashlib.sha256(key).digest().ljust(64, b"\0")
    return (
        hashlib.sha256(bytes(b ^ 0x36 for b in padded)),
        hashlib.sha256(bytes(b ^ 0x5C for b in padded)),
    )


def key_file() -> Path:
    config = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return Path(config) / "atlas_remote" / "key"


@lru_cache(maxsize=8)
def _derive(secret: bytes) -> SigningKey:
    return SigningKey(
        hmac.digest(secret, _BLOCKS_LABEL, hashlib.sha256), hmac.digest(secret, _ID_LABEL, hashlib.sha256)[:MAC_BYTES]
    )


def _parse(text: str, where: str) -> bytes:
    try:
        secret = bytes.fromhex(text.strip())
    except ValueError:
        secret = b""
    if len(secret) < 16:
        raise AtlasError(f"{where} must hold a key of at least 32 hex digits (64 as written by atlas_remote)")
    return secret


_warned: set[str] = set()


def _warn_once(message: str) -> None:
    if message not in _warned:
        _warned.add(message)
        log.warning(message)


def _read_file(path: Path) -> bytes | None:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except FileNotFoundError:
        return None
    except OSError as err:
        _warn_once(
            f"signing key {path} not used ({err.strerror}): datasets are written unsigned and read as a stranger's"
        )
        return None
    with os.fdopen(fd, "r") as file:
        if os.fstat(fd).st_mode & 0o077:
            _warn_once(
                f"signing key {path} not used: others can read it (chmod 600 {path}); datasets are written unsigned "
                f"and read as a stranger's"
            )
            return None
        return _parse(file.read(256), str(path))


def reader_key() -> SigningKey | None:
    """The user's key, if there is one (never created by reading)."""
    text = os.environ.get(KEY_ENV)
    if text:
        return _derive(_parse(text, KEY_ENV))
    secret = _read_file(key_file())
    return _derive(secret) if secret is not None else None


def writer_key() -> SigningKey | None:
    """The user's key, created (readable by its owner only) if there is none yet; None where it cannot be."""
    found = reader_key()
    if found is not None or os.environ.get(KEY_ENV):
        return found
    path = key_file()
    try:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w") as file:
            file.write(secrets.token_hex(32) + "\n")
        log.info("created a signing key at %s: datasets you write are signed with it (docs/security.md)", path)
    except FileExistsError:
        pass  # another process made it meanwhile
    except OSError as err:
        _warn_once(
            f"no signing key ({path}: {err.strerror}; or set {KEY_ENV}): datasets are written unsigned and read as "
            f"a stranger's"
        )
        return None
    return reader_key()
