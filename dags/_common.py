"""Shared wiring for the sourcegate DAGs: project paths, config, params, run ids, the gate verdict.

No pipeline logic lives here: every task body in the DAG files is a call into
`pipelines.app.steps`. This module only turns Airflow's context (params, logical date) into
the arguments those steps take. It is listed in `.airflowignore` (not a DAG file) and
imported by the DAG files as a sibling module (Airflow puts the DAGs folder on sys.path).

Paths: the project root is the parent of `dags/`. The config file and every relative path
inside it (corpus, artifacts, model paths, eval sets, baseline) are resolved against that
root, never against the worker's current directory, and nothing here calls os.chdir.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pendulum
from airflow.sdk import Asset, Param, get_current_context
from airflow.sdk.exceptions import AirflowFailException

from pipelines import config as config_mod
from pipelines.versions.object_store import is_remote

log = logging.getLogger(__name__)

PROJECT_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_CONFIG = "config/pipeline.yaml"

# Proposed config key `airflow.schedule` (see the report to the lead); a constant until then.
NIGHTLY_SCHEDULE = "0 2 * * *"
START_DATE = pendulum.datetime(2025, 1, 1, tz="UTC")
DEFAULT_SHARDS = 2
OPENSEARCH_CONN_ID = "opensearch_default"  # define it with AIRFLOW_CONN_OPENSEARCH_DEFAULT or in the UI

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

# Config values that are file system paths (None is left alone: "use the packaged model").
PATH_KEYS = (
    "corpus.path",
    "artifacts",
    "embedding.model_path",
    "reranker.model_path",
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
    """pipelines.config.load of `path` (relative: against the project root), paths made absolute.

    Under Airflow the OpenSearch client comes from an Airflow connection (OpenSearchHook), by
    default `opensearch_default`, unless the config file names another; the CLI reads OPENSEARCH_*.
    """
    cfg = resolve_paths(config_mod.load(absolute(path or DEFAULT_CONFIG), overrides))
    conn_id = cfg.backend.opensearch.airflow_conn_id or OPENSEARCH_CONN_ID
    return config_mod.replace(cfg, {"backend.opensearch.airflow_conn_id": conn_id})


_DEFAULTS = config_mod.load(absolute(DEFAULT_CONFIG))  # for the params' defaults shown in the UI


def config_params() -> dict:
    """Params both DAGs take: which config file, and the backend (overrides the file's backend.kind)."""
    return {
        "config": Param(
            DEFAULT_CONFIG,
            type="string",
            title="config file",
            description="pipeline config; a relative path is resolved against the project root",
        ),
        "backend": Param(
            _DEFAULTS.backend.kind,
            enum=sorted(config_mod.CHOICES["backend.kind"]),
            title="search backend",
            description="overrides the config's backend.kind",
        ),
    }


def nightly_params() -> dict:
    return {
        **config_params(),
        "corpus": Param(
            _DEFAULTS.corpus.path,
            type="string",
            title="corpus",
            description="corpus folder (overrides the config's corpus.path; relative: against the project root)",
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
    params = get_current_context()["params"]
    overrides = {"backend.kind": params["backend"]}
    if params.get("corpus"):
        overrides["corpus.path"] = absolute(params["corpus"])
    return load_config(params["config"], overrides)


def in_store(step: str, call, shard: tuple[int, int] | None = None):
    """A task's step call `call(config)`: with `artifacts: s3://…`, on a scratch folder of this task holding only
    what the step reads (an embed `shard`, (shard, shards): only its slice), published after it
    (pipelines/app/staging.py); a local artifacts folder as is."""
    from pipelines.app.staging import task_staged

    with task_staged(cfg(), step, run_id(), shard) as config:
        return call(config)


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
    from pipelines.app.steps import RUN_ID, new_run_id

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


def live_version(config: dict) -> str:
    from pipelines.app.factories import open_store

    version = open_store(config).live()
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
