"""docker-compose.yml stays in step with the suite: the services exist and pass the variables the tests read."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]


def test_compose_file_runs_the_suite_against_minio_fake_gcs_and_azurite():
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    services = compose["services"]
    assert {"minio", "fake-gcs", "azurite", "create-bucket", "demo", "tests"} <= set(services)
    tests = services["tests"]
    read_by_suite = set(
        re.findall(r'os\.environ\.get\("(ATLAS_TEST_\w+)"\)', (ROOT / "tests" / "conftest.py").read_text())
    )
    assert read_by_suite == {"ATLAS_TEST_S3_ENDPOINT", "ATLAS_TEST_GCS_ENDPOINT", "ATLAS_TEST_AZURE_CONNECTION_STRING"}
    assert read_by_suite <= set(tests["environment"])
    assert tests["environment"]["ATLAS_TEST_S3_ENDPOINT"].startswith("http://minio:")
    assert tests["environment"]["ATLAS_TEST_GCS_ENDPOINT"].startswith("http://fake-gcs:")
    assert "BlobEndpoint=http://azurite:" in tests["environment"]["ATLAS_TEST_AZURE_CONNECTION_STRING"]
    assert "python -m pytest" in tests["command"] and {"minio", "fake-gcs", "azurite"} <= set(tests["depends_on"])
