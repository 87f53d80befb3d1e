"""The embedded backend (the default; no server): exact cosine + BM25 beside the Parquet.

Each index version lives in `<runs>/<version>/index/`; the live version is named by a
small pointer file, rewritten atomically (the embedded twin of an OpenSearch alias).
"""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from pipelines import faults
from pipelines.embed import embedding_matrix
from pipelines.io import write_text
from pipelines.search.base import Hit, HybridResult, ScoreDistribution, hybrid_by_calls
from pipelines.search.bm25 import BM25Index

STORED = ["chunk_id", "doc_id", "title", "section", "section_id", "text"]


def top_k(scores: np.ndarray, k: int) -> np.ndarray:
    """Indices of the k best scores, best first; ties broken by position (deterministic)."""
    k = min(k, len(scores))
    if k <= 0:
        return np.zeros(0, np.int64)
    part = np.argpartition(-scores, k - 1)[:k] if k < len(scores) else np.arange(len(scores))
    return part[np.lexsort((part, -scores[part]))]


class EmbeddedSearcher:
    def __init__(self, folder: Path):
        self.folder = Path(folder)
        # Stored columns stay columnar (Arrow): a dict per chunk costs ~3x the files in RAM.
        self.table = pq.read_table(self.folder / "chunks.parquet", columns=STORED)
        self.ids = self.table.column("chunk_id").to_pylist()
        self.position = {cid: i for i, cid in enumerate(self.ids)}
        self.vectors = np.load(self.folder / "embeddings.npy", mmap_mode="r")
        self.bm25_index = BM25Index.open(self.folder)
        # One query asks for BM25 top-k AND the BM25 distribution, kNN top-k AND the best
        # cosine: keep the last full score array of each so a query scores the corpus once.
        self._last_bm25: tuple[str, np.ndarray] | None = None
        self._last_cosine: tuple[bytes, np.ndarray] | None = None

    def _bm25_scores(self, query: str) -> np.ndarray:
        last = self._last_bm25
        if last is None or last[0] != query:
            last = (query, self.bm25_index.scores(query))
            self._last_bm25 = last  # one tuple assignment: a concurrent reader sees old or new, whole
        return last[1]

    def _cosines(self, vector: np.ndarray) -> np.ndarray:
        v = np.ascontiguousarray(vector, np.float32)
        key = v.tobytes()
        last = self._last_cosine
        if last is None or last[0] != key:
            last = (key, self.vectors @ v)
            self._last_cosine = last
        return last[1]

    def _hits(self, scores: np.ndarray, k: int) -> list[Hit]:
        return [Hit(self.ids[i], float(scores[i])) for i in top_k(scores, k)]

    def bm25(self, query: str, k: int) -> list[Hit]:
        return [h for h in self._hits(self._bm25_scores(query), k) if h.score > 0]

    def knn(self, vector: np.ndarray, k: int) -> list[Hit]:
        return self._hits(self._cosines(vector), k)

    def best_cosine(self, vector: np.ndarray) -> float:
        return float(self._cosines(vector).max()) if len(self.ids) else 0.0

    def bm25_distribution(self, query: str) -> ScoreDistribution:
        scores = self._bm25_scores(query)
        matched = scores[scores > 0]
        return ScoreDistribution(scores=matched, matched=len(matched), total=len(scores))

    def hybrid(self, query: str, vector: np.ndarray, bm25_k: int, knn_k: int) -> HybridResult:
        """No round trips to save: the single calls, which share one scoring of the corpus."""
        return hybrid_by_calls(self, query, vector, bm25_k, knn_k)

    def column(self, name: str) -> list:
        """One stored column for every chunk, in index order (aligned with `ids`)."""
        return self.table.column(name).to_pylist()

    def chunks(self, chunk_ids: Sequence[str]) -> list[dict]:
        rows = pa.array([self.position[c] for c in chunk_ids], pa.int64())
        return self.table.take(rows).to_pylist()


class EmbeddedStore:
    """Index versions under `runs/`, the live one named by the pointer file `live_file`."""

    def __init__(self, runs: str | Path, live_file: str | Path):
        self.runs, self.live_file = Path(runs), Path(live_file)

    def folder(self, version: str) -> Path:
        return self.runs / version / "index"

    def load(self, version: str, chunks_parquet: str) -> int:
        table = pq.read_table(chunks_parquet)
        folder = self.folder(version)
        tmp = folder.with_name("index.tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        try:
            pq.write_table(table.select(STORED), tmp / "chunks.parquet")
            np.save(tmp / "embeddings.npy", np.ascontiguousarray(embedding_matrix(table)))
            faults.reached("load:partial")
            BM25Index.from_texts(table["text"].to_pylist()).save(tmp)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)  # e.g. a full disk: free what we took, leave no half index
            raise
        shutil.rmtree(folder, ignore_errors=True)
        tmp.rename(folder)  # a version appears whole or not at all
        count = len(EmbeddedSearcher(folder).ids)
        if count != table.num_rows:
            raise RuntimeError(f"index {version}: {count} chunks indexed, expected {table.num_rows}")
        return count

    def promote(self, version: str) -> None:
        if not self.folder(version).is_dir():
            raise FileNotFoundError(f"no index version {version}")
        write_text(version + "\n", self.live_file)

    def live(self) -> str | None:
        if not self.live_file.exists():
            return None
        return self.live_file.read_text(encoding="utf-8").strip() or None

    def versions(self) -> list[str]:
        if not self.runs.is_dir():
            return []
        from pipelines.runs import created_at

        folders = [p.parent for p in self.runs.glob("*/index") if p.is_dir()]
        return [f.name for f in sorted(folders, key=lambda f: (created_at(f), f.name))]  # by creation, not name

    def drop(self, version: str) -> None:
        if version == self.live():
            raise ValueError(f"refusing to drop the live index version {version}")
        shutil.rmtree(self.folder(version), ignore_errors=True)

    def open(self, version: str | None = None) -> EmbeddedSearcher:
        version = version or self.live()
        if version is None:
            raise FileNotFoundError(f"no live index (pointer {self.live_file} missing); run `sourcegate run` first")
        return EmbeddedSearcher(self.folder(version))
