"""Node records: events and health reports ingested from node outboxes.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-30 00:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | Sequence[str] | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "node_records",
        sa.Column("node_id", sa.String(length=64), nullable=False),
        sa.Column("record_id", sa.String(length=36), nullable=False),
        sa.Column("seq", sa.BigInteger(), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("received_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("content_type", sa.String(length=64), nullable=False),
        sa.Column("payload", sa.LargeBinary(), nullable=False),
        sa.CheckConstraint("kind IN ('event', 'health')", name=op.f("ck_node_records_kind")),
        sa.ForeignKeyConstraint(
            ["node_id"],
            ["nodes.id"],
            name=op.f("fk_node_records_node_id_nodes"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("node_id", "record_id", name=op.f("pk_node_records")),
    )
    op.create_index("ix_node_records_node_id_kind_seq", "node_records", ["node_id", "kind", "seq"])
    op.create_index(op.f("ix_node_records_received_at"), "node_records", ["received_at"])


def downgrade() -> None:
    op.drop_index(op.f("ix_node_records_received_at"), table_name="node_records")
    op.drop_index("ix_node_records_node_id_kind_seq", table_name="node_records")
    op.drop_table("node_records")
