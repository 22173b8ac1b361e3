"""The MQTT topic tree shared by the bridge, the ACL writer and (as a copy) the node link.

Pure: names only, no broker. The tree is ``edgefleet/v1/<fleet>/<node>/<leaf>``::

    node -> control plane          control plane -> node
    status   Hello, Heartbeat,     desired  retained doorbell (ControlMessage: the signed
             UpdateStatus, and              assignment, or Command "pull-desired")
             the Last Will         ack      Ack of committed records (QoS 1, not retained)
    health   RecordBatch (health,  cmd      Command (QoS 1, not retained)
             and sampled results)
    events   RecordBatch (events)

Every payload is a serialized ``NodeMessage`` / ``ControlMessage`` (link.proto). The
control plane reads the uplink leaves through the shared subscriptions of
:func:`shared_filters`, so replicas split the load. Fleet and node segments are plain
names: never empty, never a wildcard (``+``, ``#``), never containing ``/``.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass
from typing import Final

from control_plane.errors import InvalidInputError

__all__ = [
    "DOWNLINK_LEAVES",
    "ROOT",
    "SHARE_GROUP",
    "UPLINK_LEAVES",
    "Leaf",
    "NodeTopic",
    "TopicError",
    "check_segment",
    "node_topic",
    "parse_topic",
    "shared_filters",
]

ROOT: Final = "edgefleet/v1"
SHARE_GROUP: Final = "edgefleet-cp"
# Letters, digits, '.', '_' and '-': safe in a topic, in a Mosquitto ACL line and as a
# Mosquitto user name. Fleet names and node ids are narrower still.
_SEGMENT: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


class Leaf(enum.StrEnum):
    STATUS = "status"
    HEALTH = "health"
    EVENTS = "events"
    DESIRED = "desired"
    ACK = "ack"
    CMD = "cmd"


UPLINK_LEAVES: Final = (Leaf.STATUS, Leaf.HEALTH, Leaf.EVENTS)
DOWNLINK_LEAVES: Final = (Leaf.DESIRED, Leaf.ACK, Leaf.CMD)


class TopicError(InvalidInputError):
    title = "bad MQTT topic"


@dataclass(frozen=True, slots=True)
class NodeTopic:
    fleet: str
    node_id: str
    leaf: Leaf

    def __str__(self) -> str:
        return f"{ROOT}/{self.fleet}/{self.node_id}/{self.leaf.value}"


def check_segment(value: str, what: str) -> str:
    """`value` if it is a safe fleet or node segment; TopicError otherwise."""
    if not isinstance(value, str) or _SEGMENT.fullmatch(value) is None:
        raise TopicError(
            f"{what} {str(value)[:80]!r} is not a topic segment "
            "(1-64 of A-Z a-z 0-9 . _ -, starting alphanumeric)",
            reason="bad-topic",
        )
    return value


def node_topic(fleet: str, node_id: str, leaf: Leaf | str) -> str:
    """The topic of one node's leaf, e.g. ``edgefleet/v1/gates/n-0a1b2c3d4e5f/events``."""
    return str(
        NodeTopic(check_segment(fleet, "fleet"), check_segment(node_id, "node"), _leaf(leaf))
    )


def parse_topic(topic: str) -> NodeTopic:
    """Split a concrete topic into fleet, node and leaf; TopicError if it is not ours."""
    parts = topic.split("/") if isinstance(topic, str) else []
    if len(parts) != 5 or "/".join(parts[:2]) != ROOT:
        raise TopicError(
            f"topic {str(topic)[:120]!r} is not under {ROOT}/<fleet>/<node>/<leaf>",
            reason="bad-topic",
        )
    fleet, node_id, leaf = parts[2:]
    return NodeTopic(check_segment(fleet, "fleet"), check_segment(node_id, "node"), _leaf(leaf))


def shared_filters(group: str = SHARE_GROUP) -> list[str]:
    """``$share/<group>/edgefleet/v1/+/+/<leaf>`` for each uplink leaf."""
    check_segment(group, "share group")
    return [f"$share/{group}/{ROOT}/+/+/{leaf.value}" for leaf in UPLINK_LEAVES]


def _leaf(value: Leaf | str) -> Leaf:
    try:
        return Leaf(value)
    except ValueError:
        raise TopicError(f"unknown topic leaf {str(value)[:40]!r}", reason="bad-topic") from None
