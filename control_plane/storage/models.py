"""The control plane's relational schema as typed SQLAlchemy rows (``…Row``).

Rows are persistence records, not domain objects: services map them to and from the
domain types. Schema changes go through a new alembic migration in ``migrations/``;
``tests/control_plane/storage`` fails when the models and the migrations drift apart.

Rows are mapped dataclasses with keyword-only constructors, so mypy checks every
``FleetRow(...)`` call. Timestamps are never defaulted here: services pass ``now`` from
their injected clock.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    CheckConstraint,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Text,
    UniqueConstraint,
)
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import DeclarativeBase, Mapped, MappedAsDataclass, mapped_column
from sqlalchemy.types import TypeEngine

from control_plane.storage.db import UTCDateTime

__all__ = [
    "FLEET_STATES",
    "NAMING_CONVENTION",
    "ApiTokenRow",
    "ArtifactRow",
    "AuditRow",
    "Base",
    "BootstrapTokenRow",
    "DirectorAssignmentRow",
    "FleetEventRow",
    "FleetRow",
    "HealthAlertRow",
    "HealthCursorRow",
    "HealthLatestRow",
    "HealthPointRow",
    "HealthRollupRow",
    "ModelFloorRow",
    "ModelVersionRow",
    "NodeRecordRow",
    "NodeResultRow",
    "NodeRow",
    "RolloutActionRow",
    "RolloutDecisionRow",
    "RolloutNodeRow",
    "RolloutRow",
    "TufMetadataRow",
]

# Deterministic constraint names: alembic can then create, compare and drop them by name
# on every backend (SQLite batch migrations need names to drop constraints at all).
NAMING_CONVENTION: dict[str, str] = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

FLEET_STATES = ("pending", "active")

# JSON everywhere, JSONB on PostgreSQL (indexable, compact, compares by value).
JSONDocument = JSON().with_variant(JSONB(), "postgresql")
# BIGINT on PostgreSQL; SQLite only autoincrements a column declared exactly INTEGER.
BigIntegerPK = BigInteger().with_variant(Integer(), "sqlite")


class Base(MappedAsDataclass, DeclarativeBase, kw_only=True, eq=False):
    """Declarative base: naming convention, and the column types our annotations mean."""

    metadata = MetaData(naming_convention=NAMING_CONVENTION)
    type_annotation_map = {
        datetime: UTCDateTime(),
        dict[str, Any]: JSONDocument,
    }


class FleetRow(Base):
    """One fleet = one TUF repository and its models, nodes and rollouts."""

    __tablename__ = "fleets"
    __table_args__ = (
        CheckConstraint(
            "state IN ({})".format(", ".join(f"'{s}'" for s in FLEET_STATES)), name="state"
        ),
    )

    id: Mapped[int] = mapped_column(primary_key=True, autoincrement=True, init=False)
    name: Mapped[str] = mapped_column(String(63), unique=True)
    state: Mapped[str] = mapped_column(String(16))
    created_at: Mapped[datetime]
    # Key ids of the control plane's online keys for this fleet's snapshot/timestamp roles.
    snapshot_keyid: Mapped[str | None] = mapped_column(String(64), default=None)
    timestamp_keyid: Mapped[str | None] = mapped_column(String(64), default=None)


class TufMetadataRow(Base):
    """Every version of every TUF role's signed metadata, exactly as served.

    The primary key (fleet_id, role, version) is also the index behind "latest version
    of role R" (``WHERE fleet_id = ? AND role = ? ORDER BY version DESC LIMIT 1``): both
    backends walk it backwards, so no separate index is needed.
    """

    __tablename__ = "tuf_metadata"
    __table_args__ = (CheckConstraint("version >= 1", name="version_positive"),)

    fleet_id: Mapped[int] = mapped_column(
        ForeignKey("fleets.id", ondelete="CASCADE"), primary_key=True
    )
    role: Mapped[str] = mapped_column(String(32), primary_key=True)
    version: Mapped[int] = mapped_column(primary_key=True, autoincrement=False)
    body: Mapped[bytes] = mapped_column(LargeBinary, repr=False)
    expires_at: Mapped[datetime]
    created_at: Mapped[datetime]


class ModelVersionRow(Base):
    """A published model version: one TUF target of the fleet's ``targets`` role."""

    __tablename__ = "model_versions"
    __table_args__ = (
        UniqueConstraint("fleet_id", "model", "version"),
        UniqueConstraint("fleet_id", "model", "release_counter"),
        UniqueConstraint("fleet_id", "target_path"),
        CheckConstraint("length >= 0", name="length_nonnegative"),
    )

    id: Mapped[int] = mapped_column(primary_key=True, autoincrement=True, init=False)
    fleet_id: Mapped[int] = mapped_column(ForeignKey("fleets.id", ondelete="CASCADE"))
    model: Mapped[str] = mapped_column(String(128))
    version: Mapped[str] = mapped_column(String(64))
    release_counter: Mapped[int]
    target_path: Mapped[str] = mapped_column(String(512))
    sha256: Mapped[str] = mapped_column(String(64))
    length: Mapped[int] = mapped_column(BigInteger)
    custom: Mapped[dict[str, Any]]
    # The targets metadata version that first listed this target.
    targets_version: Mapped[int]
    created_at: Mapped[datetime]
    created_by: Mapped[str] = mapped_column(String(128))


