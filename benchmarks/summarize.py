"""Print the headline numbers of every result file as Markdown tables (for docs/benchmarks/).

.venv/bin/python -m benchmarks.summarize
"""

from __future__ import annotations

import json

from benchmarks._common import RESULTS


def load(name):
    p = RESULTS / f"{name}.json"
    return json.loads(p.read_text()) if p.exists() else None


def machine_line(d) -> str:
    m, e = d["machine_start"], d.get("machine_end", {})
    return (
        f"{m['date_utc']}, {m['cores']} cores ({m['cpu']}), {m['memory'].get('total_gb')} GB; "
        f"load avg start {m['loadavg_1_5_15']} end {e.get('loadavg_1_5_15')}; wall {d.get('wall_seconds')} s; "
        f"peak RSS {d.get('peak_rss_mb')} MB"
    )


def table(header, rows) -> str:
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(out)


def main() -> None:
    d = load("embed")
    if d:
        print("## embed\n", machine_line(d))
        m = d["main"]
        print(
            table(
                ["", "p50 s", "texts/s", "peak RSS MB"],
                [[k, m[k]["p50_ms"] / 1000, m[k]["texts_per_s_median"], m["peak_rss_mb"]] for k in ("pipeline", "raw")],
            )
        )
        print(
            "ratio", m["ratio_pipeline_over_raw_throughput_median"], m["ratio_per_pair"], "cpu", m.get("cpu_s_median")
        )
        if "variants" in d:
            print(
                table(
                    ["case", "p50 s", "texts/s", "vs batch 32", "peak RSS MB"],
                    [
                        [k, v["p50_ms"] / 1000, v["texts_per_s_median"], v["speed_vs_batch_32"], v["peak_rss_mb"]]
                        for k, v in d["variants"]["cases"].items()
                    ],
                )
            )
        print(d.get("backends"))
    for name in ("search", "search-1m"):
        d = load(name)
        if not d:
            continue
        print(f"\n## {name}\n", machine_line(d))
        rows = []
        for n, s in d["sizes"].items():
            for op, l in s["latency"].items():
                rows.append([n, op, l["p50_ms"], l["p95_ms"], l.get("cpu_p50_ms", ""), s["peak_rss_mb"]])
        print(table(["chunks", "op", "p50 ms", "p95 ms", "CPU p50 ms", "peak RSS MB"], rows))
        print(
            table(
                ["chunks", "build s", "built by", "open s", "rss after open MB", "files MB"],
                [
                    [
                        n,
                        s["index_build_s"],
                        s["index_built_by"][:30],
                        s["open_s"],
                        s["rss_after_open_mb"],
                        s["index_files_mb"],
                    ]
                    for n, s in d["sizes"].items()
                ],
            )
        )
    d = load("rerank")
    if d:
        print("\n## rerank\n", machine_line(d))
        for m, c in d["cases"].items():
            print(
                m,
                "pipeline",
                c["pipeline"]["p50_ms"],
                "bare",
                c["bare"]["p50_ms"],
                "ratio",
                c["ratio_pipeline_over_bare_throughput"],
                "ms/pair",
                c["pipeline"]["ms_per_pair_median"],
                c["bare"]["ms_per_pair_median"],
                "same",
                c["pipeline_equals_bare_scores"],
            )
            for k, v in c["batched"].items():
                print(
                    "   ",
                    k,
                    {
                        x: v.get(x)
                        for x in (
                            "p50_ms",
                            "speedup_vs_one_pair_per_run",
                            "max_abs_logit_diff_vs_single",
                            "max_abs_logit_diff_reversed_order",
                            "same_top1_as_single",
                            "same_top10_order_as_single",
                        )
                    },
                )
        print(d.get("session_options"))
    for name in ("calibration", "incremental", "opensearch", "opensearch-r2", "quality", "quality_ideas_blend"):
        d = load(name)
        if d:
            print(f"\n## {name}\n", machine_line(d))
            slim = {k: v for k, v in d.items() if k not in ("machine_start", "machine_end", "config")}
            print(json.dumps(slim, indent=1)[:6000])


if __name__ == "__main__":
    main()
