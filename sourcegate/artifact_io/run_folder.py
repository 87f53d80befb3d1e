"""Where a run's file gets its path: the run folder `<artifacts>/runs/<run id>/`, every file name a run writes,
and run.json's reading and updating.

It sits in the bottom layer so the steps (sourcegate/pipelines/), the evaluation that writes into the folder (sourcegate/evals/) and the
Airflow plugins that read it all name a file the same way. `root` is the artifacts folder the run lives in as the
steps see it: the configured folder, or for an s3:// artifacts prefix the scratch folder it was staged into
(sourcegate/pipelines/app/staging.py), which says where it is published (`published`).
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from sourcegate.artifact_io import read_json, write_json

RUN_ID = re.compile(r"^[a-z0-9][a-z0-9_.-]{0,100}$")  # also a valid OpenSearch index suffix
RUNS = "runs"  # under the artifacts folder: one folder per run
PUBLISHED_AS = ".published-as"  # in a staged scratch folder: the s3:// URI it is published to (never published)

# Every file a run writes, in the order the night writes them (docs/architecture.md "What a run writes").
RUN_INFO = "run.json"  # config, hashes, model ids, counts, timings, quarantine, verdict summary
DOCUMENTS = "documents.parquet"  # ingest
INGEST_MANIFEST = "manifest.parquet"  # ingest: added / changed / deleted / unchanged against the previous run
SKIPPED = "skipped.jsonl"  # ingest: files it did not read (not articles)
QUARANTINE = "quarantine.jsonl"  # ingest, chunk, validate: every input set aside, with its stage and reason
CHUNKS_TEXT = "chunks.text.parquet"  # chunk: the chunks before embedding
EMBED_SHARDS = "embed"  # embed: one Parquet per shard, joined by merge
CHUNKS = "chunks.parquet"  # merge: the embedded chunks
QUALITY = "quality.json"  # validate: the expectations' results
CHUNKS_VALID = "chunks.valid.parquet"  # validate, only when it quarantined a document: what is loaded
INDEX = "index"  # load (embedded backend): the index version, its manifest written last
INDEX_MANIFEST = f"{INDEX}/manifest.json"
CALIBRATION = "calibration.json"  # evaluate
PRECISION = "precision.json"  # evaluate
EVAL_ERRORS = "eval_errors.json"  # evaluate: questions that could not be scored
QUESTIONS = "questions.jsonl"  # evaluate: one row per question and eval set
TEXT_VECTORS = (
    "text_vectors.parquet"  # evaluate: question, word and sentence vectors, under the bi-encoder's fingerprint
)
RERANK_PAIRS = "rerank_pairs.parquet"  # evaluate: question-passage logits, under the cross-encoder's fingerprint
ANSWER_PAIRS = "answer_pairs.parquet"  # evaluate: the answer-support model's logits, under its fingerprint
KEPT = (TEXT_VECTORS, RERANK_PAIRS, ANSWER_PAIRS)  # values an evaluation keeps for the next (retrieval/kept.py)
COMBINER = "answerability_combiner.json"  # `sourcegate calibrate --refit`: the combiner fitted on this run
DIFF_LIVE = "diff_live.json"  # gate: per question, what changed since the live version
GATE = "gate.json"  # gate: the verdict and what it judged
JUNIT = "junit.xml"  # gate: one test case per check
REPORT = "report.html"  # gate


def loadable_chunks(folder: str | Path) -> Path:
    """The chunks to load and evaluate in a run folder: the validated ones when validation quarantined any,
    else all."""
    valid = Path(folder) / CHUNKS_VALID
    return valid if valid.exists() else Path(folder) / CHUNKS


def check_run_id(run_id: str) -> str:
    """`run_id`, or ValueError naming it when it cannot be a folder name and an index suffix."""
    if not isinstance(run_id, str) or not RUN_ID.match(run_id):
        raise ValueError(f"run id {run_id!r} must match {RUN_ID.pattern}")
    return run_id


@dataclass(frozen=True)
class RunFolder:
    """One run's folder under an artifacts folder: its paths, its run.json, its neighbours."""

    root: Path
    run_id: str

    def __init__(self, root: str | Path, run_id: str):
        object.__setattr__(self, "root", Path(root))
        object.__setattr__(self, "run_id", check_run_id(run_id))

    @property
    def path(self) -> Path:
        return self.root / RUNS / self.run_id

    def __truediv__(self, name: str) -> Path:
        return self.path / name

    def __fspath__(self) -> str:
        return str(self.path)

    def exists(self) -> bool:
        return self.path.is_dir()

    def mkdir(self) -> Path:
        self.path.mkdir(parents=True, exist_ok=True)
        return self.path

    def shard(self, shard: int) -> Path:
        """Embed shard `shard`'s Parquet."""
        return self.path / EMBED_SHARDS / f"shard-{shard:04d}.parquet"

    def loadable_chunks(self) -> Path:
        return loadable_chunks(self.path)

    def sibling(self, run_id: str) -> RunFolder:
        """Another run's folder under the same artifacts folder."""
        return RunFolder(self.root, run_id)

    # --- run.json ---------------------------------------------------------------------

    def info(self) -> dict:
        """run.json, or {} before the run wrote one."""
        path = self.path / RUN_INFO
        return read_json(path) if path.exists() else {}

    def update_info(self, **fields) -> dict:
        """Merge `fields` into run.json (a dict value merges into the dict it replaces, one level deep)."""
        info = self.info()
        for key, value in fields.items():
            if isinstance(value, dict) and isinstance(info.get(key), dict):
                info[key].update(value)
            else:
                info[key] = value
        write_json(info, self.path / RUN_INFO)
        return info

    @contextmanager
    def timed(self, step: str) -> Iterator[None]:
        """Record the wall time of the block as run.json's `timings_s[step]`."""
        start = time.perf_counter()
        yield
        self.update_info(timings_s={step: round(time.perf_counter() - start, 3)})

    # --- neighbours -------------------------------------------------------------------

    def earlier_with(self, name: str) -> RunFolder | None:
        """The newest earlier run (by run id) whose folder holds `name`."""
        runs = self.root / RUNS
        names = {p.parent.name for p in runs.glob(f"*/{name}")}
        earlier = sorted(n for n in names if n < self.run_id and RUN_ID.match(n))
        return self.sibling(earlier[-1]) if earlier else None

    def previous(self) -> RunFolder | None:
        """The newest earlier run that got as far as chunks: the baseline for diffs and the embed cache."""
        return self.earlier_with(CHUNKS)

    def earlier_evaluation(self) -> RunFolder | None:
        """The newest earlier run whose evaluation kept its text vectors (and rerank logits)."""
        return self.earlier_with(TEXT_VECTORS)

    # --- where it is published --------------------------------------------------------

    def published_root(self) -> str:
        """The artifacts folder as recorded: the s3:// URI a staged scratch folder publishes to, else `root`."""
        marker = self.root / PUBLISHED_AS
        return marker.read_text(encoding="utf-8") if marker.is_file() else str(self.root)

    def published(self, local: str | Path | None = None) -> str:
        """`local` (default: this folder), a path under `root`, named where it is published."""
        local = Path(local) if local is not None else self.path
        published = self.published_root()
        if published == str(self.root):
            return str(local)
        return f"{published.rstrip('/')}/{local.relative_to(self.root).as_posix()}"
