"""Fine-tuning a cross-encoder with one logit: seeded length-grouped batches, AdamW with warm-up and linear decay, a
step count cut to a time budget measured on the first steps, bf16 autocast on the CPU.
"""

from __future__ import annotations

import os
import random
import sys
import time
from pathlib import Path

import numpy as np

from sourcegate.pipelines.training.base_model import MAX_LENGTH

SEED = 13

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


def set_seed(seed: int) -> None:
    import torch

    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


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
    seed: int = SEED,
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
    on 0/1 labels; with "mse", mean squared error on a teacher's logits (distillation: `training.in_domain`).

    Steps: one epoch (ceil(len(pairs)/batch_size)), unless ``max_steps`` is given, or unless the speed measured on
    the first ``calib_steps`` steps says one epoch would not fit in ``time_budget_s`` (`steps_that_fit`). The LR
    schedule is `lr_factor`. Saves the HF model + tokenizer to ``out_dir``; returns what was done.
    """
    settings = {k: v for k, v in locals().items() if k not in ("pairs", "out_dir", "base_path")}  # as given
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    if loss not in LOSSES:
        raise ValueError(f"loss {loss!r}: one of {sorted(LOSSES)}")
    torch.set_num_threads(threads)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    log = TrainingLog(log_path)
    set_seed(seed)
    tok = AutoTokenizer.from_pretrained(base_path)
    model = AutoModelForSequenceClassification.from_pretrained(base_path, num_labels=1)
    if freeze_word_embeddings:  # shared with the packaged cross-encoder's file, so not shipped twice
        model.base_model.embeddings.word_embeddings.weight.requires_grad_(False)
    model.train()

    batches = length_grouped_batches(tok, pairs, batch_size, seed, max_length, group_batches)
    epoch_steps = len(batches)
    plan = {"total": min(epoch_steps, max_steps) if max_steps else epoch_steps}  # the schedule reads the cut
    opt = optimizer(model, lr, weight_decay)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: lr_factor(step, warmup_steps, plan["total"]))
    loss_fn = {"bce": torch.nn.BCEWithLogitsLoss, "mse": torch.nn.MSELoss}[loss]()
    log(
        f"train: {len(pairs)} pairs, batch {batch_size}, epoch_steps {epoch_steps}, "
        f"max_steps {max_steps}, budget {time_budget_s:.0f}s, lr {lr}, warmup {warmup_steps}, "
        f"max_length {max_length}, bf16 {bf16}, threads {threads}, seed {seed}"
    )
    t0 = time.time()
    step, pairs_seen, losses, step_decision = steps(
        model, tok, opt, sched, loss_fn, pairs, batches, plan, settings, log
    )
    train_s = time.time() - t0
    log(f"done: {step} steps, {pairs_seen} pairs, {train_s:.0f}s")
    model.eval()
    model.save_pretrained(out_dir)
    tok.save_pretrained(out_dir)
    log.close()
    return {
        "steps": step,
        "pairs_seen": pairs_seen,
        "epochs": round(pairs_seen / len(pairs), 4),
        "train_seconds": round(train_s, 1),
        "step_decision": step_decision,
        "final_loss_mean_last_50": round(float(np.mean(losses[-50:])), 5) if losses else None,
        "hyperparameters": hyperparameters(settings),
    }


def one_step(model, tok, opt, sched, loss_fn, batch: list, max_length: int, bf16: bool) -> float:
    """One optimiser step on a batch of (question, passage, target): the batch's loss."""
    import torch

    enc = tok([b[0] for b in batch], [b[1] for b in batch], padding=True, truncation="only_second",
              max_length=max_length, return_tensors="pt")  # fmt: skip
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        logits = model(**enc).logits.squeeze(-1)
    loss = loss_fn(logits.float(), torch.tensor([float(b[2]) for b in batch]))
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    sched.step()
    return float(loss.detach())


def steps(model, tok, opt, sched, loss_fn, pairs, batches, plan: dict, s: dict, log) -> tuple[int, int, list, dict]:
    """The training steps: `plan["total"]` of them, cut once after `calib_steps` to what fits the time budget.
    Returns (steps, pairs seen, each step's loss, how the step count was decided)."""
    from tqdm import tqdm

    t0, step, pairs_seen, losses, step_decision = time.time(), 0, 0, [], None
    bar = tqdm(total=plan["total"], desc="train", unit="step", file=sys.stderr)
    while step < plan["total"] and step < len(batches):
        batch = [pairs[i] for i in batches[step]]
        losses.append(one_step(model, tok, opt, sched, loss_fn, batch, s["max_length"], s["bf16"]))
        step, pairs_seen = step + 1, pairs_seen + len(batch)
        bar.update(1)
        bar.set_postfix(loss=f"{losses[-1]:.4f}")
        if step == s["calib_steps"] and step_decision is None:
            step_decision = steps_that_fit(
                step, pairs_seen, time.time() - t0, len(batches), s["max_steps"], s["time_budget_s"]
            )
            plan["total"] = bar.total = step_decision["chosen_steps"]
            bar.refresh()
            log(f"calibration: {step_decision['calib_pairs_per_s']:.1f} pairs/s, {step_decision['calib_steps_per_s']:.3f} "
                f"steps/s over {step} steps -> {plan['total']} steps: {step_decision['why']}")  # fmt: skip
        if step % s["log_every"] == 0 or step == plan["total"]:
            el = time.time() - t0
            run = losses[-(step % s["log_every"] or s["log_every"]) :]
            log(f"step {step}/{plan['total']} loss {np.mean(run):.4f} lr {sched.get_last_lr()[0]:.2e} "
                f"elapsed {el:.0f}s {pairs_seen / el:.1f} pairs/s")  # fmt: skip
    bar.close()
    early = {"epoch_steps": len(batches), "chosen_steps": step, "why": "finished before calibration point"}
    return step, pairs_seen, losses, step_decision or early


