"""report.html: one self-contained page a maintainer reads before a release.

The page is templates/report.html.j2 (its style templates/report.css), rendered by Jinja2 with
autoescape on, so every piece of question, corpus or config text is escaped without a call per
value. Inline CSS and the inline SVG of sourcegate/evals/plots.py only: no scripts, no external URLs, so the
file opens the same from an artifact store, a mail attachment or the Airflow UI.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from jinja2 import Environment, FileSystemLoader, StrictUndefined

from sourcegate.artifact_io import write_text
from sourcegate.evals import plots
from sourcegate.evals.plots import num, pct

MAX_ROWS = 100  # per question table; the JSON artifacts hold the rest
TEMPLATES = Path(__file__).parent / "templates"


def band(b) -> str:
    return "n/a" if b is None else f"{num(b[0])} – {num(b[1])}"


def gap_without(fragile: Mapping | None) -> str:
    if not fragile:
        return "n/a"
    return " / ".join(num(g) for g in fragile["gap_without"].values())


def bound(promised: Mapping | None) -> str:
    if not promised or promised.get("keep_new_answer") is None:
        return "n/a"
    return f"{promised['keep_new_answer']:.3f} (n={promised['n_answer']}; {promised['n_needed']} needed)"


def scores_by_label(calibration: Mapping, name: str) -> tuple[list[float], list[float]]:
    answer, decline = [], []
    for q in calibration.get("questions", ()):
        v = q["signals"].get(name)
        if v is not None:
            (answer if q["label"] == "answer" else decline).append(v)
    return answer, decline


def pair_points(calibration: Mapping, pair: Mapping) -> list[tuple[float, float, str]]:
    """Each question with both signals of the pair, as (x, y, label)."""
    return [
        (q["signals"][pair["x"]], q["signals"][pair["y"]], q["label"])
        for q in calibration.get("questions", ())
        if q["signals"].get(pair["x"]) is not None and q["signals"].get(pair["y"]) is not None
    ]


def _environment() -> Environment:
    env = Environment(
        loader=FileSystemLoader(TEMPLATES),
        autoescape=True,
        undefined=StrictUndefined,  # a missing artifact field is an error, not an empty cell
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        finalize=lambda value: "" if value is None else value,
    )
    env.filters |= {"num": num, "pct": pct, "band": band, "fmt": format}
    env.globals |= {
        "gap_without": gap_without,
        "bound": bound,
        "scores_by_label": scores_by_label,
        "pair_points": pair_points,
        "strip_plot": plots.strip_plot,
        "sweep_plot": plots.sweep_plot,
        "heatmap": plots.heatmap,
        "pair_scatter": plots.pair_scatter,
        "bar_chart": plots.bar_chart,
    }
    return env


_ENV = _environment()


def render_report(
    calibration: Mapping, precision: Mapping | None, gate: Mapping, run_info: Mapping, diff: Mapping | None = None
) -> str:
    """The whole report as one HTML string."""
    return _ENV.get_template("report.html.j2").render(
        calibration=calibration, precision=precision, gate=gate, run_info=run_info, diff=diff, max_rows=MAX_ROWS
    )


def write_report(
    calibration: Mapping,
    precision: Mapping | None,
    gate: Mapping,
    run_info: Mapping,
    path: str | os.PathLike,
    diff: Mapping | None = None,
) -> Path:
    """Render and write report.html atomically."""
    return write_text(render_report(calibration, precision, gate, run_info, diff), path)
