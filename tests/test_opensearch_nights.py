"""Real `sourcegate run --backend opensearch` nights under faults (issue 31), and searches across a promotion.

- kill -9 right after the alias swap, and right after the promotions-log write (SOURCEGATE_KILL_AT,
  sourcegate/pipelines/faults.py), on the shared node with this test's own index prefix: the rerun (or `sourcegate
  promote RUN`) repairs run.json from the log, exactly one log record, `sourcegate runs` shows it promoted;
- a bounded loop of BM25 and kNN searches against the alias while a second version is promoted: no failed
  and no empty response;
- the node stopped while a night evaluates, on a private node (tests/private_node.py): exit 2, one line
  naming the node and the step, the alias unchanged after a restart, the stale lock broken by the rerun of
  the same run id, which completes.

The nights are the fault suite's tiny ones (tests/test_faults.py: 2-3 demo articles, 7 calibration and 3
precision questions, an empty baseline), so each costs seconds plus the model loads.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest

from sourcegate.pipelines.config import OpenSearch
from sourcegate.pipelines.search.opensearch import OpenSearchStore
from sourcegate.pipelines.search.opensearch.health import LOCK_INDEX
from sourcegate.pipelines.search.opensearch.searcher import OpenSearchSearcher
from tests.conftest import DEMO, ROOT
from tests.private_node import PrivateNode
from tests.test_faults import ARTICLES, tiny_night
from tests.test_opensearch_backend import WORDS, write_chunks
from tests.test_opensearch_delta import INPUTS

FIRST, SECOND, THIRD = "20260101-020000", "20260102-020000", "20260103-020000"


def sourcegate(tiny: dict, url: str, prefix: str, *argv: str, **env: str) -> subprocess.CompletedProcess:
    """One CLI command on the tiny night's config against the node at `url`, index prefix `prefix`."""
    cmd = [
        sys.executable,
        "-m",
        "sourcegate.pipelines.app.cli",
        "--config",
        str(tiny["config"]),
        *opensearch_args(prefix),
        *argv,
    ]
    return subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=night_env(url, **env), timeout=600)


def opensearch_args(prefix: str) -> list[str]:
    return ["--set", "backend.kind=opensearch", "--set", f"backend.opensearch.index_prefix={prefix}"]


def night_env(url: str, **extra: str) -> dict:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    env.pop("SOURCEGATE_KILL_AT", None), env.pop("SOURCEGATE_STOP_AT", None)
    return {**env, "OPENSEARCH_URL": url, **extra}


def night(tiny: dict, url: str, prefix: str, artifacts: Path, run_id: str, **env: str):
    return sourcegate(tiny, url, prefix, "run", "--artifacts", str(artifacts), "--run-id", run_id, "--quiet", **env)


def run_info(artifacts: Path, run_id: str) -> dict:
    return json.loads((artifacts / "runs" / run_id / "run.json").read_text())


def records_of(store: OpenSearchStore, version: str) -> list[dict]:
    return [r for r in store.promotions() if r["version"] == version]


@pytest.fixture
def tiny(tmp_path) -> dict:
    """The fault suite's tiny night (tests/test_faults.py), on a corpus folder of this test's own."""
    return tiny_night(tmp_path)


@pytest.fixture
def prefix(os_client):
    name = f"sgnight-{uuid.uuid4().hex[:12]}"
    yield name
    os_client.indices.delete(index=f"{name}-*", ignore_unavailable=True)
    os_client.delete(index=LOCK_INDEX, id=name, ignore=[404])


# --- kill -9 after the alias swap / after the log write -------------------------------------------------


