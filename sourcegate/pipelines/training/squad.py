"""SQuAD 2.0 dev as training data for the answer model: the file (hash-checked), its split by article, its pairs.

Every choice was fixed before the held-out articles were scored: sorted titles, random.Random(13).shuffle, 25 to
train, 10 held out; answerable question + its own paragraph -> 1, unanswerable question + its own paragraph -> 0,
answerable question + one other paragraph of the same article (seeded) -> 0.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import random
from pathlib import Path

SPLIT_SEED = 13
SQUAD_DEV_JSON_SHA256 = "80a5225e94905956a6446d296ca1093975c4d3b3260f1d6c8f68bc2ab77182d8"
N_TRAIN_ARTICLES = 25
N_HELDOUT_ARTICLES = 10


def load_squad(path: str | os.PathLike) -> tuple[dict, dict]:
    """Load SQuAD JSON (optionally gzipped). Returns (squad, {sha256 of file, of json})."""
    path = Path(path)
    raw = path.read_bytes()
    hashes = {"file": str(path), "file_sha256": hashlib.sha256(raw).hexdigest()}
    if path.suffix == ".gz":
        raw = gzip.decompress(raw)
        hashes["gz_sha256"] = hashes["file_sha256"]
    hashes["json_sha256"] = hashlib.sha256(raw).hexdigest()
    hashes["json_bytes"] = len(raw)
    return json.loads(raw.decode("utf-8")), hashes


def split_articles(squad: dict) -> tuple[list[str], list[str]]:
    """Deterministic split by article: sorted titles, seeded shuffle (seed 13),
    first 25 -> train, remaining 10 -> held out. Both lists are returned sorted."""
    titles = sorted({a["title"] for a in squad["data"]})
    if len(titles) != N_TRAIN_ARTICLES + N_HELDOUT_ARTICLES:
        raise ValueError(f"expected {N_TRAIN_ARTICLES + N_HELDOUT_ARTICLES} articles, got {len(titles)}")
    rng = random.Random(SPLIT_SEED)
    rng.shuffle(titles)
    train, held = titles[:N_TRAIN_ARTICLES], titles[N_TRAIN_ARTICLES:]
    assert not set(train) & set(held)
    return sorted(train), sorted(held)


def articles_by_title(squad: dict, titles) -> list[dict]:
    """Articles whose title is in ``titles``, in the data file's order."""
    wanted = set(titles)
    return [a for a in squad["data"] if a["title"] in wanted]


PAIR_TYPES = ("answerable_own", "unanswerable_own", "near_topic")


def make_pairs_typed(articles: list[dict], seed: int) -> list[tuple[str, str, int, str]]:
    """Like ``make_pairs`` but each pair also carries its type (one of PAIR_TYPES)."""
    rng = random.Random(seed)
    out: list[tuple[str, str, int, str]] = []
    for art in articles:
        paras = [p["context"] for p in art["paragraphs"]]
        for pi, para in enumerate(art["paragraphs"]):
            others = [j for j in range(len(paras)) if j != pi]
            for qa in para["qas"]:
                q = qa["question"]
                if qa.get("is_impossible", False):
                    out.append((q, para["context"], 0, "unanswerable_own"))
                else:
                    out.append((q, para["context"], 1, "answerable_own"))
                    if others:
                        out.append((q, paras[rng.choice(others)], 0, "near_topic"))
    return out


def pair_counts(typed_pairs) -> dict:
    c = {t: 0 for t in PAIR_TYPES}
    for *_, t in typed_pairs:
        c[t] += 1
    c["total"] = len(typed_pairs)
    c["positives"] = sum(1 for p in typed_pairs if p[2] == 1)
    c["negatives"] = c["total"] - c["positives"]
    return c
