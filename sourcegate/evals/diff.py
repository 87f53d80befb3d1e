"""What changed between two runs, question by question: `sourcegate diff RUN_A RUN_B`.

Each run's evaluate step writes questions.jsonl (one row per question and eval set:
gating score, answer mode, rank of the labelled passage). The join is SQL over those
files (duckdb), so the same query works on any two run folders, whatever backend built them.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from sourcegate.artifact_io.run_folder import QUESTIONS

_COLUMNS = (
    "{'set': 'VARCHAR', 'id': 'VARCHAR', 'kind': 'VARCHAR', 'label': 'VARCHAR', 'question': 'VARCHAR', "
    "'gating_signal': 'VARCHAR', 'gating_score': 'DOUBLE', 'mode': 'VARCHAR', 'labelled_rank': 'INTEGER'}"
)
_JOIN = f"""
WITH a AS (SELECT * FROM read_json($a, format = 'newline_delimited', columns = {_COLUMNS})),
     b AS (SELECT * FROM read_json($b, format = 'newline_delimited', columns = {_COLUMNS})),
     j AS (
SELECT coalesce(b.set, a.set) AS set, coalesce(b.id, a.id) AS id, coalesce(b.kind, a.kind) AS kind,
       coalesce(b.label, a.label) AS label, coalesce(b.question, a.question) AS question,
       a.gating_signal AS signal_a, b.gating_signal AS signal_b,
       a.gating_score AS score_a, b.gating_score AS score_b,
       -- two scores are compared only on one signal: under answer.signal auto a night may choose another
       CASE WHEN a.gating_signal = b.gating_signal THEN b.gating_score - a.gating_score END AS delta,
       a.mode AS mode_a, b.mode AS mode_b, a.labelled_rank AS rank_a, b.labelled_rank AS rank_b,
       a.id IS NULL AS only_b, b.id IS NULL AS only_a,
       a.mode IS DISTINCT FROM b.mode AS crossed,
       a.id IS NULL OR b.id IS NULL OR a.labelled_rank IS DISTINCT FROM b.labelled_rank
         OR a.mode IS DISTINCT FROM b.mode
         OR (a.gating_signal = b.gating_signal AND a.gating_score IS DISTINCT FROM b.gating_score) AS moved
FROM a FULL OUTER JOIN b ON a.set = b.set AND a.id = b.id)
SELECT * FROM j ORDER BY crossed DESC, abs(coalesce(delta, 0)) DESC, set, id
"""


def questions_file(run: str | os.PathLike) -> Path:
    """A run folder's questions.jsonl (or the file itself), with a clear error when missing."""
    path = Path(run)
    path = path if path.suffix == ".jsonl" else path / QUESTIONS
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no per-question records (runs evaluated before questions.jsonl have none)")
    return path


def diff_runs(run_a: str | os.PathLike, run_b: str | os.PathLike) -> dict[str, Any]:
    """Per-question changes from run A to run B: crossed (answer mode changed) first, then by
    the size of the gating-score change; and a per-kind summary of the shifts."""
    import duckdb

    con = duckdb.connect()
    try:
        cursor = con.execute(_JOIN, {"a": str(questions_file(run_a)), "b": str(questions_file(run_b))})
        names = [d[0] for d in cursor.description]
        rows = [dict(zip(names, values)) for values in cursor.fetchall()]
    finally:
        con.close()
    moved = [r for r in rows if r["moved"]]
    signals = {side: sorted({r[f"signal_{side}"] for r in rows if r[f"signal_{side}"]}) for side in "ab"}
    return {
        "a": str(run_a),
        "b": str(run_b),
        "n": len(rows),
        "signals": signals,  # each run's gating signal: scores are compared only where they are one
        "signal_changed": signals["a"] != signals["b"],
        "crossed": [r for r in moved if r["crossed"]],
        "moved": moved,
        "by_kind": _by_kind(rows),
    }


def _by_kind(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for r in rows:
        k = out.setdefault(f"{r['set']}/{r['kind']}", {"n": 0, "moved": 0, "crossed": 0, "deltas": []})
        k["n"] += 1
        k["moved"] += bool(r["moved"])
        k["crossed"] += bool(r["crossed"])
        if r["delta"] is not None:
            k["deltas"].append(r["delta"])
    for k in out.values():
        deltas = k.pop("deltas")
        k["mean_delta"] = sum(deltas) / len(deltas) if deltas else None
        k["min_delta"] = min(deltas, default=None)
        k["max_delta"] = max(deltas, default=None)
    return dict(sorted(out.items()))


def _num(x: float | None) -> str:
    return "-" if x is None else f"{x:.4g}"


def _scored(row: dict[str, Any], side: str) -> str:
    """A run's gating score, named by its signal when the two runs' signals differ."""
    signal = row[f"signal_{side}"] if row["signal_a"] != row["signal_b"] and row[f"signal_{side}"] else ""
    return f"{signal} {_num(row[f'score_{side}'])}".lstrip()


def signal_change(diff: dict[str, Any]) -> str:
    """The line saying the runs gated on different signals, whose scores are not compared."""
    a, b = (", ".join(diff["signals"][side]) or "-" for side in "ab")
    return f"gating signal changed: {a} -> {b}; scores on different signals are not compared (modes and ranks are)"


def format_diff(diff: dict[str, Any], limit: int = 50) -> str:
    """Plain text for the terminal: crossed questions, then the other moves, then per kind."""
    lines = [f"{diff['a']} -> {diff['b']}: {len(diff['moved'])} of {diff['n']} questions moved"]
    if diff.get("signal_changed"):
        lines.append(signal_change(diff))
    for title, rows in (
        ("crossed a threshold (answer mode changed)", diff["crossed"]),
        ("score or rank moved", [r for r in diff["moved"] if not r["crossed"]]),
    ):
        lines.append(f"\n{title}: {len(rows)}")
        for r in rows[:limit]:
            lines.append(
                f"  {r['set']}/{r['id']} [{r['kind']}, {r['label']}] score {_scored(r, 'a')} -> "
                f"{_scored(r, 'b')} ({_num(r['delta'])}), mode {r['mode_a'] or '-'} -> {r['mode_b'] or '-'}, "
                f"labelled rank {r['rank_a'] or '-'} -> {r['rank_b'] or '-'}"
            )
        if len(rows) > limit:
            lines.append(f"  … and {len(rows) - limit} more (--json for all)")
    lines.append("\nper kind: n, moved, crossed, score shift mean [min, max]")
    for kind, k in diff["by_kind"].items():
        lines.append(
            f"  {kind}: {k['n']}, {k['moved']}, {k['crossed']}, "
            f"{_num(k['mean_delta'])} [{_num(k['min_delta'])}, {_num(k['max_delta'])}]"
        )
    return "\n".join(lines)
