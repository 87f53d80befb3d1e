from pipelines.search.base import Hit, IndexStore, ScoreDistribution, SearchBackend, retain

__all__ = ["Hit", "IndexStore", "ScoreDistribution", "SearchBackend", "retain"]
