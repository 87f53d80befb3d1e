"""The sourcegate_reports Airflow plugin: serves a run's report and gate verdict, nothing else."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from urllib.parse import unquote

import pytest
from markupsafe import escape

# Keep Airflow's home out of ~/airflow when this module is the first to import airflow.
os.environ.setdefault("AIRFLOW_HOME", str(Path(tempfile.gettempdir()) / "sourcegate-pytest-airflow-home"))

from fastapi import FastAPI  # noqa: E402
from fastapi.testclient import TestClient  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
PLUGINS = ROOT / "plugins"
RUN = "20250101-020000"
SECRET = "top secret, outside the artifacts"


@pytest.fixture(scope="module")
def plugin_module():
    from sourcegate.plugins import reports

    return reports


@pytest.fixture
def artifacts(tmp_path) -> Path:
    """An artifacts folder with one run, a LIVE pointer, and a secret beside (outside) it."""
    root = tmp_path / "artifacts"
    run = root / "runs" / RUN
    run.mkdir(parents=True)
    (run / "report.html").write_text("<html><body>calibration report</body></html>")
    (run / "gate.json").write_text(json.dumps({"passed": True, "reasons": []}))
    (run / "chunks.parquet").write_bytes(b"PAR1 not for the browser")
    (root / "LIVE").write_text(RUN + "\n")
    (tmp_path / "secret").write_text(SECRET)
    (root / "secret").write_text(SECRET)  # inside artifacts/ but outside runs/
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "gate.json").write_text(SECRET)
    (outside / "report.html").write_text(SECRET)
    return root


def mounted(module, artifacts: Path) -> FastAPI:
    """The app mounted the way Airflow's API server mounts plugin apps (url_prefix /sourcegate)."""
    parent = FastAPI()
    parent.mount(module.URL_PREFIX, module.create_app(artifacts, require_auth=False))
    return parent


@pytest.fixture
def client(plugin_module, artifacts) -> TestClient:
    return TestClient(mounted(plugin_module, artifacts))


def raw_get(app, raw_path: str) -> tuple[int, bytes]:
    """GET with the path exactly as given: HTTP clients (httpx too) normalise `..` away before sending."""
    messages: list[dict] = []
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "GET",
        "scheme": "http",
        "path": unquote(raw_path),
        "raw_path": raw_path.encode(),
        "root_path": "",
        "query_string": b"",
        "headers": [(b"host", b"testserver")],
        "server": ("testserver", 80),
        "client": ("127.0.0.1", 1234),
    }

    requested = False

    async def receive():
        nonlocal requested
        if requested:  # a client still connected: a streaming response listens for a disconnect that never comes
            await asyncio.Event().wait()
        requested = True
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message):
        messages.append(message)

    asyncio.run(app(scope, receive, send))
    status = next(m["status"] for m in messages if m["type"] == "http.response.start")
    return status, b"".join(m.get("body", b"") for m in messages if m["type"] == "http.response.body")


def test_serves_report_and_gate(client):
    r = client.get(f"/sourcegate/runs/{RUN}/report.html")
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/html")
    assert "calibration report" in r.text
    r = client.get(f"/sourcegate/runs/{RUN}/gate.json")
    assert r.status_code == 200
    assert r.json() == {"passed": True, "reasons": []}


def test_index_lists_runs_with_links(client):
    r = client.get("/sourcegate/runs")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    assert f'href="/sourcegate/runs/{RUN}/report.html"' in r.text
    assert f'href="/sourcegate/runs/{RUN}/gate.json"' in r.text
    assert "(live)" in r.text and "passed" in r.text
    assert "chunks.parquet" not in r.text


def test_index_escapes_run_names(plugin_module, artifacts, client):
    evil = """<img src=x onerror="alert('x')">&amp;"""  # a folder name cannot hold "/"
    (artifacts / "runs" / evil).mkdir()
    (artifacts / "runs" / evil / "gate.json").write_text("{}")
    r = client.get("/sourcegate/runs")
    assert r.status_code == 200
    assert "<img" not in r.text
    assert str(escape(evil)) in r.text
    assert "/gate.json" not in r.text.split(str(escape(evil)))[1].split("</tr>")[0]  # not a valid run id: no links


