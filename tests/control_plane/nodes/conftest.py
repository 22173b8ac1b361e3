"""The node role services over real databases (SQLite, PostgreSQL), a real CA, a manual clock."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from sqlalchemy import Engine
from sqlalchemy.orm import Session, sessionmaker

from control_plane.access.roles import Principal, Role
from control_plane.access.service import RequestContext
from control_plane.clock import ManualClock
from control_plane.identity.ca import CertificateAuthority
from control_plane.nodes.wiring import NodeServices, build_node_services
from control_plane.storage import FleetRow, create_engine_for, migrate, session_factory

START = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
OPERATOR = RequestContext(Principal(token_id="op", name="alice", role=Role.OPERATOR), "req-op")
VIEWER = RequestContext(Principal(token_id="viewer", name="victor", role=Role.VIEWER), "req-v")


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
    return session_factory(engine)


@pytest.fixture
def fleets(sessions: sessionmaker[Session]) -> list[str]:
    with sessions() as session:
        for name in ("gates", "yards"):
            session.add(FleetRow(name=name, state="active", created_at=START))
        session.commit()
    return ["gates", "yards"]


@pytest.fixture
def ca(tmp_path: Path) -> CertificateAuthority:
    return CertificateAuthority.load_or_create(tmp_path / "ca", now=START)


@pytest.fixture
def nodes(
    sessions: sessionmaker[Session],
    ca: CertificateAuthority,
    clock: ManualClock,
    fleets: list[str],
) -> NodeServices:
    return build_node_services(sessions, ca, clock)
