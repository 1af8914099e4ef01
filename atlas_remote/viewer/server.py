"""The viewer's HTTP server: the page, its static files and four JSON answers (pages.py), read-only.

It listens on 127.0.0.1 unless told otherwise. Every response forbids inline script, plugins, frames and any
origin but its own (Content-Security-Policy), so even a flaw in the page could not run what a dataset holds; on
loopback, a request naming another host is refused (a web page in the user's browser could otherwise reach
the viewer through a DNS name rebound to 127.0.0.1 and read the dataset).
"""

from __future__ import annotations

import json
import logging
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from typing import Any
from urllib.parse import parse_qs, urlsplit

from ..errors import AtlasError
from ..read.megatron import MegatronCorpus
from ..read.reader import AtlasDataset
from .corpus import CorpusView
from .pages import DatasetView

log = logging.getLogger(__name__)

STATIC = {  # the only files served, with their types
    "viewer.js": "text/javascript; charset=utf-8",
    "viewer.css": "text/css; charset=utf-8",
    "uPlot.iife.min.js": "text/javascript; charset=utf-8",
    "uPlot.min.css": "text/css; charset=utf-8",
    "uPlot.LICENSE": "text/plain; charset=utf-8",
}
POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
    "base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
LOOPBACK = ("127.0.0.1", "localhost", "[::1]", "::1")


def static_file(name: str) -> bytes:
    return (resources.files(__package__) / "static" / name).read_bytes()


class ViewerServer(ThreadingHTTPServer):
    """Serves one dataset's page at `url` until `shutdown()` (or, from `serve_forever()`, Ctrl-C)."""

    daemon_threads = True

    def __init__(self, ds: AtlasDataset | MegatronCorpus, host: str = "127.0.0.1", port: int = 0) -> None:
        self.view = CorpusView(ds) if isinstance(ds, MegatronCorpus) else DatasetView(ds)
        self.host = host
        super().__init__((host, port), _Handler)
        self.port = self.server_address[1]
        self.allowed_hosts = {f"{name}:{self.port}" for name in LOOPBACK} if host in LOOPBACK else None

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/"

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A browser that leaves while an answer is on its way (a closed tab, a new page) is no error; anything
        else goes to the log (`--debug`), never as a traceback on the terminal (socketserver's default)."""
        if not isinstance(sys.exc_info()[1], ConnectionError):
            log.warning("the viewer failed to answer %s", client_address, exc_info=True)

    def start(self) -> ViewerServer:
        """Serve in a background thread (for notebooks and tests); `shutdown()` stops it."""
        threading.Thread(target=self.serve_forever, daemon=True, name="atlas-viewer").start()
        return self


class _Handler(BaseHTTPRequestHandler):
    server: ViewerServer
    server_version = "atlas-remote-view"
    sys_version = ""

    def do_GET(self) -> None:
        if self.server.allowed_hosts is not None and self.headers.get("Host") not in self.server.allowed_hosts:
            return self._send(403, b"this viewer answers requests for 127.0.0.1 only\n", "text/plain; charset=utf-8")
        url = urlsplit(self.path)
        if url.path == "/":
            return self._send(200, static_file("index.html"), "text/html; charset=utf-8")
        if url.path.startswith("/static/") and url.path[len("/static/") :] in STATIC:
            name = url.path[len("/static/") :]
            return self._send(200, static_file(name), STATIC[name])
        if url.path == "/favicon.ico":
            return self._send(204, b"", "image/x-icon")
        if url.path.startswith("/api/"):
            return self._api(url.path[len("/api/") :], parse_qs(url.query))
        self._send(404, b"not found\n", "text/plain; charset=utf-8")

    def _api(self, name: str, query: dict[str, list[str]]) -> None:
        view = self.server.view
        questions: dict[str, Any] = {"summary": view.summary, "shards": view.shards, "sample": view.sample}
        try:
            if name == "examples":
                start, count = (int(query.get(k, [default])[0]) for k, default in (("start", "0"), ("count", "20")))
                answer = view.answer(view.page, start, count)
            elif name in questions:
                answer = view.answer(questions[name])
            else:
                return self._json(404, {"error": f"no answer named {name!r}"})
        except ValueError as err:  # a bad start or count (AtlasErrors that are ValueErrors come next)
            if isinstance(err, AtlasError):
                return self._json(500, {"error": str(err)})
            return self._json(400, {"error": str(err)})
        except AtlasError as err:
            return self._json(500, {"error": str(err)})
        self._json(200, answer)

    def _json(self, status: int, value: dict[str, Any]) -> None:
        self._send(status, json.dumps(value, allow_nan=False).encode(), "application/json")

    def _send(self, status: int, body: bytes, content_type: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Content-Security-Policy", POLICY)
        self.send_header("X-Content-Type-Options", "nosniff")
        self.send_header("Referrer-Policy", "no-referrer")
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s " + format, self.address_string(), *args)
