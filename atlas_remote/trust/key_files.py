"""Key files: read only when they are what they claim to be, and never waited on.

A key file decides whose datasets a reader takes for its user's own, so it is used only if it is a regular file
that the user owns (a mode-600 file that another user put in a config folder they can write is their key, not
ours), read without following a link, opened without blocking (a FIFO named `key` once blocked every
`open()` of a dataset), and bounded in size. A secret (the user's key, a private key) must not be readable by
group or others; a list of trusted public keys must not be writable by them (whoever can add a line to it
chooses whom the reader trusts). A file that fails is not used: one warning says why and what to do.
"""

from __future__ import annotations

import logging
import os
import secrets
import stat
import tempfile
from pathlib import Path

log = logging.getLogger(__name__)

MOST_BYTES = 64 * 1024  # a trusted list of a thousand keys, with names
_warned: set[str] = set()


def config_path(name: str) -> Path:
    config = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return Path(config) / "atlas_remote" / name


def warn_once(message: str) -> None:
    if message not in _warned:
        _warned.add(message)
        log.warning(message)


def _problem(info: os.stat_result, path: Path, secret: bool) -> str | None:
    """Why a key file with these properties must not be used, or None."""
    if not stat.S_ISREG(info.st_mode):
        return "it is not a regular file"
    if info.st_uid != os.geteuid():
        return f"it belongs to uid {info.st_uid}, not to you (uid {os.geteuid()}): its owner chose what it holds"
    if secret and info.st_mode & 0o077:
        return f"others can read it (chmod 600 {path})"
    if not secret and info.st_mode & 0o022:
        return f"others can change it (chmod 644 {path})"
    return None


def read_key_file(path: Path, secret: bool, unused: str) -> str | None:
    """The text of the key file at path, or None: missing, or not used (one warning naming the file, why, and
    `unused`: what follows for the user)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as err:
        warn_once(f"{path} not used ({err.strerror}): {unused}")
        return None
    with os.fdopen(fd, "rb") as file:
        problem = _problem(os.fstat(fd), path, secret)
        if problem is None:
            raw = file.read(MOST_BYTES + 1)
            if len(raw) > MOST_BYTES:
                problem = f"it holds more than {MOST_BYTES:,} bytes"
    if problem is not None:
        warn_once(f"{path} not used: {problem}; {unused}")
        return None
    try:
        return raw.decode("ascii")
    except UnicodeDecodeError:
        warn_once(f"{path} not used: it is not text; {unused}")
        return None


def create_secret_file(path: Path, unused: str) -> bool:
    """A new file at path holding 32 random bytes as hex, readable by its owner only, in a folder made for it
    (mode 700); False (and one warning) where it cannot be, True if it exists now (made here or by another
    process meanwhile). Written beside it, then linked to its name: a process that finds the name finds the
    whole key (two writers starting at once each made it, and one read the other's empty file)."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd, written = tempfile.mkstemp(prefix=".key-", dir=path.parent)  # mode 600
        try:
            with os.fdopen(fd, "w") as file:
                file.write(secrets.token_hex(32) + "\n")
            os.link(written, path)
        finally:
            os.unlink(written)
    except FileExistsError:
        pass
    except OSError as err:
        warn_once(f"could not create {path} ({err.strerror}): {unused}")
        return False
    return True
