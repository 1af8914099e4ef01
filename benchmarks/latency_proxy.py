"""The tests' fault proxy (tests/fault_proxy.py) in front of an emulator, holding every request `delay` seconds
before forwarding it: one latency for every store, whatever its emulator, so that stores are compared side by side.

`--blocks FOLDER`: the emulators spend more CPU per ranged read than the clients measured (moto reads the whole
object for each; the GCS emulator is a Python server; Azurite a node one), on the same shared cores. With this, a
ranged GET of an object that is also a file under FOLDER (matched by the end of its path) is answered by the proxy
from that file, once the emulator has answered one ranged GET of it: the emulator's headers are kept (ETag,
x-ms-*, x-goog-*) and only the range and lengths changed. Every store then costs the same to serve, as real
object stores answer a ranged read in a time that does not depend on the object. Conditional headers are not
checked on that path (the emulator checked the first read's).

`--xml-headers` makes the GCS test emulator serve what obstore's GCS store asks of GCS's XML API for reads: it
leaves Last-Modified and ETag out of its XML-API downloads (`GET /bucket/object`), which obstore refuses to read
without, and does not answer HEAD there (501). Here the headers are added where missing, and a HEAD is answered
with the headers of a GET of the object. It is there only so that obstore's GCS reads can be measured against the
emulator, never in the tests: the values are made up, and no conditional read can be checked this way.

    python benchmarks/latency_proxy.py UPSTREAM_URL [--delay 0.02] [--blocks FOLDER] [--xml-headers]   # prints the port

GET /__faults__ reports the requests forwarded (the fault proxy's report).
"""

from __future__ import annotations

import argparse
import asyncio
import re
import sys
from email.utils import formatdate
from pathlib import Path
from urllib.parse import unquote

from aiohttp import web

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from fault_proxy import make_app
from static_server import run_forever

RANGE = re.compile(r"bytes=(\d+)-(\d+)$")
PER_ANSWER = {"content-length", "content-range", "content-md5", "x-goog-hash", "x-ms-content-crc64", "date"}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("upstream")
    parser.add_argument("--delay", type=float, default=0.02)
    parser.add_argument("--blocks", type=Path)
    parser.add_argument("--xml-headers", action="store_true")
    args = parser.parse_args()
    app = make_app(args.upstream.rstrip("/"))
    stamp = formatdate(usegmt=True)
    files: dict[str, Path | None] = {}  # request path -> the file it names under --blocks
    templates: dict[str, dict[str, str]] = {}  # request path -> the emulator's headers for a ranged read of it

    def local_file(path: str) -> Path | None:
        if path not in files:
            parts = unquote(path).strip("/").split("/")
            found = (args.blocks / "/".join(parts[i:]) for i in range(len(parts)))
            files[path] = next((p for p in found if p.is_file()), None)
        return files[path]

    def from_file(request: web.Request) -> web.Response | None:
        wanted = RANGE.match(request.headers.get("Range") or request.headers.get("x-ms-range") or "")
        if args.blocks is None or request.method != "GET" or wanted is None:
            return None
        path = request.raw_path.split("?", 1)[0]
        file = local_file(path)
        if file is None or path not in templates:
            return None
        start, last = int(wanted.group(1)), int(wanted.group(2))
        with open(file, "rb") as f:
            f.seek(start)
            body = f.read(last + 1 - start)
        size = file.stat().st_size
        headers = {**templates[path], "Content-Range": f"bytes {start}-{start + len(body) - 1}/{size}"}
        return web.Response(status=206, body=body, headers=headers)

    @web.middleware
    async def held(request: web.Request, handler):
        if request.path == "/__faults__":
            return await handler(request)
        await asyncio.sleep(args.delay)
        answered = from_file(request)
        if answered is not None:
            return answered
        if args.xml_headers and request.method == "HEAD":
            got = await handler(request.clone(method="GET"))
            response = web.StreamResponse(status=got.status, headers=got.headers)
            response.content_length = len(got.body or b"")
            response.headers.setdefault("Last-Modified", stamp)
            response.headers.setdefault("ETag", '"emulator"')
            await response.prepare(request)
            return response
        response = await handler(request)
        if args.xml_headers and not response.prepared:
            response.headers.setdefault("Last-Modified", stamp)
            response.headers.setdefault("ETag", '"emulator"')
        path = request.raw_path.split("?", 1)[0]
        if response.status == 206 and args.blocks is not None and local_file(path) is not None:
            templates[path] = {k: v for k, v in response.headers.items() if k.lower() not in PER_ANSWER}
        return response

    app.middlewares.append(held)
    run_forever(app)


if __name__ == "__main__":
    main()
