"""Object reads from S3 through obstore (Rust), when the optional extra `atlas_remote[obstore]` is installed.

Why: s3fs/aiobotocore spend about 1.4 ms of CPU per GET, which is what bounds a batch of random block reads
on a few cores; obstore spends a fifth of that and holds no GIL while it waits. GETs go this way: blocks, and
the small objects a shard is opened with. HEAD, listings and writes stay on s3fs, and so does every request of
a store obstore cannot serve exactly as s3fs would: a chained URL, an option this module does not map, a
region it cannot tell, a process forked after obstore ran (its runtime does not survive a fork: the child's
requests hang). For plain HTTP servers fsspec's aiohttp client is as fast (measured), so they stay on it.

Each read is one GET; obstore's own retries are off (`Store` has the one retry loop) and its
errors become the builtin types `storage._translated` maps: FileNotFoundError, PermissionError, OSError.
"""

from __future__ import annotations

import asyncio
import os
from datetime import datetime, timedelta, timezone
from typing import Any

from fsspec.asyn import get_loop, sync

# s3fs options that change nothing about a GET, or that Store sets itself (timeouts, retries).
HARMLESS = {"use_listings_cache", "skip_instance_cache", "default_block_size", "default_fill_cache",
            "default_cache_type", "config_kwargs", "client_kwargs", "endpoint_url", "key", "secret", "token",
            "anon", "profile"}
HARMLESS_CONFIG = {"connect_timeout", "read_timeout", "retries"}
HARMLESS_CLIENT = {"endpoint_url", "region_name"}
CREDENTIAL_REFRESH = timedelta(minutes=5)  # refreshable credentials are asked for again after this

_runtime_pid: int | None = None  # the process whose obstore runtime is running (inherited across fork)


def obstore_reader(url: str, options: dict[str, Any], timeout: float) -> ObstoreReads | None:
    """An obstore reader for this s3:// store, or None where s3fs must serve the reads (see the module's why)."""
    protocol, _, rest = url.partition("://")
    if protocol not in ("s3", "s3a") or "::" in url or not rest or not _fork_safe():
        return None
    try:
        import obstore  # noqa: F401
    except ImportError:
        return None
    config = options.get("config_kwargs", {})
    client = options.get("client_kwargs", {})
    if set(options) - HARMLESS or set(config) - HARMLESS_CONFIG or set(client) - HARMLESS_CLIENT:
        return None
    try:
        session = _botocore_session(options.get("profile"))
        region = client.get("region_name") or session.get_config_variable("region")
        endpoint = options.get("endpoint_url") or client.get("endpoint_url") or _configured_endpoint(session, region)
    except Exception:  # an unknown profile, a broken config file: s3fs reports it, in its own words
        return None
    region = region or ("us-east-1" if endpoint else None)
    if region is None:  # real AWS with no region set: s3fs finds the bucket's region, obstore would not
        return None
    settings: dict[str, Any] = {"region": region}
    provider = None
    if options.get("anon"):
        settings["skip_signature"] = True
    elif options.get("key") and options.get("secret"):
        settings.update(access_key_id=options["key"], secret_access_key=options["secret"])
        if options.get("token"):
            settings["token"] = options["token"]
    else:
        try:
            provider = _botocore_credentials(session)
        except Exception:
            provider = None
        if provider is None:  # s3fs raises its own clear error for missing or broken credentials
            return None
    if endpoint:
        settings.update(endpoint=endpoint, virtual_hosted_style_request=False)
    return ObstoreReads(rest.split("/", 1)[0], settings, provider, timeout)


def _fork_safe() -> bool:
    return _runtime_pid in (None, os.getpid())


def _botocore_session(profile: str | None):
    """botocore's view of the configuration (region, credentials), as s3fs would see it."""
    import botocore.session

    return botocore.session.Session(profile=profile)


def _configured_endpoint(session, region: str | None) -> str | None:
    """The endpoint botocore would use when the options name none: one set by AWS_ENDPOINT_URL(_S3) or in the
    config file is resolved by botocore itself (a client made for it, about 80 ms, so only then); else AWS's."""
    configured = {"AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3"} & set(os.environ)
    if not configured and not {"endpoint_url", "services"} & set(session.get_scoped_config()):
        return None
    client = session.create_client("s3", region_name=region or "us-east-1", aws_access_key_id="-",
                                   aws_secret_access_key="-")
    endpoint = client.meta.endpoint_url
    return None if endpoint.endswith(".amazonaws.com") else endpoint


def _botocore_credentials(session) -> Any:
    """A credential provider for obstore that asks botocore, so credentials come from where s3fs finds them
    (environment, shared files and profiles, SSO, instance metadata), refreshed as botocore refreshes them."""
    credentials = session.get_credentials()
    if credentials is None:
        return None

    def provide() -> dict:
        frozen = credentials.get_frozen_credentials()
        return {"access_key_id": frozen.access_key, "secret_access_key": frozen.secret_key,
                "token": frozen.token, "expires_at": datetime.now(timezone.utc) + CREDENTIAL_REFRESH}

    return provide


class ObstoreReads:
    """GETs (ranged or whole) of one bucket, in flight together on fsspec's event loop (bounded by
    max_concurrency)."""

    def __init__(self, bucket: str, settings: dict[str, Any], provider: Any, timeout: float) -> None:
        from obstore.store import S3Store

        client = {"timeout": f"{timeout}s", "connect_timeout": f"{timeout}s",
                  "allow_http": str(settings.get("endpoint", "")).startswith("http://")}
        self.store = S3Store(bucket, config=settings, client_options=client, retry_config={"max_retries": 0},
                             credential_provider=provider)

    def fetch(self, paths: list[str], starts: list[int], ends: list, concurrency: int) -> list:
        """Bodies (or the errors, as builtin exceptions) of bucket/key paths, in order; an end of None reads the
        whole object (start is then 0)."""
        global _runtime_pid
        _runtime_pid = os.getpid()
        keys = [p.split("/", 1)[1] for p in paths]
        return sync(get_loop(), self._fetch, keys, starts, ends, concurrency)

    async def _fetch(self, keys: list[str], starts: list[int], ends: list, concurrency: int) -> list:
        import obstore

        limit = asyncio.Semaphore(concurrency)

        async def one(key: str, start: int, end: int | None) -> Any:
            async with limit:
                try:
                    if end is None:  # a whole (small) object: metadata, parsed by callers that want bytes
                        return (await (await obstore.get_async(self.store, key)).bytes_async()).to_bytes()
                    return memoryview(await obstore.get_range_async(self.store, key, start=start, end=end))
                except Exception as err:
                    return _builtin(err)

        return await asyncio.gather(*(one(k, s, e) for k, s, e in zip(keys, starts, ends)))


def _builtin(err: Exception) -> Exception:
    """obstore's refusals as PermissionError (never retried); not-found already comes as FileNotFoundError; the
    rest (network, server errors) as OSError, which Store retries."""
    from obstore.exceptions import PermissionDeniedError, UnauthenticatedError

    if isinstance(err, (FileNotFoundError, PermissionError)):
        return err
    kind = PermissionError if isinstance(err, (PermissionDeniedError, UnauthenticatedError)) else OSError
    wrapped = kind(str(err).split("\n\nDebug source:")[0])
    wrapped.__cause__ = err
    return wrapped
