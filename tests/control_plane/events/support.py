"""Events as a node sends them: built with the node's own wire mapping (edge_node's
aggregation), so these tests hold the control plane to the node's side of the contract."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

from control_plane.link.records import IncomingRecord
from edge_node.aggregation.model import Entity, Event, Evidence, Provenance, event_id
from edge_node.aggregation.wire import encode_event

T0 = datetime(2026, 12, 1, 9, 0, tzinfo=UTC)


def event(
    n: int,
    *,
    type_: str = "line.crossed",
    rule: str = "gate-a-line",
    at: datetime | None = None,
    camera: str = "cam-1",
    version: str = "1.1.0",
) -> Event:
    when = (at or T0 + timedelta(seconds=n)).timestamp()
    return Event(
        event_id=event_id(rule, type_, camera, n, when),
        type=type_,
        rule_id=rule,
        at=when,
        entities=(Entity("track", f"{camera}/{n}", "person", camera),),
        evidence=(Evidence(camera, 100 + n, when, f"obs-{n}"),),
        provenance=(Provenance("node", "detector", version),),
        attributes={"camera": camera, "direction": "in"},
        values={"count": 1.0},
    )


def event_record(seq: int, payload: bytes | Event, **changes: Any) -> IncomingRecord:
    data = encode_event(payload) if isinstance(payload, Event) else payload
    fields: dict[str, Any] = {
        "id": str(uuid.uuid4()),
        "seq": seq,
        "kind": "event",
        "created_at": T0 + timedelta(seconds=seq),
        "content_type": "application/x-protobuf",
        "payload": data,
    }
    fields.update(changes)
    return IncomingRecord(**fields)
