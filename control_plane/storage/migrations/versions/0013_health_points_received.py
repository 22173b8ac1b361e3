"""health_points: an index on (node_id, received_at) for the gates' incremental reads.

The rollout gates keep each judged node's points between evaluations and read only the
rows received since their last read (ADR 0036): per node, the rows at or after a
`received_at`, which (node_id, at) cannot serve.

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-01 00:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0013"
down_revision: str | Sequence[str] | None = "0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_index(
        "ix_health_points_node_id_received_at", "health_points", ["node_id", "received_at"]
    )


def downgrade() -> None:
    op.drop_index("ix_health_points_node_id_received_at", table_name="health_points")
