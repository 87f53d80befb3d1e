"""The nightly DAG on a real Celery pool of two workers, one of them killed mid-task.

The multi-worker deployment of docker-compose.yml, on one machine: `airflow api-server`, `airflow dag-processor` and
`airflow scheduler` with the compose file's executor settings (read from it: the CeleryExecutor, a Redis broker, the
Celery results in the metadata DB), here a Redis from Debian's redis-server and the home's SQLite DB (Postgres in the
compose file), and two `airflow celery worker` processes (tests/celery_pool.py), each with a host name of its own (a
UTS namespace, as a container), one task at a time, its own working directory, TMPDIR, task directories and task
logs: the workers share no disk, only the metadata DB and the API. Artifacts live on the moto S3 server, reached
only through the Airflow connection aws_default. The home, its environment and the trigger-and-wait are
tests/test_scheduler_night.py's (the LocalExecutor night); the night is the demo corpus with the passing fixture's
decision (tests/promotable.py) and the fault suite's tiny eval sets, triggered through the REST API.

Both workers run with SOURCEGATE_STOP_AT=embed:encoded (sourcegate/pipelines/faults.py): an embed shard that has encoded its
vectors, and written nothing, stops itself. The first worker seen holding a stopped shard is killed, SIGKILL to it
and every process under it, as a machine going away; every other stopped shard is let go on (SIGCONT). The
scheduler fails the lost try once its heartbeat stops (`task_instance_heartbeat_timeout`, 30 s here, 300 s by
default), and the retry every task has (sourcegate/dags/common.py DEFAULT_ARGS) runs it on the surviving worker.

What it proves: the tasks of one night ran on both workers (the task instances' host names, and each worker's own
task logs), the lost shard's retry ran on the other worker, the night passed and promoted once (one record in the
promotions log, LIVE on it), the lost shard's claim on the store's lock was broken by the other worker once its
lease lapsed and no claim is left, and no artifact was written anywhere on local disk but inside the workers' own
scratch (the killed worker's leftovers stay in its own, as a lost machine's).

The same pool runs a second night on the OpenSearch backend (the real node, reached only through the Airflow
connection opensearch_default): its tasks too run on both workers, and the node's alias moves to the version.
"""

from __future__ import annotations

import json
import signal
import time
import urllib.request
import uuid
from urllib.parse import urlsplit

import pytest
import yaml

from sourcegate.pipelines.config import OpenSearch
from sourcegate.pipelines.release.object_lock import CLAIMS, LOCK_KEY
from sourcegate.pipelines.search.opensearch import OpenSearchStore
from tests.celery_pool import RedisBroker, Worker
from tests.test_dag_runs import ARTIFACT_FILES, ROOT, opensearch_hook_only_env, tree, write_config
from tests.test_scheduler_night import Scheduler, cluster_env, prepare_home, published_store, run_night, tiny_evals

pytestmark = [pytest.mark.airflow, pytest.mark.models, pytest.mark.s3, pytest.mark.system, pytest.mark.celery]

NIGHT = "2025-01-09T02:00:00+00:00"
RUN_ID = "20250109-020000"
DAG_RUN_ID = "celery-night"
PAUSE_POINT = "embed:encoded"  # vectors computed, the shard not yet written
OPENSEARCH_NIGHT = "2025-01-10T02:00:00+00:00"
OPENSEARCH_RUN_ID = "20250110-020000"
WORKERS = ("sg-worker-1", "sg-worker-2")
HEARTBEAT_TIMEOUT_S = 30  # a lost task is failed after this; not so short that a busy machine's late beat counts
# The store lock's lease, no longer than the heartbeat timeout, as in a deployment (120 s against 300 s by default):
# a lost holder's claim has lapsed by the time its task is retried, so no step waits for it.
LEASE_S = 30


@pytest.fixture(scope="session")
def redis_broker(tmp_path_factory):
    """The Celery broker, started once per session."""
    broker = RedisBroker(tmp_path_factory.mktemp("redis")).start()
    yield broker
    broker.stop()


def compose_executor_settings() -> dict:
    """docker-compose.yml's Airflow settings of the executor (CeleryExecutor, the broker, the result backend) and of
    the API's auth manager, as its Airflow services share them (x-airflow-common)."""
    env = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["x-airflow-common"]["environment"]
    keys = ("AIRFLOW__CORE__EXECUTOR", "AIRFLOW__CELERY__", "AIRFLOW__CORE__AUTH_MANAGER", "AIRFLOW__CORE__SIMPLE_AUTH")
    return {k: str(v) for k, v in env.items() if k.startswith(keys)}


