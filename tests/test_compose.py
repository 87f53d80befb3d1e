"""docker-compose.yml is valid and wires Airflow to OpenSearch (validated, not run: no Docker here).

Needs the `docker-compose` executable (Debian: apt-get install -y docker-compose); the test FAILS
without it rather than skipping, so CI cannot silently stop checking the deployment file.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
AIRFLOW_SERVICES = ("airflow-apiserver", "airflow-scheduler", "airflow-dag-processor")


@pytest.fixture(scope="module")
def compose() -> dict:
    exe = shutil.which("docker-compose")
    if exe is None:
        pytest.fail("docker-compose not found: install it (Debian: apt-get install -y docker-compose)")
    proc = subprocess.run(
        [exe, "-f", "docker-compose.yml", "config"], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, f"docker-compose config failed:\n{proc.stderr}"
    return yaml.safe_load(proc.stdout)


def _env(service: dict) -> dict:
    env = service.get("environment") or {}
    if isinstance(env, list):
        env = dict(item.split("=", 1) for item in env)
    return {k: str(v) for k, v in env.items()}


def _healthcheck_cmd(service: dict) -> str:
    test = service["healthcheck"]["test"]
    return " ".join(test) if isinstance(test, list) else str(test)


@pytest.mark.system  # docker-compose
def test_services_present(compose):
    services = compose["services"]
    for name in ("opensearch", "postgres", "airflow-init", *AIRFLOW_SERVICES):
        assert name in services, f"missing service {name}"


@pytest.mark.system  # docker-compose
def test_opensearch_service(compose):
    os_ = compose["services"]["opensearch"]
    assert os_["image"].startswith("opensearchproject/opensearch:2.19")
    env = _env(os_)
    assert env["discovery.type"] == "single-node"
    assert env["DISABLE_SECURITY_PLUGIN"] == "true"
    assert "-Xmx1g" in env["OPENSEARCH_JAVA_OPTS"] and "-Xms1g" in env["OPENSEARCH_JAVA_OPTS"]
    cmd = _healthcheck_cmd(os_)
    assert "curl" in cmd and "_cluster/health" in cmd


@pytest.mark.system  # docker-compose
def test_postgres_service(compose):
    pg = compose["services"]["postgres"]
    assert pg["image"].startswith("postgres:16")
    assert "pg_isready" in _healthcheck_cmd(pg)


@pytest.mark.system  # docker-compose
def test_airflow_services_wired_to_opensearch(compose):
    services = compose["services"]
    for name in AIRFLOW_SERVICES:
        svc = services[name]
        env = _env(svc)
        assert env["OPENSEARCH_URL"] == "http://opensearch:9200", name
        assert "opensearch:9200" in env["AIRFLOW_CONN_OPENSEARCH_DEFAULT"], name
        assert env["AIRFLOW__CORE__EXECUTOR"] == "LocalExecutor", name
        assert env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"].startswith("postgresql"), name
        deps = svc["depends_on"]
        assert deps["opensearch"]["condition"] == "service_healthy", name
        assert deps["postgres"]["condition"] == "service_healthy", name
        assert deps["airflow-init"]["condition"] == "service_completed_successfully", name
        assert svc.get("healthcheck", {}).get("test"), f"{name} has no healthcheck"
        targets = {str(v).split(":")[1] if ":" in str(v) else str(v) for v in svc["volumes"]}
        for folder in ("dags", "plugins", "config", "pipelines", "evals", "artifact_io", "artifacts"):
            assert f"/opt/sourcegate/{folder}" in targets, f"{name} does not mount {folder}"
        assert any(str(v).startswith("artifacts:") for v in svc["volumes"]), f"{name}: artifacts is not a volume"
    assert "artifacts" in compose["volumes"]


def test_airflow_image_matches_the_pinned_airflow():
    pin = re.search(r"^apache-airflow==([\w.]+)\s*$", (ROOT / "requirements.txt").read_text(), re.M)
    assert pin, "requirements.txt does not pin apache-airflow"
    version = pin.group(1)
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert f"ARG AIRFLOW_VERSION={version}" in dockerfile
    assert "FROM apache/airflow:${AIRFLOW_VERSION}" in dockerfile
    raw = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    assert raw["x-airflow-common"]["build"]["args"]["AIRFLOW_VERSION"] == version


def test_airflow_image_installs_the_locked_versions():
    # the image must carry the versions the suite ran on, not whatever PyPI resolves on build day
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert re.search(r"^COPY .*requirements\.lock.* /opt/sourcegate/", dockerfile, re.M)
    install = dockerfile[dockerfile.index("RUN pip install") :].split("&&")[0]
    assert "-c /opt/sourcegate/requirements.lock" in install
    assert "-r /opt/sourcegate/requirements.txt" in install
