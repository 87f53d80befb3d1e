"""`sourcegate run` end to end on the demo corpus, embedded backend, real models."""

import json
import re
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from sourcegate.pipelines.app.cli import main
from tests.promotable import WHOLE_FIT, promotable_args

pytestmark = pytest.mark.models


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory):
    return tmp_path_factory.mktemp("run") / "artifacts"


def read(path):
    return json.loads(path.read_text())


def test_first_night_builds_passes_the_gate_and_promotes(artifacts, capsys):
    assert (
        main([*promotable_args(), "run", "--artifacts", str(artifacts), "--run-id", "20261101-020000", "--quiet"]) == 0
    )
    out = capsys.readouterr().out
    assert "gate: PASSED" in out and "report.html" in out
    run = artifacts / "runs" / "20261101-020000"
    for name in [
        "documents.parquet",
        "chunks.parquet",
        "manifest.parquet",
        "quarantine.jsonl",
        "quality.json",
        "calibration.json",
        "precision.json",
        "questions.jsonl",
        "gate.json",
        "junit.xml",
        "report.html",
        "run.json",
    ]:
        assert (run / name).exists(), name
    gate = read(run / "gate.json")
    assert gate["passed"] and gate["reasons"] == []
    info = read(run / "run.json")
    assert info["counts"]["ingest"]["documents"] >= 40 and info["counts"]["embedded"] == info["counts"]["chunks"]
    assert info["versions"]["sentence-transformers"] and info["models"]["reranker"]["id"].startswith("cross-encoder/")
    answer_model = info["models"]["answer_support"]  # the fixture's: the shipped SQuAD-trained one, its top 3
    assert answer_model["id"].startswith("sourcegate answer-support") and answer_model["path"] is None
    assert answer_model["passages"] == 3 and answer_model["fingerprint"].startswith("sha256:")
    assert (artifacts / "LIVE").read_text().strip() == "20261101-020000"
    stages = info["evaluate_stages_s"]  # where the evaluate step's seconds went, by retrieval stage
    assert set(stages) == {"embed", "search", "rerank", "signals", "answer"} and min(stages.values()) >= 0
    assert stages["rerank"] > 0 and stages["answer"] > 0 and sum(stages.values()) <= info["timings_s"]["evaluate"]
    calibration = read(run / "calibration.json")
    for signal in ["cosine_top", "rerank_top", "bm25_z", "term_coverage", "margin", "bm25_top"]:
        s = calibration["signals"][signal]
        for key in [
            "answer_band",
            "decline_band",
            "gap",
            "auc",
            "recommended_threshold",
            "decline_recall_at_recommended",
        ]:
            assert key in s, (signal, key)
    assert calibration["shortlist_recall"]["recall"] >= 0.9
    print("shortlist recall@12:", calibration["shortlist_recall"]["recall"])
    precision = read(run / "precision.json")
    assert set(precision["by_kind"]) == {"section", "article", "indirect"}


def test_second_night_with_no_change_encodes_nothing(artifacts, capsys):
    assert (
        main([*promotable_args(), "run", "--artifacts", str(artifacts), "--run-id", "20261102-020000", "--quiet"]) == 0
    )
    info = read(artifacts / "runs" / "20261102-020000" / "run.json")
    assert info["counts"]["embedded"] == 0 and info["counts"]["embedding_reused"] == info["counts"]["chunks"]
    assert info["counts"]["ingest"]["unchanged"] == info["counts"]["ingest"]["documents"]
    # the evaluation too: the first night's question, word and sentence vectors and rerank logits are read, not computed
    kept = info["eval_kept"]
    assert info["eval_kept_refused"] == {}  # the first night's verdict bound every file it kept
    assert kept["text_vectors.parquet"]["computed"] == 0 and kept["text_vectors.parquet"]["reused"] > 0
    assert kept["rerank_pairs.parquet"]["computed"] == 0 and kept["rerank_pairs.parquet"]["reused"] > 0
    assert kept["answer_pairs.parquet"]["computed"] == 0 and kept["answer_pairs.parquet"]["reused"] > 0
    a = pq.read_table(artifacts / "runs" / "20261101-020000" / "chunks.parquet")
    b = pq.read_table(artifacts / "runs" / "20261102-020000" / "chunks.parquet")
    assert a.equals(b)  # same inputs and config: same chunk ids and embeddings
    first = read(artifacts / "runs" / "20261101-020000" / "calibration.json")
    second = read(artifacts / "runs" / "20261102-020000" / "calibration.json")
    assert first["signals"] == second["signals"]  # same calibration numbers
    assert (artifacts / "LIVE").read_text().strip() == "20261102-020000"
    # compared question by question with the live version it replaced: nothing moved
    diff = read(artifacts / "runs" / "20261102-020000" / "diff_live.json")
    assert diff["live"] == "20261101-020000" and diff["n"] >= 100 and diff["moved"] == []


