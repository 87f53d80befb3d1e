"""The report's inline SVG plots: strip, sweep, heatmap, scatter and bar charts.

Hand-made SVG (no scripts, no external URLs) from score arrays. Every element is built with
markupsafe.Markup (what Jinja2 autoescaping uses): its arguments, labels and question text
included, are escaped by construction, and the result drops into a template as is.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
from markupsafe import Markup

MAX_DOTS = 600  # per label and plot: enough to see a distribution, small enough to render
PALETTE = ((247, 251, 255), (107, 174, 214), (8, 48, 107))  # heatmap colours for 0, 0.5, 1


# --------------------------------------------------------------------------- numbers as text


def num(x: Any, digits: int = 3) -> str:
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "n/a"
    return f"{x:.{digits}g}" if isinstance(x, float) else str(x)


def pct(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.1%}"


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


def _svg(width: int, height: int, kind: str, label: str, body: Iterable[Markup]) -> Markup:
    head = Markup('<svg class="plot {}" width="{}" height="{}" viewBox="0 0 {} {}" role="img" aria-label="{}">')
    return head.format(kind, width, height, width, height, label) + Markup("").join(body) + Markup("</svg>")


def _line(x1: float, y1: float, x2: float, y2: float, cls: str) -> Markup:
    return Markup('<line class="{}" x1="{:.1f}" y1="{:.1f}" x2="{:.1f}" y2="{:.1f}"/>').format(cls, x1, y1, x2, y2)


def _text(x: float, y: float, text: str, anchor: str = "start", cls: str = "", rotate: bool = False) -> Markup:
    """A label; `rotate`: turned 90° counter-clockwise about (x, y), for a y axis (coordinates rounded)."""
    if rotate:
        spec = '<text x="{0:.0f}" y="{1:.0f}" text-anchor="{2}" transform="rotate(-90 {0:.0f} {1:.0f})">{3}</text>'
        return Markup(spec).format(x, y, anchor, text)
    klass = Markup(' class="{}"').format(cls) if cls else ""
    return Markup('<text{} x="{:.1f}" y="{:.1f}" text-anchor="{}">{}</text>').format(klass, x, y, anchor, text)


def _rect(x: float, y: float, w: float, h: float, cls: str = "", fill: str = "", title: str = "") -> Markup:
    attrs = (Markup(' class="{}"').format(cls) if cls else Markup("")) + (
        Markup(' fill="{}"').format(fill) if fill else ""
    )
    tip = Markup("<title>{}</title>").format(title) if title else ""
    spec = '<rect{} x="{:.1f}" y="{:.1f}" width="{:.1f}" height="{:.1f}">{}</rect>'
    return Markup(spec).format(attrs, x, y, max(w, 0), max(h, 0), tip)


def _circle(cls: str, x: float, y: float, r: int = 3) -> Markup:
    return Markup('<circle class="{}" cx="{:.1f}" cy="{:.1f}" r="{}"/>').format(cls, x, y, r)


def _x_axis(sx, lo: float, hi: float, y: float, x0: float, x1: float) -> list[Markup]:
    out = [_line(x0, y, x1, y, "axis")]
    for t in _ticks(lo, hi):
        out += [_line(sx(t), y, sx(t), y + 4, "axis"), _text(sx(t), y + 15, num(t), "middle", "small")]
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
) -> list[Markup]:
    if value is None:
        return []
    x = sx(value)
    anchor, dx = ("end", -4) if x > width * 0.75 else ("start", 4)
    return [_line(x, top, x, bottom, cls), _text(x + dx, label_y, f"{label} {num(value)}", anchor, "small")]


# --------------------------------------------------------------------------- plots


def strip_plot(
    name: str, result: Mapping, answer: Sequence[float], decline: Sequence[float], shipped: float | None = None
) -> Markup:
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
    label = f"{kind} {num(abs(result['gap']))}"
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
        body += [_circle(cls, sx(v), y + j) for v, j in zip(dots, _jitter(len(dots), 11))]
    body += _marker(sx, recommended, 30, 146, "recommended", "recommended", 14, width)
    body += _marker(sx, shipped, 30, 146, "shipped", "shipped", 27, width)
    body += _x_axis(sx, lo, hi, 150, left, width - right)
    return _svg(width, height, "strip", f"{name} scores by label", body)


def sweep_plot(name: str, sweep: Mapping, recommended: float | None, shipped: float | None = None) -> Markup:
    """Should-answer coverage and should-decline recall at every threshold."""
    width, height, left, right, top, bottom = 420, 178, 40, 12, 24, 146
    t = sweep["thresholds"]
    lo, hi = _domain([*t, recommended, shipped])
    sx, sy = _scale(lo, hi, left, width - right), _scale(0.0, 1.0, bottom, top)
    body = [_line(left, sy(v), width - right, sy(v), "grid") for v in (0.25, 0.5, 0.75, 1.0)]
    body += [_text(left - 4, sy(v) + 4, f"{v:.0%}", "end", "small") for v in (0.0, 0.5, 1.0)]
    for key, cls in (("kept", "answer-line"), ("declined", "decline-line")):
        points = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in zip(t, sweep[key]) if y is not None)
        body.append(Markup('<polyline class="{}" points="{}"/>').format(cls, points))
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


def heatmap(pair: Mapping, key: str, title: str) -> Markup:
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
                    title=f"{pair['x']} >= {num(a)}, {pair['y']} >= {num(b)}: {pct(v)}",
                )
            )
    # Outline the threshold pairs that keep every should-answer question.
    for i in range(len(gx)):
        for j in range(len(gy)):
            if grid["coverage"][i][j] == 1.0:
                spec = '<rect class="full-coverage" x="{:.1f}" y="{:.1f}" width="{:.1f}" height="{:.1f}"/>'
                body.append(Markup(spec).format(left + i * cw, top + size - (j + 1) * ch, cw, ch))
    for k in range(11):  # colour legend 0% .. 100%
        body.append(_rect(left + size + 8, top + size - (k + 1) * size / 11, 10, size / 11 + 0.3, fill=_color(k / 10)))
    body += [
        _text(left + size + 22, top + 8, "100%", cls="small"),
        _text(left + size + 22, top + size, "0%", cls="small"),
    ]
    rec = pair["recommended"]
    mx = left + (np.interp(rec[pair["x"]], gx, np.arange(len(gx))) + 0.5) * cw
    my = top + size - (np.interp(rec[pair["y"]], gy, np.arange(len(gy))) + 0.5) * ch
    spec = '<circle cx="{:.1f}" cy="{:.1f}" r="6" fill="none" stroke="#e53e3e" stroke-width="2.5"/>'
    body.append(Markup(spec).format(mx, my))
    for i in sorted({0, len(gx) // 2, len(gx) - 1}):
        body.append(_text(left + (i + 0.5) * cw, top + size + 14, num(gx[i]), "middle", "small"))
    for j in sorted({0, len(gy) // 2, len(gy) - 1}):
        body.append(_text(left - 4, top + size - (j + 0.5) * ch + 4, num(gy[j]), "end", "small"))
    body += [
        _text(left + size / 2, top + size + 30, f"{pair['x']} threshold", "middle"),
        _text(14, top + size / 2, f"{pair['y']} threshold", "middle", rotate=True),
    ]
    return _svg(left + size + 52, top + size + 40, "heatmap", title, body)


def pair_scatter(pair: Mapping, points: Sequence[tuple[float, float, str]]) -> Markup:
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
        body += [_circle(cls, sx(x), sy(y)) for x, y, _ in chosen]
    body += [_line(ax, top, ax, bottom, "recommended"), _line(left, ay, width - right, ay, "recommended")]
    body += _x_axis(sx, x0, x1, bottom, left, width - right)
    mid = (top + bottom) / 2
    body += [
        _text(left + (width - left) / 2, height - 6, pair["x"], "middle"),
        _line(left, top, left, bottom, "axis"),
        _text(12, mid, pair["y"], "middle", rotate=True),
        Markup('<circle class="answer" cx="{}" cy="9" r="4"/>').format(width - 150),
        _text(width - 143, 13, "answer", cls="small"),
        Markup('<circle class="decline" cx="{}" cy="9" r="4"/>').format(width - 80),
        _text(width - 73, 13, "decline", cls="small"),
    ]
    for t in _ticks(y0, y1):
        body.append(_text(left - 4, sy(t) + 4, num(t), "end", "small"))
    return _svg(width, height, "scatter", f"{pair['x']} against {pair['y']}", body)


def bar_chart(precision: Mapping, metric: str) -> Markup:
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
