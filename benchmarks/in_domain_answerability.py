"""docs/benchmarks/18-users-words.md, sixth round: the cross-encoder fine-tuned on this corpus's own labelled questions.

    python -m benchmarks.in_domain_answerability --index artifacts/runs/RUN \
        --train config/evals/riders.jsonl config/evals/riders-final.jsonl config/evals/riders-final-3.jsonl \
        --test config/evals/calibration.jsonl --work /tmp/in_domain --out FILE.json

The answer-support model learnt what SQuAD's negatives teach and did not move (§23). Here the packaged
cross-encoder (ms-marco-MiniLM-L-12-v2, dequantised: sourcegate.pipelines.training.base_model.packaged_base) is
fine-tuned with the same trainer on pairs from labelled sets of this corpus: each should-answer question
with up to two of its labelled passages among the fused top 10 (1), each should-decline question (off-topic
and near-topic) with its fused top 3 (0). A question's score is the model's highest logit over its fused top
3, the passages `answer_support` reads. The threshold is the tightest on the training sets' should-answer
questions (the gate's rule); the test sets, never trained on, are judged at it. With `--place-on SET` the
threshold is placed on that set instead, never trained on (`tightest`, and `midpoint` when it has a gap), as a
shipped model's would be: trained on some labels, placed on others, checked on a third. No check set is read.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from benchmarks._common import finished, machine, uptime
from benchmarks.question_views import retriever_on
from benchmarks.signal_candidates import judged
from sourcegate.evals.evalset import load_evalset
from sourcegate.evals.placement import place
from sourcegate.pipelines.retrieval.answer_support import PASSAGES
from sourcegate.pipelines.training import in_domain
from sourcegate.pipelines.training.base_model import packaged_base
from sourcegate.pipelines.training.in_domain import EPOCHS, LR, training_pairs
from sourcegate.pipelines.training.train import train

PLACEMENTS = ("tightest", "midpoint")  # not logit_midpoint: the scores are logits already
MAX_LENGTH = 192  # the demo's chunks fit; shorter than the shipped 256 for speed on two cores


def fused_tops(run: Path, sets: dict[str, list[dict]], cache: Path) -> dict[str, list[dict]]:
    """Per set, each question as searched with its fused top `LABELLED_FROM` passages (cached by set name)."""
    tops = json.loads(cache.read_text()) if cache.exists() else {}
    missing = [name for name in sets if name not in tops]
    if missing:
        retriever = retriever_on(run)
        tops |= {name: in_domain.fused_tops(retriever, sets[name]) for name in missing}
        cache.write_text(json.dumps(tops), encoding="utf-8")
    return {name: tops[name] for name in sets}


def scorer(model_dir: Path):
    """The fine-tuned torch model's highest logit over the fused top PASSAGES passages, as answer_support reads."""
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForSequenceClassification.from_pretrained(model_dir).eval()

    def score(row: dict) -> float:
        texts = [text for _, text in row["passages"][:PASSAGES]]
        enc = tok([row["query"]] * len(texts), texts, padding=True, truncation="only_second",
                  max_length=MAX_LENGTH, return_tensors="pt")  # fmt: skip
        with torch.no_grad():
            return float(model(**enc).logits.squeeze(-1).float().max())

    return score


def judged_at(rows: list[dict], threshold: float) -> dict:
    """`judged`, plus the should-answer questions lost and the off-topic ones let through, with their scores."""
    return {
        **judged(rows, "tuned", threshold),
        "answer_lost": sorted(
            (r["id"], round(r["tuned"], 2)) for r in rows if r["label"] == "answer" and r["tuned"] < threshold
        ),  # fmt: skip
        "off_topic_through": sorted(
            (r["id"], round(r["tuned"], 2)) for r in rows if r.get("kind") == "off_topic" and r["tuned"] >= threshold
        ),  # fmt: skip
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--index", required=True, help="an embedded run folder")
    parser.add_argument("--train", nargs="+", required=True, help="labelled sets the model learns from")
    parser.add_argument("--test", nargs="+", required=True, help="labelled sets judged at the threshold")
    parser.add_argument("--place-on", help="a labelled set, never trained on, that places the threshold instead")
    parser.add_argument("--work", required=True, help="a folder for the base model, the cache and the model")
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    sets = {
        Path(p).stem: load_evalset(p) for p in [*args.train, *([args.place_on] if args.place_on else []), *args.test]
    }
    tops = fused_tops(Path(args.index), sets, work / "fused_tops.json")
    train_rows = [r for p in args.train for r in tops[Path(p).stem]]
    pairs = training_pairs(train_rows)
    base = work / "base"
    if not (base / "config.json").exists():
        packaged_base(base)
    model_dir = work / "model"
    result = {"machine": machine(), "load_start": uptime(), "train": [Path(p).stem for p in args.train]}
    result["pairs"] = {"positive": sum(p[2] for p in pairs), "negative": sum(1 - p[2] for p in pairs)}
    trained = train(pairs * EPOCHS, model_dir, str(base), lr=LR, max_length=MAX_LENGTH, time_budget_s=60 * 60)
    result["training"] = {k: trained[k] for k in ("steps", "train_seconds", "final_loss_mean_last_50")}
    result["training"]["epochs"] = EPOCHS
    score = scorer(model_dir)
    scored = {name: [{**r, "tuned": score(r)} for r in rows] for name, rows in tops.items()}
    fit = [r for p in args.train for r in scored[Path(p).stem]]
    threshold = min(r["tuned"] for r in fit if r["label"] == "answer")
    result["threshold"] = threshold
    lowest = sorted((round(r["tuned"], 2), r["id"]) for r in fit if r["label"] == "answer")[:3]
    # what stands between the training sets and a gap: their lowest answers, the off-topic ones above them
    result["train_sets"] = {**judged_at(fit, threshold), "lowest_answers": [(i, t) for t, i in lowest]}
    if args.place_on:  # the protocol a shipped model would follow: train, place on another set, check on a third
        placed = scored[Path(args.place_on).stem]
        answer = [r["tuned"] for r in placed if r["label"] == "answer"]
        off_topic = [r["tuned"] for r in placed if r.get("kind") == "off_topic"]
        thresholds = {rule: place(answer, off_topic, rule) for rule in PLACEMENTS}
        result["placed_on"] = {"set": Path(args.place_on).stem, "gap": min(answer) - max(off_topic), **thresholds}
        for p in args.test:
            result[Path(p).stem] = {rule: judged_at(scored[Path(p).stem], t) for rule, t in thresholds.items()}
    else:
        for p in args.test:
            result[Path(p).stem] = judged_at(scored[Path(p).stem], threshold)
    return finished(result, args.out)


if __name__ == "__main__":
    raise SystemExit(main())
