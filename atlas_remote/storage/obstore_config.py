"""Which storage options obstore takes exactly as s3fs or adlfs takes them, and how: obstore serves a store's
reads only where these say so (see obstore_backend). Pure functions of the URL, the options and the environment:
no request is made here, except botocore's look at its own configuration where the options leave it open.

Azure (`az://container/path`, `abfs://`): obstore reads where the credentials are ones it takes exactly as adlfs
does (a connection string, an account key, a SAS token, anonymous); a credential object, a service principal
or what adlfs finds in the environment stays with adlfs."""

from __future__ import annotations

import os
from datetime import datetime, timedelta, timezone
from typing import Any

AZURE_OPTIONS = {"account_name", "account_key", "connection_string", "sas_token", "anon", "account_host"}
AZURE_HARMLESS = {"use_listings_cache", "skip_instance_cache", "default_fill_cache", "default_cache_type"}

# s3fs options that change nothing about a GET, or that Store sets itself (timeouts, retries).
HARMLESS = {
    "use_listings_cache",
    "skip_instance_cache",
    "default_block_size",
    "default_fill_cache",
    "default_cache_type",
    "config_kwargs",
    "client_kwargs",
    "endpoint_url",
    "key",
    "secret",
    "token",
    "anon",
    "profile",
}
HARMLESS_CONFIG = {"connect_timeout", "read_timeout", "retries"}
HARMLESS_CLIENT = {"endpoint_url", "region_name"}
BOTOCORE_VARIABLES = {
    "AWS_PROFILE",
    "AWS_DEFAULT_PROFILE",
    "AWS_CONFIG_FILE",
    "AWS_SHARED_CREDENTIALS_FILE",
    "AWS_ENDPOINT_URL",
    "AWS_ENDPOINT_URL_S3",
}  # and AWS_DEFAULT_REGION, read here as botocore does
CREDENTIAL_REFRESH = timedelta(minutes=5)  # refreshable credentials are asked for again after this


def obstore_settings(url: str, options: dict[str, Any]) -> tuple[str, dict[str, Any], Any] | None:
    """(bucket, obstore's S3 settings, credential provider) for this s3:// store, or None where s3fs must serve
    the reads (see the module's why)."""
    protocol, _, rest = url.partition("://")
    if protocol not in ("s3", "s3a") or "::" in url or not rest:
        return None
    try:
        import obstore  # noqa: F401
    except ImportError:
        return None
    config = options.get("config_kwargs", {})
    client = options.get("client_kwargs", {})
    if set(options) - HARMLESS or set(config) - HARMLESS_CONFIG or set(client) - HARMLESS_CLIENT:
        return None
    explicit = options.get("anon") or (options.get("key") and options.get("secret"))
    region = client.get("region_name") or os.environ.get("AWS_DEFAULT_REGION")  # where botocore looks first too
    endpoint = options.get("endpoint_url") or client.get("endpoint_url")
    session = None
    try:
        # botocore's session is slow to import: it is asked only for what the options leave open, the
        # credentials, or a region or endpoint its variables or config file may give
        if not explicit or options.get("profile") or not (region and endpoint) and _botocore_configured():
            session = _botocore_session(options.get("profile"))
            region = region or session.get_config_variable("region")
            endpoint = endpoint or _configured_endpoint(session, region)
    except Exception:  # an unknown profile, a broken config file: s3fs reports it, in its own words
        return None
    region = region or ("us-east-1" if endpoint else None)
    if region is None:  # real AWS with no region set: s3fs finds the bucket's region, obstore would not
        return None
    settings: dict[str, Any] = {"region": region}
    provider = None
    if options.get("anon"):
        settings["skip_signature"] = True
    elif explicit:
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
    return rest.split("/", 1)[0], settings, provider