class ModelFloorRow(Base):
    """The lowest release counter a node may run for a model, as signed in ``targets``."""

    __tablename__ = "model_floors"

    fleet_id: Mapped[int] = mapped_column(
        ForeignKey("fleets.id", ondelete="CASCADE"), primary_key=True
    )
    model: Mapped[str] = mapped_column(String(128), primary_key=True)
    floor: Mapped[int]
    targets_version: Mapped[int]
    updated_at: Mapped[datetime]


class ArtifactRow(Base):
    """An uploaded blob in the content-addressed artifact store, keyed by its sha256."""

    __tablename__ = "artifacts"
    __table_args__ = (CheckConstraint("length >= 0", name="length_nonnegative"),)

    sha256: Mapped[str] = mapped_column(String(64), primary_key=True)
    length: Mapped[int] = mapped_column(BigInteger)
    created_at: Mapped[datetime]
    uploaded_by: Mapped[str] = mapped_column(String(128))


class ApiTokenRow(Base):
    """An operator API token; only the hash of the secret is kept."""

    __tablename__ = "api_tokens"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    name: Mapped[str] = mapped_column(String(128))
    role: Mapped[str] = mapped_column(String(32))
    token_hash: Mapped[str] = mapped_column(String(64), unique=True, repr=False)
    created_at: Mapped[datetime]
    created_by: Mapped[str] = mapped_column(String(128))
    revoked_at: Mapped[datetime | None] = mapped_column(default=None)
    last_used_at: Mapped[datetime | None] = mapped_column(default=None)


class AuditRow(Base):
    """One audited mutation. Append-only: database triggers (see migration 0001) refuse
    UPDATE and DELETE on both backends, so even a buggy service cannot rewrite history."""

    __tablename__ = "audit_log"

    id: Mapped[int] = mapped_column(BigIntegerPK, primary_key=True, autoincrement=True, init=False)
    at: Mapped[datetime] = mapped_column(index=True)
    actor: Mapped[str] = mapped_column(String(128))
    role: Mapped[str] = mapped_column(String(32))
    action: Mapped[str] = mapped_column(String(64))
    target: Mapped[str] = mapped_column(String(512))
    request_id: Mapped[str] = mapped_column(String(64))
    outcome: Mapped[str] = mapped_column(String(16))
    details: Mapped[dict[str, Any]] = mapped_column(default_factory=dict)


class NodeRow(Base):
    """An enrolled edge node: identity (certificate), labels and last reported state.

    The node id is chosen by the control plane at enrollment. The previous certificate
    stays valid until it expires, so a node that renewed keeps its open connection.
    """

    __tablename__ = "nodes"

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    fleet_id: Mapped[int] = mapped_column(ForeignKey("fleets.id", ondelete="CASCADE"), index=True)
    labels: Mapped[dict[str, Any]]
    public_key_sha256: Mapped[str] = mapped_column(String(64))
    created_at: Mapped[datetime]
    reported_state: Mapped[dict[str, Any]] = mapped_column(default_factory=dict)
    agent_version: Mapped[str | None] = mapped_column(String(64), default=None)
    transport: Mapped[str | None] = mapped_column(String(16), default=None)
    last_seen: Mapped[datetime | None] = mapped_column(default=None)
    online: Mapped[bool] = mapped_column(default=False)
    cert_serial: Mapped[str | None] = mapped_column(String(40), default=None)
    cert_expires_at: Mapped[datetime | None] = mapped_column(default=None)
    previous_cert_serial: Mapped[str | None] = mapped_column(String(40), default=None)
    previous_cert_expires_at: Mapped[datetime | None] = mapped_column(default=None)
    revoked_at: Mapped[datetime | None] = mapped_column(default=None)
    # Mosquitto `$7$` hash of the node's MQTT password (nodes enrolled for MQTT only).
    mqtt_password_hash: Mapped[str | None] = mapped_column(String(160), default=None, repr=False)


