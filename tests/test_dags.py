"""DAG structure: both DAGs import cleanly, with the tasks, dependencies and settings specified."""

from __future__ import annotations

import logging
import os
import tempfile
from pathlib import Path

import pytest

# Keep Airflow's home out of ~/airflow when this module is the first to import airflow.
os.environ.setdefault("AIRFLOW_HOME", str(Path(tempfile.gettempdir()) / "sourcegate-pytest-airflow-home"))

ROOT = Path(__file__).resolve().parents[1]
DAGS = ROOT / "dags"

NIGHTLY_UPSTREAM = {
    "ingest": set(),
    "chunk": {"ingest"},
    "embed": {"chunk"},
    "merge": {"embed"},
    "validate": {"merge"},
    "load": {"validate"},
    "evaluate": {"load"},
    "gate": {"evaluate"},
    "promote": {"gate"},
    "cleanup": {"promote"},
}
RECAL_UPSTREAM = {
    "live_version": set(),
    "evaluate": {"live_version"},
    "gate": {"evaluate"},
    # beside the gate: retrain the answer model when the corpus outgrew it, judge it, ship it only through accept
    "corpus_share": {"live_version"},
    "retrain": {"corpus_share"},
    "judge": {"retrain"},
    "ship": {"judge"},
}


@pytest.fixture(scope="module")
def dagbag():
    from airflow.dag_processing.dagbag import DagBag

    return DagBag(str(DAGS))


@pytest.fixture(scope="module")
def common():
    from sourcegate.dags import common

    return common


def upstream_map(dag) -> dict[str, set[str]]:
    return {t.task_id: set(t.upstream_task_ids) for t in dag.tasks}


def downstream_map(dag) -> dict[str, set[str]]:
    return {t.task_id: set(t.downstream_task_ids) for t in dag.tasks}


def inverted(upstream: dict[str, set[str]]) -> dict[str, set[str]]:
    down = {k: set() for k in upstream}
    for task, ups in upstream.items():
        for u in ups:
            down[u].add(task)
    return down


def test_no_import_errors(dagbag):
    assert dagbag.import_errors == {}
    assert set(dagbag.dags) == {"sourcegate_nightly", "sourcegate_recalibrate"}


def test_the_dag_files_only_build_the_packaged_dags():
    """The repository's DAG files are what a user's are: a call into the installed package, so both run one code."""
    for name, builder in (("sourcegate_nightly", "nightly_dag"), ("sourcegate_recalibrate", "recalibrate_dag")):
        source = (DAGS / f"{name}.py").read_text(encoding="utf-8")
        assert f"from sourcegate.dags import {builder}" in source and f"dag = {builder}()" in source
    assert sorted(p.name for p in DAGS.glob("*.py")) == ["sourcegate_nightly.py", "sourcegate_recalibrate.py"]


def test_nightly_structure(dagbag):
    dag = dagbag.dags["sourcegate_nightly"]
    assert upstream_map(dag) == NIGHTLY_UPSTREAM
    assert downstream_map(dag) == inverted(NIGHTLY_UPSTREAM)
    assert dag.max_active_runs == 1
    assert dag.catchup is False
    # a backfill would build today's corpus under N past run ids beside the night (its own max_active_runs)
    assert {t.value for t in dag.allowed_run_types} == {"scheduled", "manual", "operator_triggered"}
    # retention runs after a failed gate too, and the run's state stays promote's (a failed gate fails the run)
    assert dag.task_dict["cleanup"].is_teardown and not dag.task_dict["cleanup"].on_failure_fail_dagrun
    assert dag.start_date is not None and dag.start_date.year < 2026
    assert dag.timetable.expression == "0 2 * * *"


def test_nightly_embed_is_mapped_over_shards(dagbag):
    from airflow.sdk.definitions.xcom_arg import XComArg

    dag = dagbag.dags["sourcegate_nightly"]
    embed = dag.task_dict["embed"]
    assert embed.is_mapped
    assert [t.task_id for t in embed.iter_mapped_dependencies()] == ["chunk"]
    expand = embed.op_kwargs_expand_input.value
    assert set(expand) == {"shard"} and isinstance(expand["shard"], XComArg)
    assert expand["shard"].operator.task_id == "chunk"
    assert not dag.task_dict["merge"].is_mapped  # the reduce step


