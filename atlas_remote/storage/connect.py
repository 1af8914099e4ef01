"""Which backend serves a URL: the one place the choice is made (`connect`), each backend's module imported
only when a URL needs it; and `location`, the one location given under any of its names."""

from __future__ import annotations

import importlib
import os
import re
from collections.abc import Callable
from typing import Any

from fsspec.core import split_protocol

from ..errors import LocationError
from .base import Backend
from .settings import StoreSettings

# The backend of each protocol, as (module, class) in this package: imported only when a URL needs it, so a reader
# of a local folder never imports s3fs, gcsfs or adlfs. Any other protocol is fsspec's (`FsspecBackend`).
SIBLINGS: dict[str, tuple[str, str]] = {
    "file": ("local_backend", "LocalBackend"),
    "local": ("local_backend", "LocalBackend"),
    "memory": ("fsspec_backend", "MemoryBackend"),
    "s3": ("s3_backend", "S3Backend"),
    "s3a": ("s3_backend", "S3Backend"),
    "gs": ("gcs_backend", "GCSBackend"),
    "gcs": ("gcs_backend", "GCSBackend"),
    "http": ("fsspec_backend", "HTTPBackend"),
    "https": ("fsspec_backend", "HTTPBackend"),
    "az": ("azure_backend", "AzureBackend"),
    "abfs": ("azure_backend", "AzureBackend"),
    "abfss": ("azure_backend", "AzureBackend"),
}
OBSTORE_READS = ("s3", "s3a", "az", "abfs", "abfss")  # protocols obstore may read (storage/obstore_backend.py)


def backend_class(protocol: str) -> Callable[[str, dict[str, Any], float], Backend]:
    """The class serving a protocol, its module imported now."""
    module, name = SIBLINGS.get(protocol, ("fsspec_backend", "FsspecBackend"))
    return getattr(importlib.import_module(f"{__package__}.{module}"), name)


def connect(url: str, storage_options: dict[str, Any], settings: StoreSettings) -> Backend:
    """The backend that serves a URL in this process: the one place the choice is made. A chained URL
    (simplecache::s3://...) is fsspec's to serve as a whole."""
    check_location(url, storage_options)
    protocol = split_protocol(url)[0] or "file"
    if "::" in url:
        return backend_class("")(url, storage_options, settings.timeout)
    if protocol in OBSTORE_READS:
        from .obstore_backend import obstore_backend

        reads = obstore_backend(url, storage_options, settings.timeout, settings.max_concurrency)
        if reads is not None:
            return reads
    return backend_class(protocol)(url, storage_options, settings.timeout)


ONE_SLASH = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*):/(?!/)")


def check_location(url: str, storage_options: dict[str, Any]) -> None:
    """LocationError for what a client would take otherwise than meant: `s3:/bucket/ds` is a local path (a folder
    named `s3:`), and an endpoint_url without a scheme made obstore panic (a BaseException, two Rust backtraces)
    and botocore refuse it in its own words."""
    slip = ONE_SLASH.match(url)
    if slip and slip.group(1).lower() in SIBLINGS and not os.path.exists(url):
        fixed = f"{slip.group(1)}://{url[slip.end() :]}"
        raise LocationError(
            f"read as a local path (one slash after {slip.group(1)}:); a URL takes two: {fixed}", url=url
        )
    client = storage_options.get("client_kwargs")
    given = [("endpoint_url", storage_options.get("endpoint_url"))]
    if isinstance(client, dict):
        given.append(("client_kwargs endpoint_url", client.get("endpoint_url")))
    for name, endpoint in given:
        if endpoint is not None and (not isinstance(endpoint, str) or "://" not in endpoint):
            raise LocationError(
                f"storage_options {name} {endpoint!r} has no scheme: write 'http://{endpoint}' (or https://)",
                url=url,
            )


def location(**names: Any) -> str:
    """The one location given under any of its names (`url` here; `root` and `path` in the format's first
    implementation), as a string: a local path or any fsspec URL."""
    given = {name: value for name, value in names.items() if value is not None}
    if len(given) != 1:
        raise TypeError(f"give the dataset's location once, as one of {', '.join(names)} (got {len(given)})")
    return os.fspath(next(iter(given.values())))
