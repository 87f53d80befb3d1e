"""Answerability signals, measured honestly: per signal AUC and decline recall at fixed coverage.

Two sources of labelled questions:

    # the demo: retrieve every question of the given sets against a run's index
    python -m benchmarks.answerability demo --index artifacts/runs/RUN \
        --questions config/evals/calibration.jsonl config/evals/answerability.jsonl --out FILE.json
    # any calibration.json (e.g. `sourcegate beir ... --decline FILE` on the SciFact unanswerables)
    python -m benchmarks.answerability table --calibration DIR/calibration.json --out FILE.json

Reported per signal (higher = more answerable) and per should-decline kind:
- AUC (should-answer vs that kind), decline recall at 100/99/95% should-answer coverage, in
  sample (the threshold chosen on the very questions it is scored on: optimistic);
- the same recall cross-validated: stratified k-fold (seeded), the threshold that keeps the
  given share of the training folds' should-answer questions, scored on the held-out fold; the
  held-out should-answer coverage is reported next to it, since a threshold fitted on 80% of
  the questions need not keep 100% of the rest;
- `combined`: a logistic regression over the listed signals, fitted inside each training fold
  (standardised, L2, sklearn defaults), thresholded like a single signal.
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

COVERAGES = (1.0, 0.99, 0.95)
SIGNALS = ["rerank_top", "cosine_top", "bm25_z", "term_coverage", "concept_coverage", "sentence_cosine"]


def auc(answer: np.ndarray, decline: np.ndarray) -> float:
    """P(answer score > decline score), ties count half (Mann-Whitney)."""
    if not len(answer) or not len(decline):
        return float("nan")
    greater = (answer[:, None] > decline[None, :]).mean()
    ties = (answer[:, None] == decline[None, :]).mean()
    return float(greater + ties / 2)


def threshold_for(answer: np.ndarray, coverage: float) -> float:
    """The highest threshold (score >= t answers) that keeps `coverage` of these answers."""
    keep = int(np.ceil(coverage * len(answer)))
    return float(np.sort(answer)[::-1][keep - 1]) if keep else float("inf")


def recall_at(answer: np.ndarray, decline: np.ndarray, coverage: float) -> float:
    t = threshold_for(answer, coverage)
    return float((decline < t).mean()) if len(decline) else float("nan")


def folds(labels: Sequence[str], k: int, seed: int) -> np.ndarray:
    """Fold number per question, stratified by label/kind, seeded."""
    rng = np.random.default_rng(seed)
    out = np.zeros(len(labels), int)
    for value in sorted(set(labels)):
        idx = np.flatnonzero(np.asarray(labels) == value)
        rng.shuffle(idx)
        out[idx] = np.arange(len(idx)) % k
    return out


def fit_combiner(x: np.ndarray, y: np.ndarray):
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    return make_pipeline(StandardScaler(), LogisticRegression(max_iter=1000)).fit(x, y)


def cross_validated(
    x: np.ndarray, is_answer: np.ndarray, strata: Sequence[str], coverage: float, k: int, seed: int, combine: bool
) -> dict:
    """Held-out decline recall and answer coverage of a threshold fitted on the other folds."""
    fold = folds(strata, k, seed)
    declined = np.zeros(len(x), bool)
    for f in range(k):
        train, test = fold != f, fold == f
        if combine:
            model = fit_combiner(x[train], is_answer[train].astype(int))
            score_train, score_test = model.predict_proba(x[train])[:, 1], model.predict_proba(x[test])[:, 1]
        else:
            score_train, score_test = x[train, 0], x[test, 0]
        t = threshold_for(score_train[is_answer[train]], coverage)
        declined[test] = score_test < t
    return {"declined": declined}


def table(records: Sequence[Mapping], signals: Sequence[str], k: int = 5, seed: int = 14, repeats: int = 5) -> dict:
    """Per signal (and the combiner), per should-decline kind: AUC, in-sample and cross-validated recall."""
    records = [r for r in records if all(r["signals"].get(s) is not None for s in signals)]
    is_answer = np.array([r["label"] == "answer" for r in records])
    kinds = np.array([r.get("kind") or "decline" for r in records])
    strata = [("answer" if a else kind) for a, kind in zip(is_answer, kinds)]
    decline_kinds = sorted(set(kinds[~is_answer]))
    matrix = np.array([[float(r["signals"][s]) for s in signals] for r in records])
    out = {"n_answer": int(is_answer.sum()), "n_decline": {kd: int((kinds == kd).sum()) for kd in decline_kinds}}
    columns = {s: matrix[:, [i]] for i, s in enumerate(signals)}
    columns["combined"] = matrix
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
                entry["auc"] = round(auc(a, d), 3)
                entry.update({f"recall@{c:g}": round(recall_at(a, d, c), 3) for c in COVERAGES})
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
    out["protocol"] = f"stratified {k}-fold, {repeats} seeds from {seed}; combined = logistic regression over {signals}"
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
    from pipelines.answerability import split_sentences
    from pipelines.rerank import sigmoid

    sentences = [s for t in texts for s in split_sentences(t)]
    if scorer is None or not sentences:
        return None
    return max(sigmoid(logit) for _, logit in scorer.score(query, sentences))


def collect_demo(index: Path, question_files: Sequence[str], config: str) -> list[dict]:
    from evals.evalset import load_evalset
    from pipelines import config as config_mod
    from pipelines.factories import retriever_for
    from pipelines.search.embedded import EmbeddedSearcher

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
    """One kind's rows as a Markdown table (docs/benchmarks.md)."""
    head = "| signal | AUC | recall@100% | @99% | @95% | CV recall@100% (held-out coverage) | CV @95% (coverage) |"
    lines = [head, "|---|---|---|---|---|---|---|"]
    for name, row in table_["signals"].items():
        e = row.get(kind)
        if not e:
            continue
        cells = [str(e.get(k, "–")) for k in ("auc", "recall@1", "recall@0.99", "recall@0.95")]
        cv = [f"{e[f'cv_recall@{c}']} ({e[f'cv_coverage@{c}']})" for c in ("1", "0.95")]
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
            "all": table(singles, signals),
            "held_out": held_out(
                [r for r in singles if r["set"] == "calibration"],
                [r for r in singles if r["set"] != "calibration"],
                signals,
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
    if "held_out" in result:
        print(json.dumps(result["held_out"], indent=1))


if __name__ == "__main__":
    main()
