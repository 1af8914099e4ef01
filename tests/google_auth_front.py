"""Google's side of authentication, on 127.0.0.1, in front of the GCS emulator (which checks no credentials):

- an OAuth token endpoint (`POST /token`, the `token_uri` of the tests' service-account keys): a JWT assertion
  signed by the key whose public half this front was given gets an access token; any other gets 400
  `invalid_grant`, as Google answers a key that is not (or no longer) the account's;
- a metadata server (`/computeMetadata/v1/...`, and its ping at `/`), as on a Google VM: the default service
  account's token and the project, for google-auth pointed here by GCE_METADATA_HOST and GCE_METADATA_IP;
- the storage API, forwarded to the emulator (tests/fault_proxy.py's forwarding), where buckets named `private-...`
  answer 401 to a request without one of the tokens handed out above, as GCS answers it.

GET /__grants__ reports the token requests by outcome (granted, refused, metadata): a client that retries a
refused key shows up as more than one refusal.

    python google_auth_front.py UPSTREAM_URL PUBLIC_KEY_PEM_FILE     # prints the port, then serves until killed
"""

from __future__ import annotations

import argparse
import re
import time
from collections import Counter
from pathlib import Path

from aiohttp import web
from fault_proxy import make_app
from static_server import run_forever

KEY_TOKEN = "ya29.granted-for-the-key"
METADATA_TOKEN = "ya29.from-the-metadata-server"
ACCOUNT = "reader@atlas-test.iam.gserviceaccount.com"
PROJECT = "atlas-test"
PRIVATE_BUCKET = re.compile(r"/b/(private-[^/?]+)|^/(private-[^/?]+)")
METADATA_HEADERS = {"Metadata-Flavor": "Google"}
AUDIENCE = "https://oauth2.googleapis.com/token"  # what google-auth names in a key's assertion, whatever its token_uri


def make_front(upstream: str, public_key: str) -> web.Application:
    from google.auth import jwt

    grants: Counter = Counter()
    app = make_app(upstream)

    async def token(request: web.Request) -> web.Response:
        form = await request.post()
        try:
            claims = jwt.decode(str(form.get("assertion", "")), certs=public_key, audience=AUDIENCE)
            granted = claims.get("iss") == ACCOUNT and claims.get("exp", 0) > time.time()
        except ValueError:
            granted = False
        grants["granted" if granted else "refused"] += 1
        if not granted:
            return web.json_response(
                {"error": "invalid_grant", "error_description": "Invalid JWT Signature."}, status=400
            )
        return web.json_response({"access_token": KEY_TOKEN, "expires_in": 3600, "token_type": "Bearer"})

    def metadata(request: web.Request) -> web.Response:
        if request.headers.get("Metadata-Flavor") != "Google":
            return web.Response(status=403, text="Missing Metadata-Flavor header")
        path = request.path.removeprefix("/computeMetadata/v1/")
        if path in ("", "/"):  # the ping
            return web.Response(headers=METADATA_HEADERS)
        if path == "project/project-id":
            return web.Response(text=PROJECT, headers=METADATA_HEADERS)
        if path == "instance/service-accounts/default/":
            answer = {
                "email": ACCOUNT,
                "aliases": ["default"],
                "scopes": ["https://www.googleapis.com/auth/cloud-platform"],
            }
            return web.json_response(answer, headers=METADATA_HEADERS)
        if path == "instance/service-accounts/default/token":
            grants["metadata"] += 1
            answer = {"access_token": METADATA_TOKEN, "expires_in": 3600, "token_type": "Bearer"}
            return web.json_response(answer, headers=METADATA_HEADERS)
        return web.Response(status=404, headers=METADATA_HEADERS)

    @web.middleware
    async def google(request: web.Request, handler):
        if request.path == "/__grants__":
            return web.json_response(grants)
        if request.path == "/token" and request.method == "POST":
            return await token(request)
        if request.path == "/" or request.path.startswith("/computeMetadata/"):
            return metadata(request)
        if PRIVATE_BUCKET.search(request.path) and request.headers.get("Authorization") not in (
            f"Bearer {KEY_TOKEN}",
            f"Bearer {METADATA_TOKEN}",
        ):
            message = (
                "Invalid Credentials"
                if "Authorization" in request.headers
                else "Anonymous caller does not have storage.objects.get access to the Google Cloud Storage object."
            )
            return web.json_response({"error": {"code": 401, "message": message}}, status=401)
        return await handler(request)

    app.middlewares.append(google)
    return app


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("upstream")
    parser.add_argument("public_key")
    args = parser.parse_args()
    run_forever(make_front(args.upstream.rstrip("/"), Path(args.public_key).read_text()))


if __name__ == "__main__":
    main()
