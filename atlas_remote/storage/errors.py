"""Every storage client's exceptions as our error types, in one place: one line, naming the URL and the object,
saying what to do, the client's exception kept as the cause."""

from __future__ import annotations

import difflib
import inspect
import re

import fsspec

from ..errors import (
    AccessDeniedError,
    AtlasError,
    DatasetChangedError,
    ObjectNotFoundError,
    RedirectRefusedError,
    StorageError,
    one_line,
)
from .base import ObjectChanged
from .retry import THROTTLE_SIGNS

CLIENT_TEXT_CHARS = 300  # the client's own words, cut short enough to leave room for ours
UNKNOWN_OPTION = re.compile(r"unexpected keyword argument '(\w+)'")
DENIED_SIGNS = (
    "InvalidAccessKeyId",
    "SignatureDoesNotMatch",
    "AccessDenied",
    "ExpiredToken",
    "403 Forbidden",
    "AuthenticationFailed",  # Azure
    "AuthorizationFailure",
)
# Clients whose errors are not the builtin ones, by class name (so that no SDK need be imported to tell them)
NOT_FOUND_CLASSES = {"ResourceNotFoundError"}  # azure.core
DENIED_CLASSES = {
    "ClientAuthenticationError",  # azure.core: a wrong key, an expired SAS
    "NoCredentialsError",  # botocore's: not OSErrors, and retrying them never helps
    "PartialCredentialsError",
    "ProfileNotFound",
}
DENIED_STATUS = {401, 403}  # a refusal, as clients keep its status (gcsfs: .code, aiohttp: .status)
TOKEN_REFUSED_CLASSES = {"RefreshError"}  # google-auth: the token endpoint refused the key (its words say why)
UNREACHABLE_SIGNS = (
    "EndpointConnectionError",
    "ClientConnectorError",
    "ConnectionRefusedError",
    "error sending request",
    "Cannot connect to host",
    "Connection refused",
)


def unknown_option(name: str, url: str) -> str:
    """An option the filesystem does not take, with the nearest ones it does (s3fs only finds out when it first
    connects, as `AioSession.__init__() got an unexpected keyword argument`)."""
    try:
        cls = fsspec.get_filesystem_class(url.split("://", 1)[0] if "://" in url else "file")
        known = [p for p in inspect.signature(cls.__init__).parameters if p not in ("self", "args", "kwargs")]
    except (ImportError, ValueError, TypeError):
        known = []
    near = difflib.get_close_matches(name, known, n=2)
    hint = f" (did you mean {' or '.join(repr(n) for n in near)}?)" if near else ""
    return f"unknown storage option {name!r}{hint}: storage_options are the fsspec filesystem's own arguments"


def translated(err: BaseException, url: str, path: str, action: str) -> AtlasError:
    """A client's exception as one of our error types, naming the URL, the object and what we were doing."""
    refusal = _refusal_within(err)
    if refusal is not None:
        return refusal.located(url=url, path=path or None)
    if isinstance(err, AtlasError):
        return err.located(url=url, path=path or None)
    if isinstance(err, ObjectChanged):
        changed = DatasetChangedError(
            f"{action}: rewritten since this reader opened it (the store answered that it is no longer the version "
            f"read then); open the dataset again (ds.reopen()) to read the new version",
            url=url,
            path=path or None,
        )
        changed.__cause__ = err
        return changed
    text = one_line(str(err))[:CLIENT_TEXT_CHARS]
    message = f"{action}: {type(err).__name__}: {text}"
    unknown = UNKNOWN_OPTION.search(text) if isinstance(err, TypeError) else None
    kind: type[AtlasError]
    if unknown:
        kind, message = StorageError, unknown_option(unknown.group(1), url)
    elif isinstance(err, FileNotFoundError) or type(err).__name__ in NOT_FOUND_CLASSES:
        kind, message = ObjectNotFoundError, f"{action}: not found"
    elif not THROTTLE_SIGNS.search(text) and (  # GCS says userRateLimitExceeded with a 403: not a refusal
        isinstance(err, PermissionError)
        or type(err).__name__ in DENIED_CLASSES
        or DENIED_STATUS & {getattr(err, "code", None), getattr(err, "status", None)}
        or any(s in text for s in DENIED_SIGNS)
    ):
        kind = AccessDeniedError
        cause = err.__cause__
        if cause is not None and type(cause).__name__ in TOKEN_REFUSED_CLASSES and cause.args:
            message += f" (asking for a token: {one_line(str(cause.args[0]))[:CLIENT_TEXT_CHARS]})"
        message += "; check the credentials (storage_options, the environment or the profile) and their rights"
    elif any(sign in f"{type(err).__name__} {text}" for sign in UNREACHABLE_SIGNS):
        kind = StorageError
        message = (
            f"{action}: cannot reach the storage server ({type(err).__name__}); check the endpoint URL and the network"
        )
    else:
        kind = StorageError
    error = kind(message, url=url, path=path or None)
    error.__cause__ = err
    return error


def _refusal_within(err: BaseException) -> RedirectRefusedError | None:
    """Our refusal of a redirect, raised inside a client that wrapped it in its own exceptions (aiobotocore's
    HTTPClientError, fsspec's FileNotFoundError after a HEAD and a GET both failed)."""
    seen: BaseException | None = err
    for _ in range(8):
        if seen is None or isinstance(seen, RedirectRefusedError):
            return seen
        seen = seen.__cause__ or seen.__context__
    return None
