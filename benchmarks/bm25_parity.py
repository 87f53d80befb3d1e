"""BM25 top-10 parity of the two backends on one run's chunks (the demo's 149 calibration questions).

Loads the run's chunks.parquet into a throw-away OpenSearch index on the node at OPENSEARCH_URL,
compares each question's BM25 top 10 with the run's embedded index, prints the mean overlap and
the questions that differ, and deletes the index.

    .venv/bin/python -m benchmarks.bm25_parity artifacts/runs/<run id>
"""

from __future__ import annotations

import sys
import uuid

import numpy as np


def main() -> None:
    from sourcegate.evals.evalset import load_evalset
    from sourcegate.pipelines.config import OpenSearch
    from sourcegate.pipelines.search.embedded import EmbeddedSearcher
    from sourcegate.pipelines.search.opensearch import OpenSearchStore
    from sourcegate.pipelines.search.opensearch.client import client_from_env

    run = sys.argv[1]
    client = client_from_env()
    prefix = f"bm25parity-{uuid.uuid4().hex[:6]}"
    store = OpenSearchStore(client, OpenSearch(index_prefix=prefix), progress=False)
    try:
        store.load("v1", f"{run}/chunks.parquet")
        remote, embedded = store.open("v1"), EmbeddedSearcher(f"{run}/index")
        questions = [it["question"] for it in load_evalset("config/evals/calibration.jsonl")]
        overlap, identical = [], 0
        for q in questions:
            a, b = [h.chunk_id for h in embedded.bm25(q, 10)], [h.chunk_id for h in remote.bm25(q, 10)]
            overlap.append(len(set(a) & set(b)) / max(len(a), len(b)) if a or b else 1.0)
            identical += a == b
            if a != b:
                print(f"differs: {q!r}")
        print(
            f"{len(questions)} questions: BM25 top-10 overlap mean {np.mean(overlap):.4f} (min {min(overlap):.2f}); "
            f"identical top 10 in {identical}"
        )
    finally:
        client.indices.delete(index=f"{prefix}-*", ignore_unavailable=True)


if __name__ == "__main__":
    main()
