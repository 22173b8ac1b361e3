"""node_records keeps rows of up to 4 kB inline and uncompressed (PostgreSQL).

PostgreSQL compresses a row's long values once the row passes `toast_tuple_target`
(2 kB by default), so every health report (about 2.6 kB of JSON) went through lz4 on
insert: about 4 of the 14 µs a stored row cost the database, for a quarter less disk
(ADR 0021). With the target at 4080 bytes (two rows a page) a report is stored as it
came; a larger payload is still compressed (lz4, migration 0007) and moved out of line.
Applies to rows written from now on; stored rows stay as they are. SQLite has no such
setting.

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-30 00:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0008"
down_revision: str | Sequence[str] | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TOAST_TUPLE_TARGET = 4080


def upgrade() -> None:
    if op.get_context().dialect.name == "postgresql":
        op.execute(f"ALTER TABLE node_records SET (toast_tuple_target = {TOAST_TUPLE_TARGET})")


def downgrade() -> None:
    if op.get_context().dialect.name == "postgresql":
        op.execute("ALTER TABLE node_records RESET (toast_tuple_target)")
