"""The evaluation of one index: the labelled sets through a retriever into calibration.json,
precision.json and questions.jsonl, then the gate verdict and the report from those files.

The retriever is anything with `retrieve(question, context)` (sourcegate.pipelines.retrieval.retriever.Retriever);
the evaluate and gate steps, `sourcegate calibrate` and the benchmarks all run this one harness.
What it reads of the pipeline's config arrives as `Judging`: the sections it needs, typed, built by the caller
(sourcegate/evals/ imports nothing of sourcegate/pipelines/); what the evals below it read is handed on as plain data.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from sourcegate.artifact_io import read_json, write_json, write_jsonl
from sourcegate.artifact_io import run_folder as rf
from sourcegate.artifact_io.run_folder import ANSWER_PAIRS, RERANK_PAIRS, TEXT_VECTORS
from sourcegate.evals import check_log
from sourcegate.evals.calibration import calibrate
from sourcegate.evals.diff import QUESTIONS, diff_runs
from sourcegate.evals.evalset import EvalSetError, check_labels, copies, load_evalset, question_key
from sourcegate.evals.evaluate import qrels_for, question_rows, run_questions, shortlist_recall, with_source_rank
from sourcegate.evals.gate import evaluate_gate, write_gate
from sourcegate.evals.precision import precision_eval
from sourcegate.evals.regression import check_baseline
from sourcegate.evals.report import write_report
from sourcegate.evals.signal_choice import resolve


@dataclass(frozen=True)
class Judging:
    """What an evaluation and its gate read of the pipeline's config: its sections, as the config types them."""

    evals: Any  # the eval sets, precision's ks, the baseline, the regression test
    calibration: Any  # the sweep: signals swept, placement, margins, the promise
    answer: Any  # the decision: gating signal, thresholds, the rule's candidates
    reranker: Any  # the cross-encoder that reranks (kind, model path): the precision eval must have used it
    rerank_depth: int  # retrieval.rerank_depth: the shortlist the reranker reads
    answer_passages: int  # answerability.answer_passages: the window the answer model reads


class NotAVerdict(RuntimeError):
    """An evaluation whose measurement did not happen as configured (the reranker did not run on the precision
    set): neither a passed nor a failed gate."""


def check_reranker_ran(reranker, precision: dict, calibration: dict | None = None) -> None:
    """A configured reranker that did not rerank every question (a timeout on a loaded worker, a failure) would
    compare the fused order with itself, and leave rerank_top missing (declined) where the fit and check sets gate
    or choose on it: the verdict would measure the failure and bind the reranker's fingerprint to that. No verdict."""
    if reranker.kind == "none":
        return
    parts = (("precision", precision, rf.PRECISION), ("fit and check", calibration or {}, rf.CALIBRATION))
    for what, part, name in parts:
        if "error" not in part and part.get("reranker_used") is False:
            raise NotAVerdict(
                f"the {what} eval ran without the reranker on some question (reranker.kind {reranker.kind}, "
                f"reranker.model_path {reranker.model_path}): {name} reranker_used is false; "
                "no verdict is written (see the evaluate step's log for why it did not run: a timeout, a failure)"
            )


def calibration_config(judging: Judging, answer_model_corpus: dict | None = None) -> dict:
    """The sweep's settings as plain data (sourcegate/evals/calibration.py): the config's `calibration` section, the
    gating thresholds of its `answer` section, and for `answer.signal: auto` the candidates, less an answer model
    that has not learned enough of this corpus (sourcegate/evals/signal_choice.py)."""
    answer = judging.answer
    corpus = answer_model_corpus or {}
    excluded = {}
    if corpus.get("scope") == "corpus" and not corpus.get("enough"):
        excluded["answer_support"] = corpus.get("why") or "its model did not learn enough of this corpus"
    return {
        **judging.calibration.model_dump(),
        "gating": answer.model_dump(include={"signal", "adjacent", "strong", "strong_signal", "below"}),
        "candidates": list(answer.candidates),
        "excluded": excluded,
    }


def resolved_answer(answer, choice: dict | None):
    """The `answer` section with the signal and threshold the rule chose (as is when nothing was chosen)."""
    if not choice or choice.get("signal") is None:
        return answer
    return answer.model_copy(update={"signal": choice["signal"], "adjacent": choice["threshold"]})


