"""`answer_support`: the probability that one of the top passages *answers* the question.

Every other signal measures relatedness, and a passage about the question's subject is related
whether or not it holds the answer ("opening hours of the Riverton Public Library" against the
stop list that names the library). This one comes from a cross-encoder trained to tell the two
apart: the packaged ms-marco-MiniLM-L-12-v2 fine-tuned on SQuAD 2.0, where a question's own
paragraph answers it, another paragraph of the same article does not, and an unanswerable question
is not answered by the paragraph it was written against (`sourcegate train-answerability`,
sourcegate/pipelines/training/answerability.py; docs/benchmarks/23-answer-model-squad.md).

The shipped model (models/answer_support/) leaves out its word-embedding table: training froze it,
so it is byte for byte the packaged cross-encoder's, and it is joined back on load. That keeps the
file under the repository's 30 MB and binds the model to the package it was trained from (the
fingerprint hashes both).

A folder holding `ensemble.json` is several such models read as one (`AnswerEnsemble`): a question's score
is the mean over the members of each one's highest logit, the seed-averaged model of
docs/decisions/0006-answer-support-in-domain-ensemble.md, so one training draw's luck does not decide the gate.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from sourcegate.pipelines import config, models
from sourcegate.pipelines.home import home
from sourcegate.pipelines.retrieval import kept
from sourcegate.pipelines.retrieval.rerank import ModelUnavailable, OnnxCrossEncoder, sigmoid
from sourcegate.pipelines.versions.manifest import sha256_file

log = logging.getLogger(__name__)
SHIPPED = home() / "models" / "answer_support"
# the default window, the fused top passages one of which may hold the answer: the config's (its one source)
PASSAGES = config.Answerability.model_fields["answer_passages"].default
MAX_LENGTH = 256  # the length the model was trained at
ENSEMBLE = "ensemble.json"  # {"members": [subfolder, ...]}: several trained models read as one
# The packaged cross-encoder's word-embedding initializers: shared, not shipped.
SHARED = tuple(f"bert.embeddings.word_embeddings.weight{s}" for s in ("_quantized", "_scale", "_zero_point"))


def assemble(model: Path, packaged: Path) -> bytes:
    """The full ONNX model: the shipped graph plus the packaged model's shared initializers it reads."""
    import onnx

    graph = onnx.load(str(model))
    have = {i.name for i in graph.graph.initializer}
    read = {name for node in graph.graph.node for name in node.input}
    wanted = [n for n in SHARED if n in read and n not in have]  # a whole (fp32) model reads none of them
    if not wanted:
        return graph.SerializeToString()
    shared = {i.name: i for i in onnx.load(str(packaged)).graph.initializer if i.name in SHARED}
    missing = [n for n in wanted if n not in shared]
    if missing:
        raise FileNotFoundError(f"the packaged cross-encoder lacks {missing}: not the model this was trained from")
    graph.graph.initializer.extend(shared[n] for n in wanted)
    return graph.SerializeToString()


class AnswerSupportModel(OnnxCrossEncoder):
    """The answer-support cross-encoder: scored one pair per run, exactly like the reranker."""

    model_id = "sourcegate answer-support (ms-marco-MiniLM-L-12-v2 fine-tuned on SQuAD 2.0, int8 onnx)"
    PAIR_CODE = (assemble,)  # the graph it runs is assembled from two files

    def __init__(self, model_dir: str | Path | None = None):
        super().__init__(model_dir, max_length=MAX_LENGTH)
        if self.folder != SHIPPED:  # one trained elsewhere says what it is in its recipe
            self.model_id = f"{self.recipe.get('task', 'answer-support cross-encoder')} ({self.folder}, int8 onnx)"

    @staticmethod
    def folder_of(model_dir: str | Path | None) -> Path:
        return Path(model_dir) if model_dir else SHIPPED

    def model_of(self, folder: Path) -> bytes:
        return assemble(folder / "model.onnx", models.cross_encoder_dir() / "model.onnx")

    @property
    def fingerprint(self) -> str:
        return fingerprint(self.folder)

    @property
    def recipe(self) -> dict:
        """recipe.json of a model trained by `sourcegate train-in-domain` ({} for one without)."""
        path = self.folder / "recipe.json"
        return json.loads(path.read_text(encoding="utf-8")) if path.exists() else {}

    @property
    def trained_on(self) -> frozenset[str]:
        """The keys of the labelled questions it was trained on (`sourcegate.evals.evalset.question_key`)."""
        return frozenset(self.recipe.get("trained_on", ()))

    @property
    def trained_on_questions(self) -> tuple[str, ...]:
        """Their texts as the model read them, for finding the same asks in other words (newer recipes
        record them; older ones name keys only)."""
        return tuple(self.recipe.get("trained_on_questions", ()))


