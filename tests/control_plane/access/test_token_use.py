"""An API token's `last_used_at` is written without failing a request while another
connection writes (SQLite's lock upgrade: "database is locked" without any wait)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from typing import Any

import pytest
from sqlalchemy import Engine, event

from control_plane.access.roles import Role
from control_plane.access.service import (
    LAST_USED_RESOLUTION,
    SYSTEM,
    AccessService,
    record_audit,
)
from control_plane.clock import ManualClock
from control_plane.storage import create_engine_for, migrate, session_factory
from control_plane.storage.models import ApiTokenRow

START = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


@pytest.fixture
def engine(sqlite_url: str) -> Iterator[Engine]:
    engine = create_engine_for(sqlite_url)
    migrate(engine)
    try:
        yield engine
    finally:
        engine.dispose()


def test_noting_a_token_use_waits_for_another_writer_instead_of_failing(engine: Engine) -> None:
    """The request reads the token while another connection holds the write lock with
    a change not yet committed; that writer commits once the request goes to write.
    Upgrading the read's own transaction fails either way (the lock is held, or the
    read's snapshot is stale); a write of its own waits for the lock and succeeds."""
    clock = ManualClock(START)
    sessions = session_factory(engine)
    access = AccessService(sessions, clock)
    token, info = access.create_token(SYSTEM, name="ops", role=Role.OPERATOR)

    writing = threading.Event()
    main = threading.get_ident()

    def on_execute(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        if threading.get_ident() != main and statement.lstrip().upper().startswith(
            "UPDATE API_TOKENS"
        ):
            writing.set()

    other = sessions()
    other.connection(execution_options={"sqlite_begin": "IMMEDIATE"})
    record_audit(other, SYSTEM, at=START, action="test.write", target="elsewhere")
    other.flush()  # the write lock is held, the change not committed
    event.listen(engine, "before_cursor_execute", on_execute)
    try:
        with ThreadPoolExecutor(max_workers=1) as pool:
            request = pool.submit(access.authenticate, token)
            assert writing.wait(timeout=10)
            other.commit()
            principal = request.result(timeout=10)
    finally:
        event.remove(engine, "before_cursor_execute", on_execute)
        other.close()

    assert (principal.token_id, principal.role) == (info.id, Role.OPERATOR)
    with sessions() as session:
        row = session.get(ApiTokenRow, info.id)
        assert row is not None and row.last_used_at == START


def test_a_token_use_is_written_at_most_once_per_resolution(engine: Engine) -> None:
    clock = ManualClock(START)
    sessions = session_factory(engine)
    access = AccessService(sessions, clock)
    token, info = access.create_token(SYSTEM, name="ops", role=Role.VIEWER)
    writes: list[str] = []

    def on_execute(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        if statement.lstrip().upper().startswith("UPDATE API_TOKENS"):
            writes.append(statement)

    event.listen(engine, "before_cursor_execute", on_execute)
    try:
        access.authenticate(token)
        clock.advance(LAST_USED_RESOLUTION / 2)
        access.authenticate(token)
        clock.advance(LAST_USED_RESOLUTION)
        access.authenticate(token)
    finally:
        event.remove(engine, "before_cursor_execute", on_execute)
    assert len(writes) == 2
    with sessions() as session:
        row = session.get(ApiTokenRow, info.id)
        expected = START + LAST_USED_RESOLUTION / 2 + LAST_USED_RESOLUTION
        assert row is not None and row.last_used_at == expected
