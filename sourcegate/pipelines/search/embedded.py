"""The embedded backend (the default; no server): exact cosine + BM25 beside the Parquet.

Each index version lives in `<runs>/<version>/index/`; the live version is named by a
small pointer file, rewritten atomically (the embedded twin of an OpenSearch alias).
A version is complete once its `manifest.json` is written (last); it is then never rebuilt,
and opening or promoting it checks every file against the manifest (`sourcegate.pipelines.versions.manifest`).
"""

from __future__ import annotations

import logging
import shutil
from collections.abc import Mapping, Sequence
from datetime import datetime
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from sourcegate.artifact_io import write_text
from sourcegate.pipelines import faults
from sourcegate.pipelines.batches import iter_batches, write_batches
from sourcegate.pipelines.build.embed import embedding_matrix
from sourcegate.pipelines.search.analyzer import analyze
from sourcegate.pipelines.search.base import (
    STORED_FIELDS,
    Hit,
    HybridResult,
    ScoreDistribution,
    hybrid_by_calls,
    oldest_first,
    refuse_dropping_live,
    refuse_rebuilding_live,
)
from sourcegate.pipelines.search.bm25 import BM25Builder, BM25Index
from sourcegate.pipelines.versions import manifest as mf
from sourcegate.pipelines.versions import promotions, stamp

log = logging.getLogger(__name__)


def top_k(scores: np.ndarray, k: int) -> np.ndarray:
    """Indices of the k best scores, best first; ties broken by position, at the k-th place too: argpartition alone
    picks among the scores tied there by its SIMD path, so two CPUs would keep different chunks (BM25 ties often)."""
    k = min(k, len(scores))
    if k <= 0:
        return np.zeros(0, np.int64)
    if k < len(scores):
        kth = np.partition(-scores, k - 1)[k - 1]  # the k-th best score, negated
        part = np.flatnonzero(-scores <= kth)  # every index scoring at least that: the ties at the edge included
    else:
        part = np.arange(len(scores))
    return part[np.lexsort((part, -scores[part]))][:k]


class EmbeddedSearcher:
    """Searches one version folder as it is. `EmbeddedStore.open` checks the folder first and sets `manifest`."""

    def __init__(self, folder: Path, manifest: Mapping | None = None):
        self.folder = Path(folder)
        self.manifest = manifest
        # Stored columns stay columnar (Arrow): a dict per chunk costs ~3x the files in RAM. One file, read as
        # one: pq.read_table would import pyarrow.dataset and with it pandas (about 0.15 s of a cold `query`).
        self.table = pq.ParquetFile(self.folder / "chunks.parquet").read(columns=list(STORED_FIELDS))
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

    def document_frequencies(self, words: Sequence[str]) -> tuple[int, dict[str, int]]:
        return self.bm25_index.size, {w: self.bm25_index.document_frequency(w) for w in words}

    def hybrid(
        self, query: str, vector: np.ndarray, bm25_k: int, knn_k: int, terms: Sequence[str] = ()
    ) -> HybridResult:
        """No round trips to save: the single calls, which share one scoring of the corpus."""
        return hybrid_by_calls(self, query, vector, bm25_k, knn_k, terms)

    def column(self, name: str) -> list:
        """One stored column for every chunk, in index order (aligned with `ids`)."""
        return self.table.column(name).to_pylist()

    def chunks(self, chunk_ids: Sequence[str]) -> list[dict]:
        rows = np.fromiter((self.position[c] for c in chunk_ids), np.int64, len(chunk_ids))
        # the indices from their buffer: pa.array would import pandas to check its input's type (0.1-0.2 s cold)
        return self.table.take(pa.Array.from_buffers(pa.int64(), len(rows), [None, pa.py_buffer(rows)])).to_pylist()


