"""A BEIR dataset's judged queries: `queries.jsonl` and `qrels/<split>.tsv`, read by `sourcegate beir` (the systems'
measures) and by `sourcegate init --judged` (should-answer questions). Light on purpose: `init` imports it."""

from __future__ import annotations

import csv
import json
from pathlib import Path


def splits(dataset: Path) -> list[str]:
    """The qrels splits a dataset has (`qrels/*.tsv`), sorted."""
    return sorted(p.stem for p in (Path(dataset) / "qrels").glob("*.tsv"))


def load_queries(dataset: Path, split: str = "test") -> tuple[dict[str, str], dict[str, dict[str, int]]]:
    """The split's judged queries and their judgements; a split the dataset lacks is named with the ones it has."""
    dataset = Path(dataset)
    path = dataset / "qrels" / f"{split}.tsv"
    if not path.is_file():
        raise FileNotFoundError(
            f"{path}: no {split!r} split in {dataset} (its qrels: {', '.join(splits(dataset)) or 'none'})"
        )
    queries = {}
    for line in (dataset / "queries.jsonl").read_text(encoding="utf-8").splitlines():
        if line.strip():
            q = json.loads(line)
            queries[str(q["_id"])] = q["text"]
    qrels: dict[str, dict[str, int]] = {}
    with path.open(encoding="utf-8") as fh:
        for row in csv.DictReader(fh, delimiter="\t"):
            qrels.setdefault(row["query-id"], {})[row["corpus-id"]] = int(row["score"])
    return {q: queries[q] for q in qrels if q in queries}, qrels