def test_a_safe_looking_threshold_fails_the_gate_and_keeps_the_live_index(artifacts, capsys):
    strict = ["--set", "answer.strong=0.99", "--set", "answer.adjacent=0.99"]  # after the fixture's own answer.*
    argv = [*promotable_args(), *strict, "run", "--artifacts", str(artifacts)]
    code = main([*argv, "--run-id", "20261103-020000", "--quiet"])
    assert code == 1
    out = capsys.readouterr().out
    assert "gate: FAILED" in out and "declines" in out
    gate = read(artifacts / "runs" / "20261103-020000" / "gate.json")
    assert not gate["passed"] and {c["name"] for c in gate["checks"] if not c["passed"]} == {
        "answer_coverage",
        "threshold_in_gap",
        "check_set",  # 0.99 declines the check set's should-answer questions too
    }
    assert (artifacts / "LIVE").read_text().strip() == "20261102-020000"  # the last good index still serves
    assert (artifacts / "runs" / "20261103-020000" / "index").is_dir()  # kept for a maintainer to inspect


def test_query_cli_prints_mode_and_passages(artifacts, capsys):
    proven = promotable_args()  # the config the live version's verdict proved (a query under another is refused)
    asked = [*proven, "query", "How much does a monthly pass cost?", "--artifacts", str(artifacts), "--json"]
    assert main(asked) == 0
    payload = json.loads(capsys.readouterr().out)
    assert payload["mode"] in {"sourced", "adjacent"} and payload["passages"]
    assert payload["proven_by"] == str(artifacts / "runs" / "20261102-020000" / "gate.json") and not payload["unproven"]
    assert "answerability" not in payload["signals"]  # the decision does not read the combiner's score
    assert main([*asked, "--all-signals"]) == 0  # every signal a night measures
    everything = json.loads(capsys.readouterr().out)
    assert 0.0 < everything["signals"]["answerability"] < 1.0  # the accepted combiner's score, with the others
    assert {k: everything[k] for k in ("mode", "value", "passages")} == {
        k: payload[k] for k in ("mode", "value", "passages")
    }
    assert all("bm25_rank" in p and "knn_rank" in p and "rerank_probability" in p for p in payload["passages"])
    assert main([*proven, "query", "What is the capital of Australia?", "--artifacts", str(artifacts), "--json"]) == 0
    payload = json.loads(capsys.readouterr().out)
    assert payload["mode"] == "decline" and len(payload["passages"]) == 3
    assert (
        main(
            [
                *proven,
                "query",
                "does that apply on Sundays too?",
                "--context",
                "Is the Night Owl bus free?",
                "--artifacts",
                str(artifacts),
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert out.startswith("mode: ") and "Night Owl" in out and "rerank" in out


def rows_by_id(path):
    """questions.jsonl's fit-set rows by question id."""
    rows = (json.loads(line) for line in path.read_text(encoding="utf-8").splitlines())
    return {r["id"]: r for r in rows if r["set"] == "calibration"}


def test_calibrate_command_on_an_existing_index(artifacts, tmp_path, capsys):
    out = tmp_path / "cal"
    code = main(
        [
            *promotable_args(),
            "--set",
            f"artifacts={artifacts}",  # where its look at the check set is logged
            "calibrate",
            "--index",
            str(artifacts / "runs" / "20261102-020000"),
            "--questions",
            WHOLE_FIT,
            "--out",
            str(out),
            "--quiet",
        ]
    )
    assert (out / "calibration.json").exists() and (out / "gate.json").exists() and (out / "report.html").exists()
    printed = capsys.readouterr().out
    assert code in (0, 1) and ("gate: PASSED" if code == 0 else "gate: FAILED") in printed
    # the night's kept vectors and pair scores are reused, and give the numbers the night computed
    reused = dict(re.findall(r"(\w+)\.parquet (\d+)", printed.split("reused from", 1)[1].splitlines()[0]))
    assert all(int(reused[name]) > 0 for name in ("text_vectors", "rerank_pairs", "answer_pairs")), reused
    night_rows = rows_by_id(artifacts / "runs" / "20261102-020000" / "questions.jsonl")
    calibrate_rows = rows_by_id(out / "questions.jsonl")
    shared = night_rows.keys() & calibrate_rows.keys()
    assert len(shared) == 63  # the night's fit set (a sample of calibration-pre28.jsonl: tests/promotable.py)
    for qid in shared:
        for signal in ("cosine_top", "rerank_top", "answer_support", "sentence_cosine"):
            assert calibrate_rows[qid]["signals"][signal] == night_rows[qid]["signals"][signal], (qid, signal)
    # calibrate fits a candidate combiner beside its calibration and sweeps it; the accepted one is untouched
    fitted, calibration = read(out / "answerability_combiner.json"), read(out / "calibration.json")
    assert calibration["combiner"]["refit"] and calibration["combiner"]["coef"] == fitted["coef"]
    assert calibration["combiner"]["training"]["sha256"] == fitted["training"]["sha256"]
    assert calibration["signals"]["answerability"]["auc"] is not None
    assert "Fitted by this calibration" in (out / "report.html").read_text()
    night = read(artifacts / "runs" / "20261102-020000" / "calibration.json")["combiner"]
    assert not night["refit"] and night["path"] == "config/baselines/answerability_combiner.json"


def test_the_shipped_decision_separates_the_questions_that_decide_it(artifacts):
    """The demo's gate passes on the shipped decision by narrow margins (docs/benchmarks/18-users-words.md):
    the lowest should-answer and highest off-topic questions of the fit set, scored with the shipped config on a
    test night's index (same corpus, same index settings), fall on their sides of the threshold. A change to
    retrieval or the answer model that closes the gap fails here, at five questions' cost. The check set is never
    read here: a test that held its questions would make every CI run a look at it."""
    from sourcegate.evals.evaluate import run_questions
    from sourcegate.pipelines import config
    from sourcegate.pipelines.app.factories import retriever_for
    from sourcegate.pipelines.search.embedded import open_run_folder

    root = Path(__file__).resolve().parents[1]
    cfg = config.load(root / "config" / "pipeline.yaml")
    deciding = {"u-a-053", "g-a-010", "g-a-029", "d-013", "g-o-006"}
    lines = (root / cfg.evals.calibration_set).read_text(encoding="utf-8").splitlines()
    items = [q for q in map(json.loads, lines) if q["id"] in deciding]
    assert len(items) == 5
    retriever, _ = retriever_for(cfg, open_run_folder(artifacts / "runs" / "20261101-020000"))
    scores = {r["id"]: r["signals"][cfg.answer.signal] for r in run_questions(retriever, items)}
    threshold = cfg.answer.adjacent
    wrong = {q["id"]: scores[q["id"]] for q in items if (scores[q["id"]] >= threshold) != (q["label"] == "answer")}
    assert not wrong, f"{cfg.answer.signal} at {threshold}: on the wrong side {wrong}"
