"""A DirectorService over a real database (both backends), real nodes and a registry whose
model versions are written as rows (the push path has its own tests; here only the
director's reading of them matters)."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import pytest
from securesystemslib.signer import CryptoSigner
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from control_plane.artifacts.local import LocalArtifactStore
from control_plane.clock import ManualClock
from control_plane.director.delivery import FanOutDelivery
from control_plane.director.service import DirectorService
from control_plane.nodes.wiring import NodeServices
from control_plane.registry.service import RegistryService
from control_plane.storage.models import FleetRow, ModelFloorRow, ModelVersionRow
from control_plane.trust.keys import generate_signer
from control_plane.trust.signer import FileOnlineKeyStore
from tests.control_plane.identity.helpers import make_csr
from tests.control_plane.nodes.conftest import (  # noqa: F401  (pytest fixtures)
    OPERATOR,
    START,
    ca,
    clock,
    engine,
    fleets,
    nodes,
    sessions,
)

TTL = timedelta(days=1)


@dataclass(frozen=True)
class Version:
    fleet: str
    model: str
    version: str
    release_counter: int
    target_path: str
    sha256: str
    length: int


def add_version(
    sessions: sessionmaker[Session], fleet: str, model: str, version: str, counter: int
) -> Version:
    data = f"{fleet}/{model}/{version}".encode()
    row = Version(
        fleet=fleet,
        model=model,
        version=version,
        release_counter=counter,
        target_path=f"models/{model}/{version}/model.onnx",
        sha256=hashlib.sha256(data).hexdigest(),
        length=len(data),
    )
    with sessions() as session:
        fleet_id = session.scalars(select(FleetRow.id).where(FleetRow.name == fleet)).one()
        session.add(
            ModelVersionRow(
                fleet_id=fleet_id,
                model=model,
                version=version,
                release_counter=counter,
                target_path=row.target_path,
                sha256=row.sha256,
                length=row.length,
                custom={"edgefleet": 1, "kind": "model", "release_counter": counter},
                targets_version=counter + 1,
                created_at=START,
                created_by="rita",
            )
        )
        session.commit()
    return row


def set_floor(sessions: sessionmaker[Session], fleet: str, model: str, floor: int) -> None:
    with sessions() as session:
        fleet_id = session.scalars(select(FleetRow.id).where(FleetRow.name == fleet)).one()
        session.merge(
            ModelFloorRow(
                fleet_id=fleet_id, model=model, floor=floor, targets_version=9, updated_at=START
            )
        )
        session.commit()


def enroll(nodes: NodeServices, fleet: str = "gates") -> str:
    token, _ = nodes.tokens.create_bootstrap_token(OPERATOR, fleet, {}, timedelta(hours=1))
    return nodes.enrollment.enroll(token, make_csr(), transport="grpc").node_id


@pytest.fixture
def director_signer() -> CryptoSigner:
    return generate_signer()


@pytest.fixture
def registry(
    sessions: sessionmaker[Session],
    clock: ManualClock,
    tmp_path: Path,
) -> RegistryService:
    store = LocalArtifactStore(tmp_path / "artifacts")
    return RegistryService(sessions, store, FileOnlineKeyStore(tmp_path / "online-keys"), clock)


@pytest.fixture
def director(
    sessions: sessionmaker[Session],
    registry: RegistryService,
    nodes: NodeServices,
    director_signer: CryptoSigner,
    clock: ManualClock,
) -> DirectorService:
    return DirectorService(sessions, registry, nodes.inventory, director_signer, clock, TTL)


@pytest.fixture
def with_delivery(
    sessions: sessionmaker[Session],
    registry: RegistryService,
    nodes: NodeServices,
    director_signer: CryptoSigner,
    clock: ManualClock,
) -> tuple[DirectorService, FanOutDelivery]:
    """A director whose deliveries go to a fan-out the test attaches transports to."""
    fan_out = FanOutDelivery()
    director = DirectorService(
        sessions, registry, nodes.inventory, director_signer, clock, TTL, delivery=fan_out
    )
    return director, fan_out


@pytest.fixture
def versions(sessions: sessionmaker[Session], fleets: list[str]) -> dict[str, Version]:
    return {
        "1.0.0": add_version(sessions, "gates", "det", "1.0.0", 1),
        "1.1.0": add_version(sessions, "gates", "det", "1.1.0", 2),
        "yards": add_version(sessions, "yards", "cls", "2.0.0", 1),
    }
