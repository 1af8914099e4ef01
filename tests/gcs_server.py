"""Run gcp-storage-emulator on 127.0.0.1:PORT, in memory, adapted so that it serves a library faithfully.

Two adaptations, both to the emulator's plumbing, not to what it answers:
- The stock emulator serves one request at a time with a listen backlog of 5 and collapses under concurrent
  ranged reads; it builds its server from `http.server.HTTPServer`, so it is handed a threading one.
- It parses multipart uploads with Python's email parser, which normalises line endings: an object whose last
  byte is '\\r' (gcsfs frames parts with bare '\\n') loses that byte. Multipart bodies are split byte-exactly here.

    python gcs_server.py PORT
"""

import json
import sys
from http import server

from gcp_storage_emulator import server as emulator


class ThreadingServer(server.ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 256


def _split_part(part: bytes) -> tuple[bytes, bytes]:
    """(headers, body) of one multipart part, keeping every byte of the body."""
    newline = b"\r\n" if part.startswith(b"\r\n") else b"\n"
    headers, _, body = part[len(newline):].partition(newline * 2)
    return headers, body[: -len(newline)] if body.endswith(newline) else body


def _read_data(request_handler, query, _original=emulator._read_data):
    content_type = request_handler.headers.get("Content-Type") or ""
    if not content_type.startswith("multipart/related"):
        return _original(request_handler, query)
    raw = emulator._decode_raw_data(emulator._read_raw_data(request_handler), request_handler)
    boundary = content_type.split("boundary=", 1)[1].strip().strip('"').encode()
    meta_part, content_part = raw.split(b"--" + boundary)[1:3]
    content_headers, content = _split_part(content_part)
    part_type = next((line.split(b":", 1)[1].strip().decode() for line in content_headers.splitlines()
                      if line.lower().startswith(b"content-type:")), "application/octet-stream")
    return {"meta": json.loads(_split_part(meta_part)[1]), "content": content, "content-type": part_type}


emulator.server.HTTPServer = ThreadingServer  # the module the emulator takes its server class from
emulator._read_data = _read_data

if __name__ == "__main__":
    emulator.create_server("127.0.0.1", int(sys.argv[1]), in_memory=True).run()
