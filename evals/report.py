"""report.html: one self-contained page a maintainer reads before a release.

Inline CSS and hand-made inline SVG only: no scripts, no external URLs, so the
file opens the same from an artifact store, a mail attachment or the Airflow UI.
Every piece of question, corpus or config text goes through `esc`.
"""

from __future__ import annotations

import html
import math
import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from pipelines.io import write_text

MAX_ROWS = 100  # per question table; the JSON artifacts hold the rest
MAX_DOTS = 600  # per label and plot: enough to see a distribution, small enough to render
PALETTE = ((247, 251, 255), (107, 174, 214), (8, 48, 107))  # heatmap colours for 0, 0.5, 1

CSS = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;color:#1a202c;margin:0;background:#f7fafc}
main{max-width:1240px;margin:0 auto;padding:16px 20px 40px}
h1{font-size:22px;margin:8px 0}
h2{font-size:18px;margin:28px 0 8px;border-bottom:1px solid #cbd5e0;padding-bottom:4px}
h3{font-size:15px;margin:0 0 6px}
.banner{padding:14px 18px;border-radius:6px;color:#fff;margin:12px 0}
.banner.pass{background:#2f855a}.banner.fail{background:#c53030}
.banner strong{font-size:20px}.banner ul{margin:6px 0 0 18px;padding:0}
.card{background:#fff;border:1px solid #e2e8f0;border-radius:6px;padding:12px 14px;margin:10px 0}
.row{display:flex;flex-wrap:wrap;gap:12px;align-items:flex-start}
.verdict{font-weight:600}.good{color:#2f855a}.bad{color:#c53030}.muted{color:#718096}
.warn{color:#b7791f}
table{border-collapse:collapse;background:#fff;margin:6px 0}
th,td{border:1px solid #e2e8f0;padding:3px 8px;text-align:left;vertical-align:top}
th{background:#edf2f7}td.num{text-align:right;font-variant-numeric:tabular-nums}
svg.plot{background:#fff;font-size:11px}
svg .answer{fill:#2b6cb0;fill-opacity:.55}svg .decline{fill:#dd6b20;fill-opacity:.55}
svg .answer-line{stroke:#2b6cb0;fill:none;stroke-width:2}svg .decline-line{stroke:#dd6b20;fill:none;stroke-width:2}
svg .band{stroke:#4a5568;stroke-width:1.5}
svg .gap{fill:#c6f6d5}svg .overlap{fill:#fed7d7}svg .keep-region{fill:#ebf8ff}
svg .recommended{stroke:#2f855a;stroke-width:2;stroke-dasharray:5 3}
svg .shipped{stroke:#1a202c;stroke-width:2}
svg .axis{stroke:#a0aec0}svg .grid{stroke:#edf2f7}
svg .full-coverage{fill:none;stroke:#38a169;stroke-width:1}
svg .fused{fill:#a0aec0}svg .reranked{fill:#6b46c1}
svg text{fill:#2d3748}svg text.small{font-size:10px}
"""


# --------------------------------------------------------------------------- text


def esc(value: Any) -> str:
    return html.escape("" if value is None else str(value), quote=True)


def _num(x: Any, digits: int = 3) -> str:
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "n/a"
    return f"{x:.{digits}g}" if isinstance(x, float) else str(x)


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.1%}"


def _table(
    headers: Sequence[str], rows: Iterable[Sequence[str]], numeric: Sequence[int] = (), limit: int | None = None
) -> str:
    """HTML table; cells are already-escaped HTML. Past `limit` rows, says how many were left out."""
    rows = list(rows)
    more = len(rows) - limit if limit is not None and len(rows) > limit else 0
    rows = rows[:limit] if more else rows
    note = f'<p class="muted">… and {more} more (see the JSON artifact).</p>' if more else ""
    head = "".join(f"<th>{esc(h)}</th>" for h in headers)
    body = "".join(
        "<tr>"
        + "".join(f'<td class="num">{c}</td>' if i in numeric else f"<td>{c}</td>" for i, c in enumerate(row))
        + "</tr>"
        for row in rows
    )
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>{note}"


# --------------------------------------------------------------------------- svg primitives


def _scale(d0: float, d1: float, r0: float, r1: float):
    span = (d1 - d0) or 1.0
    return lambda v: r0 + (v - d0) / span * (r1 - r0)


def _domain(values: Iterable[float]) -> tuple[float, float]:
    vals = [v for v in values if v is not None and math.isfinite(v)]
    if not vals:
        return 0.0, 1.0
    lo, hi = min(vals), max(vals)
    pad = (hi - lo) * 0.05 or 0.5
    return lo - pad, hi + pad


def _ticks(lo: float, hi: float, n: int = 6) -> list[float]:
    """Round-numbered ticks inside [lo, hi]."""
    raw = (hi - lo) / n
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 5, 10) if raw <= m * mag)
    start = math.ceil(lo / step) * step
    return [round(t, 12) for t in np.arange(start, hi + step * 1e-9, step)]


def _svg(width: int, height: int, kind: str, label: str, body: Iterable[str]) -> str:
    return (
        f'<svg class="plot {kind}" width="{width}" height="{height}" viewBox="0 0 {width} {height}" '
        f'role="img" aria-label="{esc(label)}">' + "".join(body) + "</svg>"
    )


def _line(x1: float, y1: float, x2: float, y2: float, cls: str) -> str:
    return f'<line class="{cls}" x1="{x1:.1f}" y1="{y1:.1f}" x2="{x2:.1f}" y2="{y2:.1f}"/>'


def _text(x: float, y: float, text: str, anchor: str = "start", cls: str = "") -> str:
    klass = f' class="{cls}"' if cls else ""
    return f'<text{klass} x="{x:.1f}" y="{y:.1f}" text-anchor="{anchor}">{esc(text)}</text>'


def _rect(x: float, y: float, w: float, h: float, cls: str = "", fill: str = "", title: str = "") -> str:
    attrs = (f' class="{cls}"' if cls else "") + (f' fill="{fill}"' if fill else "")
    tip = f"<title>{esc(title)}</title>" if title else ""
    return f'<rect{attrs} x="{x:.1f}" y="{y:.1f}" width="{max(w, 0):.1f}" height="{max(h, 0):.1f}">{tip}</rect>'


def _x_axis(sx, lo: float, hi: float, y: float, x0: float, x1: float) -> list[str]:
    out = [_line(x0, y, x1, y, "axis")]
    for t in _ticks(lo, hi):
        out += [_line(sx(t), y, sx(t), y + 4, "axis"), _text(sx(t), y + 15, _num(t), "middle", "small")]
    return out


def _thinned(values: Sequence[float], limit: int = MAX_DOTS) -> np.ndarray:
    """Evenly spaced order statistics: keeps the shape and both extremes."""
    vals = np.sort(np.asarray(values, dtype=float))
    if len(vals) <= limit:
        return vals
    return vals[np.linspace(0, len(vals) - 1, limit).round().astype(int)]


def _jitter(n: int, amplitude: float, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).uniform(-amplitude, amplitude, n)


def _marker(
    sx, value: float | None, top: float, bottom: float, cls: str, label: str, label_y: float, width: float
) -> list[str]:
    if value is None:
        return []
    x = sx(value)
    anchor, dx = ("end", -4) if x > width * 0.75 else ("start", 4)
    return [_line(x, top, x, bottom, cls), _text(x + dx, label_y, f"{label} {_num(value)}", anchor, "small")]


# --------------------------------------------------------------------------- plots


def strip_plot(
    name: str, result: Mapping, answer: Sequence[float], decline: Sequence[float], shipped: float | None = None
) -> str:
    """Should-answer and should-decline scores side by side, gap and thresholds marked."""
    width, height, left, right = 600, 180, 110, 16
    rows = {"should-answer": (62, answer, "answer"), "should-decline": (118, decline, "decline")}
    recommended = result.get("recommended_threshold")
    lo, hi = _domain([*answer, *decline, recommended, shipped])
    sx = _scale(lo, hi, left, width - right)
    answer_min, decline_max = result["answer_band"][0], result["decline_band"][1]
    body = []
    # Shade the gap (green) or, when the labels overlap, the overlap (red).
    lo_edge, hi_edge = sorted((answer_min, decline_max))
    kind = "gap" if result["has_gap"] else "overlap"
    label = f"{kind} {_num(abs(result['gap']))}"
    body += [
        _rect(sx(lo_edge), 36, sx(hi_edge) - sx(lo_edge), 108, kind, title=label),
        _text((sx(lo_edge) + sx(hi_edge)) / 2, 172, label, "middle", "small"),
    ]
    for label, (y, values, cls) in rows.items():
        band = result["answer_band"] if cls == "answer" else result["decline_band"]
        body += [
            _text(left - 8, y + 4, label, "end"),
            _line(sx(band[0]), y + 20, sx(band[1]), y + 20, "band"),
            _line(sx(band[0]), y + 16, sx(band[0]), y + 24, "band"),
            _line(sx(band[1]), y + 16, sx(band[1]), y + 24, "band"),
        ]
        dots = _thinned(values)
        body += [
            f'<circle class="{cls}" cx="{sx(v):.1f}" cy="{y + j:.1f}" r="3"/>'
            for v, j in zip(dots, _jitter(len(dots), 11))
        ]
    body += _marker(sx, recommended, 30, 146, "recommended", "recommended", 14, width)
    body += _marker(sx, shipped, 30, 146, "shipped", "shipped", 27, width)
    body += _x_axis(sx, lo, hi, 150, left, width - right)
    return _svg(width, height, "strip", f"{name} scores by label", body)


def sweep_plot(name: str, sweep: Mapping, recommended: float | None, shipped: float | None = None) -> str:
    """Should-answer coverage and should-decline recall at every threshold."""
    width, height, left, right, top, bottom = 420, 178, 40, 12, 24, 146
    t = sweep["thresholds"]
    lo, hi = _domain([*t, recommended, shipped])
    sx, sy = _scale(lo, hi, left, width - right), _scale(0.0, 1.0, bottom, top)
    body = [_line(left, sy(v), width - right, sy(v), "grid") for v in (0.25, 0.5, 0.75, 1.0)]
    body += [_text(left - 4, sy(v) + 4, f"{v:.0%}", "end", "small") for v in (0.0, 0.5, 1.0)]
    for key, cls in (("kept", "answer-line"), ("declined", "decline-line")):
        points = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in zip(t, sweep[key]) if y is not None)
        body.append(f'<polyline class="{cls}" points="{points}"/>')
    body += _marker(sx, recommended, top, bottom, "recommended", "recommended", 12, width)
    body += _marker(sx, shipped, top, bottom, "shipped", "shipped", 22, width)
    body += _x_axis(sx, lo, hi, bottom, left, width - right)
    body += [
        _line(left + 4, 170, left + 20, 170, "answer-line"),
        _text(left + 24, 173, "should-answer kept"),
        _line(left + 150, 170, left + 166, 170, "decline-line"),
        _text(left + 170, 173, "should-decline declined"),
    ]
    return _svg(width, height, "sweep", f"{name} threshold sweep", body)


def _color(value: float | None) -> str:
    if value is None:
        return "#e2e8f0"
    v = min(max(value, 0.0), 1.0) * (len(PALETTE) - 1)
    i = min(int(v), len(PALETTE) - 2)
    f = v - i
    rgb = [round(a + (b - a) * f) for a, b in zip(PALETTE[i], PALETTE[i + 1])]
    return "#{:02x}{:02x}{:02x}".format(*tuple(rgb))


def heatmap(pair: Mapping, key: str, title: str) -> str:
    """One panel of the 2-D sweep: value at (x >= a, y >= b) on a quantile grid."""
    grid = pair["heatmap"]
    gx, gy, values = grid["x_thresholds"], grid["y_thresholds"], grid[key]
    size, left, top = 260, 58, 26
    cw, ch = size / len(gx), size / len(gy)
    body = [_text(left, 14, title)]
    for i, a in enumerate(gx):
        for j, b in enumerate(gy):
            v = values[i][j]
            body.append(
                _rect(
                    left + i * cw,
                    top + size - (j + 1) * ch,
                    cw + 0.3,
                    ch + 0.3,
                    fill=_color(v),
                    title=f"{pair['x']} >= {_num(a)}, {pair['y']} >= {_num(b)}: {_pct(v)}",
                )
            )
    # Outline the threshold pairs that keep every should-answer question.
    for i in range(len(gx)):
        for j in range(len(gy)):
            if grid["coverage"][i][j] == 1.0:
                body.append(
                    f'<rect class="full-coverage" x="{left + i * cw:.1f}" '
                    f'y="{top + size - (j + 1) * ch:.1f}" width="{cw:.1f}" height="{ch:.1f}"/>'
                )
    for k in range(11):  # colour legend 0% .. 100%
        body.append(_rect(left + size + 8, top + size - (k + 1) * size / 11, 10, size / 11 + 0.3, fill=_color(k / 10)))
    body += [
        _text(left + size + 22, top + 8, "100%", cls="small"),
        _text(left + size + 22, top + size, "0%", cls="small"),
    ]
    rec = pair["recommended"]
    mx = left + (np.interp(rec[pair["x"]], gx, np.arange(len(gx))) + 0.5) * cw
    my = top + size - (np.interp(rec[pair["y"]], gy, np.arange(len(gy))) + 0.5) * ch
    body += [f'<circle cx="{mx:.1f}" cy="{my:.1f}" r="6" fill="none" stroke="#e53e3e" stroke-width="2.5"/>']
    for i in sorted({0, len(gx) // 2, len(gx) - 1}):
        body.append(_text(left + (i + 0.5) * cw, top + size + 14, _num(gx[i]), "middle", "small"))
    for j in sorted({0, len(gy) // 2, len(gy) - 1}):
        body.append(_text(left - 4, top + size - (j + 0.5) * ch + 4, _num(gy[j]), "end", "small"))
    body += [
        _text(left + size / 2, top + size + 30, f"{pair['x']} threshold", "middle"),
        f'<text x="14" y="{top + size / 2:.0f}" text-anchor="middle" '
        f'transform="rotate(-90 14 {top + size / 2:.0f})">{esc(pair["y"])} threshold</text>',
    ]
    return _svg(left + size + 52, top + size + 40, "heatmap", title, body)


def pair_scatter(pair: Mapping, points: Sequence[tuple[float, float, str]]) -> str:
    """Questions in the plane of the two signals, the recommended keep-region shaded."""
    width, height, left, top, right, bottom = 400, 326, 56, 26, 12, 286
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    rec = pair["recommended"]
    (x0, x1), (y0, y1) = _domain([*xs, rec[pair["x"]]]), _domain([*ys, rec[pair["y"]]])
    sx, sy = _scale(x0, x1, left, width - right), _scale(y0, y1, bottom, top)
    ax, ay = sx(rec[pair["x"]]), sy(rec[pair["y"]])
    body = [_text(left, 14, "shaded = answered"), _rect(ax, top, width - right - ax, ay - top, "keep-region")]
    for cls in ("decline", "answer"):
        chosen = [p for p in points if p[2] == cls]
        if len(chosen) > MAX_DOTS:
            chosen = [chosen[i] for i in np.linspace(0, len(chosen) - 1, MAX_DOTS).round().astype(int)]
        body += [f'<circle class="{cls}" cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="3"/>' for x, y, _ in chosen]
    body += [_line(ax, top, ax, bottom, "recommended"), _line(left, ay, width - right, ay, "recommended")]
    body += _x_axis(sx, x0, x1, bottom, left, width - right)
    mid = (top + bottom) / 2
    body += [
        _text(left + (width - left) / 2, height - 6, pair["x"], "middle"),
        _line(left, top, left, bottom, "axis"),
        f'<text x="12" y="{mid:.0f}" text-anchor="middle" transform="rotate(-90 12 {mid:.0f})">{esc(pair["y"])}</text>',
        f'<circle class="answer" cx="{width - 150}" cy="9" r="4"/>',
        _text(width - 143, 13, "answer", cls="small"),
        f'<circle class="decline" cx="{width - 80}" cy="9" r="4"/>',
        _text(width - 73, 13, "decline", cls="small"),
    ]
    for t in _ticks(y0, y1):
        body.append(_text(left - 4, sy(t) + 4, _num(t), "end", "small"))
    return _svg(width, height, "scatter", f"{pair['x']} against {pair['y']}", body)


def bar_chart(precision: Mapping, metric: str) -> str:
    """Fused vs reranked value of one metric, overall and per kind."""
    groups = [("overall", precision["overall"])] + list(precision["by_kind"].items())
    left, top, bottom, group_w = 40, 26, 186, 96
    width, height = left + group_w * len(groups) + 16, 232
    sy = _scale(0.0, 1.0, bottom, top)
    body = [_text(left, 14, f"{metric}: fused (grey) vs reranked (purple)")]
    body += [_line(left, sy(v), width - 10, sy(v), "grid") for v in (0.25, 0.5, 0.75, 1.0)]
    body += [_text(left - 4, sy(v) + 4, f"{v:.0%}", "end", "small") for v in (0.0, 0.5, 1.0)]
    for g, (name, stats) in enumerate(groups):
        x = left + g * group_w + 12
        for s, system in enumerate(("fused", "reranked")):
            v = stats[system][metric] or 0.0
            bx = x + s * 34
            body += [
                _rect(bx, sy(v), 30, bottom - sy(v), system, title=f"{name} {system} {metric} {v:.3f}"),
                _text(bx + 15, sy(v) - 3, f"{v:.2f}", "middle", "small"),
            ]
        label = name if len(str(name)) <= 14 else str(name)[:13] + "…"
        body.append(_text(x + 32, bottom + 14, label, "middle", "small"))
    body.append(_line(left, bottom, width - 10, bottom, "axis"))
    return _svg(width, height, "bars", f"{metric} before and after reranking", body)


# --------------------------------------------------------------------------- sections


def _banner(gate: Mapping) -> str:
    if gate.get("passed"):
        return (
            '<div class="banner pass"><strong>PASSED</strong> — this index version may be promoted.'
            f" Gating signal: {esc(gate.get('gating_signal'))}.</div>"
        )
    reasons = "".join(f"<li>{esc(r)}</li>" for r in gate.get("reasons", []))
    return (
        '<div class="banner fail"><strong>FAILED</strong> — this index version must not be promoted.'
        f"<ul>{reasons}</ul></div>"
    )


def _checks(gate: Mapping) -> str:
    rows = [
        (
            f'<span class="{"good" if c["passed"] else "bad"}">{"pass" if c["passed"] else "FAIL"}</span>',
            esc(c["name"]),
            esc(c["detail"]),
        )
        for c in gate.get("checks", [])
    ]
    return "<h2>Gate checks</h2>" + _table(["", "check", "detail"], rows)


def _scores_by_label(calibration: Mapping, name: str) -> tuple[list[float], list[float]]:
    answer, decline = [], []
    for q in calibration.get("questions", ()):
        v = q["signals"].get(name)
        if v is not None:
            (answer if q["label"] == "answer" else decline).append(v)
    return answer, decline


def _signal_summary(calibration: Mapping) -> str:
    rows = []
    for name, r in calibration["signals"].items():
        if r.get("skipped"):
            rows.append((esc(name), f'<span class="muted">{esc(r["note"])}</span>', "", "", "", "", "", ""))
            continue
        cls = "good" if r["has_gap"] else ("warn" if r["discriminates"] else "bad")
        band = lambda b: "n/a" if b is None else f"{_num(b[0])} – {_num(b[1])}"
        rows.append(
            (
                esc(name),
                f'<span class="{cls}">{esc(r["verdict"])}</span>',
                _num(r["auc"]),
                band(r["answer_band"]),
                band(r["decline_band"]),
                _num(r["gap"]),
                _gap_without(r.get("fragility")),
                _bound(r.get("promise")),
                _num(r["recommended_threshold"]),
            )
        )
    return _table(
        [
            "signal",
            "verdict",
            "AUC",
            "should-answer band",
            "should-decline band",
            "gap",
            "gap without 1 / 2 / 3 extremes per side",
            "new should-answer kept ≥",
            "recommended",
        ],
        rows,
        numeric=(2, 5, 6, 7, 8),
    )


def _gap_without(fragile: Mapping | None) -> str:
    if not fragile:
        return "n/a"
    return " / ".join(_num(g) for g in fragile["gap_without"].values())


def _bound(promised: Mapping | None) -> str:
    if not promised or promised.get("keep_new_answer") is None:
        return "n/a"
    return f"{promised['keep_new_answer']:.3f} (n={promised['n_answer']}; {promised['n_needed']} needed)"


def _promise_text(r: Mapping) -> str:
    """What the gap promises and how much it rests on single questions, in words."""
    promised, fragile = r.get("promise"), r.get("fragility")
    if not promised or not fragile:
        return ""
    text = (
        f"By exchangeability alone, a new should-answer question of these kinds scores at or above the lowest of "
        f"these {promised['n_answer']} with probability ≥ {promised['keep_new_answer']:.3f} (n/(n+1)); claiming "
        f"{promised['coverage']:.0%} kept at {promised['confidence']:.0%} confidence needs "
        f"{promised['n_needed']} should-answer questions, all kept — this set has {promised['n_answer']}. "
        f"Gap after removing the 1, 2, 3 most extreme questions per side: {esc(_gap_without(fragile))}. "
    )
    deciding = fragile["deciding"]
    if fragile["gap"] > 0:
        text += (
            f"The gap is set by {esc(', '.join(deciding['answer']))} (lowest should-answer) and "
            f"{esc(', '.join(deciding['decline']))} (highest should-decline); one mislabelled question past "
            "either edge would close it."
        )
    elif fragile["to_open"] is not None:
        text += (
            f"Removing {fragile['to_open']} question(s) would open a gap: "
            f"{esc(', '.join(fragile['opening'][:20]))}{' …' if len(fragile['opening']) > 20 else ''}."
        )
    flag = '<p class="bad"><strong>Decided by one question.</strong></p>' if fragile["one_question"] else ""
    return f'<p class="promise">{text}</p>{flag}'


def _signal_card(calibration: Mapping, name: str, r: Mapping) -> str:
    if r.get("skipped"):
        return f'<div class="card"><h3>{esc(name)}</h3><p class="muted">{esc(r["note"])}</p></div>'
    if r.get("gap") is None:
        return f'<div class="card"><h3>{esc(name)}</h3><p class="bad">{esc(r["verdict"])}</p></div>'
    shipped_info = calibration.get("shipped") or {}
    shipped = shipped_info.get("threshold") if shipped_info.get("signal") == name else None
    answer, decline = _scores_by_label(calibration, name)
    if not answer and not decline:  # artifact without per-question rows: draw the bands alone
        answer, decline = r["answer_band"], r["decline_band"]
    cls = "good" if r["has_gap"] else ("warn" if r["discriminates"] else "bad")
    position = (
        ""
        if r["position_in_gap"] is None
        else f", {r['position_in_gap']:.0%} of the way from the should-answer min to the should-decline max"
    )
    warnings = "".join(f'<li class="warn">{esc(w)}</li>' for w in r["warnings"])
    facts = (
        f"AUC {_num(r['auc'])} · should-answer band {_num(r['answer_band'][0])} – "
        f"{_num(r['answer_band'][1])} (n={r['n']['answer']}) · should-decline band "
        f"{_num(r['decline_band'][0])} – {_num(r['decline_band'][1])} (n={r['n']['decline']}) · "
        "recommended threshold "
        f"{_num(r['recommended_threshold'], 4)} ({esc(r.get('placement', ''))}{position}) declines "
        f"{_pct(r['decline_recall_at_recommended'])} of should-decline"
    )
    return (
        f'<div class="card signal" id="signal-{esc(name)}"><h3>{esc(name)}'
        f"{' (gating signal)' if shipped is not None else ''}</h3>"
        f'<p class="verdict {cls}">{esc(r["verdict"])}</p><p>{facts}</p>{_promise_text(r)}'
        f"{'<ul>' + warnings + '</ul>' if warnings else ''}"
        f'<div class="row">{strip_plot(name, r, answer, decline, shipped)}'
        f"{sweep_plot(name, r['sweep'], r['recommended_threshold'], shipped)}</div></div>"
    )


def _pair_section(calibration: Mapping) -> str:
    pair = calibration.get("pair")
    if not pair:
        return ""
    title = f"<h2>Two signals together: {esc(pair['x'])} × {esc(pair['y'])}</h2>"
    if pair.get("skipped") or not pair.get("recommended"):
        return title + f'<p class="muted">{esc(pair.get("note") or pair.get("verdict"))}</p>'
    points = [
        (q["signals"][pair["x"]], q["signals"][pair["y"]], q["label"])
        for q in calibration.get("questions", ())
        if q["signals"].get(pair["x"]) is not None and q["signals"].get(pair["y"]) is not None
    ]
    rec = pair["recommended"]
    text = (
        f'<p class="verdict {"good" if pair["separates"] else "warn"}">{esc(pair["verdict"])}</p>'
        f"<p>Answer when {esc(pair['x'])} ≥ {_num(rec[pair['x']], 4)} and {esc(pair['y'])} ≥ "
        f"{_num(rec[pair['y']], 4)} (red circle on the maps): keeps 100% of should-answer, declines "
        f"{_pct(pair['decline_recall_at_recommended'])} of should-decline. The maps show every threshold "
        "pair on a grid at quantiles of each signal; pairs that keep every should-answer question are "
        "outlined green.</p>"
    )
    plots = (
        heatmap(pair, "coverage", "should-answer kept")
        + heatmap(pair, "decline_recall", "should-decline declined")
        + (pair_scatter(pair, points) if points else "")
    )
    return title + f'<div class="card">{text}<div class="row">{plots}</div></div>'


def _shipped_section(calibration: Mapping) -> str:
    s = calibration.get("shipped")
    if not s:
        return ""
    head = (
        f"<h2>Shipped threshold: {esc(s['signal'])} ≥ {_num(s['threshold'], 4)}</h2>"
        f"<p>Keeps {_pct(s['coverage'])} of should-answer and declines {_pct(s['decline_recall'])} of "
        f"should-decline. The highest threshold that keeps every should-answer question is "
        f"{_num(s['max_threshold_for_full_coverage'], 6)}.</p>"
    )
    wd = (
        _table(
            ["id", "question", "score", "fix"],
            [(esc(q["id"]), esc(q["question"]), _num(q["score"], 4), esc(q["fix"])) for q in s["wrongly_declined"]],
            numeric=(2,),
            limit=MAX_ROWS,
        )
        if s["wrongly_declined"]
        else '<p class="good">None.</p>'
    )
    wa = (
        _table(
            ["id", "question", "score"],
            [(esc(q["id"]), esc(q["question"]), _num(q["score"], 4)) for q in s["wrongly_answered"]],
            numeric=(2,),
            limit=MAX_ROWS,
        )
        if s["wrongly_answered"]
        else '<p class="good">None.</p>'
    )
    unscored = f'<p class="warn">No score for: {esc(", ".join(s["unscored"]))}</p>' if s["unscored"] else ""
    by_kind = s.get("decline_recall_by_kind") or {}
    kinds = (
        _table(
            ["should-decline kind", "declined", "of", "recall"],
            [(esc(k), str(v["declined"]), str(v["n"]), _pct(v["recall"])) for k, v in by_kind.items()],
            numeric=(1, 2, 3),
        )
        if by_kind
        else ""
    )
    gating = calibration.get("gating") or {}
    scope = gating.get("decline_kinds")
    kinds += _gating_gap(gating)
    if scope and scope != "all":
        kinds += (
            f"<p>The gap check holds the kinds {esc(', '.join(scope))} to the gap; the others are "
            f"reported here and held to their accepted decline recall.</p>"
        )
    return (
        head + kinds + f'<div class="card"><h3>Wrongly declined (should-answer below the threshold)</h3>{wd}'
        f"<h3>Wrongly answered (should-decline at or above the threshold)</h3>{wa}{unscored}</div>"
    )


def _gating_gap(gating: Mapping) -> str:
    """The gap the gate holds the gating signal to, with what it promises."""
    r = gating.get("result")
    if not r or r.get("gap") is None:
        return ""
    scope = gating.get("decline_kinds")
    kinds = "all should-decline kinds" if scope in (None, "all") else "should-decline kinds " + ", ".join(scope)
    cls = "good" if r["has_gap"] else "bad"
    return (
        f'<div class="card gating"><h3>Gap the gate checks: {esc(r["name"])} on {esc(kinds)}</h3>'
        f'<p class="verdict {cls}">{esc(r["verdict"])}</p>'
        f"<p>should-answer band {_num(r['answer_band'][0], 4)} – {_num(r['answer_band'][1], 4)} "
        f"(n={r['n']['answer']}) · should-decline band {_num(r['decline_band'][0], 4)} – "
        f"{_num(r['decline_band'][1], 4)} (n={r['n']['decline']}) · gap {_num(r['gap'], 4)}</p>"
        f"{_promise_text(r)}</div>"
    )


def _precision_section(precision: Mapping | None) -> str:
    if not precision or not precision.get("overall"):
        return '<h2>Reranker precision</h2><p class="muted">No precision results.</p>'
    metrics = precision["metrics"]

    def cells(stats: Mapping) -> list[str]:
        out = []
        for m in metrics:
            d = stats["delta"][m]
            cls = "bad" if d < -1e-12 else ("good" if d > 1e-12 else "muted")
            out.append(f'{stats["fused"][m]:.3f} → {stats["reranked"][m]:.3f} <span class="{cls}">({d:+.3f})</span>')
        return out

    groups = [("overall", precision["overall"])] + list(precision["by_kind"].items())
    table = _table(["kind", "n", *metrics], [(esc(k), str(s["n"]), *cells(s)) for k, s in groups], numeric=(1,))
    charts = bar_chart(precision, "p@1") + bar_chart(precision, "mrr")
    losses = (
        _table(
            ["id", "kind", "question", "fused rank of first relevant", "reranked rank"],
            [
                (
                    esc(loss["id"]),
                    esc(loss["kind"]),
                    esc(loss.get("question", "")),
                    esc(loss["fused_rank_of_first_relevant"] or "none"),
                    esc(loss["reranked_rank_of_first_relevant"] or "none"),
                )
                for loss in precision["losses"]
            ],
            limit=MAX_ROWS,
        )
        if precision["losses"]
        else '<p class="good">None.</p>'
    )
    return (
        f'<h2>Reranker precision (n={precision["n"]})</h2><div class="card">{table}'
        f'<div class="row">{charts}</div>'
        f"<p>Reranking moved the first relevant passage up for {precision['wins']} questions, "
        f"down for {len(precision['losses'])}, and left {precision['ties']} unchanged.</p>"
        f"<h3>Where the reranker lost</h3>{losses}</div>"
    )


def _diff_section(diff: Mapping | None) -> str:
    """Per question, what changed since the live version this run would replace."""
    if not diff:
        return ""
    rows = [
        (
            esc(f"{r['set']}/{r['id']}"),
            esc(r["kind"]),
            esc(r["question"]),
            f"{_num(r['score_a'], 4)} → {_num(r['score_b'], 4)}",
            _num(r["delta"], 3),
            f'<span class="{"bad" if r["crossed"] else "muted"}">{esc(r["mode_a"] or "-")} → {esc(r["mode_b"] or "-")}</span>',
            f"{esc(r['rank_a'] or '-')} → {esc(r['rank_b'] or '-')}",
        )
        for r in diff["moved"]
    ]
    kinds = [
        (
            esc(kind),
            str(k["n"]),
            str(k["moved"]),
            str(k["crossed"]),
            f"{_num(k['mean_delta'], 3)} [{_num(k['min_delta'], 3)}, {_num(k['max_delta'], 3)}]",
        )
        for kind, k in diff["by_kind"].items()
    ]
    moved = (
        _table(
            ["question", "kind", "text", "gating score", "change", "mode", "labelled rank"],
            rows,
            numeric=(4,),
            limit=MAX_ROWS,
        )
        if rows
        else '<p class="good">No question moved.</p>'
    )
    return (
        f'<h2>Since the live version {esc(diff.get("live", ""))}</h2><div class="card diff">'
        f"<p>{len(diff['moved'])} of {diff['n']} questions moved; {len(diff['crossed'])} crossed a threshold "
        "(listed first).</p>"
        f"{moved}<h3>Shifts per kind</h3>"
        + _table(["set/kind", "n", "moved", "crossed", "score shift mean [min, max]"], kinds, numeric=(1, 2, 3))
        + "</div>"
    )


def _run_info(run_info: Mapping) -> str:
    def show(value: Any) -> str:
        if isinstance(value, Mapping):
            return "<br>".join(f"{esc(k)}: {show(v)}" for k, v in value.items())
        if isinstance(value, (list, tuple)):
            return esc(", ".join(map(str, value)))
        return esc(_num(value, 4) if isinstance(value, float) else value)

    return "<h2>Run</h2>" + _table(["", ""], [(esc(k), show(v)) for k, v in run_info.items()])


def render_report(
    calibration: Mapping, precision: Mapping | None, gate: Mapping, run_info: Mapping, diff: Mapping | None = None
) -> str:
    """The whole report as one HTML string."""
    run_id = run_info.get("run_id", "")
    n = calibration.get("n", {})
    signals = calibration.get("signals", {})
    cards = "".join(_signal_card(calibration, name, r) for name, r in signals.items())
    return (
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
        f"<title>sourcegate report {esc(run_id)}</title><style>{CSS}</style></head><body><main>"
        f"<h1>sourcegate calibration report {esc(run_id)}</h1>"
        f"{_banner(gate)}"
        f"<p>{n.get('answer', 0)} should-answer and {n.get('decline', 0)} should-decline questions. "
        "A question is answered when its score is at or above the threshold.</p>"
        f"{_checks(gate)}"
        f"<h2>Signals</h2>{_signal_summary(calibration)}{cards}"
        f"{_pair_section(calibration)}{_shipped_section(calibration)}"
        f"{_precision_section(precision)}{_diff_section(diff)}{_run_info(run_info)}"
        "</main></body></html>\n"
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
