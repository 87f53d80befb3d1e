"""sourcegate.evals.report: content (escaping, one plot per signal, heatmap) and a real
headless-Chromium screenshot of the rendered page."""

import copy
import os
import re
import shutil
import struct
import subprocess
import zlib
from collections import Counter

import numpy as np
import pytest

from sourcegate.evals.calibration import calibrate
from sourcegate.evals.gate import evaluate_gate
from sourcegate.evals.precision import precision_eval
from sourcegate.evals.report import render_report, write_report

XSS = "<script>alert(1)</script>"
SIGNALS = ["cosine_top", "rerank_top", "bm25_z", "bm25_top", "term_coverage", "margin"]
CONFIG = {
    "signals": SIGNALS,
    "pair": ["bm25_z", "term_coverage"],
    "placement": "tightest",
    "min_per_label": 20,
    "gating": {"signal": "rerank_top", "adjacent": 0.2, "strong": 0.6},
}


def make_records(n=160, seed=0, rerank=True):
    rng = np.random.default_rng(seed)
    records = []
    for i in range(n):
        answer = i % 2 == 0
        records.append(
            {
                "id": f"{'a' if answer else 'd'}-{i:03d}",
                "label": "answer" if answer else "decline",
                "question": f"question {i} about <topic> & more",
                "kind": ["fact", "howto", "<b>odd</b>"][i % 3],
                "signals": {
                    "cosine_top": float(rng.normal(0.7 if answer else 0.45, 0.07)),
                    "rerank_top": (float(rng.uniform(0.3, 1) if answer else rng.uniform(0, 0.25)) if rerank else None),
                    "bm25_z": float(rng.normal(3 if answer else 5, 1)),
                    "bm25_top": float(rng.normal(14 if answer else 8, 3)),
                    "term_coverage": float(rng.uniform(0.3, 1) if answer else rng.uniform(0, 0.8)),
                    "margin": float(rng.uniform()),
                },
            }
        )
    records[0]["question"] = XSS
    if rerank:
        records[0]["signals"]["rerank_top"] = 0.1  # wrongly declined at the shipped 0.2
    return records


def make_artifacts(rerank=True):
    records = make_records(rerank=rerank)
    calibration = calibrate(records, CONFIG)
    for lost in calibration["shipped"]["wrongly_declined"]:
        lost["source_rank"] = 7  # as the harness adds it
    items = [r for r in records if r["label"] == "answer"]
    qrels = {it["id"]: {f"{it['id']}-rel": 1} for it in items}
    fused = {it["id"]: [f"x{j}" for j in range(i % 4)] + [f"{it['id']}-rel"] for i, it in enumerate(items)}
    reranked = {
        it["id"]: ([f"{it['id']}-rel"] if i % 5 else ["y", "z", f"{it['id']}-rel"]) for i, it in enumerate(items)
    }
    precision = precision_eval(items, fused, reranked, qrels)
    gate = evaluate_gate(calibration, precision, None, gating_signal="rerank_top")
    run_info = {
        "run_id": "night-42",
        "models": {"embedder": "all-MiniLM-L6-v2", "reranker": XSS},
        "counts": {"documents": 120, "chunks": 980},
        "timings_s": {"calibration": 0.08},
    }
    return calibration, precision, gate, run_info


@pytest.fixture(scope="module")
def artifacts():
    return make_artifacts()


@pytest.fixture(scope="module")
def page(artifacts):
    return render_report(*artifacts)


def test_text_is_escaped(page, artifacts):
    assert XSS not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "<script" not in page.lower()  # no script of ours either
    assert "<b>odd</b>" not in page and "&lt;b&gt;odd&lt;/b&gt;" in page
    assert "question 10 about &lt;topic&gt; &amp; more" in page  # a reranker loss


def test_self_contained(page):
    assert not re.search(r"https?://", page)
    assert not re.search(r"<(link|img|iframe|object|embed)\b", page)
    assert "<style>" in page


def test_a_plot_per_signal(page, artifacts):
    calibration = artifacts[0]
    calibrated = [n for n, s in calibration["signals"].items() if not s.get("skipped")]
    assert len(calibrated) == len(SIGNALS)
    assert page.count('class="plot strip"') == len(calibrated)
    assert page.count('class="plot sweep"') == len(calibrated)
    for name in calibrated:
        assert f'aria-label="{name} scores by label"' in page
        assert calibration["signals"][name]["verdict"].split(":")[0] in page


