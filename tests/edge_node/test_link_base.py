"""The transport-independent parts of the node link."""

from __future__ import annotations

from edge_node.link.base import PROTOCOL_VERSION, Backoff, node_message
from protos.edgefleet.fleet.v1 import link_pb2


def test_backoff_grows_to_the_cap_and_jitters_below_it() -> None:
    backoff = Backoff(initial_s=0.5, cap_s=8.0)
    ceilings = [backoff.delay(n, rng=lambda: 1.0) for n in range(8)]
    assert ceilings == [0.5, 1.0, 2.0, 4.0, 8.0, 8.0, 8.0, 8.0]
    assert backoff.delay(3, rng=lambda: 0.25) == 1.0
    assert backoff.delay(100, rng=lambda: 0.0) == 0.0


def test_node_message_carries_the_protocol_version() -> None:
    message = node_message(heartbeat=link_pb2.Heartbeat())
    assert message.protocol_version == PROTOCOL_VERSION
    assert message.WhichOneof("body") == "heartbeat"
