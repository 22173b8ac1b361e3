"""Rollout decisions and alerts to webhooks: JSON POSTs signed with HMAC-SHA256, retried
with capped backoff from a bounded queue, on a thread of their own.

What it is for: a team's chat or pager hears "rollout 12: rolling back at stage 1 of 3
(1): the gates failed ... p99 +38 % vs control" without polling. `submit` never blocks and
never raises: the controller hands an event over and goes on; a full queue drops the
event (counted in `stats`). The body is signed with the shared secret, so a receiver
can check who sent it: ``X-Edgefleet-Signature: sha256=<hex of HMAC-SHA256(secret,
body)>``. What it is not for: deciding what to send (the controller's `Notify` actions)
or delivering to nodes. `NullNotifier` stands in when no URL is configured.
"""

from __future__ import annotations

import hashlib
import heapq
import hmac
import json
import logging
import random
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Protocol
from urllib.parse import urlsplit

import httpx

from control_plane.errors import InvalidInputError

__all__ = [
    "SIGNATURE_HEADER",
    "Notifier",
    "NotifierStats",
    "NullNotifier",
    "WebhookConfig",
    "WebhookNotifier",
    "backoff_s",
    "sign",
]

log = logging.getLogger(__name__)

SIGNATURE_HEADER: Final = "X-Edgefleet-Signature"
EVENT_HEADER: Final = "X-Edgefleet-Event"
DELIVERY_HEADER: Final = "X-Edgefleet-Delivery"
MAX_URLS: Final = 16
MAX_BODY_BYTES: Final = 256 * 1024


class Notifier(Protocol):
    """Where the controller hands its alerts: `submit` returns at once, never raises;
    False: the event was not taken (no URL, or the queue is full)."""

    def submit(self, event: Mapping[str, Any]) -> bool: ...


class NullNotifier:
    """No webhook configured: events go nowhere."""

    def submit(self, event: Mapping[str, Any]) -> bool:
        return False


def sign(body: bytes, secret: bytes) -> str:
    """The signature header's value: ``sha256=`` and the hex HMAC-SHA256 of the body."""
    return "sha256=" + hmac.new(secret, body, hashlib.sha256).hexdigest()


def backoff_s(attempt: int, base_s: float, cap_s: float, draw: float) -> float:
    """The wait before retry `attempt` (1 = the first retry): full jitter over
    ``min(cap, base * 2**(attempt-1))``; `draw` in [0, 1) is the random part."""
    return min(cap_s, base_s * 2.0 ** max(attempt - 1, 0)) * draw


@dataclass(frozen=True, slots=True)
class WebhookConfig:
    """Where and how: `urls` (http or https), the shared `secret`, deliveries waiting at
    most (`queue_size`, across every URL), `attempts` per delivery, the backoff between
    them, and each request's `timeout_s`."""

    urls: tuple[str, ...]
    secret: bytes = field(repr=False)
    queue_size: int = 1000
    attempts: int = 6
    backoff_base_s: float = 1.0
    backoff_cap_s: float = 60.0
    timeout_s: float = 5.0

    def __post_init__(self) -> None:
        if not 1 <= len(self.urls) <= MAX_URLS:
            raise InvalidInputError(f"give 1 to {MAX_URLS} webhook URLs", field="webhooks")
        for url in self.urls:
            parts = urlsplit(url)
            if parts.scheme not in ("http", "https") or not parts.netloc:
                raise InvalidInputError(
                    f"a webhook URL must be http(s)://host/..., got {url!r}", field="webhooks"
                )
        if len(self.secret) < 16:
            raise InvalidInputError(
                "the webhook secret must be at least 16 bytes", field="webhook_secret"
            )
        for name, low, high in (
            ("queue_size", 1, 1_000_000),
            ("attempts", 1, 100),
        ):
            value = getattr(self, name)
            if not low <= value <= high:
                raise InvalidInputError(f"{name} must be {low}..{high}", field=name)
        for name in ("backoff_base_s", "backoff_cap_s", "timeout_s"):
            if not 0 < getattr(self, name) <= 3600:
                raise InvalidInputError(f"{name} must be in (0, 3600]", field=name)


@dataclass(slots=True)
class NotifierStats:
    submitted: int = 0
    delivered: int = 0
    retried: int = 0
    failed: int = 0
    dropped: int = 0


