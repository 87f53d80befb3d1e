"""The promotions log on OpenSearch: one document per promotion or rollback in `<prefix>-_promotions`."""

from __future__ import annotations

from collections.abc import Mapping

from sourcegate.pipelines.versions.promotions import PROMOTIONS_INDEX


class PromotionsIndex:
    """Append only: every record is a new document, never an update."""

    def __init__(self, client, prefix: str):
        self.client = client
        self.index = f"{prefix}-{PROMOTIONS_INDEX}"

    def append(self, record: Mapping) -> None:
        """One document per promotion in ``<prefix>-_promotions`` (append only: new ids, never updates)."""
        if not self.client.indices.exists(index=self.index):
            keyword = {"type": "keyword"}
            fields = {k: keyword for k in ("version", "previous", "verdict_sha256", "manifest_sha256", "actor")}
            body = {"mappings": {"properties": {"time": {"type": "date"}, **fields}}}
            self.client.indices.create(index=self.index, body=body, ignore=400)  # a racing creator
        self.client.index(index=self.index, body=dict(record), refresh="wait_for")

    def records(self) -> list[dict]:
        """Every promotion and rollback, oldest first."""
        from opensearchpy import NotFoundError

        try:
            resp = self.client.search(
                index=self.index, body={"size": 10000, "query": {"match_all": {}}, "sort": [{"time": "asc"}]}
            )
        except NotFoundError:
            return []
        return [h["_source"] for h in resp["hits"]["hits"]]
