"""`sourcegate init`: a new corpus's config and eval-set files, and what to write next.

A new corpus starts with no corpus-specific model (`answerability.answer_model_path: null`, the generic answer model)
and the gating signal chosen by rule on its own fit set (`answer.signal: auto`, sourcegate/evals/signal_choice.py). What a person
must still write is the one thing no tool can: should-answer questions in their users' words, each naming the section
that answers it (a BEIR dataset's judged queries can stand in, `--judged SPLIT`: its annotators wrote them, in the
benchmark's words rather than its users'). The off-topic side starts from the reviewed pool (config/evals/pool/), split between the fit and the
check set so the check set's questions never chose anything; generated "borrowing" candidates (the corpus's own names in
asks it cannot answer) go to a file of their own for a person to review, never straight into a set.
"""

from __future__ import annotations

import json
import random
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import yaml

from sourcegate.evals.evalset import load_evalset
from sourcegate.pipelines import config as config_mod
from sourcegate.pipelines import models
from sourcegate.pipelines.build import beir_queries, quarantine
from sourcegate.pipelines.build.chunk import chunk_documents
from sourcegate.pipelines.build.ingest import empty_corpus, ingest
from sourcegate.pipelines.config import PipelineConfig
from sourcegate.pipelines.home import home
from sourcegate.pipelines.training.decline_candidates import borrowing_candidates, sections_of_chunks

POOL = home() / "config" / "evals" / "pool" / "off-topic.jsonl"
CANDIDATES = 60  # borrowing candidates generated for review
# judged queries taken from a BEIR split at most: 150 should-answer questions all kept put the exact 95% lower bound
# on coverage at 0.980, and every question costs each night its pairs
JUDGED_MAX = 300
SEED = 13


@dataclass(frozen=True)
class Scaffold:
    config: Path
    files: dict[str, Path]
    sections: int
    need: int  # questions of each label the fit set needs (calibration.min_per_label)
    pool_split: tuple[int, int]  # the pool's off-topic (gated) questions placed in the fit and the check set
    quarantined: int = 0  # documents the night would set aside too (unreadable, empty, degenerate, ...)
    quarantine_reasons: dict[str, int] | None = None
    judged: tuple[int, int] = (0, 0)  # a BEIR split's judged queries written as should-answer: fit, check
    judged_split: str | None = None
    judged_left_out: int = 0  # judged queries none of whose documents is in the corpus as read
    judged_of: int = 0  # the judged queries a sample was drawn from (0: all were taken)
    splits: tuple[str, ...] = ()  # a BEIR dataset's qrels splits, when none was taken
    topics: dict[str, int] | None = None  # the pool's questions by topic
    near_topic: tuple[str, ...] = ()  # topics whose pool questions were written as near_topic (--near-topic)


def corpus_sections(corpus: str | Path, fmt: str, work: Path, cfg: PipelineConfig) -> list[dict]:
    """The corpus's sections as the night will cut them: doc id, section id, title, heading and text. What the night
    would set aside (ingest and chunk) is set aside here too, with its reasons in `work`'s quarantine file."""
    read = ingest(corpus, work, fmt=fmt, max_doc_bytes=cfg.corpus.max_doc_bytes)
    if not read.counts["documents"]:
        raise empty_corpus(corpus, read.counts, read.quarantine, fmt)
    documents = read.documents
    tok = models.tokenizer(str(models.embedding_model_path(cfg.embedding.model_path)))
    chunking = cfg.chunking
    rows = chunk_documents(
        documents,
        tok,
        max_tokens=chunking.max_tokens,
        overlap=chunking.overlap_tokens,
        max_split_pieces=chunking.max_split_pieces,
        rejected=(degenerate := []),
    )
    quarantine.write_stage(work, "chunk", degenerate)
    return sections_of_chunks(rows)


def new_config(base: PipelineConfig, corpus: Path, fmt: str, out: Path) -> dict:
    """The base config pointed at this corpus and these files, with nothing learned on another corpus."""
    evals = out / "evals"
    overrides = {
        "corpus.path": str(corpus),
        "corpus.format": fmt,
        "artifacts": str(out / "artifacts"),
        "answer.signal": "auto",
        "answer.adjacent": 0.0,  # placed on the fit set each night under auto (recorded in calibration.json)
        "answer.calibrated_by": "",
        "answerability.answer_model_path": None,  # the generic model: a corpus model is trained and bound here later
        "answerability.answer_passages": 3,  # the window the generic model was measured with
        "answerability.combiner": None,  # the demo's combiner learned the demo's fit set
        "evals.calibration_set": str(evals / "fit.jsonl"),
        "evals.check_set": str(evals / "check.jsonl"),
        "evals.precision_set": str(evals / "fit.jsonl"),  # the fit set's labelled passages, until you write more
        "evals.check_moves": str(evals / "check_moves.jsonl"),
        "evals.baseline": None,  # none accepted yet: `sourcegate accept RUN_DIR --out ...` after a night you trust
    }
    return config_mod.replace(base, overrides).model_dump(mode="json")


