"""Engine tuning and the UTC timestamp type."""

from __future__ import annotations

import sqlite3
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path

import pytest
import sqlalchemy as sa
from sqlalchemy import Engine
from sqlalchemy.exc import IntegrityError, StatementError
from sqlalchemy.orm import Session

import control_plane.storage as storage
from control_plane.storage import (
    FleetRow,
    UTCDateTime,
    create_engine_for,
    migrate,
    session_factory,
)

IST = timezone(timedelta(hours=5, minutes=30))


def test_public_names_exist() -> None:
    for name in storage.__all__:
        assert hasattr(storage, name), name


def test_sqlite_runs_in_wal_mode_with_foreign_keys(tmp_path: Path) -> None:
    path = tmp_path / "nested" / "dir" / "cp.db"  # parent directories are created
    engine = create_engine_for(f"sqlite:///{path}")
    try:
        migrate(engine)
        with engine.connect() as conn:

            def pragma(name: str) -> object:
                return conn.exec_driver_sql(f"PRAGMA {name}").scalar()

            assert pragma("journal_mode") == "wal"
            assert pragma("foreign_keys") == 1
            assert pragma("busy_timeout") == 5000
            assert pragma("synchronous") == 1  # NORMAL
    finally:
        engine.dispose()
    assert path.exists()


def test_sqlite_ddl_is_transactional(tmp_path: Path) -> None:
    """What makes a failed migration leave nothing behind on SQLite."""
    engine = create_engine_for(f"sqlite:///{tmp_path / 'cp.db'}")
    try:
        with pytest.raises(RuntimeError), engine.begin() as conn:
            conn.exec_driver_sql("CREATE TABLE t (x INTEGER)")
            raise RuntimeError("migration step failed")
        assert sa.inspect(engine).get_table_names() == []
    finally:
        engine.dispose()


def test_sqlite_begin_mode_is_validated(tmp_path: Path) -> None:
    engine = create_engine_for(f"sqlite:///{tmp_path / 'cp.db'}")
    try:
        with engine.connect() as conn:
            conn.execution_options(sqlite_begin="IMMEDIATE")
            with conn.begin():
                assert conn.exec_driver_sql("SELECT 1").scalar() == 1
        with pytest.raises(ValueError, match="sqlite_begin"), engine.connect() as conn:
            conn.execution_options(sqlite_begin="LATER; DROP TABLE x")
            conn.begin()
    finally:
        engine.dispose()


def driver(conn: sa.Connection) -> sqlite3.Connection:
    raw = conn.connection.driver_connection
    assert isinstance(raw, sqlite3.Connection)
    return raw


def test_sqlite_autocommit_is_honoured_and_does_not_leak(tmp_path: Path) -> None:
    engine = create_engine_for(f"sqlite:///{tmp_path / 'cp.db'}")
    try:
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.exec_driver_sql("CREATE TABLE t (x INTEGER)")
            assert not driver(conn).in_transaction
        # The same pooled connection, back in transactional use: SELECTs are inside BEGIN.
        with engine.connect() as conn:
            conn.exec_driver_sql("SELECT count(*) FROM t")
            assert driver(conn).in_transaction
    finally:
        engine.dispose()


def new_fleet(created_at: datetime, name: str = "f1") -> FleetRow:
    return FleetRow(name=name, state="active", created_at=created_at)


def test_utc_datetime_round_trips_as_aware_utc(session: Session, migrated_engine: Engine) -> None:
    written = datetime(2025, 3, 1, 17, 30, 0, 123456, tzinfo=IST)
    session.add(new_fleet(written))
    session.commit()

    with Session(migrated_engine) as fresh:
        if migrated_engine.dialect.name == "postgresql":
            fresh.execute(sa.text("SET TIME ZONE 'America/New_York'"))
        read = fresh.scalars(sa.select(FleetRow.created_at)).one()

    assert read == written
    assert read.tzinfo is UTC
    assert read == datetime(2025, 3, 1, 12, 0, 0, 123456, tzinfo=UTC)


def test_utc_datetime_is_stored_as_utc(session: Session, migrated_engine: Engine) -> None:
    session.add(new_fleet(datetime(2025, 3, 1, 17, 30, tzinfo=IST)))
    session.commit()

    raw = session.execute(sa.text("SELECT created_at FROM fleets")).scalar()
    if migrated_engine.dialect.name == "sqlite":
        # Naive UTC text, so SQL comparisons and ORDER BY are correct on SQLite too.
        assert raw == "2025-03-01 12:00:00.000000"
    else:
        assert raw == datetime(2025, 3, 1, 12, 0, tzinfo=UTC)


def test_utc_datetime_refuses_naive_datetimes(session: Session) -> None:
    session.add(new_fleet(datetime(2025, 3, 1, 12, 0)))
    with pytest.raises(StatementError) as info:
        session.flush()
    assert isinstance(info.value.orig, ValueError)


def test_utc_datetime_refuses_naive_datetimes_in_queries(session: Session) -> None:
    query = sa.select(FleetRow).where(FleetRow.created_at < datetime(2025, 1, 1))
    with pytest.raises(StatementError) as info:
        session.execute(query)
    assert isinstance(info.value.orig, ValueError)


@pytest.mark.parametrize("value", [datetime(2025, 1, 1), "2025-01-01T00:00:00Z"])
def test_utc_datetime_bind_rejects_non_aware_values(value: object) -> None:
    dialect = sa.create_engine("sqlite://").dialect
    with pytest.raises((ValueError, TypeError)):
        UTCDateTime().process_bind_param(value, dialect)  # type: ignore[arg-type]


def test_utc_datetime_passes_none(session: Session) -> None:
    assert UTCDateTime().process_bind_param(None, session.get_bind().dialect) is None


def test_a_session_can_take_the_sqlite_write_lock_up_front(tmp_path: Path) -> None:
    """For read-then-write transactions (e.g. "targets version == current + 1")."""
    engine = create_engine_for(f"sqlite:///{tmp_path / 'cp.db'}")
    statements: list[str] = []
    sa.event.listen(engine, "before_cursor_execute", lambda *a: statements.append(a[2]))
    try:
        with session_factory(engine)() as session:
            session.connection(execution_options={"sqlite_begin": "IMMEDIATE"})
            session.execute(sa.text("SELECT 1"))
            session.commit()
    finally:
        engine.dispose()
    assert "BEGIN IMMEDIATE" in statements


def test_savepoints_roll_back_only_their_part(session: Session) -> None:
    session.add(new_fleet(datetime(2025, 1, 1, tzinfo=UTC), "kept"))
    with pytest.raises(IntegrityError), session.begin_nested():
        session.add(new_fleet(datetime(2025, 1, 1, tzinfo=UTC), "kept"))
        session.flush()
    session.add(new_fleet(datetime(2025, 1, 1, tzinfo=UTC), "also-kept"))
    session.commit()

    names = session.scalars(sa.select(FleetRow.name).order_by(FleetRow.name)).all()
    assert names == ["also-kept", "kept"]
