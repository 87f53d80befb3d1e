"""The sourcegate_reports plugin over `artifacts: s3://…`: runs listed and served from the bucket, on the real moto
server, reached through the DAGs' Airflow connection, with the local folder's access checks."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import pytest
from markupsafe import escape

os.environ.setdefault("AIRFLOW_HOME", str(Path(tempfile.gettempdir()) / "sourcegate-pytest-airflow-home"))

from fastapi import FastAPI  # noqa: E402
from fastapi.testclient import TestClient  # noqa: E402

from tests.test_plugin import TRAVERSALS, raw_get  # noqa: E402

pytestmark = pytest.mark.s3

# The failed run is a rerun of an older logical date: newest by run.json, not by name.
PASSED, FAILED = "20250102-020000", "20250101-020000"
HOSTILE = """bad <img src=x onerror="alert('x')">"""  # an object under runs/ whose folder is no run id
SECRET = "top secret, outside runs/"
CONN_ID = "sg_reports"
BIG = 6 << 20  # a run's chunks.parquet: the index page must never read it
REPORT = "<html><body>calibration report " + "x" * (9 << 20) + "</body></html>"  # more than one streamed block


def connection_json(endpoint: str) -> str:
    from tests.s3_server import CREDENTIALS

    return json.dumps(
        {
            "conn_type": "aws",
            "login": CREDENTIALS["AWS_ACCESS_KEY_ID"],
            "password": CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
            "extra": {"endpoint_url": endpoint, "region_name": CREDENTIALS["AWS_REGION"]},
        }
    )


def run_folder(root: Path, run: str, passed: bool, started: str, report: str) -> None:
    folder = root / "runs" / run
    (folder / "index").mkdir(parents=True)
    (folder / "report.html").write_text(report)
    (folder / "gate.json").write_text(json.dumps({"passed": passed, "reasons": [] if passed else ["recall fell"]}))
    (folder / "run.json").write_text(json.dumps({"run_id": run, "started_at": started}))
    (folder / "chunks.parquet").write_bytes(os.urandom(BIG))
    (folder / "index" / "manifest.json").write_text(json.dumps({"version": run}))


@pytest.fixture(scope="module")
def reports():
    """sourcegate/plugins/reports.py, the module the plugins folder's file loads."""
    from sourcegate.plugins import reports

    return reports


@pytest.fixture(scope="module")
def bucket(s3_server, tmp_path_factory) -> str:
    """Two runs published to `s3://…/nightly` by the pipeline's own publishing (staging.publish): one passed
    and live, a newer one failed; plus a folder that is no run id, and secrets outside runs/ and outside the
    prefix."""
    from sourcegate.pipelines.app.staging import Snapshot, publish
    from sourcegate.pipelines.versions.object_store import ObjectStore, connection, connection_options
    from tests.s3_server import CREDENTIALS

    uri = s3_server.bucket("plugin-reports") + "/nightly"
    local = tmp_path_factory.mktemp("published")
    run_folder(local, PASSED, True, "2025-01-02T02:00:05+00:00", REPORT)
    run_folder(local, FAILED, False, "2025-01-03T09:30:00+00:00", "<html>failed night</html>")
    (local / "runs" / HOSTILE).mkdir()
    (local / "runs" / HOSTILE / "gate.json").write_text(json.dumps({"passed": True}))
    (local / "LIVE").write_text(PASSED + "\n")
    extra = {"endpoint_url": f"http://127.0.0.1:{s3_server.port}", "region_name": CREDENTIALS["AWS_REGION"]}
    with connection(connection_options(CREDENTIALS["AWS_ACCESS_KEY_ID"], CREDENTIALS["AWS_SECRET_ACCESS_KEY"], extra)):
        store = ObjectStore.from_uri(uri)
        outside = ObjectStore.from_uri(uri.rsplit("/", 1)[0])
    publish(store, local, Snapshot())
    for key in ("secret", "gate.json", "report.html"):  # inside the prefix, outside runs/
        store.put(key, SECRET.encode())
    outside.put("secret", SECRET.encode())  # outside the prefix
    outside.put("outside/gate.json", SECRET.encode())
    return uri


