"""Retraining as the corpus grows (sourcegate/pipelines/app/retrain_step.py), the recalibrate DAG's steps run without Airflow:
a tiny answer model that learned less than `answerability.retrain_below_share` of the live version is retrained by its
recipe on that version, judged like a night in its own run folder, and shipped only through accept. The deployment,
its eval sets and the model live in a tmp folder (tests/outgrown.py); the live version is a copy of the demo index.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml

from sourcegate.evals.evalset import load_evalset
from tests.outgrown import outgrown

ROOT = Path(__file__).resolve().parents[1]
RECAL = "recal-20260102-093000"


@pytest.fixture(scope="module")
def workspace(demo_index, tmp_path_factory):
    from sourcegate.artifact_io.run_folder import RunFolder
    from sourcegate.pipelines import config

    cfg, run_id, _ = demo_index
    root = tmp_path_factory.mktemp("retrain")
    artifacts = root / "artifacts"
    shutil.copytree(RunFolder(cfg.artifacts, run_id).path, artifacts / "runs" / run_id)
    (artifacts / "LIVE").write_text(run_id + "\n")
    made = outgrown(root, artifacts, run_id)
    return {**made, "cfg": config.load(made["config_file"])}


@pytest.mark.models
def test_a_model_that_learned_too_little_is_retrained_by_its_recipe_and_judged_in_its_own_run_folder(workspace):
    from sourcegate.pipelines.app import retrain_step
    from sourcegate.pipelines.retrieval import learned_corpus
    from sourcegate.pipelines.training import retrain

    cfg, version, model = workspace["cfg"], workspace["version"], workspace["model"]
    decided = retrain_step.needed(cfg, version)
    assert decided["retrain"] is True and decided["model"] == str(model)
    assert decided["corpus"]["share"]["sections"] < 0.95 and "below 95%" in decided["why"]

    trained = retrain_step.train_candidate(cfg, RECAL, version, model)
    candidate = Path(trained["model"])
    assert candidate.parent.name == f"{RECAL}-retrained"
    old, new = retrain.recipes(model)[0], retrain.recipes(candidate)[0]
    for key in ("data", "hyperparameters", "answer_passages", "base_model"):  # the recipe's own inputs
        assert old[key] == new[key], key
    assert retrain.command_args(new)[retrain.command_args(new).index("--index") + 1].endswith(f"runs/{version}")
    retrained = retrain_step.needed(retrain_step.judged_config(cfg, candidate), version)
    assert retrained["retrain"] is False and retrained["corpus"]["share"]["sections"] == 1.0  # learned today's
    assert learned_corpus.read(candidate)["version"] == version

    judged = retrain_step.judge(cfg, RECAL, version)
    folder = candidate.parent
    gate = json.loads((folder / "gate.json").read_text())
    assert gate["gating_signal"] == "answer_support"  # the new model judged on its own threshold, placed on the fit set
    assert judged["threshold"]["signal"] == "answer_support"
    assert judged["ship"] == all(c["passed"] for c in gate["checks"] if c["name"] in retrain_step.SHIP_CHECKS)
    record = json.loads((folder / retrain_step.RECORD).read_text())
    assert record["judged"]["ship"] == judged["ship"] and record["trained"]["seeds"] == ["13"]


@pytest.mark.models
def test_a_candidate_that_failed_its_judgement_leaves_the_old_model_and_every_file_as_they_were(workspace):
    from sourcegate.pipelines.app import retrain_step

    folder = Path(workspace["cfg"].artifacts) / "runs" / f"{RECAL}-retrained"
    record = json.loads((folder / retrain_step.RECORD).read_text())
    record["judged"] = {**record["judged"], "ship": False, "why": "threshold_gap: no gap (the test's)"}
    (folder / retrain_step.RECORD).write_text(json.dumps(record))
    files = [
        workspace["config_file"],
        *sorted((workspace["root"] / "evals").iterdir()),
        workspace["root"] / "baseline.json",
    ]
    before = {p: p.read_bytes() for p in files}
    shipped = retrain_step.ship(workspace["cfg"], RECAL, workspace["config_file"], ROOT)
    assert shipped == {"shipped": False, "why": "the old model stays: threshold_gap: no gap (the test's)"}
    assert {p: p.read_bytes() for p in files} == before
    assert not list((workspace["root"] / "models").glob("tiny-*"))


@pytest.mark.models
def test_a_candidate_that_passed_ships_through_accept_and_retires_the_check_set_that_judged_it(workspace):
    """The ship step given a passing verdict (the tiny model's own verdict is whatever one epoch earned)."""
    from sourcegate.pipelines import config
    from sourcegate.pipelines.app import retrain_step

    root, config_file = workspace["root"], workspace["config_file"]
    folder = Path(workspace["cfg"].artifacts) / "runs" / f"{RECAL}-retrained"
    record = json.loads((folder / retrain_step.RECORD).read_text())
    record["judged"] = {**record["judged"], "ship": True}
    record.pop("shipped", None)  # as a new judgement leaves it (the test before shipped nothing)
    (folder / retrain_step.RECORD).write_text(json.dumps(record))
    check_ids = [q["id"] for q in load_evalset(root / "evals" / "check.jsonl")]

    shipped = retrain_step.ship(workspace["cfg"], RECAL, config_file, ROOT)
    dest = root / "models" / f"tiny-{RECAL}-retrained"
    assert shipped["shipped"] is True and shipped["model"] == str(dest) and (dest / "recipe.json").is_file()
    after = config.load(config_file)
    assert after.answerability.answer_model_path == str(dest)
    assert after.answerability.answer_passages == workspace["cfg"].answerability.answer_passages  # the reading window
    assert after.evals.check_set == str(root / "evals" / "next.jsonl")  # the next check is fresh
    assert (after.answer.signal, after.answer.adjacent) == ("answer_support", record["judged"]["threshold"]["adjacent"])
    roles = {e["file"]: e["role"] for e in yaml.safe_load((root / "evals" / "sets.yaml").read_text())["sets"]}
    assert roles == {"fit.jsonl": "fit", "check.jsonl": "retired", "next.jsonl": "check"}
    fit_ids = [q["id"] for q in load_evalset(root / "evals" / "fit.jsonl")]
    assert fit_ids[-len(check_ids) :] == check_ids
    baseline = json.loads((root / "baseline.json").read_text())
    assert baseline["accepted_from"] == f"runs/{RECAL}-retrained"
    assert baseline["threshold"] == record["judged"]["threshold"]
    moves = [json.loads(x) for x in (root / "check_moves.jsonl").read_text().splitlines()]
    assert moves[-1]["moved"] == check_ids and moves[-1]["accepted_from"] == f"runs/{RECAL}-retrained"
    # the task retried: after its record (said again), or after the config switched and before the record
    assert retrain_step.ship(after, RECAL, config_file, ROOT) == shipped
    record = json.loads((folder / retrain_step.RECORD).read_text())
    (folder / retrain_step.RECORD).write_text(json.dumps({k: v for k, v in record.items() if k != "shipped"}))
    again = retrain_step.ship(config.load(config_file), RECAL, config_file, ROOT)
    assert again["shipped"] is True and again["model"] == str(dest)
    assert [p.name for p in (root / "models").iterdir() if p.name.startswith("tiny-")] == [f"tiny-{RECAL}-retrained"]
    assert config.load(config_file).answerability.answer_model_path == str(dest)


def test_a_retrain_is_asked_only_of_a_corpus_specific_model_below_the_configured_share(tmp_path):
    from sourcegate.pipelines import config
    from sourcegate.pipelines.app import retrain_step

    off = config.load(ROOT / "config" / "pipeline.yaml", {"answerability.retrain_below_share": None})
    assert retrain_step.needed(off, "v")["why"] == "answerability.retrain_below_share is null: never retrained"
    remote = config.load(ROOT / "config" / "pipeline.yaml", {"artifacts": "s3://bucket/prefix"})
    assert "s3:// artifacts is not supported yet" in retrain_step.needed(remote, "v")["why"]
    with pytest.raises(config.ConfigError, match="retrain_below_share 0.5 must be null or between min_corpus_share"):
        config.load(ROOT / "config" / "pipeline.yaml", {"answerability.retrain_below_share": 0.5})


def test_a_candidate_is_judged_reading_the_configured_window_not_the_one_it_drew_its_training_pairs_from():
    """A model trained on the top 10 is read over the top 5 when the config says 5: the window that ships is the one
    the fit and check sets judged (docs/benchmarks/30-answer-window.md)."""
    from sourcegate.pipelines import config
    from sourcegate.pipelines.app import retrain_step

    cfg = config.load(ROOT / "config" / "pipeline.yaml", {"answerability.answer_passages": 5})
    judged = retrain_step.judged_config(cfg, "models/candidate")
    assert judged.answerability.answer_passages == 5 and judged.answerability.answer_model_path == "models/candidate"
    assert (judged.answer.signal, judged.answer.candidates) == ("auto", ["answer_support"])


def test_a_candidate_ships_only_on_a_gap_a_passed_check_and_no_judged_question_learned():
    from sourcegate.pipelines.app.retrain_step import verdict

    def gate(**failed):
        names = ("threshold_gap", "check_set", "answer_model_unseen", "precision_regression")
        checks = [{"name": n, "passed": n not in failed, "detail": failed.get(n, "")} for n in names]
        return {"gating_signal": "answer_support", "checks": checks}

    assert verdict(gate())["ship"] is True
    assert verdict(gate(precision_regression="lost 4"))["ship"] is True  # the reranker's business, not the model's
    kept = verdict(gate(check_set="c-a-3 declined"))
    assert kept["ship"] is False and kept["why"] == "check_set: c-a-3 declined"
    assert verdict(gate(threshold_gap="no gap"))["ship"] is False
    assert verdict(gate(answer_model_unseen="trained on c-a-1"))["ship"] is False
    assert verdict({**gate(), "gating_signal": "auto"})["ship"] is False


def test_a_config_value_is_rewritten_in_place_its_comment_kept_and_a_folded_old_value_dropped(tmp_path):
    from sourcegate.pipelines import config
    from sourcegate.pipelines.app.accepting import planned, with_value

    text = (ROOT / "config" / "pipeline.yaml").read_text()
    line = next(x for x in text.splitlines() if x.startswith("  calibrated_by: "))
    folded = text.replace(line, line[:60] + "\n    continued on a line of its own," + line[60:])
    assert folded != text  # a long scalar folded onto two lines, as yaml.safe_dump writes it
    path = tmp_path / "pipeline.yaml"
    path.write_text(folded)
    written = planned(path, {"answer.calibrated_by": "runs/r-retrained", "answer.adjacent": 0.00123})
    assert "continued on a line of its own" not in written and path.read_text() == folded  # planned: not written
    path.write_text(written)
    after = config.load(path)
    assert (after.answer.calibrated_by, after.answer.adjacent) == ("runs/r-retrained", 0.00123)
    assert "  adjacent: 0.00123      # `placement: tightest` (0.04 logit below" in written  # its comment kept
    with pytest.raises(ValueError, match="has no key no_such_key"):
        with_value(text, "answer.no_such_key", 1)


def test_a_corpus_that_outgrew_the_model_in_one_night_is_retrained_on_that_nights_version(tmp_path):
    """Nine new articles in one night take the model from every section to 84%: that night fails
    `answer_model_corpus` and LIVE stays on the corpus the model knows whole. Retraining on LIVE would learn nothing
    new and no night would pass again, so the failed night's version is the one retrained on; a newest night that
    failed for another reason, or none after LIVE, leaves LIVE."""
    from sourcegate.pipelines import config
    from sourcegate.pipelines.app import retrain_step

    cfg = config.load(ROOT / "config" / "pipeline.yaml", {"artifacts": str(tmp_path)})

    def night(run_id: str, started: str, failed: str | None = None) -> None:
        folder = tmp_path / "runs" / run_id
        folder.mkdir(parents=True)
        (folder / "chunks.parquet").write_bytes(b"")
        (folder / "run.json").write_text(json.dumps({"started_at": f"2026-12-0{started}T00:00:00+00:00"}))
        if failed:
            checks = [{"name": "threshold_gap", "passed": True}, {"name": failed, "passed": False}]
            (folder / "gate.json").write_text(json.dumps({"passed": False, "checks": checks}))

    night("20261201-000000", "1")
    assert retrain_step.retrain_version(cfg, "20261201-000000")[0] == "20261201-000000"
    night("20261202-000000", "2", failed="precision_regression")
    version, why = retrain_step.retrain_version(cfg, "20261201-000000")
    assert version == "20261201-000000" and "did not fail for the answer model's share" in why
    night("manual", "3", failed="answer_model_corpus")  # ordered by creation, not by name
    version, why = retrain_step.retrain_version(cfg, "20261201-000000")
    assert version == "manual" and "learned too little of it" in why
    (tmp_path / "runs" / "recal-20261204-000000-retrained").mkdir()  # a candidate's folder builds no version
    assert retrain_step.retrain_version(cfg, "20261201-000000")[0] == "manual"
