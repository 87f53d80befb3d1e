"""Shared wiring for the sourcegate DAGs: project paths, config, params, run ids, the gate verdict.

No pipeline logic lives here: every task body in the DAGs (nightly.py, recalibrate.py) is a call into
`sourcegate.pipelines.app.steps`. This module only turns Airflow's context (params, logical date) into
the arguments those steps take.

Paths: the project folder is sourcegate.pipelines.home.home() ($SOURCEGATE_HOME, else a checkout's root). The
config file and every relative path inside it (corpus, artifacts, model paths, eval sets, baseline) are resolved
against that folder, never against the worker's current directory, and nothing here calls os.chdir.
"""

from __future__ import annotations

import logging
import os
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pendulum
from airflow.sdk import Asset, Param, get_current_context
from airflow.sdk.exceptions import AirflowFailException, AirflowNotFoundException

from sourcegate.pipelines import config as config_mod
from sourcegate.pipelines.home import HOME_ENV, home
from sourcegate.pipelines.versions.object_store import is_remote

log = logging.getLogger(__name__)

PROJECT_ROOT = home()
DEFAULT_CONFIG = "config/pipeline.yaml"

# Proposed config key `airflow.schedule` (see the report to the lead); a constant until then.
NIGHTLY_SCHEDULE = "0 2 * * *"
START_DATE = pendulum.datetime(2025, 1, 1, tz="UTC")
DEFAULT_SHARDS = 2
OPENSEARCH_CONN_ID = "opensearch_default"  # define it with AIRFLOW_CONN_OPENSEARCH_DEFAULT or in the UI
# s3:// artifacts: endpoint and credentials (login = access key id, password = secret, extra {"endpoint_url",
# "region_name"}), e.g. AIRFLOW_CONN_AWS_DEFAULT; left undefined, a task uses its worker's AWS environment.
AWS_CONN_ID = "aws_default"
# A deployment's artifacts location (e.g. s3://bucket/prefix in docker-compose.yml): overrides the config file's
# `artifacts` for the DAGs' tasks, so every worker of a deployment writes to the same store.
ARTIFACTS_ENV = "SOURCEGATE_ARTIFACTS"

# The live alias (OpenSearch) / LIVE pointer (embedded): promote is its only producer.
LIVE_INDEX = Asset("sourcegate://live-index")
# The eval sets; an asset event on it (UI "Create Asset Event", REST API) triggers recalibration.
EVAL_SETS = Asset(name="sourcegate_eval_sets", uri=(PROJECT_ROOT / "config" / "evals").as_uri())

# Retried tasks (they talk to the backend): 3 retries, 30 s, 60 s, 120 s (capped at 10 min).
RETRY_ARGS = {
    "retries": 3,
    "retry_delay": timedelta(seconds=30),
    "retry_exponential_backoff": 2.0,
    "max_retry_delay": timedelta(minutes=10),
}

# Every task's defaults. A task lost with its worker (a Celery worker killed, its machine gone) is failed by the
# scheduler once its heartbeat stops ([scheduler] task_instance_heartbeat_timeout) and runs again only as a
# retry, on another worker (tests/test_celery_night.py). Steps are idempotent per run id and a lost try
# published nothing, so one retry redoes only the lost work; a failed gate raises AirflowFailException, which
# is never retried.
DEFAULT_ARGS = {"retries": 1, "retry_delay": timedelta(seconds=10)}

# A writing task waits this long for the store's lock at least (lock.timeout_s, if longer): the nightly and the
# recalibrate DAGs share the lock, and a recalibration's evaluate holds it for minutes; a step that waited only the
# CLI's 30 s would fail a night that merely overlapped one.
DAG_LOCK_WAIT_S = 3600.0


def refusals() -> tuple[type[BaseException], ...]:
    """Errors that are a decision on the task's inputs, not a fault of the moment: a rerun of a night whose inputs
    changed (VersionConflict), a verdict that does not bind what is promoted (VerdictMismatch), a config, eval set or
    corpus the night cannot judge. Failed at once, never retried (a retry waits minutes to fail the same way)."""
    from sourcegate.evals.preflight import PreflightError
    from sourcegate.pipelines.build.ingest import EmptyCorpus
    from sourcegate.pipelines.config import ConfigError
    from sourcegate.pipelines.release.decision import NotProven
    from sourcegate.pipelines.release.verdict import VerdictMismatch
    from sourcegate.pipelines.versions.manifest import VersionConflict

    return (VersionConflict, VerdictMismatch, NotProven, PreflightError, ConfigError, EmptyCorpus)


# Config values that are file system paths (None is left alone: "use the packaged model").
PATH_KEYS = (
    "corpus.path",
    "artifacts",
    "embedding.model_path",
    "reranker.model_path",
    "answerability.answer_model_path",
    "evals.calibration_set",
    "evals.precision_set",
    "evals.baseline",
    "evals.check_set",
    "evals.check_moves",
    "answerability.combiner",
)


def absolute(path: str | Path, root: Path = PROJECT_ROOT) -> str:
    if is_remote(path):  # s3://bucket/prefix: a location on the object store, not a path
        return str(path)
    p = Path(path).expanduser()
    return str(p if p.is_absolute() else root / p)


