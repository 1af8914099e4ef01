"""Azure Blob Storage as a first-class store, against Azurite (Microsoft's emulator): credentials as adlfs takes
them, reads through obstore where it maps them exactly, the lease by a conditional create, faults through the
proxy, and `cp` between S3 and Azure (server-side within one account). The conformance suite (every store) runs
on Azure too, through the `backend` fixture."""

from __future__ import annotations

import json
import threading
from datetime import datetime, timedelta, timezone

import pytest
from conftest import AZURITE_ACCOUNT, AZURITE_KEY, Faults, azurite_connection
from helpers import same, sample_examples, tree

import atlas_remote as ar
from atlas_remote import CompressionStrategy as CS
from atlas_remote.cli import main
from atlas_remote.storage import obstore_backend as obstore_module

EXAMPLES = sample_examples(120, seed=4)


def write(url: str, options: dict, examples: list = EXAMPLES) -> str:
    with ar.AtlasDatasetWriter(url, 40, 8, CS.SHARED_DICTIONARY_COMPRESSION, storage_options=options) as w:
        for example in examples:
            w.add_example(example)
    return url


def sas_connection(connection: str, container: str) -> str:
    """The same account through a SAS token on the container, and no key."""
    from azure.storage.blob import ContainerSasPermissions, generate_container_sas

    token = generate_container_sas(
        AZURITE_ACCOUNT,
        container,
        account_key=AZURITE_KEY,
        permission=ContainerSasPermissions(read=True, write=True, delete=True, list=True, create=True, add=True),
        expiry=datetime.now(timezone.utc) + timedelta(hours=1),
    )
    endpoint = next(p for p in connection.split(";") if p.startswith("BlobEndpoint="))
    return f"{endpoint};SharedAccessSignature={token}"


@pytest.mark.parametrize("client", ["obstore", "fsspec"])
def test_a_dataset_written_and_read_with_each_credential_form(azure, client, monkeypatch):
    options, container, _ = azure
    if client == "fsspec":
        monkeypatch.setattr(obstore_module, "obstore_backend", lambda *args: None)
    url = write(f"az://{container}/ds", options)
    for form in (options, {"connection_string": sas_connection(options["connection_string"], container)}):
        ds = ar.open(url, storage_options=form)
        assert ds.store.read_client == client and same(ds[:], EXAMPLES)
        assert same(ds.get_many([7, 100, 41]), [EXAMPLES[7], EXAMPLES[100], EXAMPLES[41]])
    abfs = ar.open(f"abfs://{container}/ds", storage_options=options)
    assert same(abfs[5], EXAMPLES[5])


@pytest.mark.parametrize("client", ["obstore", "fsspec"])
def test_a_wrong_key_is_access_denied_at_once(azure, client, monkeypatch, capsys):
    options, container, _ = azure
    if client == "fsspec":
        monkeypatch.setattr(obstore_module, "obstore_backend", lambda *args: None)
    url = write(f"az://{container}/ds", options)
    wrong = options["connection_string"].replace(AZURITE_KEY, "d3Jvbmcta2V5LXdyb25nLWtleQ==")
    with pytest.raises(ar.AccessDeniedError, match="check the credentials") as denied:
        ar.open(url, storage_options={"connection_string": wrong})
    assert "\n" not in str(denied.value)
    with pytest.raises(SystemExit) as code:
        main(["info", url, "--storage-options", json.dumps({"connection_string": wrong})])
    err = capsys.readouterr().err
    assert code.value.code == 1 and err.count("\n") == 1 and "check the credentials" in err


def test_two_writers_started_together_one_gets_in(azure):
    """The lease is a conditional create (If-None-Match: *): of two writers starting at the same instant on a
    fresh URL, one is refused, every time."""
    options, container, _ = azure
    for race in range(10):
        url = f"az://{container}/race{race}"
        start: threading.Barrier = threading.Barrier(2)
        results: list = []

        def begin(url: str = url, start: threading.Barrier = start, results: list = results) -> None:
            start.wait()
            try:
                results.append(ar.AtlasDatasetWriter(url, 10, 2, storage_options=options))
            except ar.DatasetLockedError as err:
                results.append(err)

        threads = [threading.Thread(target=begin) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        writers = [r for r in results if isinstance(r, ar.AtlasDatasetWriter)]
        assert len(writers) == 1, results
        writers[0].discard()


@pytest.fixture
def azure_faults(azure, azure_proxy_endpoint):
    """(url of a dataset, options through the fault proxy, faults): the session's proxy forwards to Azurite."""
    if azure_proxy_endpoint is None:
        pytest.skip("faults are injected in front of Azurite only")
    options, container, _ = azure
    url = write(f"az://{container}/ds", options)
    faults = Faults(azure_proxy_endpoint)
    faults.set()
    yield url, {"connection_string": azurite_connection(azure_proxy_endpoint)}, faults
    faults.set()


@pytest.mark.parametrize("client", ["obstore", "fsspec"])
@pytest.mark.parametrize("fault", ["500", "503", "drop", "truncate"])
def test_faults_are_retried_and_never_decoded(azure_faults, client, fault, monkeypatch):
    url, through, faults = azure_faults
    if client == "fsspec":
        monkeypatch.setattr(obstore_module, "obstore_backend", lambda *args: None)
    ds = ar.open(url, storage_options=through)
    assert ds.store.read_client == client
    faults.set({"method": "GET", "path": r"/0/data\.bin", "fault": fault, "times": 2})
    assert same(ds.get_many(range(0, 40, 3)), EXAMPLES[0:40:3])
    report = faults.report()
    assert report["injected"] == {fault: 2}, report
    if client == "obstore" or fault in ("500", "503"):
        assert ds.stats.retries == 2, ds.stats  # ours, the one retry loop: the client's own are off
    else:  # the Azure SDK under adlfs reconnects a dropped read, and resumes a short one, by itself
        assert ds.stats.retries <= 2, ds.stats


def test_cp_between_s3_and_azure_and_within_azure(azure, s3, capsys):
    azure_options, container, _ = azure
    s3_options, bucket, _ = s3
    source = write(f"s3://{bucket}/src", s3_options)
    to_azure = f"az://{container}/copy"
    assert main_exit(["cp", source, to_azure, *options_of(s3_options, azure_options)]) == 0
    assert "streamed" in capsys.readouterr().out
    within = f"az://{container}/again"
    assert main_exit(["cp", to_azure, within, "--storage-options", json.dumps(azure_options)]) == 0
    assert "server-side copies" in capsys.readouterr().out
    back = f"s3://{bucket}/back"
    assert main_exit(["cp", within, back, *options_of(azure_options, s3_options)]) == 0
    assert tree(back, s3_options) == tree(source, s3_options), "byte for byte, through Azure and back"
    assert same(ar.open(within, storage_options=azure_options)[:], EXAMPLES)


def options_of(src: dict, dest: dict) -> list[str]:
    return ["--src-storage-options", json.dumps(src), "--dest-storage-options", json.dumps(dest)]


def main_exit(argv: list[str]) -> int:
    with pytest.raises(SystemExit) as code:
        main(argv)
    return int(code.value.code)
