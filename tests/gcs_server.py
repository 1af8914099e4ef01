"""Run gcp-storage-emulator on 127.0.0.1:PORT, in memory, adapted so that it serves a library faithfully.

Three adaptations, to the emulator's plumbing and to the preconditions real GCS honours and it ignores:
- The stock emulator serves one request at a time with a listen backlog of 5 and collapses under concurrent
  ranged reads; it builds its server from `http.server.HTTPServer`, so it is handed a threading one.
- It parses multipart uploads with Python's email parser, which normalises line endings: an object whose last
  byte is '\\r' (gcsfs frames parts with bare '\\n') loses that byte. Multipart bodies are split byte-exactly here.
- It ignores `ifGenerationMatch` (0: create only if absent; N: only if the object is at generation N), which
  writers' leases and readers' conditional reads rely on: an upload, a download or a delete whose precondition
  does not hold is answered 412 Precondition Failed here, as GCS answers it.

    python gcs_server.py PORT
"""

import json
import sys
from http import HTTPStatus, server

from gcp_storage_emulator import server as emulator
from gcp_storage_emulator.exceptions import NotFound
from gcp_storage_emulator.handlers import objects


class ThreadingServer(server.ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 256


def _split_part(part: bytes) -> tuple[bytes, bytes]:
    """(headers, body) of one multipart part, keeping every byte of the body."""
    newline = b"\r\n" if part.startswith(b"\r\n") else b"\n"
    headers, _, body = part[len(newline) :].partition(newline * 2)
    return headers, body[: -len(newline)] if body.endswith(newline) else body


def _read_data(request_handler, query, _original=emulator._read_data):
    content_type = request_handler.headers.get("Content-Type") or ""
    if not content_type.startswith("multipart/related"):
        return _original(request_handler, query)
    raw = emulator._decode_raw_data(emulator._read_raw_data(request_handler), request_handler)
    boundary = content_type.split("boundary=", 1)[1].strip().strip('"').encode()
    meta_part, content_part = raw.split(b"--" + boundary)[1:3]
    content_headers, content = _split_part(content_part)
    part_type = next(
        (
            line.split(b":", 1)[1].strip().decode()
            for line in content_headers.splitlines()
            if line.lower().startswith(b"content-type:")
        ),
        "application/octet-stream",
    )
    return {"meta": json.loads(_split_part(meta_part)[1]), "content": content, "content-type": part_type}


def _precondition_fails(request, storage, name) -> bool:
    """GCS's ifGenerationMatch: 0 means "does not exist", N means "exists at generation N"."""
    wanted = (request.query.get("ifGenerationMatch") or [None])[0]
    if wanted is None:
        return False
    try:
        current = storage.get_file_obj(request.params["bucket_name"], name)["generation"]
    except NotFound:
        current = None
    return (current is not None) if wanted == "0" else str(current) != wanted


def _guarded(stock, name_of):
    def handler(request, response, storage, *args, **kwargs):
        if _precondition_fails(request, storage, name_of(request)):
            response.status = HTTPStatus.PRECONDITION_FAILED
            return None
        return stock(request, response, storage, *args, **kwargs)

    return handler


def _inserted_name(request):
    name = (request.query.get("name") or [None])[0]
    if name is None and isinstance(request.data, dict):
        name = (request.data.get("meta") or request.data).get("name")
    return name


def _object_name(request):
    return request.params["object_id"]


GUARDED = {
    objects.insert: _guarded(objects.insert, _inserted_name),
    objects.download: _guarded(objects.download, _object_name),
    objects.delete: _guarded(objects.delete, _object_name),
}
emulator.server.HTTPServer = ThreadingServer  # the module the emulator takes its server class from
emulator._read_data = _read_data
objects.insert = GUARDED[objects.insert]  # what the router falls back on, and every route that names them:
emulator.HANDLERS = tuple(
    (pattern, {method: GUARDED.get(handler, handler) for method, handler in handlers.items()})
    for pattern, handlers in emulator.HANDLERS
)

if __name__ == "__main__":
    emulator.create_server("127.0.0.1", int(sys.argv[1]), in_memory=True).run()