def celery_env(base: dict, broker: RedisBroker) -> dict:
    """docker-compose.yml's executor settings with this machine's addresses: its Redis broker URL on the test's
    broker, its results in the metadata DB (`db+` the DB's URL) on this home's DB; the heartbeat timeout shortened."""
    compose = compose_executor_settings()
    broker_url = urlsplit(compose["AIRFLOW__CELERY__BROKER_URL"])
    assert broker_url.scheme == "redis" and compose["AIRFLOW__CELERY__RESULT_BACKEND"].startswith("db+"), compose
    return (
        base
        | compose
        | {
            "AIRFLOW__CELERY__BROKER_URL": broker_url._replace(netloc=f"127.0.0.1:{broker.port}").geturl(),
            "AIRFLOW__CELERY__RESULT_BACKEND": "db+" + base["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"],
            "AIRFLOW__CORE__PARALLELISM": "4",  # the pool's slots (2 x 1) bound the work; a lost task's is freed late
            "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT": str(HEARTBEAT_TIMEOUT_S),
            "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT_DETECTION_INTERVAL": "5",
        }
    )


def api(cluster: Scheduler, method: str, path: str, body: dict | None = None) -> dict:
    """One call of the api-server's REST API with a token of the simple auth manager (all admins)."""
    base = cluster.env["AIRFLOW__CORE__EXECUTION_API_SERVER_URL"].removesuffix("/execution/")
    with urllib.request.urlopen(f"{base}/auth/token", timeout=30) as r:
        token = json.load(r)["access_token"]
    request = urllib.request.Request(
        f"{base}{path}",
        method=method,
        data=None if body is None else json.dumps(body).encode(),
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=60) as r:
        return json.load(r)


def api_trigger(cluster: Scheduler, conf: dict, logical_date: str, dag_run_id: str) -> None:
    def answered():
        try:
            return api(cluster, "GET", "/api/v2/version")
        except OSError:
            return None

    cluster.wait_for("the api-server to answer", answered, timeout_s=300, every_s=2)
    assert api(cluster, "PATCH", "/api/v2/dags/sourcegate_nightly", {"is_paused": False})["is_paused"] is False
    run = api(
        cluster,
        "POST",
        "/api/v2/dags/sourcegate_nightly/dagRuns",
        {"dag_run_id": dag_run_id, "logical_date": logical_date, "conf": conf},
    )
    assert run["dag_run_id"] == dag_run_id, run


class KillAtPause:
    """Called at every poll: kills the first worker seen with a task stopped at the pause point (recording which
    task instance it ran), lets every other stopped task go on, and fails when a live worker died."""

    def __init__(self, cluster: Scheduler, workers: list[Worker], dag_run_id: str):
        self.cluster, self.workers, self.dag_run_id = cluster, workers, dag_run_id
        self.killed: Worker | None = None
        self.lost: list[tuple] = []  # (task_id, map_index, try_number) running on the killed worker
        self.resumed = 0

    def __call__(self) -> None:
        for worker in self.workers:
            if worker is self.killed:
                continue
            worker.check_running()
            stopped = worker.stopped()
            if stopped and self.killed is None:
                self.lost = self.cluster.query(
                    "SELECT task_id, map_index, try_number FROM task_instance"
                    " WHERE run_id = ? AND state = 'running' AND hostname = ?",
                    self.dag_run_id,
                    worker.name,
                )
                worker.kill()
                self.killed = worker
                continue
            for process in stopped:
                process.send_signal(signal.SIGCONT)
                self.resumed += 1


