"""Per-node MQTT credentials: the Mosquitto hash of each MQTT node's password.

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-01 00:00:01
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | Sequence[str] | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("nodes") as batch:
        batch.add_column(sa.Column("mqtt_password_hash", sa.String(length=160), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("nodes") as batch:
        batch.drop_column("mqtt_password_hash")
