"""`sourcegate serve` as a real process over a real night: /health names the live version, /query answers what
`sourcegate query --json` answers, a promotion moves what is served, and a bad body is a 400 naming what is wrong.

The night is the fault suite's tiny one (tests/test_faults.py: demo articles, tiny eval sets, the shipped
decision), whose gate passes; the second night adds an article, so its version differs.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from sourcegate.pipelines.app.serve import BadRequest, parse_question
from tests.test_faults import ARTICLES, DEMO, tiny_night

ROOT = Path(__file__).resolve().parents[1]
FIRST, SECOND = "20260401-020000", "20260402-020000"
BIKE = "Can I bring my bike on the light rail at rush hour?"
ENV = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


# --- fast tier: what a body must be ------------------------------------------------------------------------------


def test_a_question_and_its_prior_turns_are_read_from_a_json_object():
    assert parse_question(b'{"question": "Where?", "context": ["the 5 bus"]}') == ("Where?", ["the 5 bus"])
    assert parse_question('{"question": "Où est la gare ?"}'.encode()) == ("Où est la gare ?", [])


@pytest.mark.parametrize(
    "body, named",
    [
        (b"question=where", "not JSON"),
        (b"\xff\xfe", "not UTF-8"),
        (b'["where"]', "must be a JSON object"),
        (b"{}", '"question" must be a non-empty string'),
        (b'{"question": "  "}', '"question" must be a non-empty string'),
        (b'{"question": 3}', '"question" must be a non-empty string'),
        (b'{"question": "where", "context": "the 5"}', '"context" must be a list of strings'),
        (b'{"question": "where", "context": [1]}', '"context" must be a list of strings'),
        (b'{"question": "where", "k": 5}', "unknown field(s) k"),
        (b'{"question": "x", "context": ' + b"[" * 20_000 + b"]" * 20_000 + b"}", "nests too deeply"),
        (b'{"question": "\\u200b???"}', "has no letter or digit"),
        (b'{"question": "' + b"where " * 400 + b'"}', '"question" is 2400 characters; at most 2000'),
        (b'{"question": "bikes \\ud800 on trains"}', '"question" is not valid Unicode: surrogates not allowed'),
        (b'{"question": "bikes?", "context": ["\\udfff"]}', '"context" is not valid Unicode'),
    ],
)
def test_a_body_that_is_not_a_question_is_refused_naming_what_is_wrong(body, named):
    with pytest.raises(BadRequest) as refused:
        parse_question(body)
    assert named in str(refused.value)


# --- a served night ----------------------------------------------------------------------------------------------


def sourcegate(config: Path, *args: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "sourcegate.pipelines.app.cli", "--config", str(config), *args]
    return subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=ENV, timeout=900)


def request(url: str, body: bytes | None = None) -> tuple[int, str, dict]:
    """(status, content type, JSON body) of a GET, or a POST of `body`."""
    req = urllib.request.Request(url, data=body, method="POST" if body is not None else "GET")
    try:
        with urllib.request.urlopen(req, timeout=300) as resp:
            return resp.status, resp.headers["Content-Type"], json.loads(resp.read())
    except urllib.error.HTTPError as err:
        return err.code, err.headers["Content-Type"], json.loads(err.read())


class Served:
    """A `sourcegate serve` process on a free loopback port (its first line names the port)."""

    def __init__(self, config: Path, artifacts: Path):
        cmd = [sys.executable, "-m", "sourcegate.pipelines.app.cli", "--config", str(config), "serve"]
        cmd += ["--artifacts", str(artifacts), "--port", "0"]
        self.proc = subprocess.Popen(cmd, cwd=ROOT, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.first_line = self.proc.stdout.readline().strip()  # printed once the models are loaded
        if not self.first_line.startswith("sourcegate serve: http://"):
            self.stop()
            raise AssertionError(f"serve did not start: {self.first_line!r} {self.proc.stderr.read()}")
        self.url = self.first_line.split()[2]

    def get(self, path: str):
        return request(self.url + path)

    def post(self, path: str, body: bytes):
        return request(self.url + path, body)

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.terminate()
        try:
            return self.proc.wait(timeout=60)
        finally:
            self.proc.stdout.close(), self.proc.stderr.close()


@pytest.fixture(scope="module")
def night(tmp_path_factory) -> dict:
    base = tmp_path_factory.mktemp("serve")
    tiny = tiny_night(base)
    artifacts = base / "artifacts"
    done = sourcegate(tiny["config"], "run", "--artifacts", str(artifacts), "--run-id", FIRST, "--quiet")
    assert done.returncode == 0, done.stderr
    return {**tiny, "artifacts": artifacts}


@pytest.fixture(scope="module")
def served(night):
    server = Served(night["config"], night["artifacts"])
    yield server
    assert server.stop() == 0  # SIGTERM: a clean exit


@pytest.mark.models
def test_health_names_the_live_version_and_the_verdict_that_proved_its_decision(night, served):
    assert served.first_line.endswith(f"(version {FIRST})") and "127.0.0.1" in served.url
    status, kind, body = served.get("/health")
    assert (status, kind) == (200, "application/json")
    assert body == {
        "status": "ok",
        "version": FIRST,
        "proven_by": str(night["artifacts"] / "runs" / FIRST / "gate.json"),
        "unproven": False,
        "overridden": [],
        "kept_text_vectors": 0,  # the decision's signals encode no passage text: nothing lent (--all-signals lends)
    }


@pytest.mark.models
def test_a_served_answer_is_what_query_answers_and_names_its_version(night, served):
    for question, context in ((BIKE, []), ("What is the capital of Australia?", []), ("and at night?", [BIKE])):
        status, kind, body = served.post("/query", json.dumps({"question": question, "context": context}).encode())
        assert kind == "application/json"
        args = ["query", question, "--artifacts", str(night["artifacts"]), "--json"]
        for turn in context:
            args += ["--context", turn]
        asked = sourcegate(night["config"], *args)
        assert asked.returncode in (0, 2), asked.stderr
        expected = json.loads(asked.stdout)
        assert status == (200 if asked.returncode == 0 else 503)
        assert body.pop("version") == FIRST
        assert set(body.pop("timings_s")) >= {"queued", "embed", "search", "rerank", "signals"}
        assert body == expected
    assert body["context"] == [BIKE] and body["query"] == f"{BIKE} and at night?"


@pytest.mark.models
def test_a_bad_body_is_a_400_naming_what_is_wrong_and_the_server_keeps_serving(served):
    for body, named in ((b"not json", "not JSON"), (b'{"q": "x"}', "unknown field(s) q")):
        status, kind, answer = served.post("/query", body)
        assert (status, kind) == (400, "application/json") and named in answer["error"]
        assert "Traceback" not in answer["error"]
    assert served.get("/query")[0] == 404 and served.post("/health", b"{}")[0] == 404
    assert served.get("/health")[0] == 200


@pytest.mark.models
def test_a_promotion_moves_what_is_served_without_a_restart(night, served):
    shutil.copy(DEMO / ARTICLES[2], night["corpus"] / ARTICLES[2])  # the second night has one article more
    done = sourcegate(night["config"], "run", "--artifacts", str(night["artifacts"]), "--run-id", SECOND, "--quiet")
    assert done.returncode == 0, done.stderr
    assert (night["artifacts"] / "LIVE").read_text().strip() == SECOND
    status, _, health = served.get("/health")
    assert (status, health["version"]) == (200, SECOND)
    assert health["proven_by"] == str(night["artifacts"] / "runs" / SECOND / "gate.json")
    status, _, body = served.post("/query", json.dumps({"question": BIKE}).encode())
    assert status == 200 and body["version"] == SECOND and body["proven_by"] == health["proven_by"]
    rolled = sourcegate(night["config"], "rollback", "--artifacts", str(night["artifacts"]))
    assert rolled.returncode == 0, rolled.stderr
    assert served.get("/health")[2]["version"] == FIRST  # a rollback moves it back


@pytest.mark.models
def test_without_a_live_version_health_and_query_are_503_saying_why(night, tmp_path):
    server = Served(night["config"], tmp_path / "empty")
    try:
        assert "unavailable: no live version" in server.first_line
        status, kind, health = server.get("/health")
        assert (status, kind) == (503, "application/json")
        assert health["status"] == "unavailable" and health["version"] is None
        assert "no live version" in health["error"]
        status, _, body = server.post("/query", json.dumps({"question": BIKE}).encode())
        assert status == 503 and "no live version" in body["error"]
    finally:
        assert server.stop() == 0


@pytest.mark.models
def test_a_stop_answers_the_questions_already_taken_before_the_process_exits(night):
    """A rolling restart sends SIGTERM while clients wait: the questions the server already took are answered (the
    process exits 0 after them), not cut off with a reset."""
    import concurrent.futures as cf

    server = Served(night["config"], night["artifacts"])
    questions = [
        f"{q} (asked during a restart)" for q in (BIKE, "How much is a day pass?", "Where do I find lost items?")
    ]
    try:
        with cf.ThreadPoolExecutor(len(questions)) as pool:
            asked = [pool.submit(server.post, "/query", json.dumps({"question": q}).encode()) for q in questions]
            time.sleep(0.3)  # accepted at once; the three take seconds through the models, one at a time
            server.proc.terminate()
            answers = [a.result(timeout=120) for a in asked]
        code = server.proc.wait(timeout=60)  # once, by the one SIGTERM (a second one stops at once)
    finally:
        server.stop()
    assert [status for status, _, _ in answers] == [200, 200, 200]
    assert sorted(body["question"] for _, _, body in answers) == sorted(questions) and code == 0