def pool_night(s3_server, broker, tmp, logical_date: str, dag_run_id: str, *, backend=None, env=None, kill=False):
    """The nightly DAG on a pool of two fresh workers, artifacts on the moto server under a bucket of `tmp`'s name,
    `backend` (a config section; the embedded one when None) and `env` added to every process's environment.
    `kill`: both workers stop an embed shard at PAUSE_POINT and the first worker seen holding one is killed
    (KillAtPause; without it nothing stops, so nothing is killed, and a worker that dies still fails the night). Returns what the tests read: the night's state, every try with its host, the store."""
    from tests.s3_server import free_port

    places = prepare_home(tmp)
    uri = s3_server.bucket(tmp.name) + "/sourcegate"
    # the config file names a local artifacts folder (SOURCEGATE_ARTIFACTS overrides it) and the tiny eval sets
    sections = {"lock": {"lease_s": LEASE_S}, **({"backend": backend} if backend else {}), **tiny_evals(tmp)}
    config = write_config(tmp / "night.yaml", places["local_artifacts"], **sections)
    cluster_environment = celery_env(cluster_env(places, s3_server, uri, free_port()), broker) | (env or {})
    cluster = Scheduler(places["home"], cluster_environment)
    workers = [Worker(name, tmp / name) for name in WORKERS]
    project_artifacts = tree(ROOT / "artifacts")
    cluster.cli("db", "migrate")
    started = time.monotonic()
    watch = KillAtPause(cluster, workers, dag_run_id)
    try:
        for worker in workers:
            worker.start(cluster_environment | ({"SOURCEGATE_STOP_AT": PAUSE_POINT} if kill else {}))

        def trigger(*args):  # once both workers consume: a night queued earlier would start on the first one up
            for worker in workers:
                cluster.wait_for(f"celery worker {worker.name} to be ready", worker.ready, timeout_s=300, every_s=2)
            api_trigger(*args)

        kind = (backend or {}).get("kind", "embedded")
        conf = {"config": config, "corpus": "corpus/demo", "backend": kind, "shards": 2}
        state = run_night(cluster, conf, logical_date, dag_run_id, trigger=trigger, watch=watch)
        elapsed = time.monotonic() - started
        tries = cluster.query(
            "SELECT task_id, map_index, try_number, state, hostname FROM task_instance WHERE run_id = ?"
            " UNION SELECT task_id, map_index, try_number, state, hostname FROM task_instance_history"
            " WHERE run_id = ?",
            dag_run_id,
            dag_run_id,
        )
    finally:
        for worker in workers:
            worker.stop()
        cluster.stop()
    return places | {
        "state": state,
        "dag_run_id": dag_run_id,
        "tries": {(t, m, n): {"state": s, "host": h} for t, m, n, s, h in tries},
        "killed": watch.killed,
        "survivor": next(w for w in workers if w is not watch.killed) if watch.killed else None,
        "lost": watch.lost,
        "resumed": watch.resumed,
        "workers": workers,
        "elapsed_s": elapsed,
        "store": published_store(s3_server, uri),
        "uri": uri,
        "cwd": cluster.cwd,
        "project_artifacts": project_artifacts,
    }


@pytest.fixture(scope="module")
def night(s3_server, redis_broker, tmp_path_factory):
    """The embedded backend's night, one of its embed shards lost with its worker."""
    return pool_night(s3_server, redis_broker, tmp_path_factory.mktemp("celery-night"), NIGHT, DAG_RUN_ID, kill=True)


def failed(night: dict) -> str:
    return f"night {night['state']}; tries: {night['tries']}; logs under {night['home'].parent}"


def attempt_logs(worker: Worker, dag_run_id: str) -> set[tuple]:
    """(task_id, map_index, try_number) of every task log of the DAG run in the worker's own log folder."""
    out = set()
    for path in worker.logs.rglob("attempt=*.log"):
        parts = dict(p.split("=", 1) for p in path.relative_to(worker.logs).parts if "=" in p)
        if parts.get("run_id") == dag_run_id:
            out.add((parts["task_id"], int(parts.get("map_index", -1)), int(parts["attempt"].removesuffix(".log"))))
    return out


def assert_ran_on_both_workers(night: dict) -> None:
    """The night's tries ran on both workers, and each worker's own disk holds the logs of exactly the tries it ran."""
    assert {t["host"] for t in night["tries"].values()} == set(WORKERS), night["tries"]
    for worker in night["workers"]:
        ran = {key for key, t in night["tries"].items() if t["host"] == worker.name}
        assert attempt_logs(worker, night["dag_run_id"]) == ran, worker.name


def test_the_tasks_of_one_night_ran_on_both_workers(night):
    assert night["state"] == "success", failed(night)
    assert_ran_on_both_workers(night)


def test_a_task_lost_with_its_worker_is_retried_on_the_other_and_the_night_completes(night):
    assert night["killed"] is not None, "no task stopped at the pause point: no worker was killed"
    assert night["state"] == "success", failed(night)
    (lost,) = night["lost"]  # one task at a time per worker: the stopped embed shard
    task_id, map_index, try_number = lost
    assert task_id == "embed" and try_number == 1, lost
    assert night["tries"][lost]["host"] == night["killed"].name
    assert night["tries"][lost]["state"] != "success", night["tries"]
    retry = night["tries"][(task_id, map_index, 2)]
    assert retry == {"state": "success", "host": night["survivor"].name}, night["tries"]
    assert night["resumed"] >= 2  # the other worker's own shard and the retry stopped too, and were let go on
    finals = {(t, m): s for (t, m, n), s in night["tries"].items() if (t, m, n + 1) not in night["tries"]}
    assert all(s["state"] == "success" for s in finals.values()), failed(night)


