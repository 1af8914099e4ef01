"""Credentials for gs:// in every form gcsfs takes them, checked the way Google checks them.

The GCS emulator checks no credentials, so it sits behind tests/google_auth_front.py: an OAuth token endpoint
(the `token_uri` of the keys below), a metadata server, and buckets named `private-...` that refuse requests
without a token it handed out. A service-account key is then exchanged for a token through google-auth, as
against Google, and a wrong key is refused by the token endpoint, as Google refuses it. Nothing leaves 127.0.0.1.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request

import pytest
from conftest import TESTS, stop, unique
from google_auth_front import ACCOUNT, PROJECT
from helpers import same, sample_examples, write_dataset

import atlas_remote as ar
from atlas_remote.cli import main
from atlas_remote.storage import Store

EXAMPLES = sample_examples(40, seed=7)


def rsa_pem() -> tuple[str, str]:
    """(private key PEM, public key PEM) of a fresh 2048-bit RSA key."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    private = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    public = key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    return private.decode(), public.decode()


class Google:
    """The front's URL, the account's key (as a dict and as a file), a key that is not the account's, and a
    private and a public dataset."""

    def __init__(self, endpoint: str, key: dict, key_file: str, wrong_key: dict) -> None:
        self.endpoint, self.key, self.key_file, self.wrong_key = endpoint, key, key_file, wrong_key
        self.private = f"gs://{unique('private')}/ds"
        self.public = f"gs://{unique('public')}/ds"

    def options(self, token) -> dict:
        return {"endpoint_url": self.endpoint, "token": token, "project": PROJECT}

    def grants(self) -> dict:
        return json.loads(urllib.request.urlopen(f"{self.endpoint}/__grants__").read())


@pytest.fixture(scope="module")
def google(gcs_endpoint, tmp_path_factory):
    folder = tmp_path_factory.mktemp("google")
    private, public = rsa_pem()
    (folder / "public.pem").write_text(public)
    process = subprocess.Popen(
        [sys.executable, str(TESTS / "google_auth_front.py"), gcs_endpoint, str(folder / "public.pem")],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        endpoint = f"http://127.0.0.1:{int(process.stdout.readline())}"
        key = {
            "type": "service_account",
            "project_id": PROJECT,
            "private_key_id": "k1",
            "private_key": private,
            "client_email": ACCOUNT,
            "client_id": "1",
            "token_uri": f"{endpoint}/token",
        }
        (folder / "key.json").write_text(json.dumps(key))
        google = Google(endpoint, key, str(folder / "key.json"), {**key, "private_key": rsa_pem()[0]})
        import gcsfs

        direct = {"endpoint_url": gcs_endpoint, "token": "anon"}  # the emulator itself: no token asked for here
        fs = gcsfs.GCSFileSystem(**direct, skip_instance_cache=True)
        for url in (google.private, google.public):
            fs.mkdir(url[len("gs://") :].split("/")[0])
            write_dataset(url, EXAMPLES, 20, 4, options=direct)
        yield google
    finally:
        stop(process)


def test_anonymous_reads_a_public_bucket(google):
    ds = ar.open(google.public, storage_options=google.options("anon"))
    assert same(ds[:], EXAMPLES) and ds.store.read_client == "fsspec"


def test_anonymous_is_refused_a_private_bucket_at_once(google):
    store = Store(google.private, google.options("anon"))
    with pytest.raises(ar.AccessDeniedError, match=f"{google.private}/meta.json") as denied:
        store.read("meta.json", "meta")
    assert "\n" not in str(denied.value) and "check the credentials" in str(denied.value)
    assert store.stats.retries == 0 and store.stats.requests["meta"] == 1


@pytest.mark.parametrize("form", ["key file", "key dict"])
def test_a_service_account_key_is_exchanged_for_a_token(google, form):
    before = google.grants().get("granted", 0)
    token = google.key_file if form == "key file" else google.key
    ds = ar.open(google.private, storage_options=google.options(token))
    assert same(ds.get_many([3, 39, 20]), [EXAMPLES[3], EXAMPLES[39], EXAMPLES[20]])
    assert google.grants()["granted"] > before  # the private bucket answered the token the key got


def test_google_default_finds_the_key_in_the_environment(google, monkeypatch):
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", google.key_file)
    for token in ("google_default", None):
        assert same(ar.open(google.private, storage_options=google.options(token))[-1], EXAMPLES[-1])


def test_a_wrong_key_is_refused_at_once(google, capsys):
    """Google refuses the key's token request (400 invalid_grant): an access error naming the object, on one
    line, after one token request: neither gcsfs nor our retry loop tries a refused key again."""
    before = google.grants().get("refused", 0)
    store = Store(google.private, google.options(google.wrong_key))
    with pytest.raises(ar.AccessDeniedError, match=f"{google.private}/meta.json") as denied:
        store.read("meta.json", "meta")
    assert "\n" not in str(denied.value) and "check the credentials" in str(denied.value)
    assert "invalid_grant" in str(denied.value)  # Google's reason, from the token endpoint
    assert store.stats.retries == 0 and google.grants()["refused"] == before + 1
    with pytest.raises(SystemExit) as code:
        main(["info", google.private, "--storage-options", json.dumps(google.options(google.wrong_key))])
    err = capsys.readouterr().err
    assert code.value.code == 1 and err.count("\n") == 1 and "check the credentials" in err


def test_a_writer_with_a_wrong_key_is_refused_before_any_work(google):
    url = google.private.replace("/ds", "/other")
    with pytest.raises(ar.AccessDeniedError, match=url):
        ar.AtlasDatasetWriter(url, 10, 2, storage_options=google.options(google.wrong_key))


def test_the_metadata_server(google, tmp_path):
    """On a Google VM google-auth finds the metadata server (here the front, named by GCE_METADATA_HOST and
    GCE_METADATA_IP before google-auth is imported, so nothing is asked of a real one); run in a fresh process."""
    code = f"""
import atlas_remote as ar
ds = ar.open({google.private!r}, storage_options={{"endpoint_url": {google.endpoint!r}, "token": "google_default"}})
print(len(ds[:]))
"""
    host = google.endpoint.removeprefix("http://")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GOOGLE_", "GCE_", "CLOUDSDK_"))}
    env.update(HOME=str(tmp_path), GCE_METADATA_HOST=host, GCE_METADATA_IP=host, GCE_METADATA_ROOT=host)
    before = google.grants().get("metadata", 0)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == [str(len(EXAMPLES))] and google.grants()["metadata"] > before