def test_missing_and_unknown_files(client):
    assert client.get(f"/sourcegate/runs/{RUN}/calibration.json").status_code == 404  # allowed, absent
    for name in ("chunks.parquet", "secret", "run.json.bak", "documents.parquet", "index"):
        assert client.get(f"/sourcegate/runs/{RUN}/{name}").status_code == 404
    assert client.get("/sourcegate/runs/20991231-000000/report.html").status_code == 404


# Traversal attempts, as paths under the mount (tests/test_plugin_s3.py sends them to a bucket too).
TRAVERSALS = [
    "/sourcegate/runs/..%2f..%2fetc/passwd",
    "/sourcegate/runs/..%2f..%2fsecret",
    "/sourcegate/runs/x/../../secret",
    "/sourcegate/runs/../secret",
    "/sourcegate/runs/%2e%2e/secret",
    "/sourcegate/runs/%2e%2e/gate.json",
    "/sourcegate/runs/%2e%2e%2f%2e%2e/gate.json",
    "/sourcegate/runs/%2Fetc/passwd",
    "/sourcegate/runs//etc/passwd/gate.json",
    "/sourcegate/runs/../../outside/gate.json",
]


@pytest.mark.parametrize("path", TRAVERSALS)
def test_rejects_traversal(plugin_module, artifacts, client, path):
    r = client.get(path)  # as a client sends it (normalised)
    assert r.status_code in (400, 404), (path, r.status_code)
    assert SECRET not in r.text
    status, body = raw_get(mounted(plugin_module, artifacts), path)  # as a raw request line
    assert status in (400, 404), (path, status)
    assert SECRET.encode() not in body


def test_rejects_symlinks_pointing_outside(artifacts, client):
    outside = artifacts.parent / "outside"
    (artifacts / "runs" / "linked").symlink_to(outside, target_is_directory=True)
    assert client.get("/sourcegate/runs/linked/gate.json").status_code == 404
    assert client.get("/sourcegate/runs/linked/report.html").status_code == 404
    (artifacts / "runs" / RUN / "run.json").symlink_to(artifacts.parent / "secret")
    r = client.get(f"/sourcegate/runs/{RUN}/run.json")
    assert r.status_code == 404 and SECRET not in r.text
    index = client.get("/sourcegate/runs").text
    assert "linked" not in index  # not offered either


def test_requires_an_airflow_user_by_default(plugin_module, artifacts):
    parent = FastAPI()
    parent.mount("/sourcegate", plugin_module.create_app(artifacts))
    c = TestClient(parent)
    assert c.get("/sourcegate/runs").status_code == 401
    assert c.get(f"/sourcegate/runs/{RUN}/gate.json").status_code == 401


PLUGIN_CHECK = r"""
import json
from airflow import plugins_manager
from airflow.api_fastapi.app import init_plugins
from fastapi import FastAPI
from fastapi.testclient import TestClient

plugins, errors = plugins_manager._get_plugins()
views, _ = plugins_manager._get_ui_plugins()
app = FastAPI()
init_plugins(app)  # what Airflow's API server does with plugin apps
print(json.dumps({
    "plugins": [p.name for p in plugins],
    "errors": {str(k): v for k, v in errors.items()},
    "fastapi": [(a["name"], a["url_prefix"]) for a in plugins_manager.get_fastapi_plugins()[0]],
    "views": [(v["name"], v["href"], v.get("url_route")) for v in views],
    "anonymous": TestClient(app).get("/sourcegate/runs").status_code,
}))
"""


@pytest.mark.airflow  # Airflow itself, in a fresh interpreter
def test_discovered_by_airflow_plugin_manager(tmp_path, artifacts):
    env = {
        **os.environ,
        "AIRFLOW_HOME": str(tmp_path / "airflow_home"),
        "AIRFLOW__CORE__PLUGINS_FOLDER": str(PLUGINS),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__LAZY_LOAD_PLUGINS": "False",
        "SOURCEGATE_ARTIFACTS": str(artifacts),
    }
    out = subprocess.run(
        [sys.executable, "-c", PLUGIN_CHECK], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr[-3000:]
    info = json.loads(out.stdout.strip().splitlines()[-1])
    assert info["errors"] == {}
    assert "sourcegate_reports" in info["plugins"]
    assert ["sourcegate reports", "/sourcegate"] in info["fastapi"]
    assert ["Calibration reports", "sourcegate/runs", "sourcegate-reports"] in info["views"]
    assert info["anonymous"] == 401  # mounted, and Airflow's authentication applies
