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
    ClientFailedError,
    DatasetChangedError,
    ObjectNotFoundError,
    RedirectRefusedError,
    StorageError,
    one_line,
    shortened,
)
from .base import ObjectChanged, ServerAnswer

CLIENT_TEXT_CHARS = 300  # the client's own words, cut short enough to leave room for ours
UNKNOWN_OPTION = re.compile(r"unexpected keyword argument '(\w+)'")  # Python's own TypeError, not a server's
# A store's own error codes (S3's Code, GCS's reason, Azure's x-ms-error-code) that ask us to slow down
THROTTLE_CODES = {
    "SlowDown",
    "Throttling",
    "ThrottlingException",
    "TooManyRequests",
    "RequestLimitExceeded",
    "ServiceUnavailable",
    "ServerBusy",  # Azure
    "rateLimitExceeded",  # GCS, with a 403 or a 429
    "userRateLimitExceeded",
}
THROTTLE_STATUS = {429, 503}
DENIED_STATUS = {401, 403}
DENIED_CODES = {"InvalidAccessKeyId", "SignatureDoesNotMatch", "AccessDenied", "ExpiredToken", "AuthenticationFailed"}
PRECONDITION_CODES = {"PreconditionFailed", "ConditionNotMet"}
# Clients' exception classes, by name in their class hierarchy (so that no SDK need be imported to tell them)
NOT_FOUND_CLASSES = {"ResourceNotFoundError", "NoSuchKey", "NoSuchBucket"}  # azure.core, botocore
DENIED_CLASSES = {
    "ClientAuthenticationError",  # azure.core: a wrong key, an expired SAS
    "NoCredentialsError",  # botocore's: not OSErrors, and retrying them never helps
    "PartialCredentialsError",
    "ProfileNotFound",
    "RefreshError",  # google-auth: the token endpoint refused the key
}
TOKEN_REFUSED_CLASSES = {"RefreshError"}  # google-auth: the token endpoint refused the key (its words say why)
UNREACHABLE_CLASSES = {
    "EndpointConnectionError",  # botocore
    "ConnectTimeoutError",
    "ClientConnectorError",  # aiohttp
    "ServiceRequestError",  # azure.core: the request never reached the service
    "ConnectionRefusedError",
    "Unreachable",  # ours (storage.base), for obstore
}
CHAIN_DEPTH = 8


def _chain(err: BaseException) -> list[BaseException]:
    """The exception and what it was raised from (clients wrap each other's: s3fs keeps botocore's as cause)."""
    seen: list[BaseException] = []
    at: BaseException | None = err
    while at is not None and len(seen) < CHAIN_DEPTH and at not in seen:
        seen.append(at)
        at = at.__cause__ or at.__context__
    return seen


def _classes(err: BaseException) -> set[str]:
    return {c.__name__ for c in type(err).__mro__}


def answer_of(err: BaseException) -> tuple[int | None, str]:
    """The HTTP status and the store's own error code of a client's failure, as the client keeps them: ours
    (ServerAnswer), botocore's ClientError.response, aiohttp's .status, gcsfs's HttpError.code, azure.core's
    .status_code and .error_code. (None, "") when no answer came (a connection that failed, a timeout)."""
    for e in _chain(err):
        status, code = None, ""
        response = getattr(e, "response", None)
        if isinstance(response, dict):  # botocore
            status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            code = str(response.get("Error", {}).get("Code") or "")
        if isinstance(e, ServerAnswer):
            status, code = e.status, e.code
        for name in ("status", "status_code", "code"):  # aiohttp, azure.core, gcsfs: the first one held
            value = getattr(e, name, None) if status is None else None
            if isinstance(value, int) and not isinstance(value, bool) and 100 <= value < 600:
                status = value
        code = code or str(getattr(e, "error_code", None) or "")
        if status is not None or code:
            return status, code
    return None, ""


def throttled_failure(err: BaseException) -> bool:
    """The store asked us to slow down (S3 503 SlowDown, 429, GCS rateLimitExceeded even with a 403, Azure
    ServerBusy): from its status and code, never from the words of a message (they hold ports and request ids)."""
    status, code = answer_of(err)
    return code in THROTTLE_CODES or status in THROTTLE_STATUS


def precondition_failed(err: BaseException) -> bool:
    """Whether a client's failure is a store's 412 answer to a conditional request."""
    status, code = answer_of(err)
    return status == 412 or code in PRECONDITION_CODES


def _denied(err: BaseException) -> bool:
    if throttled_failure(err):  # GCS says userRateLimitExceeded with a 403: not a refusal
        return False
    status, code = answer_of(err)
    chain = _chain(err)
    return (
        isinstance(err, PermissionError)
        or status in DENIED_STATUS
        or code in DENIED_CODES
        or any(_classes(e) & DENIED_CLASSES for e in chain)
    )


def _unreachable(err: BaseException) -> bool:
    return answer_of(err)[0] is None and any(_classes(e) & UNREACHABLE_CLASSES for e in _chain(err))


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


INTERRUPTS = (KeyboardInterrupt, SystemExit, GeneratorExit)  # a BaseException a client may raise that is not ours


def client_failure(err: BaseException) -> bool:
    """A BaseException that is a client's failure, not an interrupt (obstore's PanicException): translated, never
    let through, so `except Exception` and our CLI see an AtlasError."""
    return not isinstance(err, (Exception, *INTERRUPTS))


def translated(err: BaseException, url: str, path: str, action: str) -> AtlasError:
    """A client's exception as one of our error types, naming the URL, the object and what we were doing."""
    if client_failure(err):
        failed = ClientFailedError(
            f"{action}: the storage client failed inside itself ({type(err).__name__}: "
            f"{shortened(one_line(str(err)), CLIENT_TEXT_CHARS)}); check the storage_options (an endpoint_url is "
            f"'http://host:port' or 'https://host')",
            url=url,
            path=path or None,
        )
        failed.__cause__ = err
        return failed
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
    text = shortened(one_line(str(err)), CLIENT_TEXT_CHARS)
    message = f"{action}: {type(err).__name__}: {text}"
    unknown = UNKNOWN_OPTION.search(text) if isinstance(err, TypeError) else None
    kind: type[AtlasError]
    if unknown:
        kind, message = StorageError, unknown_option(unknown.group(1), url)
    elif isinstance(err, FileNotFoundError) or _classes(err) & NOT_FOUND_CLASSES:
        kind, message = ObjectNotFoundError, f"{action}: not found"
    elif _denied(err):
        kind = AccessDeniedError
        cause = err.__cause__
        if cause is not None and type(cause).__name__ in TOKEN_REFUSED_CLASSES and cause.args:
            message += f" (asking for a token: {shortened(one_line(str(cause.args[0])), CLIENT_TEXT_CHARS)})"
        message += "; check the credentials (storage_options, the environment or the profile) and their rights"
    elif _unreachable(err):
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
