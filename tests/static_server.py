"""A static file server on 127.0.0.1 that honours Range requests and can add a fixed latency per request.

Python's http.server ignores Range; aiohttp's static handler answers 206 with Content-Range, like a CDN or
nginx, and sends files with sendfile. Run as a subprocess (`serve()`), so that in benchmarks it does not share
the client's interpreter lock. It counts the requests it answers by method and path (GET /__requests__).

    python static_server.py DIRECTORY [--latency SECONDS]     # prints the port, then serves until killed
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import subprocess
import sys
from collections import Counter

from aiohttp import web


def make_app(directory: str, latency: float, weak_etags: bool = False) -> web.Application:
    """aiohttp's static handler answers Range requests (206, Content-Range) with sendfile; we add latency, and
    with weak_etags send ETags as nginx does for gzipped files (W/"..."), which If-Match never matches."""
    served: Counter = Counter()

    @web.middleware
    async def delay_and_count(request: web.Request, handler):
        if request.path == "/__requests__":
            return web.json_response(served)
        served[f"{request.method} {request.path}"] += 1
        if latency:
            await asyncio.sleep(latency)
        return await handler(request)

    async def weaken(request: web.Request, response: web.StreamResponse) -> None:
        if response.headers.get("ETag", "").startswith('"'):
            response.headers["ETag"] = "W/" + response.headers["ETag"]

    app = web.Application(middlewares=[delay_and_count])
    if weak_etags:
        app.on_response_prepare.append(weaken)
    app.router.add_static("/", directory, show_index=False, follow_symlinks=False)
    return app


@contextlib.contextmanager
def serve_script(script: str, *args: str):
    """Run a server script that prints its port and then serves until killed; yields its base URL."""
    process = subprocess.Popen([sys.executable, script, *args], stdout=subprocess.PIPE, text=True)
    try:
        port = int(process.stdout.readline())
        yield f"http://127.0.0.1:{port}"
    finally:
        process.terminate()
        process.wait(timeout=10)


def serve(directory: str, latency: float = 0.0, weak_etags: bool = False):
    """Serve directory on a free loopback port in a subprocess; yields the base URL."""
    return serve_script(__file__, str(directory), "--latency", str(latency), *(["--weak-etags"] * weak_etags))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("directory")
    parser.add_argument("--latency", type=float, default=0.0)
    parser.add_argument("--weak-etags", action="store_true")
    args = parser.parse_args()

    run_forever(make_app(args.directory, args.latency, args.weak_etags))


def run_forever(app: web.Application) -> None:
    """Serve app on a free loopback port, print the port (for the parent process), and serve until killed."""

    async def run() -> None:
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0, backlog=1024)
        await site.start()
        print(site._server.sockets[0].getsockname()[1], flush=True)
        await asyncio.Event().wait()

    asyncio.run(run())


if __name__ == "__main__":
    main()
