"""A read-only S3 endpoint over a local folder, for benchmarks at 100,000 shards: no upload into moto needed.

`/<bucket>/<key>` is the file `<folder>/<bucket>/<key>`. It answers GET (whole or one Range), HEAD and
ListObjectsV2 (prefix, delimiter, continuation token, 1,000 keys a page, as S3 does), with an ETag from the file's
size and modification time, and adds a fixed latency to every request. No authentication; writes are refused.
`POST /__storm__ {"every": k, "seconds": t}` answers one GET in k with 503 SlowDown for t seconds;
`POST /__rate__ {"per_second": r}` answers GETs beyond r in the last second with 503 SlowDown (0: no limit);
`GET /__stats__` returns the requests answered by kind (get, head, list, throttled), by object name (`meta.json`,
`index.npy`, ...: where a reader's requests go) and the body bytes sent.

    python benchmarks/folder_s3.py FOLDER [--latency SECONDS]    # prints the port once listening, then serves
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from collections import Counter, deque
from functools import lru_cache
from pathlib import Path
from urllib.parse import unquote
from xml.sax.saxutils import escape

from aiohttp import web
from s3_endpoint import byte_window

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # static_server: serving a listening app

PAGE = 1000
SLOW_DOWN = (
    "<?xml version='1.0' encoding='UTF-8'?><Error><Code>SlowDown</Code>"
    "<Message>Please reduce your request rate.</Message></Error>"
)


@lru_cache(maxsize=64)
def _entries(folder: str, changed: int) -> tuple[list[str], list[str]]:
    """(sub-folders, files) of a folder, sorted: listings of 100,000 shard folders are asked for page by page
    (kept while the folder's modification time, `changed`, stays the same)."""
    folders, files = [], []
    with os.scandir(folder) as scan:
        for entry in scan:
            (folders if entry.is_dir() else files).append(entry.name)
    return sorted(folders), sorted(files)


def list_page(root: Path, bucket: str, prefix: str, delimiter: str, after: str) -> tuple[list, list, str | None]:
    """(keys with sizes, common prefixes, next token) of one ListObjectsV2 page; a delimiter of "/" and a prefix
    naming a folder are what readers ask (anything else walks the folder)."""
    base = root / bucket
    if delimiter == "/" and (prefix == "" or prefix.endswith("/")):
        folder = base / prefix
        if not folder.is_dir():
            return [], [], None
        subfolders, files = _entries(str(folder), folder.stat().st_mtime_ns)
        names = sorted([(f"{prefix}{n}/", True) for n in subfolders] + [(f"{prefix}{n}", False) for n in files])
    else:
        names = sorted(
            (str(p.relative_to(base)), False)
            for p in base.rglob("*")
            if p.is_file() and str(p.relative_to(base)).startswith(prefix)
        )
    if after:
        names = [n for n in names if n[0] > after]
    page, rest = names[:PAGE], names[PAGE:]
    keys = [(name, (base / name).stat().st_size) for name, is_prefix in page if not is_prefix]
    prefixes = [name for name, is_prefix in page if is_prefix]
    return keys, prefixes, page[-1][0] if rest else None


def make_app(root: Path, latency: float) -> web.Application:
    stats = {"requests": Counter(), "objects": Counter(), "bytes": 0}
    storm = {"every": 0, "until": 0.0, "seen": 0}
    rate = {"per_second": 0, "passed": deque()}

    def over_rate() -> bool:
        now, passed = time.monotonic(), rate["passed"]
        while passed and passed[0] <= now - 1:
            passed.popleft()
        if len(passed) < rate["per_second"]:
            passed.append(now)
            return False
        return True

    async def handle(request: web.Request) -> web.StreamResponse:
        if request.path == "/__stats__":
            return web.json_response(stats)
        if request.path == "/__storm__":
            asked = await request.json()
            storm.update(every=int(asked["every"]), until=time.monotonic() + float(asked["seconds"]), seen=0)
            return web.json_response({"ok": True})
        if request.path == "/__rate__":
            rate.update(per_second=int((await request.json())["per_second"]), passed=deque())
            return web.json_response({"ok": True})
        if latency:
            await asyncio.sleep(latency)
        if request.method not in ("GET", "HEAD"):
            stats["requests"]["refused"] += 1
            return web.Response(status=405, text="read-only endpoint")
        bucket, _, key = request.path.lstrip("/").partition("/")
        bucket, key = unquote(bucket), unquote(key)
        if request.method == "GET" and not key and "list-type" in request.query:
            return listing(request, bucket)
        if rate["per_second"] and request.method == "GET" and over_rate():
            stats["requests"]["throttled"] += 1
            return web.Response(status=503, text=SLOW_DOWN, content_type="application/xml")
        if storm["every"] and request.method == "GET" and time.monotonic() < storm["until"]:
            storm["seen"] += 1
            if storm["seen"] % storm["every"] == 0:
                stats["requests"]["throttled"] += 1
                return web.Response(status=503, text=SLOW_DOWN, content_type="application/xml")
        return answer_object(request, bucket, key)

    def listing(request: web.Request, bucket: str) -> web.Response:
        stats["requests"]["list"] += 1
        query = request.query
        keys, prefixes, token = list_page(
            root, bucket, query.get("prefix", ""), query.get("delimiter", ""), query.get("continuation-token", "")
        )
        xml = ["<?xml version='1.0' encoding='UTF-8'?><ListBucketResult>", f"<Name>{escape(bucket)}</Name>"]
        xml.append(
            f"<Prefix>{escape(query.get('prefix', ''))}</Prefix><KeyCount>{len(keys) + len(prefixes)}</KeyCount>"
        )
        xml.append(f"<MaxKeys>{PAGE}</MaxKeys><IsTruncated>{'true' if token else 'false'}</IsTruncated>")
        if token:
            xml.append(f"<NextContinuationToken>{escape(token)}</NextContinuationToken>")
        for name, size in keys:
            xml.append(
                f"<Contents><Key>{escape(name)}</Key><Size>{size}</Size><ETag>&quot;{size:x}&quot;</ETag>"
                f"<LastModified>2026-01-01T00:00:00.000Z</LastModified><StorageClass>STANDARD</StorageClass></Contents>"
            )
        xml += [f"<CommonPrefixes><Prefix>{escape(p)}</Prefix></CommonPrefixes>" for p in prefixes]
        xml.append("</ListBucketResult>")
        return web.Response(text="".join(xml), content_type="application/xml")

    def answer_object(request: web.Request, bucket: str, key: str) -> web.Response:
        path = root / bucket / key
        kind = "head" if request.method == "HEAD" else "get"
        stats["requests"][kind] += 1
        stats["objects"][f"{kind} {key.rsplit('/', 1)[-1]}"] += 1
        if not key or not path.is_file():
            xml = "<?xml version='1.0' encoding='UTF-8'?><Error><Code>NoSuchKey</Code></Error>"
            return web.Response(status=404, text=xml if kind == "get" else None, content_type="application/xml")
        info = path.stat()
        headers = {
            "ETag": f'"{info.st_size:x}-{int(info.st_mtime_ns):x}"',
            "Last-Modified": time.strftime("%a, %d %b %Y %H:%M:%S GMT", time.gmtime(info.st_mtime)),
            "Accept-Ranges": "bytes",
            "Content-Type": "binary/octet-stream",
        }
        window = byte_window(request.headers.get("Range"), info.st_size, headers)
        if window is None:
            return web.Response(status=400, text="unparsed Range")
        if isinstance(window, web.Response):
            return window
        status, start, end = window
        if kind == "head":
            headers["Content-Length"] = str(end - start)
            return web.Response(status=status, headers=headers)
        with open(path, "rb") as file:
            file.seek(start)
            body = file.read(end - start)
        stats["bytes"] += len(body)
        return web.Response(status=status, body=body, headers=headers)

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handle)
    return app


def serve(folder: str, latency: float = 0.0):
    """Run the endpoint in a subprocess on a free loopback port; a context manager yielding its URL."""
    from static_server import serve_script

    return serve_script(__file__, folder, "--latency", str(latency))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("folder")
    parser.add_argument("--latency", type=float, default=0.0)
    args = parser.parse_args()
    from static_server import run_forever

    run_forever(make_app(Path(args.folder), args.latency))  # the port is printed once the socket listens


if __name__ == "__main__":
    main()
