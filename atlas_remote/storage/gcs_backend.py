"""Google Cloud Storage through gcsfs, with GCS's generation preconditions: a read names the generation its shard
was opened with (ifGenerationMatch), the lease is created only if absent (ifGenerationMatch=0) and renewed, taken
over or released only at the generation its holder read. gcsfs's own requests take these as query parameters; a
412 answer means the object is at another generation (gcsfs raises it as FileExistsError).

gcsfs retries every request itself, seconds apart, a refused key included (it reports a failed token
request as a 401 it deems worth retrying): on the filesystem made for us its requests are made once, and `Store`'s
loop is the one that retries, transient failures only."""

from __future__ import annotations

import inspect
import types
from typing import Any
from urllib.parse import quote

from fsspec.asyn import sync

from .base import ObjectChanged
from .fsspec_backend import FsspecBackend, precondition_failed


class GCSBackend(FsspecBackend):
    conditional = True

    def __init__(self, url: str, storage_options: dict[str, Any], timeout: float) -> None:
        super().__init__(url, storage_options, timeout)
        self.fs._request = types.MethodType(inspect.unwrap(type(self.fs)._request), self.fs)  # see the module

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
