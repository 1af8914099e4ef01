"""Azure Blob Storage through adlfs (the `azure` extra), with Azure's conditional requests made through the SDK
adlfs is built on: a read names the ETag its shard was opened with (If-Match), the lease is created only if absent
(If-None-Match: *) and renewed, taken over or released only at the ETag its holder read. An Azure ETag changes at
every write, so it tells a rewrite of the same bytes too.

Server-side copies (`cp` within an account, and a commit's promotion of staged files) are Azure's Copy Blob,
which may finish after it answers: a copy is awaited until the service says it succeeded, so a staged file is
never deleted under a copy still reading it.
"""

from __future__ import annotations

import asyncio
from typing import Any

from fsspec.asyn import sync

from .base import ObjectChanged
from .fsspec_backend import FsspecBackend

COPY_POLL_SECONDS = 0.2


class AzureBackend(FsspecBackend):
    conditional = True

    def __init__(self, url: str, storage_options: dict[str, Any], timeout: float) -> None:
        super().__init__(url, storage_options, timeout)
        # The SDK's client retries each request itself (3 times by default), under ours: a persistent failure
        # would be tried 3 x retries times. adlfs takes no retry setting, so its client's policy is set here.
        policy = getattr(getattr(self.fs.service_client, "_config", None), "retry_policy", None)
        if policy is not None and hasattr(policy, "total_retries"):
            policy.total_retries = 0

    def version_of(self, info: dict[str, Any]) -> str:
        return str(info.get("etag") or "")

    def _blob(self, path: str) -> Any:
        container, blob, _ = self.fs.split_path(path)
        return self.fs.service_client.get_blob_client(container=container, blob=blob)

    async def _get_one(self, path: str, start: int, end: int | None, version: str | None, limit: int | None) -> bytes:
        """The SDK reads the body whole; Store checks its length (the endpoint is Microsoft's)."""
        if version is None:
            return await self.fs._cat_file(path, start=start, end=end)
        from azure.core import MatchConditions
        from azure.core.exceptions import ResourceModifiedError, ResourceNotFoundError

        length = None if end is None else end - start
        try:
            async with self._blob(path) as blob:
                stream = await blob.download_blob(
                    offset=start, length=length, etag=version, match_condition=MatchConditions.IfNotModified
                )
                return await stream.readall()
        except ResourceModifiedError as err:
            raise ObjectChanged(f"{path} is no longer version {version}") from err
        except ResourceNotFoundError as err:
            raise FileNotFoundError(path) from err

    def put_if_absent(self, path: str, data: bytes) -> bool:
        try:
            self.fs.pipe_file(path, data, mode="create")
        except FileExistsError:
            return False
        return True

    def put_if_version(self, path: str, data: bytes, version: str) -> bool:
        from azure.core import MatchConditions
        from azure.core.exceptions import ResourceModifiedError, ResourceNotFoundError

        try:
            self.fs.pipe_file(path, data, etag=version, match_condition=MatchConditions.IfNotModified)
        except (ResourceModifiedError, ResourceNotFoundError):
            return False
        return True

    def delete_if_version(self, path: str, version: str) -> bool:
        from azure.core import MatchConditions
        from azure.core.exceptions import ResourceModifiedError, ResourceNotFoundError

        async def delete() -> None:
            async with self._blob(path) as blob:
                await blob.delete_blob(etag=version, match_condition=MatchConditions.IfNotModified)

        try:
            sync(self.fs.loop, delete)
        except (ResourceModifiedError, ResourceNotFoundError):
            return False
        self.fs.invalidate_cache(self.fs._parent(path))
        return True

    def copy(self, src: str, dst: str) -> None:
        from azure.core.exceptions import ResourceNotFoundError

        async def copy() -> None:
            async with self._blob(src) as source, self._blob(dst) as target:
                status = (await target.start_copy_from_url(source.url))["copy_status"]
                while status == "pending":
                    await asyncio.sleep(COPY_POLL_SECONDS)
                    status = (await target.get_blob_properties()).copy.status
            if status != "success":
                raise OSError(f"Azure's copy of {src} to {dst} ended {status!r}")

        try:
            sync(self.fs.loop, copy)
        except ResourceNotFoundError as err:
            raise FileNotFoundError(src) from err
        self.fs.invalidate_cache(self.fs._parent(dst))

    def promote(self, src: str, dst: str) -> None:
        self.copy(src, dst)
