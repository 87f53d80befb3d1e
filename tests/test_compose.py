"""docker-compose.yml is valid and shows the multi-worker deployment (validated, not run: no Docker here):
CeleryExecutor, two workers and a broker, artifacts on an S3-compatible service reached through an Airflow
connection, no volume holding artifacts shared by workers or the scheduler, OpenSearch as before.

Needs the `docker-compose` executable (Debian: apt-get install -y docker-compose); the test FAILS
without it rather than skipping, so CI cannot silently stop checking the deployment file.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
WORKERS = ("airflow-worker-1", "airflow-worker-2")
AIRFLOW_SERVICES = ("airflow-apiserver", "airflow-scheduler", "airflow-dag-processor", *WORKERS)
CODE = ("dags", "plugins", "config", "sourcegate", "corpus")  # mounted read-only


def compose_config(env: dict | None = None) -> dict:
    exe = shutil.which("docker-compose")
    if exe is None:
        pytest.fail("docker-compose not found: install it (Debian: apt-get install -y docker-compose)")
    # Only the variables a shell would pass, without the deployment's own (their documented defaults apply).
    base = {k: v for k, v in os.environ.items() if not k.startswith(("SOURCEGATE_", "AIRFLOW_", "COMPOSE_"))}
    proc = subprocess.run(
        [exe, "-f", "docker-compose.yml", "config"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env=base | (env or {}),
    )
    assert proc.returncode == 0, f"docker-compose config failed:\n{proc.stderr}"
    return yaml.safe_load(proc.stdout)


@pytest.fixture(scope="module")
def compose() -> dict:
    return compose_config()


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
    for name in ("opensearch", "postgres", "redis", "minio", "s3-init", "airflow-init", *AIRFLOW_SERVICES):
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
        assert env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"].startswith("postgresql"), name
        deps = svc["depends_on"]
        assert deps["opensearch"]["condition"] == "service_healthy", name
        assert deps["postgres"]["condition"] == "service_healthy", name
        assert deps["airflow-init"]["condition"] == "service_completed_successfully", name
        assert svc.get("healthcheck", {}).get("test"), f"{name} has no healthcheck"
        targets = {str(v).split(":")[1] if ":" in str(v) else str(v) for v in svc["volumes"]}
        for folder in CODE:
            assert f"/opt/sourcegate/{folder}" in targets, f"{name} does not mount {folder}"


@pytest.mark.system  # docker-compose
def test_celery_executor_with_two_workers_and_a_broker(compose):
    services = compose["services"]
    broker = services["redis"]
    assert broker["image"].startswith("redis:") and "redis-cli" in _healthcheck_cmd(broker)
    for name in AIRFLOW_SERVICES:
        env = _env(services[name])
        assert env["AIRFLOW__CORE__EXECUTOR"] == "CeleryExecutor", name
        assert env["AIRFLOW__CELERY__BROKER_URL"].startswith("redis://redis:"), name
        assert env["AIRFLOW__CELERY__RESULT_BACKEND"].startswith("db+postgresql://"), name
        assert services[name]["depends_on"]["redis"]["condition"] == "service_healthy", name
        assert env["AIRFLOW__CORE__EXECUTION_API_SERVER_URL"] == "http://airflow-apiserver:8080/execution/", name
    workers = [n for n, svc in services.items() if str(svc.get("command", "")).startswith("celery worker")]
    assert sorted(workers) == sorted(WORKERS)  # two workers, each its own service (and its own disk)
    assert len({services[w]["hostname"] for w in workers}) == 2  # distinct Celery node names, log servers
    for w in workers:
        assert "inspect ping" in _healthcheck_cmd(services[w])


@pytest.mark.system  # docker-compose
def test_artifacts_live_on_the_s3_service_reached_through_an_airflow_connection(compose):
    services = compose["services"]
    store = services["minio"]
    assert store["image"].startswith("minio/minio:RELEASE.")  # pinned, never :latest
    assert "mc ready" in _healthcheck_cmd(store)
    bucket = _env(services["s3-init"])["S3_BUCKET"]
    assert "mc mb" in " ".join(services["s3-init"]["command"])
    for name in AIRFLOW_SERVICES:
        assert _env(services[name])["SOURCEGATE_ARTIFACTS"] == f"s3://{bucket}/nightly", name
    for w in WORKERS:
        conn = json.loads(_env(services[w])["AIRFLOW_CONN_AWS_DEFAULT"])  # the JSON form the DAGs read
        assert conn["conn_type"] == "aws" and conn["extra"]["endpoint_url"] == "http://minio:9000"
        assert (
            conn["login"] == _env(store)["MINIO_ROOT_USER"] and conn["password"] == _env(store)["MINIO_ROOT_PASSWORD"]
        )
        assert services[w]["depends_on"]["s3-init"]["condition"] == "service_completed_successfully"
    for name in ("airflow-scheduler", "airflow-dag-processor"):
        assert "AIRFLOW_CONN_AWS_DEFAULT" not in _env(services[name]), f"{name} needs no store credentials"


@pytest.mark.system  # docker-compose
def test_the_runs_page_reads_the_bucket_with_a_key_that_can_only_read_it(compose):
    """The api-server serves the runs page from the bucket (plugins/, through aws_default): its connection is the
    reader s3-init makes, a user whose one policy lists the bucket and gets its objects; never the workers' key."""
    services = compose["services"]
    init = _env(services["s3-init"])
    bucket = init["S3_BUCKET"]
    conn = json.loads(_env(services["airflow-apiserver"])["AIRFLOW_CONN_AWS_DEFAULT"])
    assert conn["conn_type"] == "aws" and conn["extra"]["endpoint_url"] == "http://minio:9000"
    assert (conn["login"], conn["password"]) == (init["S3_READ_KEY"], init["S3_READ_SECRET"])
    assert conn["login"] != _env(services["minio"])["MINIO_ROOT_USER"]
    assert services["airflow-apiserver"]["depends_on"]["s3-init"]["condition"] == "service_completed_successfully"
    policy = json.loads(init["READ_POLICY"])
    granted = {
        (a, r) for st in policy["Statement"] if st["Effect"] == "Allow" for a in st["Action"] for r in st["Resource"]
    }
    assert granted == {("s3:ListBucket", f"arn:aws:s3:::{bucket}"), ("s3:GetObject", f"arn:aws:s3:::{bucket}/*")}
    script = " ".join(services["s3-init"]["command"])
    for step in (
        "mc admin policy create store sourcegate-read",
        'mc admin user add store "$$S3_READ_KEY"',
        'mc admin policy attach store sourcegate-read --user "$$S3_READ_KEY"',
    ):
        assert step in script, step


