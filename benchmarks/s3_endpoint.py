"""An S3 endpoint for benchmarks: object GET/HEAD answered in constant time, everything else by moto, and a fixed
latency added to every request.

moto reads and copies a whole object for every ranged GET and spends milliseconds of CPU per request, which
makes any block-level reader look slow. Real S3 answers a ranged GET in a time that does not depend on the
object's size. So this process runs moto in-process (ThreadedMotoServer, on a private port) behind an aiohttp
front that answers GET and HEAD of an object itself, from moto's in-memory backend: a seek and a read of the
range, with the headers S3 sends (ETag, Last-Modified, Content-Length, Content-Range, Accept-Ranges; 206 for a
range, 416 for one past the end, 404 NoSuchKey). Listing, PUT, multipart, DELETE, conditional writes and bucket
calls are forwarded to moto unchanged.

How it differs from real S3: no authentication or signature checks, no versioning or conditional GET headers
(If-Match, If-None-Match) on the fast path, one machine's loopback instead of a network (the latency is a
sleep), and a single process serving every client.

    python benchmarks/s3_endpoint.py [--latency SECONDS]    # prints the port, then serves until killed

GET /__stats__ returns the requests answered and the body bytes sent, by method.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import socket
import sys
from collections import Counter
from pathlib import Path
from urllib.parse import unquote

import aiohttp
from aiohttp import web

ACCOUNT = "123456789012"  # moto's default account
HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "content-encoding", "content-length", "host"}
RANGE = re.compile(r"bytes=(\d*)-(\d*)$")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def find_key(bucket: str, key: str):
    """moto's object, or None (reads moto's in-process backend; no copy of the value)."""
    from moto.s3.models import s3_backends

    backend = s3_backends[ACCOUNT]["aws"]
    found = backend.buckets.get(bucket)
    return found.keys.get(key) if found is not None else None


def read_range(obj, start: int, end: int) -> bytes:
    with obj.lock:
        obj._value_buffer.seek(start)
        return obj._value_buffer.read(end - start)


def byte_window(wanted: str | None, size: int, headers: dict) -> tuple[int, int, int] | web.Response | None:
    """(status, start, end) for a GET's Range header as S3 answers it (Content-Range added to headers), a 416
    response for a range past the end, or None for a header this endpoint does not parse."""
    if not wanted:
        return 200, 0, size
    match = RANGE.match(wanted.strip())
    if match is None:
        return None
    first, last = match.groups()
    if first == "":
        start, end = max(size - int(last), 0), size
    else:
        start, end = int(first), min(int(last) + 1, size) if last else size
    if start >= size:
        headers["Content-Range"] = f"bytes */{size}"
        return web.Response(status=416, headers=headers)
    headers["Content-Range"] = f"bytes {start}-{end - 1}/{size}"
    return 206, start, end


def make_app(upstream: str, latency: float) -> web.Application:
    stats = {"requests": Counter(), "bytes": Counter()}
    session: dict = {}

    async def handle(request: web.Request) -> web.StreamResponse:
        if request.path == "/__stats__":
            return web.json_response(stats)
        stats["requests"][request.method] += 1
        if latency:
            await asyncio.sleep(latency)
        parts = request.path.lstrip("/").split("/", 1)
        if request.method in ("GET", "HEAD") and len(parts) == 2 and parts[1] and not request.query_string:
            response = answer_object(request, unquote(parts[0]), unquote(parts[1]))
            if response is not None:
                stats["bytes"][request.method] += len(response.body or b"")
                return response
        return await forward(request)

    def answer_object(request: web.Request, bucket: str, key: str) -> web.Response | None:
        obj = find_key(bucket, key)
        if obj is None:
            return None  # moto answers the errors (NoSuchKey, NoSuchBucket) as S3 words them
        size = obj.size
        headers = {
            "ETag": obj.etag,
            "Last-Modified": obj.last_modified_RFC1123,
            "Accept-Ranges": "bytes",
            "Content-Type": obj.metadata.get("content-type", "binary/octet-stream"),
        }
        window = byte_window(request.headers.get("Range"), size, headers)
        if window is None or isinstance(window, web.Response):
            return window
        status, start, end = window
        if request.method == "HEAD":
            headers["Content-Length"] = str(end - start)
            return web.Response(status=status, headers=headers)
        return web.Response(status=status, body=read_range(obj, start, end), headers=headers)

    async def forward(request: web.Request) -> web.StreamResponse:
        if "client" not in session:
            session["client"] = aiohttp.ClientSession(auto_decompress=False)
        body = await request.read()
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_BY_HOP}
        async with session["client"].request(
            request.method, upstream + request.path_qs, data=body, headers=headers, allow_redirects=False
        ) as upstream_response:
            data = await upstream_response.read()
            stats["bytes"][request.method] += len(data)
            out = {k: v for k, v in upstream_response.headers.items() if k.lower() not in HOP_BY_HOP}
            return web.Response(status=upstream_response.status, body=data, headers=out)

    async def close_client(_: web.Application) -> None:
        if "client" in session:
            await session["client"].close()

    app = web.Application(client_max_size=1 << 30)
    app.router.add_route("*", "/{tail:.*}", handle)
    app.on_cleanup.append(close_client)
    return app


def serve(latency: float = 0.0):
    """Run the endpoint in a subprocess on a free loopback port; yields its URL."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from static_server import serve_script

    return serve_script(__file__, "--latency", str(latency))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--latency", type=float, default=0.0)
    args = parser.parse_args()
    import logging

    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)

    moto_port = free_port()
    moto = ThreadedMotoServer(ip_address="127.0.0.1", port=moto_port, verbose=False)
    moto.start()
    port = free_port()
    print(port, flush=True)
    web.run_app(
        make_app(f"http://127.0.0.1:{moto_port}", args.latency),
        host="127.0.0.1",
        port=port,
        print=None,
        access_log=None,
    )


if __name__ == "__main__":
    main()
