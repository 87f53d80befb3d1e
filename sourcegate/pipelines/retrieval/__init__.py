"""Retrieval and answering: hybrid search, fail-safe reranking, signals, the answer decision."""
