"""Webhooks against a local HTTP server: the body signed with HMAC-SHA256, retried with
capped backoff after failures, not retried after a refusal, a full queue dropping."""

from __future__ import annotations

import hashlib
import hmac
import http.server
import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import httpx
import pytest

from control_plane.errors import InvalidInputError
from control_plane.rollouts.notify import (
    SIGNATURE_HEADER,
    WebhookConfig,
    WebhookNotifier,
    backoff_s,
    sign,
)

SECRET = b"s3cret-s3cret-s3cret"
EVENT = {"rollout": "12", "kind": "rolling-back", "text": "rollout 12: p99 +38 % vs control"}


@dataclass
class Receiver:
    """Answers each POST with the next status of `script` (then 200); keeps what came."""

    script: list[int] = field(default_factory=list)
    received: list[tuple[dict[str, str], bytes]] = field(default_factory=list)
    arrived: threading.Condition = field(default_factory=threading.Condition)

    def wait_for(self, count: int, timeout_s: float = 10.0) -> None:
        deadline = time.monotonic() + timeout_s
        with self.arrived:
            while len(self.received) < count:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"{len(self.received)} of {count} requests arrived")
                self.arrived.wait(left)


@pytest.fixture
def receiver() -> Iterator[tuple[Receiver, str]]:
    got = Receiver()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["Content-Length"]))
            status = got.script.pop(0) if got.script else 200
            self.send_response(status)
            self.send_header("Content-Length", "0")
            self.end_headers()
            with got.arrived:
                got.received.append((dict(self.headers), body))
                got.arrived.notify_all()

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield got, f"http://127.0.0.1:{server.server_address[1]}/hook"
    finally:
        server.shutdown()
        server.server_close()


def notifier(url: str, **changes: object) -> WebhookNotifier:
    options: dict[str, object] = {
        "urls": (url,),
        "secret": SECRET,
        "backoff_base_s": 0.01,
        "backoff_cap_s": 0.05,
        **changes,
    }
    return WebhookNotifier(WebhookConfig(**options))  # type: ignore[arg-type]


def test_an_event_arrives_signed(receiver: tuple[Receiver, str]) -> None:
    got, url = receiver
    hooks = notifier(url)
    try:
        assert hooks.submit(EVENT)
        got.wait_for(1)
    finally:
        hooks.close()
    headers, body = got.received[0]
    assert json.loads(body) == EVENT
    expected = "sha256=" + hmac.new(SECRET, body, hashlib.sha256).hexdigest()
    assert headers[SIGNATURE_HEADER] == expected == sign(body, SECRET)
    assert headers["X-Edgefleet-Event"] == "rolling-back"
    assert hooks.stats.delivered == 1


def test_failures_are_retried_and_refusals_are_not(receiver: tuple[Receiver, str]) -> None:
    got, url = receiver
    got.script = [503, 500, 200, 400]
    hooks = notifier(url, attempts=4)
    try:
        hooks.submit(EVENT)
        got.wait_for(3)
        hooks.submit({**EVENT, "kind": "paused"})
        got.wait_for(4)
        deadline = time.monotonic() + 5
        while not hooks.idle() and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        hooks.close()
    bodies = [json.loads(body)["kind"] for _, body in got.received]
    assert bodies == ["rolling-back", "rolling-back", "rolling-back", "paused"]
    ids = {headers["X-Edgefleet-Delivery"] for headers, _ in got.received[:3]}
    assert len(ids) == 1  # one delivery, tried three times
    assert (hooks.stats.delivered, hooks.stats.retried, hooks.stats.failed) == (1, 2, 1)


def test_a_dead_receiver_gives_up_after_the_attempts(receiver: tuple[Receiver, str]) -> None:
    got, url = receiver
    got.script = [503] * 10
    hooks = notifier(url, attempts=3)
    try:
        hooks.submit(EVENT)
        got.wait_for(3)
        deadline = time.monotonic() + 5
        while hooks.stats.failed == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        hooks.close()
    assert len(got.received) == 3
    assert hooks.stats.failed == 1


def test_the_queue_is_bounded_and_submit_never_blocks() -> None:
    # The receiver hangs on the first delivery until released: the queue fills behind it.
    release = threading.Event()

    def hanging(request: httpx.Request) -> httpx.Response:
        release.wait(5)
        return httpx.Response(204)

    config = WebhookConfig(
        urls=("http://hooks.example/hook",), secret=SECRET, queue_size=3, attempts=1
    )
    hooks = WebhookNotifier(config, transport=httpx.MockTransport(hanging))
    try:
        started = time.monotonic()
        taken = [hooks.submit(EVENT) for _ in range(10)]
        assert time.monotonic() - started < 0.5
    finally:
        release.set()
        hooks.close()
    assert taken.count(False) >= 6
    assert hooks.stats.dropped == taken.count(False)


def test_backoff_doubles_up_to_its_cap() -> None:
    assert [backoff_s(n, 1.0, 8.0, 1.0) for n in range(1, 7)] == [1, 2, 4, 8, 8, 8]
    assert backoff_s(3, 1.0, 8.0, 0.5) == 2.0


def test_bad_settings_are_named() -> None:
    with pytest.raises(InvalidInputError, match="http"):
        WebhookConfig(("ftp://x",), SECRET)
    with pytest.raises(InvalidInputError) as short:
        WebhookConfig(("https://chat.example/hook",), b"short")
    assert short.value.fields["field"] == "webhook_secret"
