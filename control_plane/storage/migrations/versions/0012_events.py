"""fleet_events: the event store, nodes' aggregation events (`edgefleet events list`).

One row per (fleet, event id): the id is deterministic (a uuid5 the node computes over
the rule and the facts behind the event), so a resent record is never a second event.
Indexes: fleet + event time (listing, newest first), fleet + node / type + event time
(the filters), fleet + arrival (`events tail`), event time alone (retention).

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-01 00:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

# The chain, in one place: the integrator re-chains `down_revision` at merge.
revision: str = "0012"
down_revision: str | Sequence[str] | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_INDEXES: tuple[tuple[str, list[str]], ...] = (
    ("ix_fleet_events_fleet_id_occurred_at", ["fleet_id", "occurred_at", "id"]),
    ("ix_fleet_events_fleet_id_node_id_occurred_at", ["fleet_id", "node_id", "occurred_at"]),
    ("ix_fleet_events_fleet_id_type_occurred_at", ["fleet_id", "type", "occurred_at"]),
    ("ix_fleet_events_fleet_id_received_at", ["fleet_id", "received_at", "id"]),
    ("ix_fleet_events_occurred_at", ["occurred_at"]),
)


def upgrade() -> None:
    op.create_table(
        "fleet_events",
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            autoincrement=True,
            nullable=False,
        ),
        sa.Column("fleet_id", sa.Integer(), nullable=False),
        sa.Column("node_id", sa.String(length=64), nullable=False),
        sa.Column("event_id", sa.String(length=36), nullable=False),
        sa.Column("type", sa.String(length=64), nullable=False),
        sa.Column("rule_id", sa.String(length=128), nullable=False),
        sa.Column("occurred_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("received_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("record_id", sa.String(length=36), nullable=False),
        sa.Column("seq", sa.BigInteger(), nullable=False),
        sa.Column(
            "document", sa.JSON().with_variant(postgresql.JSONB(), "postgresql"), nullable=False
        ),
        sa.ForeignKeyConstraint(
            ["fleet_id"],
            ["fleets.id"],
            name=op.f("fk_fleet_events_fleet_id_fleets"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_fleet_events")),
        sa.UniqueConstraint("fleet_id", "event_id", name=op.f("uq_fleet_events_fleet_id_event_id")),
    )
    for name, columns in _INDEXES:
        op.create_index(name, "fleet_events", columns)


def downgrade() -> None:
    for name, _ in reversed(_INDEXES):
        op.drop_index(name, table_name="fleet_events")
    op.drop_table("fleet_events")
