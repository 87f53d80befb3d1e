"""docs/benchmarks.md §18, fifth round: can a question's wording alone say it is not for this corpus?

    python -m benchmarks.intent_probe --fit config/evals/calibration.jsonl \
        --questions config/evals/riders.jsonl config/evals/riders-final.jsonl \
        --background ../shared/datasets/squad2/dev-v2.0.json.gz --cache /tmp/bi --out FILE

A linear probe on the shipped bi-encoder's question vectors: the fit set's should-answer and near-topic questions
(questions this corpus's users ask) against a background of general-knowledge questions (SQuAD 2.0 dev's). It
never trains on an off-topic question, so the fit set's off-topic questions test it honestly. Cross-fitted on the
fit set (5 deterministic folds, evals/placement.folds_of): each fold scored by the probe fitted without it; the
threshold is the lowest out-of-fold should-answer score. Then fitted on the whole fit set and judged on the other
sets at its own tightest in-sample threshold. No check set is read.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from benchmarks._common import machine, uptime
from benchmarks.bi_encoder_candidates import encoded, encoder, question_vectors
from benchmarks.signal_candidates import background_questions, judged
from evals.evalset import load_evalset
from evals.placement import folds_of

C = 1.0  # scikit-learn's default penalty; 0.3-10 moved the cross-fitted off-topic declines by one (18-20 of 34)


def probe(in_domain: np.ndarray, background: np.ndarray):
    """Logistic regression, in-domain 1 against background 0, the classes weighted equally."""
    from sklearn.linear_model import LogisticRegression

    x = np.vstack([in_domain, background])
    y = np.r_[np.ones(len(in_domain)), np.zeros(len(background))]
    return LogisticRegression(C=C, max_iter=3000, class_weight="balanced").fit(x, y)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--fit", required=True)
    parser.add_argument("--questions", nargs="*", default=[])
    parser.add_argument("--background", required=True)
    parser.add_argument("--cache", required=True)
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    model, cache = encoder("shipped"), Path(args.cache)
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
    result["load_end"] = uptime()
    print(json.dumps(result, indent=2))
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