@pytest.mark.opensearch
@pytest.mark.models
def test_a_kill_after_the_swap_or_the_log_write_is_repaired_from_the_promotions_log(tiny, prefix, os_client, tmp_path):
    from sourcegate.pipelines.search.opensearch.client import config_from_env

    url = config_from_env().url
    artifacts = tmp_path / "artifacts"
    corpus = tiny["corpus"]
    store = OpenSearchStore(os_client, OpenSearch(index_prefix=prefix), progress=False)
    first = night(tiny, url, prefix, artifacts, FIRST)
    assert first.returncode == 0, first.stdout + first.stderr
    assert f"load {prefix}-" not in first.stderr  # a quiet night draws no bar while OpenSearch loads
    shutil.copy(DEMO / ARTICLES[2], corpus / ARTICLES[2])  # the second night has something new

    # 1. Killed right after the alias swap: no log record yet, run.json without `promoted`.
    killed = night(tiny, url, prefix, artifacts, SECOND, SOURCEGATE_KILL_AT="promote:swapped")
    assert killed.returncode == -9, killed.stderr[-2000:]
    assert store.live() == SECOND and records_of(store, SECOND) == []
    assert "promoted" not in run_info(artifacts, SECOND)
    rerun = night(tiny, url, prefix, artifacts, SECOND)  # the same run id again
    assert rerun.returncode == 0, rerun.stdout + rerun.stderr
    assert "broke the stale lock" in rerun.stderr  # the killed night's lock document
    [record] = records_of(store, SECOND)
    assert (record["previous"], record["actor"]) == (FIRST, "cli")
    assert run_info(artifacts, SECOND)["promoted"] == {"version": SECOND, "replaced": FIRST, "actor": "cli"}

    # 2. Killed right after the log write: the record is there, run.json still lacks `promoted`.
    (corpus / ARTICLES[0]).write_text((corpus / ARTICLES[0]).read_text() + "\nAsk at any ticket office.\n")
    killed = night(tiny, url, prefix, artifacts, THIRD, SOURCEGATE_KILL_AT="promote:logged")
    assert killed.returncode == -9, killed.stderr[-2000:]
    assert store.live() == THIRD and len(records_of(store, THIRD)) == 1
    assert "promoted" not in run_info(artifacts, THIRD)
    promote = sourcegate(tiny, url, prefix, "promote", THIRD, "--artifacts", str(artifacts))
    assert promote.returncode == 0, promote.stdout + promote.stderr
    [record] = records_of(store, THIRD)  # still exactly one
    assert record["previous"] == SECOND
    assert run_info(artifacts, THIRD)["promoted"] == {"version": THIRD, "replaced": SECOND, "actor": "cli"}
    assert [r["version"] for r in store.promotions()] == [FIRST, SECOND, THIRD]

    runs = sourcegate(tiny, url, prefix, "runs", "--artifacts", str(artifacts), "--json")
    assert runs.returncode == 0, runs.stderr
    rows = {r["run"]: r for r in json.loads(runs.stdout)}
    assert {run: (rows[run]["verdict"], rows[run]["promoted"]) for run in rows} == {
        FIRST: ("passed", True),
        SECOND: ("passed", True),
        THIRD: ("passed", True),
    }


# --- searches across a promotion ----------------------------------------------------------------------


@pytest.mark.opensearch
def test_searches_across_a_promotion_never_fail_or_come_back_empty(os_client, prefix, tmp_path):
    """BM25 and kNN through the searcher on the alias, in a thread, while the main thread promotes v2 (verify +
    the one-request alias swap). Bounded: at most MAX_ROUNDS, and AFTER rounds once the promotion is done."""
    store = OpenSearchStore(os_client, OpenSearch(index_prefix=prefix, bulk_chunk_size=100), progress=False)
    v1, vectors, _, _ = write_chunks(tmp_path / "v1.parquet", n=60, seed=3)
    v2 = write_chunks(tmp_path / "v2.parquet", n=80, seed=5)[0]
    store.load("v1", str(v1), inputs=INPUTS)
    store.promote("v1")
    store.load("v2", str(v2), inputs=INPUTS)
    searcher = OpenSearchSearcher(os_client, store.alias, store.section)
    query, k = " ".join(WORDS[:4]), 10
    max_rounds, after = 2000, 20
    warmed, promoted, done = threading.Event(), threading.Event(), threading.Event()
    failures: list[str] = []
    served: list[int] = []  # the alias's document count seen each round: 60 (v1) or 80 (v2)

    def loop() -> None:
        rounds_after = 0
        for i in range(max_rounds):
            try:
                bm25, knn = searcher.bm25(query, k), searcher.knn(vectors[i % len(vectors)], k)
                served.append(int(os_client.count(index=store.alias)["count"]))
            except Exception as exc:  # noqa: BLE001 - every failure is the finding
                failures.append(f"round {i}: {type(exc).__name__}: {exc}")
                continue
            if len(bm25) != k or len(knn) != k:
                failures.append(f"round {i}: {len(bm25)} BM25 and {len(knn)} kNN hits, expected {k} each")
            if i >= after:
                warmed.set()
            rounds_after += promoted.is_set()
            if rounds_after >= after:
                break
        done.set()

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    assert warmed.wait(120), f"the loop did not get going: {failures[:3]}"
    store.promote("v2")
    promoted.set()
    thread.join(300)
    assert done.is_set() and not thread.is_alive()
    assert failures == []
    assert served[0] == 60 and served[-1] == 80 and served == sorted(served)  # v1, then v2, never back


