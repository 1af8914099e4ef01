"""Holding a server to what it was asked: a body is read up to the bytes asked for (a range, or the bound of a
whole object of its kind) and no further, and a redirect is followed only within the origin it starts from.

A server's answers are data from whoever runs it (docs/security.md): `meta.json` streamed without end took
2.86 GB in 5 s, a ranged read answered `200` with a GiB was read whole before it was refused, and a `302` to
another origin was followed. Bodies read by Store's backends go through `read_within`; redirects of the
aiohttp-based clients (fsspec's HTTP filesystem, s3fs through aiobotocore) through `REDIRECTS_CHECKED`, a trace
hook aiohttp calls before it follows one.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from typing import Any

import aiohttp
from yarl import URL

from ..errors import FormatError, RangeNotSupportedError, RedirectRefusedError
from .base import Oversized
from .ranges import ByteRange

MiB = 1024 * 1024
# The most a whole object of each kind may hold; other kinds (a shared dictionary, an importer's source) are
# bounded by max_block_bytes. A root meta.json lists one size per shard, a journal five names per shard: 64 MiB
# is millions of shards. An index holds 8 bytes a block, a checksum file 4: 256 MiB is 32 million blocks.
WHOLE_OBJECT_BYTES = {"meta": 64 * MiB, "manifest": 256 * MiB, "index": 256 * MiB, "checksums": 256 * MiB}

# Where the requests a redirect adds are counted: set by the backend around each request it makes.
REDIRECTS: ContextVar[Callable[[int], None] | None] = ContextVar("atlas_redirects", default=None)


async def read_within(
    read: Callable[[int], Awaitable[bytes]], declared: int | None, limit: int | None, whole_answer: bool = False
) -> bytes:
    """A body, read with read(n) (at most n bytes a call, all of it for -1, b"" at its end), and never more than
    limit + 1 bytes of it: the caller sees a body past its limit without holding the rest. Oversized before
    anything is read if the server declares more than limit, or answers a ranged request (whole_answer: status
    200) with an object of another size than the range."""
    if limit is None:
        return await read(-1)
    if declared is not None:
        if declared > limit or (whole_answer and declared != limit):
            raise Oversized(declared)
        return await read(-1)  # HTTP/1.1 framing ends the body at its Content-Length
    chunks: list[bytes] = []
    got = 0
    while got <= limit:
        chunk = await read(limit + 1 - got)
        if not chunk:
            break
        chunks.append(chunk)
        got += len(chunk)
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


async def _on_redirect(
    session: aiohttp.ClientSession, context: Any, params: aiohttp.TraceRequestRedirectParams
) -> None:
    """Raised inside aiohttp, before it follows the redirect: another origin is refused; one within the origin
    is counted as a request."""
    here = params.url
    location = params.response.headers.get("Location") or params.response.headers.get("URI")
    if location:
        target = URL(location)
        if not target.is_absolute():
            target = here.join(target)
        if (target.scheme, target.host, target.port) != (here.scheme, here.host, here.port):
            raise RedirectRefusedError(
                f"{params.method} was redirected to another origin ({target.scheme}://{target.host}:{target.port}): "
                f"refused, a dataset is read from its own origin only; if you trust the server it redirects to, "
                f"open the dataset there",
                url=str(here.with_query(None)),
            )
    count = REDIRECTS.get()
    if count is not None:
        count(1)


REDIRECTS_CHECKED = aiohttp.TraceConfig()
REDIRECTS_CHECKED.on_request_redirect.append(_on_redirect)
REDIRECTS_CHECKED.freeze()  # sessions that take it after they are made (s3_session_class) never freeze it


@functools.cache
def s3_session_class() -> type:
    """aiobotocore's HTTP session with REDIRECTS_CHECKED on its aiohttp sessions (s3fs's `http_session_cls`):
    aiobotocore lets aiohttp follow redirects, to any origin. One class, so fsspec's instance cache sees the
    same options each time."""
    from aiobotocore.httpsession import AIOHTTPSession

    class SameOriginSession(AIOHTTPSession):
        async def _get_session(self, proxy_url: Any) -> aiohttp.ClientSession:
            session = await super()._get_session(proxy_url)
            if REDIRECTS_CHECKED not in session.trace_configs:
                session.trace_configs.append(REDIRECTS_CHECKED)
            return session

    return SameOriginSession


def too_large(url: str, rel: str, kind: str, limit: int) -> FormatError:
    """A whole object longer than its kind's bound (nothing past the bound read)."""
    return FormatError(
        f"longer than {limit:,} bytes, the most a {kind} file may hold: not a file of an Atlas dataset (a server "
        f"that sends without end, or a damaged file); nothing past the bound was read. Check what this URL serves",
        url=url,
        path=rel,
    )


def range_refused(url: str, span: ByteRange, announced: int | None, answer: str) -> RangeNotSupportedError:
    """A server that answered a ranged read with more than the range."""
    if announced is not None:
        answer = f"it announced {announced:,} bytes (none read)"
    return RangeNotSupportedError(
        f"this server ignores Range requests: asked for bytes [{span.start}, {span.end}) ({span.size} bytes), "
        f"{answer}. Serve the dataset from a server that honours Range (any object store, nginx), or copy it "
        f"to a local path",
        url=url,
        path=span.path,
        byte_range=(span.start, span.end),
    )