@dataclass(order=True, slots=True)
class _Delivery:
    due: float
    number: int
    url: str = field(compare=False)
    body: bytes = field(compare=False, repr=False)
    kind: str = field(compare=False)
    delivery_id: str = field(compare=False)
    attempt: int = field(compare=False, default=0)


class WebhookNotifier:
    """Posts each event to every URL from one worker thread; `close()` stops it (safe
    twice). `transport` and `monotonic` are seams for tests."""

    def __init__(
        self,
        config: WebhookConfig,
        *,
        transport: httpx.BaseTransport | None = None,
        monotonic: Callable[[], float] = time.monotonic,
        rng: random.Random | None = None,
    ) -> None:
        self.config = config
        self.stats = NotifierStats()
        self._client = httpx.Client(timeout=config.timeout_s, transport=transport)
        self._monotonic = monotonic
        self._rng = rng or random.Random()
        self._queue: list[_Delivery] = []
        self._numbers = 0
        self._busy = 0
        self._cond = threading.Condition()
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="rollout-webhooks", daemon=True)
        self._thread.start()

    def submit(self, event: Mapping[str, Any]) -> bool:
        try:
            body = json.dumps(event, sort_keys=True, default=str).encode()
        except (TypeError, ValueError):
            log.exception("a rollout event could not be encoded; not sent")
            return False
        if len(body) > MAX_BODY_BYTES:
            log.warning(
                "a rollout event of %d bytes is over the webhook limit; not sent", len(body)
            )
            return False
        kind = str(event.get("kind", "rollout"))
        delivery_id = uuid.uuid4().hex
        with self._cond:
            if self._closed:
                return False
            self.stats.submitted += 1
            if len(self._queue) + len(self.config.urls) > self.config.queue_size:
                self.stats.dropped += 1
                log.warning("webhook queue full (%d): a %s event dropped", len(self._queue), kind)
                return False
            now = self._monotonic()
            for url in self.config.urls:
                self._numbers += 1
                heapq.heappush(
                    self._queue, _Delivery(now, self._numbers, url, body, kind, delivery_id)
                )
            self._cond.notify()
        return True

    def idle(self) -> bool:
        """Nothing waiting or being sent."""
        with self._cond:
            return not self._queue and not self._busy

    def close(self, timeout_s: float = 5.0) -> None:
        with self._cond:
            if self._closed:
                return
            self._closed = True
            self._cond.notify_all()
        self._thread.join(timeout_s)
        self._client.close()

    # -------------------------------------------------------------- worker

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._closed:
                    wait = self._queue[0].due - self._monotonic() if self._queue else None
                    if wait is not None and wait <= 0:
                        break
                    self._cond.wait(wait)
                if self._closed:
                    return
                delivery = heapq.heappop(self._queue)
                self._busy += 1
            try:
                self._send(delivery)
            finally:
                with self._cond:
                    self._busy -= 1

    def _send(self, delivery: _Delivery) -> None:
        headers = {
            "Content-Type": "application/json",
            SIGNATURE_HEADER: sign(delivery.body, self.config.secret),
            EVENT_HEADER: delivery.kind,
            DELIVERY_HEADER: delivery.delivery_id,
            "User-Agent": "edgefleet-rollouts",
        }
        try:
            response = self._client.post(delivery.url, content=delivery.body, headers=headers)
            status: int | None = response.status_code
            why = f"HTTP {status}"
        except httpx.HTTPError as exc:
            status, why = None, f"{type(exc).__name__}: {exc}"
        if status is not None and status < 300:
            with self._cond:
                self.stats.delivered += 1
            return
        # A refusal that says the request itself is wrong (4xx, save 408 and 429) is not
        # retried: the same body would be refused again.
        retry = status is None or status >= 500 or status in (408, 429)
        delivery.attempt += 1
        if not retry or delivery.attempt >= self.config.attempts:
            with self._cond:
                self.stats.failed += 1
            log.warning(
                "webhook %s: %s event not delivered after %d attempts (%s)",
                _host(delivery.url),
                delivery.kind,
                delivery.attempt,
                why,
            )
            return
        wait = backoff_s(
            delivery.attempt,
            self.config.backoff_base_s,
            self.config.backoff_cap_s,
            self._rng.random(),
        )
        delivery.due = self._monotonic() + wait
        with self._cond:
            self.stats.retried += 1
            heapq.heappush(self._queue, delivery)
            self._cond.notify()


def _host(url: str) -> str:
    """A URL as logs show it: scheme and host, never a path (it may hold a token)."""
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.hostname or ''}"
