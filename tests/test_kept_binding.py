"""Values kept across nights are bound to everything that made them, and the verdict binds the files it reused.

A kept text vector or pair logit is found under a binding of the model's files, the code and settings that turn
the text or pair into model input (max length, truncation, pair assembly) and the runtime's versions
(sourcegate/pipelines/retrieval/kept.py); a row kept under any other binding is computed again. The kept files a night
reused are part of gate.json's `evaluated` (sourcegate/pipelines/release/verdict.py), so a changed one refuses promotion.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from sourcegate.artifact_io import write_json
from sourcegate.artifact_io.run_folder import KEPT, RunFolder
from sourcegate.evals.harness import ANSWER_PAIRS, RERANK_PAIRS, TEXT_VECTORS, keep_for_next, keep_from
from sourcegate.pipelines.app import steps
from sourcegate.pipelines.release import verdict
from sourcegate.pipelines.retrieval import kept
from sourcegate.pipelines.versions.manifest import sha256_file
from tests.test_verdicts import night  # noqa: F401  (the fixture)

QUESTION = "Can I bring my bike on the light rail at rush hour?"
PASSAGES = ["Bikes ride free on trains outside rush hours.", "Buses run every 15 minutes.", "Lost items: call us."]
TEXTS = ["bike", "rush hour", QUESTION]


def parts(embedder):
    """The three parts a retriever keeps values with, freshly loaded (a new night's process)."""
    from sourcegate.pipelines.retrieval.answer_support import AnswerSupportModel
    from sourcegate.pipelines.retrieval.answerability import TextVectors
    from sourcegate.pipelines.retrieval.rerank import OnnxCrossEncoder

    return SimpleNamespace(
        text_vectors=TextVectors(embedder), scorer=OnnxCrossEncoder(), answer_scorer=AnswerSupportModel()
    )


def a_night(retriever, earlier: Path | None, out: Path) -> tuple[dict, dict]:
    """What an evaluation does with kept values: load the earlier night's, score, keep for the next."""
    out.mkdir(parents=True, exist_ok=True)
    start = keep_from(retriever, {name: earlier / name for name in KEPT} if earlier else None)
    values = {
        "vectors": retriever.text_vectors(TEXTS),
        "rerank": retriever.scorer.score(QUESTION, PASSAGES),
        "answer": retriever.answer_scorer.score(QUESTION, PASSAGES),
    }
    return keep_for_next(retriever, out, start), values


@pytest.mark.models
def test_same_inputs_reuse_everything_and_a_changed_pair_recipe_recomputes(embedder, tmp_path, monkeypatch):
    from sourcegate.pipelines.retrieval import answer_support

    first, values = a_night(parts(embedder), None, tmp_path / "r1")
    assert {n: (k["reused"], k["computed"]) for n, k in first.items()} == {
        TEXT_VECTORS: (0, 3),
        RERANK_PAIRS: (0, 3),
        ANSWER_PAIRS: (0, 3),
    }
    # a rerun with the same inputs: every value read from the earlier night, none computed, the same numbers
    again, same = a_night(parts(embedder), tmp_path / "r1", tmp_path / "r2")
    assert {n: (k["reused"], k["computed"]) for n, k in again.items()} == {
        TEXT_VECTORS: (3, 0),
        RERANK_PAIRS: (3, 0),
        ANSWER_PAIRS: (3, 0),
    }
    assert np.array_equal(same["vectors"], values["vectors"])
    assert (same["rerank"], same["answer"]) == (values["rerank"], values["answer"])
    assert again[ANSWER_PAIRS]["from_run"] == "r1"
    assert again[ANSWER_PAIRS]["sha256"] == sha256_file(tmp_path / "r1" / ANSWER_PAIRS)

    # the answer model's pairs are now truncated elsewhere: same model files, other logits; never reused
    monkeypatch.setattr(answer_support, "MAX_LENGTH", 128)
    changed, _ = a_night(parts(embedder), tmp_path / "r1", tmp_path / "r3")
    assert (changed[ANSWER_PAIRS]["reused"], changed[ANSWER_PAIRS]["computed"]) == (0, 3)
    assert "sha256" not in changed[ANSWER_PAIRS]  # nothing reused: nothing of r1's to bind
    assert (changed[RERANK_PAIRS]["reused"], changed[TEXT_VECTORS]["reused"]) == (3, 3)  # the others still are


@pytest.mark.models
def test_a_changed_pair_assembly_or_runtime_is_another_binding():
    from sourcegate.pipelines.retrieval.answer_support import AnswerSupportModel

    model = AnswerSupportModel()
    bound = model.kept_binding
    assert bound == AnswerSupportModel().kept_binding  # deterministic: a new process finds its rows
    assert model.pair_recipe["truncation"]["max_length"] == 256
    original = kept.runtime_versions
    try:
        kept.runtime_versions = lambda: {**original(), "onnxruntime": "0.0.1"}  # another runtime, same files
        assert model.kept_binding != bound
    finally:
        kept.runtime_versions = original
    # the code that builds the model's graph is in the recipe: the answer model's (assemble) is not the reranker's
    from sourcegate.pipelines.retrieval.rerank import OnnxCrossEncoder

    assert model.pair_recipe["code"] != OnnxCrossEncoder().pair_recipe["code"]


def test_rows_kept_before_they_were_bound_are_computed_again(tmp_path):
    """A file of the earlier layout (a model fingerprint, no binding) holds nothing to reuse."""
    path = tmp_path / ANSWER_PAIRS
    pq.write_table(
        pa.table(
            {
                "key": ["k"],
                "model_fingerprint": ["sha256:m"],
                "values": pa.FixedSizeListArray.from_arrays(pa.array([1.0], pa.float64()), 1),
            }
        ),
        path,
    )
    assert kept.load(path, "sha256:m", 1, np.float64) == {}
    kept.save(path, "sha256:bound", {"k": np.array([1.0])}, 1, np.float64)
    assert kept.load(path, "sha256:other", 1, np.float64) == {}
    assert kept.load(path, "sha256:bound", 1, np.float64)["k"].tolist() == [1.0]


def reused_record(folder: Path) -> dict:
    """keep_for_next's record of an evaluation that reused `folder`'s answer pairs."""
    return {ANSWER_PAIRS: {"reused": 1, "from_run": folder.name, "sha256": sha256_file(folder / ANSWER_PAIRS)}}


def test_an_altered_kept_file_changes_evaluated_and_is_refused_at_promotion(night):  # noqa: F811
    cfg = night.cfg
    earlier = RunFolder(cfg.artifacts, "20260101-020000").path
    earlier.mkdir(parents=True)
    kept.save(earlier / ANSWER_PAIRS, "sha256:bound", {"k": np.array([2.5])}, 1, np.float64)
    record = reused_record(earlier)
    honest = verdict.evaluated(cfg, None, verdict.eval_sets(cfg), reused=record)
    assert honest["reused"][ANSWER_PAIRS]["sha256"] == sha256_file(earlier / ANSWER_PAIRS)

    # someone raises the logit of the kept pair before the next night reads it: the verdict records other bytes
    kept.save(earlier / ANSWER_PAIRS, "sha256:bound", {"k": np.array([9.0])}, 1, np.float64)
    forged = verdict.evaluated(cfg, None, verdict.eval_sets(cfg), reused=reused_record(earlier))
    assert forged["reused"] != honest["reused"]

    # a verdict that reused the honest file is refused once that file was altered
    night("20260102-020000")
    gate_path = RunFolder(cfg.artifacts, "20260102-020000").path / "gate.json"
    gate = json.loads(gate_path.read_text())
    gate["evaluated"]["reused"] = honest["reused"]
    write_json(gate, gate_path)
    with pytest.raises(verdict.VerdictMismatch, match=f"{ANSWER_PAIRS} of run 20260101-020000"):
        steps.promote_step(RunFolder(cfg.artifacts, "20260102-020000"), cfg)
    kept.save(earlier / ANSWER_PAIRS, "sha256:bound", {"k": np.array([2.5])}, 1, np.float64)  # the honest bytes
    assert steps.promote_step(RunFolder(cfg.artifacts, "20260102-020000"), cfg) == "20260102-020000"


def test_a_kept_file_is_read_beside_its_verdict_only_as_the_verdict_bound_it(tmp_path):
    """What `serve` reads of its night's kept values: the file the verdict bound, by SHA-256, or nothing."""
    folder = tmp_path / "runs" / "20260101-020000"
    folder.mkdir(parents=True)
    kept.save(folder / TEXT_VECTORS, "sha256:bound", {"k": np.array([1.0, 0.0])}, 2)
    facts = verdict.kept_facts(folder, {TEXT_VECTORS: {"kept": 1}, RERANK_PAIRS: {"kept": 0}})
    assert facts == {
        TEXT_VECTORS: {"sha256": sha256_file(folder / TEXT_VECTORS), "rows": 1}
    }  # none written: none bound
    gate = {"evaluated": {"kept": facts}}
    assert verdict.bound_kept_file(gate, folder, TEXT_VECTORS) == (folder / TEXT_VECTORS, None)

    kept.save(folder / TEXT_VECTORS, "sha256:bound", {"k": np.array([0.0, 1.0])}, 2)  # altered after the night
    path, why_not = verdict.bound_kept_file(gate, folder, TEXT_VECTORS)
    assert path is None and "differs from the one its verdict bound" in why_not
    assert verdict.bound_kept_file({"evaluated": {}}, folder, TEXT_VECTORS)[0] is None  # a verdict binding none
    assert verdict.bound_kept_file(None, folder, TEXT_VECTORS)[0] is None  # no verdict at all
    (folder / TEXT_VECTORS).unlink()
    assert verdict.bound_kept_file(gate, folder, TEXT_VECTORS) == (None, f"{folder / TEXT_VECTORS}: not there")


@pytest.mark.models
def test_the_next_night_reuses_an_earlier_nights_kept_values_only_as_its_verdict_bound_them(tmp_path, caplog):
    """A kept file altered after its night (here: one row dropped, still a readable file under the same binding) is
    not reused by the next night: its values were computed by no verdict. The next night computes them again, says
    why in run.json (`eval_kept_refused`) and a warning, and reuses the files that are as bound."""
    from sourcegate.pipelines.app.cli import main
    from tests.test_faults import tiny_night

    tiny = tiny_night(tmp_path)
    artifacts = tmp_path / "artifacts"
    argv = ["--config", str(tiny["config"]), "run", "--artifacts", str(artifacts), "--quiet", "--run-id"]
    assert main([*argv, "20260301-020000"]) == 0
    first = artifacts / "runs" / "20260301-020000"
    altered = first / TEXT_VECTORS
    table = pq.read_table(altered)
    pq.write_table(table.slice(1), altered)  # the same schema and binding, one vector fewer
    bound = table["binding"][0].as_py()
    assert len(kept.load(altered, bound, 384)) == table.num_rows - 1  # readable: it would be reused, were it bound
    with caplog.at_level("WARNING"):
        assert main([*argv, "20260302-020000"]) == 0
    info = json.loads((artifacts / "runs" / "20260302-020000" / "run.json").read_text())
    assert set(info["eval_kept_refused"]) == {TEXT_VECTORS}
    assert "differs from the one its verdict bound" in info["eval_kept_refused"][TEXT_VECTORS]
    assert "not reusing kept values" in caplog.text
    assert info["eval_kept"][TEXT_VECTORS]["reused"] == 0 and info["eval_kept"][TEXT_VECTORS]["computed"] > 0
    assert info["eval_kept"][RERANK_PAIRS]["reused"] > 0 and info["eval_kept"][RERANK_PAIRS]["computed"] == 0
    assert TEXT_VECTORS not in info["evaluated"]["reused"]  # the verdict binds only what it reused
