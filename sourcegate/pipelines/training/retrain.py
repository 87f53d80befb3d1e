"""`sourcegate retrain MODEL --out NEW`: a trained answer model rebuilt from its recipe and the repository's files.

A model is only as trustworthy as the way back to it: its recipe names the command that trained it, the training
sets by content hash and the version it paired against (learned_corpus.json). Retraining reads all of that, finds
each training set by its hash (the recorded path first, then the repository's training sets, so a set committed
after training under another name is still the same bytes), rebuilds the version from the corpus when the recorded
run folder is gone and checks it holds exactly the content the model learned, and runs the same command into NEW.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import yaml

from sourcegate.pipelines.home import home
from sourcegate.pipelines.retrieval import learned_corpus
from sourcegate.pipelines.retrieval.answer_support import PASSAGES
from sourcegate.pipelines.versions.manifest import sha256_file

ROOT = home()  # the recipes' recorded paths are relative to the project folder
OLD_WINDOW = PASSAGES  # recipes from before the window was recorded were trained on the default window


class NotReproducible(ValueError):
    """A recipe that names something the repository no longer holds (exit 2, naming it)."""


def recipes(model: Path) -> list[dict]:
    """The recipe of a model folder, or each member's of an ensemble (ensemble.json), in member order."""
    ensemble = model / "ensemble.json"
    if ensemble.is_file():
        members = json.loads(ensemble.read_text(encoding="utf-8"))["members"]
        return [json.loads((model / m / "recipe.json").read_text(encoding="utf-8")) for m in members]
    return [json.loads((model / "recipe.json").read_text(encoding="utf-8"))]


def training_sets(root: Path = ROOT) -> list[Path]:
    """The committed sets a model may have trained on: the eval sets whose role is training (config/evals/sets.yaml;
    a fit or check set is never opened here) and the tests' own sets."""
    evals = root / "config" / "evals"
    roles = yaml.safe_load((evals / "sets.yaml").read_text(encoding="utf-8"))["sets"]
    found = [evals / s["file"] for s in roles if s["role"] == "training"]
    return found + sorted((root / "tests" / "data" / "evals").rglob("*.jsonl"))


def find_by_hash(recorded: dict, root: Path = ROOT) -> Path:
    """The training set with the recorded content: at its recorded path, else any committed set with that hash."""
    path = Path(recorded["path"])
    if path.is_file() and sha256_file(path) == recorded["sha256"]:
        return path
    for candidate in training_sets(root):
        if sha256_file(candidate) == recorded["sha256"]:
            return candidate.relative_to(root) if candidate.is_relative_to(root) else candidate
    raise NotReproducible(
        f"training set {recorded['path']} (sha256 {recorded['sha256'][:12]}…) is in no committed file"
    )


def command_args(recipe: dict) -> list[str]:
    """The recorded command's arguments after `sourcegate train-in-domain`."""
    words = shlex.split(recipe["command"])
    return words[words.index("train-in-domain") + 1 :]


def _value(args: list[str], flag: str) -> list[str]:
    """The words after `flag` up to the next flag."""
    if flag not in args:
        return []
    rest = args[args.index(flag) + 1 :]
    return rest[: next((i for i, w in enumerate(rest) if w.startswith("--")), len(rest))]


def _without(args: list[str], *flags: str) -> list[str]:
    out, skipping = [], False
    for word in args:
        if word.startswith("--"):
            skipping = word in flags
        if not skipping:
            out.append(word)
    return out


def retrain_argv(model: Path, out: Path, index: Path) -> tuple[list[str], dict]:
    """The `sourcegate` argv that retrains `model` into `out` over `index`, and what it was resolved from."""
    members = recipes(model)
    first = command_args(members[0])
    seeds = [str(r["hyperparameters"]["seed"]) for r in members]
    sets = [str(find_by_hash(d)) for d in members[0]["data"]]
    window = members[0].get("answer_passages", OLD_WINDOW)
    args = _without(first, "--index", "--train", "--out", "--seed")
    argv = ["--set", f"answerability.answer_passages={window}", "train-in-domain", "--index", str(index)]
    argv += (["--train", *sets] if sets else []) + ["--out", str(out), "--seed", *seeds, *args]
    return argv, {"sets": sets, "seeds": seeds, "window": window, "recorded_index": _value(first, "--index")}


def same_content(model: Path, chunks_parquet: Path) -> dict:
    """How much of the version in `chunks_parquet` the model learned; NotReproducible unless all of it, exactly."""
    learned = learned_corpus.read(model)
    if learned is None:
        raise NotReproducible(
            f"{model} records no corpus it learned ({learned_corpus.FILE}): its index cannot be checked"
        )
    share = learned_corpus.share(learned, *learned_corpus.content_hashes(chunks_parquet))
    if share["sections"] != 1.0 or share["chunks"] != 1.0 or share["n_sections"] != len(learned["sections"]):
        raise NotReproducible(
            f"the version at {chunks_parquet.parent} is not the one {model} learned: {share['sections']:.0%} of its "
            f"sections and {share['chunks']:.0%} of its chunks are (new {share['new_examples'][:5]}, changed "
            f"{share['changed_examples'][:5]})"
        )
    return share


def compare(old: list[dict], new: list[dict]) -> list[str]:
    """Per member, what the retrain reproduced and what it did not (weights differ where kernels differ)."""
    lines = []
    for a, b in zip(old, new):
        same = [k for k in ("data", "pairs", "hyperparameters", "trained_on") if a.get(k) == b.get(k)]
        differ = [k for k in ("data", "pairs", "hyperparameters", "trained_on") if a.get(k) != b.get(k)]
        weights = "identical weights" if a.get("onnx_sha256") == b.get("onnx_sha256") else "different weights"
        seed = b["hyperparameters"]["seed"]
        lines.append(
            f"seed {seed}: same {', '.join(same) or 'nothing'}; differs {', '.join(differ) or 'nothing'}; {weights}"
        )
    return lines
