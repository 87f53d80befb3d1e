"""The nightly DAG run by a real Airflow scheduler, artifacts on the S3 server (issue 23).

Not `dag.test()`: `airflow scheduler` with the LocalExecutor (each task instance its own process, started by
the executor's supervisor), `airflow dag-processor` parsing the DAGs, `airflow api-server` serving the
Execution API the task processes talk to, on SQLite in a temporary AIRFLOW_HOME. Airflow 3 has no
SequentialExecutor: the LocalExecutor is its default executor and `airflow standalone` runs it on SQLite, as
here. The night is triggered with `airflow dags trigger` and polled in the metadata DB until it ends.

What it proves: the night passes and promotes with artifacts on the moto server, reached only through the
Airflow connection aws_default (AIRFLOW_CONN_AWS_DEFAULT, JSON form; the AWS environment has no credentials
and a dead endpoint); SOURCEGATE_ARTIFACTS points the tasks at the bucket while the config file names a local
artifacts folder that must never appear; every task (each embed shard) ran in a process of its own, in a
fresh working directory of its own (a cluster policy in the home's airflow_local_settings.py), and left it
empty; no task left a staging folder or touched the project's artifacts; the secret is in no log.
The demo corpus with the passing fixture's decision (tests/promotable.py) and the fault suite's tiny eval sets: what this
night is about is the scheduler and the store; its evaluation only has to pass, at the least cost.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.test_dag_runs import ARTIFACT_FILES, DAGS, ROOT, tree, write_config
from tests.test_faults import tiny_check_set, tiny_eval_sets

pytestmark = [pytest.mark.airflow, pytest.mark.models, pytest.mark.s3]

NIGHT = "2025-01-08T02:00:00+00:00"
RUN_ID = "20250108-020000"  # the pipeline's run id: the logical date
DAG_RUN_ID = "scheduler-night"
NIGHT_TIMEOUT_S = 2400
TASKS = ("ingest", "chunk", "embed", "merge", "validate", "load", "evaluate", "gate", "promote", "cleanup")

# Loaded by every Airflow process of the home (its config/ folder is on sys.path); the policy runs wherever the
# DAG file is parsed, the task process included: each task instance starts in a fresh directory of its own.
LOCAL_SETTINGS = """
import os
import tempfile


def _own_working_directory(context):
    ti = context["ti"]
    os.chdir(tempfile.mkdtemp(prefix=f"{ti.task_id}-{ti.map_index}-", dir=os.environ["SG_TASK_DIRS"]))


def task_policy(task):
    callbacks = task.on_execute_callback
    callbacks = [] if callbacks is None else list(callbacks) if isinstance(callbacks, list) else [callbacks]
    task.on_execute_callback = [*callbacks, _own_working_directory]
