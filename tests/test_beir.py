"""`sourcegate beir` end to end on a small slice of SciFact, with the real models."""

import csv
import json

import pytest

from pipelines import config
from pipelines.beir import run_beir
from tests.conftest import ROOT, SCIFACT

pytestmark = [pytest.mark.models, pytest.mark.dataset]


def slice_of_scifact(folder, n_queries=6, n_other=24):
    """The first queries with judgements, their relevant abstracts, and some others."""
    with (SCIFACT / "qrels" / "test.tsv").open() as fh:
        rows = list(csv.DictReader(fh, delimiter="\t"))
    qids = list(dict.fromkeys(r["query-id"] for r in rows))[:n_queries]
    rows = [r for r in rows if r["query-id"] in qids]
    wanted = {r["corpus-id"] for r in rows}
    docs = [json.loads(x) for x in (SCIFACT / "corpus.jsonl").read_text().splitlines() if x.strip()]
    keep = [d for d in docs if str(d["_id"]) in wanted] + [d for d in docs if str(d["_id"]) not in wanted][:n_other]
    (folder / "qrels").mkdir(parents=True)
    (folder / "corpus.jsonl").write_text("".join(json.dumps(d) + "\n" for d in keep))
    queries = [json.loads(x) for x in (SCIFACT / "queries.jsonl").read_text().splitlines() if x.strip()]
    (folder / "queries.jsonl").write_text("".join(json.dumps(q) + "\n" for q in queries if str(q["_id"]) in qids))
    with (folder / "qrels" / "test.tsv").open("w") as fh:
        fh.write(
            "query-id\tcorpus-id\tscore\n" + "".join(f"{r['query-id']}\t{r['corpus-id']}\t{r['score']}\n" for r in rows)
        )
    return len(qids), len(keep)


def test_beir_evaluates_four_systems_and_reuses_its_index(tmp_path):
    n_queries, n_docs = slice_of_scifact(tmp_path / "data")
    cfg = config.load(ROOT / "config" / "pipeline.yaml", {"artifacts": str(tmp_path / "artifacts")})
    first = run_beir(cfg, tmp_path / "data", tmp_path / "out")
    assert json.loads((tmp_path / "out" / "beir.json").read_text())["systems"] == first["systems"]
    assert first["queries"] == n_queries and first["documents"] == n_docs
    assert set(first["systems"]) == {"bm25", "dense", "hybrid", "hybrid+rerank"}
    for name, m in first["systems"].items():
        assert 0.0 <= m["ndcg@10"] <= 1.0, name
    # every chunk is within the 100-deep kNN list of so small a corpus, so fusion finds every relevant abstract
    assert first["systems"]["hybrid"]["recall@100"] == 1.0
    assert first["systems"]["hybrid+rerank"]["ndcg@10"] >= 0.5  # relevant abstracts among 30: near the top
    again = run_beir(cfg, tmp_path / "data", tmp_path / "out")  # the cached index, the same numbers
    assert again["systems"] == {k: {**v, "p50_ms": again["systems"][k]["p50_ms"]} for k, v in first["systems"].items()}
    assert len(list((tmp_path / "out" / "cache" / "runs").iterdir())) == 1
