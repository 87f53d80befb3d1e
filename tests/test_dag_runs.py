"""Real Airflow DAG runs (`dag.test()`), each in a subprocess with its own AIRFLOW_HOME and SQLite DB.

Module-scoped: one metadata DB and one artifacts folder are shared by the runs of this module, in
order: a nightly run that passes its gate and promotes; a night whose gate fails (a "safe" threshold
that declines everything) and must leave the live pointer alone; a recalibration of the live index;
and, against the real OpenSearch node, a nightly run with backend=opensearch.
A full nightly run embeds ~300 chunks and evaluates ~150 questions: minutes on 2 cores.

The cross-encoder's pair logits are exact (one pair per session run), so the runs of this module
share them: each run starts with the logits earlier runs computed (`rerank-memo.json` in the Airflow
home) and adds its own. The first night scores every pair with the real model; later runs score only
the pairs it has not seen, as one long-lived worker would.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from tests.promotable import promotable_sections

pytestmark = [pytest.mark.airflow, pytest.mark.models]  # the runs embed and rerank in their subprocesses

ROOT = Path(__file__).resolve().parents[1]
DAGS = ROOT / "dags"
RUN_TIMEOUT_S = 1800
FIRST_NIGHT = "2025-01-02T02:00:00+00:00"
FAILED_NIGHT = "2025-01-03T02:00:00+00:00"
RECAL_DAY = "2025-01-04T09:30:00+00:00"
RETRAIN_DAY = "2025-01-04T15:00:00+00:00"
OPENSEARCH_NIGHT = "2025-01-05T02:00:00+00:00"
ARTIFACT_FILES = (
    "documents.parquet",
    "chunks.parquet",
    "quality.json",
    "calibration.json",
    "precision.json",
    "gate.json",
    "junit.xml",
    "report.html",
    "run.json",
)

# Runs in the subprocess: Airflow reads its environment when first imported, so every test run
# gets a fresh interpreter with AIRFLOW_HOME etc. set before `import airflow`.
RUNNER = r"""
import json, sys
from datetime import datetime
from pathlib import Path

args = json.loads(sys.argv[1])
from airflow import settings
from airflow.dag_processing.dagbag import DagBag

if settings.Session is None:
    settings.configure_orm()

from sourcegate.pipelines.app.factories import _SCORERS, scorer_for

memo = Path(args["memo"])
if memo.exists():  # the pair logits of earlier runs (see the module docstring)
    scorer_for("onnx", None)._memo.update({(q, p): x for q, p, x in json.loads(memo.read_text())})

bag = DagBag(args["dags"])
assert not bag.import_errors, bag.import_errors
dag = bag.dags[args["dag_id"]]

if args.get("task_dirs"):  # each task (each mapped shard) runs in a fresh working directory of its own
    import os, tempfile

    def own_cwd(context):
        ti = context["ti"]
        folder = tempfile.mkdtemp(prefix=f"{ti.task_id}-{ti.map_index}-", dir=args["task_dirs"])
        os.chdir(folder)

    for t in dag.tasks:
        t.on_execute_callback = [own_cwd]
dr = dag.test(logical_date=datetime.fromisoformat(args["logical_date"]), run_conf=args["conf"],
              mark_success_pattern=args["mark_success"])

tasks = {}
for ti in dr.get_task_instances():
    key = ti.task_id if ti.map_index < 0 else f"{ti.task_id}[{ti.map_index}]"
    tasks[key] = str(ti.state.value if hasattr(ti.state, "value") else ti.state)

scorer = _SCORERS.get(("onnx", None))
if scorer is not None:
    tmp = memo.with_suffix(".tmp")
    tmp.write_text(json.dumps([[q, p, x] for (q, p), x in scorer._memo.items()]))
    tmp.replace(memo)

from sourcegate.dags import common as _common
from sourcegate.pipelines.app.factories import open_store
cfg = _common.load_config(args["conf"]["config"], {"backend.kind": args["conf"].get("backend", "embedded")})
with _common.store_connection(cfg):  # s3:// artifacts: as the tasks reach the store
    live = open_store(cfg).live()
