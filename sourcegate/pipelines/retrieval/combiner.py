"""The answerability combiner: one calibrated score from several signals.

A logistic regression over standardised signals (scikit-learn's, L2, solved by Newton-Cholesky to a tight
tolerance: the same rows give the same coefficients on the same machine). It is fitted only by
`sourcegate calibrate` and `sourcegate accept`, from a calibration's per-question signals; the
nightly run reads the accepted coefficients from the file `answerability.combiner` names and
never refits, so a night cannot move its own gating score. The file records the features, the
standardisation, the coefficients, the hash of the rows it was fitted on and a cross-validated
estimate of what it does on questions it was not fitted on.

Higher = more answerable (the probability of "answer"), like every other signal.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from sourcegate.pipelines.config import PipelineConfig
from sourcegate.pipelines.versions.manifest import sha256_file, sha256_json

FORMAT = "sourcegate-answerability-combiner/1"
SIGNAL = "answerability"  # the name the combined score has among the signals
L2 = 1.0  # penalty on the standardised coefficients (scikit-learn's default C = 1)
SOLVER = "sklearn.linear_model.LogisticRegression(newton-cholesky)"
FOLDS, SEED = 5, 14  # the cross-validated estimate written beside the coefficients


class CombinerError(RuntimeError):
    """A coefficient file that is missing, unreadable or fitted for other signals."""


# --------------------------------------------------------------------------- fitting


def training_rows(questions: Sequence[Mapping], features: Sequence[str]) -> list[Mapping]:
    """Labelled questions that have every feature (a question without a reranker score cannot be scored)."""
    rows = []
    for q in questions:
        values = [q.get("signals", {}).get(f) for f in features]
        if q.get("label") in ("answer", "decline") and all(v is not None and math.isfinite(v) for v in values):
            rows.append({"id": q["id"], "label": q["label"], "kind": q.get("kind"), "x": [float(v) for v in values]})
    return rows


def training_hash(rows: Sequence[Mapping], features: Sequence[str]) -> str:
    """SHA-256 of exactly what the fit reads: the feature names and each row's id, label and values."""
    return sha256_json({"features": list(features), "rows": [[r["id"], r["label"], r["x"]] for r in rows]})


def fit_logistic(z: np.ndarray, y: np.ndarray, l2: float = L2) -> tuple[np.ndarray, float]:
    """L2-penalised logistic regression (the intercept is not penalised): minimises the summed log loss
    plus l2/2 * |coef|^2, i.e. scikit-learn's C = 1/l2."""
    from sklearn.linear_model import LogisticRegression

    model = LogisticRegression(C=1.0 / l2, solver="newton-cholesky", tol=1e-10, max_iter=200)
    model.fit(z, y.astype(int))
    return model.coef_[0].astype(float), float(model.intercept_[0])


