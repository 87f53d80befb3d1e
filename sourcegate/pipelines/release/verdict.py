"""A gate verdict bound to what it judged (G3).

The evaluate step records what it evaluated (the version's manifest hash, the eval sets' SHA-256,
the config's judged values and hash, the kept files it reused); the gate adds the baseline it compared against and writes all of it into
gate.json under `evaluated`. Promotion recomputes the same facts for the version it is about to
serve and refuses a verdict that does not match: a cleared-and-rerun load, an edited eval set, a
new baseline or config all need a new verdict.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

from sourcegate.artifact_io import run_folder as rf
from sourcegate.pipelines import config, models
from sourcegate.pipelines.build import embed_backends
from sourcegate.pipelines.config import PipelineConfig
from sourcegate.pipelines.retrieval import answer_support
from sourcegate.pipelines.versions.code import code_version
from sourcegate.pipelines.versions.manifest import manifest_hash, sha256_file, sha256_json


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


# The config that decides an index's content (the corpus's own content is `corpus_hash`; the
# model's weights are `model_fingerprint`). Thresholds, evals, retrieval settings are not here:
# re-gating a night with new thresholds may reuse its index.
INDEX_CONFIG_KEYS = (
    "corpus.format",
    "corpus.max_doc_bytes",
    "chunking.max_tokens",
    "chunking.overlap_tokens",
    "chunking.max_split_pieces",
    "embedding.model_id",
    "embedding.batch_size",
)


def index_config_hash(cfg: PipelineConfig) -> str:
    """Hash of the config values that decide an index version's content (INDEX_CONFIG_KEYS): a manifest's
    `config_hash`."""
    return sha256_json({k: config.get(cfg, k) for k in INDEX_CONFIG_KEYS})


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


# Config keys that say where things live or how a task reaches them (or when a DAG acts), not what was judged. Each one's content is
# bound on its own, so a version built by a DAG (absolute paths, connection ids) is promoted from the CLI (paths
# relative to the project) and the other way round:
LOCATION_KEYS = (
    "artifacts",  # a local folder, or a per-task scratch folder for a night on an object store
    "artifacts_airflow_conn_id",  # how a DAG task reaches the object store
    "backend.opensearch.airflow_conn_id",  # how a DAG task reaches the node
    "corpus.path",  # the corpus is read by ingest only: the version's manifest (corpus_hash, files) binds it
    "embedding.model_path",  # embedder_fingerprint
    "reranker.model_path",  # reranker_fingerprint
    "answerability.answer_model_path",  # answer_model_fingerprint
    "answerability.combiner",  # combiner.sha256
    "evals.calibration_set",  # eval_set_sha256, by role
    "evals.check_set",
    "evals.precision_set",
    "evals.baseline",  # baseline.sha256
    "evals.check_moves",  # `accept`'s log of moved questions: never read by an evaluation
)
# Keys that are no location but judge nothing a night measures, and that joined the config after the legacy
# verdicts (which never held them). When the recalibrate DAG retrains the answer model: no night's scores depend
# on it (the retrained model's fingerprint is bound when it ships).
NOT_JUDGED = ("answerability.retrain_below_share",)
# Keys that say how the product operates, never what a night measures: how many versions retention keeps, how long a
# writer waits or leases the lock (`run --lock-timeout`), how hard a load or search retries, the note naming the run
# that calibrated the decision. Changing one needs no new verdict; a verdict recorded while they were judged holds
# them, and they are not compared.
OPERATING = (
    "backend.retention",
    "backend.keep_failed_days",
    "backend.opensearch.bulk_chunk_size",
    "backend.opensearch.max_retries",
    "backend.opensearch.search_retries",
    "lock.timeout_s",
    "lock.lease_s",
    "answer.calibrated_by",
)
# What config_sha256 left out before every location was: a verdict recorded then still matches an unchanged config.
LEGACY_LOCATION_KEYS = ("artifacts", "artifacts_airflow_conn_id")
ABSENT = "(absent)"


def excluding(dotted: tuple[str, ...]) -> dict:
    """A pydantic `exclude` for dotted keys ("corpus.path" -> {"corpus": {"path": True}})."""
    tree: dict = {}
    for key in dotted:
        *sections, leaf = key.split(".")
        node = tree
        for section in sections:
            node = node.setdefault(section, {})
        node[leaf] = True
    return tree


def flatten(values: Mapping, prefix: str = "") -> dict:
    """{"retrieval": {"rrf_k": 5}} -> {"retrieval.rrf_k": 5} (lists are values)."""
    flat = {}
    for key, value in values.items():
        if isinstance(value, Mapping):
            flat |= flatten(value, f"{prefix}{key}.")
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def judged_config(cfg: PipelineConfig) -> dict:
    """The config a verdict judged, by dotted key: every key but LOCATION_KEYS, NOT_JUDGED and OPERATING."""
    return flatten(cfg.model_dump(mode="json", exclude=excluding(LOCATION_KEYS + NOT_JUDGED + OPERATING)))


def config_hash(cfg: PipelineConfig) -> str:
    """The hash of the config a verdict judged (`judged_config`, nested as the config is)."""
    return sha256_json(cfg.model_dump(mode="json", exclude=excluding(LOCATION_KEYS + NOT_JUDGED + OPERATING)))


def legacy_config_hash(cfg: PipelineConfig) -> str:
    """config_sha256 as verdicts recorded it before they recorded the judged values (every key but
    LEGACY_LOCATION_KEYS; tests/test_config.py pins the shipped config's)."""
    return sha256_json(cfg.model_dump(mode="json", exclude=excluding(LEGACY_LOCATION_KEYS + NOT_JUDGED)))


def eval_set_roles(cfg: PipelineConfig) -> dict[str, str]:
    """The eval sets an evaluation reads, by role (a check set only when one is configured)."""
    roles = {
        "calibration": cfg.evals.calibration_set,
        "check": cfg.evals.check_set,
        "precision": cfg.evals.precision_set,
    }
    return {role: path for role, path in roles.items() if path}


def reused_facts(kept: Mapping | None) -> dict:
    """The kept files an evaluation reused values from (sourcegate.evals.harness.keep_for_next's per-file record): the run
    each came from and its SHA-256. Those values were computed by an earlier night, so the verdict binds them."""
    return {
        name: {"from_run": part["from_run"], "sha256": part["sha256"], "reused": part["reused"]}
        for name, part in (kept or {}).items()
        if part.get("sha256")
    }


def kept_facts(folder: str | Path, kept: Mapping | None) -> dict:
    """The files an evaluation kept for the next night (harness.keep_for_next's per-file record), by SHA-256 as
    written into its `folder`: the verdict binds them, so whoever reads one later (the next night, `serve`) reads
    exactly what this evaluation computed."""
    facts = {}
    for name, part in (kept or {}).items():
        path = Path(folder) / name
        if path.is_file():
            facts[name] = {"sha256": sha256_file(path), "rows": part.get("kept")}
    return facts


def bound_kept_file(gate: Mapping | None, folder: str | Path, name: str) -> tuple[Path | None, str | None]:
    """The kept file `name` beside a verdict, if it is the one the verdict bound: (its path, None), else (None,
    why not). A file that differs from its binding is never read: its values were computed by no verdict."""
    fact = ((gate or {}).get("evaluated") or {}).get("kept", {}).get(name)
    path = Path(folder) / name
    if not fact:
        return None, f"{path}: the verdict binds no kept file {name}"
    if not path.is_file():
        return None, f"{path}: not there"
    if sha256_file(path) != fact.get("sha256"):
        return None, f"{path} differs from the one its verdict bound (SHA-256 {fact.get('sha256')}): not read"
    return path, None


def bound_kept_files(folder: str | Path) -> tuple[dict[str, Path], dict[str, str]]:
    """The kept files in a run `folder` that its gate.json bound, and why each other kept file there is not one:
    what a later evaluation may reuse (values computed by no verdict are computed again)."""
    gate_path = Path(folder) / rf.GATE
    gate = json.loads(gate_path.read_text(encoding="utf-8")) if gate_path.is_file() else None
    files, refused = {}, {}
    for name in rf.KEPT:
        if (Path(folder) / name).is_file():
            path, why_not = bound_kept_file(gate, folder, name)
            if path:
                files[name] = path
            else:
                refused[name] = why_not
    return files, refused


def evaluated(
    cfg: PipelineConfig, manifest: Mapping | None, eval_sets: list[str], reused: Mapping | None = None
) -> dict:
    """What one evaluation judged: the version (by manifest hash), the eval sets (by role and content), the
    config (its judged values and their hash), the accepted answerability combiner its signals were scored with,
    the models that scored them (embedder, reranker), the kept values it reused from an earlier night (`reused`:
    harness.keep_for_next's record) and the code that ran: any of them changed needs a new verdict."""
    return {
        "version": (manifest or {}).get("version"),
        "manifest_sha256": manifest_hash(manifest) if manifest else None,
        "eval_sets": {str(p): file_hash(p) for p in eval_sets},
        "eval_set_sha256": {role: file_hash(path) for role, path in eval_set_roles(cfg).items()},
        "config_sha256": config_hash(cfg),
        "config": judged_config(cfg),
        "combiner": file_fact(cfg.answerability.combiner),
        "embedder_fingerprint": embedding_fingerprint(cfg),
        "reranker_fingerprint": reranker_fingerprint(cfg),
        "answer_model_fingerprint": answer_model_fingerprint(cfg),
        "reused": reused_facts(reused),
        "code_version": code_version(),
    }


def binding(evaluated_facts: Mapping, baseline_path: str | Path | None) -> dict:
    """gate.json's `evaluated`: the evaluation's facts plus the baseline the gate compared against (None: none
    accepted yet)."""
    baseline = {"path": str(baseline_path), "sha256": file_hash(baseline_path)} if baseline_path else None
    return {**evaluated_facts, "baseline": baseline}


def reused_now(root: str | Path, recorded: Mapping | None) -> dict:
    """The recorded reused files as they are now in the artifacts folder `root`. One no longer there (retention deleted
    its run) or an empty placeholder (a step staged from an object store did not download it) stands as recorded:
    the values it lent are in the verdict's own calibration.json."""
    now = {}
    for name, fact in (recorded or {}).items():
        path = Path(root) / rf.RUNS / str(fact.get("from_run")) / name
        present = path.is_file() and path.stat().st_size > 0
        now[name] = {**fact, "sha256": sha256_file(path) if present else fact.get("sha256")}
    return now


def current_binding(cfg: PipelineConfig, manifest: Mapping, recorded: Mapping, root: str | Path) -> dict:
    """The same facts recomputed now, for the version about to be promoted (eval sets as recorded; the reused
    files as they are in the artifacts folder `root`)."""
    sets = list(recorded.get("eval_sets") or {}) or eval_sets(cfg)
    facts = {**evaluated(cfg, manifest, sets), "reused": reused_now(root, recorded.get("reused"))}
    return {**binding(facts, cfg.evals.baseline), "legacy_config_sha256": legacy_config_hash(cfg)}


def shown(value) -> str:
    return ABSENT if value is ABSENT else json.dumps(value)


def config_differences(judged: Mapping, now: Mapping) -> list[str]:
    """Each judged config key whose value differs now: "retrieval.rrf_k: 5 (judged) vs 60 (now)"."""
    return [
        f"{key}: {shown(judged.get(key, ABSENT))} (judged) vs {shown(now.get(key, ABSENT))} (now)"
        for key in sorted(set(judged) | set(now))
        if judged.get(key, ABSENT) != now.get(key, ABSENT) and key not in OPERATING
    ]


def eval_set_mismatches(recorded: Mapping, current: Mapping) -> list[str]:
    """Eval sets whose content differs: by role when the verdict recorded roles, else by the recorded paths."""
    if "eval_set_sha256" in recorded:
        judged, now = recorded["eval_set_sha256"] or {}, current.get("eval_set_sha256") or {}
        return [
            f"eval set {role} differs in content from the one evaluated"
            for role in sorted(set(judged) | set(now))
            if judged.get(role) != now.get(role)
        ]
    return [
        f"eval set {path} changed since the evaluation"
        for path, digest in (current.get("eval_sets") or {}).items()
        if (recorded.get("eval_sets") or {}).get(path) != digest
    ]


def config_mismatches(recorded: Mapping, current: Mapping) -> list[str]:
    if "config" in recorded:
        differences = config_differences(recorded["config"] or {}, current.get("config") or {})
        return [f"the config differs from the one the evaluation ran with: {d}" for d in differences]
    if recorded.get("config_sha256") in (current["config_sha256"], current.get("legacy_config_sha256")):
        return []
    return ["the config differs from the one the evaluation ran with (a verdict from before it recorded its values)"]


def digest_of(fact: Mapping | None) -> str | None:
    return (fact or {}).get("sha256")


def file_differs(judged: Mapping | None, now: Mapping | None) -> bool:
    """A bound file (path and sha256, or None when not configured) differs by content, never by path."""
    return (judged is None) != (now is None) or digest_of(judged) != digest_of(now)


def mismatches(recorded: Mapping | None, current: Mapping, name: str | None = None) -> list[str]:
    """Each fact of the verdict that differs from now, as a readable line (a file by content, never by path);
    `name`: the version going live."""
    if not recorded:
        return ["gate.json records nothing about what it evaluated (a verdict from before verdicts were bound)"]
    return content_mismatches(recorded, current, name) + judging_mismatches(recorded, current)


def content_mismatches(recorded: Mapping, current: Mapping, name: str | None = None) -> list[str]:
    """What the verdict's numbers were computed on that differs now: the version's content, the kept values it
    reused, and (`name`: the version going live) the name it was built as. Nothing may go live past one of these:
    its numbers would not be this version's."""
    found = []
    if name is not None and current["version"] not in (None, name):  # a run folder copied under another run id
        found.append(f"its folder holds version {current['version']!r}, built under that name, not {name!r}")
    if recorded.get("version") != current["version"]:
        found.append(f"it judged version {recorded.get('version')!r}, not {current['version']!r}")
    if recorded.get("manifest_sha256") != current["manifest_sha256"]:
        found.append("the index version was rebuilt or changed since it was evaluated (manifest hash differs)")
    for kept, fact in (recorded.get("reused") or {}).items():
        now = digest_of((current.get("reused") or {}).get(kept))
        if fact.get("sha256") != now:
            found.append(
                f"{kept} of run {fact.get('from_run')}, whose kept values the evaluation reused, changed since "
                f"({fact.get('sha256')} -> {now})"
            )
    return found


def judging_mismatches(recorded: Mapping, current: Mapping) -> list[str]:
    """What judged the version that differs now: eval sets, config, combiner, baseline, models, code. A promotion
    needs none (a new verdict is due); a rollback may go past them when forced (`judged_since`)."""
    found = eval_set_mismatches(recorded, current)
    found += config_mismatches(recorded, current)
    if file_differs(recorded.get("combiner"), current.get("combiner")):
        found.append(
            f"the answerability combiner {(current.get('combiner') or {}).get('path')} changed since the evaluation"
        )
    if file_differs(recorded.get("baseline"), current["baseline"]):
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


def check_verdict(gate: Mapping, cfg: PipelineConfig, manifest: Mapping, version: str, root: str | Path) -> None:
    """Refuse (VerdictMismatch) a verdict that failed or that was computed on other content than `manifest`
    (`root`: the artifacts folder the version's run lives in)."""
    if gate.get("passed") is not True:  # a verdict passes only as JSON true ("false" is a string)
        reasons = "; ".join(str(r) for r in (gate.get("reasons") or [])[:3])
        raise VerdictMismatch(f"refusing to promote {version}: its gate failed" + (f": {reasons}" if reasons else ""))
    recorded = gate.get("evaluated")
    problems = mismatches(recorded, current_binding(cfg, manifest, recorded or {}, root), version)
    if problems:
        raise VerdictMismatch(
            f"refusing to promote {version}: its gate verdict does not match what is being promoted: "
            + "; ".join(problems)
            + ". Re-run evaluate and gate on this version."
        )


def judged_since(gate: Mapping, cfg: PipelineConfig, manifest: Mapping, version: str, root: str | Path, force: bool):
    """What judged a rollback target that differs now (a baseline accepted since, an eval set grown, a code upgrade),
    which `force` goes past: the version goes back to serving what its verdict proved, and a night re-judges it.
    Refused (VerdictMismatch) whatever `force`: a verdict that failed or binds nothing, and a version whose content or
    reused values differ from what it judged (its numbers would not be this version's)."""
    if gate.get("passed") is not True:  # a verdict passes only as JSON true ("false" is a string)
        raise VerdictMismatch(f"refusing to roll back to {version}: its gate failed")
    recorded = gate.get("evaluated")
    current = current_binding(cfg, manifest, recorded or {}, root)
    if not recorded or (changed := content_mismatches(recorded, current, version)):
        raise VerdictMismatch(
            f"refusing to roll back to {version}: its verdict does not bind what it would serve: "
            + "; ".join(changed if recorded else mismatches(recorded, current, version))
        )
    since = judging_mismatches(recorded, current)
    if since and not force:
        raise VerdictMismatch(
            f"refusing to roll back to {version}: what judged it has changed since its verdict: "
            + "; ".join(since)
            + ". --force rolls back anyway, logged with its actor and these differences (the version serves the "
            "decision its verdict proved, checked against today's config and models; the next night judges again)"
        )
    return since
