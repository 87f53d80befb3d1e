"""`sourcegate serve`: the live version answered over HTTP by one long-lived process, models loaded once.

    GET  /health   200 {"status": "ok", "version", "proven_by", "unproven", "overridden", "kept_text_vectors"}
                   (the text vectors lent by the verdict's night, factories.kept_text_vectors) when the live version
                   and the decision its verdict proved can be served; 503 {"status": "unavailable", "version",
                   "error"} when there is no live version or its decision cannot be served (the reason `query`
                   would exit 2 with)
    POST /query    {"question": "...", "context": ["a prior turn", ...]} -> the payload of `query --json`
                   (answering.ask: the signals the proven decision reads, every signal with --all-signals)
                   plus "version" and "timings_s" (seconds per stage, this process); 503 with
                   that payload when the proven decision could not be applied (query's exit 2), or busy;
                   400 naming what is wrong with the body; 411 without a Content-Length; 413 over MAX_BODY
    HEAD /health   /health's status and headers (a load balancer's probe)

What is served is what `query` serves (factories.serving_for): the version LIVE names and the decision its passed
verdict proved, a differing config value or model refused unless --unproven. LIVE is read on every request (the
pointer file; one GET on an object store; the alias lookup on OpenSearch), so the first request after a promotion
or a rollback is answered by the new version; a version is opened, verified and its decision checked once, by that
request (requests meanwhile are answered by the version before, and say so in "version"). The models are loaded at
start and kept: a changed model or config needs a restart.

Concurrency: requests are handled on threads, but one question at a time goes through the models (ModelQueue). The
embedder's tokenizer (a Hugging Face fast tokenizer, whose truncation settings are set on every call) and the
cross-encoders' pair memo are not safe to share between threads, and on a few cores a second concurrent ONNX run
only competes for the same cores. At most MAX_WAITING questions wait; one more is a 503 with Retry-After at once.
Opening a version holds no lock, so /health never waits behind a queue of questions or a download. A connection
silent for IDLE_S is closed. SIGTERM stops taking connections and gives the questions already taken DRAIN_S.

Everything sent is JSON (corpus text is untrusted: never HTML), errors included; a failure is one line naming its
cause, never a traceback (that goes to the log). It listens on loopback by default and has no authentication.
"""

from __future__ import annotations

import json
import logging
import signal
import socket
import threading
import time
from collections.abc import Sequence
from contextlib import contextmanager
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
MAX_QUESTION_CHARS = 2_000  # a question, not a document: every term of it is searched (one count each on OpenSearch)
IDLE_S = 30.0  # a connection silent this long (idle keep-alive, a body that never comes) is closed: it holds a thread
MAX_WAITING = 32  # questions waiting for the models; past this a new one is refused at once (503, Retry-After)
DRAIN_S = 20.0  # on SIGTERM: questions already being answered get this long to finish before the process exits
RETRY_S = 5.0  # a version that could not be served is tried again after this long (a node may come back)
LOOPBACK = ("127.0.0.1", "localhost", "::1")
WARM_UP = "warm up"  # one question through every model at start, so the first client does not pay the first run


class BadRequest(ValueError):
    """A request body that is not a question; its message names what is wrong."""


class Busy(RuntimeError):
    """Too many questions already wait for the models: refused at once (503 with Retry-After)."""


