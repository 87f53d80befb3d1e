"""`sourcegate train-answerability`: the recipe of the answer-support model (docs/benchmarks/23-answer-model-squad.md).

The model scores (question, passage) -> P(the passage answers the question); the signal that reads
it is `sourcegate/pipelines/retrieval/answer_support.py`. Recipe, every choice fixed before the held-out
articles were scored:
  * data: SQuAD 2.0 dev (35 articles, CC BY-SA 4.0, SHA-256 checked) split by article
    (training/squad.py): 25 to train, 10 held out; no held-out question in training;
  * start: the packaged cross-encoder, dequantised (training/base_model.py); its word embeddings
    frozen, so the shipped file can leave them out (answer_support.SHARED);
  * training: BCE-with-logits, AdamW lr 2e-5, 20 warm-up steps then linear decay, batch 16,
    length-grouped seeded batches, 200 steps (3,200 of 12,312 pairs: what 2 shared cores train
    in about ten minutes), bf16 autocast, seed 13 (training/train.py);
  * export: ONNX opset 17, dynamic INT8 weights, the shared embedding table stripped (training/export.py);
  * held-out evaluation with the shipped scorer, one pair per run (training/evaluate.py).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from sourcegate.pipelines.training.base_model import base_model_info, packaged_base
from sourcegate.pipelines.training.evaluate import evaluate
from sourcegate.pipelines.training.export import TOKENIZER_NAME, export_int8, ship, versions, write_recipe
from sourcegate.pipelines.training.squad import (
    SPLIT_SEED,
    SQUAD_DEV_JSON_SHA256,
    articles_by_title,
    load_squad,
    make_pairs_typed,
    pair_counts,
    split_articles,
)
from sourcegate.pipelines.training.train import train
from sourcegate.pipelines.versions.manifest import sha256_file


def train_answerability(
    data: str, out: Path, work: Path | None = None, steps: int = 200, threads: int = 2, lr: float = 2e-5
) -> dict:
    """The whole recipe: base model, training, export, the shipped files, the held-out evaluation.
    Writes OUT/{model.onnx, tokenizer.json, recipe.json, heldout.json, training.log}; returns the held-out result."""
    from sourcegate.pipelines.retrieval.answer_support import SHARED

    t_start = time.time()
    out = Path(out)
    work = Path(work) if work else out.parent / (out.name + "_work")
    out.mkdir(parents=True, exist_ok=True)
    work.mkdir(parents=True, exist_ok=True)
    log_path = out / "training.log"
    squad, hashes = load_squad(data)
    if hashes["json_sha256"] != SQUAD_DEV_JSON_SHA256:
        raise ValueError(f"{data}: SHA-256 {hashes['json_sha256']} is not SQuAD 2.0 dev's {SQUAD_DEV_JSON_SHA256}")
    train_titles, held_titles = split_articles(squad)
    train_typed = make_pairs_typed(articles_by_title(squad, train_titles), SPLIT_SEED)
    held_typed = make_pairs_typed(articles_by_title(squad, held_titles), SPLIT_SEED)
    if set(train_titles) & set(held_titles):
        raise RuntimeError("an article is both in training and held out")
    # the same wording may recur in two articles ("What is the capital?"): counted, not a leak of an article
    same_wording = len({p[0] for p in held_typed} & {p[0] for p in train_typed})
    base = packaged_base(work / "base")
    log_path.write_text(
        f"data {hashes}\nsplit train={train_titles}\nsplit heldout={held_titles}\n"
        f"train pairs {pair_counts(train_typed)}\nheldout pairs {pair_counts(held_typed)}\n"
        f"base {base_model_info(base)}\nversions {versions()}\n"
    )
    hyper = {"lr": lr, "batch_size": 16, "warmup_steps": 20, "max_steps": steps, "freeze_word_embeddings": True}
    trained = train(
        [(q, p, y) for q, p, y, _ in train_typed], work / "hf", base, log_path=log_path, threads=threads, **hyper
    )
    exported = export_int8(work / "hf", work / "model.int8.onnx", fp32_path=work / "model.fp32.onnx")
    shipped_bytes = ship(work / "model.int8.onnx", out / "model.onnx")
    (out / TOKENIZER_NAME).write_bytes((work / TOKENIZER_NAME).read_bytes())
    recipe = {
        "task": "answer support cross-encoder: P(passage answers question)",
        "command": f"sourcegate train-answerability --data {data} --out {out} --steps {steps} --lr {lr}",
        "base_model": base_model_info(base),
        "data": {**hashes, "name": "SQuAD 2.0 dev (dev-v2.0.json)", "license": "CC BY-SA 4.0"},
        "split": {"seed": SPLIT_SEED, "train_titles": train_titles, "heldout_titles": held_titles},
        "pairs": {
            "seed": SPLIT_SEED,
            "train": pair_counts(train_typed),
            "heldout": pair_counts(held_typed),
            "heldout_questions_worded_as_a_training_question": same_wording,
        },
        **{k: trained[k] for k in ("hyperparameters", "steps", "pairs_seen", "epochs", "train_seconds")},
        "final_loss_mean_last_50": trained["final_loss_mean_last_50"],
        "export": {
            "opset": exported["opset"],
            "quantization": exported["quantization"],
            "shipped_bytes": shipped_bytes,
        },
        "shared_with_packaged_cross_encoder": list(SHARED),
        "onnx_sha256": sha256_file(out / "model.onnx"),
        "tokenizer_sha256": sha256_file(out / TOKENIZER_NAME),
        "versions": versions(),
    }
    write_recipe(out / "recipe.json", recipe)
    result = evaluate(out, data)
    (out / "heldout.json").write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    recipe["wall_seconds"] = round(time.time() - t_start, 1)
    write_recipe(out / "recipe.json", recipe)
    return result
