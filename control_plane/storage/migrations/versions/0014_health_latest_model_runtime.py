"""health_latest.model_runtime: where the served model's runtime settings come from.

The newest report's ``model_runtime`` section (issue 12 §1): ``config`` ``signed`` (the
version's signed runtime spec) or ``node`` (node.yaml's preprocess: a version pushed
before bundles, or a local model), the session settings node.yaml overrides on that box,
and whether node.yaml sets a preprocess the signed spec replaces. Kept so `nodes show`
can say so without reading raw records. NULL: the newest report has no such section (an
older agent, or no model served yet).

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-01 00:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0014"
down_revision: str | Sequence[str] | None = "0013"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("health_latest") as batch:
        batch.add_column(
            sa.Column(
                "model_runtime",
                sa.JSON().with_variant(postgresql.JSONB(), "postgresql"),
                nullable=True,
            )
        )


def downgrade() -> None:
    with op.batch_alter_table("health_latest") as batch:
        batch.drop_column("model_runtime")