@pytest.fixture
def through_connection(s3_server, monkeypatch) -> str:
    """The Airflow connection CONN_ID points at the server; the AWS environment points nowhere."""
    for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL_S3"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")  # the connection's endpoint must win
    monkeypatch.setenv(f"AIRFLOW_CONN_{CONN_ID.upper()}", connection_json(f"http://127.0.0.1:{s3_server.port}"))
    return CONN_ID


def mounted(module, artifacts: str, conn_id: str | None) -> FastAPI:
    parent = FastAPI()
    parent.mount(module.URL_PREFIX, module.create_app(artifacts, require_auth=False, aws_conn_id=conn_id))
    return parent


@pytest.fixture
def client(reports, bucket, through_connection) -> TestClient:
    return TestClient(mounted(reports, bucket, through_connection))


def row(page: str, run: str) -> str:
    """The index table's row of `run` (its name escaped as the page shows it)."""
    return page.split(f"<td>{escape(run)}", 1)[1].split("</tr>", 1)[0]


def test_runs_published_to_the_bucket_are_listed_with_their_verdicts(client, bucket):
    r = client.get("/sourcegate/runs")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    assert r.headers["x-content-type-options"] == "nosniff"
    page = r.text
    assert f"{bucket}/runs" in page
    assert page.index(FAILED) < page.index(PASSED)  # newest first (run.json's started_at)
    assert "(live)" in row(page, PASSED) and "passed" in row(page, PASSED)
    assert "FAILED" in row(page, FAILED) and "(live)" not in row(page, FAILED)
    for run in (PASSED, FAILED):
        for name in ("report.html", "gate.json", "run.json"):
            assert f'href="/sourcegate/runs/{run}/{name}"' in row(page, run)
    assert "chunks.parquet" not in page and "manifest.json" not in page
    # A folder that is no run id: shown as text, never linked nor read (its gate.json says passed).
    assert "<img" not in page and str(escape(HOSTILE)) in page
    assert "href" not in row(page, HOSTILE) and "passed" not in row(page, HOSTILE)


def test_a_report_on_the_bucket_is_streamed_and_only_allowed_files_are_served(client):
    r = client.get(f"/sourcegate/runs/{PASSED}/report.html")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    assert r.headers["x-content-type-options"] == "nosniff"
    assert r.text == REPORT  # every block of a report larger than one read
    gate = client.get(f"/sourcegate/runs/{FAILED}/gate.json")
    assert gate.status_code == 200 and gate.json() == {"passed": False, "reasons": ["recall fell"]}
    assert client.get(f"/sourcegate/runs/{FAILED}/run.json").json()["run_id"] == FAILED
    assert client.get(f"/sourcegate/runs/{PASSED}/calibration.json").status_code == 404  # allowed, absent
    for name in ("chunks.parquet", "manifest.json", "index%2Fmanifest.json", "secret", "LIVE"):
        assert client.get(f"/sourcegate/runs/{PASSED}/{name}").status_code == 404, name
    assert client.get("/sourcegate/runs/20991231-000000/report.html").status_code == 404


@pytest.mark.parametrize(
    "path", TRAVERSALS + ["/sourcegate/runs/..%2fsecret/gate.json", f"/sourcegate/runs/{PASSED}/..%2f..%2fsecret"]
)
def test_hostile_run_ids_and_keys_never_leave_runs_on_the_bucket(reports, bucket, through_connection, path):
    app = mounted(reports, bucket, through_connection)
    assert raw_get(app, f"/sourcegate/runs/{PASSED}/gate.json")[0] == 200  # the app does reach the bucket
    r = TestClient(app).get(path)
    assert r.status_code in (400, 404), (path, r.status_code)
    assert SECRET not in r.text
    status, body = raw_get(app, path)
    assert status in (400, 404), (path, status)
    assert SECRET.encode() not in body


