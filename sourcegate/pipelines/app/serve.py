"""`sourcegate serve`: the live version answered over HTTP by one long-lived process, models loaded once.

    GET  /health   200 {"status": "ok", "version", "proven_by", "unproven", "overridden", "kept_text_vectors"}
                   (the text vectors lent by the verdict's night, factories.kept_text_vectors) when the live version
                   and the decision its verdict proved can be served; 503 {"status": "unavailable", "version",
                   "error"} when there is no live version or its decision cannot be served (the reason `query`
                   would exit 2 with)
    POST /query    {"question": "...", "context": ["a prior turn", ...]} -> the payload of `query --json`
                   (answering.ask: the signals the proven decision reads, every signal with --all-signals)
                   plus "version" and "timings_s" (seconds per stage, this process); 503 with
                   that payload when the proven decision could not be applied (query's exit 2); 400 naming what
                   is wrong with the body

What is served is what `query` serves (factories.serving_for): the version LIVE names and the decision its passed
verdict proved, a differing config value or model refused unless --unproven. LIVE is read on every request (the
pointer file; one GET on an object store; the alias lookup on OpenSearch), so the first request after a promotion
or a rollback is answered by the new version; a version is opened, verified and its decision checked once, when
LIVE first names it. The models are loaded at start and kept: a changed model or config needs a restart.

Concurrency: requests are handled on threads, but one question at a time goes through the models. The embedder's
tokenizer (a Hugging Face fast tokenizer, whose truncation settings are set on every call) and the cross-encoders'
pair memo are not safe to share between threads, and on a few cores a second concurrent ONNX run only competes
for the same cores. Version swaps take a lock of their own, so /health never waits behind a queue of questions.

Everything sent is JSON (corpus text is untrusted: never HTML), errors included; a failure is one line naming its
cause, never a traceback (that goes to the log). It listens on loopback by default and has no authentication.
"""

from __future__ import annotations

import json
import logging
import signal
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from sourcegate.pipelines.app.answering import ask
from sourcegate.pipelines.app.factories import (
    Serving,
    answer_scorer_for,
    get_embedder,
    open_store,
    scorer_for,
    serving_for,
)
from sourcegate.pipelines.config import PipelineConfig

log = logging.getLogger(__name__)

MAX_BODY = 64 * 1024  # a question and its prior turns; anything larger is not a question
RETRY_S = 5.0  # a version that could not be served is tried again after this long (a node may come back)
LOOPBACK = ("127.0.0.1", "localhost", "::1")
WARM_UP = "warm up"  # one question through every model at start, so the first client does not pay the first run


class BadRequest(ValueError):
    """A request body that is not a question; its message names what is wrong."""


