"""Versions `<prefix>-<version>` behind the alias `<prefix>`: open, verify, promote, list and drop them."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from sourcegate.pipelines.config import OpenSearch, PipelineConfig
from sourcegate.pipelines.search.base import oldest_first, refuse_dropping_live
from sourcegate.pipelines.search.opensearch import content, mapping
from sourcegate.pipelines.search.opensearch.bulk import BulkLoader
from sourcegate.pipelines.search.opensearch.loader import load_version
from sourcegate.pipelines.search.opensearch.mapping import FORBIDDEN_IN_INDEX, META_KEY, PREFIX_RE, own_meta
from sourcegate.pipelines.search.opensearch.promotions import PromotionsIndex
from sourcegate.pipelines.search.opensearch.searcher import DEFAULT_SECTION, EF_SEARCH, OpenSearchSearcher
from sourcegate.pipelines.versions import manifest as mf
from sourcegate.pipelines.versions import promotions

log = logging.getLogger(__name__)
BULK_BACKOFF_S = (2.0, 60.0)  # a 429/5xx bulk request waits 2 s doubling, capped at 60 s


class OpenSearchStore:
    """Write side: versions ``<prefix>-<version>`` behind the alias ``<prefix>``."""

    shards, replicas = 1, 0  # of each version's index

    def __init__(
        self,
        client=None,
        section: OpenSearch = DEFAULT_SECTION,
        *,
        progress: bool = True,
        backoff_s: tuple[float, float] = BULK_BACKOFF_S,
        ef_search: int | None = EF_SEARCH,
    ):
        if not PREFIX_RE.match(section.index_prefix):
            raise ValueError(
                f"index prefix must be lower-case [a-z0-9._-] and start alphanumeric, got {section.index_prefix!r}"
            )
        if client is None:
            from sourcegate.pipelines.search.opensearch.client import client_from_env

            client = client_from_env()
        self.client = client
        self.section = section
        self.prefix = section.index_prefix
        self.alias = section.index_prefix
        self.progress = progress
        self.bulk = BulkLoader(
            client,
            chunk_size=section.bulk_chunk_size,
            max_retries=section.max_retries,
            initial_backoff=backoff_s[0],
            max_backoff=backoff_s[1],
            progress=progress,
        )
        self._promotions = PromotionsIndex(client, self.prefix)
        self.ef_search = ef_search

    @classmethod
    def from_config(cls, cfg: PipelineConfig, client=None, **kwargs: Any) -> OpenSearchStore:
        """A store from the pipeline config's ``backend.opensearch`` section.

        ``client`` defaults to the section's Airflow connection if it names one (the DAGs'), else
        to the ``OPENSEARCH_*`` environment (``client.client_for``).
        """
        section = cfg.backend.opensearch
        if client is None:
            from sourcegate.pipelines.search.opensearch.client import client_for

            client = client_for(section)
        return cls(client, section, **kwargs)

    # --- names --------------------------------------------------------------------------------

    def index_name(self, version: str) -> str:
        if not version or not version.strip():
            raise ValueError("empty index version")
        name = FORBIDDEN_IN_INDEX.sub("-", version.lower())
        if name == promotions.PROMOTIONS_INDEX:
            raise ValueError(f"{version!r} is reserved for the promotions log")
        return f"{self.prefix}-{name}"

    @property
    def promotions_index(self) -> str:
        return self._promotions.index

    def log_promotion(self, record: Mapping) -> None:
        self._promotions.append(record)

    def promotions(self) -> list[dict]:
        """Every promotion and rollback, oldest first."""
        return self._promotions.records()

    def meta(self, index: str) -> dict | None:
        """The sourcegate ``_meta`` of one index, or None when the index does not exist."""
        from opensearchpy import NotFoundError

        try:
            resp = self.client.indices.get_mapping(index=index)
        except NotFoundError:
            return None
        mapping = resp.get(index, {}).get("mappings", {})
        return own_meta((mapping.get("_meta") or {}).get(META_KEY) or {}, index)

    def set_meta(self, index: str, meta: dict) -> None:
        self.client.indices.put_mapping(index=index, body={"_meta": {META_KEY: meta}})

    # --- IndexStore ---------------------------------------------------------------------------

    def manifest(self, version: str) -> dict | None:
        """The version's manifest, or None when it does not exist or is not complete."""
        meta = self.meta(self.index_name(version)) or {}
        return meta.get("manifest") if meta.get("status") == "complete" else None

    def load(
        self,
        version: str,
        chunks_parquet: str,
        inputs: Mapping | None = None,
        *,
        base_chunks: str | Path | None = None,
    ) -> int:
        """Build `version`, or reuse it when complete and built from `inputs` (sourcegate/pipelines/search/opensearch/loader.py)."""
        return load_version(self, version, chunks_parquet, inputs, base_chunks=base_chunks)

    def verify(self, version: str, hashes: bool = True) -> dict:
        """The manifest of a complete, intact version; IntegrityError naming each problem otherwise.

        Always: ``_count``, the shards' ``max_seq_no`` (no write since completion) and the manifest's hash
        against the promotions log. With `hashes` (``verify``, promote, before a delta clones it): every
        ``_source`` against the content digest, the ids and the write block. Opening a version (no
        `hashes`) that was written to reads it in full too, to name the edited chunks.
        FileNotFoundError when there is no such index.
        """
        index = self.index_name(version)
        meta = self.meta(index)
        if meta is None:
            raise FileNotFoundError(f"no index version {version} ({index})")
        manifest = meta.get("manifest")
        if meta.get("status") != "complete" or not manifest:
            raise mf.IntegrityError(
                f"index version {version} ({index}) is incomplete: its load is {meta.get('status', 'unknown')!r} "
                "and it has no manifest; it is never opened or promoted"
            )
        problems = self._manifest_problems(version, index, manifest)
        count = int(self.client.count(index=index)["count"])
        if count != manifest["rows"]:
            problems.append(f"{index}: _count is {count}, manifest says {manifest['rows']}")
        written = content.seq_no_problems(index, manifest.get("max_seq_no"), content.max_seq_nos(self.client, index))
        problems += written
        if hashes or written:
            problems += self._content_problems(index, manifest)
        if hashes and not self._write_blocked(index):
            problems.append(f"{index}: its write block was removed (a complete version is read-only)")
        if problems:
            raise mf.IntegrityError(f"index version {version} is corrupt: " + "; ".join(problems), problems)
        return manifest

    def _manifest_problems(self, version: str, index: str, manifest: Mapping) -> list[str]:
        """The manifest in ``_meta`` against the hash the promotions log recorded for it (not editable in place)."""
        logged = {r.get("manifest_sha256") for r in self.promotions() if r.get("version") == version} - {None}
        now = mf.manifest_hash(manifest)
        return [
            f"{index}: its manifest in _meta (sha256 {now}) differs from the one promoted (sha256 {h}): edited in place"
            for h in sorted(logged)
            if h != now
        ]

    def _content_problems(self, index: str, manifest: Mapping) -> list[str]:
        """Every ``_source`` against the manifest's content digest; the edited chunks named from the source Parquet."""
        if not manifest.get("content_sha256"):
            return [f"{index}: its manifest has no content digest (loaded before edit detection); rebuild it"]
        found = content.index_digests(self.client, index)
        problems = []
        if mapping.ids_checksum(found) != manifest.get("ids_sha256"):
            problems.append(f"{index}: the chunk ids differ from the manifest's ids_sha256")
        if content.content_checksum(found) == manifest["content_sha256"]:
            return problems
        return (
            problems + [f"{index}: its documents differ from the content digest loaded"] + self._named(manifest, found)
        )

    def _named(self, manifest: Mapping, found: Mapping[str, str]) -> list[str]:
        """The chunks that differ from the Parquet the version was loaded from (when it is still there and is it)."""
        source = manifest.get("source")
        if not source or not Path(source).is_file():
            return [f"the Parquet it was loaded from ({source}) is gone: the edited chunks cannot be named"]
        pf = pq.ParquetFile(source)
        expected = content.parquet_digests(pf, mapping.indexed_columns(pf.schema_arrow.names), manifest["dimension"])
        if content.content_checksum(expected) != manifest["content_sha256"]:
            return [f"{source} no longer holds what was loaded: the edited chunks cannot be named"]
        return content.differing_chunks(expected, found)

    def _write_blocked(self, index: str) -> bool:
        settings = self.client.indices.get_settings(index=index, name="index.blocks.write")
        blocks = settings.get(index, {}).get("settings", {}).get("index", {}).get("blocks", {})
        return str(blocks.get("write")).lower() == "true"

    def ids_checksum(self, index: str) -> str:
        """The ids' SHA-256 from a scroll over ``_id``, 10,000 a page (benchmarks/opensearch_night.py: 6-26%
        faster than 1,000). Reading ``chunk_id`` doc values is ~9x cheaper still, but checks the field,
        not the ``_id`` a search returns."""
        from opensearchpy.helpers import scan

        hits = scan(self.client, index=index, query={"_source": False, "query": {"match_all": {}}}, size=10_000)
        return mapping.ids_checksum(h["_id"] for h in hits)

    def promote(self, version: str) -> None:
        index = self.index_name(version)
        try:
            self.verify(version)
        except mf.IntegrityError as exc:
            raise mf.IntegrityError(f"refusing to promote {index}: {exc}") from exc
        current = self._alias_indices()
        actions: list[dict] = [{"remove": {"index": i, "alias": self.alias}} for i in current if i != index]
        actions.append({"add": {"index": index, "alias": self.alias}})
        # One request: OpenSearch applies all actions atomically.
        self.client.indices.update_aliases(body={"actions": actions})
        log.info("promoted %s (alias %s; was %s)", index, self.alias, current or "unset")

    def _alias_indices(self) -> list[str]:
        from opensearchpy import NotFoundError

        try:
            return sorted(self.client.indices.get_alias(name=self.alias).keys())
        except NotFoundError:
            return []

    def live(self) -> str | None:
        indices = self._alias_indices()
        if not indices:
            return None
        if len(indices) > 1:
            raise RuntimeError(f"alias {self.alias} points at several indices: {indices}")
        meta = self.meta(indices[0]) or {}
        return meta.get("version") or indices[0][len(self.prefix) + 1 :]

    def versions(self) -> list[str]:
        resp = self.client.indices.get_mapping(index=f"{self.prefix}-*")
        created = self.client.indices.get_settings(index=f"{self.prefix}-*", name="index.creation_date")
        found = []
        for name, body in resp.items():
            meta = own_meta(((body.get("mappings") or {}).get("_meta") or {}).get(META_KEY) or {}, name)
            if meta.get("prefix") == self.prefix and meta.get("version"):
                when = int(created.get(name, {}).get("settings", {}).get("index", {}).get("creation_date", 0))
                found.append((when, meta["version"]))
        return oldest_first(found)

    def drop(self, version: str) -> None:
        refuse_dropping_live(self, version)
        index = self.index_name(version)
        if self.meta(index) is None:
            log.warning("drop: no index %s", index)
            return
        self.client.indices.delete(index=index)
        log.info("dropped %s", index)

    def open(self, version: str | None = None) -> OpenSearchSearcher:
        """A searcher over ``version``, or over the alias (following later promotions) by default."""
        if version is None:
            live = self.live()
            if live is None:
                raise FileNotFoundError(f"no live index: alias {self.alias} is not set; promote a version first")
            manifest, index = self.verify(live, hashes=False), self.alias
        else:
            manifest, index = self.verify(version, hashes=False), self.index_name(version)
        return OpenSearchSearcher(self.client, index, self.section, manifest=manifest, ef_search=self.ef_search)