def answer_model_saw(retriever, items: list[dict]) -> list[str]:
    """Ids of `items` the answer-support model trained on: the same question (`question_key`), or one asking a
    question of its recipe again (`copies`: a word or two away, or in other words by the night's bi-encoder)."""
    scorer = getattr(retriever, "answer_scorer", None)
    keys = getattr(scorer, "trained_on", frozenset())
    taught = [{"id": str(i), "question": t} for i, t in enumerate(getattr(scorer, "trained_on_questions", ()))]
    seen = {q["id"] for q in items if question_key(q) in keys}
    if taught:
        seen |= {a for a, _, _ in copies(items, taught, getattr(retriever, "text_vectors", None))}
    return [q["id"] for q in items if q["id"] in seen]


def calibrate_records(
    records: list[dict],
    judging: Judging,
    check: list[dict] = (),
    repeats=(),
    answer_model_corpus: dict | None = None,
) -> dict:
    """calibration.json from the fit set's (and the check set's) records: for `answer.signal: auto` the signal and
    threshold the rule picks on the fit set (sourcegate/evals/signal_choice.py), recorded with every candidate's row."""
    if not records:
        return {"signals": {}, "error": "no questions", "answer_model_corpus": answer_model_corpus}
    config, choice = resolve(records, calibration_config(judging, answer_model_corpus))
    calibration = calibrate(records, config, check, judging.evals.check_set, repeats)
    return {**calibration, "signal_choice": choice, "answer_model_corpus": answer_model_corpus}


def evaluate(
    retriever,
    chunks_parquet: Path,
    judging: Judging,
    out_dir: Path,
    *,
    calibration_set: str | None = None,
    precision_set: str | None = None,
    progress: bool = False,
    before_sweep: Callable[[list[dict]], dict | None] | None = None,
    kept_from: Mapping[str, Path] | None = None,
    answer_model_corpus: dict | None = None,
) -> dict:
    """Calibration sweep + precision evals of one index; writes calibration.json, precision.json.

    `before_sweep(records)` runs on the calibration records before the sweep (`sourcegate
    calibrate` refits the answerability combiner there and rescores its signal); what it
    returns is recorded under calibration.json's `combiner`. `kept_from`: the files an earlier night
    kept (TEXT_VECTORS, RERANK_PAIRS, ANSWER_PAIRS, by name; verdict.bound_kept_files gives those its verdict
    bound): their text vectors and pair logits are not computed again, and this night's are written to `out_dir`
    for the next. `answer_model_corpus`: how much of this corpus the answer model learned
    (sourcegate/pipelines/retrieval/learned_corpus.py), recorded and held by the gate.
    """
    out_dir = Path(out_dir)
    start = keep_from(retriever, kept_from)
    chunks = pq.read_table(chunks_parquet, columns=["chunk_id", "doc_id", "section_id"]).to_pylist()
    errors: list[str] = []
    sets = {}
    for name, path in (
        ("calibration", calibration_set or judging.evals.calibration_set),
        ("check", judging.evals.check_set),
        ("precision", precision_set or judging.evals.precision_set),
    ):
        if path is None:  # no check set configured: the gate says so
            sets[name] = []
            continue
        try:
            sets[name] = load_evalset(path)
            if name == "precision":  # precision needs labels; declines have none to be precise about
                sets[name] = [it for it in sets[name] if it["label"] == "answer"]
            errors += check_labels(sets[name], chunks, str(path))
        except EvalSetError as exc:
            errors.append(str(exc))
            sets[name] = []
    write_json({"errors": errors}, out_dir / rf.EVAL_ERRORS)
    stages: Counter = Counter()
    records = run_questions(retriever, sets["calibration"], progress=progress, stages=stages)
    combiner = before_sweep(records) if before_sweep else None
    # after before_sweep: the check set is scored with the combiner the fit set was swept with
    c_records = run_questions(retriever, sets["check"], progress=progress, stages=stages)
    # a check question asking a fit question again placed the threshold in its other wording: not unseen
    repeats = copies(sets["check"], sets["calibration"], getattr(retriever, "text_vectors", None))
    calibration = calibrate_records(records, judging, c_records, repeats, answer_model_corpus)
    if records or c_records:  # a question the reranker failed on has no rerank_top: the gate refuses to judge it
        calibration["reranker_used"] = all(r["reranked"] for r in [*records, *c_records])
    choice = calibration.get("signal_choice")
    if before_sweep:
        calibration["combiner"] = combiner
    calibration["answer_model_trained_on"] = {  # the gate fails a model that saw a question it is judged on
        part: answer_model_saw(retriever, sets[name]) for part, name in (("fit", "calibration"), ("check", "check"))
    }
    by_id = {c["chunk_id"]: c for c in chunks}
    qrels = {name: qrels_for(sets[name], chunks) for name in ("calibration", "check")}
    # per set: is the labelled article among the candidates, and where stood each lost answer's source
    sets_seen = ((calibration, records, qrels["calibration"]), (calibration.get("check"), c_records, qrels["check"]))
    for part, recs, rels in sets_seen:
        if part:
            part["shortlist_recall"] = shortlist_recall(recs, by_id, judging.rerank_depth)
            if part.get("shipped"):
                part["shipped"]["wrongly_declined"] = with_source_rank(part["shipped"]["wrongly_declined"], recs, rels)
    write_json(calibration, out_dir / rf.CALIBRATION)

    p_records = run_questions(retriever, sets["precision"], progress=progress, stages=stages)
    precision = (
        precision_eval(
            sets["precision"],
            {r["id"]: r["fused"] for r in p_records},
            {r["id"]: r["ranked"] for r in p_records},
            qrels_for(sets["precision"], chunks),
            ks=tuple(judging.evals.ks),
        )
        if p_records
        else {"error": "no questions"}
    )
    precision["reranker_used"] = all(r["reranked"] for r in p_records) if p_records else False
    configured = judging.evals.precision_set
    if precision_set and (not configured or Path(precision_set).resolve() != Path(configured).resolve()):
        precision["set"] = "other"  # `calibrate --questions`: the baseline's outcomes are of another set, none pair
    write_json(precision, out_dir / rf.PRECISION)
    answer = resolved_answer(judging.answer, choice)
    rows = question_rows("calibration", records, qrels["calibration"], answer)
    rows += question_rows("check", c_records, qrels["check"], answer)
    rows += question_rows("precision", p_records, qrels_for(sets["precision"], chunks), answer)
    write_jsonl(rows, out_dir / rf.QUESTIONS)
    return {
        "questions": len(records) + len(c_records) + len(p_records),
        "eval_errors": len(errors),
        "kept": keep_for_next(retriever, out_dir, start),
        "stages_s": {stage: round(seconds, 3) for stage, seconds in sorted(stages.items())},
    }