def parse_question(body: bytes) -> tuple[str, list[str]]:
    """The question and its prior turns from a /query body: a JSON object with a non-empty string `question`
    and optionally `context`, a list of strings; nothing else."""
    try:
        data = json.loads(body.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise BadRequest(f"the body is not UTF-8: {exc}") from None
    except json.JSONDecodeError as exc:
        raise BadRequest(f"the body is not JSON: {exc}") from None
    if not isinstance(data, dict):
        raise BadRequest(f'the body must be a JSON object {{"question": ...}}, not {type(data).__name__}')
    unknown = sorted(set(data) - {"question", "context"})
    if unknown:
        raise BadRequest(f"unknown field(s) {', '.join(unknown)}: a body has question and optionally context")
    question = data.get("question")
    if not isinstance(question, str) or not question.strip():
        raise BadRequest('"question" must be a non-empty string')
    context = data.get("context", [])
    if not isinstance(context, list) or not all(isinstance(turn, str) for turn in context):
        raise BadRequest('"context" must be a list of strings (the prior turns)')
    return question, context


@dataclass(frozen=True)
class Loaded:
    """What LIVE named when last looked at, and its Serving, or why it cannot be served."""

    version: str | None
    serving: Serving | None = None
    error: str | None = None
    at: float = field(default_factory=time.monotonic)


def served_version(serving: Serving) -> str | None:
    """The version a Serving's searcher opened (its verified manifest names it)."""
    manifest = getattr(serving.retriever.searcher, "manifest", None) or {}
    return manifest.get("version")


def one_line(exc: BaseException) -> str:
    from sourcegate.pipelines.app.errors import exit_line
    from sourcegate.pipelines.search.opensearch.client import config_from_env, redact_url

    try:
        url = redact_url(config_from_env().url)
    except ValueError as bad:
        url = f"(OPENSEARCH_URL invalid: {bad})"
    return exit_line(exc, "serve", url)


class LiveServing:
    """The Serving of whichever version LIVE names now, opened when LIVE first names it."""

    def __init__(self, cfg: PipelineConfig, unproven: bool = False, all_signals: bool = False):
        self.cfg, self.unproven, self.all_signals = cfg, unproven, all_signals
        self.store = open_store(cfg)
        self.swap = threading.Lock()  # one reader of LIVE opens a new version; the others wait for it
        self.models = threading.Lock()  # one question at a time through the models (see the module doc)
        self.loaded = Loaded(None, error="not opened yet")

    def warm(self) -> None:
        """Load the models the config names (kept for the process's life) and the live version."""
        get_embedder(self.cfg.embedding)
        scorer_for(self.cfg.reranker.kind, self.cfg.reranker.model_path)
        if self.cfg.answerability.answer_support:
            answer_scorer_for(self.cfg.answerability.answer_model_path)
        loaded = self.current()
        if loaded.serving is not None:
            self.ask(loaded.serving, WARM_UP, [])

    def current(self) -> Loaded:
        """The live version's Serving, reading LIVE now; a version is opened once, a failure retried after RETRY_S."""
        with self.swap:
            try:
                live = self.store.live()
            except Exception as exc:  # noqa: BLE001 - the store unreachable: unavailable, said in one line
                log.warning("serve: reading the live pointer failed", exc_info=True)
                return Loaded(None, error=f"cannot read the live pointer: {one_line(exc)}")
            if live is None:
                return Loaded(None, error="no live version: promote one first (`sourcegate run` or `promote`)")
            stale = self.loaded.version != live
            if stale or (self.loaded.serving is None and time.monotonic() - self.loaded.at >= RETRY_S):
                self.loaded = self.open(live)
            return self.loaded

    def open(self, live: str) -> Loaded:
        try:
            serving = serving_for(self.cfg, unproven=self.unproven, all_signals=self.all_signals)
        except Exception as exc:  # noqa: BLE001 - refused or unreadable: unavailable until LIVE moves or a retry
            log.warning("serve: the live version %s cannot be served", live, exc_info=True)
            return Loaded(live, error=one_line(exc))
        version = served_version(serving) or live  # LIVE may have moved again in between: the next request sees it
        log.info(
            "serve: serving version %s (%s, %d kept text vectors)", version, serving.proven_by, serving.kept_vectors
        )
        return Loaded(version, serving)

    def ask(self, serving: Serving, question: str, context: Sequence[str]) -> dict:
        """query's payload, and the seconds each stage took in this process (`timings_s`: waiting for the
        models included as `queued`)."""
        waited = time.perf_counter()
        with self.models:
            queued = time.perf_counter() - waited
            answered = ask(self.cfg, serving, question, context)
        timings = {"queued": queued, **answered.retrieval.timings}
        return {**answered.payload, "timings_s": {k: round(v, 4) for k, v in timings.items()}}

    def health(self) -> tuple[int, dict]:
        loaded = self.current()
        if loaded.serving is None:
            return 503, {"status": "unavailable", "version": loaded.version, "error": loaded.error}
        serving = loaded.serving
        return 200, {
            "status": "ok",
            "version": loaded.version,
            "proven_by": None if serving.overridden else serving.proven_by,
            "unproven": bool(serving.overridden),
            "overridden": serving.overridden,
            "kept_text_vectors": serving.kept_vectors,
        }

    def query(self, body: bytes) -> tuple[int, dict]:
        question, context = parse_question(body)
        loaded = self.current()
        if loaded.serving is None:
            return 503, {"error": loaded.error, "version": loaded.version}
        payload = {**self.ask(loaded.serving, question, context), "version": loaded.version}
        return (200 if payload["decision_applied"] else 503), payload


class Handler(BaseHTTPRequestHandler):
    server_version = "sourcegate"
    protocol_version = "HTTP/1.1"  # keep-alive: a client asks many questions over one connection
    live: LiveServing  # set on the class `serve` builds

    def do_GET(self):  # noqa: N802 - the name http.server dispatches to
        if self.path.split("?", 1)[0] != "/health":
            return self.send_json(404, {"error": f"no such endpoint: GET {self.path} (GET /health, POST /query)"})
        self.answer(self.live.health)

    def do_POST(self):  # noqa: N802
        length = self.headers.get("Content-Length")
        refused = None  # (status, error) of a request whose body is not read
        if self.path.split("?", 1)[0] != "/query":
            refused = 404, f"no such endpoint: POST {self.path} (GET /health, POST /query)"
        elif length is None or not length.isdigit():
            refused = 411, "a Content-Length header is required"
        elif int(length) > MAX_BODY:
            refused = 413, f"the body is {length} bytes; at most {MAX_BODY}"
        if refused:
            self.close_connection = True  # its body was not read: the connection cannot carry another request
            return self.send_json(refused[0], {"error": refused[1]})
        body = self.rfile.read(int(length))
        self.answer(lambda: self.live.query(body))

    def answer(self, respond) -> None:
        try:
            code, payload = respond()
        except BadRequest as exc:
            code, payload = 400, {"error": str(exc)}
        except Exception as exc:  # noqa: BLE001 - one line to the client, the traceback to the log
            log.exception("serve: %s %s failed", self.command, self.path)
            code, payload = 500, {"error": one_line(exc)}
        self.send_json(code, payload)

    def send_json(self, code: int, payload: dict) -> None:
        data = json.dumps(payload, sort_keys=True).encode("utf-8")  # ASCII-escaped: corpus text is never markup
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("X-Content-Type-Options", "nosniff")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def send_error(self, code, message=None, explain=None):
        """http.server's own errors (a malformed request line, an unsupported method) as JSON, not its HTML page."""
        self.close_connection = True
        self.send_json(code, {"error": message or self.responses.get(code, ("error",))[0]})

    def log_message(self, format, *args):  # noqa: A002 - http.server's signature
        log.info("%s %s", self.address_string(), format % args)


class Server(ThreadingHTTPServer):
    daemon_threads = True
    # socketserver's default backlog (5) overflows when a burst of clients connects while the process is busy:
    # the kernel falls back to SYN cookies and clients see their connection reset (measured at 16 clients)
    request_queue_size = 128


def serve(
    cfg: PipelineConfig, host: str = "127.0.0.1", port: int = 8765, unproven: bool = False, all_signals: bool = False
) -> int:
    """Serve until SIGINT or SIGTERM (exit 0). The first line printed names the address (the port chosen when
    `port` is 0) and the live version, once the models are loaded. `all_signals`: as `query --all-signals`."""
    live = LiveServing(cfg, unproven, all_signals)
    live.warm()
    handler = type("LiveHandler", (Handler,), {"live": live})
    server = Server((host, port), handler)
    bound_host, bound_port = server.server_address[:2]
    loaded = live.current()
    state = f"version {loaded.version}" if loaded.serving else f"unavailable: {loaded.error}"
    print(f"sourcegate serve: http://{bound_host}:{bound_port} ({state})", flush=True)
    if host not in LOOPBACK:
        print(f"sourcegate serve: listening on {host} without authentication", flush=True)

    def stop(signum, frame):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, stop)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0
