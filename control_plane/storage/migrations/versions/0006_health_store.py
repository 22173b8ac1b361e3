"""The health store: raw points, minute/hour roll-ups, latest per node, alerts, cursor.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-02 00:00:00
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0006"
down_revision: str | Sequence[str] | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _json() -> sa.types.TypeEngine[Any]:
    return sa.JSON().with_variant(postgresql.JSONB(), "postgresql")


def _node_fk(table: str) -> sa.ForeignKeyConstraint:
    return sa.ForeignKeyConstraint(
        ["node_id"], ["nodes.id"], name=op.f(f"fk_{table}_node_id_nodes"), ondelete="CASCADE"
    )


def upgrade() -> None:
    op.create_table(
        "health_cursor",
        sa.Column("name", sa.String(length=32), nullable=False),
        sa.Column("received_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("node_id", sa.String(length=64), nullable=False),
        sa.Column("record_id", sa.String(length=36), nullable=False),
        sa.Column("processed", sa.BigInteger(), nullable=False),
        sa.Column("malformed", sa.BigInteger(), nullable=False),
        sa.Column("retention_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("name", name=op.f("pk_health_cursor")),
    )
    op.create_table(
        "health_points",
        sa.Column("node_id", sa.String(length=64), nullable=False),
        sa.Column("record_id", sa.String(length=36), nullable=False),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("received_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("schema", sa.String(length=64), nullable=False),
        sa.Column("metrics", _json(), nullable=False),
        sa.Column("latency", _json(), nullable=False),
        _node_fk("health_points"),
        sa.PrimaryKeyConstraint("node_id", "record_id", name=op.f("pk_health_points")),
    )
    op.create_index(op.f("ix_health_points_at"), "health_points", ["at"])
    op.create_index("ix_health_points_node_id_at", "health_points", ["node_id", "at"])
    op.create_table(
        "health_rollups",
        sa.Column("node_id", sa.String(length=64), nullable=False),
        sa.Column("resolution", sa.String(length=8), nullable=False),
        sa.Column("bucket", sa.DateTime(timezone=True), nullable=False),
        sa.Column("reports", sa.Integer(), nullable=False),
        sa.Column("stats", _json(), nullable=False),
        sa.Column("sketches", _json(), nullable=False),
        sa.CheckConstraint(
            "resolution IN ('minute', 'hour')", name=op.f("ck_health_rollups_resolution")
        ),
        _node_fk("health_rollups"),
        sa.PrimaryKeyConstraint("node_id", "resolution", "bucket", name=op.f("pk_health_rollups")),
    )
    op.create_index(
        "ix_health_rollups_resolution_bucket", "health_rollups", ["resolution", "bucket"]
    )
    op.create_table(
        "health_latest",
        sa.Column("node_id", sa.String(length=64), nullable=False),
        sa.Column("record_id", sa.String(length=36), nullable=False),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("schema", sa.String(length=64), nullable=False),
        sa.Column("metrics", _json(), nullable=False),
        sa.Column("latency", _json(), nullable=False),
        _node_fk("health_latest"),
        sa.PrimaryKeyConstraint("node_id", name=op.f("pk_health_latest")),
    )
    op.create_table(
        "health_alerts",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("node_id", sa.String(length=64), nullable=False),
        sa.Column("kind", sa.String(length=32), nullable=False),
        sa.Column("since", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("details", _json(), nullable=False),
        sa.Column("cleared_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("cleared_by", sa.String(length=160), nullable=True),
        sa.Column("ended_at", sa.DateTime(timezone=True), nullable=True),
        _node_fk("health_alerts"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_health_alerts")),
    )
    op.create_index("ix_health_alerts_node_id_kind", "health_alerts", ["node_id", "kind"])
    op.create_index("ix_health_alerts_cleared_at", "health_alerts", ["cleared_at"])


def downgrade() -> None:
    op.drop_index("ix_health_alerts_cleared_at", table_name="health_alerts")
    op.drop_index("ix_health_alerts_node_id_kind", table_name="health_alerts")
    op.drop_table("health_alerts")
    op.drop_table("health_latest")
    op.drop_index("ix_health_rollups_resolution_bucket", table_name="health_rollups")
    op.drop_table("health_rollups")
    op.drop_index("ix_health_points_node_id_at", table_name="health_points")
    op.drop_index(op.f("ix_health_points_at"), table_name="health_points")
    op.drop_table("health_points")
    op.drop_table("health_cursor")
