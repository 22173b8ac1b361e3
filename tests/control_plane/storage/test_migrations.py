"""Migrations build exactly the schema the models describe, on both backends."""

from __future__ import annotations

import io
import threading
from typing import Any

import pytest
import sqlalchemy as sa
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import Engine, MetaData, event, inspect

from control_plane.errors import UnavailableError
from control_plane.storage import (
    Base,
    SchemaOutOfDateError,
    check_schema_current,
    create_engine_for,
    current_revision,
    downgrade,
    head_revision,
    migrate,
)
from control_plane.storage.db import alembic_config

TABLES = {
    "fleets",
    "tuf_metadata",
    "model_versions",
    "model_floors",
    "artifacts",
    "api_tokens",
    "audit_log",
    "nodes",
    "bootstrap_tokens",
    "node_records",
    "node_results",
    "fleet_events",
    "director_assignments",
    "health_cursor",
    "health_points",
    "health_rollups",
    "health_latest",
    "health_alerts",
    "rollouts",
    "rollout_nodes",
    "rollout_decisions",
    "rollout_actions",
}


def schema_diff(engine: Engine, metadata: MetaData = Base.metadata) -> list[Any]:
    with engine.connect() as conn:
        context = MigrationContext.configure(
            conn, opts={"compare_type": True, "compare_server_default": True}
        )
        return list(compare_metadata(context, metadata))


def test_migrated_schema_matches_the_models(migrated_engine: Engine) -> None:
    assert schema_diff(migrated_engine) == []
    assert set(inspect(migrated_engine).get_table_names()) == TABLES | {"alembic_version"}


def test_the_comparison_notices_drift(migrated_engine: Engine) -> None:
    """Guards the test above: a drifted model must show up as a diff."""
    drifted = MetaData(naming_convention=Base.metadata.naming_convention)
    for table in Base.metadata.tables.values():
        table.to_metadata(drifted)
    drifted.tables["fleets"].append_column(sa.Column("region", sa.String(32), nullable=True))
    drifted.tables["artifacts"].c.uploaded_by.type = sa.String(64)

    diff = schema_diff(migrated_engine, drifted)

    assert any(d[0] == "add_column" and d[3].name == "region" for d in diff)
    assert any(isinstance(d, list) and d[0][0] == "modify_type" for d in diff)


def test_downgrade_to_base_and_upgrade_again(migrated_engine: Engine) -> None:
    downgrade(migrated_engine, "base")
    assert current_revision(migrated_engine) is None
    assert set(inspect(migrated_engine).get_table_names()) <= {"alembic_version"}

    migrate(migrated_engine)

    assert current_revision(migrated_engine) == head_revision()
    assert schema_diff(migrated_engine) == []