def test_the_night_is_published_once_promoted_and_unlocked(night):
    assert night["state"] == "success", failed(night)
    store = night["store"]
    assert store.get("LIVE").decode().strip() == RUN_ID
    published = {k.split("/", 2)[2] for k in store.listing(f"runs/{RUN_ID}/")}
    for name in ARTIFACT_FILES + ("index/manifest.json", "embed/shard-0000.parquet", "embed/shard-0001.parquet"):
        assert name in published, f"{name} not published"
    assert json.loads(store.get(f"runs/{RUN_ID}/gate.json"))["passed"] is True
    assert json.loads(store.get(f"runs/{RUN_ID}/run.json"))["promoted"]["version"] == RUN_ID
    assert len(store.listing("promotions/")) == 1  # published once, though a task ran twice
    assert not store.listing(CLAIMS)  # no holder's claim left: the lock is not held
    survivor_logs = "\n".join(p.read_text(errors="replace") for p in night["survivor"].logs.rglob("*.log"))
    broken = [line for line in survivor_logs.splitlines() if "broke the stale lock" in line]
    assert any(f"on {night['killed'].name} (" in line and "[embed]" in line for line in broken), broken
    assert store.get(LOCK_KEY) is not None  # the fence record stays, by design: it carries the generation on


def test_no_artifact_was_written_outside_the_workers_scratch(night):
    """The config file's local artifacts folder never made, the project's artifacts untouched, the components'
    directory and TMPDIR empty of staging; the surviving worker's task directories empty and no staging folder
    left in its TMPDIR. The killed worker's leftovers stay in its own scratch, as a lost machine's disk."""
    assert not night["local_artifacts"].exists()
    assert tree(ROOT / "artifacts") == night["project_artifacts"]
    assert not list(night["cwd"].iterdir())
    assert not list(night["task_dirs"].iterdir())  # the LocalExecutor's: no task ran outside a worker
    assert not list(night["scratch"].glob("sourcegate-stage-*"))
    survivor = night["survivor"]
    assert not [str(p) for p in survivor.task_dirs.rglob("*") if p.is_file() or p.name == "artifacts"]
    assert not list(survivor.scratch.glob("sourcegate-stage-*"))
    assert not list(survivor.cwd.iterdir())


# --- the OpenSearch backend on the pool ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def opensearch_night(s3_server, redis_broker, tmp_path_factory, os_client):
    """The OpenSearch backend's night on a pool of two fresh workers, nothing killed: the node reached only through
    the Airflow connection opensearch_default (OPENSEARCH_URL points at a closed port), a private index prefix."""
    prefix = f"sgtest-{uuid.uuid4().hex[:8]}"
    env = opensearch_hook_only_env()
    backend = {"kind": "opensearch", "opensearch": {"index_prefix": prefix}}
    tmp = tmp_path_factory.mktemp("celery-opensearch-night")
    try:
        night = pool_night(
            s3_server, redis_broker, tmp, OPENSEARCH_NIGHT, "celery-opensearch", backend=backend, env=env
        )
        yield night | {"live": OpenSearchStore(os_client, OpenSearch(index_prefix=prefix), progress=False).live()}
    finally:
        os_client.indices.delete(index=f"{prefix}-*", params={"ignore_unavailable": "true"})


@pytest.mark.opensearch
def test_an_opensearch_night_on_the_pool_runs_on_both_workers_and_moves_the_alias(opensearch_night):
    night = opensearch_night
    assert night["state"] == "success", failed(night)
    assert_ran_on_both_workers(night)
    store = night["store"]
    assert json.loads(store.get(f"runs/{OPENSEARCH_RUN_ID}/gate.json"))["passed"] is True
    assert json.loads(store.get(f"runs/{OPENSEARCH_RUN_ID}/run.json"))["backend"] == "opensearch"
    assert night["live"] == OPENSEARCH_RUN_ID  # the alias <prefix> -> <prefix>-<version>
    assert store.get("LIVE") is None  # the embedded pointer is not the OpenSearch alias
    assert not store.listing(CLAIMS)  # the lock is not held
    assert not night["local_artifacts"].exists()
    assert tree(ROOT / "artifacts") == night["project_artifacts"]
