"""A gate verdict bound to what it judged (G3).

The evaluate step records what it evaluated (the version's manifest hash, the eval sets' SHA-256,
the config's hash); the gate adds the baseline it compared against and writes all of it into
gate.json under `evaluated`. Promotion recomputes the same facts for the version it is about to
serve and refuses a verdict that does not match: a cleared-and-rerun load, an edited eval set, a
new baseline or config all need a new verdict.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from pipelines import models
from pipelines.build import embed_backends
from pipelines.config import PipelineConfig
from pipelines.retrieval import answer_support
from pipelines.versions.code import code_version
from pipelines.versions.manifest import manifest_hash, sha256_file, sha256_json


class VerdictMismatch(RuntimeError):
    """A gate verdict that was not computed on the content about to be promoted."""


def file_hash(path: str | Path) -> str | None:
    return sha256_file(path) if Path(path).is_file() else None


def file_fact(path: str | None) -> dict | None:
    """A bound file (the answerability combiner): its path and content hash; None when not configured."""
    return {"path": str(path), "sha256": file_hash(path)} if path else None


def eval_sets(cfg: PipelineConfig) -> list[str]:
    """The eval sets an evaluation reads (their content is part of what a verdict judged)."""
    check = cfg.evals.check_set
    return [cfg.evals.calibration_set, *([check] if check else []), cfg.evals.precision_set]


def embedding_fingerprint(cfg: PipelineConfig) -> str:
    """The fingerprint of the embedding model the config names, per backend (no model load: a hash of its files)."""
    return embed_backends.fingerprint(cfg.embedding.model_path, cfg.embedding.backend)


def reranker_fingerprint(cfg: PipelineConfig) -> str | None:
    """The cross-encoder's files' fingerprint (it scores the gating signal), None when there is none."""
    kind, path = cfg.reranker.kind, cfg.reranker.model_path
    try:
        if kind == "onnx":
            return models.fingerprint(models.cross_encoder_dir(path))
        return models.fingerprint(path) if kind == "sentence_transformers" and path else None
    except FileNotFoundError:
        return None


def answer_model_fingerprint(cfg: PipelineConfig) -> str | None:
    """The answer-support model's fingerprint (it scores `answer_support`), None when it is off or missing."""
    if not cfg.answerability.answer_support:
        return None
    try:
        return answer_support.fingerprint(cfg.answerability.answer_model_path)
    except FileNotFoundError:
        return None


# Config keys that say where things live, not what was judged: `artifacts` is a local folder for one night
# and a per-task scratch folder (a different one per task and worker) for a night on an object store;
# `artifacts_airflow_conn_id` how a DAG task reaches that store (set by the DAGs, null on the CLI).
LOCATION_KEYS = ("artifacts", "artifacts_airflow_conn_id")


def config_hash(cfg: PipelineConfig) -> str:
    """The hash of the config a verdict judged: every key but LOCATION_KEYS (its JSON form, as it was hashed
    when configs were dicts: tests/test_config.py pins the shipped config's hash)."""
    return sha256_json(cfg.model_dump(mode="json", exclude=set(LOCATION_KEYS)))


def evaluated(cfg: PipelineConfig, manifest: Mapping | None, eval_sets: list[str]) -> dict:
    """What one evaluation judged: the version (by manifest hash), the eval sets, the config, the accepted
    answerability combiner its signals were scored with, the models that scored them (embedder, reranker)
    and the code that ran: any of them changed needs a new verdict."""
    return {
        "version": (manifest or {}).get("version"),
        "manifest_sha256": manifest_hash(manifest) if manifest else None,
        "eval_sets": {str(p): file_hash(p) for p in eval_sets},
        "config_sha256": config_hash(cfg),
        "combiner": file_fact(cfg.answerability.combiner),
        "embedder_fingerprint": embedding_fingerprint(cfg),
        "reranker_fingerprint": reranker_fingerprint(cfg),
        "answer_model_fingerprint": answer_model_fingerprint(cfg),
        "code_version": code_version(),
    }


def binding(evaluated_facts: Mapping, baseline_path: str | Path | None) -> dict:
    """gate.json's `evaluated`: the evaluation's facts plus the baseline the gate compared against (None: none
    accepted yet)."""
    baseline = {"path": str(baseline_path), "sha256": file_hash(baseline_path)} if baseline_path else None
    return {**evaluated_facts, "baseline": baseline}


def current_binding(cfg: PipelineConfig, manifest: Mapping, recorded: Mapping) -> dict:
    """The same facts recomputed now, for the version about to be promoted (eval sets as recorded)."""
    sets = list(recorded.get("eval_sets") or {}) or eval_sets(cfg)
    return binding(evaluated(cfg, manifest, sets), cfg.evals.baseline)


def mismatches(recorded: Mapping | None, current: Mapping) -> list[str]:
    """Each fact of the verdict that differs from now, as a readable line."""
    if not recorded:
        return ["gate.json records nothing about what it evaluated (a verdict from before verdicts were bound)"]
    found = []
    if recorded.get("version") != current["version"]:
        found.append(f"it judged version {recorded.get('version')!r}, not {current['version']!r}")
    if recorded.get("manifest_sha256") != current["manifest_sha256"]:
        found.append("the index version was rebuilt or changed since it was evaluated (manifest hash differs)")
    for path, digest in (current.get("eval_sets") or {}).items():
        if (recorded.get("eval_sets") or {}).get(path) != digest:
            found.append(f"eval set {path} changed since the evaluation")
    if recorded.get("config_sha256") != current["config_sha256"]:
        found.append("the config differs from the one the evaluation ran with")
    if recorded.get("combiner") != current.get("combiner"):
        found.append(
            f"the answerability combiner {(current.get('combiner') or {}).get('path')} changed since the evaluation"
        )
    if recorded.get("baseline") != current["baseline"]:
        base = (current["baseline"] or {}).get("path")
        found.append(f"the baseline {base} differs from the one the gate compared against")
    for field, what in BOUND_MODELS_AND_CODE.items():
        if recorded.get(field) != current.get(field):
            found.append(
                f"{field}: {what} changed since the evaluation ({recorded.get(field)!r} -> {current[field]!r})"
            )
    return found


BOUND_MODELS_AND_CODE = {
    "embedder_fingerprint": "the embedding model",
    "reranker_fingerprint": "the cross-encoder behind rerank_top",
    "answer_model_fingerprint": "the answer-support model behind answer_support",
    "code_version": "the code",
}


def check_verdict(gate: Mapping, cfg: PipelineConfig, manifest: Mapping, version: str) -> None:
    """Refuse (VerdictMismatch) a verdict that failed or that was computed on other content than `manifest`."""
    if not gate.get("passed"):
        raise VerdictMismatch(f"refusing to promote {version}: its gate failed")
    recorded = gate.get("evaluated")
    problems = mismatches(recorded, current_binding(cfg, manifest, recorded or {}))
    if problems:
        raise VerdictMismatch(
            f"refusing to promote {version}: its gate verdict does not match what is being promoted: "
            + "; ".join(problems)
            + ". Re-run evaluate and gate on this version."
        )
