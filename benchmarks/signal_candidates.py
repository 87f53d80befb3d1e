"""Candidate decline signals on the words users write, side by side with the shipped ones (issue #30, item 2).

    python -m benchmarks.signal_candidates --index artifacts/runs/RUN --fit config/evals/calibration.jsonl \
        --questions config/evals/riders.jsonl --out FILE.json

Every question is retrieved by the shipped `Retriever` (its signals as a night computes them); the candidates
are computed beside them, each deterministic and setting-free:
- `rerank_views`: the cross-encoder's best probability over the question as written (against the fused head,
  as `rerank_top`), each of its sentences and its content words alone (each against the fused top 4);
- `cosine_views`: the best corpus-wide cosine over the same views;
- `cosine_lift`: the best cosine minus the question's mean cosine over the whole corpus (how far the best
  passage stands out from the question's own background);
- `rerank_lift`: the best cross-encoder logit minus the head's mean;
- `answer_support@1`: the answer model over the fused top 1 only (the shipped signal reads the top 3);
- `cosine_over_background` (with `--background`, a SQuAD-format file): the best corpus cosine minus the mean of
  the question's 5 best cosines to a background of general-knowledge questions (SQuAD 2.0 dev's): a question
  that looks more like encyclopedia questions ("What is the population of ...?") than like the corpus scores low.
Per signal and set: AUC (should-answer vs off-topic, vs near-topic), off-topic and near-topic declined at the
set's own 100% should-answer coverage, and what the fit set's tightest threshold (its lowest should-answer
score) keeps and declines. Nothing is fitted; no threshold is chosen on a reported set but the fit set.
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

import numpy as np

from benchmarks._common import finished, machine, uptime
from benchmarks.question_views import content_view, retriever_on
from sourcegate.evals.evalset import load_evalset
from sourcegate.evals.sweep import roc_auc
from sourcegate.pipelines.retrieval.answer_support import answer_support
from sourcegate.pipelines.retrieval.rerank import sigmoid
from sourcegate.pipelines.training.squad import load_squad

SENTENCE = re.compile(r"(?<=[.!?])\s+|\n+")
SHIPPED = ["rerank_top", "cosine_top", "bm25_top", "concept_coverage", "sentence_cosine", "answer_support"]
CANDIDATES = ["rerank_views", "cosine_views", "cosine_lift", "rerank_lift", "answer_support@1"]
BACKGROUND_TOP = 5  # background neighbours averaged: one near-duplicate question should not decide alone


def background_questions(path: str) -> list[str]:
    """The distinct questions of a SQuAD-format file, sorted (a deterministic background)."""
    squad, _ = load_squad(path)
    return sorted({q["question"].strip() for a in squad["data"] for p in a["paragraphs"] for q in p["qas"]})


def over_background(corpus_best: float, background_cosines: np.ndarray) -> float:
    """The best corpus cosine minus the mean of the `BACKGROUND_TOP` best background cosines."""
    top = np.sort(np.asarray(background_cosines, dtype=float))[::-1][:BACKGROUND_TOP]
    return float(corpus_best - top.mean())


def views_of(question: str) -> list[str]:
    """As written, each sentence (when there are several), and the content words alone."""
    sentences = [s.strip() for s in SENTENCE.split(question) if len(s.split()) >= 2]
    content = content_view(question)
    return list(dict.fromkeys([question, *(sentences if len(sentences) > 1 else []), *([content] if content else [])]))


def features(retriever, corpus: np.ndarray, item: dict, background: np.ndarray | None = None) -> dict:
    """The shipped signals and the candidates of one question (`background`: vectors, or None)."""
    r = retriever.retrieve(item["question"], item.get("context", []))
    head = [c.text for c in r.fused[: retriever.settings.rerank_depth]]
    views = views_of(r.query)
    written = [logit for _, logit in sorted(retriever.scorer.score(r.query, head))]
    others = [logit for v in views[1:] for _, logit in retriever.scorer.score(v, head[:4])]
    cosine_query = retriever.text_vectors([r.query])[0]
    cosines = corpus @ cosine_query
    view_vectors = retriever.text_vectors(views)
    out = {
        **{name: r.signals.get(name) for name in SHIPPED},
        "rerank_views": sigmoid(max(written + others)),
        "cosine_views": float((view_vectors @ corpus.T).max()),
        "cosine_lift": float(cosines.max() - cosines.mean()),
        "rerank_lift": float(max(written) - np.mean(written)),
        "answer_support@1": answer_support(retriever.answer_scorer, r.query, head[:1]),
    }
    if background is not None:
        out["cosine_over_background"] = over_background(cosines.max(), background @ cosine_query)
    return out


def judged(rows: list[dict], name: str, fit_threshold: float) -> dict:
    """One signal on one set: AUCs, declines at the set's own 100% coverage, and at the fit set's threshold."""
    answer = [r[name] for r in rows if r["label"] == "answer"]
    by_kind = {k: [r[name] for r in rows if r.get("kind") == k] for k in ("off_topic", "near_topic")}
    own = min(answer)
    out = {"kept_at_fit_threshold": f"{sum(a >= fit_threshold for a in answer)}/{len(answer)}"}
    for kind, scores in by_kind.items():
        if scores:
            out[f"auc_{kind}"] = round(roc_auc(np.array(answer), np.array(scores)), 3)
            out[f"{kind}_declined_at_own_100"] = f"{sum(s < own for s in scores)}/{len(scores)}"
            out[f"{kind}_declined_at_fit_threshold"] = f"{sum(s < fit_threshold for s in scores)}/{len(scores)}"
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--index", required=True, help="an embedded run folder")
    parser.add_argument("--fit", required=True, help="the fit set: places each signal's tightest threshold")
    parser.add_argument("--questions", nargs="+", required=True, help="the sets to report beside the fit set")
    parser.add_argument("--background", help="a SQuAD-format file (.json or .json.gz) for cosine_over_background")
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    run = Path(args.index)
    retriever = retriever_on(run)
    corpus = np.asarray(retriever.searcher.vectors, np.float32)  # the version's vectors, as the searcher holds them
    background = retriever.text_vectors(background_questions(args.background)) if args.background else None
    candidates = CANDIDATES + (["cosine_over_background"] if args.background else [])
    sets = {}
    for path in [args.fit, *args.questions]:
        sets[Path(path).stem] = [{**it, **features(retriever, corpus, it, background)} for it in load_evalset(path)]
    fit = sets[Path(args.fit).stem]
    result = {"machine": machine(), "load_start": uptime(), "index": str(run), "fit": args.fit, "signals": {}}
    for name in SHIPPED + candidates:
        threshold = min(r[name] for r in fit if r["label"] == "answer" and r[name] is not None)
        result["signals"][name] = {
            "fit_threshold": threshold,
            **{s: judged([r for r in rows if r[name] is not None], name, threshold) for s, rows in sets.items()},
        }
        print(name, json.dumps(result["signals"][name]))
    return finished(result, args.out)


if __name__ == "__main__":
    raise SystemExit(main())
