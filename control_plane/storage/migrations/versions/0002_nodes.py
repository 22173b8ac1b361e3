"""Node inventory and bootstrap tokens.

Revision ID: 0002
Revises: 0001
Create Date: 2025-02-01 00:00:00

Two new tables, nothing existing changes, so the SQLite batch mode is not needed.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0002"
down_revision: str | Sequence[str] | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

JSON_DOCUMENT = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")


def upgrade() -> None:
    op.create_table(
        "nodes",
        sa.Column("id", sa.String(length=64), nullable=False),
        sa.Column("fleet_id", sa.Integer(), nullable=False),
        sa.Column("labels", JSON_DOCUMENT, nullable=False),
        sa.Column("public_key_sha256", sa.String(length=64), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("reported_state", JSON_DOCUMENT, nullable=False),
        sa.Column("agent_version", sa.String(length=64), nullable=True),
        sa.Column("transport", sa.String(length=16), nullable=True),
        sa.Column("last_seen", sa.DateTime(timezone=True), nullable=True),
        sa.Column("online", sa.Boolean(), nullable=False),
        sa.Column("cert_serial", sa.String(length=40), nullable=True),
        sa.Column("cert_expires_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("previous_cert_serial", sa.String(length=40), nullable=True),
        sa.Column("previous_cert_expires_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("revoked_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(
            ["fleet_id"],
            ["fleets.id"],
            name=op.f("fk_nodes_fleet_id_fleets"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_nodes")),
    )
    op.create_index(op.f("ix_nodes_fleet_id"), "nodes", ["fleet_id"], unique=False)
    op.create_table(
        "bootstrap_tokens",
        sa.Column("id", sa.String(length=32), nullable=False),
        sa.Column("fleet_id", sa.Integer(), nullable=False),
        sa.Column("token_hash", sa.String(length=64), nullable=False),
        sa.Column("labels", JSON_DOCUMENT, nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("created_by", sa.String(length=128), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("used_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("node_id", sa.String(length=64), nullable=True),
        sa.Column("revoked_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(
            ["fleet_id"],
            ["fleets.id"],
            name=op.f("fk_bootstrap_tokens_fleet_id_fleets"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["node_id"],
            ["nodes.id"],
            name=op.f("fk_bootstrap_tokens_node_id_nodes"),
            ondelete="SET NULL",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_bootstrap_tokens")),
        sa.UniqueConstraint("token_hash", name=op.f("uq_bootstrap_tokens_token_hash")),
    )
    op.create_index(
        op.f("ix_bootstrap_tokens_fleet_id"), "bootstrap_tokens", ["fleet_id"], unique=False
    )


def downgrade() -> None:
    op.drop_index(op.f("ix_bootstrap_tokens_fleet_id"), table_name="bootstrap_tokens")
    op.drop_table("bootstrap_tokens")
    op.drop_index(op.f("ix_nodes_fleet_id"), table_name="nodes")
    op.drop_table("nodes")