print("SUMMARY " + json.dumps({"state": str(getattr(dr.state, "value", dr.state)), "run_id": dr.run_id,
                               "tasks": tasks, "live": live}), flush=True)
"""


class Airflow:
    """One isolated Airflow installation (home, SQLite DB) running this checkout's DAGs."""

    def __init__(self, home: Path):
        self.home = home
        home.mkdir(parents=True, exist_ok=True)
        (home / "plugins").mkdir(exist_ok=True)
        self.env = {
            **os.environ,
            "AIRFLOW_HOME": str(home),
            "AIRFLOW__CORE__DAGS_FOLDER": str(DAGS),
            "AIRFLOW__CORE__PLUGINS_FOLDER": str(home / "plugins"),  # the DAG runs do not need plugins
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home / 'airflow.db'}",
            "AIRFLOW__CORE__UNIT_TEST_MODE": "False",
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "TQDM_DISABLE": "1",
        }
        self.runs = 0

    def migrate(self) -> None:
        out = subprocess.run(
            [sys.executable, "-m", "airflow", "db", "migrate"],
            env=self.env,
            cwd=self.home,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert out.returncode == 0, f"airflow db migrate failed:\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}"

    def test_dag(
        self,
        dag_id: str,
        logical_date: str,
        conf: dict,
        mark_success: str | None = None,
        env: dict | None = None,
        task_dirs: Path | None = None,
    ) -> dict:
        """dag.test() one run in a fresh interpreter (cwd: a scratch folder, not the project);
        returns {state, run_id, tasks: {task[map]: state}, live}. Tasks matching the regex
        `mark_success` are marked successful without running; `env` adds to the run's environment; with
        `task_dirs`, each task runs in a fresh working directory made under it."""
        self.runs += 1
        log = self.home / f"run-{self.runs}-{dag_id}.log"
        cwd = self.home / "cwd"
        cwd.mkdir(exist_ok=True)
        args = json.dumps(
            {
                "dags": str(DAGS),
                "dag_id": dag_id,
                "logical_date": logical_date,
                "conf": conf,
                "mark_success": mark_success,
                "memo": str(self.home / "rerank-memo.json"),
                "task_dirs": str(task_dirs) if task_dirs else None,
            }
        )
        with log.open("w") as fh:  # dag.test logs every task's output to stdout
            out = subprocess.run(
                [sys.executable, "-c", RUNNER, args],
                env={**self.env, **(env or {})},
                cwd=cwd,
                stdout=fh,
                stderr=subprocess.STDOUT,
                timeout=RUN_TIMEOUT_S,
            )
        text = log.read_text(errors="replace")
        lines = [ln for ln in text.splitlines() if ln.startswith("SUMMARY ")]
        assert out.returncode == 0 and lines, f"dag.test of {dag_id} crashed (log {log}):\n{text[-6000:]}"
        summary = json.loads(lines[-1][len("SUMMARY ") :])
        summary["log"] = str(log)
        return summary


def write_config(path: Path, artifacts: Path | str, **sections) -> str:
    """The project's config/pipeline.yaml with artifacts elsewhere and `sections` merged in
    (key by key; its relative paths still resolve against the project root)."""
    import yaml

    def merge(base: dict, extra: dict) -> dict:
        for key, value in extra.items():
            base[key] = merge(base.get(key) or {}, value) if isinstance(value, dict) else value
        return base

    body = yaml.safe_load((ROOT / "config" / "pipeline.yaml").read_text())
    merge(body, promotable_sections())  # a gate that can pass (tests/promotable.py)
    merge(body, {"artifacts": str(artifacts), **sections})
    path.write_text(yaml.safe_dump(body, sort_keys=False))
    return str(path)


def read_json(path: Path) -> dict:
    return json.loads(path.read_text())


def failed_tasks(summary: dict) -> str:
    bad = {k: v for k, v in summary["tasks"].items() if v != "success"}
    return f"tasks not successful: {bad}; log: {summary['log']}"


# --- the embedded backend: pass, fail, recalibrate ---------------------------------------------------


@pytest.fixture(scope="module")
def airflow(tmp_path_factory) -> Airflow:
    af = Airflow(tmp_path_factory.mktemp("airflow_home"))
    af.migrate()
    return af


@pytest.fixture(scope="module")
def workspace(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("sourcegate")
    artifacts = root / "artifacts"
    return {
        "artifacts": artifacts,
        "passing": write_config(root / "passing.yaml", artifacts),
        # A "safe" threshold that declines everything: should-answer coverage collapses.
        "declining": write_config(root / "declining.yaml", artifacts, answer={"adjacent": 0.99, "strong": 0.99}),
    }


@pytest.fixture(scope="module")
def first_night(airflow, workspace) -> dict:
    conf = {"config": workspace["passing"], "corpus": "corpus/demo", "backend": "embedded", "shards": 2}
    return airflow.test_dag("sourcegate_nightly", FIRST_NIGHT, conf)


def test_nightly_run_passes_and_promotes(first_night, workspace):
    run_id = "20250102-020000"
    assert first_night["state"] == "success", failed_tasks(first_night)
    expected = {
        "ingest",
        "chunk",
        "embed[0]",
        "embed[1]",
        "merge",
        "validate",
        "load",
        "evaluate",
        "gate",
        "promote",
        "cleanup",
    }
    assert set(first_night["tasks"]) == expected
    assert all(state == "success" for state in first_night["tasks"].values()), failed_tasks(first_night)
    folder = workspace["artifacts"] / "runs" / run_id
    for name in ARTIFACT_FILES:
        assert (folder / name).is_file(), f"{name} missing from {folder}"
    gate = read_json(folder / "gate.json")
    assert gate["passed"] is True, gate.get("reasons")
    assert (workspace["artifacts"] / "LIVE").read_text().strip() == run_id
    assert first_night["live"] == run_id
    info = read_json(folder / "run.json")
    assert info["promoted"]["version"] == run_id
    assert info["counts"]["embedded"] > 0 and info["counts"]["indexed"] == info["counts"]["chunks"]
    assert info["corpus"] == str(ROOT / "corpus" / "demo")  # resolved against the project, not the cwd


def test_failed_gate_fails_the_run_and_keeps_the_live_index(airflow, workspace, first_night):
    assert first_night["state"] == "success", "needs the first night to have promoted"
    conf = {"config": workspace["declining"], "backend": "embedded", "shards": 2}
    night = airflow.test_dag("sourcegate_nightly", FAILED_NIGHT, conf)
    assert night["state"] == "failed"
    tasks = night["tasks"]
    for task in ("ingest", "chunk", "embed[0]", "embed[1]", "merge", "validate", "load", "evaluate"):
        assert tasks[task] == "success", failed_tasks(night)
    assert tasks["gate"] == "failed"
    assert tasks["promote"] == "upstream_failed"
    assert tasks["cleanup"] == "success"  # a teardown: retention after a failed gate too; the run is still failed
    folder = workspace["artifacts"] / "runs" / "20250103-020000"
    gate = read_json(folder / "gate.json")
    assert gate["passed"] is False and gate["reasons"]
    assert (folder / "report.html").is_file() and (folder / "index").is_dir()  # kept for inspection
    assert (workspace["artifacts"] / "LIVE").read_text().strip() == "20250102-020000"
    assert night["live"] == "20250102-020000"
    assert "promoted" not in read_json(folder / "run.json")
    log = Path(night["log"]).read_text(errors="replace")
    assert "calibration gate failed" in log and gate["reasons"][0][:60] in log  # the reasons are in the task log
    # Cache: the second night re-encoded nothing that the first one had embedded.
    assert read_json(folder / "run.json")["counts"]["embedded"] == 0


def test_recalibrate_evaluates_the_live_version(airflow, workspace, first_night):
    assert first_night["state"] == "success", "needs a live index"
    conf = {"config": workspace["passing"], "backend": "embedded"}
    run = airflow.test_dag("sourcegate_recalibrate", RECAL_DAY, conf)
    assert run["state"] == "success", failed_tasks(run)
    # the answer model of these nights is generic: nothing to retrain, corpus_share skips the rest
    retrain = {"corpus_share": "success", "retrain": "skipped", "judge": "skipped", "ship": "skipped"}
    assert run["tasks"] == {"live_version": "success", "evaluate": "success", "gate": "success", **retrain}
    folder = workspace["artifacts"] / "runs" / "recal-20250104-093000"
    info = read_json(folder / "run.json")
    assert info["evaluated_version"] == "20250102-020000"
    for name in ("calibration.json", "precision.json", "gate.json", "junit.xml", "report.html"):
        assert (folder / name).is_file(), name
    assert read_json(folder / "gate.json")["passed"] is True
    assert not (folder / "index").exists()  # no reindexing
    assert (workspace["artifacts"] / "LIVE").read_text().strip() == "20250102-020000"


def test_recalibrate_retrains_an_answer_model_the_corpus_outgrew_and_judges_it(
    airflow, workspace, first_night, tmp_path
):
    """The live version holds sections the configured answer model never learned (tests/outgrown.py: a tiny model
    whose record leaves out a fifth of them): the recalibrate DAG retrains it by its recipe on the live version,
    judges it in its own run folder and ships it through accept only if it passed; the run says which and why."""
    from sourcegate.pipelines.app import retrain_step
    from tests.outgrown import outgrown

    assert first_night["state"] == "success", "needs a live index"
    made = outgrown(tmp_path, workspace["artifacts"], "20250102-020000")
    files = [made["config_file"], *sorted((tmp_path / "evals").iterdir()), tmp_path / "baseline.json"]
    before = {p: p.read_bytes() for p in files}
    run = airflow.test_dag(
        "sourcegate_recalibrate", RETRAIN_DAY, {"config": str(made["config_file"]), "backend": "embedded"}
    )
    for task in ("live_version", "evaluate", "corpus_share", "retrain", "judge", "ship"):
        assert run["tasks"][task] == "success", failed_tasks(run)
    folder = workspace["artifacts"] / "runs" / "recal-20250104-150000-retrained"
    record = read_json(folder / retrain_step.RECORD)
    assert record["trained"]["version"] == "20250102-020000" and record["trained"]["seeds"] == ["13"]
    assert (folder / "answer_model" / "learned_corpus.json").is_file() and (folder / "report.html").is_file()
    gate = read_json(folder / "gate.json")
    assert gate["gating_signal"] == "answer_support"
    assert record["judged"]["ship"] == all(c["passed"] for c in gate["checks"] if c["name"] in retrain_step.SHIP_CHECKS)
    assert record["shipped"]["shipped"] == record["judged"]["ship"]
    log = Path(run["log"]).read_text(errors="replace")
    assert "retrain: " in log and "below 95%" in log
    if record["shipped"]["shipped"]:  # through accept: the config names the new model, the check set is retired
        from sourcegate.pipelines import config

        after = config.load(made["config_file"])
        assert after.answerability.answer_model_path == record["shipped"]["model"]
        assert (after.answer.signal, after.answer.adjacent) == (
            "answer_support",
            record["judged"]["threshold"]["adjacent"],
        )
        assert after.evals.check_set == str(tmp_path / "evals" / "next.jsonl")
        assert read_json(tmp_path / "baseline.json")["accepted_from"] == "runs/recal-20250104-150000-retrained"
        assert "role: retired" in (tmp_path / "evals" / "sets.yaml").read_text()
    else:  # the old model stays: nothing of the deployment changed, and the record says why
        assert {p: p.read_bytes() for p in files} == before
        assert record["shipped"]["why"].startswith("the old model stays: ")
    assert (workspace["artifacts"] / "LIVE").read_text().strip() == "20250102-020000"


def test_rerunning_a_night_reuses_its_run_folder(airflow, workspace, first_night):
    """Re-running the failed night (same logical date) rebuilds the same folder and index version:
    nothing is duplicated and the live index is untouched. Evaluation and what follows are marked
    success without running here: this run is about the build half."""
    assert first_night["state"] == "success"
    runs = workspace["artifacts"] / "runs"
    assert (runs / "20250103-020000").is_dir(), "needs the failed night"
    before = sorted(p.name for p in runs.iterdir())
    conf = {"config": workspace["declining"], "backend": "embedded", "shards": 2}
    # Same metadata DB: dag.test clears the earlier run of this logical date and runs it again.
    rerun = airflow.test_dag("sourcegate_nightly", FAILED_NIGHT, conf, mark_success="evaluate|gate|promote|cleanup")
    assert rerun["state"] == "success", failed_tasks(rerun)
    assert sorted(p.name for p in runs.iterdir()) == before
    from sourcegate.pipelines.search.embedded import EmbeddedStore

    versions = EmbeddedStore(runs, workspace["artifacts"] / "LIVE").versions()
    assert versions == ["20250102-020000", "20250103-020000"]
    assert read_json(runs / "20250103-020000" / "run.json")["run_id"] == "20250103-020000"
    assert (workspace["artifacts"] / "LIVE").read_text().strip() == "20250102-020000"


# --- the OpenSearch backend -----------------------------------------------------------------------------


def opensearch_hook_only_env() -> dict:
    """The node (OPENSEARCH_URL) as the Airflow connection opensearch_default, and OPENSEARCH_URL itself on a closed
    port: a task that built its client from the environment instead of the hook fails."""
    from sourcegate.pipelines.search.opensearch.client import config_from_env

    node = urlsplit(config_from_env().url)
    return {
        "AIRFLOW_CONN_OPENSEARCH_DEFAULT": f"opensearch://{node.hostname}:{node.port or 9200}?timeout=120",
        "OPENSEARCH_URL": "http://127.0.0.1:9",  # discard port
    }


@pytest.mark.opensearch
def test_nightly_run_on_opensearch(airflow, tmp_path):
    """backend=opensearch against the real node (OPENSEARCH_URL, default http://127.0.0.1:9200;
    `scripts/opensearch start`). A private index prefix keeps the node's own alias untouched.
    The tasks reach the node only through the Airflow connection (OpenSearchHook) defined by
    AIRFLOW_CONN_OPENSEARCH_DEFAULT: OPENSEARCH_URL points at a closed port inside the run."""
    prefix = f"sgtest-{uuid.uuid4().hex[:8]}"
    artifacts = tmp_path / "artifacts"
    config = write_config(
        tmp_path / "opensearch.yaml", artifacts, backend={"kind": "opensearch", "opensearch": {"index_prefix": prefix}}
    )
    conf = {"config": config, "corpus": "corpus/demo", "backend": "opensearch", "shards": 2}
    from sourcegate.pipelines.search.opensearch.client import client_from_env, config_from_env, redact_url

    client = client_from_env()
    try:
        client.info()
    except Exception as exc:  # fail, not skip: the node is part of the test environment
        pytest.fail(
            f"OpenSearch at {redact_url(config_from_env().url)} is not reachable ({exc}); run scripts/opensearch start"
        )
    try:
        night = airflow.test_dag("sourcegate_nightly", OPENSEARCH_NIGHT, conf, env=opensearch_hook_only_env())
        assert night["state"] == "success", failed_tasks(night)
        assert all(state == "success" for state in night["tasks"].values()), failed_tasks(night)
        run_id = "20250105-020000"
        folder = artifacts / "runs" / run_id
        assert read_json(folder / "gate.json")["passed"] is True
        assert read_json(folder / "run.json")["backend"] == "opensearch"
        assert night["live"] == run_id  # the alias <prefix> -> <prefix>-20250105-020000
        assert not (artifacts / "LIVE").exists()  # the embedded pointer is not the OpenSearch alias
    finally:
        client.indices.delete(index=f"{prefix}-*", params={"ignore_unavailable": "true"})


# --- artifacts on an object store (issue 23) ------------------------------------------------------------


def tree(folder: Path) -> dict[str, float]:
    """Every path under `folder` with its mtime (what a run must leave as it found it)."""
    return {str(p): p.stat().st_mtime for p in folder.rglob("*")} if folder.exists() else {}


S3_NIGHT = "2025-01-06T02:00:00+00:00"
S3_RECAL_DAY = "2025-01-07T09:30:00+00:00"


def task_dir_names(task_dirs: Path) -> list[str]:
    return sorted(p.name.rsplit("-", 1)[0] for p in task_dirs.iterdir())


def left_behind(task_dirs: Path, scratch: Path) -> list[str]:
    """Files (or an artifacts folder) left in the tasks' working directories, and staging folders not removed."""
    return [str(p) for p in task_dirs.rglob("*") if p.is_file() or p.name == "artifacts"] + [
        str(p) for p in scratch.glob("sourcegate-stage-*")
    ]


@pytest.fixture(scope="module")
def s3_night(airflow, s3_server, tmp_path_factory):
    """sourcegate_nightly with artifacts on the moto server, reached through the standard AWS environment (the
    fallback when no Airflow connection is defined); every task in a fresh working directory of its own."""
    from sourcegate.pipelines.versions.object_store import ObjectStore
    from tests.test_object_store import _server_fs

    tmp = tmp_path_factory.mktemp("s3-dag")
    uri = s3_server.bucket("dag-nights") + "/sourcegate"
    config = write_config(tmp / "s3.yaml", uri)
    task_dirs, scratch = tmp / "tasks", tmp / "tmp"
    task_dirs.mkdir(), scratch.mkdir()
    project_artifacts = tree(ROOT / "artifacts")
    conf = {"config": config, "corpus": "corpus/demo", "backend": "embedded", "shards": 2}
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")} | s3_server.env | {"TMPDIR": str(scratch)}
    night = airflow.test_dag("sourcegate_nightly", S3_NIGHT, conf, env=env, task_dirs=task_dirs)
    store = ObjectStore.from_uri(uri, fs=_server_fs(s3_server))
    return {
        "night": night,
        "uri": uri,
        "config": config,
        "store": store,
        "task_dirs": task_dirs,
        "scratch": scratch,
        "project_artifacts": project_artifacts,
        "tmp": tmp,
    }


@pytest.mark.s3
def test_nightly_run_with_artifacts_on_the_s3_server_shares_nothing_but_the_store(s3_night):
    """Every task in its own working directory, each staging only what its step reads into its own scratch
    folder (removed after): the night passes and promotes on the moto server, and no task writes a local
    artifacts folder, the project's included."""
    night, store, uri = s3_night["night"], s3_night["store"], s3_night["uri"]
    assert night["state"] == "success", failed_tasks(night)
    assert all(state == "success" for state in night["tasks"].values()), failed_tasks(night)
    run_id = "20250106-020000"
    assert night["live"] == run_id

    assert store.get("LIVE").decode().strip() == run_id
    keys = store.listing(f"runs/{run_id}/")
    for name in ARTIFACT_FILES + ("index/manifest.json", "embed/shard-0000.parquet", "embed/shard-0001.parquet"):
        assert name in {k.split("/", 2)[2] for k in keys}, f"{name} not published"
    assert json.loads(store.get(f"runs/{run_id}/gate.json"))["passed"] is True
    info = json.loads(store.get(f"runs/{run_id}/run.json"))
    assert info["config"]["artifacts"] == uri and info["promoted"]["version"] == run_id
    assert len(store.listing("promotions/")) == 1

    dirs = task_dir_names(s3_night["task_dirs"])
    assert dirs == sorted(
        ["cleanup--1", "chunk--1", "embed-0", "embed-1", "evaluate--1", "gate--1", "ingest--1", "load--1"]
        + ["merge--1", "promote--1", "validate--1"]
    ), dirs  # one working directory per task, mapped shards included
    assert not left_behind(s3_night["task_dirs"], s3_night["scratch"])  # every task removed its scratch folder
    assert tree(ROOT / "artifacts") == s3_night["project_artifacts"]  # the project's artifacts folder untouched


@pytest.mark.s3
def test_recalibrate_on_the_s3_server_shares_nothing_and_reads_the_store_through_the_airflow_connection(
    airflow, s3_night, s3_server, tmp_path
):
    """sourcegate_recalibrate of the live version on the server, each task in its own working directory, the store
    reached only through the Airflow connection aws_default (AIRFLOW_CONN_AWS_DEFAULT, JSON form): the AWS
    environment has no credentials and its endpoint is a closed port. The secret appears in no log or object."""
    from tests.s3_server import CREDENTIALS, SECRET

    assert s3_night["night"]["state"] == "success", "needs the S3 night's live version"
    store = s3_night["store"]
    before = store.listing()
    task_dirs, scratch = tmp_path / "tasks", tmp_path / "tmp"
    task_dirs.mkdir(), scratch.mkdir()
    connection = {
        "conn_type": "aws",
        "login": CREDENTIALS["AWS_ACCESS_KEY_ID"],
        "password": SECRET,
        "extra": {"endpoint_url": s3_server.env["AWS_ENDPOINT_URL"], "region_name": "us-east-1"},
    }
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")} | {
        "AIRFLOW_CONN_AWS_DEFAULT": json.dumps(connection),
        "AWS_ENDPOINT_URL": "http://127.0.0.1:9",  # discard port: a store built from the environment fails
        "TMPDIR": str(scratch),
    }
    conf = {"config": s3_night["config"], "backend": "embedded"}
    run = airflow.test_dag("sourcegate_recalibrate", S3_RECAL_DAY, conf, env=env, task_dirs=task_dirs)
    assert run["state"] == "success", failed_tasks(run)
    # retraining needs a local model folder: on a bucket corpus_share skips the rest (and says so in its log)
    retrain = {"corpus_share": "success", "retrain": "skipped", "judge": "skipped", "ship": "skipped"}
    assert run["tasks"] == {"live_version": "success", "evaluate": "success", "gate": "success", **retrain}
    assert run["live"] == "20250106-020000"

    folder = "runs/recal-20250107-093000/"
    published = {k[len(folder) :] for k in store.listing(folder)}
    for name in ("calibration.json", "precision.json", "gate.json", "junit.xml", "report.html", "run.json"):
        assert name in published, f"{name} not published"
    assert not [k for k in published if k.startswith("index/")]  # no reindexing
    info = json.loads(store.get(folder + "run.json"))
    assert info["evaluated_version"] == "20250106-020000"
    assert json.loads(store.get(folder + "gate.json"))["passed"] is True
    assert store.get("LIVE").decode().strip() == "20250106-020000"
    # nothing else written but the lock's own fence record (its generation moves with every holder, by design)
    # and the one check scoring this evaluation made (the check log: one object per scoring)
    scoring = "check_scorings/recal-20250107-093000-"
    assert len([k for k in store.listing("check_scorings/") if k.startswith(scoring)]) == 1
    others = (folder, ".sourcegate.lock", scoring)
    assert {k: v for k, v in store.listing().items() if not k.startswith(others)} == {
        k: v for k, v in before.items() if not k.startswith(others)
    }

    assert task_dir_names(task_dirs) == ["corpus_share--1", "evaluate--1", "gate--1", "live_version--1"]
    assert not left_behind(task_dirs, scratch)
    assert tree(ROOT / "artifacts") == s3_night["project_artifacts"]
    log = Path(run["log"]).read_text(errors="replace")
    assert "from the Airflow connection 'aws_default'" in log
    assert SECRET not in log and not any(SECRET.encode() in store.get(k) for k in store.listing(folder))
