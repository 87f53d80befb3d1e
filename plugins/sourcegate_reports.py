"""Airflow plugin: serve each run's calibration report and gate verdict inside the Airflow UI.

    /sourcegate/runs                          an index of run folders (newest first) with links
    /sourcegate/runs/{run_id}/{name}          one artifact of one run, `name` from ALLOWED only

Only files under `<artifacts>/runs/` are served, and only the names in ALLOWED. Run ids must
match the pipeline's run id pattern (one path component: no `/`, no `..`), and the resolved file
(symlinks followed) must still lie inside the runs folder, so a symlinked run folder pointing
elsewhere is refused like any other traversal. The artifacts root is $SOURCEGATE_ARTIFACTS, or else
the `artifacts` of config/pipeline.yaml resolved against the project root (the parent of plugins/).

Airflow does not authenticate plugin apps: inside Airflow the app depends on Airflow's `get_user`
(the UI session cookie or a bearer token), so anonymous callers get 401.
"""

# No `from __future__ import annotations`: FastAPI reads the route annotations, and the route
# functions live inside create_app, whose imports are local.
import json
import os
from pathlib import Path
from urllib.parse import quote

from airflow.plugins_manager import AirflowPlugin
from jinja2 import Environment, FileSystemLoader, StrictUndefined

PROJECT_ROOT = Path(__file__).resolve().parents[1]
URL_PREFIX = "/sourcegate"
# The runs page: autoescaped like the report, so a run folder's name is text, never markup.
_TEMPLATES = Environment(
    loader=FileSystemLoader(Path(__file__).resolve().parent / "templates"), autoescape=True, undefined=StrictUndefined
)
_TEMPLATES.filters["urlencode_all"] = lambda value: quote(str(value), safe="")

# name -> media type. Everything else in a run folder (Parquet, index files, ...) is not served.
ALLOWED = {
    "report.html": "text/html; charset=utf-8",
    "gate.json": "application/json",
    "calibration.json": "application/json",
    "precision.json": "application/json",
    "junit.xml": "application/xml",
    "run.json": "application/json",
}


def _run_id_pattern():
    from pipelines.app.steps import RUN_ID  # the one definition of a valid run id

    return RUN_ID


def default_artifacts_root() -> Path:
    env = os.environ.get("SOURCEGATE_ARTIFACTS")
    if env:
        return Path(env).expanduser().resolve()
    from pipelines import config

    artifacts = Path(config.load(PROJECT_ROOT / "config" / "pipeline.yaml").artifacts).expanduser()
    return (artifacts if artifacts.is_absolute() else PROJECT_ROOT / artifacts).resolve()


def create_app(artifacts_root: str | Path, *, require_auth: bool = True):
    """The reports app for `artifacts_root`; routes are relative to where it is mounted (/sourcegate).

    With `require_auth` (the default; tests turn it off) every route depends on Airflow's authenticated
    user, so it needs Airflow's API server auth manager to let anyone in.
    """
    from fastapi import Depends, FastAPI, HTTPException, Request
    from fastapi.responses import FileResponse, HTMLResponse

    runs_root = Path(artifacts_root).expanduser().resolve() / "runs"
    run_id_ok = _run_id_pattern().match
    dependencies = []
    if require_auth:
        from airflow.api_fastapi.core_api.security import get_user

        dependencies.append(Depends(get_user))
    app = FastAPI(
        title="sourcegate reports", dependencies=dependencies, docs_url=None, redoc_url=None, openapi_url=None
    )

    def artifact(run_id: str, name: str) -> Path:
        if name not in ALLOWED or not run_id_ok(run_id) or run_id in (".", ".."):
            raise HTTPException(status_code=404, detail="not found")
        try:
            path = (runs_root / run_id / name).resolve(strict=True)
        except (OSError, RuntimeError):
            raise HTTPException(status_code=404, detail="not found") from None
        if not path.is_relative_to(runs_root) or not path.is_file():
            raise HTTPException(status_code=404, detail="not found")
        return path

    def run_folders() -> list[Path]:
        if not runs_root.is_dir():
            return []
        found = []
        for p in runs_root.iterdir():
            try:
                if p.is_dir() and p.resolve().is_relative_to(runs_root):
                    found.append(p)
            except OSError:
                continue
        return sorted(found, key=lambda p: (p.stat().st_mtime, p.name), reverse=True)  # newest first

    @app.get("/runs", response_class=HTMLResponse)
    def runs_index(request: Request) -> HTMLResponse:
        base = request.scope.get("root_path", "").rstrip("/") + "/runs/"  # where the app is mounted
        live = _live_version(runs_root.parent)
        runs = [
            {
                "name": folder.name,
                "live": folder.name == live,
                "gate": _gate_status(folder),
                "files": [n for n in ALLOWED if (folder / n).is_file()] if run_id_ok(folder.name) else [],
            }
            for folder in run_folders()
        ]
        page = _TEMPLATES.get_template("runs.html.j2").render(base=base, runs=runs, runs_root=str(runs_root))
        return HTMLResponse(page, headers={"X-Content-Type-Options": "nosniff"})

    @app.get("/runs/{run_id}/{name}")
    def run_artifact(run_id: str, name: str) -> FileResponse:
        return FileResponse(
            artifact(run_id, name), media_type=ALLOWED[name], headers={"X-Content-Type-Options": "nosniff"}
        )

    return app


def _live_version(artifacts: Path) -> str | None:
    """The embedded backend's LIVE pointer, if there is one (OpenSearch keeps its alias server-side)."""
    try:
        return (artifacts / "LIVE").read_text(encoding="utf-8").strip() or None
    except OSError:
        return None


def _gate_status(folder: Path) -> str:
    try:
        gate = json.loads((folder / "gate.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return "-"
    return "passed" if gate.get("passed") else "FAILED"


class LazyApp:
    """An ASGI app built on its first request. Every Airflow process loads plugins (the scheduler, each
    task's worker), but only the API server ever serves this; the others skip importing it (seconds)."""

    def __init__(self, factory):
        self.factory, self.app = factory, None

    async def __call__(self, scope, receive, send):
        if self.app is None:
            self.app = self.factory()
        await self.app(scope, receive, send)


app = LazyApp(lambda: create_app(default_artifacts_root(), require_auth=True))


class SourcegateReportsPlugin(AirflowPlugin):
    name = "sourcegate_reports"
    fastapi_apps = [{"app": app, "url_prefix": URL_PREFIX, "name": "sourcegate reports"}]
    # A "Calibration reports" entry in the Browse menu, rendering the run index in an iframe.
    external_views = [
        {
            "name": "Calibration reports",
            "href": URL_PREFIX.lstrip("/") + "/runs",
            "url_route": "sourcegate-reports",
            "destination": "nav",
            "category": "browse",
        }
    ]
