"""The OpenSearch backend: one index per version behind an alias.

By job: `client` (the one place a client is made), `mapping` (an index version's settings and fields),
`searcher` (the read side), `bulk` (bulk loading with retries), `loader` (building a version: a full load or
clone + the night's delta, and its completion mark), `promotions` (the promotions index), `store` (versions
behind the alias: open, verify, promote, drop).


- index ``<prefix>-<version>`` (the version lower-cased, characters OpenSearch forbids in index
  names replaced by ``-``; the exact version string is kept in the mapping's ``_meta``), alias
  ``<prefix>`` pointing at the live one;
- ``chunk_id``/``doc_id`` keywords; ``title``, ``section`` and ``text`` analysed text fields.
  BM25 queries search ``text``, which (like the embedded backend's BM25) already holds title +
  section + body, analysed by ``sourcegate_en`` (the embedded backend's analyser, sourcegate/pipelines/search/analyzer.py)
  and scored with its k1/b, so the two backends rank alike; ``embedding`` a ``knn_vector`` (HNSW, engine ``lucene``,
  ``cosinesimil``). The lucene engine is the only one that runs without the k-NN plugin's
  native libraries (and faiss is the 2.19 default), so every mapping names it.

A version is promotable only after ``load`` has checked ``_count`` against the Parquet row
count and marked the index complete in ``_meta``: a half-built index is never served. The
complete mark carries the version's manifest (``sourcegate.pipelines.versions.manifest``: rows, dimension, model
fingerprint, the inputs it was built from, a SHA-256 of its sorted chunk ids), so a complete
version is reused or refused, never rebuilt, and opening it checks ``_count`` against it.
"""

from sourcegate.pipelines.search.opensearch.mapping import ids_checksum, index_body, indexed_columns
from sourcegate.pipelines.search.opensearch.searcher import OpenSearchSearcher
from sourcegate.pipelines.search.opensearch.store import OpenSearchStore

__all__ = ["OpenSearchSearcher", "OpenSearchStore", "ids_checksum", "index_body", "indexed_columns"]