class BootstrapTokenRow(Base):
    """A single-use, expiring enrollment token for one fleet; only its hash is kept."""

    __tablename__ = "bootstrap_tokens"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    fleet_id: Mapped[int] = mapped_column(ForeignKey("fleets.id", ondelete="CASCADE"), index=True)
    token_hash: Mapped[str] = mapped_column(String(64), unique=True, repr=False)
    labels: Mapped[dict[str, Any]]
    created_at: Mapped[datetime]
    created_by: Mapped[str] = mapped_column(String(128))
    expires_at: Mapped[datetime]
    used_at: Mapped[datetime | None] = mapped_column(default=None)
    node_id: Mapped[str | None] = mapped_column(
        String(64), ForeignKey("nodes.id", ondelete="SET NULL"), default=None
    )
    revoked_at: Mapped[datetime | None] = mapped_column(default=None)


def _ascii_id(length: int) -> TypeEngine[str]:
    """An identifier column: bytewise comparison on PostgreSQL (SQLite's is already)."""
    return String(length).with_variant(String(length, collation="C"), "postgresql")


class NodeRecordRow(Base):
    """An event or health report from a node's outbox, stored at most once per (node, id).

    Nodes resend until acked, so inserts use ON CONFLICT DO NOTHING on the primary key;
    the ack goes out only after the commit.
    """

    __tablename__ = "node_records"

    # No foreign key to nodes (ADR 0020): it cost a lookup and a row lock per stored
    # record; records are only written for a node the link has authenticated. The key
    # columns compare bytewise on PostgreSQL (COLLATE "C"): ids, not words. Also on
    # PostgreSQL, set by migrations only: lz4 for payloads (0007), and rows up to 4 kB
    # stored uncompressed (toast_tuple_target, 0008, ADR 0021).
    node_id: Mapped[str] = mapped_column(_ascii_id(64), primary_key=True)
    record_id: Mapped[str] = mapped_column(_ascii_id(36), primary_key=True)
    seq: Mapped[int] = mapped_column(BigInteger)
    kind: Mapped[str] = mapped_column(String(16))
    created_at: Mapped[datetime]
    received_at: Mapped[datetime] = mapped_column(index=True)
    content_type: Mapped[str] = mapped_column(String(64))
    payload: Mapped[bytes] = mapped_column(LargeBinary, repr=False)

    __table_args__ = (CheckConstraint("kind IN ('event', 'health')", name="kind"),)


class NodeResultRow(Base):
    """A sampled inference result of a node (``edgefleet.agent.results/1``), the newest K
    per node: what an operator sees with ``edgefleet nodes results``.

    Written by the record ingest in the group commit that acks it (ON CONFLICT DO NOTHING
    on (node, record id), like ``node_records``), which also deletes the node's results
    below its K newest by ``seq``. ``document`` is the result as ``result_from_wire``
    read it; the columns beside it are what queries filter and sort by.
    """

    __tablename__ = "node_results"
    __table_args__ = (Index("ix_node_results_node_id_seq", "node_id", "seq"),)

    node_id: Mapped[str] = mapped_column(
        String(64), ForeignKey("nodes.id", ondelete="CASCADE"), primary_key=True
    )
    record_id: Mapped[str] = mapped_column(String(36), primary_key=True)
    seq: Mapped[int] = mapped_column(BigInteger)
    created_at: Mapped[datetime]
    received_at: Mapped[datetime]
    captured_at: Mapped[datetime]
    stream: Mapped[str] = mapped_column(String(256))
    model: Mapped[str] = mapped_column(String(256))
    version: Mapped[str | None] = mapped_column(String(64))
    kind: Mapped[str] = mapped_column(String(256))
    document: Mapped[dict[str, Any]]