def _mounts(svc: dict) -> list[tuple[str, str, bool]]:
    """(source, target, read-only) of each volume, short or long syntax."""
    out = []
    for v in svc.get("volumes") or []:
        if isinstance(v, dict):
            out.append((str(v.get("source")), str(v["target"]), bool(v.get("read_only"))))
        else:
            parts = str(v).split(":")
            out.append((parts[0], parts[1] if len(parts) > 1 else parts[0], len(parts) > 2 and "ro" in parts[2]))
    return out


@pytest.mark.system  # docker-compose
def test_no_volume_holding_artifacts_is_shared_between_workers_or_the_scheduler(compose):
    """Share nothing but the store (DESIGN.md G9): no artifacts volume at all; what several task runners (workers,
    scheduler) mount is the project's code and configuration, read-only, so no task can leave an artifact on it."""
    services = compose["services"]
    assert "artifacts" not in (compose.get("volumes") or {})
    runners = ("airflow-scheduler", *WORKERS)
    seen: dict[str, list[str]] = {}
    for name in runners:
        for source, target, read_only in _mounts(services[name]):
            assert "artifacts" not in target and "artifacts" not in source, f"{name} mounts {source}:{target}"
            seen.setdefault(source, []).append(name)
            if len(seen[source]) > 1 or name in WORKERS:
                assert read_only, f"{name}: {source} is mounted writable"
                assert target in {f"/opt/sourcegate/{f}" for f in CODE}, f"{name} mounts {source}:{target}"
    shared = {s: names for s, names in seen.items() if len(names) > 1}
    assert shared and all(Path(s).name in CODE for s in shared), shared
    assert {s for s, *_ in _mounts(services["minio"])} == {"object-store"}  # the store's data: minio only
    for name, svc in services.items():
        if name != "minio":
            assert "object-store" not in {s for s, *_ in _mounts(svc)}, name


@pytest.mark.system  # docker-compose
def test_no_credential_is_hard_coded(compose):
    """The store's keys (and Airflow's secrets) are substituted from the environment (an .env file), with
    documented local-only defaults; a deployment's values appear wherever the defaults stood."""
    raw = (ROOT / "docker-compose.yml").read_text()
    for var in ("SOURCEGATE_S3_ACCESS_KEY", "SOURCEGATE_S3_SECRET_KEY", "AIRFLOW_JWT_SECRET", "AIRFLOW_API_SECRET_KEY"):
        assert f"${{{var}:-" in raw, f"{var} is not substituted"
    assert re.findall(r"\$\{SOURCEGATE_S3_SECRET_KEY:-([^}]*)\}", raw) == ["sourcegate-local-only-s3-secret"] * 3
    assert re.findall(r"\$\{SOURCEGATE_S3_READ_SECRET:-([^}]*)\}", raw) == ["sourcegate-local-only-read-secret"] * 2
    secret, read_secret = "deploy-secret-5b1f", "deploy-read-secret-07c2"
    deployed = compose_config(
        {
            "SOURCEGATE_S3_ACCESS_KEY": "deploy-key",
            "SOURCEGATE_S3_SECRET_KEY": secret,
            "SOURCEGATE_S3_READ_KEY": "deploy-reader",
            "SOURCEGATE_S3_READ_SECRET": read_secret,
        }
    )
    services = deployed["services"]
    assert _env(services["minio"])["MINIO_ROOT_PASSWORD"] == secret
    for w in WORKERS:
        conn = json.loads(_env(services[w])["AIRFLOW_CONN_AWS_DEFAULT"])
        assert (conn["login"], conn["password"]) == ("deploy-key", secret)
    conn = json.loads(_env(services["airflow-apiserver"])["AIRFLOW_CONN_AWS_DEFAULT"])
    assert (conn["login"], conn["password"]) == ("deploy-reader", read_secret)
    assert "local-only-s3-secret" not in yaml.safe_dump(deployed)
    assert "local-only-read-secret" not in yaml.safe_dump(deployed)


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
