"""Retraining as the corpus grows: the recalibrate DAG's steps that retrain the answer model on the live version,
judge the new model, and ship it only through `accept`.

A model trained on a corpus knows the sections it learned (sourcegate/pipelines/retrieval/learned_corpus.py). Once today's live
version holds fewer than `answerability.retrain_below_share` of its sections unchanged, the model is retrained by its
own recipe (`sourcegate retrain` machinery, sourcegate/pipelines/training/retrain.py: the same training sets found by content hash,
the same seeds, window and command) over the live version, into a candidate run folder `<recal run>-retrained/`.
The candidate is evaluated there like a night, with `answer_support` as the only candidate signal of the rule in
sourcegate/evals/signal_choice.py (its threshold placed on the fit set, as the model is new), and gated. It ships only when the
fit set has a gap on it, the check set passes at that threshold, and it trained on no fit or check question; it then
ships as any decision does, through `accept` (sourcegate/pipelines/app/accepting.py): its folder copied beside the old model, the
config file switched to it and to the decision judged (`answer_support` at its threshold), the check set that judged
it retired. Otherwise the old model stays and `retrain.json` says why. Each step is a plain function over the config.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
from pathlib import Path
from typing import Any

from sourcegate.artifact_io import read_json, write_json
from sourcegate.artifact_io import run_folder as rf
from sourcegate.artifact_io.run_folder import RunFolder
from sourcegate.evals.check_set import threshold_of
from sourcegate.pipelines import config as config_mod
from sourcegate.pipelines.app.accepting import accept_run, file_value
from sourcegate.pipelines.app.steps import answer_model_corpus, evaluate_step, gate_step
from sourcegate.pipelines.config import PipelineConfig
from sourcegate.pipelines.release import runs
from sourcegate.pipelines.release.lock import writer_lock
from sourcegate.pipelines.retrieval.answer_support import AnswerSupportModel
from sourcegate.pipelines.training import retrain
from sourcegate.pipelines.versions.object_store import is_remote

log = logging.getLogger(__name__)

RECORD = "retrain.json"  # in the candidate's run folder: what was decided at each step, and why
MODEL = "answer_model"  # the candidate model, inside its run folder
SHIP_CHECKS = ("threshold_gap", "check_set", "answer_model_unseen")  # the gate checks a retrained model must pass


def candidate(cfg: PipelineConfig, recal_run: str) -> RunFolder:
    """The run folder the recalibration `recal_run` retrains and judges its candidate model in."""
    return RunFolder(cfg.artifacts, f"{recal_run}-retrained")


def needed(cfg: PipelineConfig, version: str) -> dict[str, Any]:
    """Whether the configured answer model must be retrained on `version` (the live one), and why (or why not)."""
    below = cfg.answerability.retrain_below_share
    if below is None:
        return {"retrain": False, "why": "answerability.retrain_below_share is null: never retrained"}
    if is_remote(cfg.artifacts):
        return {
            "retrain": False,
            "why": "retraining on s3:// artifacts is not supported yet (a model is a local folder)",
        }
    corpus = answer_model_corpus(cfg, RunFolder(cfg.artifacts, version).loadable_chunks())
    if corpus is None or corpus["scope"] != "corpus":
        what = "answer_support is off" if corpus is None else f"the answer model {corpus['path']} is generic"
        return {"retrain": False, "why": f"{what}: nothing learned this corpus", "corpus": corpus}
    folder = Path(corpus["path"])
    if not any((folder / name).is_file() for name in ("recipe.json", "ensemble.json")):
        return {"retrain": False, "why": f"{folder} has no recipe.json to retrain it by", "corpus": corpus}
    share = (corpus.get("share") or {}).get("sections")
    learned = "records no corpus it learned" if share is None else f"learned {share:.0%} of today's sections"
    if share is not None and share >= below:
        why = f"{folder} {learned} (retrained below {below:.0%})"
        return {"retrain": False, "why": why, "corpus": corpus}
    return {"retrain": True, "why": f"{folder} {learned}: below {below:.0%}", "model": str(folder), "corpus": corpus}


def retrain_version(cfg: PipelineConfig, live: str) -> tuple[str, str]:
    """The version to retrain on, and why: the live one, unless the newest night built after it failed its gate
    because the answer model learned too little of that night's corpus. Then the corpus moved past the model in one
    step (past `min_corpus_share` before `retrain_below_share` was ever reached on a live version): no night passes
    until the model learns the new corpus, and a model retrained on LIVE would learn only the corpus it knows."""
    folders = Path(cfg.artifacts) / rf.RUNS
    nights = [r.name for r in runs.list_runs(folders) if (folders / r.name / rf.CHUNKS).exists()]  # built a version
    newest = nights[-1] if nights and live in nights and nights[-1] != live else None
    if newest is None:
        return live, "the live version (no night built after it)"
    gate_path = folders / newest / rf.GATE
    checks = read_json(gate_path).get("checks", []) if gate_path.exists() else []
    if any(c["name"] == "answer_model_corpus" and not c["passed"] for c in checks):
        return (
            newest,
            f"night {newest}, newer than live {live}: its gate failed as the answer model learned too little of it",
        )
    return live, f"the live version (the newest night, {newest}, did not fail for the answer model's share)"


def train_candidate(cfg: PipelineConfig, recal_run: str, version: str, model: str | Path) -> dict[str, Any]:
    """The model retrained by its recipe over `version` into the candidate run folder (torch checkpoints in a
    scratch folder, removed). RuntimeError when the training command fails (its log names the cause)."""
    from sourcegate.pipelines.app.cli import build_parser, train_in_domain

    folder = candidate(cfg, recal_run).path
    out = folder / MODEL
    if out.exists():  # a retried task: the earlier try's model is partial or was not judged
        shutil.rmtree(out)
    folder.mkdir(parents=True, exist_ok=True)
    argv, resolved = retrain.retrain_argv(Path(model), out, RunFolder(cfg.artifacts, version).path)
    args = build_parser().parse_args(argv)  # the window it names is applied to the config below
    trained_cfg = config_mod.replace(cfg, {"answerability.answer_passages": resolved["window"]})
    with tempfile.TemporaryDirectory(prefix="sourcegate-retrain-") as work:
        args.work = work
        code = train_in_domain(trained_cfg, args)
    if code != 0:
        raise RuntimeError(f"retraining {model} on {version} exited {code}")
    record = {"from_model": str(model), "version": version, "argv": argv, **resolved, "model": str(out)}
    write_json({"trained": record}, folder / RECORD)
    return record


def judged_config(cfg: PipelineConfig, model: str | Path) -> PipelineConfig:
    """The config a candidate is judged under: its model reading the configured window (which may be narrower than
    the window it drew its training pairs from: docs/benchmarks/30-answer-window.md), `answer_support` the only
    signal the rule may pick (its threshold placed on the fit set)."""
    return config_mod.replace(
        cfg,
        {
            "answerability.answer_model_path": str(model),
            "answer.signal": "auto",
            "answer.candidates": ["answer_support"],
        },
    )


def verdict(gate: dict) -> dict[str, Any]:
    """Ship or keep: the SHIP_CHECKS of the candidate's gate, with the details of those that failed."""
    failed = [c for c in gate["checks"] if c["name"] in SHIP_CHECKS and not c["passed"]]
    if gate.get("gating_signal") != "answer_support":
        failed.append({"name": "gating_signal", "detail": "the rule picked no answer_support threshold"})
    why = "; ".join(f"{c['name']}: {c['detail']}" for c in failed)
    return {"ship": not failed, "why": why or "the fit set has a gap and the check set passed at its threshold"}


