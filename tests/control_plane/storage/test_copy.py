"""The PostgreSQL binary COPY helper: rows arrive typed, in the caller's transaction, and
the driver's errors come out as SQLAlchemy's."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime

import pytest
from sqlalchemy import Engine, text
from sqlalchemy.exc import IntegrityError

from control_plane.storage import create_engine_for
from control_plane.storage.copy import BinaryCopy, WriteRow, copy_rows, copy_with, server_version

ITEMS = BinaryCopy(
    "items", ("id", "name", "at", "blob"), ("int8", "varchar", "timestamptz", "bytea")
)
AT = datetime(2026, 3, 1, 12, 30, tzinfo=UTC)


@pytest.fixture
def pg(postgres_url: str) -> Iterator[Engine]:
    engine = create_engine_for(postgres_url)
    with engine.begin() as conn:
        conn.execute(
            text(
                "CREATE TABLE items (id int8 PRIMARY KEY, name varchar, at timestamptz, blob bytea)"
            )
        )
    try:
        yield engine
    finally:
        engine.dispose()


def rows_of(engine: Engine, table: str = "items") -> list[tuple[object, ...]]:
    with engine.connect() as conn:
        return [tuple(r) for r in conn.execute(text(f"SELECT * FROM {table} ORDER BY id"))]


def test_the_statement_names_the_table_and_columns_in_order() -> None:
    assert ITEMS.statement == "COPY items (id, name, at, blob) FROM STDIN (FORMAT BINARY)"
    stage = ITEMS.into("items_stage")
    assert stage.statement == "COPY items_stage (id, name, at, blob) FROM STDIN (FORMAT BINARY)"
    assert stage.types == ITEMS.types


def test_a_column_without_a_type_is_refused_at_once() -> None:
    with pytest.raises(ValueError, match="one type per column"):
        BinaryCopy("items", ("id", "name"), ("int8",))
    with pytest.raises(ValueError, match="one type per column"):
        BinaryCopy("items", (), ())


def test_rows_arrive_typed_and_only_when_the_transaction_commits(pg: Engine) -> None:
    with pg.connect() as conn:
        copy_rows(conn, ITEMS, [(1, "a", AT, b"\x00\xff"), (2, None, AT, b"")])
        assert rows_of(pg) == []  # not committed yet: another connection sees nothing
        conn.commit()
    assert rows_of(pg) == [(1, "a", AT, b"\x00\xff"), (2, None, AT, b"")]
    with pg.connect() as conn:
        copy_rows(conn, ITEMS, [(3, "c", AT, b"c")])
        conn.rollback()
    assert [r[0] for r in rows_of(pg)] == [1, 2]


def test_before_and_after_run_on_the_copys_own_cursor(pg: Engine) -> None:
    stage = ITEMS.into("items_stage")

    def fill(write_row: WriteRow) -> None:
        for i in range(3):
            write_row((i, f"n{i}", AT, bytes([i])))

    with pg.connect() as conn:
        copy_with(
            conn,
            stage,
            fill,
            before=["CREATE TEMPORARY TABLE items_stage (LIKE items) ON COMMIT DROP"],
            after=["INSERT INTO items SELECT * FROM items_stage ON CONFLICT DO NOTHING"],
        )
        conn.commit()
    assert [r[1] for r in rows_of(pg)] == ["n0", "n1", "n2"]


def test_a_duplicate_is_an_integrity_error_with_its_sqlstate(pg: Engine) -> None:
    with pg.connect() as conn:
        copy_rows(conn, ITEMS, [(1, "a", AT, b"")])
        conn.commit()
        with pytest.raises(IntegrityError) as caught:
            copy_rows(conn, ITEMS, [(1, "again", AT, b"")])
        conn.rollback()
    assert getattr(caught.value.orig, "sqlstate", None) == "23505"
    assert caught.value.statement == ITEMS.statement
    assert rows_of(pg) == [(1, "a", AT, b"")]


def test_the_server_version_is_read_without_a_query(pg: Engine) -> None:
    with pg.connect() as conn:
        reported = conn.execute(text("SHOW server_version_num")).scalar_one()
        assert server_version(conn) == int(reported)


def test_copy_needs_postgresql(sqlite_url: str) -> None:
    engine = create_engine_for(sqlite_url)
    try:
        with engine.connect() as conn, pytest.raises(ValueError, match="PostgreSQL"):
            copy_rows(conn, ITEMS, [(1, "a", AT, b"")])
    finally:
        engine.dispose()
