"""node_results: each node's newest sampled inference results (`edgefleet nodes results`).

Results records are best-effort samples, not history: they are stored here, not in
node_records, and the ingest keeps only the newest K per node (by the node's sequence)
as it inserts them. The (node_id, seq) index serves that pruning and the newest-first
reads.

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-10 00:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0009"
down_revision: str | Sequence[str] | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "node_results",
        sa.Column("node_id", sa.String(length=64), nullable=False),
        sa.Column("record_id", sa.String(length=36), nullable=False),
        sa.Column("seq", sa.BigInteger(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("received_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("captured_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("stream", sa.String(length=256), nullable=False),
        sa.Column("model", sa.String(length=256), nullable=False),
        sa.Column("version", sa.String(length=64), nullable=True),
        sa.Column("kind", sa.String(length=256), nullable=False),
        sa.Column(
            "document", sa.JSON().with_variant(postgresql.JSONB(), "postgresql"), nullable=False
        ),
        sa.ForeignKeyConstraint(
            ["node_id"],
            ["nodes.id"],
            name=op.f("fk_node_results_node_id_nodes"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("node_id", "record_id", name=op.f("pk_node_results")),
    )
    op.create_index("ix_node_results_node_id_seq", "node_results", ["node_id", "seq"])


def downgrade() -> None:
    op.drop_index("ix_node_results_node_id_seq", table_name="node_results")
    op.drop_table("node_results")