def parse_question(body: bytes) -> tuple[str, list[str]]:
    """The question and its prior turns from a /query body: a JSON object with a non-empty string `question`
    and optionally `context`, a list of strings; nothing else."""
    try:
        data = json.loads(body.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise BadRequest(f"the body is not UTF-8: {exc}") from None
    except json.JSONDecodeError as exc:
        raise BadRequest(f"the body is not JSON: {exc}") from None
    except RecursionError:
        raise BadRequest("the body nests too deeply to be a question") from None
    if not isinstance(data, dict):
        raise BadRequest(f'the body must be a JSON object {{"question": ...}}, not {type(data).__name__}')
    unknown = sorted(set(data) - {"question", "context"})
    if unknown:
        raise BadRequest(f"unknown field(s) {', '.join(unknown)}: a body has question and optionally context")
    question = data.get("question")
    if not isinstance(question, str) or not question.strip():
        raise BadRequest('"question" must be a non-empty string')
    if not any(ch.isalnum() for ch in question):
        raise BadRequest('"question" has no letter or digit: nothing to search for')
    if len(question) > MAX_QUESTION_CHARS:
        raise BadRequest(
            f'"question" is {len(question)} characters; at most {MAX_QUESTION_CHARS} (a question, not a text)'
        )
    context = data.get("context", [])
    if not isinstance(context, list) or not all(isinstance(turn, str) for turn in context):
        raise BadRequest('"context" must be a list of strings (the prior turns)')
    for name, text in (("question", question), *(("context", turn) for turn in context)):
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as exc:  # a lone surrogate escaped in JSON ("\ud800"): no tokenizer reads it
            raise BadRequest(f'"{name}" is not valid Unicode: {exc.reason} at {exc.start}') from None
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


class ModelQueue:
    """One question at a time through the models, at most `max_waiting` waiting for them (a new one past that is
    refused at once: Busy), and a drain that waits for the questions already taken when the server stops."""

    def __init__(self, max_waiting: int):
        self.max_waiting = max_waiting
        self.models = threading.Lock()
        self.state = threading.Condition()  # guards the two counts; notified as a question ends
        self.waiting = 0  # taken, not yet at the models
        self.taken = 0  # taken, not yet answered (waiting included): what a drain waits for

    @contextmanager
    def turn(self):
        """Hold the models for one question; yields the seconds it waited for them."""
        with self.state:
            if self.waiting >= self.max_waiting:
                raise Busy(f"busy: {self.waiting} questions are waiting for the models; ask again shortly")
            self.waiting += 1
            self.taken += 1
        start, at_models = time.perf_counter(), False
        try:
            with self.models:
                with self.state:
                    self.waiting -= 1
                at_models = True
                yield time.perf_counter() - start
        finally:
            with self.state:
                if not at_models:  # interrupted while waiting
                    self.waiting -= 1
                self.taken -= 1
                self.state.notify_all()

    def drain(self, timeout_s: float) -> int:
        """Wait up to `timeout_s` for the questions taken; returns how many were still unanswered."""
        deadline = time.monotonic() + timeout_s
        with self.state:
            while self.taken and (left := deadline - time.monotonic()) > 0:
                self.state.wait(left)
            return self.taken


class LiveServing:
    """The Serving of whichever version LIVE names now, opened when LIVE first names it."""

    def __init__(self, cfg: PipelineConfig, unproven: bool = False, all_signals: bool = False):
        self.cfg, self.unproven, self.all_signals = cfg, unproven, all_signals
        self.store = open_store(cfg)
        self.swap = threading.Lock()  # guards `loaded` and `opening`; never held while a version is opened
        self.opening = False  # a request is opening the version LIVE now names; the others keep the loaded one
        self.queue = ModelQueue(MAX_WAITING)  # one question at a time through the models (see the module doc)
        self.loaded = Loaded(None, error="not opened yet")

    def warm(self) -> None:
        """Load the models the config names (kept for the process's life) and the live version, and ask one
        question through them. A warm-up question that fails is logged: the server still starts, and its requests
        say what fails."""
        get_embedder(self.cfg.embedding)
        scorer_for(self.cfg.reranker.kind, self.cfg.reranker.model_path)
        if self.cfg.answerability.answer_support:
            answer_scorer_for(self.cfg.answerability.answer_model_path)
        loaded = self.current()
        if loaded.serving is not None:
            try:
                self.ask(loaded.serving, WARM_UP, [])
            except Exception:  # noqa: BLE001 - a transient search error at start is no reason not to serve
                log.warning("serve: the warm-up question failed; serving anyway", exc_info=True)

    def current(self) -> Loaded:
        """The live version's Serving, reading LIVE now. A version is opened once, by the first request that sees
        LIVE name it, outside the lock: requests meanwhile are answered by the version loaded before (each answer
        names its version) and /health never waits behind a download. A failure is retried after RETRY_S."""
        try:
            live = self.store.live()
        except Exception as exc:  # noqa: BLE001 - the store unreachable: unavailable, said in one line
            log.warning("serve: reading the live pointer failed", exc_info=True)
            return Loaded(None, error=f"cannot read the live pointer: {one_line(exc)}")
        if live is None:
            return Loaded(None, error="no live version: promote one first (`sourcegate run` or `promote`)")
        with self.swap:
            loaded = self.loaded
            due = loaded.version != live or (loaded.serving is None and time.monotonic() - loaded.at >= RETRY_S)
            opener = due and not self.opening
            if not opener:
                return loaded
            self.opening = True
        opened = None
        try:
            opened = self.open(live)
            return opened
        finally:
            with self.swap:
                self.opening = False
                self.loaded = opened or self.loaded

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
        models included as `queued`). Busy when MAX_WAITING questions already wait."""
        with self.queue.turn() as queued:
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
    timeout = IDLE_S  # socketserver sets it on the connection: a silent client is closed, its thread freed
    live: LiveServing  # set on the class `serve` builds

    def do_GET(self):  # noqa: N802 - the name http.server dispatches to
        if self.path.split("?", 1)[0] != "/health":
            return self.send_json(
                404, {"error": f"no such endpoint: {self.command} {self.path} (GET /health, POST /query)"}
            )
        self.answer(self.live.health)

    do_HEAD = do_GET  # noqa: N815 - a load balancer's probe: /health's status and headers, no body

    def do_POST(self):  # noqa: N802
        length = self.headers.get("Content-Length")
        refused = None  # (status, error) of a request whose body is not read
        if self.path.split("?", 1)[0] != "/query":
            refused = 404, f"no such endpoint: POST {self.path} (GET /health, POST /query)"
        elif length is None or not (length.isascii() and length.isdigit() and len(length) <= 9):
            refused = 411, "a Content-Length header (a number of bytes) is required; chunked bodies are not read"
        elif int(length) > MAX_BODY:
            refused = 413, f"the body is {length} bytes; at most {MAX_BODY}"
        if refused:
            self.close_connection = True  # its body was not read: the connection cannot carry another request
            return self.send_json(refused[0], {"error": refused[1]})
        try:
            body = self.rfile.read(int(length))
        except OSError as exc:  # the client went silent for IDLE_S mid-body, or went away: nothing to answer
            self.close_connection = True
            log.info("serve: %s: the body of POST %s did not arrive (%s)", self.address_string(), self.path, exc)
            return
        if len(body) < int(length):  # the client closed before sending all it announced
            self.close_connection = True
            return
        self.answer(lambda: self.live.query(body))

    def answer(self, respond) -> None:
        headers = {}
        try:
            code, payload = respond()
        except BadRequest as exc:
            code, payload = 400, {"error": str(exc)}
        except Busy as exc:
            code, payload, headers = 503, {"error": str(exc)}, {"Retry-After": "1"}
        except Exception as exc:  # noqa: BLE001 - one line to the client, the traceback to the log
            log.exception("serve: %s %s failed", self.command, self.path)
            code, payload = 500, {"error": one_line(exc)}
        self.send_json(code, payload, headers)

    def send_json(self, code: int, payload: dict, headers: dict | None = None) -> None:
        data = json.dumps(payload, sort_keys=True).encode("utf-8")  # ASCII-escaped: corpus text is never markup
        try:
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("X-Content-Type-Options", "nosniff")
            self.send_header("Content-Length", str(len(data)))
            for name, value in (headers or {}).items():
                self.send_header(name, value)
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(data)
        except OSError as exc:  # the client left while its question waited: no one to answer
            self.close_connection = True
            log.info("serve: %s left before its answer (%s)", self.address_string(), exc)

    def send_error(self, code, message=None, explain=None):
        """http.server's own errors (a malformed request line, an unsupported method) as JSON, not its HTML page."""
        self.close_connection = True
        self.send_json(code, {"error": message or self.responses.get(code, ("error",))[0]})

    def log_message(self, format, *args):  # noqa: A002 - http.server's signature
        log.info("%s %s", self.address_string(), format % args)