def judge(cfg: PipelineConfig, recal_run: str, version: str) -> dict[str, Any]:
    """Evaluate and gate the candidate on `version` in its run folder; the verdict recorded in retrain.json."""
    run = candidate(cfg, recal_run)
    folder = run.path
    judged = judged_config(cfg, folder / MODEL)
    evaluate_step(run, judged, version=version)
    gate = gate_step(run, judged)
    decided = verdict(gate)
    threshold = threshold_of(read_json(folder / "calibration.json"))
    earlier = {k: v for k, v in read_json(folder / RECORD).items() if k != "shipped"}  # judged anew: ship anew
    write_json({**earlier, "judged": {**decided, "threshold": threshold}}, folder / RECORD)
    return {**decided, "threshold": threshold, "run": run.run_id}


def ship(cfg: PipelineConfig, recal_run: str, config_path: Path, root: Path) -> dict[str, Any]:
    """A candidate that passed, shipped through `accept`: its model copied beside the configured one (under the
    candidate run's name), the config file switched to it and to the decision judged (`answer_support` at its
    threshold; under `answer.signal: auto` the model only, the rule keeps choosing); the check set that judged it
    retired. One that did not pass: nothing changes, and the record says why."""
    retrained = candidate(cfg, recal_run)
    run, folder = retrained.run_id, retrained.path
    record = read_json(folder / RECORD)
    if record.get("shipped"):  # a retried task: shipped (or kept) already, said once
        return record["shipped"]
    judged = record.get("judged") or {}
    if not judged.get("ship"):
        record["shipped"] = {"shipped": False, "why": f"the old model stays: {judged.get('why', 'not judged')}"}
        write_json(record, folder / RECORD)
        return record["shipped"]
    old = Path(AnswerSupportModel.folder_of(cfg.answerability.answer_model_path))
    if old.name.endswith(f"-{run}"):  # a try that switched the config and died before its record: it shipped
        shipped = {
            "shipped": True,
            "model": str(old),
            "config_written": True,
            "check_retired": None,
            "next_check": None,
        }
        write_json({**record, "shipped": shipped}, folder / RECORD)
        return shipped
    dest = old.parent / f"{old.name}-{run}"
    in_file = file_value(config_path, "answerability.answer_model_path")
    also: dict[str, Any] = {"answerability.answer_model_path": str(Path(in_file).parent / dest.name)}
    if file_value(config_path, "answer.signal") != "auto":  # the decision that ships is the one the check set judged
        also |= {"answer.signal": "answer_support", "answer.adjacent": judged["threshold"]["adjacent"]}
    if file_value(config_path, "answer.calibrated_by") is not None:
        also["answer.calibrated_by"] = f"runs/{run} (answer model retrained by the recalibrate DAG, shipped by accept)"
    if not cfg.evals.baseline:
        raise ValueError("evals.baseline is null: a retrained model ships through accept, which writes the baseline")
    with writer_lock(cfg, f"ship {run}"):
        if not dest.exists():
            shutil.copytree(folder / MODEL, dest)
        baseline = Path(cfg.evals.baseline)
        accepted = accept_run(judged_config(cfg, dest), folder, f"runs/{run}", baseline, config_path, root, also)
    shipped = {
        "shipped": True,
        "model": str(dest),
        "config_written": accepted["config_written"],
        "check_retired": bool(accepted["moved"]),
        "next_check": str(accepted["next_check"]) if accepted["next_check"] else None,
    }
    write_json({**record, "shipped": shipped}, folder / RECORD)
    return shipped