class FleetEventRow(Base):
    """An event of a node's aggregation (``edgefleet.event/1``), once per (fleet, event id).

    Written by the record ingest in the group commit that acks its record (ON CONFLICT
    DO NOTHING on (fleet, event id): the id is deterministic, so a resent record, or the
    same event raised again from a replayed input, is never a second row). Read by
    ``control_plane.events.store`` newest first by event time or in arrival order
    (``id`` breaks ties in both keysets); pruned by event time past the retention.
    No foreign key to nodes: an event outlives its node until the retention takes it.
    """

    __tablename__ = "fleet_events"
    __table_args__ = (
        UniqueConstraint("fleet_id", "event_id"),
        Index("ix_fleet_events_fleet_id_occurred_at", "fleet_id", "occurred_at", "id"),
        Index("ix_fleet_events_fleet_id_node_id_occurred_at", "fleet_id", "node_id", "occurred_at"),
        Index("ix_fleet_events_fleet_id_type_occurred_at", "fleet_id", "type", "occurred_at"),
        Index("ix_fleet_events_fleet_id_received_at", "fleet_id", "received_at", "id"),
        Index("ix_fleet_events_occurred_at", "occurred_at"),
    )

    id: Mapped[int] = mapped_column(BigIntegerPK, primary_key=True, autoincrement=True, init=False)
    fleet_id: Mapped[int] = mapped_column(ForeignKey("fleets.id", ondelete="CASCADE"))
    node_id: Mapped[str] = mapped_column(String(64))
    event_id: Mapped[str] = mapped_column(String(36))
    type: Mapped[str] = mapped_column(String(64))
    rule_id: Mapped[str] = mapped_column(String(128))
    occurred_at: Mapped[datetime]
    received_at: Mapped[datetime]
    record_id: Mapped[str] = mapped_column(String(36))
    seq: Mapped[int] = mapped_column(BigInteger)
    document: Mapped[dict[str, Any]]


class DirectorAssignmentRow(Base):
    """A signed director assignment: "node N shall run target T", one per (node, sequence).

    The sequence is monotonic per node (the node refuses anything not above the last it
    accepted); rows are never updated, so the table is the node's pin history and the
    newest row is the current assignment. ``signed`` holds the serialized
    SignedDirectorAssignment exactly as the node receives it.
    """

    __tablename__ = "director_assignments"
    __table_args__ = (
        CheckConstraint("sequence >= 1", name="sequence_positive"),
        CheckConstraint("length >= 0", name="length_nonnegative"),
    )

    node_id: Mapped[str] = mapped_column(
        String(64), ForeignKey("nodes.id", ondelete="CASCADE"), primary_key=True
    )
    sequence: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=False)
    target_path: Mapped[str] = mapped_column(String(512))
    sha256: Mapped[str] = mapped_column(String(64))
    length: Mapped[int] = mapped_column(BigInteger)
    issued_at: Mapped[datetime]
    expires_at: Mapped[datetime]
    signed: Mapped[bytes] = mapped_column(LargeBinary, repr=False)
    created_by: Mapped[str] = mapped_column(String(128))


class HealthCursorRow(Base):
    """How far the health processor got through ``node_records``, one row per processor.

    The position is the last processed record's (received_at, node_id, record_id): the
    processor reads health records strictly after it, in that order, and moves it in the
    same transaction that stores what it derived from them (see ADR 0016).
    """

    __tablename__ = "health_cursor"

    name: Mapped[str] = mapped_column(String(32), primary_key=True)
    received_at: Mapped[datetime | None] = mapped_column(default=None)
    node_id: Mapped[str] = mapped_column(String(64), default="")
    record_id: Mapped[str] = mapped_column(String(36), default="")
    processed: Mapped[int] = mapped_column(BigInteger, default=0)
    malformed: Mapped[int] = mapped_column(BigInteger, default=0)
    retention_at: Mapped[datetime | None] = mapped_column(default=None)
    updated_at: Mapped[datetime | None] = mapped_column(default=None)


class HealthPointRow(Base):
    """One health report as a raw point of its node's series (kept for hours).

    ``metrics`` is the flat map of numbers the report carried (names in
    ``control_plane.health.report``); ``latency`` holds per model version and kind the
    percentiles and, when the node sent it, the mergeable sketch.
    """

    __tablename__ = "health_points"
    __table_args__ = (
        Index("ix_health_points_node_id_at", "node_id", "at"),
        # The rollout gates' incremental reads: a node's rows received since (ADR 0036).
        Index("ix_health_points_node_id_received_at", "node_id", "received_at"),
    )

    node_id: Mapped[str] = mapped_column(
        String(64), ForeignKey("nodes.id", ondelete="CASCADE"), primary_key=True
    )
    record_id: Mapped[str] = mapped_column(String(36), primary_key=True)
    at: Mapped[datetime] = mapped_column(index=True)
    received_at: Mapped[datetime]
    schema: Mapped[str] = mapped_column(String(64))
    metrics: Mapped[dict[str, Any]]
    latency: Mapped[dict[str, Any]]