def _jsonl(rows: list[dict]) -> str:
    return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)


def pool_questions(near_topic: tuple[str, ...] = ()) -> list[dict]:
    """The reviewed off-topic pool, a question of a topic in `near_topic` (one the corpus's domain covers) relabelled
    `near_topic`: scored and reported, not gated. Chosen by topic before any score, never by one."""
    pool = load_evalset(POOL)
    known = sorted({t for q in pool for t in q["topics"]})
    unknown = sorted(set(near_topic) - set(known))
    if unknown:
        raise ValueError(f"--near-topic {','.join(unknown)}: the pool's topics are {', '.join(known)}")
    return [{**q, "kind": "near_topic"} if set(q["topics"]) & set(near_topic) else q for q in pool]


def judged_questions(dataset: Path, split: str, doc_ids: set[str], most: int) -> tuple[list[dict], int, int]:
    """A BEIR split's judged queries as should-answer questions, in the qrels file's order, each expecting the
    documents judged relevant that the corpus holds as read; at most `most` (a seeded sample, in the file's order).
    Also how many were left out for holding no such document, and how many a sample was drawn from (0: no sample)."""
    queries, qrels = beir_queries.load_queries(dataset, split)
    rows, left_out = [], 0
    for qid, text in queries.items():
        expected = [doc for doc, relevance in qrels[qid].items() if relevance > 0 and doc in doc_ids]
        if not expected:
            left_out += 1
            continue
        rows.append(
            {"id": f"{split}-{qid}", "question": text, "label": "answer", "expected": expected, "kind": "judged"}
        )
    if len(rows) <= most:
        return rows, left_out, 0
    return [rows[i] for i in sorted(random.Random(SEED).sample(range(len(rows)), most))], left_out, len(rows)


def scaffold(
    base: PipelineConfig,
    corpus: str | Path,
    out: str | Path,
    fmt: str = "markdown",
    judged: str | None = None,
    judged_max: int | None = None,
    near_topic: tuple[str, ...] = (),
) -> Scaffold:
    """Write OUT/pipeline.yaml, OUT/evals/{fit,check,candidates}.jsonl and OUT/sections.tsv; refuse to overwrite.
    `judged` (a BEIR dataset's split): its judged queries are the should-answer questions, alternate ones in the
    fit and the check set (a seeded sample of `judged_max`, default JUDGED_MAX, when there are more). `near_topic`: the pool's topics the
    corpus covers (`pool_questions`)."""
    corpus, out = Path(corpus).resolve(), Path(out).resolve()
    config_path = out / "pipeline.yaml"
    if config_path.exists():
        raise FileExistsError(f"{config_path} exists: init writes a new corpus's files and never overwrites them")
    if judged and fmt != "beir":
        raise ValueError(f"--judged {judged}: judged queries come from a BEIR dataset's qrels (--format beir)")
    work = out / "artifacts" / "init"
    sections = corpus_sections(corpus, fmt, work, base)  # first: a corpus it refuses leaves nothing written
    (out / "evals").mkdir(parents=True, exist_ok=True)
    if not sections:  # every document read was degenerate (ingest raises for a corpus that gave none)
        raise ValueError(f"{corpus}: no document could be chunked (see {work / quarantine.FILE})")
    pool = pool_questions(near_topic)
    fit_pool, check_pool = pool[0::2], pool[1::2]  # every other one: the check set's never chose anything
    doc_ids = {s["id"] for s in sections}  # a BEIR document is one section, named by its doc id
    answers, left_out, judged_of = (
        judged_questions(corpus, judged, doc_ids, judged_max or JUDGED_MAX) if judged else ([], 0, 0)
    )
    fit_answers, check_answers = answers[0::2], answers[1::2]
    files = {
        "config": config_path,
        "fit": out / "evals" / "fit.jsonl",
        "check": out / "evals" / "check.jsonl",
        "candidates": out / "evals" / "candidates.jsonl",
        "sections": out / "sections.tsv",
    }
    config_path.write_text(
        "# sourcegate config for the corpus at " + str(corpus) + ", written by `sourcegate init`.\n"
        + yaml.safe_dump(new_config(base, corpus, fmt, out), sort_keys=False),
        encoding="utf-8",
    )  # fmt: skip
    files["fit"].write_text(_jsonl(fit_answers + fit_pool), encoding="utf-8")
    files["check"].write_text(_jsonl(check_answers + check_pool), encoding="utf-8")
    files["candidates"].write_text(_jsonl(borrowing_candidates(sections, CANDIDATES, SEED)), encoding="utf-8")
    files["sections"].write_text(
        "id\ttitle\theading\n" + "".join(f"{s['id']}\t{s['title']}\t{s['heading']}\n" for s in sections),
        encoding="utf-8",
    )
    need = base.calibration.min_per_label
    set_aside = quarantine.summary(work)
    gated = tuple(sum(q["kind"] == "off_topic" for q in half) for half in (fit_pool, check_pool))
    files["quarantine"] = work / quarantine.FILE
    return Scaffold(
        config=config_path,
        files=files,
        sections=len(sections),
        need=need,
        pool_split=gated,
        quarantined=set_aside["total"],
        quarantine_reasons=set_aside["by_reason"],
        judged=(len(fit_answers), len(check_answers)),
        judged_split=judged,
        judged_left_out=left_out,
        judged_of=judged_of,
        splits=tuple(beir_queries.splits(corpus)) if fmt == "beir" and not judged else (),
        topics=dict(sorted(Counter(t for q in pool for t in q["topics"]).items())),
        near_topic=tuple(near_topic),
    )