def test_nightly_params(dagbag):
    params = dagbag.dags["sourcegate_nightly"].params
    assert params["config"] == "config/pipeline.yaml"
    assert params["corpus"] is None and params["backend"] is None  # the config file's, whichever file it is
    assert params["full_rebuild"] is False
    assert params["shards"] == 2
    assert params.get_param("backend").schema["enum"] == [None, "embedded", "opensearch"]


def test_a_run_of_another_config_keeps_its_corpus_and_backend_unless_a_param_says_otherwise(common, tmp_path):
    """The UI once pre-filled corpus/demo and the demo's backend: a run of a user's config indexed the demo."""
    own = tmp_path / "mine.yaml"
    own.write_text("corpus:\n  path: /data/help-centre\nbackend:\n  kind: opensearch\n")
    cfg = common.config_of({"config": str(own), "backend": None, "corpus": None})
    assert (cfg.corpus.path, cfg.backend.kind) == ("/data/help-centre", "opensearch")
    cfg = common.config_of({"config": str(own), "backend": "embedded", "corpus": "corpus/demo"})
    assert (cfg.corpus.path, cfg.backend.kind) == (str(ROOT / "corpus" / "demo"), "embedded")


def test_retries_and_asset_outlet(dagbag):
    from airflow.sdk import Asset

    dag = dagbag.dags["sourcegate_nightly"]
    for task_id in ("load", "promote"):
        task = dag.task_dict[task_id]
        assert task.retries == 3, task_id
        assert task.retry_exponential_backoff > 1, task_id
    promote = dag.task_dict["promote"]
    assert promote.outlets == [Asset("sourcegate://live-index")]
    assert promote.trigger_rule == "all_success"
    # a task lost with its worker runs again on another only as a retry: every task of both DAGs has one (a
    # failed gate is a verdict, not a flake: enforce_gate raises AirflowFailException, which is never retried)
    assert all(t.retries >= 1 for d in dagbag.dags.values() for t in d.tasks)
    others = [t for t in dag.tasks if t.task_id != "promote"]
    assert all(not t.outlets for t in others)


def test_recalibrate_structure(dagbag, common):
    dag = dagbag.dags["sourcegate_recalibrate"]
    assert upstream_map(dag) == RECAL_UPSTREAM
    assert downstream_map(dag) == inverted(RECAL_UPSTREAM)
    assert dag.max_active_runs == 1 and dag.catchup is False
    assert "promote" not in dag.task_dict and not any(t.outlets for t in dag.tasks)
    assert common.EVAL_SETS.uri == (ROOT / "config" / "evals").as_uri()
    assert list(dag.timetable.asset_condition.objects) == [common.EVAL_SETS]
    assert set(dag.params.keys()) == {"config", "backend"}


def test_dags_serialize(dagbag):
    from airflow.serialization.serialized_objects import DagSerialization

    for dag in dagbag.dags.values():
        restored = DagSerialization.deserialize_dag(DagSerialization.serialize_dag(dag))
        assert set(restored.task_dict) == set(dag.task_dict)


def test_run_id_is_the_logical_date(common):
    import pendulum

    from sourcegate.pipelines.app.steps import RUN_ID

    when = pendulum.datetime(2025, 3, 4, 2, 0, 7, tz="UTC")
    assert common.run_id(context={"logical_date": when}) == "20250304-020007"
    assert common.run_id(context={"logical_date": when}) == common.run_id(context={"logical_date": when})
    assert (
        common.run_id(context={"logical_date": pendulum.datetime(2025, 3, 4, 3, 0, 7, tz="Europe/Berlin")})
        == "20250304-020007"
    )  # UTC, whatever the zone

    class DagRun:
        run_after = pendulum.datetime(2025, 3, 5, 9, 30, tz="UTC")

    # Asset-triggered runs have no logical date: run_after then.
    assert common.recal_run_id(context={"logical_date": None, "dag_run": DagRun()}) == "recal-20250305-093000"
    assert RUN_ID.match(common.recal_run_id(context={"logical_date": when}))


