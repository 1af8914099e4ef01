"""S3 through s3fs, with S3's conditional requests: a read names the ETag its shard was opened with (If-Match),
the lease is created only if absent (If-None-Match: *) and renewed, taken over or released only if it is still
the version its holder read (If-Match on PUT and DELETE). s3fs's own calls take these headers as botocore's
parameters; a 412 answer means the object is at another version."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .answers import REDIRECTS, read_within
from .base import ObjectChanged
from .errors import precondition_failed
from .fsspec_backend import FsspecBackend


class S3Backend(FsspecBackend):
    conditional = True

    def version_of(self, info: dict[str, Any]) -> str:
        return str(info.get("ETag") or "")

    async def _get_one(self, path: str, start: int, end: int | None, version: str | None, limit: int | None) -> bytes:
        """One GET, its body read within the limit (s3fs's own reads take the body whole, however long)."""
        REDIRECTS.set(self.on_redirects)
        bucket, key, _ = self.fs.split_path(path)
        conditions = {} if version is None else {"IfMatch": version}
        if end is not None:
            conditions["Range"] = f"bytes={start}-{end - 1}"
        try:
            answer = await self.fs._call_s3("get_object", Bucket=bucket, Key=key, **conditions)
        except OSError as err:
            if version is not None and precondition_failed(err):
                raise ObjectChanged(f"{path} is no longer version {version}") from err
            raise
        body = answer["Body"]
        try:
            whole = end is not None and answer["ResponseMetadata"]["HTTPStatusCode"] != 206
            return await read_within(body.read, answer.get("ContentLength"), limit, whole)
        finally:
            body.close()

    def put_if_absent(self, path: str, data: bytes) -> bool:
        return _applied(lambda: self.fs.pipe_file(path, data, mode="create"), FileExistsError)

    def put_if_version(self, path: str, data: bytes, version: str) -> bool:
        return _applied(lambda: self.fs.pipe_file(path, data, IfMatch=version), FileNotFoundError)

    def delete_if_version(self, path: str, version: str) -> bool:
        bucket, key, _ = self.fs.split_path(path)
        deleted = _applied(
            lambda: self.fs.call_s3("delete_object", Bucket=bucket, Key=key, IfMatch=version), FileNotFoundError
        )
        if not deleted:
            return False
        self.fs.invalidate_cache(path)
        return True


def _applied(request: Callable[[], Any], refused: type[OSError]) -> bool:
    """Whether a conditional request was carried out: False on a 412 (the object is at another version) or on
    `refused` (a create finding the object there, a replace or delete finding it gone)."""
    try:
        request()
    except refused:
        return False
    except OSError as err:
        if precondition_failed(err):
            return False
        raise
    return True