def test_a_key_is_checked_before_it_reaches_the_store(reports):
    """The store resolves `..` inside a key, so the key itself is refused, not only the run id."""
    from sourcegate.plugins import bucket_runs

    assert bucket_runs.run_key(PASSED, "report.html") == f"runs/{PASSED}/report.html"
    for run_id, name in ((PASSED, "chunks.parquet"), ("..", "gate.json"), (".", "gate.json"), ("a/../..", "x")):
        assert bucket_runs.run_key(run_id, name) is None, (run_id, name)
    for key in (
        "runs/../secret",
        "runs/a/../../secret",
        "runs//gate.json",
        "secret",
        "runs/a\\..\\b/gate.json",
        "runs/a\x00/gate.json",
    ):
        assert not bucket_runs.safe_key(key), key


def test_the_index_reads_records_not_run_folders(reports, bucket, through_connection, s3_server, monkeypatch):
    """Bytes from the store, counted by a relay in front of it: the page costs kilobytes although each run holds
    a 6 MB chunks.parquet, and a report costs about its own size."""
    from tests.s3_server import Relay

    relay = Relay(s3_server.port)
    try:
        monkeypatch.setenv(f"AIRFLOW_CONN_{CONN_ID.upper()}", connection_json(f"http://127.0.0.1:{relay.port}"))
        client = TestClient(mounted(reports, bucket, CONN_ID))
        assert client.get("/sourcegate/runs").status_code == 200
        _, index_bytes = relay.counts()
        print("bytes from the store: index", index_bytes)
        assert index_bytes < 256 << 10, index_bytes
        assert client.get(f"/sourcegate/runs/{PASSED}/report.html").text == REPORT
        _, after_report = relay.counts()
        assert len(REPORT) <= after_report - index_bytes < len(REPORT) + (256 << 10)
    finally:
        relay.close()


def test_the_deployed_app_reads_the_dags_location_and_falls_back_to_the_aws_environment(
    reports, bucket, s3_env, monkeypatch
):
    """No connection configured and aws_default undefined: the AWS environment, as a DAG task does."""
    monkeypatch.setenv("SOURCEGATE_ARTIFACTS", bucket)
    monkeypatch.delenv("AIRFLOW_CONN_AWS_DEFAULT", raising=False)
    parent = FastAPI()
    parent.mount(reports.URL_PREFIX, reports.deployed_app(require_auth=False))
    page = TestClient(parent).get("/sourcegate/runs")
    assert page.status_code == 200 and f"{bucket}/runs" in page.text and "(live)" in row(page.text, PASSED)


def test_a_missing_connection_or_an_unreachable_store_is_a_clear_503(reports, bucket, s3_server, monkeypatch):
    from tests.s3_server import Relay

    monkeypatch.delenv("AIRFLOW_CONN_SG_NOWHERE", raising=False)
    r = TestClient(mounted(reports, bucket, "sg_nowhere")).get("/sourcegate/runs")
    assert r.status_code == 503 and "'sg_nowhere': no such Airflow connection" in r.json()["detail"]
    relay = Relay(s3_server.port)
    relay.close()  # an endpoint that refuses connections
    monkeypatch.setenv(f"AIRFLOW_CONN_{CONN_ID.upper()}", connection_json(f"http://127.0.0.1:{relay.port}"))
    client = TestClient(mounted(reports, bucket, CONN_ID))
    for path in ("/sourcegate/runs", f"/sourcegate/runs/{PASSED}/report.html"):
        r = client.get(path)
        assert r.status_code == 503 and f"object store {bucket}" in r.json()["detail"], (path, r.text[:500])
        assert "sgtest" not in r.text  # neither the key id nor the secret
