"""Shipping a decision: what `sourcegate accept` does, and the only way a decision ships (the recalibrate DAG's
ship step calls the same function).

Accepting a run writes its per-question outcomes as the baseline the next nights are compared against. When the run's
decision (gating signal and threshold) is not the accepted one, its check set has judged a new decision and is worn:
its questions move into the fit set (logged in `evals.check_moves`), the next-check set becomes the check set
(sourcegate/evals/check_rotation.py) and the config file's `evals.check_set` is switched to it, so the next check is fresh;
with no next-check set, the check set keeps only what the decision never saw (a night refuses an empty one).
The config file is rewritten line by line (its comments kept) and only where it is what the run was configured
with: a check set given by `--set` is the caller's to write down.
"""

from __future__ import annotations

import json
import re
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from sourcegate.artifact_io import read_json, write_json, write_text
from sourcegate.evals.check_rotation import next_check, rotate
from sourcegate.evals.check_set import log_move, move_to_fit, seen_check_questions
from sourcegate.evals.evalset import load_evalset
from sourcegate.evals.regression import baseline_from
from sourcegate.pipelines import config as config_mod
from sourcegate.pipelines.config import PipelineConfig

PLAIN = re.compile(r"^[A-Za-z0-9_./-]+$")  # a value YAML reads back as the same string, unquoted


def _yaml_scalar(value: Any) -> str:
    if isinstance(value, str) and PLAIN.match(value) and yaml.safe_load(value) == value:
        return value
    return json.dumps(value)  # JSON scalars are YAML scalars


def with_value(text: str, dotted: str, value: Any) -> str:
    """The config file's text with `section.key` set to `value`: that one line rewritten, its comment kept."""
    section, key = dotted.split(".")
    lines = text.splitlines(keepends=True)
    start = next((i for i, line in enumerate(lines) if re.match(rf"^{re.escape(section)}:\s*(#.*)?$", line)), None)
    if start is None:
        raise ValueError(f"the config file has no section {section}: write {dotted} there")
    for i in range(start + 1, len(lines)):
        line = lines[i]
        if re.match(r"^\S", line) and not line.startswith("#"):
            break  # the next section
        found = re.match(rf"^(\s+{re.escape(key)}:\s*)([^#\r\n]*?)(\s+#[^\r\n]*)?(\r?\n)?$", line)
        if found:
            lines[i] = f"{found.group(1)}{_yaml_scalar(value)}{found.group(3) or ''}{found.group(4) or ''}"
            indent = len(line) - len(line.lstrip())
            end = i + 1  # the old value's continuation lines (a long scalar or list folded), not comments, go too
            while end < len(lines) and _continues(lines[end], indent):
                end += 1
            return "".join(lines[: i + 1] + lines[end:])
    raise ValueError(f"the config file's section {section} has no key {key}: write {dotted} there")


def _continues(line: str, indent: int) -> bool:
    body = line.strip()
    return bool(body) and not body.startswith("#") and len(line) - len(line.lstrip()) > indent


def planned(config_path: Path, values: Mapping[str, Any]) -> str:
    """The config file's text with `values` written, checked by the loader before anything is written: a key it
    cannot write or a value it would not take stops the caller here."""
    text = config_path.read_text(encoding="utf-8")
    for dotted, value in values.items():
        text = with_value(text, dotted, value)
    with tempfile.TemporaryDirectory(prefix="sourcegate-config-") as scratch:
        trial = Path(scratch) / config_path.name
        trial.write_text(text, encoding="utf-8")
        loaded = config_mod.load(trial)
    wrong = [k for k, v in values.items() if config_mod.get(loaded, k) != v]
    if wrong:
        raise ValueError(f"{config_path}: {', '.join(wrong)} would not read back as written")
    return text


def file_value(config_path: Path, dotted: str) -> Any:
    node: Any = yaml.safe_load(config_path.read_text(encoding="utf-8")) or {}
    for part in dotted.split("."):
        node = (node or {}).get(part) if isinstance(node, Mapping) else None
    return node


def same_path(a: str | Path | None, b: str | Path | None, root: Path) -> bool:
    if a is None or b is None:
        return a is b
    return (root / a).resolve() == (root / b).resolve()


def switch(config_path: Path | None, values: Mapping[str, Any]) -> list[str]:
    """Write `values` (dotted key -> value) into the config file, each line rewritten in place; the keys written."""
    if config_path is None or not values:
        return []
    write_text(planned(config_path, values), config_path)
    return list(values)


def accept_run(
    cfg: PipelineConfig,
    run: Path,
    source: str,
    out: Path,
    config_path: Path | None,
    root: Path,
    also: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Accept the run in folder `run` (named `source` in the records): the baseline written to `out`, and for a new
    decision the check set retired and the next one switched in (`config_path`, its relative paths against `root`;
    `also`: more config values the decision ships with, e.g. a retrained model's folder). Call it under the
    artifacts' writer lock. Everything is checked before the first file is written."""
    calibration = read_json(run / "calibration.json")
    baseline = baseline_from(read_json(run / "precision.json"), calibration, source)
    previous = read_json(out) if out.exists() else None
    seen = seen_check_questions(calibration, previous)
    check = Path(cfg.evals.check_set) if cfg.evals.check_set else None
    from_file = config_path is not None and same_path(file_value(config_path, "evals.check_set"), check, root)
    values = dict(also or {})
    moved = fresh = None
    if seen and check is not None and (fresh := next_check(check)) is not None:
        load_evalset(fresh)  # a broken next-check set is refused before anything moves
        if from_file:
            values["evals.check_set"] = str(Path(file_value(config_path, "evals.check_set")).parent / fresh.name)
    if values:  # the config edit is planned and loaded first: a key it cannot write stops accept here
        if config_path is None:
            raise ValueError(f"no config file to write {', '.join(values)} into")
        planned(config_path, values)
    if seen and check is not None:
        moved = move_to_fit(check, cfg.evals.calibration_set, seen)
        record = {"accepted_from": source, "threshold": baseline["threshold"], **moved}
        if fresh is not None:
            unseen = [q["id"] for q in load_evalset(check)] if moved["remaining"] else []
            carried = move_to_fit(check, fresh, unseen)["moved"] if unseen else []  # never scored: still fresh
            rotate(check, fresh, source)
            record |= {"next_check": str(fresh)} | ({"carried_to_next_check": carried} if carried else {})
        log_move(record | {"previous_threshold": (previous or {}).get("threshold")}, cfg.evals.check_moves)
        baseline["check_moved"] = record
    written = switch(config_path, values)
    write_json(baseline, out)
    return {
        "baseline": out,
        "moved": moved,
        "next_check": fresh,
        "config_written": written,
        "check_set_by_override": bool(fresh) and not from_file,
        "threshold": baseline["threshold"],
    }
