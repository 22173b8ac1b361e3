"""`NodeLink`: the one port through which the agent talks to the control plane.

Both transports (`GrpcNodeLink`, `MqttNodeLink`) implement it, so the agent's uplink
loop, updater and enrollment code never know which one they use. Messages are the
protobuf `NodeMessage` / `ControlMessage` of protos/edgefleet/fleet/v1/link.proto.

Semantics every adapter keeps:
- `connect()` returns once the link can carry messages and the node's Hello was sent;
  it raises `LinkUnavailableError` when the control plane (or broker) cannot be
  reached, and `LinkRefusedError` when it answered "no" (revoked node, bad certificate):
  the caller backs off and retries the first, and stops on the second.
- `send()` hands a message to the transport; delivery is confirmed only by an `Ack`
  arriving on `incoming()`, never by `send()` returning.
- `incoming()` yields control messages until the link drops, then raises
  `LinkUnavailableError`.
- `fetch_metadata()` / `fetch_artifact()` raise `LinkNotFoundError` for a file the
  control plane does not have (TUF clients rely on "not found" for the next root) and
  `LinkRequestError` for a request it refuses; both leave the link as it was.
- `close()` is idempotent.
"""

from __future__ import annotations

import abc
import random
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

from edge_node.errors import EdgeNodeError
from protos.edgefleet.fleet.v1 import link_pb2

PROTOCOL_VERSION = 1


class LinkError(EdgeNodeError):
    title = "link error"


class LinkUnavailableError(LinkError):
    """The other side cannot be reached now; retry with backoff."""

    title = "link unavailable"


class LinkRefusedError(LinkError):
    """The other side refused this node (revoked, unknown, bad credentials); do not spin."""

    title = "link refused"


class LinkRequestError(LinkError):
    """The control plane refused this one request (bad argument, offset past the end);
    the link itself is fine, and sending the same request again will not help.
    """

    title = "request refused"


class LinkNotFoundError(LinkRequestError):
    """No such metadata file or target (a TUF fetcher reports it as HTTP 404 does)."""

    title = "not found"


class NodeLink(abc.ABC):
    @abc.abstractmethod
    async def connect(self, hello: link_pb2.Hello) -> None: ...

    @abc.abstractmethod
    async def send(self, message: link_pb2.NodeMessage) -> None: ...

    @abc.abstractmethod
    def incoming(self) -> AsyncIterator[link_pb2.ControlMessage]: ...

    @abc.abstractmethod
    async def fetch_metadata(self, filename: str) -> bytes: ...

    @abc.abstractmethod
    def fetch_artifact(
        self, target_path: str, sha256: str, offset: int = 0
    ) -> AsyncIterator[bytes]: ...

    @abc.abstractmethod
    async def close(self) -> None: ...


@dataclass(frozen=True, slots=True)
class Backoff:
    """Capped exponential backoff with full jitter (AWS architecture blog's variant)."""

    initial_s: float = 0.5
    cap_s: float = 60.0
    multiplier: float = 2.0

    def delay(self, attempt: int, rng: Callable[[], float] = random.random) -> float:
        """Seconds to wait before retry number `attempt` (0-based)."""
        ceiling = min(self.cap_s, self.initial_s * self.multiplier ** max(0, attempt))
        return ceiling * rng()


def node_message(**body: object) -> link_pb2.NodeMessage:
    """A NodeMessage with the current protocol version and one body field set."""
    return link_pb2.NodeMessage(protocol_version=PROTOCOL_VERSION, **body)  # type: ignore[arg-type]
