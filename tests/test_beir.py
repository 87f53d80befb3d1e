"""`sourcegate beir` end to end on a small slice of SciFact, with the real models."""

import csv
import json
import uuid

import pytest

from sourcegate.pipelines import config
from sourcegate.pipelines.app.beir import run_beir, system_rankings
from sourcegate.pipelines.build.beir_queries import load_queries
from sourcegate.pipelines.retrieval.retriever import Candidate, Retrieval
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
    declines = tmp_path / "decline.jsonl"  # two questions the slice cannot answer
    declines.write_text(
        "".join(
            json.dumps({"id": f"d{i}", "question": q, "label": "decline", "kind": "off_topic"}) + "\n"
            for i, q in enumerate(["What is the capital of Australia?", "How do I reset my router?"])
        )
    )
    # the cached index, the same numbers; with a decline file, the sweep over the dataset's queries
    again = run_beir(cfg, tmp_path / "data", tmp_path / "out", decline=str(declines))
    calibration = json.loads((tmp_path / "out" / "calibration.json").read_text())
    # every signal is swept, the accepted combiner's `answerability` too, and the file names the combiner
    assert calibration["n"] == {"answer": n_queries, "decline": 2} and again["calibration"]
    assert calibration["signals"]["answerability"]["auc"] is not None
    assert calibration["combiner"]["training"]["sha256"] and not calibration["combiner"]["refit"]
    assert again["systems"] == {k: {**v, "p50_ms": again["systems"][k]["p50_ms"]} for k, v in first["systems"].items()}
    assert len(list((tmp_path / "out" / "cache" / "runs").iterdir())) == 1


def test_the_four_systems_are_read_off_one_retrieval():
    """BM25 and kNN lists are the candidates' own ranks; hybrid the fused order; +rerank the final order."""

    def cand(cid, bm25_rank=None, knn_rank=None):
        return Candidate(cid, "d-" + cid, "", "", "", "", 0, 0.0, bm25_rank=bm25_rank, knn_rank=knn_rank)

    a, b, c = cand("a", bm25_rank=2, knn_rank=1), cand("b", bm25_rank=1), cand("c", knn_rank=2)
    retrieval = Retrieval("q", fused=[a, b, c], ranked=[c, a, b], reranked=True)
    assert system_rankings(retrieval) == {
        "bm25": ["b", "a"],
        "dense": ["a", "c"],
        "hybrid": ["a", "b", "c"],
        "hybrid+rerank": ["c", "a", "b"],
    }


@pytest.mark.models
@pytest.mark.opensearch
@pytest.mark.dataset
def test_beir_on_opensearch_goes_through_the_same_retriever(tmp_path, os_client):
    """`beir --backend opensearch` on a SciFact slice: the run folder built for the embedded backend is
    loaded into the real node (not rebuilt), and on so small a corpus HNSW is exact, so the dense
    system scores exactly as embedded while BM25 (Lucene vs rank-bm25 idf) may differ."""
    n_queries, n_docs = slice_of_scifact(tmp_path / "data")
    prefix = f"sgtest-{uuid.uuid4().hex[:8]}"
    overrides = {"artifacts": str(tmp_path / "artifacts"), "backend.opensearch.index_prefix": prefix}
    embedded = run_beir(config.load(ROOT / "config" / "pipeline.yaml", overrides), tmp_path / "data", tmp_path / "out")
    cfg = config.load(ROOT / "config" / "pipeline.yaml", {**overrides, "backend.kind": "opensearch"})
    try:
        served = run_beir(cfg, tmp_path / "data", tmp_path / "out")
        assert os_client.count(index=f"{prefix}-beir-*")["count"] == served["chunks"] == embedded["chunks"]
    finally:
        os_client.indices.delete(index=f"{prefix}-beir-*", params={"ignore_unavailable": "true"})
    assert served["backend"] == "opensearch" and embedded["backend"] == "embedded"
    assert served["queries"] == n_queries and served["documents"] == n_docs
    assert len(list((tmp_path / "out" / "cache" / "runs").iterdir())) == 1  # one build, two loads
    ignore_latency = {name: {m: v for m, v in s.items() if m != "p50_ms"} for name, s in embedded["systems"].items()}
    assert {m: v for m, v in served["systems"]["dense"].items() if m != "p50_ms"} == ignore_latency["dense"]
    assert served["systems"]["hybrid"]["recall@100"] == 1.0
    assert abs(served["systems"]["hybrid+rerank"]["ndcg@10"] - embedded["systems"]["hybrid+rerank"]["ndcg@10"]) <= 0.1


def test_beir_reads_the_split_asked_for_and_names_the_splits_a_dataset_has(tmp_path):
    slice_of_scifact(tmp_path / "data", n_queries=3)
    test = (tmp_path / "data" / "qrels" / "test.tsv").read_text().splitlines()
    (tmp_path / "data" / "qrels" / "dev.tsv").write_text("\n".join(test[:2]) + "\n")  # the header and one judgement
    queries, qrels = load_queries(tmp_path / "data", "dev")
    assert list(qrels) == list(queries) == [test[1].split("\t")[0]] and len(load_queries(tmp_path / "data")[0]) == 3
    cfg = config.load(ROOT / "config" / "pipeline.yaml", {"artifacts": str(tmp_path / "artifacts")})
    with pytest.raises(FileNotFoundError, match=r"no 'train' split in .* \(its qrels: dev, test\)"):
        run_beir(cfg, tmp_path / "data", tmp_path / "out", split="train")
    assert not (tmp_path / "out").exists() and not (tmp_path / "artifacts").exists()  # said before any indexing