class TrainingLog:
    """Timestamped lines to the progress bar's stream and, with a path, appended to a log file."""

    def __init__(self, path: str | os.PathLike | None):
        self.file = open(path, "a", encoding="utf-8") if path else None  # noqa: SIM115  (closed by close())

    def __call__(self, message: str) -> None:
        from tqdm import tqdm

        line = f"[{time.strftime('%H:%M:%S')}] {message}"
        tqdm.write(line)
        if self.file:
            self.file.write(line + "\n")
            self.file.flush()

    def close(self) -> None:
        if self.file:
            self.file.close()


def optimizer(model, lr: float, weight_decay: float):
    """AdamW with no weight decay on biases and layer norms."""
    import torch

    no_decay = ("bias", "LayerNorm.weight", "layernorm", "layer_norm")
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    return torch.optim.AdamW(
        [
            {"params": [p for n, p in named if not any(k in n for k in no_decay)], "weight_decay": weight_decay},
            {"params": [p for n, p in named if any(k in n for k in no_decay)], "weight_decay": 0.0},
        ],
        lr=lr,
    )


def lr_factor(step: int, warmup_steps: int, total: int) -> float:
    """Linear warm-up over a fixed count (the first steps are the same whatever total), then linear decay to 0."""
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    return max(0.0, (total - step) / max(1, total - warmup_steps))


def steps_that_fit(
    step: int, pairs_seen: int, elapsed: float, epoch_steps: int, max_steps: int | None, time_budget_s: float
) -> dict:
    """The step count, decided once after the first `step` steps: the epoch, `max_steps`, or what fits the budget."""
    pps, sps = pairs_seen / elapsed, step / elapsed
    fit = int(time_budget_s * sps)
    if max_steps:
        chosen, why = min(epoch_steps, max_steps), f"fixed by --max-steps {max_steps} (epoch = {epoch_steps})"
    elif fit >= epoch_steps:
        chosen = epoch_steps
        why = f"1 epoch ({epoch_steps} steps) fits the {time_budget_s:.0f}s budget (est. {epoch_steps / sps:.0f}s)"
    else:
        chosen = max(fit, step)
        why = (
            f"1 epoch ({epoch_steps} steps, est. {epoch_steps / sps:.0f}s) does not fit the "
            f"{time_budget_s:.0f}s budget; cut to {fit} steps"
        )
    return {
        "calib_steps": step,
        "calib_seconds": round(elapsed, 2),
        "calib_pairs_per_s": round(pps, 2),
        "calib_steps_per_s": round(sps, 4),
        "epoch_steps": epoch_steps,
        "chosen_steps": chosen,
        "why": why,
    }


def hyperparameters(s: dict) -> dict:
    """What a recipe records of a training, so that it can be run again."""
    return {
        "batch_size": s["batch_size"],
        "lr": s["lr"],
        "optimizer": "AdamW",
        "weight_decay": s["weight_decay"],
        "betas": [0.9, 0.999],
        "eps": 1e-8,
        "grad_clip_norm": 1.0,
        "schedule": f"linear warmup {s['warmup_steps']} steps then linear decay to 0 at the last step",
        "warmup_steps": s["warmup_steps"],
        "max_length": s["max_length"],
        "truncation": "only_second",
        "loss": LOSSES[s["loss"]],
        "num_labels": 1,
        "bf16_autocast": s["bf16"],
        "torch_threads": s["threads"],
        "seed": s["seed"],
        "batching": (
            f"length-grouped: random.Random(seed).shuffle of pair indices, chunks of "
            f"{s['group_batches']}x{s['batch_size']} pairs sorted by token length and cut into batches, "
            f"then the batch order shuffled with the same RNG; padding to the longest in batch"
        ),
        "time_budget_s": s["time_budget_s"],
        "max_steps_arg": s["max_steps"],
        "freeze_word_embeddings": s["freeze_word_embeddings"],
    }
