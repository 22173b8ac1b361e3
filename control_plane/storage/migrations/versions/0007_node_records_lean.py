"""A leaner node_records: no foreign key to nodes, no (node_id, kind, seq) index, and
on PostgreSQL bytewise ("C") ids and payloads compressed with lz4.

Every ingested record paid for all three in PostgreSQL: the foreign key is a trigger
that looks up and share-locks the node's row once per inserted row, nothing reads by
(node_id, kind, seq), and a health report (about 2.6 kB) is over the 2 kB at which
PostgreSQL compresses a row, with pglz unless told otherwise, at twice lz4's CPU
(ADR 0020). Records are only ever written for a node the link has just authenticated,
and nodes are revoked, never deleted.

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-03 00:00:00
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | Sequence[str] | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _node_records_0006() -> sa.Table:
    """The table as 0003 made it, less the dropped index (SQLite's batch mode copies it,
    and the offline SQL script cannot reflect it)."""
    return sa.Table(
        "node_records",
        sa.MetaData(),
        sa.Column("node_id", sa.String(length=64), nullable=False),
        sa.Column("record_id", sa.String(length=36), nullable=False),
        sa.Column("seq", sa.BigInteger(), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("received_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("content_type", sa.String(length=64), nullable=False),
        sa.Column("payload", sa.LargeBinary(), nullable=False),
        sa.CheckConstraint("kind IN ('event', 'health')", name="ck_node_records_kind"),
        sa.ForeignKeyConstraint(
            ["node_id"], ["nodes.id"], name="fk_node_records_node_id_nodes", ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("node_id", "record_id", name="pk_node_records"),
        sa.Index("ix_node_records_received_at", "received_at"),
    )


def upgrade() -> None:
    op.drop_index("ix_node_records_node_id_kind_seq", table_name="node_records")
    with op.batch_alter_table("node_records", copy_from=_node_records_0006()) as batch:
        batch.drop_constraint(op.f("fk_node_records_node_id_nodes"), type_="foreignkey")
    if op.get_context().dialect.name == "postgresql":
        # Ids compare bytewise: the primary key's comparisons cost a fifth of a row.
        # Rebuilds the primary key (the table is locked meanwhile); rows stay as they are.
        op.execute(
            'ALTER TABLE node_records ALTER COLUMN node_id TYPE varchar(64) COLLATE "C", '
            'ALTER COLUMN record_id TYPE varchar(36) COLLATE "C"'
        )
        # The health store's cursor orders ties of received_at by (node_id, record_id):
        # under the new collation that order may differ, so the processor reads the
        # cursor's own received_at again (what it processed already it skips, ADR 0018).
        op.execute("UPDATE health_cursor SET node_id = '', record_id = ''")
        # lz4 for new payloads, where the server has it (PostgreSQL 14+ built with lz4).
        _where_supported(
            "ALTER TABLE node_records ALTER COLUMN payload SET COMPRESSION lz4",
            "node_records.payload keeps pglz",
        )


def _where_supported(statement: str, otherwise: str) -> None:
    """Run `statement`; where the server lacks what it needs, log `otherwise` and go on.

    For compression settings: slower without them, not wrong. Offline (--sql) the
    statement is written as is.
    """
    if op.get_context().as_sql:
        op.execute(statement)
        return
    bind = op.get_bind()
    try:
        with bind.begin_nested():
            bind.exec_driver_sql(statement)
    except sa.exc.DBAPIError as exc:
        logging.getLogger("alembic.runtime.migration").warning(
            "%s (%s)", otherwise, str(exc.orig).strip().splitlines()[0]
        )


def downgrade() -> None:
    if op.get_context().dialect.name == "postgresql":
        _where_supported(
            "ALTER TABLE node_records ALTER COLUMN payload SET COMPRESSION DEFAULT",
            "node_records.payload compression left as it is",
        )
        op.execute(
            'ALTER TABLE node_records ALTER COLUMN node_id TYPE varchar(64) COLLATE "default", '
            'ALTER COLUMN record_id TYPE varchar(36) COLLATE "default"'
        )
        op.execute("UPDATE health_cursor SET node_id = '', record_id = ''")
    # Records of nodes that no longer exist would break the foreign key: drop them first.
    op.execute("DELETE FROM node_records WHERE node_id NOT IN (SELECT id FROM nodes)")
    with op.batch_alter_table("node_records") as batch:
        batch.create_foreign_key(
            op.f("fk_node_records_node_id_nodes"),
            "nodes",
            ["node_id"],
            ["id"],
            ondelete="CASCADE",
        )
    op.create_index("ix_node_records_node_id_kind_seq", "node_records", ["node_id", "kind", "seq"])
