"""health_latest.shadow: the shadow section of each node's newest report (ADR 0031).

The numbers were already among the latest metrics (`shadow_*`); what the candidate is, its
state and why it failed are text, kept here so `nodes show` can say what a node shadows
without reading its raw records. NULL: the newest report has no shadow section.

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-21 00:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0011"
down_revision: str | Sequence[str] | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("health_latest") as batch:
        batch.add_column(
            sa.Column(
                "shadow", sa.JSON().with_variant(postgresql.JSONB(), "postgresql"), nullable=True
            )
        )


def downgrade() -> None:
    with op.batch_alter_table("health_latest") as batch:
        batch.drop_column("shadow")
