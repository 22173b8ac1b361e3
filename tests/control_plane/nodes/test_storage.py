"""The nodes and bootstrap_tokens tables hold their constraints on both backends."""

from __future__ import annotations

from datetime import timedelta

import pytest
from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from control_plane.storage.models import BootstrapTokenRow, FleetRow, NodeRow
from tests.control_plane.nodes.conftest import START


def fleet_id(session: Session, name: str) -> int:
    found = session.scalar(select(FleetRow.id).where(FleetRow.name == name))
    assert found is not None
    return found


def node(fid: int, node_id: str = "n-000000000001") -> NodeRow:
    return NodeRow(
        id=node_id,
        fleet_id=fid,
        labels={"site": "a"},
        public_key_sha256="a" * 64,
        created_at=START,
    )


def token(fid: int, token_id: str = "t1", token_hash: str = "f" * 64) -> BootstrapTokenRow:
    return BootstrapTokenRow(
        id=token_id,
        fleet_id=fid,
        token_hash=token_hash,
        labels={},
        created_at=START,
        created_by="alice",
        expires_at=START + timedelta(hours=1),
    )


def test_a_node_row_round_trips_with_defaults(
    sessions: sessionmaker[Session], fleets: list[str]
) -> None:
    with sessions() as session:
        session.add(node(fleet_id(session, "gates")))
        session.commit()
    with sessions() as session:
        row = session.get(NodeRow, "n-000000000001")
        assert row is not None
        assert (row.online, row.reported_state, row.labels) == (False, {}, {"site": "a"})
        assert row.created_at == START
        assert row.cert_serial is None and row.revoked_at is None


def test_token_hashes_are_unique(sessions: sessionmaker[Session], fleets: list[str]) -> None:
    with sessions() as session:
        fid = fleet_id(session, "gates")
        session.add(token(fid))
        session.commit()
        session.add(token(fid, "t2"))
        with pytest.raises(IntegrityError):
            session.commit()


def test_nodes_and_tokens_belong_to_an_existing_fleet(
    sessions: sessionmaker[Session], fleets: list[str]
) -> None:
    with sessions() as session:
        session.add(node(9999))
        with pytest.raises(IntegrityError):
            session.commit()
        session.rollback()
        session.add(token(9999))
        with pytest.raises(IntegrityError):
            session.commit()


def test_deleting_a_fleet_deletes_its_nodes_and_tokens(
    sessions: sessionmaker[Session], fleets: list[str]
) -> None:
    with sessions() as session:
        gates, yards = fleet_id(session, "gates"), fleet_id(session, "yards")
        session.add_all([node(gates, "n-000000000001"), node(yards, "n-000000000002")])
        session.flush()
        used = token(gates, "t1", "1" * 64)
        used.node_id = "n-000000000001"
        session.add_all([used, token(yards, "t2", "2" * 64)])
        session.commit()
        doomed = session.get(FleetRow, gates)
        session.delete(doomed)
        session.commit()
    with sessions() as session:
        assert session.scalars(select(NodeRow.id)).all() == ["n-000000000002"]
        assert session.scalars(select(BootstrapTokenRow.id)).all() == ["t2"]
