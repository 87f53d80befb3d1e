"""Airflow plugin: serve each run's calibration report and gate verdict inside the Airflow UI.

    /sourcegate/runs                          an index of run folders (newest first) with links
    /sourcegate/runs/{run_id}/{name}          one artifact of one run, `name` from ALLOWED only

Only files under `<artifacts>/runs/` are served, and only the names in ALLOWED. Run ids must
match the pipeline's run id pattern (one path component: no `/`, no `..`), and the resolved file
(symlinks followed) must still lie inside the runs folder, so a symlinked run folder pointing
elsewhere is refused like any other traversal. The artifacts location is the DAGs' own
(sourcegate.dags.common.load_config): $SOURCEGATE_ARTIFACTS, else the `artifacts` of config/pipeline.yaml
resolved against the project folder ($SOURCEGATE_HOME, else a checkout's root). An `s3://bucket/prefix` location is
read through the DAGs' Airflow connection (bucket_runs.py).

Airflow finds the plugin through a file in its plugins folder that imports SourcegateReportsPlugin (the
repository's plugins/sourcegate_reports.py, docs/deploying.md): no entry point, so a checkout whose plugins
folder holds that file never registers it twice.

Airflow does not authenticate plugin apps: inside Airflow the app depends on Airflow's `get_user`
(the UI session cookie or a bearer token), so anonymous callers get 401.
"""

# No `from __future__ import annotations`: FastAPI reads the route annotations, and the route
# functions live inside create_app, whose imports are local.
from pathlib import Path
from urllib.parse import quote

from airflow.plugins_manager import AirflowPlugin
from jinja2 import Environment, FileSystemLoader, StrictUndefined

from sourcegate.artifact_io import run_folder as rf
from sourcegate.plugins.served import ALLOWED, NOSNIFF, gate_status, live_name, not_found, valid_run_id

URL_PREFIX = "/sourcegate"
# The runs page: autoescaped like the report, so a run folder's name is text, never markup.
_TEMPLATES = Environment(
    loader=FileSystemLoader(Path(__file__).resolve().parent / "templates"), autoescape=True, undefined=StrictUndefined
)
_TEMPLATES.filters["urlencode_all"] = lambda value: quote(str(value), safe="")


def dag_common():
    """sourcegate.dags.common, the DAGs' own reading of the config (imported when first needed: it reads the
    project's config file)."""
    from sourcegate.dags import common

    return common


def deployed_location() -> tuple[str, str | None]:
    """(artifacts, Airflow AWS connection id) exactly as the DAGs' tasks see them: SOURCEGATE_ARTIFACTS, else the
    config file's `artifacts` against the project root; the connection `artifacts_airflow_conn_id` or aws_default."""
    cfg = dag_common().load_config()
    return cfg.artifacts, cfg.artifacts_airflow_conn_id


def create_app(artifacts_root: str | Path, *, require_auth: bool = True, aws_conn_id: str | None = None):
    """The reports app for `artifacts_root` (a folder, or `s3://bucket/prefix` reached through the Airflow
    connection `aws_conn_id`, default aws_default); routes are relative to where it is mounted (/sourcegate).

    With `require_auth` (the default; tests turn it off) every route depends on Airflow's authenticated
    user, so it needs Airflow's API server auth manager to let anyone in.
    """
    from fastapi import Depends, FastAPI, Request
    from fastapi.responses import HTMLResponse

    from sourcegate.pipelines.versions.object_store import is_remote

    if is_remote(artifacts_root):
        from sourcegate.plugins.bucket_runs import BucketRuns  # imported only by a deployment with a bucket

        source = BucketRuns(str(artifacts_root), aws_conn_id)
    else:
        source = FolderRuns(Path(artifacts_root).expanduser().resolve() / rf.RUNS)
    dependencies = []
    if require_auth:
        from airflow.api_fastapi.core_api.security import get_user

        dependencies.append(Depends(get_user))
    app = FastAPI(
        title="sourcegate reports", dependencies=dependencies, docs_url=None, redoc_url=None, openapi_url=None
    )

    @app.get("/runs", response_class=HTMLResponse)
    def runs_index(request: Request) -> HTMLResponse:
        base = request.scope.get("root_path", "").rstrip("/") + "/runs/"  # where the app is mounted
        runs = source.rows()
        page = _TEMPLATES.get_template("runs.html.j2").render(base=base, runs=runs, runs_root=source.location)
        return HTMLResponse(page, headers=NOSNIFF)

    @app.get("/runs/{run_id}/{name}")
    def run_artifact(run_id: str, name: str):
        return source.response(run_id, name)

    return app


class FolderRuns:
    """The runs of a local artifacts folder (`runs_root` = <artifacts>/runs, resolved)."""

    def __init__(self, runs_root: Path):
        self.runs_root = runs_root
        self.location = str(runs_root)

    def artifact(self, run_id: str, name: str) -> Path:
        if name not in ALLOWED or not valid_run_id(run_id):
            raise not_found()
        try:
            path = (self.runs_root / run_id / name).resolve(strict=True)
        except (OSError, RuntimeError):
            raise not_found() from None
        if not path.is_relative_to(self.runs_root) or not path.is_file():
            raise not_found()
        return path

    def response(self, run_id: str, name: str):
        from fastapi.responses import FileResponse

        return FileResponse(self.artifact(run_id, name), media_type=ALLOWED[name], headers=NOSNIFF)

    def run_folders(self) -> list[Path]:
        if not self.runs_root.is_dir():
            return []
        found = []
        for p in self.runs_root.iterdir():
            try:
                if p.is_dir() and p.resolve().is_relative_to(self.runs_root):
                    found.append(p)
            except OSError:
                continue
        return sorted(found, key=lambda p: (p.stat().st_mtime, p.name), reverse=True)  # newest first

    def rows(self) -> list[dict]:
        live = _live_version(self.runs_root.parent)
        return [
            {
                "name": folder.name,
                "live": folder.name == live,
                "gate": gate_status(_read(folder / rf.GATE)),
                "files": [n for n in ALLOWED if (folder / n).is_file()] if valid_run_id(folder.name) else [],
            }
            for folder in self.run_folders()
        ]


def _read(path: Path) -> bytes | None:
    try:
        return path.read_bytes()
    except OSError:
        return None


def _live_version(artifacts: Path) -> str | None:
    """The embedded backend's LIVE pointer, if there is one (OpenSearch keeps its alias server-side)."""
    return live_name(_read(artifacts / "LIVE"))


class LazyApp:
    """An ASGI app built on its first request. Every Airflow process loads plugins (the scheduler, each
    task's worker), but only the API server ever serves this; the others skip importing it (seconds)."""

    def __init__(self, factory):
        self.factory, self.app = factory, None

    async def __call__(self, scope, receive, send):
        if self.app is None:
            self.app = self.factory()
        await self.app(scope, receive, send)


def deployed_app(require_auth: bool = True):
    """The app over the deployment's artifacts, reached as the DAGs reach them (deployed_location)."""
    artifacts, conn_id = deployed_location()
    return create_app(artifacts, require_auth=require_auth, aws_conn_id=conn_id)


app = LazyApp(deployed_app)


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
