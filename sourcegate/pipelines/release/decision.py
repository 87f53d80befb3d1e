"""What a passed verdict proved about answering, as one artifact: the decision a served answer uses (G11).

The gate writes it into gate.json as `decision`: the gating signal and its threshold (`adjacent`), what a question
under it gets (`below`), the strong signal and its threshold, how many fused passages the answer model reads, the
answer model (path as configured, fingerprint), the reranker (kind, fingerprint), the embedder's fingerprint, the
combiner file's hash, and the config values the night ran with (`configured`). The signal and thresholds come from
calibration.json's `shipped` block, where the night says what it gated on (it may choose the signal itself), and
from the config only where calibration does not say. Promotion publishes it beside the live pointer
(PUBLISHED) so an application reads exactly what was proven; `sourcegate query` serves it and refuses a config
value or a model on disk that differs from it, naming the field and both values.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from sourcegate.artifact_io import read_json, write_json
from sourcegate.pipelines.config import PipelineConfig
from sourcegate.pipelines.release import verdict
from sourcegate.pipelines.versions.manifest import sha256_file

PUBLISHED = "LIVE.decision.json"  # in the artifacts folder, beside LIVE (and the promotions log)

# The config keys an answer depends on beyond the index: any of them changed serves something no verdict proved.
# The retrieval settings make the fused order the answer model reads and the order of the sources served (a verdict
# recorded before they were listed here binds the keys it lists).
CONFIGURED = (
    "retrieval.bm25_top_n",
    "retrieval.knn_top_n",
    "retrieval.rrf_k",
    "retrieval.rerank_depth",
    "retrieval.rerank_weight",
    "answer.signal",
    "answer.adjacent",
    "answer.below",
    "answer.strong_signal",
    "answer.strong",
    "answerability.answer_support",
    "answerability.answer_model_path",
    "answerability.answer_passages",
    "answerability.combiner",
    "reranker.kind",
    "reranker.model_path",
)


# Where a model or file lives is not what was proven: a DAG names it by absolute path, the CLI relative to the project;
# what it holds is compared by fingerprint and hash below.
LOCATIONS = ("answerability.answer_model_path", "answerability.combiner", "reranker.model_path")

ON_DISK = ("embedder_fingerprint", "reranker_fingerprint", "answer_model_fingerprint", "combiner")


class NotProven(RuntimeError):
    """An answer that would use something no passed verdict proved (another config value, another model)."""


def config_value(cfg: PipelineConfig, dotted: str):
    value = cfg
    for part in dotted.split("."):
        value = getattr(value, part)
    return value


def configured(cfg: PipelineConfig) -> dict:
    return {key: config_value(cfg, key) for key in CONFIGURED}


def on_disk(cfg: PipelineConfig) -> dict:
    """The fingerprints of the models and the combiner file the config names, as they are now."""
    return {
        "embedder_fingerprint": verdict.embedding_fingerprint(cfg),
        "reranker_fingerprint": verdict.reranker_fingerprint(cfg),
        "answer_model_fingerprint": verdict.answer_model_fingerprint(cfg),
        "combiner": verdict.file_fact(cfg.answerability.combiner),
    }


def proven(cfg: PipelineConfig, calibration: Mapping | None, evaluated: Mapping | None = None) -> dict:
    """The decision a night proves: thresholds from `calibration` (calibration.json), models as `evaluated`
    (gate.json's binding) recorded them; each from the config, or the files as they are, where those do not say."""
    shipped = (calibration or {}).get("shipped") or {}
    gating = ((calibration or {}).get("config") or {}).get("gating") or {}
    facts = {**on_disk(cfg), **{k: v for k, v in (evaluated or {}).items() if k in ON_DISK}}
    answer, section = cfg.answer, cfg.answerability
    signal = shipped.get("signal") or answer.signal
    return {
        "signal": signal,
        "adjacent": shipped["threshold"] if shipped.get("threshold") is not None else answer.adjacent,
        "below": gating.get("below") or answer.below,
        "strong_signal": gating.get("strong_signal") or answer.strong_signal or signal,
        "strong": shipped["strong_threshold"] if shipped.get("strong_threshold") is not None else answer.strong,
        "answer_passages": section.answer_passages,
        "answer_model": {"path": section.answer_model_path, "fingerprint": facts["answer_model_fingerprint"]}
        if section.answer_support
        else None,
        "reranker": {"kind": cfg.reranker.kind, "fingerprint": facts["reranker_fingerprint"]},
        "embedder_fingerprint": facts["embedder_fingerprint"],
        "combiner": facts["combiner"],
        "configured": configured(cfg),
    }


def of_verdict(gate: Mapping | None, where: str) -> dict:
    """The decision a passed verdict proved (NotProven when there is no verdict, it failed, or it records none)."""
    if not gate:
        raise NotProven(f"no gate verdict at {where}")
    if gate.get("passed") is not True:  # a verdict passes only as JSON true ("false" is a string)
        raise NotProven(f"the verdict at {where} did not pass: it proved nothing to serve")
    if not gate.get("decision"):
        raise NotProven(f"the verdict at {where} records no decision (a verdict from before decisions were bound)")
    return dict(gate["decision"])


# What a decision decides (the rest names models and files, bound by the verdict's binding)
DECIDING = ("signal", "adjacent", "below", "strong_signal", "strong", "answer_passages")


def edited(gate: Mapping, calibration: Mapping | None, cfg: PipelineConfig) -> list[str]:
    """Each value of gate.json's `decision` that is not what its night's calibration.json and the config make of it
    (`proven`): a decision edited by hand would be served, and published, as proven. None: nothing to recompute."""
    recorded = gate.get("decision") or {}
    if calibration is None or not recorded:
        return []
    remade = proven(cfg, calibration, gate.get("evaluated"))
    return [
        f"{k}: {shown(recorded.get(k))} recorded vs {shown(remade[k])}"
        for k in DECIDING
        if recorded.get(k) != remade[k]
    ]


def unproven(gate: Mapping | None, cfg: PipelineConfig) -> tuple[dict, str]:
    """What `--unproven` answers with, and how to name it: the decision a verdict that did not pass records, when
    the config is the one its night ran with (under `answer.signal: auto` the night chose the signal and placed its
    threshold, which the config alone names neither of); else the config as it is."""
    recorded = (gate or {}).get("decision")
    if recorded and not mismatches(recorded, cfg):
        return dict(recorded), "the decision its night chose"
    return proven(cfg, None), "the config as it is"


def shown(value) -> str:
    if value is None:
        return "null"
    return value if isinstance(value, str) else repr(value)


# The config keys of a model that only some signals read: an answer that computes none of them does not use it.
ANSWER_MODEL_KEYS = ("answerability.answer_support", "answerability.answer_model_path", "answerability.answer_passages")
COMBINER_KEYS = ("answerability.combiner",)


def unread(computed: frozenset[str] | None) -> set[str]:
    """What an answer computing the signals `computed` (None: every one) does not use: "answer model" unless it
    computes `answer_support` (or the combiner, which may read it), "combiner" unless it computes `answerability`."""
    skip = set()
    if computed is not None and not {"answer_support", "answerability"} & computed:
        skip.add("answer model")
    if computed is not None and "answerability" not in computed:
        skip.add("combiner")
    return skip


def mismatches(decision: Mapping, cfg: PipelineConfig, computed: frozenset[str] | None = None) -> list[str]:
    """Each config value and model on disk that differs from the proven decision, as "field: proven vs now".

    A reranker missing on disk is not one: at query time the reranker is a preference (its failure leaves the
    fused order); a different reranker is. `computed`: the signals an answer computes (None: every one); a model
    none of them reads is not part of the answer, so its keys and fingerprint are not compared (a config naming
    tomorrow's answer model still serves today's version, which gates on `rerank_top`, exactly as proven)."""
    skip = unread(computed)
    ignored = {
        *LOCATIONS,
        *(ANSWER_MODEL_KEYS if "answer model" in skip else ()),
        *(COMBINER_KEYS if "combiner" in skip else ()),
    }
    found = [
        f"{key}: {shown(value)} (proven) vs {shown(config_value(cfg, key))} (config)"
        for key, value in (decision.get("configured") or {}).items()
        if key not in ignored and config_value(cfg, key) != value
    ]
    now = on_disk(cfg)
    models = {  # what: (proven, on disk now)
        "embedder fingerprint": (decision.get("embedder_fingerprint"), now["embedder_fingerprint"]),
        "answer model fingerprint": (
            (decision.get("answer_model") or {}).get("fingerprint"),
            now["answer_model_fingerprint"],
        ),
        "reranker fingerprint": ((decision.get("reranker") or {}).get("fingerprint"), now["reranker_fingerprint"]),
        "answerability combiner sha256": (
            (decision.get("combiner") or {}).get("sha256"),
            (now["combiner"] or {}).get("sha256"),
        ),
    }
    for what, (was, is_now) in models.items():
        if what == "reranker fingerprint" and is_now is None:  # missing: the fused order, like any reranker failure
            continue
        if what.startswith("answer model") and "answer model" in skip or "combiner" in what and "combiner" in skip:
            continue
        if was != is_now:
            found.append(f"{what}: {shown(was)} (proven) vs {shown(is_now or 'missing')} (on disk)")
    return found


def refusal(where: str, problems: list[str]) -> NotProven:
    """The error refusing an answer that would use what the verdict at `where` did not prove."""
    return NotProven(
        f"refusing to answer with what the verdict at {where} did not prove: "
        + "; ".join(problems)
        + " (--unproven answers anyway, and says so)"
    )


def publish(artifacts: str | Path, version: str, gate_path: Path) -> Path:
    """PUBLISHED beside the live pointer: the live version, its verdict's hash and the decision it proved
    (written atomically, so an application never reads half of one)."""
    gate = read_json(gate_path)
    body = {
        "version": version,
        "verdict": f"runs/{version}/gate.json",
        "verdict_sha256": sha256_file(gate_path),
        "decision": of_verdict(gate, str(gate_path)),
    }
    return write_json(body, Path(artifacts) / PUBLISHED)