"""


class Scheduler:
    """api-server + dag-processor + scheduler (LocalExecutor, SQLite) in one temporary AIRFLOW_HOME."""

    def __init__(self, home: Path, env: dict):
        self.home, self.env, self.procs = home, env, {}
        self.db = home / "airflow.db"
        self.cwd = home / "cwd"  # the components' working directory (and the executor's): must stay empty
        self.cwd.mkdir(parents=True, exist_ok=True)

    def cli(self, *args: str, timeout: int = 600) -> subprocess.CompletedProcess:
        out = subprocess.run(
            [sys.executable, "-m", "airflow", *args],
            env=self.env,
            cwd=self.cwd,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        assert out.returncode == 0, f"airflow {' '.join(args)} failed:\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}"
        return out

    def start(self, name: str, *args: str) -> None:
        self.procs[name] = self.popen(name, [sys.executable, "-m", "airflow", *args], self.env, self.cwd)

    def popen(self, name: str, argv: list[str], env: dict, cwd: Path) -> subprocess.Popen:
        """`argv` with its output in the home's `<name>.log`, in a session of its own: stopped with its children
        (executor workers)."""
        with open(self.home / f"{name}.log", "ab") as log:
            return subprocess.Popen(
                argv, env=env, cwd=cwd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )

    def check_running(self) -> None:
        for name, proc in self.procs.items():
            if proc.poll() is not None:
                log = (self.home / f"{name}.log").read_text(errors="replace")[-4000:]
                pytest.fail(f"airflow {name} exited {proc.returncode}:\n{log}")

    def stop(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in self.procs.values():
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=30)

    def query(self, sql: str, *params) -> list[tuple]:
        """Read the metadata DB (read-only; the components write it)."""
        if not self.db.exists():
            return []
        with sqlite3.connect(f"file:{self.db}?mode=ro", uri=True, timeout=30) as con:
            try:
                return con.execute(sql, params).fetchall()
            except sqlite3.OperationalError:  # a table not migrated yet, or the DB busy: ask again later
                return []

    def wait_for(self, what: str, done, timeout_s: float, every_s: float = 5.0):
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            self.check_running()
            value = done()
            if value:
                return value
            time.sleep(every_s)
        pytest.fail(f"timed out after {timeout_s:.0f} s waiting for {what}; logs in {self.home}")


def prepare_home(tmp: Path) -> dict:
    """A fresh AIRFLOW_HOME under `tmp` (its local settings: the own-directory policy), the tasks' directories
    and staging scratch, and the local artifacts folder the config file names (that must never appear)."""
    places = {
        "home": tmp / "airflow_home",
        "task_dirs": tmp / "tasks",
        "scratch": tmp / "tmp",
        "local_artifacts": tmp / "local-artifacts",
    }
    for folder in (places["home"] / "config", places["home"] / "plugins", places["task_dirs"], places["scratch"]):
        folder.mkdir(parents=True)
    (places["home"] / "config" / "airflow_local_settings.py").write_text(LOCAL_SETTINGS)
    return places


def cluster_env(places: dict, s3_server, uri: str, port: int) -> dict:
    """The environment of every Airflow process of the home: this checkout's DAGs on SQLite, the API on `port`,
    the artifacts at `uri` reached only through the Airflow connection aws_default (the AWS environment has no
    keys and a dead endpoint), the LocalExecutor (a test of another executor overrides it)."""
    from tests.s3_server import CREDENTIALS, SECRET

    home = places["home"]
    connection = {
        "conn_type": "aws",
        "login": CREDENTIALS["AWS_ACCESS_KEY_ID"],
        "password": SECRET,
        "extra": {"endpoint_url": s3_server.env["AWS_ENDPOINT_URL"], "region_name": "us-east-1"},
    }
    return {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "AIRFLOW"))} | {
        "PYTHONPATH": os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]),
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__DAGS_FOLDER": str(DAGS),
        "AIRFLOW__CORE__PLUGINS_FOLDER": str(home / "plugins"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home / 'airflow.db'}",
        "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
        "AIRFLOW__CORE__PARALLELISM": "2",  # two task processes at a time (the two embed shards): 2 cores
        "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "True",
        "AIRFLOW__SCHEDULER__USE_JOB_SCHEDULE": "False",  # only the triggered run: no scheduled nights
        "AIRFLOW__API__HOST": "127.0.0.1",
        "AIRFLOW__API__PORT": str(port),
        "AIRFLOW__API__WORKERS": "1",
        "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"http://127.0.0.1:{port}/execution/",
        "AIRFLOW__API_AUTH__JWT_SECRET": "sourcegate-test-jwt-secret",  # shared by the scheduler and the API
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "TQDM_DISABLE": "1",
        "TMPDIR": str(places["scratch"]),  # the tasks' staging folders
        "SG_TASK_DIRS": str(places["task_dirs"]),
        "SOURCEGATE_ARTIFACTS": uri,
        "AIRFLOW_CONN_AWS_DEFAULT": json.dumps(connection),
        "AWS_ENDPOINT_URL": "http://127.0.0.1:9",  # discard port: a store built from the environment fails
    }


def cli_trigger(cluster: Scheduler, conf: dict, logical_date: str, dag_run_id: str) -> None:
    cluster.cli("dags", "unpause", "sourcegate_nightly")
    cluster.cli("dags", "trigger", "sourcegate_nightly", "-c", json.dumps(conf), "-l", logical_date, "-r", dag_run_id)


def run_night(
    cluster: Scheduler, conf: dict, logical_date: str, dag_run_id: str, trigger=cli_trigger, watch=lambda: None
) -> str:
    """Start the api-server, dag-processor and scheduler of a migrated home, `trigger` the nightly DAG with `conf`
    (default: the CLI) and wait for the run to end (`watch` is called at every poll); returns its state."""
    cluster.start("api-server", "api-server")
    cluster.start("dag-processor", "dag-processor")
    cluster.start("scheduler", "scheduler")
    cluster.wait_for(
        "the dag-processor to parse sourcegate_nightly",
        lambda: cluster.query("SELECT 1 FROM dag WHERE dag_id = 'sourcegate_nightly'"),
        timeout_s=600,
    )
    trigger(cluster, conf, logical_date, dag_run_id)

    def ended():
        watch()
        rows = cluster.query(
            "SELECT state FROM dag_run WHERE run_id = ? AND state IN ('success', 'failed')", dag_run_id
        )
        return rows[0][0] if rows else None

    return cluster.wait_for("the night to end", ended, timeout_s=NIGHT_TIMEOUT_S, every_s=2)


def published_store(s3_server, uri: str):
    """The night's store, read by the test through the server's own filesystem."""
    from sourcegate.pipelines.versions.object_store import ObjectStore
    from tests.test_object_store import _server_fs

    return ObjectStore.from_uri(uri, fs=_server_fs(s3_server))


@pytest.fixture(scope="module")
def night(s3_server, tmp_path_factory):
    from tests.s3_server import free_port

    tmp = tmp_path_factory.mktemp("scheduler-night")
    places = prepare_home(tmp)
    uri = s3_server.bucket("scheduler-nights") + "/sourcegate"
    # what the config file says; SOURCEGATE_ARTIFACTS overrides it
    config = write_config(tmp / "night.yaml", places["local_artifacts"], **tiny_evals(tmp))
    cluster = Scheduler(places["home"], cluster_env(places, s3_server, uri, free_port()))
    project_artifacts = tree(ROOT / "artifacts")
    cluster.cli("db", "migrate")
    started = time.monotonic()
    try:
        conf = {"config": config, "corpus": "corpus/demo", "backend": "embedded", "shards": 2}
        state = run_night(cluster, conf, NIGHT, DAG_RUN_ID)
        elapsed = time.monotonic() - started
        tasks = cluster.query(
            "SELECT task_id, map_index, state, pid, hostname FROM task_instance WHERE run_id = ?", DAG_RUN_ID
        )
        component_pids = {p.pid for p in cluster.procs.values()}
    finally:
        cluster.stop()
    return places | {
        "state": state,
        "tasks": {(t if m < 0 else f"{t}[{m}]"): {"state": s, "pid": p, "host": h} for t, m, s, p, h in tasks},
        "component_pids": component_pids,
        "elapsed_s": elapsed,
        "store": published_store(s3_server, uri),
        "uri": uri,
        "cwd": cluster.cwd,
        "project_artifacts": project_artifacts,
    }


def tiny_evals(folder: Path) -> dict:
    """Config sections for the fault suite's tiny eval sets (tests/test_faults.py): a few should-answer questions
    and three off-topic ones, the same under new ids as the check set, a gate that can pass on three. What this
    night is about is the pool; its evaluation only has to pass, at the least cost."""
    fit, precision = tiny_eval_sets(folder)
    check = tiny_check_set(fit, folder / "check.jsonl")
    return {
        "evals": {"calibration_set": str(fit), "precision_set": str(precision), "check_set": str(check)},
        "calibration": {"min_per_label": 3},
    }


def failed(night: dict) -> str:
    bad = {k: v["state"] for k, v in night["tasks"].items() if v["state"] != "success"}
    return f"night {night['state']}; tasks not successful: {bad}; logs under {night['home']}"


def test_a_real_scheduler_runs_the_night_with_each_task_in_its_own_process(night):
    assert night["state"] == "success", failed(night)
    expected = {t for t in TASKS if t != "embed"} | {"embed[0]", "embed[1]"}
    assert set(night["tasks"]) == expected
    assert all(t["state"] == "success" for t in night["tasks"].values()), failed(night)
    pids = [t["pid"] for t in night["tasks"].values()]
    assert all(pids) and len(set(pids)) == len(pids), pids  # every task instance its own process
    assert not set(pids) & night["component_pids"]  # none of them the scheduler's (or another component's)


def test_the_night_is_published_to_the_store_and_promoted(night):
    assert night["state"] == "success", failed(night)
    store = night["store"]
    assert store.get("LIVE").decode().strip() == RUN_ID
    published = {k.split("/", 2)[2] for k in store.listing(f"runs/{RUN_ID}/")}
    for name in ARTIFACT_FILES + ("index/manifest.json", "embed/shard-0000.parquet", "embed/shard-0001.parquet"):
        assert name in published, f"{name} not published"
    assert json.loads(store.get(f"runs/{RUN_ID}/gate.json"))["passed"] is True
    info = json.loads(store.get(f"runs/{RUN_ID}/run.json"))
    assert info["config"]["artifacts"] == night["uri"] and info["promoted"]["version"] == RUN_ID
    assert len(store.listing("promotions/")) == 1


def test_no_task_touched_a_local_artifacts_folder(night):
    """Each task in its own working directory, left empty; the config file's local artifacts folder never made;
    every staging folder removed; the project's artifacts untouched; the components' directory empty."""
    dirs = sorted(p.name.rsplit("-", 1)[0] for p in night["task_dirs"].iterdir())
    assert dirs == sorted([f"{t}--1" for t in TASKS if t != "embed"] + ["embed-0", "embed-1"]), (
        dirs
    )  # the policy ran in every task process: one fresh directory each
    assert not [str(p) for p in night["task_dirs"].rglob("*") if p.is_file() or p.name == "artifacts"]
    assert not night["local_artifacts"].exists()
    assert not list(night["scratch"].glob("sourcegate-stage-*"))
    assert not list(night["cwd"].iterdir())
    assert tree(ROOT / "artifacts") == night["project_artifacts"]


def test_the_store_was_reached_through_the_airflow_connection_and_no_log_holds_the_secret(night):
    from tests.s3_server import SECRET

    logs = [p for p in night["home"].rglob("*.log") if p.is_file()]
    text = "\n".join(p.read_text(errors="replace") for p in logs)
    assert "from the Airflow connection 'aws_default'" in text  # the task logs say where the keys came from
    assert SECRET not in text, [str(p) for p in logs if SECRET in p.read_text(errors="replace")]
    store = night["store"]
    assert not [k for k in store.listing() if SECRET.encode() in store.get(k)]