def test_config_paths_resolve_against_project_root(common, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # Airflow's cwd can be anything
    cfg = common.load_config()
    assert cfg.artifacts == str(ROOT / "artifacts")
    assert cfg.corpus.path == str(ROOT / "corpus" / "demo")
    assert cfg.evals.calibration_set == str(ROOT / "config" / "evals" / "calibration.jsonl")
    assert cfg.evals.baseline == str(ROOT / "config" / "baselines" / "precision.json")
    assert cfg.embedding.model_path is None  # "the packaged model" stays None
    custom = tmp_path / "custom.yaml"
    custom.write_text(f"artifacts: {tmp_path / 'art'}\nanswer: {{strong: 0.99, adjacent: 0.99}}\n")
    cfg = common.load_config(str(custom), {"corpus.path": common.absolute("corpus/demo")})
    assert cfg.artifacts == str(tmp_path / "art")
    assert cfg.corpus.path == str(ROOT / "corpus" / "demo")
    assert cfg.answer.strong == 0.99


def test_failed_gate_fails_the_task_with_every_reason(common, caplog):
    from airflow.sdk.exceptions import AirflowFailException

    verdict = {"passed": False, "reasons": ["no threshold gap for rerank_top", "coverage 0.93 < 1.0"]}
    with caplog.at_level(logging.INFO), pytest.raises(AirflowFailException) as err:
        common.enforce_gate(verdict)
    assert "no threshold gap for rerank_top" in str(err.value) and "coverage 0.93 < 1.0" in str(err.value)
    assert [r.getMessage() for r in caplog.records if r.getMessage().startswith("gate: ")] == [
        "gate: no threshold gap for rerank_top",
        "gate: coverage 0.93 < 1.0",
    ]
    assert common.enforce_gate({"passed": True, "reasons": []}) == {"passed": True, "reasons": []}


def test_every_path_in_the_config_is_made_absolute_for_the_tasks(common):
    """A task runs in a directory of its own: every config value that is a file path must be in PATH_KEYS
    (a check set left relative was "not found" by the gate task)."""
    from sourcegate.pipelines import config

    def paths(model, prefix=""):
        for name, field in model.model_fields.items():
            if isinstance(field.annotation, type) and issubclass(field.annotation, config.BaseModel):
                yield from paths(field.annotation, f"{prefix}{name}.")
            elif name.endswith(("_set", "_path", "path", "baseline", "combiner", "moves")) or name == "artifacts":
                yield prefix + name

    assert sorted(set(paths(config.PipelineConfig)) - set(common.PATH_KEYS)) == []


def test_the_object_store_is_reached_through_the_airflow_aws_connection(common, monkeypatch, caplog):
    """s3:// artifacts in a task: endpoint and credentials from the connection (AIRFLOW_CONN_<ID>, JSON form, read
    with Airflow's generic BaseHook), handed to pyarrow for that block only, never logged; the default aws_default
    left undefined falls back to the AWS environment, a connection the config names must exist. (That a night
    reaches the real server this way: tests/test_dag_runs.py, the recalibration on the S3 server.)"""
    import json

    from airflow.sdk.exceptions import AirflowFailException

    from sourcegate.pipelines.versions import object_store

    secret = "conn-secret-9d2e"
    conn = {"conn_type": "aws", "login": "conn-key", "password": secret}
    conn["extra"] = {"endpoint_url": "http://127.0.0.1:9555", "region_name": "eu-west-3"}
    monkeypatch.setenv("AIRFLOW_CONN_SG_STORE", json.dumps(conn))
    monkeypatch.delenv("AIRFLOW_CONN_AWS_DEFAULT", raising=False)
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")  # the connection's endpoint wins
    monkeypatch.setenv("AWS_REGION", "us-east-1")
    cfg = common.load_config(None, {"artifacts": "s3://nights/demo", "artifacts_airflow_conn_id": "sg_store"})
    built = []
    monkeypatch.setattr(object_store, "s3_filesystem", lambda: built.append(object_store._CONNECTION.get()))
    with caplog.at_level(logging.DEBUG), common.store_connection(cfg):
        object_store.s3_filesystem()  # what ObjectStore.from_uri builds its filesystem with
    assert built == [
        {
            "endpoint_override": "127.0.0.1:9555",
            "scheme": "http",
            "region": "eu-west-3",
            "access_key": "conn-key",
            "secret_key": secret,
        }
    ]
    assert object_store._CONNECTION.get() is None  # only inside the block
    assert "'sg_store'" in caplog.text and secret not in caplog.text

    # The DAGs' default, aws_default, undefined: the AWS environment (what the CLI reads).
    default = common.load_config(None, {"artifacts": "s3://nights/demo"})
    assert default.artifacts_airflow_conn_id == "aws_default"
    with common.store_connection(default):
        object_store.s3_filesystem()
    assert built[-1] is None
    with pytest.raises(AirflowFailException, match="'missing_conn': no such Airflow connection"):
        common.aws_connection_options("missing_conn")
    monkeypatch.setenv("AIRFLOW_CONN_SG_STORE", json.dumps({"conn_type": "aws", "login": "key-only"}))
    with pytest.raises(AirflowFailException, match="both login"):
        common.aws_connection_options("sg_store")
    # A local artifacts folder never reads a connection.
    with common.store_connection(common.load_config(None, {"artifacts_airflow_conn_id": "missing_conn"})):
        pass


def test_a_deployment_points_the_dags_at_its_store_with_sourcegate_artifacts(common, monkeypatch):
    """docker-compose.yml sets SOURCEGATE_ARTIFACTS=s3://…: it replaces the config file's `artifacts` in the tasks."""
    monkeypatch.setenv("SOURCEGATE_ARTIFACTS", "s3://sourcegate/nightly")
    assert common.load_config().artifacts == "s3://sourcegate/nightly"
    assert common.load_config(None, {"artifacts": "/elsewhere"}).artifacts == "/elsewhere"  # explicit wins
    monkeypatch.delenv("SOURCEGATE_ARTIFACTS")
    assert common.load_config().artifacts == str(common.PROJECT_ROOT / "artifacts")


def test_a_task_waits_its_own_time_for_the_lock_and_a_refusal_is_never_retried(common, monkeypatch, tmp_path):
    """The nightly and recalibrate DAGs share the store's lock and a recalibration's evaluate holds it for minutes:
    a task waits at least DAG_LOCK_WAIT_S, also in the steps given only a config section (chunk, embed, merge and
    validate waited the CLI's 30 s, whatever the config said), without changing the config a verdict judges. A
    refusal that the same inputs would repeat (a rerun of a night whose corpus changed) fails the task at once; a
    fault of the moment is left to the task's retries."""
    from airflow.sdk.exceptions import AirflowFailException

    from sourcegate.artifact_io.run_folder import RunFolder
    from sourcegate.pipelines.release import lock
    from sourcegate.pipelines.versions.manifest import VersionConflict

    config = common.load_config(None, {"artifacts": str(tmp_path)})
    assert config.lock.timeout_s == 30.0  # as judged: the DAG's wait is not a config value
    monkeypatch.setattr(common, "cfg", lambda: config)
    monkeypatch.setattr(common, "run_id", lambda *a: "20260101-020000")
    waits = []

    @lock.locked("probe")
    def section_step(where, chunking):
        waits.append(lock.timeout_of(lock.PipelineConfig()))

    def whole_config_step(run: RunFolder, cfg):
        waits.append(lock.timeout_of(cfg))
        section_step(run, cfg.chunking)
        return "done"

    assert common.in_store("validate", whole_config_step) == "done"
    assert waits == [common.DAG_LOCK_WAIT_S, common.DAG_LOCK_WAIT_S]
    assert lock.timeout_of(config) == 30.0  # outside a task: the config's own wait

    def conflict(run, cfg):
        raise VersionConflict("version 20260101-020000 was built from other inputs: run again with a new run id")

    with pytest.raises(AirflowFailException, match="validate: VersionConflict: version 20260101-020000"):
        common.in_store("validate", conflict)

    def flaky(run, cfg):
        raise ConnectionError("node restarting")

    with pytest.raises(ConnectionError):
        common.in_store("validate", flaky)