# --- the node stopped while a night evaluates (a private node) ------------------------------------------


def wait_stopped(pid: int, bound_s: float = 600) -> None:
    """Until process `pid` is stopped (SIGSTOP at its fault point); fails if it exits or the bound passes."""
    deadline = time.monotonic() + bound_s
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except FileNotFoundError:
            raise AssertionError(f"process {pid} ended before its pause point") from None
        if state in ("T", "t"):
            return
        if state == "Z":
            raise AssertionError(f"process {pid} ended before its pause point")
        time.sleep(0.2)
    raise AssertionError(f"process {pid} did not reach its pause point within {bound_s:g} s")


@pytest.mark.opensearch
@pytest.mark.models
def test_the_node_stopped_while_a_night_evaluates(tiny, tmp_path):
    from opensearchpy import OpenSearch as Client  # not the config section OpenSearch imported above

    node = PrivateNode(tmp_path / "node")
    url = node.start()
    try:
        client = Client(hosts=[url], timeout=30)
        store = OpenSearchStore(client, OpenSearch(index_prefix="sg-stopped"), progress=False)
        artifacts = tmp_path / "artifacts"
        first = night(tiny, url, store.prefix, artifacts, FIRST)
        assert first.returncode == 0, first.stdout + first.stderr
        assert store.live() == FIRST

        cmd = [
            sys.executable,
            "-m",
            "sourcegate.pipelines.app.cli",
            "--config",
            str(tiny["config"]),
            *opensearch_args("sg-stopped"),
        ]
        cmd += ["run", "--artifacts", str(artifacts), "--run-id", SECOND, "--quiet"]
        env = night_env(url, SOURCEGATE_STOP_AT="evaluate:searching")
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            wait_stopped(proc.pid)  # the version loaded and opened, the models loaded, no question asked yet
            node.stop()
            os.kill(proc.pid, signal.SIGCONT)
            out, err = proc.communicate(timeout=300)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        assert proc.returncode == 2, out + err
        assert "Traceback" not in err
        cause = f"sourcegate: OpenSearch unreachable at {url} during evaluate (connection refused or lost)"
        [line] = [x for x in err.splitlines() if x.startswith("sourcegate: ")]
        assert line.startswith(cause), err
        assert err.splitlines()[-1] == line  # the cause is the last word, not the cleanup after it
        beside = [x for x in err.splitlines() if "Connection refused" in x and x != line]
        assert all(
            x.startswith("WARNING sourcegate.pipelines.release.lock: could not release the lock") for x in beside
        ), err

        node.start()  # same port, same data
        client.cluster.health(wait_for_status="yellow", request_timeout=120)
        assert store.live() == FIRST  # the alias never moved
        lock = client.get(index=LOCK_INDEX, id="sg-stopped", ignore=[404])
        assert not lock.get("found") or lock["_source"]["pid"] == proc.pid  # released, or left by the dead night
        rerun = night(tiny, url, store.prefix, artifacts, SECOND)  # the next writer is not blocked by it
        assert rerun.returncode == 0, rerun.stdout + rerun.stderr
        assert store.live() == SECOND
        if lock.get("found"):
            assert "broke the stale lock" in rerun.stderr
        assert run_info(artifacts, SECOND)["promoted"] == {"version": SECOND, "replaced": FIRST, "actor": "cli"}
    finally:
        node.stop()