class EmbeddedStore:
    """Index versions under `runs/`, the live one named by the pointer file `live_file`."""

    def __init__(self, runs: str | Path, live_file: str | Path):
        self.runs, self.live_file = Path(runs), Path(live_file)

    def folder(self, version: str) -> Path:
        return self.runs / version / "index"

    def manifest(self, version: str) -> dict | None:
        """The version's manifest, or None when it does not exist or is incomplete."""
        return mf.read_manifest(self.folder(version))

    def load(self, version: str, chunks_parquet: str, inputs: Mapping | None = None) -> int:
        """Build `version` from a chunks.parquet, or reuse it when it is complete and built from `inputs`.

        Never rebuilds the live version or a complete one built from other inputs (VersionConflict).
        """
        folder = self.folder(version)
        refuse_rebuilding_live(self, version)
        existing = mf.read_manifest(folder)
        if existing is not None:
            refusal = mf.conflict(version, existing, inputs or {})
            if refusal:
                raise refusal
            log.info("index version %s is complete and built from the same inputs: reused", version)
            return existing["rows"]
        tmp = folder.with_name("index.tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        try:
            count, dimension = write_index_files(chunks_parquet, tmp)
            names = [p.name for p in tmp.iterdir() if p.is_file()]
            before = stamp.identities(tmp, names)
            files = mf.file_entries(tmp, names)
            manifest = mf.build_manifest(
                version, rows=count, dimension=dimension, inputs=inputs, files=files, backend="embedded"
            )
            mf.write_manifest(tmp, manifest)  # last: the completion mark
            stamp.write_stamp(tmp, mf.manifest_hash(manifest), before)  # just hashed: the first open reads none
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)  # e.g. a full disk: free what we took, leave no half index
            raise
        shutil.rmtree(folder, ignore_errors=True)  # an incomplete earlier attempt (no manifest)
        tmp.rename(folder)  # a version appears whole or not at all
        return count

    def verify(self, version: str, hashes: bool = True, proof: bool = False) -> dict:
        """The manifest of an intact, complete version; IntegrityError naming each bad file otherwise.

        With `proof`, a `.verified` stamp still holding for the files stands in for re-hashing them."""
        folder = self.folder(version)
        if not folder.is_dir():
            raise FileNotFoundError(f"no index version {version} ({folder})")
        return mf.verify_folder(folder, version, hashes=hashes, proof=proof)

    def promote(self, version: str) -> None:
        self.verify(version)
        write_text(version + "\n", self.live_file)

    @property
    def promotions_log(self) -> Path:
        return self.live_file.parent / promotions.PROMOTIONS_LOG

    def log_promotion(self, record: Mapping) -> None:
        promotions.append_record(record, self.promotions_log)

    def promotions(self) -> list[dict]:
        """Every promotion and rollback, oldest first."""
        return promotions.read_records(self.promotions_log)

    def live(self) -> str | None:
        if not self.live_file.exists():
            return None
        return self.live_file.read_text(encoding="utf-8").strip() or None

    def versions(self) -> list[str]:
        if not self.runs.is_dir():
            return []
        folders = [p.parent for p in self.runs.glob("*/index") if p.is_dir()]
        return oldest_first((_created(f / "index"), f.name) for f in folders)

    def drop(self, version: str) -> None:
        refuse_dropping_live(self, version)
        shutil.rmtree(self.folder(version), ignore_errors=True)

    def open(self, version: str | None = None, hashes: bool = True) -> EmbeddedSearcher:
        """A searcher over a verified version: sizes always; unless `hashes=False` the SHA-256s too, or the
        `.verified` stamp when the files kept the identity they had when last hashed."""
        version = version or self.live()
        if version is None:
            raise FileNotFoundError(f"no live index (pointer {self.live_file} missing); run `sourcegate run` first")
        return EmbeddedSearcher(self.folder(version), manifest=self.verify(version, hashes=hashes, proof=True))


def write_index_files(chunks_parquet: str | Path, folder: Path, rows: int | None = None) -> tuple[int, int]:
    """chunks.parquet (stored columns), embeddings.npy and the BM25 files of a version, one batch at a time.

    Memory: a batch, plus what the index needs to serve: the BM25 matrix and its vocabulary (the
    vectors go to disk as they come and are read back memory-mapped). Returns (chunks, dimension).
    """
    source = pq.ParquetFile(chunks_parquet)
    total, dimension = source.metadata.num_rows, source.schema_arrow.field("embedding").type.list_size
    stored = source.schema_arrow
    stored = pa.schema([stored.field(name) for name in STORED_FIELDS])
    bm25, vectors_written = BM25Builder(), 0
    (folder / "embeddings.npy").unlink(missing_ok=True)  # a new file: a staged one may be a worker cache's link
    with open(folder / "embeddings.npy", "wb") as npy:
        header = {"descr": np.lib.format.dtype_to_descr(np.dtype(np.float32)), "fortran_order": False}
        np.lib.format.write_array_header_1_0(npy, header | {"shape": (total, dimension)})  # np.save's header

        def tables():
            nonlocal vectors_written
            for table in iter_batches(chunks_parquet, [*STORED_FIELDS, "embedding"], rows):
                vectors = np.ascontiguousarray(embedding_matrix(table), np.float32)
                npy.write(vectors.tobytes())
                vectors_written += len(vectors)
                bm25.add([analyze(t) for t in table["text"].to_pylist()])
                yield table.select(list(STORED_FIELDS))

        count = write_batches(tables(), folder / "chunks.parquet", stored)
    faults.reached("load:partial")
    index = bm25.build()
    index.save(folder)
    indexed = {count, vectors_written, index.size, len(np.load(folder / "embeddings.npy", mmap_mode="r"))}
    if indexed != {total}:
        raise RuntimeError(f"index {folder}: {sorted(indexed)} chunks indexed, expected {total}")
    return total, dimension


def open_run_folder(run_folder: str | Path, hashes: bool = True) -> EmbeddedSearcher:
    """A verified searcher over the version in an embedded run folder (`runs/<version>/`)."""
    run_folder = Path(run_folder)
    return EmbeddedStore(run_folder.parent, run_folder.parent / "LIVE").open(run_folder.name, hashes=hashes)


def _created(index: Path) -> float:
    """When a version was loaded: its manifest's `created` (an incomplete one: the folder's mtime)."""
    manifest = mf.read_manifest(index)
    if manifest and manifest.get("created"):
        return datetime.fromisoformat(manifest["created"]).timestamp()
    return index.stat().st_mtime
