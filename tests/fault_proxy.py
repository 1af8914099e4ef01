"""An HTTP proxy on 127.0.0.1 that forwards to an S3 endpoint (or any HTTP server) and injects faults, for the
reliability and hostile-server tests.

Rules (POST /__faults__ with {"rules": [...]}, which replaces the current ones) each name a method, a regex on
the path and query, a fault and how many matching requests it hits:

    {"method": "GET", "path": "/data.bin", "fault": "503", "times": 2}

Faults: "500", "503" (S3 error bodies: InternalError, SlowDown), "drop" (close the connection without an
answer), "truncate" (announce the full length, send half the body, close), "slow" (wait `delay` seconds, then
answer), "whole" (a ranged GET answered 200 with the whole object, as a proxy that drops Range would), "trickle" (the
body one byte every `delay` seconds: a socket timeout never fires, only a deadline for the whole request), "flood"
(the upstream's status and headers, then `size` zero bytes, or zero bytes without end if no size is given, with
Content-Length `length` if given, else chunked; `status` replaces the status: a ranged GET answered 200 with a
GiB; with "keep_range" the upstream answers the range and its Content-Range is kept), "redirect" (`status`, default 302, with Location `to` + the request's path and query; without `to`, the
same path on this proxy with `moved=1` added to the query, which the rule's path should not match). A rule with
"every": k hits one matching request in k (a storm of 503s at 1/k of the requests), with "per_second": r those
beyond r matching requests in the last second (a rate limit), and
with "seconds": t only for t seconds after it was set. GET /__faults__ reports what was injected, the requests, and the body bytes that crossed (up and down). `Expect: 100-continue` (botocore sends it on larger PUTs)
is answered by aiohttp before a body is read.

    python fault_proxy.py UPSTREAM_URL          # prints the port, then serves until killed
"""

from __future__ import annotations

import argparse
import asyncio
import re
import time
from collections import Counter, deque

import aiohttp
from aiohttp import web
from static_server import run_forever

ERRORS = {
    "500": ("InternalError", "We encountered an internal error. Please try again."),
    "503": ("SlowDown", "Please reduce your request rate."),
}
HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "content-encoding", "content-length", "host"}


