"""Answerability signals, measured honestly: per signal AUC and decline recall at fixed coverage.

Two sources of labelled questions:

    # the demo: retrieve every question of the given sets against a run's index
    python -m benchmarks.answerability demo --index artifacts/runs/RUN \
        --questions config/evals/calibration.jsonl --out FILE.json
    # (before issue #30 the `u-*` questions were a second file, answerability.jsonl; §12's numbers are from then)
    # any calibration.json (e.g. `sourcegate beir ... --decline FILE` on the SciFact unanswerables)
    python -m benchmarks.answerability table --calibration DIR/calibration.json --out FILE.json

Reported per signal (higher = more answerable) and per should-decline kind:
- AUC (should-answer vs that kind), decline recall at 100/99/95% should-answer coverage, in
  sample (the threshold chosen on the very questions it is scored on: optimistic);
- the same recall cross-validated: stratified k-fold (seeded), the threshold that keeps the
  given share of the training folds' should-answer questions, scored on the held-out fold; the
  held-out should-answer coverage is reported next to it, since a threshold fitted on 80% of
  the questions need not keep 100% of the rest;
- `combined`: the shipped combiner's logistic regression (`sourcegate/pipelines/retrieval/combiner.py`: standardised,
  L2 1.0, Newton) over the listed signals, fitted inside each training fold, thresholded like a
  single signal. `answerability`, the accepted combiner's own score, is in `held_out` only: it
  was fitted on `calibration.jsonl`, so only the other set is held out from it.
The demo mode also scores `sentence_rerank`, the cross-encoder's best probability over single
sentences of the top passage, a candidate that costs ~5 more cross-encoder pairs a question.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from benchmarks._common import Result
from sourcegate.evals.sweep import roc_auc
from sourcegate.pipelines.retrieval.combiner import cross_validate as combiner_cv
from sourcegate.pipelines.retrieval.combiner import fit_arrays, folds, probabilities, threshold_for, training_rows

COVERAGES = (1.0, 0.99, 0.95)
SIGNALS = ["rerank_top", "cosine_top", "bm25_z", "term_coverage", "concept_coverage", "sentence_cosine"]


def recall_at(answer: np.ndarray, decline: np.ndarray, coverage: float) -> float:
    t = threshold_for(answer, coverage)
    return float((decline < t).mean()) if len(decline) else float("nan")


def cross_validated(
    x: np.ndarray, is_answer: np.ndarray, strata: Sequence[str], coverage: float, k: int, seed: int, combine: bool
) -> dict:
    """Held-out decline recall and answer coverage of a threshold fitted on the other folds."""
    fold = folds(strata, k, seed)
    declined = np.zeros(len(x), bool)
    scores = np.zeros(len(x))
    for f in range(k):
        train, test = fold != f, fold == f
        if (
            combine
        ):  # the shipped combiner's fit (sourcegate/pipelines/retrieval/combiner.py), inside the training folds only
            params = fit_arrays(x[train], is_answer[train])
            score_train, score_test = probabilities(params, x[train]), probabilities(params, x[test])
        else:
            score_train, score_test = x[train, 0], x[test, 0]
        t = threshold_for(score_train[is_answer[train]], coverage)
        declined[test] = score_test < t
        scores[test] = score_test
    return {"declined": declined, "scores": scores}


def table(
    records: Sequence[Mapping],
    signals: Sequence[str],
    k: int = 5,
    seed: int = 14,
    repeats: int = 5,
    combined_over: Sequence[str] | None = None,
) -> dict:
    """Per signal (and the combiner), per should-decline kind: AUC, in-sample and cross-validated recall."""
    records = [r for r in records if all(r["signals"].get(s) is not None for s in signals)]
    is_answer = np.array([r["label"] == "answer" for r in records])
    kinds = np.array([r.get("kind") or "decline" for r in records])
    strata = [("answer" if a else kind) for a, kind in zip(is_answer, kinds)]
    decline_kinds = sorted(set(kinds[~is_answer]))
    matrix = np.array([[float(r["signals"][s]) for s in signals] for r in records])
    out = {"n_answer": int(is_answer.sum()), "n_decline": {kd: int((kinds == kd).sum()) for kd in decline_kinds}}
    columns = {s: matrix[:, [i]] for i, s in enumerate(signals)}
    combined_over = list(combined_over or signals)
    columns["combined"] = matrix[:, [signals.index(s) for s in combined_over]]
    rows = {}
    for name, x in columns.items():
        combine = name == "combined"
        row = {}
        for kd in decline_kinds:
            mask = is_answer | (kinds == kd)
            score = x[:, 0] if not combine else None
            entry = {}
            if not combine:
                a, d = score[is_answer], score[kinds == kd]
                entry["auc"] = round(roc_auc(a, d), 3)
                entry.update({f"recall@{c:g}": round(recall_at(a, d, c), 3) for c in COVERAGES})
            if combine:  # out-of-fold probabilities: the combiner's AUC on questions it was not fitted on
                aucs = []
                for rep in range(repeats):
                    oof = cross_validated(
                        x[mask], is_answer[mask], [s for s, m in zip(strata, mask) if m], 1.0, k, seed + rep, True
                    )["scores"]
                    aucs.append(roc_auc(oof[is_answer[mask]], oof[~is_answer[mask]]))
                entry["cv_auc"] = round(float(np.mean(aucs)), 3)
            for c in COVERAGES:
                recalls, coverage = [], []
                for rep in range(repeats):
                    cv = cross_validated(
                        x[mask], is_answer[mask], [s for s, m in zip(strata, mask) if m], c, k, seed + rep, combine
                    )["declined"]
                    recalls.append(cv[~is_answer[mask]].mean())
                    coverage.append(1 - cv[is_answer[mask]].mean())
                entry[f"cv_recall@{c:g}"] = round(float(np.mean(recalls)), 3)
                entry[f"cv_coverage@{c:g}"] = round(float(np.mean(coverage)), 3)
            row[kd] = entry
        rows[name] = row
    out["signals"] = rows
    out["protocol"] = (
        f"stratified {k}-fold, {repeats} seeds from {seed}; combined = logistic regression over {combined_over}, "
        "fitted per kind (should-answer vs that kind)"
    )
    # the shipped protocol (sourcegate/pipelines/retrieval/combiner.cross_validate): one fit against every should-decline kind
    out["combined_all_kinds"] = [
        combiner_cv(training_rows(records, combined_over), k=k, seed=seed + rep) for rep in range(repeats)
    ]
    return out


def held_out(train: Sequence[Mapping], test: Sequence[Mapping], signals: Sequence[str]) -> dict:
    """Thresholds fitted on one question set (100% of its should-answer kept), scored on another."""
    out = {}
    for s in signals:
        a = np.array([r["signals"][s] for r in train if r["label"] == "answer"], float)
        t = threshold_for(a, 1.0)
        row = {"threshold": round(t, 4)}
        for kind in sorted({r.get("kind") for r in test}):
            scores = np.array([r["signals"][s] for r in test if r.get("kind") == kind], float)
            label = next(r["label"] for r in test if r.get("kind") == kind)
            frac = (scores < t).mean() if label == "decline" else (scores >= t).mean()
            row[f"{kind} {'declined' if label == 'decline' else 'kept'}"] = (
                f"{int(round(frac * len(scores)))}/{len(scores)}"
            )
        out[s] = row
    return out


def sentence_rerank(scorer, query: str, texts: Sequence[str]) -> float | None:
    """Best cross-encoder probability over the single sentences of `texts` (a measured candidate)."""
    from sourcegate.pipelines.retrieval.answerability import split_sentences
    from sourcegate.pipelines.retrieval.rerank import sigmoid

    sentences = [s for t in texts for s in split_sentences(t)]
    if scorer is None or not sentences:
        return None
    return max(sigmoid(logit) for _, logit in scorer.score(query, sentences))


def collect_demo(index: Path, question_files: Sequence[str], config: str) -> list[dict]:
    from sourcegate.api import retriever_for
    from sourcegate.evals.evalset import load_evalset
    from sourcegate.pipelines import config as config_mod
    from sourcegate.pipelines.search.embedded import EmbeddedSearcher

    cfg = config_mod.load(config, {})
    retriever, scorer = retriever_for(cfg, EmbeddedSearcher(index / "index"))
    records = []
    for path in question_files:
        for it in load_evalset(path):
            if it["kind"].startswith("multi_turn"):  # the table is about single questions
                continue
            r = retriever.retrieve(it["question"], it.get("context", []))
            signals = dict(r.signals)
            signals["sentence_rerank"] = sentence_rerank(scorer, r.query, [c.text for c in r.ranked[:1]])
            records.append({"id": it["id"], "set": Path(path).stem, "label": it["label"], "kind": it["kind"]})
            records[-1]["signals"] = signals
    return records


def markdown(table_: Mapping, kind: str) -> str:
    """One kind's rows as a Markdown table (docs/benchmarks/12-answerability.md)."""
    head = "| signal | AUC | recall@100% | @99% | @95% | CV recall@100% (held-out coverage) | CV @99% | CV @95% |"
    lines = [head, "|---|---|---|---|---|---|---|---|"]
    for name, row in table_["signals"].items():
        e = row.get(kind)
        if not e:
            continue
        cells = [str(e.get(k, "–")) for k in ("auc", "recall@1", "recall@0.99", "recall@0.95")]
        if "cv_auc" in e:
            cells[0] = f"{e['cv_auc']} (CV)"
        cv = [f"{e[f'cv_recall@{c}']} ({e[f'cv_coverage@{c}']})" for c in ("1", "0.99", "0.95")]
        lines.append(f"| `{name}` | " + " | ".join(cells + cv) + " |")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("demo")
    d.add_argument("--index", type=Path, required=True)
    d.add_argument("--questions", nargs="+", required=True)
    d.add_argument("--config", default="config/pipeline.yaml")
    d.add_argument("--records", type=Path, nargs="+", help="files of saved records: read if they exist, else written")
    t = sub.add_parser("table")
    t.add_argument("--calibration", type=Path, required=True)
    for q in (d, t):
        q.add_argument("--signals", nargs="+", default=SIGNALS)
        q.add_argument("--out", type=Path, required=True)
    args = p.parse_args()
    out = Result(f"answerability-{args.cmd}")
    if args.cmd == "demo":
        if args.records and all(p.exists() for p in args.records):
            records = [r for p in args.records for r in json.loads(p.read_text())]
        else:
            records = collect_demo(args.index, args.questions, args.config)
            if args.records:
                args.records[0].write_text(json.dumps(records))
        signals = args.signals + (["sentence_rerank"] if "sentence_rerank" not in args.signals else [])
        singles = [r for r in records if r.get("kind") != "multi_turn_decline" and r.get("kind") != "multi_turn"]
        result = {
            "source": "demo",
            "index": str(args.index),
            "questions": args.questions,
            "all": table(singles, signals, combined_over=args.signals),
            "held_out": held_out(
                [r for r in singles if r["set"] == "calibration"],
                [r for r in singles if r["set"] != "calibration"],
                signals
                + (["answerability"] if all(r["signals"].get("answerability") is not None for r in singles) else []),
            ),
        }
    else:
        calibration = json.loads(args.calibration.read_text())
        result = {"source": str(args.calibration), "all": table(calibration["questions"], args.signals)}
    for key, value in result.items():
        out[key] = value
    out.write(args.out)
    for kind in result["all"]["n_decline"]:
        print(f"\n{kind} (n = {result['all']['n_decline'][kind]}; {result['all']['n_answer']} should-answer)")
        print(markdown(result["all"], kind))
    runs = result["all"]["combined_all_kinds"]
    mean = {
        kd: round(float(np.mean([r["decline_recall_by_kind"][kd] for r in runs])), 3)
        for kd in runs[0]["decline_recall_by_kind"]
    }
    kept = round(float(np.mean([r["answer_kept"] for r in runs])), 3)
    print(f"\ncombined, one fit against every kind (shipped protocol), mean of {len(runs)} seeds: kept {kept}, {mean}")
    if "held_out" in result:
        print(json.dumps(result["held_out"], indent=1))


if __name__ == "__main__":
    main()
