"""Engines and sessions over the shared ``database_url`` fixture (SQLite and PostgreSQL)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from sqlalchemy import Engine
from sqlalchemy.orm import Session

from control_plane.storage import create_engine_for, migrate, session_factory


@pytest.fixture
def engine(database_url: str) -> Iterator[Engine]:
    """An engine on an empty database."""
    engine = create_engine_for(database_url)
    try:
        yield engine
    finally:
        engine.dispose()


@pytest.fixture
def migrated_engine(engine: Engine) -> Engine:
    migrate(engine)
    return engine


@pytest.fixture
def session(migrated_engine: Engine) -> Iterator[Session]:
    with session_factory(migrated_engine)() as session:
        yield session
