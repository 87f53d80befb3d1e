"""`sourcegate serve`'s connections, without models: the request handler driven over a socket pair with a stand-in for
the live version (LiveServing), and the queue in front of the models. A silent client is closed and frees its thread,
a malformed header is a JSON refusal and never a traceback, a probe's HEAD gets no body, a full queue refuses at once,
and a stop waits for the questions already taken."""

from __future__ import annotations

import socket
import threading
import time

import pytest

from sourcegate.pipelines.app import serve


class StandIn:
    """What the handler asks of LiveServing."""

    def __init__(self, busy: bool = False):
        self.busy = busy

    def health(self):
        return 200, {"status": "ok", "version": "v1"}

    def query(self, body: bytes):
        question, _ = serve.parse_question(body)
        if self.busy:
            raise serve.Busy("busy: 32 questions are waiting for the models; ask again shortly")
        return 200, {"question": question}


def exchange(raw: bytes, live=None, idle_s: float = 0.5, wait_s: float = 5.0) -> tuple[bytes, BaseException | None]:
    """Send `raw` to a handler on one end of a socket pair; what it sent back until it closed the connection, and
    any exception that escaped it. Fails if the handler still holds its thread after `wait_s`."""
    handler = type("H", (serve.Handler,), {"live": live or StandIn(), "timeout": idle_s})
    client, server_end = socket.socketpair()
    escaped: list[BaseException] = []

    def run():
        try:
            handler(server_end, ("127.0.0.1", 1), object())
        except BaseException as exc:  # noqa: BLE001 - what the test looks for
            escaped.append(exc)
        finally:
            server_end.close()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    client.sendall(raw)
    client.settimeout(wait_s)
    received = b""
    while chunk := client.recv(65536):
        received += chunk
    thread.join(wait_s)
    assert not thread.is_alive(), "the handler still holds its thread"
    client.close()
    return received, (escaped[0] if escaped else None)


def test_an_idle_keep_alive_connection_is_closed_and_frees_its_thread():
    assert 0 < serve.Handler.timeout == serve.IDLE_S <= 60  # the served handler's own bound (here shortened)
    got, escaped = exchange(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")  # then silence, the connection kept open
    assert got.startswith(b"HTTP/1.1 200") and b'"version": "v1"' in got and escaped is None


def test_a_body_that_never_arrives_is_given_up_without_an_answer_or_a_traceback():
    got, escaped = exchange(b"POST /query HTTP/1.1\r\nContent-Length: 100\r\n\r\n" + b'{"question": "wh')
    assert got == b"" and escaped is None


@pytest.mark.parametrize("length", ["\u00b2".encode(), b"1" * 5000, b"-1", b"12abc"])
def test_a_content_length_that_is_not_a_number_of_bytes_is_a_411_in_json(length):
    got, escaped = exchange(b"POST /query HTTP/1.1\r\nContent-Length: " + length + b"\r\n\r\n")
    assert escaped is None and got.startswith(b"HTTP/1.1 411") and b'"error": "a Content-Length header' in got


def test_a_head_probe_of_health_gets_its_status_and_headers_and_no_body():
    got, escaped = exchange(b"HEAD /health HTTP/1.1\r\nConnection: close\r\n\r\n")
    head, _, body = got.partition(b"\r\n\r\n")
    assert escaped is None and head.startswith(b"HTTP/1.1 200") and b"Content-Length: " in head and body == b""
    got, _ = exchange(b"HEAD /nowhere HTTP/1.1\r\nConnection: close\r\n\r\n")
    assert got.startswith(b"HTTP/1.1 404") and got.endswith(b"\r\n\r\n")


def test_a_question_refused_as_busy_is_a_503_with_retry_after():
    body = b'{"question": "Can I bring my bike?"}'
    raw = b"POST /query HTTP/1.1\r\nConnection: close\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
    got, escaped = exchange(raw, StandIn(busy=True))
    assert escaped is None and got.startswith(b"HTTP/1.1 503") and b"Retry-After: 1" in got and b"busy: 32" in got


def test_the_queue_refuses_past_its_bound_at_once_and_a_drain_waits_for_what_it_took():
    queue = serve.ModelQueue(max_waiting=1)
    release, started = threading.Event(), threading.Event()

    def hold():
        with queue.turn():
            started.set()
            release.wait(10)

    holder = threading.Thread(target=hold)
    holder.start()
    started.wait(10)
    waited: list[float] = []

    def wait_turn():
        with queue.turn() as queued:
            waited.append(queued)

    waiter = threading.Thread(target=wait_turn)
    waiter.start()
    while queue.waiting < 1:
        time.sleep(0.01)
    with pytest.raises(serve.Busy, match="busy: 1 questions are waiting"), queue.turn():
        pass
    assert queue.drain(0.2) == 2  # one at the models, one waiting: neither answered yet
    release.set()
    assert queue.drain(10) == 0
    holder.join(), waiter.join()
    assert waited and waited[0] > 0 and (queue.waiting, queue.taken) == (0, 0)


def test_an_ipv6_loopback_host_binds_and_is_written_as_a_url_host():
    """`serve --host ::1` failed after the models loaded (an IPv4 socket cannot bind an IPv6 address)."""
    server = serve.Server(("::1", 0), serve.Handler)
    try:
        host, port = server.server_address[:2]
        assert host == "::1" and port > 0 and server.address_family == socket.AF_INET6
        assert serve._url_host(host) == "[::1]" and serve._url_host("127.0.0.1") == "127.0.0.1"
    finally:
        server.server_close()


def test_a_version_being_opened_holds_no_lock_and_requests_meanwhile_get_the_one_before():
    """Opening a new version (on an object store: a download, then verifying every file) held the swap lock, so
    /health and every question waited behind it. The request that sees LIVE move opens it; the others are answered
    by the version loaded before, which each answer names."""
    opened, release = threading.Event(), threading.Event()

    class Store:
        live_now = "v1"

        def live(self):
            return self.live_now

    live = serve.LiveServing.__new__(serve.LiveServing)  # no models: only the swap is tested
    live.store, live.swap, live.opening = Store(), threading.Lock(), False
    live.loaded = serve.Loaded("v1", serving="serving v1")

    def slow_open(version):
        opened.set()
        release.wait(10)
        return serve.Loaded(version, serving=f"serving {version}")

    live.open = slow_open
    live.store.live_now = "v2"
    opener = threading.Thread(target=live.current)
    opener.start()
    assert opened.wait(10)
    meanwhile = live.current()  # at once, while v2 is being opened
    assert (meanwhile.version, meanwhile.serving) == ("v1", "serving v1")
    release.set()
    opener.join(10)
    assert (live.current().version, live.loaded.serving) == ("v2", "serving v2")
