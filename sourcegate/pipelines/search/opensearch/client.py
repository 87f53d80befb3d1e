"""The one place an OpenSearch client is made: from the environment or an Airflow connection.

Environment (``client_from_env``):

- ``OPENSEARCH_URL``          default ``http://127.0.0.1:9200``
- ``OPENSEARCH_USER``         basic-auth user (optional)
- ``OPENSEARCH_PASSWORD``     basic-auth password (optional; never logged or shown in a repr)
- ``OPENSEARCH_VERIFY_CERTS`` ``true``/``false``; default true (only matters for https)
- ``OPENSEARCH_CA_CERTS``     path to a CA bundle (optional)
- ``OPENSEARCH_TIMEOUT``      request timeout in seconds (default 60)

Airflow (``client_from_airflow``): the ``OpenSearchHook`` of
``apache-airflow-providers-opensearch``, imported only when called, so the library and its
tests do not need Airflow. ``client_for`` picks one from the config: the DAGs name the
connection (``backend.opensearch.airflow_conn_id``, default ``opensearch_default``), the CLI does not.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit, urlunsplit

from sourcegate.pipelines import config

if TYPE_CHECKING:  # pragma: no cover
    from opensearchpy import OpenSearch

log = logging.getLogger(__name__)

DEFAULT_URL = "http://127.0.0.1:9200"
DEFAULT_TIMEOUT = 60

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


def _parse_bool(name: str, value: str) -> bool:
    v = value.strip().lower()
    if v in _TRUE:
        return True
    if v in _FALSE:
        return False
    raise ValueError(f"{name} must be one of true/false/1/0/yes/no/on/off, got {value!r}")


def redact_url(url: str) -> str:
    """The URL with any password in its user-info replaced by ``***``."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = parts.hostname or ""
    if parts.port is not None:
        host = f"{host}:{parts.port}"
    netloc = f"{parts.username or ''}:***@{host}"
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


@dataclass(frozen=True)
class OpenSearchConfig:
    """Connection settings. ``repr``/``str`` never show the password."""

    url: str = DEFAULT_URL
    user: str | None = None
    password: str | None = field(default=None, repr=False)
    verify_certs: bool = True
    ca_certs: str | None = None
    timeout: float = DEFAULT_TIMEOUT

    def __repr__(self) -> str:
        return (
            f"OpenSearchConfig(url={redact_url(self.url)!r}, user={self.user!r}, "
            f"password={'***' if self.password else None!r}, verify_certs={self.verify_certs!r}, "
            f"ca_certs={self.ca_certs!r}, timeout={self.timeout!r})"
        )

    __str__ = __repr__

    @property
    def uses_tls(self) -> bool:
        return urlsplit(self.url).scheme == "https"

    def client_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for ``opensearchpy.OpenSearch`` (contains the secret: do not log)."""
        kwargs: dict[str, Any] = {
            "hosts": [self.url],
            "timeout": self.timeout,
            "max_retries": 3,
            "retry_on_timeout": True,
        }
        if self.user is not None:
            kwargs["http_auth"] = (self.user, self.password or "")
        if self.uses_tls:
            kwargs["use_ssl"] = True
            kwargs["verify_certs"] = self.verify_certs
            kwargs["ssl_show_warn"] = self.verify_certs
            if self.ca_certs:
                kwargs["ca_certs"] = self.ca_certs
        return kwargs

    def client(self) -> OpenSearch:
        from opensearchpy import OpenSearch

        log.info("OpenSearch client for %s", self)
        return OpenSearch(**self.client_kwargs())


def config_from_env(env: Mapping[str, str] | None = None) -> OpenSearchConfig:
    """Read the ``OPENSEARCH_*`` variables (see the module docstring)."""
    env = os.environ if env is None else env
    url = (env.get("OPENSEARCH_URL") or DEFAULT_URL).strip().rstrip("/")
    scheme = urlsplit(url).scheme
    if scheme not in ("http", "https"):
        raise ValueError(f"OPENSEARCH_URL must start with http:// or https://, got {redact_url(url)!r}")
    verify_raw = env.get("OPENSEARCH_VERIFY_CERTS")
    verify = True if not verify_raw else _parse_bool("OPENSEARCH_VERIFY_CERTS", verify_raw)
    timeout_raw = env.get("OPENSEARCH_TIMEOUT")
    timeout = float(timeout_raw) if timeout_raw else DEFAULT_TIMEOUT
    return OpenSearchConfig(
        url=url,
        user=env.get("OPENSEARCH_USER") or None,
        password=env.get("OPENSEARCH_PASSWORD") or None,
        verify_certs=verify,
        ca_certs=env.get("OPENSEARCH_CA_CERTS") or None,
        timeout=timeout,
    )


def client_from_env(env: Mapping[str, str] | None = None) -> OpenSearch:
    """An ``OpenSearch`` client configured from the environment."""
    return config_from_env(env).client()


DEFAULT_CONN_ID = "opensearch_default"


def client_from_airflow(conn_id: str = DEFAULT_CONN_ID) -> OpenSearch:
    """An ``OpenSearch`` client from an Airflow connection (``OpenSearchHook``), with the CLI's defaults where the
    connection is silent: certificates verified (the hook's own default is not to verify: basic-auth credentials
    would cross an unverified TLS link), a DEFAULT_TIMEOUT timeout retried 3 times (its client's is 10 s, never
    retried). The default connection left undefined: the environment (``OPENSEARCH_*``), as the CLI reads it; any
    other connection the config names must exist."""
    from airflow.providers.opensearch.hooks.opensearch import OpenSearchHook
    from airflow.sdk.exceptions import AirflowNotFoundException

    try:
        hook = OpenSearchHook(open_search_conn_id=conn_id, log_query=False)
    except AirflowNotFoundException:
        if conn_id != DEFAULT_CONN_ID:
            raise
        log.info("Airflow connection %r is not defined: OpenSearch from the environment (OPENSEARCH_*)", conn_id)
        return client_from_env()
    extra = hook.conn.extra_dejson
    if "verify_certs" not in extra:
        hook.verify_certs = True
    if extra.get("timeout") is None:
        hook.timeout = DEFAULT_TIMEOUT
    log.info("OpenSearch client from Airflow connection %r", conn_id)
    client = hook.client
    client.transport.max_retries, client.transport.retry_on_timeout = 3, True
    return client


def client_for(section: config.OpenSearch) -> OpenSearch:
    """The client the config's ``backend.opensearch`` section asks for: its Airflow connection
    when it names one (under Airflow), else the environment (the CLI)."""
    conn_id = section.airflow_conn_id
    return client_from_airflow(conn_id) if conn_id else client_from_env()