def _botocore_configured() -> bool:
    """Whether botocore could find a region, profile or endpoint in the variables it reads for them, or in its
    files (it reads profiles from the credentials file too)."""
    if BOTOCORE_VARIABLES & set(os.environ):
        return True
    return any(os.path.exists(os.path.expanduser(f"~/.aws/{name}")) for name in ("config", "credentials"))


def _botocore_session(profile: str | None):
    """botocore's view of the configuration (region, credentials), as s3fs would see it."""
    import botocore.session

    return botocore.session.Session(profile=profile)


def _configured_endpoint(session, region: str | None) -> str | None:
    """The endpoint botocore would use when the options name none: one set by AWS_ENDPOINT_URL(_S3) or in the
    config file is resolved by botocore itself (a client made for it, slow, so only then); else AWS's."""
    configured = {"AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3"} & set(os.environ)
    if not configured and not {"endpoint_url", "services"} & set(session.get_scoped_config()):
        return None
    client = session.create_client(
        "s3", region_name=region or "us-east-1", aws_access_key_id="-", aws_secret_access_key="-"
    )
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
        return {
            "access_key_id": frozen.access_key,
            "secret_access_key": frozen.secret_key,
            "token": frozen.token,
            "expires_at": datetime.now(timezone.utc) + CREDENTIAL_REFRESH,
        }

    return provide


def azure_settings(url: str, options: dict[str, Any]) -> tuple[str, dict[str, Any]] | None:
    """(container, obstore's Azure settings) for an az:// or abfs:// URL whose credentials obstore takes exactly
    as adlfs does, or None where adlfs must serve the reads."""
    protocol, _, rest = url.partition("://")
    if protocol not in ("az", "abfs", "abfss") or "::" in url or not rest or "@" in rest:
        return None
    if set(options) - AZURE_OPTIONS - AZURE_HARMLESS:
        return None
    given = dict(options)
    if not {"connection_string", "account_name"} & set(given):
        if os.environ.get("AZURE_STORAGE_CONNECTION_STRING"):
            given["connection_string"] = os.environ["AZURE_STORAGE_CONNECTION_STRING"]
        else:
            return None  # adlfs's own search of the environment (service principals, managed identity...)
    config: dict[str, Any] = {}
    if given.get("connection_string"):
        parts = dict(item.split("=", 1) for item in str(given["connection_string"]).split(";") if "=" in item)
        config["account_name"] = parts.get("AccountName") or _account_of(parts.get("BlobEndpoint", ""))
        if parts.get("AccountKey"):
            config["account_key"] = parts["AccountKey"]
        if parts.get("SharedAccessSignature"):
            config["sas_key"] = parts["SharedAccessSignature"]
        if parts.get("BlobEndpoint"):
            config["endpoint"] = parts["BlobEndpoint"].rstrip("/")
        elif parts.get("EndpointSuffix"):
            config["endpoint"] = (
                f"{parts.get('DefaultEndpointsProtocol', 'https')}://{config['account_name']}.blob.{parts['EndpointSuffix']}"
            )
    else:
        config["account_name"] = given["account_name"]
        if given.get("account_key"):
            config["account_key"] = given["account_key"]
        if given.get("sas_token"):
            config["sas_key"] = str(given["sas_token"]).lstrip("?")
        if given.get("account_host"):
            config["endpoint"] = f"https://{given['account_host']}"
    if given.get("anon"):
        config["skip_signature"] = True
    elif not {"account_key", "sas_key"} & set(config):
        return None  # adlfs would look for a token credential
    if not config.get("account_name"):
        return None
    return rest.split("/", 1)[0], {k: v for k, v in config.items() if v is not None}


def _account_of(endpoint: str) -> str | None:
    """The account a blob endpoint names: its host's first label (ACCOUNT.blob.core.windows.net), or the first
    segment of its path on an emulator (http://127.0.0.1:10000/ACCOUNT)."""
    _, _, rest = endpoint.partition("://")
    host, _, path = rest.partition("/")
    if path.strip("/"):
        return path.strip("/").split("/")[0]
    return host.split(".")[0] or None