def kept_parts(retriever) -> dict:
    """The retriever's parts that keep values across nights (`load_kept` / `save_kept` / `computed`), by file."""
    parts = {
        TEXT_VECTORS: getattr(retriever, "text_vectors", None),
        RERANK_PAIRS: getattr(retriever, "scorer", None),
        ANSWER_PAIRS: getattr(retriever, "answer_scorer", None),
    }
    return {name: part for name, part in parts.items() if hasattr(part, "save_kept")}


def keep_from(retriever, files: Mapping[str, Path] | None) -> dict:
    """Load what an earlier night kept (its `files`, by name) into the retriever's parts; per file, how many values
    it took, what the part had computed so far (a scorer lives as long as its process, across evaluations) and, for
    a file it reused values from, the run it came from and its SHA-256 (bound into the verdict: those values were
    not computed by this evaluation)."""
    start = {}
    for name, part in kept_parts(retriever).items():
        path = (files or {}).get(name)
        reused = part.load_kept(path)
        start[name] = {"reused": reused, "computed_before": part.computed}
        if reused:
            start[name] |= {"from_run": path.parent.name, "sha256": sha256_file(path)}
    return start


def keep_for_next(retriever, out_dir: Path, start: dict) -> dict:
    """Write this night's kept values to `out_dir`; per file: reused (and, when it reused any, from which run's
    file, by SHA-256), computed by this evaluation, kept."""
    return {
        name: {
            "reused": start[name]["reused"],
            **{k: start[name][k] for k in ("from_run", "sha256") if k in start[name]},
            "computed": part.computed - start[name]["computed_before"],
            "kept": part.save_kept(out_dir / name),
        }
        for name, part in kept_parts(retriever).items()
    }


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()


