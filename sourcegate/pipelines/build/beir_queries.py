"""A BEIR dataset's judged queries: `queries.jsonl` and `qrels/<split>.tsv`, read by `sourcegate beir` (the systems'
measures) and by `sourcegate init --judged` (should-answer questions). Light on purpose: `init` imports it.

Datasets come from many hands: a file saved with a byte-order mark, or a qrels file without its header line, reads
as the format means it; anything else the format does not allow is named by file and line, never a bare KeyError."""

from __future__ import annotations

import csv
import json
import logging
from collections.abc import Iterator
from pathlib import Path

from sourcegate.pipelines.build.doc_ids import HostileName, id_from_beir

log = logging.getLogger(__name__)

QRELS_COLUMNS = ["query-id", "corpus-id", "score"]


class DatasetError(ValueError):
    """A queries or qrels file that does not read as BEIR's format: the message names the file and the line."""


def splits(dataset: Path) -> list[str]:
    """The qrels splits a dataset has (`qrels/*.tsv`), sorted."""
    return sorted(p.stem for p in (Path(dataset) / "qrels").glob("*.tsv"))


def text_lines(path: Path) -> list[str]:
    """A UTF-8 file's lines, a leading byte-order mark dropped (Windows tools write one); invalid UTF-8 named."""
    try:
        return path.read_text(encoding="utf-8-sig").splitlines()
    except UnicodeDecodeError as exc:
        raise DatasetError(f"{path}: not UTF-8 (byte {exc.start})") from None


def read_queries(path: Path) -> dict[str, str]:
    """`queries.jsonl`: query id -> text."""
    queries = {}
    for lineno, line in enumerate(text_lines(path), 1):
        if not line.strip():
            continue
        try:
            q = json.loads(line)
        except json.JSONDecodeError as exc:
            raise DatasetError(f"{path}:{lineno}: not valid JSON ({exc.msg})") from None
        if not isinstance(q, dict) or isinstance(q.get("_id"), bool) or not isinstance(q.get("_id"), (str, int)):
            raise DatasetError(f'{path}:{lineno}: a query needs an "_id" (a string)')
        if not isinstance(q.get("text"), str):
            raise DatasetError(f'{path}:{lineno}: query {q["_id"]!r} needs a "text" (a string)')
        queries[str(q["_id"])] = q["text"]
    return queries


def qrels_rows(path: Path) -> Iterator[list[str]]:
    """[query id, corpus id, score] of each judgement of a qrels file; its header line is optional, as long as the
    first line is either the header or a judgement (three tab-separated fields, the last an integer)."""
    rows = csv.reader(text_lines(path), delimiter="\t")
    for lineno, row in enumerate(rows, 1):
        row = [field.strip() for field in row]
        if not any(row):
            continue
        if lineno == 1 and row == QRELS_COLUMNS:
            continue
        if len(row) != 3 or not _is_int(row[2]):
            expected = "the header query-id, corpus-id, score or a judgement" if lineno == 1 else "a judgement"
            raise DatasetError(
                f"{path}:{lineno}: expected {expected} (three tab-separated fields: query id, corpus id, "
                f"integer score), found {row!r}"
            )
        yield row


def document_id(corpus_id: str) -> str:
    """The id ingest gives the document of a judgement's corpus id (`doc_ids.id_from_beir`); an id ingest refuses
    stays as written: its document was set aside, so the judgement names nothing in the index."""
    try:
        return id_from_beir(corpus_id)
    except HostileName:
        return corpus_id


def _is_int(text: str) -> bool:
    try:
        int(text)
    except ValueError:
        return False
    return True


def load_queries(dataset: Path, split: str = "test") -> tuple[dict[str, str], dict[str, dict[str, int]]]:
    """The split's judged queries and their judgements, both for the queries `queries.jsonl` holds (a judged query it
    lacks cannot be searched: counted as 0 it would only lower every system's mean); a split the dataset lacks is
    named with the ones it has."""
    dataset = Path(dataset)
    path = dataset / "qrels" / f"{split}.tsv"
    if not path.is_file():
        raise FileNotFoundError(
            f"{path}: no {split!r} split in {dataset} (its qrels: {', '.join(splits(dataset)) or 'none'})"
        )
    queries = read_queries(dataset / "queries.jsonl")
    qrels: dict[str, dict[str, int]] = {}
    for query_id, corpus_id, score in qrels_rows(path):
        qrels.setdefault(query_id, {})[document_id(corpus_id)] = int(score)
    if not qrels:
        raise DatasetError(f"{path}: no judgement: nothing to measure")
    missing = [q for q in qrels if q not in queries]
    if len(missing) == len(qrels):  # measures over no query would read 0.0, not "nothing measured"
        raise DatasetError(
            f"{path}: none of its {len(qrels)} judged queries is in queries.jsonl (first: {missing[0]!r}): "
            "nothing to measure"
        )
    if missing:
        log.warning(
            "%s: %d judged queries are not in queries.jsonl (first: %r): left out", path, len(missing), missing[0]
        )
    return {q: queries[q] for q in qrels if q in queries}, {q: judged for q, judged in qrels.items() if q in queries}