def resolve_paths(cfg: config_mod.PipelineConfig, root: Path = PROJECT_ROOT) -> config_mod.PipelineConfig:
    """The config with every relative path in PATH_KEYS made absolute against `root`."""
    paths = {k: absolute(v, root) for k in PATH_KEYS if (v := config_mod.get(cfg, k)) is not None}
    return config_mod.replace(cfg, paths)


def load_config(path: str | Path | None = None, overrides: dict | None = None) -> config_mod.PipelineConfig:
    """sourcegate.pipelines.config.load of `path` (relative: against the project root), paths made absolute.

    Under Airflow the OpenSearch client comes from an Airflow connection (OpenSearchHook), by
    default `opensearch_default`, unless the config file names another; the CLI reads OPENSEARCH_*.
    Likewise s3:// artifacts: the connection `artifacts_airflow_conn_id`, by default `aws_default`
    (store_connection); the CLI reads AWS_*. SOURCEGATE_ARTIFACTS, when set, is the artifacts location.
    """
    if os.environ.get(ARTIFACTS_ENV):
        overrides = {"artifacts": os.environ[ARTIFACTS_ENV], **(overrides or {})}
    cfg = resolve_paths(config_mod.load(absolute(path or DEFAULT_CONFIG), overrides))
    conn_id = cfg.backend.opensearch.airflow_conn_id or OPENSEARCH_CONN_ID
    aws_conn_id = cfg.artifacts_airflow_conn_id or AWS_CONN_ID
    return config_mod.replace(
        cfg, {"backend.opensearch.airflow_conn_id": conn_id, "artifacts_airflow_conn_id": aws_conn_id}
    )


def aws_connection_options(conn_id: str) -> dict | None:
    """S3FileSystem options from the Airflow connection `conn_id` (Airflow's generic BaseHook: the Amazon provider
    is not installed): login the access key id, password the secret, extra {"endpoint_url", "region_name",
    "aws_session_token"}. None, the worker's AWS environment, when the default `aws_default` is not defined;
    any other connection the config names must exist. Never logs or returns anything but to pyarrow."""
    from airflow.sdk import BaseHook

    from sourcegate.pipelines.versions.object_store import connection_options

    try:
        conn = BaseHook.get_connection(conn_id)
    except AirflowNotFoundException:
        if conn_id != AWS_CONN_ID:
            raise AirflowFailException(
                f"artifacts_airflow_conn_id {conn_id!r}: no such Airflow connection (define it, "
                f"e.g. AIRFLOW_CONN_{conn_id.upper()}, or leave the key null to use {AWS_CONN_ID} or AWS_*)"
            ) from None
        log.info("no Airflow connection %r: the object store is reached with the AWS environment", conn_id)
        return None
    try:
        options = connection_options(conn.login, conn.password, conn.extra_dejson)
    except ValueError as exc:
        raise AirflowFailException(f"Airflow connection {conn_id!r}: {exc}") from None
    log.info("object store endpoint and credentials from the Airflow connection %r", conn_id)
    return options


@contextmanager
def store_connection(config: config_mod.PipelineConfig):
    """With `artifacts: s3://…`, every store opened inside (staging, lock, publishing) in this task process reaches
    the store with the Airflow connection's endpoint and credentials (object_store.connection); else nothing."""
    from sourcegate.pipelines.versions.object_store import connection

    if not is_remote(config.artifacts):
        yield
        return
    with connection(aws_connection_options(config.artifacts_airflow_conn_id)):
        yield


def default_config() -> config_mod.PipelineConfig:
    """The project folder's config/pipeline.yaml, for the params' defaults shown in the UI."""
    path = Path(absolute(DEFAULT_CONFIG))
    if not path.is_file():  # an installed wheel without SOURCEGATE_HOME looks inside site-packages
        raise FileNotFoundError(
            f"{path}: no pipeline config in the project folder {PROJECT_ROOT}; set {HOME_ENV} to the folder "
            f"holding {DEFAULT_CONFIG} (docs/deploying.md)"
        )
    return config_mod.load(path)


default_config()  # a project folder without its config fails here, at parse time, naming SOURCEGATE_HOME


def config_params() -> dict:
    """Params both DAGs take: which config file, and the backend (overrides the file's backend.kind)."""
    return {
        "config": Param(
            DEFAULT_CONFIG,
            type="string",
            title="config file",
            description="pipeline config; a relative path is resolved against the project root",
        ),
        "backend": Param(  # empty: the config file's, so a run of another config file keeps that file's backend
            None,
            type=["null", "string"],
            enum=[None, *sorted(config_mod.CHOICES["backend.kind"])],
            title="search backend",
            description="overrides the config's backend.kind (empty: the config file's)",
        ),
    }


