"""Google Cloud Storage through gcsfs, with GCS's generation preconditions: a read names the generation its shard
was opened with (ifGenerationMatch), the lease is created only if absent (ifGenerationMatch=0) and renewed, taken
over or released only at the generation its holder read. gcsfs's own requests take these as query parameters; a
412 answer means the object is at another generation (gcsfs raises it as FileExistsError).

gcsfs retries every request itself, seconds apart, a refused key included (it reports a failed token
request as a 401 it deems worth retrying): on the filesystem made for us its requests are made once, and `Store`'s
loop is the one that retries, transient failures only. gcsfs also drops the status of a 403 (GCS answers a rate
limit with one): its refusals, throttling and server errors are raised here as `ServerAnswer`, with GCS's reason.
"""

from __future__ import annotations

import json
import types
from typing import Any
from urllib.parse import quote

from fsspec.asyn import sync

from .base import ObjectChanged, ServerAnswer
from .errors import precondition_failed
from .fsspec_backend import FsspecBackend


class GCSBackend(FsspecBackend):
    conditional = True

    def __init__(self, url: str, storage_options: dict[str, Any], timeout: float) -> None:
        super().__init__(url, storage_options, timeout)
        self.fs._request = types.MethodType(_request_once, self.fs)  # see the module

    def version_of(self, info: dict[str, Any]) -> str:
        return str(info.get("generation") or "")

    async def _get_one(self, path: str, start: int, end: int | None, version: str | None, limit: int | None) -> bytes:
        """The client reads the body whole; Store checks its length (the endpoint is Google's or Microsoft's)."""
        if version is None:
            return await self.fs._cat_file(path, start=start, end=end)
        headers = {} if end is None else {"Range": f"bytes={start}-{end - 1}"}
        try:
            _, body = await self.fs._call("GET", self.fs.url(path), headers=headers, ifGenerationMatch=version)
        except Exception as err:
            if isinstance(err, FileExistsError) or precondition_failed(err):
                raise ObjectChanged(f"{path} is no longer generation {version}") from err
            raise
        return body

    def _conditional(self, coroutine: Any, creating: bool = False) -> bool:
        """Run a conditional request: False if its precondition failed (or, changing an object, it is gone)."""
        try:
            sync(self.fs.loop, lambda: coroutine)
        except FileNotFoundError:
            if creating:
                raise  # no bucket
            return False
        except FileExistsError:
            return False
        except Exception as err:
            if precondition_failed(err):
                return False
            raise
        return True

    def put_if_absent(self, path: str, data: bytes) -> bool:
        return self._put(path, data, "0")

    def put_if_version(self, path: str, data: bytes, version: str) -> bool:
        return self._put(path, data, version)

    def _put(self, path: str, data: bytes, generation: str) -> bool:
        bucket, key, _ = self.fs.split_path(path)
        upload = self.fs._call(
            "POST",
            f"{self.fs._location}/upload/storage/v1/b/{quote(bucket)}/o",
            uploadType="media",
            name=key,
            ifGenerationMatch=generation,
            data=data,
            headers={"Content-Type": "application/octet-stream"},
            json_out=True,
        )
        done = self._conditional(upload, creating=generation == "0")
        self.fs.invalidate_cache(self.fs._parent(path))
        return done

    def delete_if_version(self, path: str, version: str) -> bool:
        bucket, key, _ = self.fs.split_path(path)
        done = self._conditional(self.fs._call("DELETE", "b/{}/o/{}", bucket, key, ifGenerationMatch=version))
        self.fs.invalidate_cache(self.fs._parent(path))
        return done


ANSWERED_HERE = {401, 403, 429}  # and 5xx: statuses gcsfs's validate_response would turn into text


async def _request_once(fs: Any, method: str, path: str, *args: Any, **kwargs: Any) -> tuple:
    """gcsfs's `_request` without its retry decorator, raising the answers it would lose as ServerAnswer."""
    from gcsfs.retry import validate_response

    headers, json_body, data = kwargs.pop("headers", None), kwargs.pop("json", None), kwargs.pop("data", None)
    cache = {"cache_type": kwargs.pop("cache_type", None), "cache_source": kwargs.pop("cache_source", None)}
    await fs._set_session()
    if hasattr(data, "seek"):
        data.seek(0)
    async with fs.session.request(
        method=method,
        url=fs._format_path(path, args),
        params=fs._get_params(kwargs),
        json=json_body,
        headers=fs._get_headers(headers, **cache),
        data=data,
        timeout=fs.requests_timeout,
    ) as r:
        status, answer_headers, info, contents = r.status, r.headers, r.request_info, await r.read()
    if status in ANSWERED_HERE or status >= 500:
        raise ServerAnswer(status, _reason(contents), contents[:300].decode("utf-8", "replace"))
    validate_response(status, contents, path, args)
    return status, answer_headers, info, contents


def _reason(contents: bytes) -> str:
    """GCS's own reason code (`rateLimitExceeded`, `forbidden`), from its JSON error body."""
    try:
        errors = json.loads(contents)["error"]["errors"]
        return str(errors[0]["reason"])
    except (ValueError, KeyError, IndexError, TypeError):
        return ""
