"""How a client's failure is classified: from the status and error code the client keeps and from its exception
types, never from the words of its message (they hold ports, durations and request ids)."""

from __future__ import annotations

import errno

import aiohttp
import pytest
import yarl
from botocore.exceptions import ClientError, EndpointConnectionError
from gcsfs.retry import HttpError
from multidict import CIMultiDict, CIMultiDictProxy
from s3fs.errors import translate_boto_error

import atlas_remote as ar
from atlas_remote import storage
from atlas_remote.errors import shortened
from atlas_remote.format.codec import DEFAULT_MAX_BLOCK_BYTES
from atlas_remote.storage.base import ServerAnswer, Unreachable
from atlas_remote.storage.errors import precondition_failed, throttled_failure, translated

pytestmark = pytest.mark.unit


def s3_error(code: str, status: int, message: str = "") -> OSError:
    """What s3fs raises for an S3 error answer: its OSError, botocore's ClientError kept as the cause."""
    answer = {"Error": {"Code": code, "Message": message}, "ResponseMetadata": {"HTTPStatusCode": status}}
    return translate_boto_error(ClientError(answer, "GetObject"))


def aiohttp_error(status: int, message: str = "") -> aiohttp.ClientResponseError:
    """What aiohttp raises for an HTTP error answer (fsspec's HTTP filesystem lets it through)."""
    url = yarl.URL("http://127.0.0.1:45039/ds/0/data.bin")
    request = aiohttp.RequestInfo(url, "GET", CIMultiDictProxy(CIMultiDict()), url)
    return aiohttp.ClientResponseError(request, (), status=status, message=message)


def as_storage_error(err: BaseException) -> ar.AtlasError:
    return translated(err, "s3://b/ds", "0/data.bin", "reading")


@pytest.mark.parametrize(
    "err, slow_down",
    [
        (s3_error("SlowDown", 503, "Please reduce your request rate."), True),
        (s3_error("InternalError", 500), False),
        (aiohttp_error(429, "Too Many Requests"), True),
        (aiohttp_error(503, "Service Unavailable"), True),
        (aiohttp_error(502), False),
        (HttpError({"code": 429, "message": "rate"}), True),
        (ServerAnswer(403, "userRateLimitExceeded"), True),  # GCS: a 403 that is a rate limit
        (ServerAnswer(503, "ServerBusy"), True),  # Azure (and obstore's answers, read from its error)
        (ServerAnswer(500, "InternalError"), False),
        # words alone never decide: a port, a request id or a message that holds "503"
        (OSError("Cannot connect to host 127.0.0.1:503 ssl:default [Connect call failed ('127.0.0.1', 503)]"), False),
        (OSError("RequestId 9Gjjt1m+503/ILVxh: connection reset"), False),
        (OSError("503 SlowDown, 429 Too Many Requests"), False),
        (Unreachable("error sending request to 127.0.0.1:503"), False),
    ],
)
def test_only_a_store_asking_to_slow_down_is_throttled(err, slow_down):
    assert throttled_failure(err) is slow_down
    assert storage.retry.throttled(as_storage_error(err)) is slow_down


def test_a_403_that_says_rate_limit_is_throttled_not_refused():
    """GCS answers userRateLimitExceeded with a 403: slow down, not a refusal."""
    error = as_storage_error(ServerAnswer(403, "userRateLimitExceeded"))
    assert not isinstance(error, ar.AccessDeniedError) and storage.retry.throttled(error)


@pytest.mark.parametrize(
    "err",
    [
        s3_error("AccessDenied", 403),
        s3_error("InvalidAccessKeyId", 403),
        aiohttp_error(401),
        HttpError({"code": 403, "message": "forbidden"}),
        ServerAnswer(403, "forbidden"),
        PermissionError("obstore: lacked the necessary privileges"),
    ],
)
def test_refusals_are_access_denied_and_never_retried(err):
    error = as_storage_error(err)
    assert isinstance(error, ar.AccessDeniedError) and "check the credentials" in error.problem
    assert not storage.retry.transient(error)


def test_an_error_whose_words_say_forbidden_is_not_a_refusal():
    error = as_storage_error(OSError("the key AccessDenied-403 Forbidden was not found in 127.0.0.1:403"))
    assert not isinstance(error, ar.AccessDeniedError) and storage.retry.transient(error)


@pytest.mark.parametrize(
    "err, failed",
    [
        (s3_error("PreconditionFailed", 412), True),
        (aiohttp_error(412), True),
        (ServerAnswer(412), True),
        (OSError("Cannot connect to host 127.0.0.1:412 ssl:default [Connect call failed ('127.0.0.1', 412)]"), False),
        (OSError("412 Precondition Failed"), False),  # words only: no client kept a status
        (aiohttp_error(404), False),
    ],
)
def test_a_failed_precondition_is_the_store_answering_412(err, failed):
    assert precondition_failed(err) is failed


@pytest.mark.parametrize(
    "err",
    [
        EndpointConnectionError(endpoint_url="http://127.0.0.1:1"),
        ConnectionRefusedError(errno.ECONNREFUSED, "Connect call failed ('127.0.0.1', 1)"),
        Unreachable("error sending request"),
    ],
)
def test_an_unreachable_server_is_said_so(err):
    error = as_storage_error(err)
    assert "cannot reach the storage server" in error.problem and storage.retry.transient(error)


def test_missing_objects_are_not_found_and_never_retried():
    for err in (s3_error("NoSuchKey", 404), FileNotFoundError("0/data.bin")):
        error = as_storage_error(err)
        assert isinstance(error, ar.ObjectNotFoundError) and not storage.retry.transient(error)


def test_storage_settings_are_storage_own_and_made_from_the_reader():
    settings = ar.ReaderOptions(retries=1, timeout=3.0, max_concurrency=5, max_gap_bytes=7).storage
    assert settings == storage.StoreSettings(max_concurrency=5, retries=1, timeout=3.0, max_gap_bytes=7)
    assert storage.StoreSettings().max_block_bytes == DEFAULT_MAX_BLOCK_BYTES  # one default, stated twice


def test_a_message_too_long_is_cut_between_words():
    text = "the request signature we calculated does not match the signature you provided " * 3
    cut = shortened(text, 100)
    assert len(cut) <= 100 and cut.endswith("…") and text.startswith(cut[:-1]) and text[len(cut) - 1] == " "
    assert shortened("short", 100) == "short"