def nightly_params() -> dict:
    return {
        **config_params(),
        "corpus": Param(  # empty: the config file's (a default here would index the demo under another config)
            None,
            type=["null", "string"],
            title="corpus",
            description="corpus folder (overrides the config's corpus.path; relative: against the project root; "
            "empty: the config file's)",
        ),
        "full_rebuild": Param(
            False,
            type="boolean",
            title="full rebuild",
            description=(
                "re-encode every chunk instead of reusing the previous run's vectors, and on OpenSearch "
                "load every chunk instead of building from the live version"
            ),
        ),
        "shards": Param(
            DEFAULT_SHARDS,
            type="integer",
            minimum=1,
            maximum=64,
            title="embedding shards",
            description="embed is mapped over this many shards of the chunks",
        ),
    }


def cfg() -> config_mod.PipelineConfig:
    """The run's config: the `config` param's file with the run's param overrides, paths absolute."""
    return config_of(get_current_context()["params"])


def config_of(params: dict) -> config_mod.PipelineConfig:
    """The `config` param's file with the params that are set (backend, corpus) over it, paths absolute."""
    overrides = {}
    if params.get("backend"):
        overrides["backend.kind"] = params["backend"]
    if params.get("corpus"):
        overrides["corpus.path"] = absolute(params["corpus"])
    return load_config(params["config"], overrides)


def in_store(step: str, call, shard: tuple[int, int] | None = None, run: str | None = None):
    """A task's step call `call(run_folder, config)` on run `run` (default: the night's run_id()) under the run's
    config (read once per task): with `artifacts: s3://…`
    the folder is in a scratch folder of this task holding only what the step reads (an embed `shard`, (shard,
    shards): only its slice), published after it (sourcegate/pipelines/app/staging.py), the store reached through the
    Airflow connection (store_connection); a local artifacts folder as is."""
    from sourcegate.artifact_io.run_folder import RunFolder
    from sourcegate.pipelines.app.staging import task_staged
    from sourcegate.pipelines.config import Lock
    from sourcegate.pipelines.release.lock import task_locking

    config, run = cfg(), run or run_id()
    waits = Lock(timeout_s=max(config.lock.timeout_s, DAG_LOCK_WAIT_S), lease_s=config.lock.lease_s)
    try:
        with store_connection(config), task_locking(waits), task_staged(config, step, run, shard) as root:
            done = call(RunFolder(root, run), config)
    except refusals() as exc:  # the same inputs give the same refusal: a retry would only wait to fail again
        _say_stop(config, run, exc)
        raise AirflowFailException(f"{step}: {type(exc).__name__}: {exc}") from exc
    except BaseException as exc:
        _say_stop(config, run, exc)
        raise
    _say_stop(config, run, None)
    return done


def _say_stop(config: config_mod.PipelineConfig, run: str, exc: BaseException | None) -> None:
    """A local artifacts folder's run says where its night stopped (`sourcegate runs`), and no longer once a
    retry's step succeeded; on an object store a failed task publishes nothing, and its log says why."""
    from sourcegate.artifact_io.run_folder import RunFolder
    from sourcegate.pipelines.app.steps import record_stop

    if not is_remote(config.artifacts):
        record_stop(RunFolder(config.artifacts, run), exc)


def params() -> dict:
    return get_current_context()["params"]


def run_time(context=None) -> datetime:
    """The logical date, or for runs that have none (asset-triggered, some manual runs) run_after."""
    context = context or get_current_context()
    when = context.get("logical_date") or context["dag_run"].run_after
    return when.astimezone(UTC) if when.tzinfo else when  # run ids are UTC


def run_id(prefix: str = "", context=None) -> str:
    """The pipeline run id (run folder, index version): a pure function of the logical date,
    so re-running the same logical date reuses the same folder and index version."""
    from sourcegate.pipelines.app.steps import RUN_ID, new_run_id

    rid = (prefix + new_run_id(run_time(context))).lower()
    if not RUN_ID.match(rid):
        raise AirflowFailException(f"derived run id {rid!r} does not match {RUN_ID.pattern}")
    return rid


def recal_run_id(context=None) -> str:
    return run_id("recal-", context)


def dag_actor(context=None) -> str:
    """Who promoted, for the promotions log: this DAG run."""
    context = context or get_current_context()
    return f"dag:{context['dag_run'].run_id}"


def shard_list(chunk_count: int) -> list[int]:
    """The shards embed is mapped over: `shards` param, never more than there are chunks, at least one."""
    return list(range(max(1, min(int(params()["shards"]), chunk_count))))


def live_version(run, config: config_mod.PipelineConfig) -> str:
    """The live version, as the store staged for the task of run folder `run` holds it."""
    from sourcegate.pipelines.app.factories import open_store

    version = open_store(config, run.root).live()
    if not version:
        raise AirflowFailException("no live index to recalibrate: run sourcegate_nightly first")
    return version


def enforce_gate(gate: dict) -> dict:
    """Fail the run (no retry) when the gate failed, after logging every reason; else a small summary."""
    for reason in gate.get("reasons", []):
        (log.error if not gate["passed"] else log.info)("gate: %s", reason)
    if not gate["passed"]:
        reasons = "; ".join(gate.get("reasons") or ["no reason given"])
        raise AirflowFailException(f"calibration gate failed: {reasons}")
    return {"passed": True, "reasons": list(gate.get("reasons", []))}