def standardisation(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    mean = x.mean(axis=0)
    scale = x.std(axis=0)
    return mean, np.where(scale > 0, scale, 1.0)


def fit_arrays(x: np.ndarray, y: np.ndarray, l2: float = L2) -> dict:
    """Standardise, fit; the parameters as plain lists."""
    mean, scale = standardisation(x)
    coef, intercept = fit_logistic((x - mean) / scale, y.astype(float), l2)
    return {"mean": mean.tolist(), "scale": scale.tolist(), "coef": coef.tolist(), "intercept": intercept}


def probabilities(params: Mapping, x: np.ndarray) -> np.ndarray:
    z = (np.asarray(x, float) - np.asarray(params["mean"])) / np.asarray(params["scale"])
    return 1.0 / (1.0 + np.exp(-(z @ np.asarray(params["coef"]) + params["intercept"])))


def folds(strata: Sequence[str], k: int, seed: int) -> np.ndarray:
    """Fold number per row, stratified (every label/kind spread over the folds), seeded."""
    rng = np.random.default_rng(seed)
    labels = np.asarray(strata)
    out = np.zeros(len(labels), int)
    for value in sorted(set(strata)):
        idx = np.flatnonzero(labels == value)
        rng.shuffle(idx)
        out[idx] = np.arange(len(idx)) % k
    return out


def threshold_for(answer: np.ndarray, coverage: float) -> float:
    """The highest threshold (score >= t answers) that keeps `coverage` of these answers."""
    keep = int(np.ceil(coverage * len(answer)))
    return float(np.sort(answer)[::-1][keep - 1]) if keep else float("inf")


def cross_validate(rows: Sequence[Mapping], k: int = FOLDS, seed: int = SEED, l2: float = L2) -> dict:
    """Held-out estimate: per fold, fit on the others and threshold at 100% of their should-answer.

    Reports, over all held-out rows, the share of should-answer kept and, per should-decline
    kind, the share declined, plus the AUC of the out-of-fold probabilities.
    """
    x = np.array([r["x"] for r in rows], float)
    is_answer = np.array([r["label"] == "answer" for r in rows])
    kinds = np.array([r.get("kind") or "decline" for r in rows], dtype=object)
    strata = ["answer" if a else str(kd) for a, kd in zip(is_answer, kinds)]
    k = max(2, min(k, min(strata.count(s) for s in set(strata))))  # each fold holds every stratum
    fold = folds(strata, k, seed)
    held_out = np.zeros(len(rows))
    declined = np.zeros(len(rows), bool)
    for f in range(k):
        train, test = fold != f, fold == f
        params = fit_arrays(x[train], is_answer[train], l2)
        t = threshold_for(probabilities(params, x[train][is_answer[train]]), 1.0)
        held_out[test] = probabilities(params, x[test])
        declined[test] = held_out[test] < t
    by_kind = {
        str(kd): round(float(declined[~is_answer & (kinds == kd)].mean()), 4) for kd in sorted(set(kinds[~is_answer]))
    }
    from sourcegate.evals.sweep import roc_auc  # here, not at the top: scipy costs a second on every query's start

    return {
        "protocol": f"stratified {k}-fold (seed {seed}); threshold = lowest training-fold should-answer probability",
        "auc": round(roc_auc(held_out[is_answer], held_out[~is_answer]), 4),
        "answer_kept": round(float(1 - declined[is_answer].mean()), 4),
        "decline_recall_by_kind": by_kind,
    }


def fit(questions: Sequence[Mapping], features: Sequence[str], l2: float = L2) -> dict:
    """The combiner fitted on a calibration's questions, with its training hash and a CV estimate."""
    features = list(features)
    if SIGNAL in features:
        raise CombinerError(f"the combiner cannot read its own score {SIGNAL!r} as a feature")
    rows = training_rows(questions, features)
    n_answer = sum(r["label"] == "answer" for r in rows)
    if n_answer < 2 or len(rows) - n_answer < 2:
        raise CombinerError(
            f"cannot fit the answerability combiner: {n_answer} should-answer and {len(rows) - n_answer} "
            f"should-decline questions have all of {features} (need at least 2 of each)"
        )
    x = np.array([r["x"] for r in rows], float)
    y = np.array([r["label"] == "answer" for r in rows])
    return {
        "format": FORMAT,
        "features": features,
        **fit_arrays(x, y, l2),
        "l2": l2,
        "solver": SOLVER,
        "training": {
            "sha256": training_hash(rows, features),
            "n": {"answer": n_answer, "decline": len(rows) - n_answer},
            "left_out": len(questions) - len(rows),
        },
        "cross_validated": cross_validate(rows, l2=l2),
    }


# --------------------------------------------------------------------------- using


def score(model: Mapping, signals: Mapping) -> float | None:
    """The combined probability for one retrieval's signals; None when a feature is missing."""
    values = [signals.get(f) for f in model["features"]]
    if any(v is None or not math.isfinite(v) for v in values):
        return None
    return float(probabilities(model, np.array([values], float))[0])


def write(model: Mapping, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(model, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    return path


def load(path: str | Path, features: Sequence[str]) -> dict:
    """The accepted combiner, checked against the features the config lists (CombinerError if not)."""
    path = Path(path)
    refit = "fit one with `sourcegate calibrate` and accept it with `sourcegate accept`"
    if not path.is_file():
        raise CombinerError(f"answerability.combiner: {path} not found; {refit} (or set answerability.combiner: null)")
    try:
        model = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise CombinerError(f"answerability.combiner: {path} is not readable JSON ({exc}); {refit}") from None
    if not isinstance(model, dict) or model.get("format") != FORMAT:
        raise CombinerError(f"answerability.combiner: {path} is not a {FORMAT} file; {refit}")
    if model.get("features") != list(features):
        raise CombinerError(
            f"answerability.combiner: {path} was fitted on {model.get('features')}, but answerability.features "
            f"lists {list(features)}; {refit}"
        )
    n = len(features)
    if any(not isinstance(model.get(key), list) or len(model[key]) != n for key in ("mean", "scale", "coef")) or not (
        isinstance(model.get("intercept"), float | int)
    ):
        raise CombinerError(f"answerability.combiner: {path} does not hold {n} means, scales and coefficients; {refit}")
    return model


def describe(model: Mapping | None, path: str | Path | None, refit: bool) -> dict | None:
    """What calibration.json records about the combiner a sweep used (None: none configured)."""
    if model is None:
        return None
    return {
        "path": str(path) if path else None,
        "sha256": sha256_file(path) if path and Path(path).is_file() else None,
        "refit": refit,  # True: fitted by this calibration (written beside it), not the accepted one
        **{k: model[k] for k in ("features", "mean", "scale", "coef", "intercept", "l2", "training")},
        "cross_validated": model.get("cross_validated"),
    }


def before_sweep(retriever, cfg: PipelineConfig, out_dir: str | Path, refit: bool):
    """The evaluation harness's hook: what calibration.json records about the combiner.

    A night (`refit` False) records the accepted combiner its `answerability` was scored with.
    `sourcegate calibrate` (`refit` True) fits a candidate on these very questions, writes it
    beside the calibration (answerability_combiner.json; only `sourcegate accept` adopts it),
    rescores `answerability` with it and has the rest of the evaluation use it.
    """

    def hook(records: list[dict]) -> dict | None:
        path = cfg.answerability.combiner
        if refit and records:
            retriever.combiner = fit(records, cfg.answerability.features)
            path = write(retriever.combiner, Path(out_dir) / "answerability_combiner.json")
            for r in records:
                r["signals"][SIGNAL] = score(retriever.combiner, r["signals"])
        return describe(getattr(retriever, "combiner", None), path, refit)

    return hook
