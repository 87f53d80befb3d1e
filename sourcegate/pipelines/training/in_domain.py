"""`sourcegate train-in-domain`: an answer-support model trained on this corpus's own labelled questions.

The shipped answer-support model learnt from SQuAD 2.0 and did not move past the reranker it started from
(docs/benchmarks/23-answer-model-squad.md); the same cross-encoder fine-tuned on a corpus's own labelled
questions is the strongest decline evidence measured here (docs/benchmarks/18-users-words.md). This is that recipe
as a command, its output a drop-in `answerability.answer_model_path`:
  * pairs, from the version's own retrieval: each should-answer question with up to POSITIVES of its labelled
    passages among the fused top LABELLED_FROM (1); each should-decline question, off-topic or near-topic, with
    its fused top `answerability.answer_passages` (default PASSAGES), the passages `answer_support` reads (0);
  * start and training as `sourcegate train-answerability` (the packaged cross-encoder dequantised, word
    embeddings frozen; BCE, AdamW, seed 13), EPOCHS passes; exported as `int8` (default: dynamic INT8 with one
    scale per output channel, the shared embedding table left out as the shipped model does: about 22 MB, small
    enough to commit) or `fp32` (whole, 134 MB, the trained model's own scores). Per-tensor INT8, as the SQuAD
    model is shipped, moved this model's logits by up to 15 (docs/benchmarks/18-users-words.md); the gate
    judges whichever file is configured;
  * recipe.json records the training sets (path, SHA-256) and the key of every question trained on
    (`sourcegate.evals.evalset.question_key`): a night whose fit or check set holds one of them fails its gate
    (`answer_model_unseen`), since a model's scores on its own training questions are in-sample and would
    make the coverage figures claim what the model has only memorised; the command refuses, before training,
    sets holding a judged question verbatim, a word or two away (`sourcegate.evals.evalset.near_duplicates`) or in other
    words (`sourcegate.evals.evalset.paraphrases`, the version's bi-encoder), or with `--drop-judged` leaves them out and
    records which (`left_out`).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from sourcegate.evals.evalset import NEAR, PARAPHRASE, copies, load_evalset, question_key, question_text
from sourcegate.pipelines.build.validate import loadable_chunks
from sourcegate.pipelines.retrieval import learned_corpus
from sourcegate.pipelines.retrieval.answer_support import PASSAGES, load_answer_model, write_ensemble
from sourcegate.pipelines.retrieval.retriever import effective_query
from sourcegate.pipelines.training.base_model import base_model_info, packaged_base, shrink
from sourcegate.pipelines.training.export import TOKENIZER_NAME, export_fp32, export_int8, ship, versions, write_recipe
from sourcegate.pipelines.training.synthetic_pairs import synthetic_source
from sourcegate.pipelines.training.train import train
from sourcegate.pipelines.versions.manifest import sha256_file

LABELLED_FROM = 10  # how deep the fused order is searched for a should-answer question's labelled passages
POSITIVES = 2  # labelled passages per should-answer question, at most
EPOCHS = 4  # one epoch left 18 of 43 training off-topic questions above the tightest threshold; four epochs, 2
LR = 3e-5
SEED = 13  # the recipe's; another seed measures how much of a result is the draw (up to three off-topic questions)
TIME_BUDGET_S = 6 * 3600


def fused_tops(retriever, items: list[dict], depth: int = LABELLED_FROM) -> list[dict]:
    """Each question as searched, with its fused top `depth` passages as (doc_id#section_id, text)."""
    rows = []
    for q in items:
        query = effective_query(q["question"], q.get("context", []))
        fused, _ = retriever.fuse(query, retriever.text_vectors([query])[0])
        rows.append({**q, "query": query, "passages": [(f"{c.doc_id}#{c.section_id}", c.text) for c in fused[:depth]]})
    return rows


def training_pairs(rows: list[dict], window: int = PASSAGES) -> list[tuple[str, str, int]]:
    """Should-answer questions with their labelled passages (1); should-decline ones with their fused top
    `window`, the passages `answer_support` reads (0)."""
    pairs: list[tuple[str, str, int]] = []
    for r in rows:
        if r["label"] == "answer":
            doc_ids = {e.split("#", 1)[0] for e in r["expected"] if "#" not in e}
            labelled = [t for s, t in r["passages"] if s in r["expected"] or s.split("#", 1)[0] in doc_ids]
            pairs += [(r["query"], text, 1) for text in labelled[:POSITIVES]]
        else:
            pairs += [(r["query"], text, 0) for _, text in r["passages"][:window]]
    return pairs


def distillation_pairs(rows: list[dict], teacher, window: int = PASSAGES) -> list[tuple[str, str, float]]:
    """Every question with each passage of its fused top `window` (the passages a night reads) and, for a
    should-answer one, its labelled passages among the fused top (`training_pairs`), each pair once, its target
    the teacher's logit: an ensemble's mean over its members, the pair's share of what the ensemble reads."""
    members = getattr(teacher, "members", [teacher])
    asked = list(
        dict.fromkeys(
            (r["query"], text)
            for r in rows
            for text in [t for _, t in r["passages"][:window]] + [t for _, t, y in training_pairs([r], window) if y]
        )
    )
    for m in members:
        m.prefetch(asked)  # side by side, one pair per run: the logits `logit` then reads
    return [(q, p, float(np.mean([m.logit(q, p) for m in members]))) for q, p in asked]


def judged_copies(items: list[dict], judged: Mapping[str, str | None], vectors=None) -> dict[str, list]:
    """Name of each set that judges nights (`judged`: name -> path, e.g. the config's fit and check sets) ->
    (item id, its id, score) for the items of `items` that are its questions verbatim or reworded: by a word
    or two (`near_duplicates`, difflib ratio) or, given `vectors` (a bi-encoder), in other words
    (`paraphrases`, cosine). Either is the same question to a model, whose score on it would be in-sample."""
    found = {}
    for name, path in judged.items():
        if not path:
            continue
        close = copies(items, load_evalset(path), vectors)
        if close:
            found[f"{name} {path}"] = close
    return found


def refuse_judged(items: list[dict], judged: Mapping[str, str | None], vectors=None) -> None:
    """ValueError, before any training, when `items` hold a question of a set that judges nights, or a copy of
    one (`judged_copies`): the gate fails a night judged on a question trained on (answer_model_unseen), and a
    reworded one is the same question to the model."""
    found = judged_copies(items, judged, vectors)
    if found:
        shown = "; ".join(
            f"{len(close)} questions of the {name} or near copies "
            f"({', '.join(f'{a} ~ {b} ({r:.2f})' for a, b, r in close[:10])}{' ...' * (len(close) > 10)})"
            for name, close in found.items()
        )
        raise ValueError(
            f"the training sets hold {shown}: a model's scores on its own training questions are in-sample, "
            "and the gate fails a night judged on them (answer_model_unseen). Train on sets that neither place nor "
            f"check a threshold, with no question within a difflib ratio of {NEAR} or a bi-encoder cosine of "
            f"{PARAPHRASE} of theirs (--drop-judged leaves those questions out and records them)."
        )


def leave_out_judged(items: list[dict], judged: Mapping[str, str | None], vectors=None, drop: bool = False) -> dict:
    """Refuse copies of a judged set's questions (`refuse_judged`), or with `drop` return them as id -> why,
    for `train_in_domain(left_out=...)` to leave out and record."""
    if not drop:
        refuse_judged(items, judged, vectors)
        return {}
    found = judged_copies(items, judged, vectors).items()
    return {a: f"~ {b} of the {name} ({r:.2f})" for name, close in found for a, b, r in close}


EXPORTS = ("int8", "fp32")


def export(hf: Path, out: Path, work: Path, kind: str) -> dict:
    """The trained checkpoint as OUT/model.onnx (+ tokenizer.json): per-channel INT8 stripped of the shared
    embedding table, or whole fp32."""
    if kind == "fp32":
        exported = export_fp32(hf, out / "model.onnx")
        return {"opset": exported["opset"], "format": "fp32 ONNX", "bytes": exported["fp32_bytes"]}
    exported = export_int8(hf, work / "model.int8.onnx", fp32_path=work / "model.fp32.onnx", per_channel=True)
    (out / TOKENIZER_NAME).write_bytes((work / TOKENIZER_NAME).read_bytes())
    return {
        "opset": exported["opset"],
        "format": "INT8 ONNX, the packaged cross-encoder's word embeddings left out",
        "quantization": exported["quantization"],
        "bytes": ship(work / "model.int8.onnx", out / "model.onnx"),
    }


def train_in_domain(
    retriever,
    index: str,
    train_sets: list[str],
    out: Path,
    work: Path,
    *,
    epochs: int = EPOCHS,
    export_as: str = "int8",
    threads: int = 2,
    left_out: Mapping[str, str] | None = None,
    seed: int = SEED,
    synthetic: Mapping | None = None,
    time_budget_s: float = TIME_BUDGET_S,
    teacher: str | Path | None = None,
    layers: int | None = None,
    max_steps: int | None = None,
) -> dict:
    """Train on `train_sets` (labelled JSONL files, less `left_out`: id -> why) over `retriever`, the version at
    `index`, and with `synthetic` (`synthetic_source`'s arguments) on questions made from the corpus too; write
    OUT/{model.onnx, tokenizer.json, recipe.json, training.log}; return the recipe. `time_budget_s`: train the steps
    that fit. `teacher`: a trained answer model whose logits the model learns instead of the labels (MSE), so one
    model reads what several did. `layers`: start from that many of the base model's encoder layers (`shrink`)."""
    t_start = time.time()
    refuse_options(export_as, teacher, synthetic)
    left_out = dict(left_out or {})
    out, work = Path(out), Path(work)
    out.mkdir(parents=True, exist_ok=True)
    work.mkdir(parents=True, exist_ok=True)
    taught_by = load_answer_model(teacher, required=True) if teacher else None
    window = retriever.answer_passages
    items, pairs, made = learning_data(retriever, train_sets, left_out, window, taught_by, synthetic, seed)
    base = packaged_base(work / "base")
    start, shrunk = base, None
    if layers:
        start = str(work / f"base-{layers}")
        shrunk = shrink(base, Path(start), layers)
    hyper = {"lr": LR, "batch_size": 16, "warmup_steps": 20, "freeze_word_embeddings": True, "seed": seed}
    hyper |= {"loss": "mse" if taught_by else "bce", "threads": threads, "max_steps": max_steps}  # mse: the teacher's
    trained = train(
        pairs * epochs, work / "hf", start, log_path=out / "training.log", time_budget_s=time_budget_s, **hyper
    )  # fmt: skip
    exported = export(work / "hf", out, work, export_as)
    steps = steps_to_record(trained, max_steps)
    recipe = {
        "task": "answer support cross-encoder trained on this corpus's labelled questions",
        "command": command_line(
            index, train_sets, made, teacher, layers, out, epochs, export_as, seed, time_budget_s, steps
        ),
        "base_model": base_model_info(base),
        "data": [{"path": str(p), "sha256": sha256_file(p)} for p in train_sets],
        "synthetic": made,  # how the corpus-made questions were drawn (synthetic_pairs), or None
        "pairs": (
            {"distilled": len(pairs), "epochs": epochs}
            if taught_by
            else {"positive": sum(y for *_, y in pairs), "negative": sum(1 - y for *_, y in pairs), "epochs": epochs}
        ),
        "distilled_from": (
            {"folder": str(teacher), "fingerprint": taught_by.fingerprint, "model_id": taught_by.model_id}
            if taught_by
            else None
        ),
        "layers": shrunk,  # the base model's encoder layers kept, or None for all of them
        "answer_passages": window,  # the window a night must read the model with (answerability.answer_passages)
        **{k: trained[k] for k in ("hyperparameters", "steps", "pairs_seen", "train_seconds")},
        "final_loss_mean_last_50": trained["final_loss_mean_last_50"],
        "export": exported,
        # what the teacher trained on is in-sample for its student too
        "trained_on": sorted({question_key(q) for q in items} | set(taught_by.trained_on if taught_by else ())),
        "trained_on_questions": sorted(  # for the gate's paraphrase check
            {question_text(q) for q in items} | set(taught_by.trained_on_questions if taught_by else ())
        ),
        "left_out": left_out,
        "onnx_sha256": sha256_file(out / "model.onnx"),
        "tokenizer_sha256": sha256_file(out / TOKENIZER_NAME),
        "versions": versions(),
    }
    recipe["wall_seconds"] = round(time.time() - t_start, 1)
    write_recipe(out / "recipe.json", recipe)
    return recipe


def learning_data(
    retriever, train_sets, left_out, window, taught_by, synthetic, seed
) -> tuple[list, list, dict | None]:
    """The questions and (question, passage, target) pairs a model learns from: the labelled sets' (less
    `left_out`), labelled or, with a teacher, the teacher's logits; plus the corpus-made ones with `synthetic`."""
    items = [q for path in train_sets for q in load_evalset(path) if q["id"] not in left_out]
    rows = fused_tops(retriever, items, max(LABELLED_FROM, window)) if items else []
    pairs = distillation_pairs(rows, taught_by, window) if taught_by else training_pairs(rows, window)
    made = None
    if synthetic:
        settings = dict(synthetic)
        made_items, made_pairs, made = synthetic_source(
            lambda qs, depth: fused_tops(retriever, qs, depth), settings.pop("chunks"), seed=seed, window=window,
            **settings,
        )  # fmt: skip
        items, pairs = items + made_items, pairs + made_pairs
    if taught_by is None and (not any(y for *_, y in pairs) or all(y for *_, y in pairs)):
        raise ValueError(f"{train_sets}: training needs should-answer questions found by retrieval and declines")
    return items, pairs, made


def refuse_options(export_as: str, teacher, synthetic) -> None:
    """Options that cannot train together, refused before anything is scored."""
    if export_as not in EXPORTS:
        raise ValueError(f"export {export_as!r}: one of {EXPORTS}")
    if teacher and synthetic:
        raise ValueError("--distil-from learns the teacher's logits on labelled sets' passages: not with --synthetic")


def steps_to_record(trained: dict, max_steps: int | None) -> int | None:
    """The --max-steps that trains this model again: the one given, or the cut a time budget made by the speed of
    that machine (a retrain on another would train another count); none when the epochs ran whole."""
    planned = (trained.get("step_decision") or {}).get("epoch_steps", trained["steps"])
    return max_steps or (trained["steps"] if trained["steps"] < planned else None)


def command_line(
    index, train_sets, made, teacher, layers, out, epochs, export_as, seed, time_budget_s, max_steps=None
) -> str:
    """The `sourcegate train-in-domain` command that trains this model again (`sourcegate retrain` runs it)."""
    return (
        f"sourcegate train-in-domain --index {index} "
        + (f"--train {' '.join(train_sets)} " if train_sets else "")
        + (f"--synthetic {made['pseudo_queries_asked']} " if made else "")
        + (f"--distil-from {teacher} " if teacher else "")
        + (f"--layers {layers} " if layers else "")
        + f"--out {out} --epochs {epochs} --export {export_as} --seed {seed}"
        + (f" --time-budget {time_budget_s:g}" if time_budget_s != TIME_BUDGET_S else "")
        + (f" --max-steps {max_steps}" if max_steps else "")
    )


def train_seeds(
    retriever, index: str, train_sets: list[str], out: Path, work: Path, seeds: list[int], **kw
) -> list[dict]:
    """`train_in_domain` once per seed. One seed: the model in OUT. Several: one in OUT/seed-N each, and OUT read as
    their mean logit (answer_support.ENSEMBLE), so one training draw's luck does not decide the gate
    (docs/benchmarks/18-users-words.md: one seed to the next moved the off-topic questions declined by three;
    the shipped model is such a mean)."""
    if len(set(seeds)) != len(seeds) or not seeds:
        raise ValueError(f"--seed {' '.join(map(str, seeds))}: one or more distinct seeds")
    out, work = Path(out), Path(work)
    if len(seeds) == 1:
        recipes = [train_in_domain(retriever, index, train_sets, out, work, seed=seeds[0], **kw)]
    else:
        names = [f"seed-{s}" for s in seeds]
        recipes = [
            train_in_domain(retriever, index, train_sets, out / name, work / name, seed=seed, **kw)
            for seed, name in zip(seeds, names)
        ]
        write_ensemble(
            out, names, trained_by="sourcegate train-in-domain, one model per seed (each member's recipe.json)"
        )
    # what it learned of the corpus: a night measures today's corpus against it and gates on it only if enough
    learned_corpus.write(out, learned_corpus.record(loadable_chunks(Path(index)), Path(index).name))
    return recipes