class HealthRollupRow(Base):
    """A node's health over one minute or one hour: min/max/sum/count per metric and the
    merged latency sketches, so a roll-up's percentiles come from all of its samples."""

    __tablename__ = "health_rollups"
    __table_args__ = (
        CheckConstraint("resolution IN ('minute', 'hour')", name="resolution"),
        Index("ix_health_rollups_resolution_bucket", "resolution", "bucket"),
    )

    node_id: Mapped[str] = mapped_column(
        String(64), ForeignKey("nodes.id", ondelete="CASCADE"), primary_key=True
    )
    resolution: Mapped[str] = mapped_column(String(8), primary_key=True)
    bucket: Mapped[datetime] = mapped_column(primary_key=True)
    reports: Mapped[int]
    stats: Mapped[dict[str, Any]]
    sketches: Mapped[dict[str, Any]]


class HealthLatestRow(Base):
    """Each node's newest processed report, for the fleet at a glance."""

    __tablename__ = "health_latest"

    node_id: Mapped[str] = mapped_column(
        String(64), ForeignKey("nodes.id", ondelete="CASCADE"), primary_key=True
    )
    record_id: Mapped[str] = mapped_column(String(36))
    at: Mapped[datetime]
    schema: Mapped[str] = mapped_column(String(64))
    metrics: Mapped[dict[str, Any]]
    latency: Mapped[dict[str, Any]]
    # The report's shadow section without its sketch (`HealthPoint.shadow`); None: none.
    shadow: Mapped[dict[str, Any] | None] = mapped_column(default=None)
    # The report's model_runtime section (`HealthPoint.model_runtime`); None: none.
    model_runtime: Mapped[dict[str, Any] | None] = mapped_column(default=None)


class HealthAlertRow(Base):
    """An alert: raised when its condition starts, cleared when it ends or by an operator.

    At most one open alert (``cleared_at IS NULL``) per node and kind; the health
    processor is the only writer of new alerts and holds its cursor's lock meanwhile.
    ``details`` holds the numbers behind it (values and thresholds), updated while open.
    """

    __tablename__ = "health_alerts"
    __table_args__ = (
        Index("ix_health_alerts_node_id_kind", "node_id", "kind"),
        Index("ix_health_alerts_cleared_at", "cleared_at"),
    )

    id: Mapped[int] = mapped_column(BigIntegerPK, primary_key=True, autoincrement=True, init=False)
    node_id: Mapped[str] = mapped_column(String(64), ForeignKey("nodes.id", ondelete="CASCADE"))
    kind: Mapped[str] = mapped_column(String(32))
    since: Mapped[datetime]
    updated_at: Mapped[datetime]
    details: Mapped[dict[str, Any]]
    cleared_at: Mapped[datetime | None] = mapped_column(default=None)
    # "condition-ended" or "operator:<name>"
    cleared_by: Mapped[str | None] = mapped_column(String(160), default=None)
    # Set once the condition is seen to have ended (an operator's clear silences the
    # alert until then).
    ended_at: Mapped[datetime | None] = mapped_column(default=None)


ROLLOUT_STATUSES = (
    "pending",
    "running",
    "baking",
    "paused",
    "rolling-back",
    "done",
    "aborted",
    "rolled-back",
)


class RolloutRow(Base):
    """A canary rollout (ADR 0033, 0034): the spec, the controller's state without its
    nodes, and who may step it.

    ``state`` is `RolloutState.to_dict()` less ``spec`` and ``nodes`` (those are the
    ``spec`` column and one ``rollout_nodes`` row per node). ``revision`` counts the
    steps and commands stored; a write names the revision it read. ``lease_owner`` and
    ``lease_expires_at``: the replica stepping the rollout, until then (one at a time).
    ``following``: a done rollout still takes in nodes that enrol later, until a newer
    rollout of the same model supersedes it. ``verdict``: the gates' latest evaluation
    (what ``watch`` shows, and the history the next one continues).
    """

    __tablename__ = "rollouts"
    __table_args__ = (
        CheckConstraint(
            "status IN ({})".format(", ".join(f"'{s}'" for s in ROLLOUT_STATUSES)),
            name="status",
        ),
        CheckConstraint("revision >= 0", name="revision_nonnegative"),
        Index("ix_rollouts_fleet_id_model", "fleet_id", "model"),
        Index("ix_rollouts_status", "status"),
    )

    id: Mapped[int] = mapped_column(BigIntegerPK, primary_key=True, autoincrement=True, init=False)
    fleet_id: Mapped[int] = mapped_column(ForeignKey("fleets.id", ondelete="CASCADE"))
    model: Mapped[str] = mapped_column(String(128))
    version: Mapped[str] = mapped_column(String(64))
    spec: Mapped[dict[str, Any]]
    state: Mapped[dict[str, Any]]
    status: Mapped[str] = mapped_column(String(16))
    stage: Mapped[int]
    created_by: Mapped[str] = mapped_column(String(128))
    created_at: Mapped[datetime]
    updated_at: Mapped[datetime]
    revision: Mapped[int] = mapped_column(BigInteger, default=0)
    following: Mapped[bool] = mapped_column(default=True)
    verdict: Mapped[dict[str, Any] | None] = mapped_column(default=None)
    lease_owner: Mapped[str | None] = mapped_column(String(128), default=None)
    lease_expires_at: Mapped[datetime | None] = mapped_column(default=None)