class Server(ThreadingHTTPServer):
    daemon_threads = True  # an idle keep-alive connection never holds the exit: `serve` drains answers itself
    # socketserver's default backlog (5) overflows when a burst of clients connects while the process is busy:
    # the kernel falls back to SYN cookies and clients see their connection reset (measured at 16 clients)
    request_queue_size = 128

    def __init__(self, address, handler):
        self.address_family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET  # `--host ::1` binds
        super().__init__(address, handler)


def serve(
    cfg: PipelineConfig, host: str = "127.0.0.1", port: int = 8765, unproven: bool = False, all_signals: bool = False
) -> int:
    """Serve until SIGINT or SIGTERM (exit 0; questions being answered get DRAIN_S to finish). The first line
    printed names the address (the port chosen when `port` is 0) and the live version, once the models are loaded.
    `all_signals`: as `query --all-signals`."""

    def stop(signum, frame):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, stop)  # before the models load: a stop while warming is an exit 0 too
    try:
        live = LiveServing(cfg, unproven, all_signals)
        live.warm()
    except KeyboardInterrupt:
        return 0
    handler = type("LiveHandler", (Handler,), {"live": live})
    server = Server((host, port), handler)
    bound_host, bound_port = server.server_address[:2]
    loaded = live.current()
    state = f"version {loaded.version}" if loaded.serving else f"unavailable: {loaded.error}"
    print(f"sourcegate serve: http://{_url_host(bound_host)}:{bound_port} ({state})", flush=True)
    if host not in LOOPBACK:
        print(f"sourcegate serve: listening on {host} without authentication", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)  # a second SIGTERM stops at once, not after the drain
        server.server_close()  # no new connection; the questions already being answered finish
        left = live.queue.drain(DRAIN_S)
        if left:
            log.warning("serve: stopped with %d question(s) unanswered after %.0f s", left, DRAIN_S)
    return 0


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host