def test_heatmap_and_precision_charts(page):
    assert page.count('class="plot heatmap"') == 2
    assert page.count('class="plot scatter"') == 1
    assert page.count('class="plot bars"') == 2


def test_verdict_banner_and_shipped_errors(page, artifacts):
    gate = artifacts[2]
    assert gate["passed"] is False
    assert 'class="banner fail"' in page and "FAILED" in page
    assert "The shipped rerank_top threshold 0.2 declines 1" in page
    assert "threshold &lt;= 0.1" in page  # the fix for the wrongly declined question
    assert '<td class="num">7</td>' in page and "its source at rank 7" in page  # whose miss it was


def test_gap_shows_its_bound_fragility_and_deciding_questions(page, artifacts):
    gating = artifacts[0]["gating"]["result"]
    n = gating["n"]["answer"]
    assert "Gap the gate checks: rerank_top" in page
    assert f"with probability ≥ {n / (n + 1):.3f} (n/(n+1))" in page and "needs 368 should-answer" in page
    assert "Gap after removing the 1, 2, 3 most extreme questions per side" in page
    assert "new should-answer kept ≥" in page  # the summary table column
    assert "gap 95% CI" not in page
    deciding = gating["fragility"]["deciding"]
    assert gating["has_gap"] is False  # record 0 (0.1) sits in the should-decline band
    assert f"Removing {gating['fragility']['to_open']} question(s) would open a gap: a-000" in page
    assert deciding["answer"] == ["a-000"]


def test_answer_modes_per_set_and_kind_are_counted_and_shown(page, artifacts):
    calibration = artifacts[0]
    expected: dict = {}
    for r in make_records():  # by hand: below 0.2 declined, from 0.6 sourced, adjacent between
        value = r["signals"]["rerank_top"]
        mode = "decline" if value < 0.2 else "sourced" if value >= 0.6 else "adjacent"
        row = expected.setdefault(f"{r['label']}/{r['kind']}", {"sourced": 0, "adjacent": 0, "decline": 0, "open": 0})
        row[mode] += 1
    assert calibration["modes"] == {"fit": expected, "check": None}
    assert "Answer modes per set and kind" in page and "answer/&lt;b&gt;odd&lt;/b&gt;" in page


def test_the_signal_table_reads_each_signal_on_the_kinds_the_gap_holds_and_errors_name_their_kind():
    records = make_records()
    for r in records[1::4]:
        r["kind"] = "near_topic" if r["label"] == "decline" else r["kind"]
    calibration = calibrate(records, dict(CONFIG, gate_decline_kinds=["near_topic"]))
    page = render_report(calibration, *make_artifacts()[1:])
    assert "the gap check holds only near_topic questions to the gap" in page and "<th>near_topic only</th>" in page
    gated = calibration["signals"]["rerank_top"]["gated"]
    assert gated["n"]["decline"] == sum(r["kind"] == "near_topic" for r in records)
    wrong = calibration["shipped"]["wrongly_answered"][0]
    assert f"<td>{wrong['id']}</td><td>{wrong['kind']}</td>" in page.replace("&lt;", "<").replace("&gt;", ">")
    assert "only</th>" not in render_report(*make_artifacts())  # no kinds named: one scope, no extra column


def test_skipped_signal_is_reported_not_hidden():
    page = render_report(*make_artifacts(rerank=False))
    assert "skipped: no question has a rerank_top score (reranker off?)" in page
    assert page.count('class="plot strip"') == len(SIGNALS) - 1


def test_write_report(tmp_path, artifacts):
    path = write_report(*artifacts, tmp_path / "report.html")
    assert path.read_text(encoding="utf-8") == render_report(*artifacts)


# --------------------------------------------------------------------------- real browser


def png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    assert data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