class RolloutNodeRow(Base):
    """One node's `NodeRecord` in a rollout, and the director sequence of the last
    assignment the rollout gave it (a node's update status counts from that sequence on).

    No foreign key to ``nodes``: the record outlives a node that leaves, as history.
    """

    __tablename__ = "rollout_nodes"

    rollout_id: Mapped[int] = mapped_column(
        BigInteger,
        ForeignKey("rollouts.id", ondelete="CASCADE"),
        primary_key=True,
        autoincrement=False,
    )
    node_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    stage: Mapped[int | None]
    rank: Mapped[int]
    stratum: Mapped[str] = mapped_column(String(512))
    previous: Mapped[str | None] = mapped_column(String(64))
    since: Mapped[datetime]
    phase: Mapped[str] = mapped_column(String(24))
    track: Mapped[str] = mapped_column(String(16))
    shadowing: Mapped[bool]
    touched: Mapped[bool]
    started_at: Mapped[datetime | None]
    reason: Mapped[str] = mapped_column(Text)
    sequence: Mapped[int | None] = mapped_column(BigInteger, default=None)


class RolloutDecisionRow(Base):
    """Every decision of a rollout (a machine `Record`), with the numbers behind it."""

    __tablename__ = "rollout_decisions"
    __table_args__ = (Index("ix_rollout_decisions_rollout_id_id", "rollout_id", "id"),)

    id: Mapped[int] = mapped_column(BigIntegerPK, primary_key=True, autoincrement=True, init=False)
    rollout_id: Mapped[int] = mapped_column(
        BigInteger, ForeignKey("rollouts.id", ondelete="CASCADE")
    )
    revision: Mapped[int] = mapped_column(BigInteger)
    at: Mapped[datetime]
    kind: Mapped[str] = mapped_column(String(32))
    stage: Mapped[int]
    text: Mapped[str] = mapped_column(Text)
    numbers: Mapped[dict[str, Any]]


class RolloutActionRow(Base):
    """An action a rollout step decided (assign, assign-shadow, end-shadow, rollback,
    notify), stored with the state that decided it and carried out after the commit.

    ``done_at`` is set once it was carried out, with its ``outcome`` (done, skipped: the
    node's assignment already said so, superseded: a later action for the node replaced
    it, failed) and the director ``sequence`` it produced; a crash in between leaves it
    pending, and the next pass finds what the director already holds.
    """

    __tablename__ = "rollout_actions"
    __table_args__ = (
        CheckConstraint(
            "kind IN ('assign', 'assign-shadow', 'end-shadow', 'rollback', 'notify')",
            name="kind",
        ),
        Index("ix_rollout_actions_rollout_id_done_at", "rollout_id", "done_at"),
    )

    id: Mapped[int] = mapped_column(BigIntegerPK, primary_key=True, autoincrement=True, init=False)
    rollout_id: Mapped[int] = mapped_column(
        BigInteger, ForeignKey("rollouts.id", ondelete="CASCADE")
    )
    revision: Mapped[int] = mapped_column(BigInteger)
    kind: Mapped[str] = mapped_column(String(16))
    node_id: Mapped[str | None] = mapped_column(String(64))
    version: Mapped[str | None] = mapped_column(String(64))
    payload: Mapped[dict[str, Any]]
    created_at: Mapped[datetime]
    done_at: Mapped[datetime | None] = mapped_column(default=None)
    outcome: Mapped[str | None] = mapped_column(String(16), default=None)
    detail: Mapped[str] = mapped_column(Text, default="")
    sequence: Mapped[int | None] = mapped_column(BigInteger, default=None)
