"""Benchmark 8: the BM25 leg on SciFact and NFCorpus, analyser by analyser, chunks vs whole documents.

No model is loaded: each dataset is ingested and chunked by the pipeline's own steps (into
/tmp/sgbench-bm25, deleted afterwards), then BM25 is built over

- ``chunks``: the pipeline's chunks; a document's rank is its best chunk's, from the top 100
  chunks (what `sourcegate beir` reports as ``bm25``);
- ``docs``: one field per document, title + text (what BEIR's published BM25 indexes).

Variants (nDCG@10 / recall@100 with the pipeline's metrics, sourcegate.evals.metrics):

- ``before``: the previous leg: lowercase ``\\w+`` tokens, rank-bm25's BM25Okapi (k1 1.5,
  b 0.75, negative idfs floored at 0.25 x mean idf), which the old index matched bit for bit;
- ``lucene-words``: Lucene BM25 (k1 1.2, b 0.75, sourcegate.pipelines.search.bm25) on the same tokens;
- ``+stop74``: and the analyser's 74 stopwords;
- ``+stop74+stem`` (**shipped**, ``BM25Index.from_texts``): and the Snowball English stemmer;
- ``+lucene33+stem``: Lucene's 33-word English stopword set instead.

    SOURCEGATE_SHARED=../shared .venv/bin/python -m benchmarks.bm25 [--datasets scifact,nfcorpus]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np

from benchmarks._common import ROOT, Result, log
from sourcegate.artifact_io.run_folder import RunFolder

DATASETS = (Path(os.environ.get("SOURCEGATE_SHARED", ROOT.parent / "shared")) / "datasets").resolve()
SCRATCH = Path("/tmp/sgbench-bm25")
DEPTH = 100
LUCENE_STOP = frozenset(
    [
        "a",
        "an",
        "and",
        "are",
        "as",
        "at",
        "be",
        "but",
        "by",
        "for",
        "if",
        "in",
        "into",
        "is",
        "it",
        "no",
        "not",
        "of",
        "on",
        "or",
        "such",
        "that",
        "the",
        "their",
        "then",
        "there",
        "these",
        "they",
        "this",
        "to",
        "was",
        "will",
        "with",
    ]
)


def chunk_texts(dataset: Path) -> tuple[list[str], list[str]]:
    """(chunk texts, their doc ids), chunked by the pipeline's steps with the shipped config."""
    import pyarrow.parquet as pq

    from sourcegate import api as steps
    from sourcegate.pipelines import config

    cfg = config.load(
        ROOT / "config" / "pipeline.yaml",
        {
            "artifacts": str(SCRATCH / dataset.name),
            "corpus.path": str(dataset),
            "corpus.format": "beir",
            "corpus.max_doc_bytes": 10**7,
        },
    )
    steps.ingest_step(RunFolder(cfg.artifacts, "bm25"), cfg)
    steps.chunk_step(RunFolder(cfg.artifacts, "bm25"), cfg.chunking, cfg.embedding)
    table = pq.read_table(RunFolder(cfg.artifacts, "bm25").path / "chunks.text.parquet", columns=["doc_id", "text"])
    return table["text"].to_pylist(), table["doc_id"].to_pylist()


def documents(dataset: Path) -> dict[str, str]:
    docs = {}
    for line in (dataset / "corpus.jsonl").read_text(encoding="utf-8").splitlines():
        if line.strip():
            d = json.loads(line)
            docs[str(d["_id"])] = "\n".join(x for x in (d.get("title", "").strip(), d["text"].strip()) if x)
    return docs


def ranking(scores: np.ndarray, ids: list[str]) -> list[str]:
    from sourcegate.pipelines.search.embedded import top_k

    return list(dict.fromkeys(ids[i] for i in top_k(scores, DEPTH) if scores[i] > 0))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--datasets", default="scifact,nfcorpus")
    ap.add_argument("--name", default="bm25")
    args = ap.parse_args()
    res = Result(args.name)

    import Stemmer
    from rank_bm25 import BM25Okapi

    from sourcegate.api import evaluate_systems, load_queries
    from sourcegate.pipelines.search.analyzer import STOPWORDS, words
    from sourcegate.pipelines.search.bm25 import BM25Index, _legacy_tokens

    stem = Stemmer.Stemmer("english").stemWords

    def lucene(stop: frozenset, stemmed: bool) -> Callable[[list[str]], Callable[[str], np.ndarray]]:
        def analyse(text: str) -> list[str]:
            kept = [w for w in words(text) if w not in stop]
            return stem(kept) if stemmed else kept

        def build(texts: list[str]) -> Callable[[str], np.ndarray]:
            index = BM25Index.build([analyse(t) for t in texts])
            vocab = index.vocab

            def scores(query: str) -> np.ndarray:
                ids = [vocab[t] for t in analyse(query) if t in vocab]
                mult = np.bincount(ids, minlength=len(vocab))[sorted(set(ids))].astype(np.float64)
                return np.asarray(index.weights[sorted(set(ids))].T @ mult).ravel() if ids else np.zeros(index.size)

            return scores

        return build

    def before(texts: list[str]) -> Callable[[str], np.ndarray]:
        okapi = BM25Okapi([_legacy_tokens(t) for t in texts])
        return lambda q: okapi.get_scores(_legacy_tokens(q))

    def shipped(texts: list[str]) -> Callable[[str], np.ndarray]:
        return BM25Index.from_texts(texts).scores

    variants = {
        "before": before,
        "lucene-words": lucene(frozenset(), False),
        "+stop74": lucene(STOPWORDS, False),
        "+stop74+stem (shipped)": shipped,
        "+lucene33+stem": lucene(LUCENE_STOP, True),
    }
    res["datasets"] = {}
    for name in args.datasets.split(","):
        dataset = DATASETS / name
        texts, doc_of_chunk = chunk_texts(dataset)
        docs = documents(dataset)
        doc_ids, doc_texts = list(docs), list(docs.values())
        queries, qrels = load_queries(dataset)
        log(f"{name}: {len(texts)} chunks, {len(docs)} documents, {len(queries)} queries")
        runs: dict[str, dict[str, list[str]]] = {}
        for variant, build in variants.items():
            for unit, corpus, ids in (("chunks", texts, doc_of_chunk), ("docs", doc_texts, doc_ids)):
                scores = build(corpus)
                runs[f"{variant} / {unit}"] = {q: ranking(scores(t), ids) for q, t in queries.items()}
            log(f"{name}: {variant} done")
        res["datasets"][name] = {
            "chunks": len(texts),
            "documents": len(docs),
            "queries": len(queries),
            "systems": evaluate_systems(runs, qrels),
        }
        shutil.rmtree(SCRATCH / name, ignore_errors=True)
    res.write()


if __name__ == "__main__":
    main()
