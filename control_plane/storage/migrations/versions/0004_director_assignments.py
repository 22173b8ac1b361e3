"""Director assignments: signed per-node "run target T" decisions, one row per sequence.

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-01 00:00:00

One new table, nothing existing changes.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | Sequence[str] | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "director_assignments",
        sa.Column("node_id", sa.String(length=64), nullable=False),
        sa.Column("sequence", sa.BigInteger(), autoincrement=False, nullable=False),
        sa.Column("target_path", sa.String(length=512), nullable=False),
        sa.Column("sha256", sa.String(length=64), nullable=False),
        sa.Column("length", sa.BigInteger(), nullable=False),
        sa.Column("issued_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("signed", sa.LargeBinary(), nullable=False),
        sa.Column("created_by", sa.String(length=128), nullable=False),
        sa.CheckConstraint("sequence >= 1", name=op.f("ck_director_assignments_sequence_positive")),
        sa.CheckConstraint("length >= 0", name=op.f("ck_director_assignments_length_nonnegative")),
        sa.ForeignKeyConstraint(
            ["node_id"],
            ["nodes.id"],
            name=op.f("fk_director_assignments_node_id_nodes"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("node_id", "sequence", name=op.f("pk_director_assignments")),
    )


def downgrade() -> None:
    op.drop_table("director_assignments")
