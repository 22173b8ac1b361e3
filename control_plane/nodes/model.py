"""The node inventory's domain values: nodes, tokens, enrollments, limits, refusal counts.

Plain data and rules on it, no I/O; the role services beside this module hold the
storage. Not for wire formats (`control_plane.link.wire`) or certificates (`identity`).
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Final

from control_plane.errors import EdgefleetError, InvalidInputError, reason_of

__all__ = [
    "FAILURE_PHASES",
    "LAST_FAILURE",
    "TRANSPORTS",
    "UPDATE",
    "BootstrapTokenInfo",
    "Enrollment",
    "FleetMember",
    "Node",
    "NodeConfig",
    "NodeRefusals",
    "RefusalCounter",
    "checked_agent",
    "served_target",
    "update_summary",
]

log = logging.getLogger("control_plane.nodes")

TRANSPORTS: Final = ("grpc", "mqtt", "rest")
UPDATE: Final = "update"
"""`Node.reported_state` key of the node's latest update status (`wire.update_status`)."""
LAST_FAILURE: Final = "last_failure"
"""`Node.reported_state` key of its latest `failed` or `reverted` status, which outlives
the node's Hellos (`presence.record_update_status`)."""
FAILURE_PHASES: Final = frozenset({"failed", "reverted"})
ACTIVE_TARGET: Final = "active_target"
"""`Node.reported_state` key of the target the node serves: its Hello's, then each update
status that says what it serves (`served_target`)."""
# A failed or reverted status ends with what the node serves instead (the agent's words).
_SERVING = re.compile(r"(?:^|; )serving (?P<what>\S+)$")
MAX_AGENT_VERSION: Final = 64
MAX_NODE_ID: Final = 64


@dataclass(frozen=True, slots=True)
class NodeConfig:
    """Lifetimes and bounds of enrollment and liveness."""

    cert_ttl: timedelta = timedelta(days=7)
    min_token_ttl: timedelta = timedelta(minutes=1)
    max_token_ttl: timedelta = timedelta(days=30)
    heartbeat_timeout: timedelta = timedelta(seconds=90)
    # `touch` writes last_seen at most this often per node: heartbeats stay cheap.
    touch_resolution: timedelta = timedelta(seconds=5)
    max_reported_state_bytes: int = 64 * 1024


@dataclass(frozen=True, slots=True)
class Node:
    id: str
    fleet: str
    labels: dict[str, str]
    agent_version: str | None
    transport: str | None
    reported_state: dict[str, Any]
    created_at: datetime
    last_seen: datetime | None
    online: bool
    cert_serial: str | None
    cert_expires_at: datetime | None
    revoked_at: datetime | None
    public_key_sha256: str

    @property
    def revoked(self) -> bool:
        return self.revoked_at is not None


@dataclass(frozen=True, slots=True)
class FleetMember:
    """What the rollout controller reads of each unrevoked node of a fleet every tick: a
    `Node` without the columns it never looks at."""

    id: str
    labels: dict[str, str]
    reported_state: dict[str, Any]
    online: bool
    created_at: datetime

    @property
    def revoked(self) -> bool:
        return False  # only unrevoked nodes are listed as members


@dataclass(frozen=True, slots=True)
class BootstrapTokenInfo:
    id: str
    fleet: str
    labels: dict[str, str]
    created_at: datetime
    created_by: str
    expires_at: datetime
    used_at: datetime | None
    node_id: str | None
    revoked_at: datetime | None

    def state(self, now: datetime) -> str:
        """active | used | revoked | expired."""
        if self.revoked_at is not None:
            return "revoked"
        if self.used_at is not None:
            return "used"
        return "expired" if now >= self.expires_at else "active"


@dataclass(frozen=True, slots=True)
class Enrollment:
    """What a freshly enrolled node needs: its id, its certificate and the CA to trust."""

    node_id: str
    fleet: str
    labels: dict[str, str]
    certificate_pem: bytes
    ca_pem: bytes
    cert_serial: str
    not_after: datetime
    # Nodes enrolled for transport "mqtt": their broker login (username = node id). The
    # password is shown here once; the control plane keeps only its Mosquitto hash.
    mqtt_username: str | None = None
    mqtt_password: str | None = field(default=None, repr=False)


class RefusalCounter:
    """Refused node-facing calls by reason; thread-safe. Reasons are a small fixed set."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: dict[str, int] = {}

    def add(self, reason: str) -> None:
        with self._lock:
            self._counts[reason] = self._counts.get(reason, 0) + 1

    def __getitem__(self, reason: str) -> int:
        with self._lock:
            return self._counts.get(reason, 0)

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return dict(self._counts)


class NodeRefusals(RefusalCounter):
    """The node services' one refusal count: every role counts and logs here alike."""

    def refused(self, action: str, exc: EdgefleetError, *, node_id: str | None = None) -> None:
        """Count and log (at WARNING, never with a token value) a refused node call."""
        reason = reason_of(exc)
        self.add(reason)
        log.warning(
            "refused node %s: %s (%s)",
            action,
            reason,
            exc.message,
            extra={"action": action, "reason": reason, "node_id": node_id},
        )


def checked_agent(
    agent_version: str | None, transport: str | None
) -> tuple[str | None, str | None]:
    """Checked agent version and transport; "" (protobuf's unset string) becomes None."""
    agent_version, transport = agent_version or None, transport or None
    if agent_version is not None and (
        not isinstance(agent_version, str)
        or not 0 < len(agent_version) <= MAX_AGENT_VERSION
        or not agent_version.isprintable()
    ):
        raise InvalidInputError(
            f"agent version must be 1-{MAX_AGENT_VERSION} printable characters",
            reason="bad-hello",
        )
    if transport is not None and transport not in TRANSPORTS:
        raise InvalidInputError(
            f"transport must be one of {', '.join(TRANSPORTS)}",
            reason="bad-hello",
            transport=str(transport)[:32],
        )
    return agent_version, transport


def human_duration(delta: timedelta) -> str:
    seconds = int(delta.total_seconds())
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds % size == 0 and seconds >= size:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def served_target(status: Mapping[str, Any]) -> str | None:
    """The target a node serves once it sent this update status: an active one's target;
    for a failed or reverted one, what its detail names (`...; serving <path>`, "" for
    `serving nothing`); None when the status does not say (downloading, ...)."""
    phase = status.get("phase")
    target = status.get("target_path")
    if phase == "active":
        return target if isinstance(target, str) and target else None
    detail = status.get("detail")
    if phase in FAILURE_PHASES and isinstance(detail, str):
        found = _SERVING.search(detail)
        if found is not None:
            return "" if found["what"] == "nothing" else found["what"]
    return None


def update_summary(status: object) -> str | None:
    """One line an operator reads for a stored update status: `phase — detail` (the
    detail starts with the node's reason code, e.g. `failed — self-test: output-mismatch:
    'scores' 12 of 1000 elements out of tolerance ...`); None for anything else."""
    if not isinstance(status, dict):
        return None
    phase = status.get("phase")
    if not isinstance(phase, str) or not phase:
        return None
    detail = status.get("detail")
    reason = status.get("reason")
    text = detail if isinstance(detail, str) else ""
    if isinstance(reason, str) and reason and not text.startswith(reason):
        text = f"{reason}: {text}" if text else reason
    return f"{phase} — {text}" if text else phase