class AnswerEnsemble:
    """Several answer-support models (the subfolders `ensemble.json` names) read as one: the mean over them
    of each one's best logit. It trained on every question any member trained on; its fingerprint hashes
    every member's files; its kept logits are one row per pair with a value per member."""

    def __init__(self, folder: str | Path):
        self.folder = Path(folder)
        spec = json.loads((self.folder / ENSEMBLE).read_text(encoding="utf-8"))
        if not spec.get("members"):
            raise ValueError(f"{self.folder / ENSEMBLE}: no members")
        self.members = [AnswerSupportModel(self.folder / name) for name in spec["members"]]
        self.model_id = f"mean of {len(self.members)}: " + "; ".join(m.model_id for m in self.members)

    @property
    def fingerprint(self) -> str:
        return fingerprint(self.folder)

    @property
    def trained_on(self) -> frozenset[str]:
        return frozenset().union(*(m.trained_on for m in self.members))

    @property
    def trained_on_questions(self) -> tuple[str, ...]:
        return tuple(sorted(set().union(*(m.trained_on_questions for m in self.members))))

    @property
    def computed(self) -> int:
        return sum(m.computed for m in self.members)

    @property
    def kept_binding(self) -> str:
        return kept.binding(self.fingerprint, {"members": [m.pair_recipe for m in self.members]})

    def load_kept(self, path: Path | None) -> int:
        found = kept.load(path, self.kept_binding, len(self.members), np.float64)
        for i, member in enumerate(self.members):
            member.take_kept({k: float(v[i]) for k, v in found.items()})
        return len(found)

    def save_kept(self, path: Path) -> int:
        each = [m.logits_by_key() for m in self.members]
        rows = {k: [logits[k] for logits in each] for k in set(each[0]).intersection(*each[1:])}
        return kept.save(path, self.kept_binding, rows, len(self.members), np.float64)


def write_ensemble(folder: str | Path, members: Sequence[str], **about) -> Path:
    """FOLDER/ENSEMBLE naming `members` (its subfolders, each a trained model) and `about` them."""
    path = Path(folder) / ENSEMBLE
    read_as = "mean over members of each member's highest answer-support logit over the fused top answerability.answer_passages"
    path.write_text(
        json.dumps({"members": list(members), "read_as": read_as, **about}, indent=2) + "\n", encoding="utf-8"
    )
    return path


def fingerprint(folder: str | Path | None = None) -> str:
    """The shipped files' fingerprint joined with the packaged cross-encoder's (the shared embeddings)."""
    own = models.fingerprint(Path(folder) if folder else SHIPPED)
    packaged = models.fingerprint(models.cross_encoder_dir())
    return "sha256:" + hashlib.sha256(f"{own}\n{packaged}".encode()).hexdigest()


# Each trained model's recipe.json records the SHA-256 of the files it exported (`onnx_sha256`, `tokenizer_sha256`).
RECORDED = (("model.onnx", "onnx_sha256"), ("tokenizer.json", "tokenizer_sha256"))


def member_folders(folder: Path) -> list[Path]:
    """The folders holding one trained model each: an ensemble's members, else the folder itself."""
    spec = folder / ENSEMBLE
    if not spec.is_file():
        return [folder]
    return [folder / name for name in json.loads(spec.read_text(encoding="utf-8")).get("members") or []]


def integrity_problems(folder: Path) -> list[str]:
    """Each file of a trained model that is missing or differs from the SHA-256 its recipe recorded at export
    (a truncated copy, a replaced file), naming the file, its size and both hashes."""
    problems = []
    for member in member_folders(folder):
        recipe_path = member / "recipe.json"
        recipe = json.loads(recipe_path.read_text(encoding="utf-8")) if recipe_path.is_file() else {}
        for name, key in RECORDED:
            path, expected = member / name, recipe.get(key)
            if not path.is_file():
                problems.append(f"{path}: missing")
            elif expected and (actual := sha256_file(path)) != expected:
                problems.append(
                    f"{path}: sha256 {actual[:12]}... is not the {key} {expected[:12]}... its recipe.json recorded "
                    f"({path.stat().st_size} bytes: truncated or replaced)"
                )
    return problems


def load_answer_model(
    model_dir: str | Path | None = None, required: bool = False
) -> AnswerSupportModel | AnswerEnsemble | None:
    """The answer-support model (an ensemble if its folder holds ENSEMBLE), or None (logged) when it cannot
    load: the signal is then missing, never faked. `required`: its files are first checked against their recipes,
    and a model that cannot be used raises ModelUnavailable naming the file and what is wrong."""
    folder = AnswerSupportModel.folder_of(model_dir)
    try:
        if required and (problems := integrity_problems(folder)):
            raise ModelUnavailable(f"answer model (answerability.answer_model_path) {folder}: " + "; ".join(problems))
        return AnswerEnsemble(folder) if (folder / ENSEMBLE).exists() else AnswerSupportModel(model_dir)
    except ModelUnavailable:
        raise
    except Exception as exc:
        if required:
            raise ModelUnavailable(
                f"answer model (answerability.answer_model_path) {folder} could not load: {type(exc).__name__}: {exc}"
            ) from exc
        log.warning("answer support: could not load (%s: %s); signal answer_support is None", type(exc).__name__, exc)
        return None


def answer_support(scorer, query: str, passages: Sequence[str]) -> float | None:
    """P(one of `passages` answers): the sigmoid of the scorer's highest logit over them (of an ensemble, the
    mean over its members of each one's highest); None without a scorer or passages."""
    if scorer is None or not passages:
        return None
    members = getattr(scorer, "members", [scorer])
    return sigmoid(float(np.mean([max(logit for _, logit in m.score(query, list(passages))) for m in members])))