def png_top_rows(data: bytes, n_rows: int) -> list[bytes]:
    """Decode the first n_rows of an 8-bit RGB/RGBA PNG (no PIL needed)."""
    width, _ = png_size(data)
    bit_depth, color_type = data[24], data[25]
    assert bit_depth == 8 and color_type in (2, 6), (bit_depth, color_type)
    bpp = 3 if color_type == 2 else 4
    pos, idat = 8, b""
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos : pos + 8])
        if kind == b"IDAT":
            idat += data[pos + 8 : pos + 8 + length]
        pos += 12 + length
    stride = width * bpp
    raw = zlib.decompressobj().decompress(idat, (stride + 1) * n_rows)
    rows, prev = [], bytearray(stride)
    for r in range(n_rows):
        kind, line = raw[r * (stride + 1)], bytearray(raw[r * (stride + 1) + 1 : (r + 1) * (stride + 1)])
        for i in range(stride):
            a = line[i - bpp] if i >= bpp else 0
            b, c = prev[i], (prev[i - bpp] if i >= bpp else 0)
            if kind == 1:
                line[i] = (line[i] + a) & 255
            elif kind == 2:
                line[i] = (line[i] + b) & 255
            elif kind == 3:
                line[i] = (line[i] + (a + b) // 2) & 255
            elif kind == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        rows.append(bytes(line))
        prev = line
    return [bytes(px for j, px in enumerate(row) if j % bpp < 3) for row in rows]  # drop alpha


@pytest.mark.browser
def test_screenshot_in_headless_chromium(tmp_path, artifacts):
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    assert browser, "chromium is required for the report test (apt-get install -y chromium)"
    report = write_report(*artifacts, tmp_path / "report.html")
    shot = tmp_path / "report.png"
    done = subprocess.run(
        [
            browser,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--hide-scrollbars",
            f"--user-data-dir={tmp_path / 'profile'}",
            f"--screenshot={shot}",
            "--window-size=1280,4000",
            report.as_uri(),
        ],
        timeout=180,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0 and shot.exists(), done.stderr[-2000:]
    if os.environ.get("REPORT_SCREENSHOT"):  # keep it for a person to look at
        shutil.copy(shot, os.environ["REPORT_SCREENSHOT"])
    data = shot.read_bytes()
    assert png_size(data) == (1280, 4000)
    assert len(data) > 100_000, "screenshot suspiciously small: blank page?"
    rows = png_top_rows(data, 320)  # title, banner, gate checks
    pixels = Counter(row[i : i + 3] for row in rows for i in range(0, len(row), 3))
    assert len(pixels) > 50, "too few colours: the page did not render"
    banner_red = bytes((0xC5, 0x30, 0x30))  # .banner.fail background
    assert pixels[banner_red] > 1000, "the FAILED banner is not visible"


def test_hostile_text_in_every_place_is_escaped():
    # autoescape covers what the template writes and what the SVG plots draw (sourcegate/evals/plots.py)
    calibration, precision, gate, _ = make_artifacts()
    pair = calibration["pair"]
    for axis, old, new in (("x", "bm25_z", "<script>x()</script>"), ("y", "term_coverage", "<i>y</i>")):
        # a signal name lands in HTML text, SVG text (rotated on the y axis) and SVG attributes
        assert pair[axis] == old
        pair[axis], pair["recommended"][new] = new, pair["recommended"].pop(old)
        calibration["signals"][new] = calibration["signals"].pop(old)
        for q in calibration["questions"]:
            q["signals"][new] = q["signals"].pop(old)
    gate = {**gate, "reasons": [XSS], "checks": [{"name": XSS, "passed": False, "detail": '"><img src=x>'}]}
    page = render_report(calibration, precision, gate, {XSS: {XSS: [XSS, 1.5]}})
    assert "<script" not in page.lower() and "<img" not in page and "<i>" not in page
    assert 'transform="rotate(-90 12 156)">&lt;i&gt;y&lt;/i&gt;</text>' in page
    assert 'aria-label="&lt;script&gt;x()&lt;/script&gt; scores by label"' in page
    assert "&lt;script&gt;x()&lt;/script&gt; threshold</text>" in page
    assert "&#34;&gt;&lt;img src=x&gt;" in page


def test_shortlist_recall_of_both_sets_names_what_retrieval_missed(artifacts):
    calibration, precision, gate, run_info = copy.deepcopy(artifacts)
    calibration["shortlist_recall"] = {"depth": 12, "n": 80, "recall": 79 / 80, "missed": ["a-004"]}
    calibration["check"] = {"path": "check.jsonl", "n": {"answer": 5, "decline": 3}}
    calibration["check"]["shortlist_recall"] = {"depth": 12, "n": 5, "recall": 1.0, "missed": []}
    page = render_report(calibration, precision, gate, run_info)
    assert "fit set: the reranker's 12 candidates hold the labelled article of 79 of 80" in page
    assert "(not: a-004: whatever a signal decides, their answer cannot come from their labelled article)" in page
    assert (
        "check set: the reranker's 12 candidates hold the labelled article of 5 of 5 should-answer questions." in page
    )