def make_app(upstream: str) -> web.Application:
    # bytes: body bytes that crossed the proxy, by "METHOD path" (request bodies up, response bodies down)
    state = {"rules": [], "injected": Counter(), "requests": Counter(), "bytes_up": Counter(), "bytes_down": Counter()}

    async def control(request: web.Request) -> web.Response:
        if request.method == "POST":
            now = time.monotonic()
            state["rules"] = [
                {**rule, "left": rule.get("times", 1), "seen": 0, "until": now + rule.get("seconds", 1e9)}
                for rule in (await request.json())["rules"]
            ]
            for counter in ("injected", "requests", "bytes_up", "bytes_down"):
                state[counter].clear()
            return web.json_response({"ok": True})
        return web.json_response(
            {
                "injected": state["injected"],
                "requests": state["requests"],
                "bytes_up": state["bytes_up"],
                "bytes_down": state["bytes_down"],
                "left": [r["left"] for r in state["rules"]],
            }
        )

    def under_rate(rule: dict) -> bool:
        """Whether a request passes a rule's "per_second": r (a rate limit: what goes beyond r requests in the last
        second is hit, as S3 answers 503 SlowDown past a prefix's rate)."""
        if "per_second" not in rule:
            return False
        now, passed = time.monotonic(), rule.setdefault("passed", deque())
        while passed and passed[0] <= now - 1:
            passed.popleft()
        if len(passed) < rule["per_second"]:
            passed.append(now)
            return True
        return False

    def matching_fault(request: web.Request) -> dict | None:
        target = request.path_qs
        for rule in state["rules"]:
            if (
                rule["left"] > 0
                and rule.get("method", request.method) == request.method
                and re.search(rule["path"], target)
                and time.monotonic() < rule["until"]
            ):
                rule["seen"] += 1
                if rule["seen"] % rule.get("every", 1) or under_rate(rule):
                    continue
                rule["left"] -= 1
                state["injected"][rule["fault"]] += 1
                return rule
        return None

    async def forward(request: web.Request, session: aiohttp.ClientSession, drop: frozenset = frozenset()):
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_BY_HOP | {"expect"} | drop}
        headers["Host"] = request.headers.get("Host", "")
        body = await request.read()
        state["bytes_up"][f"{request.method} {request.path}"] += len(body)
        async with session.request(  # no body, no data: aiohttp would add a Content-Type, which Azure's keys sign
            request.method,
            upstream + request.raw_path,
            headers=headers,
            data=body or None,
            allow_redirects=False,
            skip_auto_headers={"Content-Type"},
        ) as upstream_response:
            payload = await upstream_response.read()
            state["bytes_down"][f"{request.method} {request.path}"] += len(payload)
            out_headers = {k: v for k, v in upstream_response.headers.items() if k.lower() not in HOP_BY_HOP}
            length = int(upstream_response.headers.get("Content-Length", len(payload)))
            return upstream_response.status, out_headers, payload, length

    async def proxy(request: web.Request) -> web.StreamResponse:
        state["requests"][f"{request.method} {request.path}"] += 1
        if request.headers.get("Expect", "").lower() == "100-continue":
            state["requests"]["Expect: 100-continue"] += 1
        rule = matching_fault(request)
        fault = rule["fault"] if rule else None
        if fault in ERRORS:
            await request.read()
            code, message = ERRORS[fault]
            xml = (
                f"<?xml version='1.0' encoding='UTF-8'?><Error><Code>{code}</Code><Message>{message}</Message></Error>"
            )
            return web.Response(status=int(fault), text=xml, content_type="application/xml")
        if fault == "drop":
            request.transport.close()
            return web.Response(status=500)  # never reaches the client
        if fault == "slow":
            await asyncio.sleep(float(rule.get("delay", 5)))
        if fault == "redirect":
            await request.read()
            target = request.path_qs + ("&" if request.query_string else "?") + "moved=1"
            location = rule["to"] + request.path_qs if "to" in rule else target
            return web.Response(status=int(rule.get("status", 302)), headers={"Location": location})
        if fault == "flood":
            return await flood(request, rule)
        dropped = frozenset({"range"}) if fault == "whole" else frozenset()
        status, headers, payload, length = await forward(request, request.app["session"], dropped)
        if fault == "truncate" and len(payload) > 1:
            response = web.StreamResponse(status=status, headers=headers)
            response.content_length = len(payload)
            await response.prepare(request)
            await response.write(payload[: len(payload) // 2])
            request.transport.close()
            return response
        if fault == "trickle":
            response = web.StreamResponse(status=status, headers=headers)
            response.content_length = len(payload)
            await response.prepare(request)
            for i in range(len(payload)):
                await response.write(payload[i : i + 1])
                await asyncio.sleep(float(rule.get("delay", 1)))
            return response
        if request.method == "HEAD":  # no body, but the client needs the object's length
            response = web.StreamResponse(status=status, headers=headers)
            response.content_length = length
            await response.prepare(request)
            return response
        return web.Response(status=status, headers=headers, body=payload)

    async def flood(request: web.Request, rule: dict) -> web.StreamResponse:
        """The upstream's answer (range dropped), its body replaced by zeros: `size` of them, or without end."""
        kept = rule.get("keep_range", False)
        status, headers, _, _ = await forward(request, request.app["session"], frozenset() if kept else {"range"})
        if not kept:
            headers.pop("Content-Range", None)
        response = web.StreamResponse(status=int(rule.get("status", status)), headers=headers)
        if "length" in rule:
            response.content_length = int(rule["length"])
        else:
            response.enable_chunked_encoding()
        await response.prepare(request)
        left = int(rule.get("size", 1 << 62))
        chunk = bytes(1 << 16)
        key = f"{request.method} {request.path}"
        try:
            while left > 0:
                piece = chunk[: min(left, len(chunk))]
                await response.write(piece)
                state["bytes_down"][key] += len(piece)
                left -= len(piece)
        except (ConnectionError, RuntimeError):  # the client hung up: what it read is counted
            return response
        await response.write_eof()
        return response

    async def start_session(app: web.Application):
        app["session"] = aiohttp.ClientSession(auto_decompress=False)
        yield
        await app["session"].close()

    app = web.Application(client_max_size=1 << 30)
    app.cleanup_ctx.append(start_session)
    app.router.add_route("*", "/__faults__", control)
    app.router.add_route("*", "/{tail:.*}", proxy)
    return app


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("upstream")
    args = parser.parse_args()

    run_forever(make_app(args.upstream.rstrip("/")))


if __name__ == "__main__":
    main()
