"""Initial schema: fleets, TUF metadata, model versions and floors, artifacts, API tokens, audit log.

Revision ID: 0001
Revises:
Create Date: 2025-01-01 00:00:00

The audit log is append-only, enforced by the database (not only by the services):

* PostgreSQL: ``BEFORE UPDATE OR DELETE`` (per row) and ``BEFORE TRUNCATE`` (per
  statement) triggers call ``audit_log_append_only()``, which raises SQLSTATE 23001
  (restrict_violation), surfacing as ``sqlalchemy.exc.IntegrityError``. A retention job
  has to run as a role allowed to ``ALTER TABLE audit_log DISABLE TRIGGER …``, which
  the application's role should not be.
* SQLite: ``BEFORE UPDATE`` / ``BEFORE DELETE`` triggers ``RAISE(ABORT, …)``, also an
  ``IntegrityError``. A later batch migration that rebuilds ``audit_log`` on SQLite
  drops these triggers with the old table and must create them again.

Triggers are not part of ``Base.metadata``; autogenerate ignores them.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0001"
down_revision: str | Sequence[str] | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

JSON_DOCUMENT = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")

# The message is built without RAISE's '%' placeholders: offline (--sql) rendering
# doubles every percent sign, which would break the function body.
_PG_AUDIT_TRIGGERS_UP = (
    """
    CREATE FUNCTION audit_log_append_only() RETURNS trigger
    LANGUAGE plpgsql AS $$
    BEGIN
        RAISE EXCEPTION USING
            MESSAGE = 'audit_log is append-only (' || TG_OP || ' refused)',
            ERRCODE = 'restrict_violation';
    END;
    $$
    """,
    """
    CREATE TRIGGER audit_log_no_update_delete
    BEFORE UPDATE OR DELETE ON audit_log
    FOR EACH ROW EXECUTE FUNCTION audit_log_append_only()
    """,
    """
    CREATE TRIGGER audit_log_no_truncate
    BEFORE TRUNCATE ON audit_log
    FOR EACH STATEMENT EXECUTE FUNCTION audit_log_append_only()
    """,
)
_PG_AUDIT_TRIGGERS_DOWN = (
    "DROP TRIGGER IF EXISTS audit_log_no_truncate ON audit_log",
    "DROP TRIGGER IF EXISTS audit_log_no_update_delete ON audit_log",
    "DROP FUNCTION IF EXISTS audit_log_append_only()",
)
_SQLITE_AUDIT_TRIGGERS_UP = (
    """
    CREATE TRIGGER audit_log_no_update BEFORE UPDATE ON audit_log
    BEGIN SELECT RAISE(ABORT, 'audit_log is append-only'); END
    """,
    """
    CREATE TRIGGER audit_log_no_delete BEFORE DELETE ON audit_log
    BEGIN SELECT RAISE(ABORT, 'audit_log is append-only'); END
    """,
)
_SQLITE_AUDIT_TRIGGERS_DOWN = (
    "DROP TRIGGER IF EXISTS audit_log_no_delete",
    "DROP TRIGGER IF EXISTS audit_log_no_update",
)


def upgrade() -> None:
    op.create_table(
        "fleets",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("name", sa.String(length=63), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("snapshot_keyid", sa.String(length=64), nullable=True),
        sa.Column("timestamp_keyid", sa.String(length=64), nullable=True),
        sa.CheckConstraint("state IN ('pending', 'active')", name=op.f("ck_fleets_state")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_fleets")),
        sa.UniqueConstraint("name", name=op.f("uq_fleets_name")),
    )
    op.create_table(
        "tuf_metadata",
        sa.Column("fleet_id", sa.Integer(), nullable=False),
        sa.Column("role", sa.String(length=32), nullable=False),
        sa.Column("version", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("body", sa.LargeBinary(), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.CheckConstraint("version >= 1", name=op.f("ck_tuf_metadata_version_positive")),
        sa.ForeignKeyConstraint(
            ["fleet_id"],
            ["fleets.id"],
            name=op.f("fk_tuf_metadata_fleet_id_fleets"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("fleet_id", "role", "version", name=op.f("pk_tuf_metadata")),
    )
    op.create_table(
        "model_versions",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("fleet_id", sa.Integer(), nullable=False),
        sa.Column("model", sa.String(length=128), nullable=False),
        sa.Column("version", sa.String(length=64), nullable=False),
        sa.Column("release_counter", sa.Integer(), nullable=False),
        sa.Column("target_path", sa.String(length=512), nullable=False),
        sa.Column("sha256", sa.String(length=64), nullable=False),
        sa.Column("length", sa.BigInteger(), nullable=False),
        sa.Column("custom", JSON_DOCUMENT, nullable=False),
        sa.Column("targets_version", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("created_by", sa.String(length=128), nullable=False),
        sa.CheckConstraint("length >= 0", name=op.f("ck_model_versions_length_nonnegative")),
        sa.ForeignKeyConstraint(
            ["fleet_id"],
            ["fleets.id"],
            name=op.f("fk_model_versions_fleet_id_fleets"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_model_versions")),
        sa.UniqueConstraint(
            "fleet_id",
            "model",
            "release_counter",
            name=op.f("uq_model_versions_fleet_id_model_release_counter"),
        ),
        sa.UniqueConstraint(
            "fleet_id", "model", "version", name=op.f("uq_model_versions_fleet_id_model_version")
        ),
        sa.UniqueConstraint(
            "fleet_id", "target_path", name=op.f("uq_model_versions_fleet_id_target_path")
        ),
    )
    op.create_table(
        "model_floors",
        sa.Column("fleet_id", sa.Integer(), nullable=False),
        sa.Column("model", sa.String(length=128), nullable=False),
        sa.Column("floor", sa.Integer(), nullable=False),
        sa.Column("targets_version", sa.Integer(), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["fleet_id"],
            ["fleets.id"],
            name=op.f("fk_model_floors_fleet_id_fleets"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("fleet_id", "model", name=op.f("pk_model_floors")),
    )
    op.create_table(
        "artifacts",
        sa.Column("sha256", sa.String(length=64), nullable=False),
        sa.Column("length", sa.BigInteger(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("uploaded_by", sa.String(length=128), nullable=False),
        sa.CheckConstraint("length >= 0", name=op.f("ck_artifacts_length_nonnegative")),
        sa.PrimaryKeyConstraint("sha256", name=op.f("pk_artifacts")),
    )
    op.create_table(
        "api_tokens",
        sa.Column("id", sa.String(length=32), nullable=False),
        sa.Column("name", sa.String(length=128), nullable=False),
        sa.Column("role", sa.String(length=32), nullable=False),
        sa.Column("token_hash", sa.String(length=64), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("created_by", sa.String(length=128), nullable=False),
        sa.Column("revoked_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("last_used_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_api_tokens")),
        sa.UniqueConstraint("token_hash", name=op.f("uq_api_tokens_token_hash")),
    )
    op.create_table(
        "audit_log",
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            autoincrement=True,
            nullable=False,
        ),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("actor", sa.String(length=128), nullable=False),
        sa.Column("role", sa.String(length=32), nullable=False),
        sa.Column("action", sa.String(length=64), nullable=False),
        sa.Column("target", sa.String(length=512), nullable=False),
        sa.Column("request_id", sa.String(length=64), nullable=False),
        sa.Column("outcome", sa.String(length=16), nullable=False),
        sa.Column("details", JSON_DOCUMENT, nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_audit_log")),
    )
    op.create_index(op.f("ix_audit_log_at"), "audit_log", ["at"], unique=False)

    for statement in _audit_triggers(up=True):
        op.execute(statement)


def downgrade() -> None:
    for statement in _audit_triggers(up=False):
        op.execute(statement)
    op.drop_index(op.f("ix_audit_log_at"), table_name="audit_log")
    op.drop_table("audit_log")
    op.drop_table("api_tokens")
    op.drop_table("artifacts")
    op.drop_table("model_floors")
    op.drop_table("model_versions")
    op.drop_table("tuf_metadata")
    op.drop_table("fleets")


def _audit_triggers(*, up: bool) -> Sequence[str]:
    dialect = op.get_context().dialect.name
    if dialect == "postgresql":
        return _PG_AUDIT_TRIGGERS_UP if up else _PG_AUDIT_TRIGGERS_DOWN
    if dialect == "sqlite":
        return _SQLITE_AUDIT_TRIGGERS_UP if up else _SQLITE_AUDIT_TRIGGERS_DOWN
    raise NotImplementedError(f"no append-only triggers for {dialect}; add them here")
