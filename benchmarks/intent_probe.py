"""docs/benchmarks/18-users-words.md, fifth round: can a question's wording alone say it is not for this corpus?

    python -m benchmarks.intent_probe --fit config/evals/calibration.jsonl \
        --questions config/evals/riders.jsonl config/evals/riders-final.jsonl \
        --background ../shared/datasets/squad2/dev-v2.0.json.gz --cache /tmp/bi --out FILE

A linear probe on the shipped bi-encoder's question vectors: the fit set's should-answer and near-topic questions
(questions this corpus's users ask) against a background of general-knowledge questions (SQuAD 2.0 dev's). It
never trains on an off-topic question, so the fit set's off-topic questions test it honestly. Cross-fitted on the
fit set (5 deterministic folds, sourcegate/evals/placement.folds_of): each fold scored by the probe fitted without it; the
threshold is the lowest out-of-fold should-answer score. Then fitted on the whole fit set and judged on the other
sets at its own tightest in-sample threshold. No check set is read.

`--supervised` (sixth round) asks the other question: trained WITH off-topic questions, does the probe carry to a
set written by someone else? Each of the sets (the fit set and `--questions`) is held out in turn; the probe
learns from the others (their should-answer and near-topic questions 1, their off-topic ones 0, no background),
its threshold is the lowest should-answer score of those, and the held-out set is judged at it.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from benchmarks._common import finished, machine, uptime
from benchmarks.bi_encoder_candidates import encoded, encoder, question_vectors
from benchmarks.signal_candidates import background_questions, judged
from sourcegate.evals.evalset import load_evalset
from sourcegate.evals.placement import folds_of

C = 1.0  # scikit-learn's default penalty; 0.3-10 moved the cross-fitted off-topic declines by one (18-20 of 34)


def probe(in_domain: np.ndarray, background: np.ndarray):
    """Logistic regression, in-domain 1 against background 0, the classes weighted equally."""
    from sklearn.linear_model import LogisticRegression

    x = np.vstack([in_domain, background])
    y = np.r_[np.ones(len(in_domain)), np.zeros(len(background))]
    return LogisticRegression(C=C, max_iter=3000, class_weight="balanced").fit(x, y)


def leave_one_set_out(sets: dict[str, list[dict]], vectors: dict[str, np.ndarray]) -> dict:
    """Each set judged by the probe trained on the others' labels, at their tightest threshold."""
    from sklearn.linear_model import LogisticRegression

    result = {}
    for held in sets:
        others = [name for name in sets if name != held]
        x = np.vstack([vectors[name] for name in others])
        items = [q for name in others for q in sets[name]]
        y = np.array([q.get("kind") != "off_topic" for q in items], dtype=float)
        model = LogisticRegression(C=C, max_iter=5000, class_weight="balanced").fit(x, y)
        trained = model.decision_function(x)
        threshold = float(min(s for s, q in zip(trained, items) if q["label"] == "answer"))
        rows = [{**q, "probe": float(s)} for q, s in zip(sets[held], model.decision_function(vectors[held]))]
        result[held] = {
            **judged(rows, "probe", threshold),
            "threshold": threshold,
            "off_topic_not_declined": [
                r["id"] for r in rows if r.get("kind") == "off_topic" and r["probe"] >= threshold
            ],
        }
    return result


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--fit", required=True)
    parser.add_argument("--questions", nargs="*", default=[])
    parser.add_argument("--background", help="a SQuAD-format file (required unless --supervised)")
    parser.add_argument("--cache", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--supervised", action="store_true", help="leave one set out, trained with off-topic")
    args = parser.parse_args(argv)
    model, cache = encoder("shipped"), Path(args.cache)
    if args.supervised:
        sets = {Path(p).stem: load_evalset(p) for p in [args.fit, *args.questions]}
        vectors = {name: question_vectors(model, "shipped", items, cache) for name, items in sets.items()}
        result = {
            "machine": machine(),
            "load_start": uptime(),
            "C": C,
            "leave_one_set_out": leave_one_set_out(sets, vectors),
        }
        return finished(result, args.out)
    if not args.background:
        parser.error("--background is required unless --supervised")
    back = encoded(model, "shipped", background_questions(args.background), cache)
    sets = {Path(p).stem: load_evalset(p) for p in [args.fit, *args.questions]}
    vectors = {name: question_vectors(model, "shipped", items, cache) for name, items in sets.items()}
    fit, x = sets.pop(Path(args.fit).stem), vectors.pop(Path(args.fit).stem)
    in_domain = np.array([q.get("kind") != "off_topic" for q in fit])
    fold = folds_of([q["label"] == "answer" for q in fit], 5)
    out_of_fold = np.empty(len(fit))
    for k in range(5):
        out_of_fold[fold == k] = probe(x[(fold != k) & in_domain], back).decision_function(x[fold == k])
    cross = [{**q, "probe": float(s)} for q, s in zip(fit, out_of_fold)]
    threshold = min(r["probe"] for r in cross if r["label"] == "answer")
    whole = probe(x[in_domain], back)
    in_sample = whole.decision_function(x)
    tightest = float(min(s for s, q in zip(in_sample, fit) if q["label"] == "answer"))
    result = {
        "machine": machine(),
        "load_start": uptime(),
        "C": C,
        "fit_cross_fitted": {**judged(cross, "probe", threshold), "threshold": threshold},
        "fit_off_topic_not_declined": [
            r["id"] for r in cross if r.get("kind") == "off_topic" and r["probe"] >= threshold
        ],
        "fit_threshold": tightest,
    }
    for name, items in sets.items():
        scores = whole.decision_function(vectors[name])
        result[name] = judged([{**q, "probe": float(s)} for q, s in zip(items, scores)], "probe", tightest)
    return finished(result, args.out)


if __name__ == "__main__":
    raise SystemExit(main())