def diff_with(folder: Path, live_folder: Path | None) -> dict | None:
    """Per-question changes since the live version (diff_live.json), when both runs have records."""
    if live_folder is None or live_folder == folder or not (live_folder / QUESTIONS).exists():
        return None
    diff = {**diff_runs(live_folder, folder), "live": live_folder.name}
    write_json(diff, folder / rf.DIFF_LIVE)
    return diff


def check_scoring(
    judging: Judging, log: list[dict], run: str, calibration: dict, evaluated: dict | None
) -> dict | None:
    """This night's look at the check set: its content hash, the design that looked (the decision and the models
    behind its scores) and how many distinct designs have looked at that content (sourcegate/evals/check_log.py)."""
    shipped = (calibration.get("check") or {}).get("shipped")
    check_sha = ((evaluated or {}).get("eval_sets") or {}).get(str(judging.evals.check_set))
    if not shipped or not check_sha:
        return None
    design = {
        "signal": shipped["signal"],
        "threshold": shipped["threshold"],
        "strong": (calibration.get("shipped") or {}).get("strong_threshold"),
        "strong_signal": judging.answer.strong_signal,
        "answer_passages": judging.answer_passages,
        **{k: evaluated.get(k) for k in ("embedder_fingerprint", "reranker_fingerprint", "answer_model_fingerprint")},
        "combiner": evaluated.get("combiner"),
    }
    digest = check_log.design_hash(design)
    # this run's own earlier look under this design is no new look; under another design (re-gated with another
    # threshold or model) it is one
    earlier = [r for r in log if (r.get("run"), r.get("design_sha256")) != (run, digest)]
    keys = sorted({question_key(q) for q in load_evalset(judging.evals.check_set)})  # who saw which question
    designs = check_log.designs_scored(earlier, check_sha, digest, keys)
    return {
        "check_sha256": check_sha,
        "design_sha256": digest,
        "design": design,
        "designs_scored": len(designs),
        "question_keys": keys,
    }


def gate_for_dir(
    judging: Judging,
    folder: Path,
    run_info: dict,
    check_scorings: Path,
    evaluated: dict | None = None,
    live_folder: Path | None = None,
    decision: dict | None = None,
) -> dict:
    """Gate verdict, gate.json, junit.xml and report.html from the evals in `folder`.

    `evaluated` is what the evaluation judged, already bound to the baseline it is compared against
    (`sourcegate.pipelines.release.verdict.binding`), stored in gate.json as is; `decision` what a pass proves about
    answering (`sourcegate.pipelines.release.decision.proven`), stored as is; `live_folder` is the live version's run
    folder, for the per-question diff since it; `check_scorings` the artifacts folder's log of check-set scorings
    (check_log.LOG), read and appended to. NotAVerdict when the precision eval ran without the configured
    reranker: nothing is written.
    """
    calibration = read_json(folder / rf.CALIBRATION)
    precision = read_json(folder / rf.PRECISION)
    check_reranker_ran(judging.reranker, precision, calibration)
    errors = read_json(folder / rf.EVAL_ERRORS)["errors"]
    baseline_path = Path(judging.evals.baseline) if judging.evals.baseline else None  # None: none accepted yet
    baseline = check_baseline(read_json(baseline_path), str(baseline_path)) if baseline_path else {}
    chosen = (calibration.get("signal_choice") or {}).get("signal")  # answer.signal: auto
    scoring = check_scoring(judging, check_log.read(check_scorings), folder.name, calibration, evaluated)
    if scoring and calibration.get("coverage"):  # the check figure pays for every design that looked at the set
        calibration["coverage"] = check_log.account(calibration["coverage"], scoring["designs_scored"])
    gate = evaluate_gate(
        calibration,
        precision,
        baseline,
        gating_signal=chosen or judging.answer.signal,
        regression=judging.evals.regression.model_dump(),
        eval_errors=errors,
    )
    if evaluated is not None:
        gate["evaluated"] = evaluated
    if scoring:
        held = next(c["passed"] for c in gate["checks"] if c["name"] == "check_set")
        record = {"run": folder.name, "check_set": judging.evals.check_set, "passed": held, **scoring}
        check_log.append(check_scorings, record)
        gate["check_scoring"] = scoring
    if decision is not None:
        gate["decision"] = decision
    write_gate(gate, folder)
    diff = diff_with(folder, live_folder) if (folder / rf.QUESTIONS).exists() else None
    write_report(calibration, precision, gate, run_info, folder / rf.REPORT, diff)
    return gate
