"""The search backends behind one interface (base.py): embedded (exact cosine + BM25 on files) and OpenSearch."""

from sourcegate.pipelines.search.base import Hit, IndexStore, ScoreDistribution, SearchBackend, retain

__all__ = ["Hit", "IndexStore", "ScoreDistribution", "SearchBackend", "retain"]