def next_steps(s: Scaffold) -> str:
    """What to write next, in the order a person does it."""
    fit, check = s.files["fit"], s.files["check"]
    short = max(0, s.need - s.pool_split[0])
    set_aside = []
    if s.quarantined:
        reasons = ", ".join(f"{n} {why}" for why, n in (s.quarantine_reasons or {}).items())
        set_aside = [
            f"quarantined {s.quarantined} document(s) a night would set aside too "
            f"({reasons}): each with its reason in {s.files['quarantine']}"
        ]
    judged, write = [], f"write at least {s.need} should-answer questions"
    if s.judged_split:
        judged = [
            f"the fit and the check set hold {s.judged[0]} and {s.judged[1]} of the {s.judged_split!r} split's judged "
            "queries as should-answer questions (the dataset's annotators wrote them, not your users)"
            + (f" (a sample of {sum(s.judged)} of {s.judged_of}, seed {SEED}: --judged-max)" if s.judged_of else "")
            + (f"; {s.judged_left_out} left out: none of their documents is in the corpus" if s.judged_left_out else "")
        ]
        more = s.need - s.judged[0]
        write = f"write at least {more} more should-answer questions" if more > 0 else "add should-answer questions"
    elif s.splits:
        split = "test" if "test" in s.splits else s.splits[0]
        judged = [
            f"this dataset has judged queries (qrels: {', '.join(s.splits)}): init with `--judged {split}` (into a new"
            " --out) writes them as should-answer questions"
        ]
    return "\n".join(
        [
            f"wrote {s.config} and the eval sets under {fit.parent} ({s.sections} sections in {s.files['sections']})",
            *set_aside,
            *judged,
            "next:",
            f"  1. {write} in your users' own words into {fit}, one JSON",
            '     line each: {"id": "a-001", "question": "...", "label": "answer", "expected": ["<section id>"]}',
            f"     (section ids: {s.files['sections']}); {s.pool_split[0]} off-topic questions from the pool are"
            + (" already there" if not short else f" there, write {short} more"),
            "     read those against your corpus's domain before any night: one your domain reaches (health questions",
            '     on a medical corpus) is "kind": "near_topic" (scored and reported, not gated) in both sets; the pool\'s',
            f"     topics: {', '.join(f'{t} {n}' for t, n in (s.topics or {}).items())}"
            + (
                f"; written near_topic: {', '.join(s.near_topic)}"
                if s.near_topic
                else " (init with `--near-topic TOPIC,...` into a new --out writes a whole topic so)"
            ),
            f"  2. separately and blind (before any score is seen), the check set {check}: should-answer questions",
            "     written the same way; it holds the other half of the pool's off-topic questions",
            f"  3. review {s.files['candidates']}: generated asks that borrow the corpus's names; move the ones",
            "     your corpus cannot answer into the fit set (the kind that fools every relevance signal)",
            f"  4. sourcegate --config {s.config} run --no-promote",
            "     (a set that does not fit the corpus stops it before scoring, exit 2, saying what is missing;",
            "     the gate then says which signal it chose by rule and whether the check set held)",
            f"  5. once a night is trusted: sourcegate --config {s.config} accept RUN_DIR --out "
            f"{s.config.parent / 'baseline.json'} (and set evals.baseline to that file)",
        ]
    )
