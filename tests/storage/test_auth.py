"""Credentials against an S3 endpoint that checks them: clear errors that name the URL.

moto enforces signatures and IAM policies once INITIAL_NO_AUTH_ACTION_COUNT actions have been served; the
first ones create a user allowed everything on S3 and a user allowed nothing.
"""

from __future__ import annotations

import json

import boto3
import pytest
from conftest import start_server, stop
from helpers import same, sample_examples

import atlas_remote as ar
from atlas_remote.storage import Store
from atlas_remote.storage.ranges import ByteRange

FREE_ACTIONS = 5  # the IAM calls below; everything after them is authenticated and authorised


@pytest.fixture(scope="module")
def auth_s3():
    endpoint, process = start_server(
        ["-m", "moto.server", "-H", "127.0.0.1", "-p", "{port}"],
        "/moto-api/",
        env={"INITIAL_NO_AUTH_ACTION_COUNT": str(FREE_ACTIONS)},
    )
    try:
        iam = boto3.client(
            "iam",
            endpoint_url=endpoint,
            region_name="us-east-1",
            aws_access_key_id="bootstrap",
            aws_secret_access_key="bootstrap",
        )
        everything = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "s3:*", "Resource": "*"}]}
        iam.create_user(UserName="writer")
        iam.put_user_policy(UserName="writer", PolicyName="all-s3", PolicyDocument=json.dumps(everything))
        writer = iam.create_access_key(UserName="writer")["AccessKey"]
        iam.create_user(UserName="nobody")
        nobody = iam.create_access_key(UserName="nobody")["AccessKey"]
        keys = {
            name: {"endpoint_url": endpoint, "key": k["AccessKeyId"], "secret": k["SecretAccessKey"]}
            for name, k in (("writer", writer), ("nobody", nobody))
        }
        import s3fs

        s3fs.S3FileSystem(**keys["writer"], skip_instance_cache=True).mkdir("secured")
        url = "s3://secured/ds"
        examples = sample_examples(60)
        with ar.AtlasDatasetWriter(url, 30, 5, storage_options=keys["writer"]) as w:
            for example in examples:
                w.add_example(example)
        yield url, keys, examples
    finally:
        stop(process)


def test_valid_credentials_read(auth_s3):
    url, keys, examples = auth_s3
    assert same(ar.open(url, storage_options=keys["writer"])[:], examples)


@pytest.mark.parametrize("client", [{}, {"version_aware": False}], ids=["obstore", "s3fs"])
def test_wrong_secret_is_refused_clearly(auth_s3, client):
    """The store's own words whole (obstore's were cut mid-word behind its URL and timing: "does not match the
    signatur"), then what to do."""
    url, keys, _ = auth_s3
    with pytest.raises(ar.AccessDeniedError, match=f"{url}/meta.json") as refused:
        ar.open(url, storage_options={**keys["writer"], "secret": "not-the-secret", **client})
    message = str(refused.value)
    assert "does not match the signature you provided" in message and "check the credentials" in message, message


def test_unknown_access_key_is_refused_clearly(auth_s3):
    url, keys, _ = auth_s3
    with pytest.raises(ar.AccessDeniedError, match=f"{url}/meta.json"):
        ar.open(url, storage_options={**keys["writer"], "key": "AKIANOSUCHKEY0000000"})


def test_forbidden_objects_are_refused_clearly(auth_s3):
    url, keys, _ = auth_s3
    with pytest.raises(ar.AccessDeniedError, match=f"{url}/meta.json"):
        ar.open(url, storage_options=keys["nobody"])
    with pytest.raises(ar.AccessDeniedError, match="s3://secured/other"):
        ar.AtlasDatasetWriter("s3://secured/other", 10, 2, storage_options=keys["nobody"])


def test_credentials_from_the_environment(auth_s3, monkeypatch):
    url, keys, examples = auth_s3
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", keys["writer"]["key"])
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", keys["writer"]["secret"])
    assert same(ar.open(url, storage_options={"endpoint_url": keys["writer"]["endpoint_url"]})[-1], examples[-1])


def test_anonymous_access_to_a_private_bucket_is_refused_clearly(auth_s3):
    url, keys, _ = auth_s3
    with pytest.raises(ar.AccessDeniedError, match=f"{url}/meta.json"):
        ar.open(url, storage_options={"endpoint_url": keys["writer"]["endpoint_url"], "anon": True})


def writer_in_a_credentials_file(keys: dict, profile: str, tmp_path, monkeypatch) -> None:
    """The writer's keys under a profile of a shared credentials file, and nowhere else."""
    credentials = tmp_path / "credentials"
    credentials.write_text(
        f"[{profile}]\naws_access_key_id = {keys['writer']['key']}\n"
        f"aws_secret_access_key = {keys['writer']['secret']}\n"
    )
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(credentials))
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")


def test_profile_and_requester_pays_options_pass_through(auth_s3, tmp_path, monkeypatch):
    url, keys, examples = auth_s3
    writer_in_a_credentials_file(keys, "atlas-writer", tmp_path, monkeypatch)
    endpoint = {"endpoint_url": keys["writer"]["endpoint_url"]}
    assert same(
        ar.open(url, storage_options={**endpoint, "profile": "atlas-writer", "requester_pays": True})[3], examples[3]
    )
    with pytest.raises(ar.AccessDeniedError, match="nosuchprofile") as info:  # at once: not worth a retry
        ar.open(url, storage_options={**endpoint, "profile": "nosuchprofile"})
    assert isinstance(info.value.__cause__, Exception) and "ProfileNotFound" in str(info.value)


@pytest.mark.parametrize("who", ["nobody", "wrong secret"])
def test_block_reads_through_obstore_are_refused_clearly_and_not_retried(auth_s3, who):
    """Block reads go through obstore (the `obstore` extra): its refusals are access errors as s3fs's are."""
    url, keys, _ = auth_s3
    options = keys["nobody"] if who == "nobody" else {**keys["writer"], "secret": "not-the-secret"}
    store = Store(url, options)
    assert store.read_client == "obstore"
    with pytest.raises(ar.AccessDeniedError, match=rf"{url}/0/data.bin: reading bytes \[0, 10\)"):
        store.read_ranges([ByteRange("0/data.bin", 0, 10)], "block")
    assert store.stats.retries == 0 and store.stats.requests["block"] == 1


def test_credentials_from_a_profile_reach_obstore(auth_s3, tmp_path, monkeypatch):
    """Without keys in the options obstore asks botocore, so a shared credentials file works as with s3fs."""
    url, keys, examples = auth_s3
    writer_in_a_credentials_file(keys, "default", tmp_path, monkeypatch)
    ds = ar.open(url, storage_options={"endpoint_url": keys["writer"]["endpoint_url"]}, cache_bytes=0)
    assert ds.store.read_client == "obstore" and same(ds[:], examples)
