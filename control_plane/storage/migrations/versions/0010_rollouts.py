"""rollouts: canary rollouts, one row per rollout node, their decisions and actions.

The controller's state is split (ADR 0034): the rollout row holds the spec and the
state without its nodes, `rollout_nodes` one row per node (a 10,000-node state is 2.6 MB
as one document, and a step changes a few rows of it), `rollout_decisions` every
decision with its numbers, `rollout_actions` what a step decided, stored with it and
carried out after the commit. The lease columns say which replica steps a rollout.

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-20 00:00:00
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0010"
down_revision: str | Sequence[str] | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_STATUSES = (
    "pending",
    "running",
    "baking",
    "paused",
    "rolling-back",
    "done",
    "aborted",
    "rolled-back",
)


def _json() -> sa.types.TypeEngine[Any]:
    return sa.JSON().with_variant(postgresql.JSONB(), "postgresql")


def _id() -> sa.types.TypeEngine[Any]:
    return sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def _rollout_fk(table: str) -> sa.ForeignKeyConstraint:
    return sa.ForeignKeyConstraint(
        ["rollout_id"],
        ["rollouts.id"],
        name=op.f(f"fk_{table}_rollout_id_rollouts"),
        ondelete="CASCADE",
    )


def upgrade() -> None:
    statuses = ", ".join(f"'{s}'" for s in _STATUSES)
    op.create_table(
        "rollouts",
        sa.Column("id", _id(), autoincrement=True, nullable=False),
        sa.Column("fleet_id", sa.Integer(), nullable=False),
        sa.Column("model", sa.String(length=128), nullable=False),
        sa.Column("version", sa.String(length=64), nullable=False),
        sa.Column("spec", _json(), nullable=False),
        sa.Column("state", _json(), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("stage", sa.Integer(), nullable=False),
        sa.Column("created_by", sa.String(length=128), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("revision", sa.BigInteger(), nullable=False),
        sa.Column("following", sa.Boolean(), nullable=False),
        sa.Column("verdict", _json(), nullable=True),
        sa.Column("lease_owner", sa.String(length=128), nullable=True),
        sa.Column("lease_expires_at", sa.DateTime(timezone=True), nullable=True),
        sa.CheckConstraint(f"status IN ({statuses})", name=op.f("ck_rollouts_status")),
        sa.CheckConstraint("revision >= 0", name=op.f("ck_rollouts_revision_nonnegative")),
        sa.ForeignKeyConstraint(
            ["fleet_id"],
            ["fleets.id"],
            name=op.f("fk_rollouts_fleet_id_fleets"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_rollouts")),
    )
    op.create_index("ix_rollouts_fleet_id_model", "rollouts", ["fleet_id", "model"])
    op.create_index("ix_rollouts_status", "rollouts", ["status"])
    op.create_table(
        "rollout_nodes",
        sa.Column("rollout_id", sa.BigInteger(), autoincrement=False, nullable=False),
        sa.Column("node_id", sa.String(length=64), nullable=False),
        sa.Column("stage", sa.Integer(), nullable=True),
        sa.Column("rank", sa.Integer(), nullable=False),
        sa.Column("stratum", sa.String(length=512), nullable=False),
        sa.Column("previous", sa.String(length=64), nullable=True),
        sa.Column("since", sa.DateTime(timezone=True), nullable=False),
        sa.Column("phase", sa.String(length=24), nullable=False),
        sa.Column("track", sa.String(length=16), nullable=False),
        sa.Column("shadowing", sa.Boolean(), nullable=False),
        sa.Column("touched", sa.Boolean(), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("sequence", sa.BigInteger(), nullable=True),
        _rollout_fk("rollout_nodes"),
        sa.PrimaryKeyConstraint("rollout_id", "node_id", name=op.f("pk_rollout_nodes")),
    )
    op.create_table(
        "rollout_decisions",
        sa.Column("id", _id(), autoincrement=True, nullable=False),
        sa.Column("rollout_id", sa.BigInteger(), nullable=False),
        sa.Column("revision", sa.BigInteger(), nullable=False),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("kind", sa.String(length=32), nullable=False),
        sa.Column("stage", sa.Integer(), nullable=False),
        sa.Column("text", sa.Text(), nullable=False),
        sa.Column("numbers", _json(), nullable=False),
        _rollout_fk("rollout_decisions"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_rollout_decisions")),
    )
    op.create_index("ix_rollout_decisions_rollout_id_id", "rollout_decisions", ["rollout_id", "id"])
    op.create_table(
        "rollout_actions",
        sa.Column("id", _id(), autoincrement=True, nullable=False),
        sa.Column("rollout_id", sa.BigInteger(), nullable=False),
        sa.Column("revision", sa.BigInteger(), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("node_id", sa.String(length=64), nullable=True),
        sa.Column("version", sa.String(length=64), nullable=True),
        sa.Column("payload", _json(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("done_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("outcome", sa.String(length=16), nullable=True),
        sa.Column("detail", sa.Text(), nullable=False),
        sa.Column("sequence", sa.BigInteger(), nullable=True),
        sa.CheckConstraint(
            "kind IN ('assign', 'assign-shadow', 'end-shadow', 'rollback', 'notify')",
            name=op.f("ck_rollout_actions_kind"),
        ),
        _rollout_fk("rollout_actions"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_rollout_actions")),
    )
    op.create_index(
        "ix_rollout_actions_rollout_id_done_at", "rollout_actions", ["rollout_id", "done_at"]
    )


def downgrade() -> None:
    op.drop_index("ix_rollout_actions_rollout_id_done_at", table_name="rollout_actions")
    op.drop_table("rollout_actions")
    op.drop_index("ix_rollout_decisions_rollout_id_id", table_name="rollout_decisions")
    op.drop_table("rollout_decisions")
    op.drop_table("rollout_nodes")
    op.drop_index("ix_rollouts_status", table_name="rollouts")
    op.drop_index("ix_rollouts_fleet_id_model", table_name="rollouts")
    op.drop_table("rollouts")
