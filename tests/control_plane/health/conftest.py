"""The health services (processor, queries, retention, clearing) over a real database
(SQLite and PostgreSQL) and a manual clock."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from sqlalchemy import Engine
from sqlalchemy.orm import Session, sessionmaker

from control_plane.clock import ManualClock
from control_plane.health.config import HealthConfig
from control_plane.link.ingest import RecordIngest
from control_plane.services import HealthServices, build_health
from control_plane.storage import create_engine_for, migrate, session_factory
from tests.control_plane.health.support import START, Sender, add_nodes


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(START)


@pytest.fixture
def engine(database_url: str) -> Iterator[Engine]:
    engine = create_engine_for(database_url)
    migrate(engine)
    try:
        yield engine
    finally:
        engine.dispose()


@pytest.fixture
def sessions(engine: Engine) -> sessionmaker[Session]:
    factory = session_factory(engine)
    add_nodes(factory, "n-a", "n-b")
    return factory


@pytest.fixture
def config() -> HealthConfig:
    return HealthConfig(batch_size=3)


@pytest.fixture
def health(
    sessions: sessionmaker[Session], clock: ManualClock, config: HealthConfig
) -> HealthServices:
    return build_health(sessions, clock, config)


@pytest.fixture
def sender(sessions: sessionmaker[Session], clock: ManualClock) -> Iterator[Sender]:
    ingest = RecordIngest(sessions, clock)
    try:
        yield Sender(ingest)
    finally:
        ingest.close()