def test_migrate_twice_is_a_no_op(migrated_engine: Engine) -> None:
    statements: list[str] = []

    def record(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        statements.append(statement.strip().upper())

    event.listen(migrated_engine, "before_cursor_execute", record)
    try:
        migrate(migrated_engine)
    finally:
        event.remove(migrated_engine, "before_cursor_execute", record)

    writes = [
        s for s in statements if s.startswith(("CREATE", "ALTER", "DROP", "INSERT", "UPDATE"))
    ]
    assert writes == []
    assert current_revision(migrated_engine) == head_revision()


def test_migrate_accepts_a_url(database_url: str, engine: Engine) -> None:
    migrate(database_url)
    assert current_revision(engine) == head_revision()


def test_concurrent_migrations_take_turns(database_url: str, engine: Engine) -> None:
    """Replicas starting together must not both try to create the schema."""
    errors: list[BaseException] = []

    def run() -> None:
        replica = create_engine_for(database_url)
        try:
            migrate(replica)
        except BaseException as exc:
            errors.append(exc)
        finally:
            replica.dispose()

    threads = [threading.Thread(target=run) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)

    assert errors == []
    assert current_revision(engine) == head_revision()
    assert schema_diff(engine) == []


def test_check_schema_current_refuses_an_unmigrated_database(engine: Engine) -> None:
    assert current_revision(engine) is None
    with pytest.raises(SchemaOutOfDateError) as info:
        check_schema_current(engine)
    assert isinstance(info.value, UnavailableError)
    assert info.value.fields == {"current_revision": None, "head_revision": head_revision()}


def test_check_schema_current_passes_at_head(migrated_engine: Engine) -> None:
    check_schema_current(migrated_engine)


def test_check_schema_current_refuses_an_unknown_newer_revision(migrated_engine: Engine) -> None:
    with migrated_engine.begin() as conn:
        conn.execute(sa.text("UPDATE alembic_version SET version_num = '9999'"))
    with pytest.raises(SchemaOutOfDateError, match="unknown to this build"):
        check_schema_current(migrated_engine)


@pytest.mark.parametrize("url", ["sqlite:///unused.db", "postgresql+psycopg://u@h/unused"])
def test_offline_sql_script_renders(url: str) -> None:
    """``--sql`` output for DBAs who apply migrations by hand; needs no database."""
    config = alembic_config(url)
    config.output_buffer = io.StringIO()

    command.upgrade(config, "head", sql=True)

    script = config.output_buffer.getvalue()
    assert "CREATE TABLE audit_log" in script
    assert "CREATE TRIGGER audit_log_no_" in script
    assert "%%" not in script


def test_node_records_is_lean_and_its_payloads_use_lz4(migrated_engine: Engine) -> None:
    # ADR 0020: no foreign key, no (node_id, kind, seq) index; lz4 where PostgreSQL has it.
    inspector = inspect(migrated_engine)
    assert inspector.get_foreign_keys("node_records") == []
    assert {i["name"] for i in inspector.get_indexes("node_records")} == {
        "ix_node_records_received_at"
    }
    if migrated_engine.dialect.name != "postgresql":
        return
    with migrated_engine.connect() as connection:
        lz4_built_in = connection.exec_driver_sql(
            "SELECT count(*) FROM pg_settings WHERE name = 'default_toast_compression' "
            "AND 'lz4' = ANY(enumvals)"
        ).scalar_one()
        compression = connection.exec_driver_sql(
            "SELECT attcompression FROM pg_attribute "
            "WHERE attrelid = 'node_records'::regclass AND attname = 'payload'"
        ).scalar_one()
        collations = dict(
            connection.exec_driver_sql(
                "SELECT column_name, collation_name FROM information_schema.columns "
                "WHERE table_name = 'node_records' AND column_name IN ('node_id', 'record_id')"
            ).all()
        )
    assert compression == ("l" if lz4_built_in else "")
    assert collations == {"node_id": "C", "record_id": "C"}


def test_node_records_keeps_a_health_report_inline_and_uncompressed(
    migrated_engine: Engine,
) -> None:
    # ADR 0021: rows up to 4 kB are stored as they came; larger payloads still compress.
    if migrated_engine.dialect.name != "postgresql":
        pytest.skip("a PostgreSQL storage parameter")
    from datetime import UTC, datetime

    stored = datetime(2026, 11, 30, tzinfo=UTC)
    report = b'{"schema": "edgefleet.agent.health/2", "pad": "' + b"ab" * 1300 + b'"}'
    large = b'{"pad": "' + b"ab" * 4000 + b'"}'
    with migrated_engine.begin() as connection:
        options = connection.exec_driver_sql(
            "SELECT reloptions FROM pg_class WHERE relname = 'node_records'"
        ).scalar_one()
        for record_id, payload in (("a", report), ("b", large)):
            connection.exec_driver_sql(
                "INSERT INTO node_records (node_id, record_id, seq, kind, created_at, "
                "received_at, content_type, payload) "
                "VALUES ('n', %(id)s, 1, 'health', %(at)s, %(at)s, 'application/json', %(p)s)",
                {"id": record_id, "at": stored, "p": payload},
            )
        sizes = dict(
            connection.exec_driver_sql(
                "SELECT record_id, pg_column_size(payload) FROM node_records ORDER BY 1"
            ).all()
        )
    assert options == ["toast_tuple_target=4080"]
    assert sizes["a"] >= len(report)  # as it came: not compressed
    assert sizes["b"] < len(large) / 2  # over the target: compressed


def test_downgrading_0008_resets_the_toast_target(migrated_engine: Engine) -> None:
    downgrade(migrated_engine, "0007")
    if migrated_engine.dialect.name == "postgresql":
        with migrated_engine.connect() as connection:
            options = connection.exec_driver_sql(
                "SELECT reloptions FROM pg_class WHERE relname = 'node_records'"
            ).scalar_one()
        assert options is None
    migrate(migrated_engine)
    assert schema_diff(migrated_engine) == []


def test_downgrading_0007_keeps_only_records_of_known_nodes(migrated_engine: Engine) -> None:
    from datetime import UTC, datetime

    from control_plane.storage import session_factory
    from control_plane.storage.models import HealthCursorRow, NodeRecordRow
    from tests.control_plane.health.support import add_nodes

    now = datetime.now(UTC)
    sessions = session_factory(migrated_engine)
    add_nodes(sessions, "n-1")
    with sessions() as session:
        for node in ("n-1", "gone"):
            session.add(
                NodeRecordRow(
                    node_id=node,
                    record_id=f"0190a2b4-0000-7000-8000-00000000000{len(node)}",
                    seq=1,
                    kind="event",
                    created_at=now,
                    received_at=now,
                    content_type="application/json",
                    payload=b"{}",
                )
            )
        session.add(HealthCursorRow(name="health", received_at=now, node_id="n-1", record_id="r"))
        session.commit()
    downgrade(migrated_engine, "0006")
    with migrated_engine.connect() as connection:
        left = connection.exec_driver_sql("SELECT node_id FROM node_records").scalars().all()
    assert left == ["n-1"]
    assert inspect(migrated_engine).get_foreign_keys("node_records")
    migrate(migrated_engine)
    assert schema_diff(migrated_engine) == []
    with sessions() as session:
        cursor = session.get(HealthCursorRow, "health")
        assert cursor is not None and cursor.received_at == now
        # PostgreSQL changed the ids' collation: the cursor re-reads its received_at.
        expected = ("", "") if migrated_engine.dialect.name == "postgresql" else ("n-1", "r")
        assert (cursor.node_id, cursor.record_id) == expected


def test_0011_adds_the_latest_shadow_and_its_downgrade_keeps_the_latest_points(
    migrated_engine: Engine,
) -> None:
    from datetime import UTC, datetime

    from control_plane.storage import session_factory
    from control_plane.storage.models import HealthLatestRow
    from tests.control_plane.health.support import add_nodes

    now = datetime.now(UTC)
    sessions = session_factory(migrated_engine)
    add_nodes(sessions, "n-1")
    shadow = {"candidate": "det@1.1.0", "state": "running", "frames_compared": 3}
    with sessions() as session:
        session.add(
            HealthLatestRow(
                node_id="n-1", record_id="r", at=now, schema="s", metrics={}, latency={},
                shadow=shadow,
            )
        )  # fmt: skip
        session.commit()
    with sessions() as session:
        row = session.get(HealthLatestRow, "n-1")
        assert row is not None and row.shadow == shadow

    downgrade(migrated_engine, "0010")
    columns = {c["name"] for c in inspect(migrated_engine).get_columns("health_latest")}
    assert "shadow" not in columns and "metrics" in columns
    with migrated_engine.connect() as connection:
        kept = connection.exec_driver_sql("SELECT node_id FROM health_latest").scalars().all()
    assert kept == ["n-1"]

    migrate(migrated_engine)
    assert schema_diff(migrated_engine) == []
    with sessions() as session:
        row = session.get(HealthLatestRow, "n-1")
        assert row is not None and row.shadow is None  # the next report fills it in
