"""The schema's constraints hold on both backends, whatever the services get wrong."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from control_plane.storage import (
    ApiTokenRow,
    ArtifactRow,
    AuditRow,
    FleetRow,
    ModelFloorRow,
    ModelVersionRow,
    TufMetadataRow,
)

NOW = datetime(2025, 6, 1, 12, 0, tzinfo=UTC)


def add_fleet(session: Session, name: str = "plant-a") -> FleetRow:
    fleet = FleetRow(name=name, state="active", created_at=NOW)
    session.add(fleet)
    session.flush()
    return fleet


def model_version(fleet: FleetRow, **overrides: Any) -> ModelVersionRow:
    fields: dict[str, Any] = {
        "fleet_id": fleet.id,
        "model": "detector",
        "version": "1.0.0",
        "release_counter": 1,
        "target_path": "models/detector/1.0.0/model.onnx",
        "sha256": "a" * 64,
        "length": 1234,
        "custom": {"release_counter": 1, "io": {"inputs": [{"name": "x", "shape": [1, 3]}]}},
        "targets_version": 2,
        "created_at": NOW,
        "created_by": "alice",
    }
    fields.update(overrides)
    return ModelVersionRow(**fields)


def audit_entry(action: str = "fleet.create") -> AuditRow:
    return AuditRow(
        at=NOW,
        actor="alice",
        role="admin",
        action=action,
        target="fleets/plant-a",
        request_id="req-1",
        outcome="success",
        details={"name": "plant-a"},
    )


def assert_rejected(session: Session, row: object) -> None:
    session.add(row)
    with pytest.raises(IntegrityError):
        session.flush()
    session.rollback()


def test_a_model_version_round_trips(session: Session) -> None:
    fleet = add_fleet(session)
    row = model_version(fleet, length=5 * 2**30)  # > 2**32: needs BIGINT
    session.add(row)
    session.commit()
    session.expunge_all()

    read = session.get(ModelVersionRow, row.id)

    assert read is not None
    assert read.length == 5 * 2**30
    assert read.custom == {"release_counter": 1, "io": {"inputs": [{"name": "x", "shape": [1, 3]}]}}
    assert read.created_at == NOW


def test_fleet_names_are_unique(session: Session) -> None:
    add_fleet(session, "plant-a")
    session.commit()
    assert_rejected(session, FleetRow(name="plant-a", state="pending", created_at=NOW))


def test_fleet_state_is_checked(session: Session) -> None:
    assert_rejected(session, FleetRow(name="plant-b", state="deleted", created_at=NOW))


def test_a_model_version_is_published_once_per_fleet(session: Session) -> None:
    fleet = add_fleet(session)
    session.add(model_version(fleet))
    session.commit()

    assert_rejected(
        session,
        model_version(fleet, release_counter=2, target_path="models/detector/1.0.0/b.onnx"),
    )


def test_release_counters_are_unique_per_model(session: Session) -> None:
    fleet = add_fleet(session)
    session.add(model_version(fleet))
    session.commit()

    assert_rejected(
        session,
        model_version(fleet, version="1.0.1", target_path="models/detector/1.0.1/model.onnx"),
    )
    # The same counter for another model is fine.
    session.add(
        model_version(fleet, model="classifier", target_path="models/classifier/1.0.0/model.onnx")
    )
    session.commit()


def test_target_paths_are_unique_per_fleet(session: Session) -> None:
    fleet = add_fleet(session)
    session.add(model_version(fleet))
    session.commit()

    assert_rejected(session, model_version(fleet, version="2.0.0", release_counter=2))


def test_other_fleets_may_reuse_versions_counters_and_paths(session: Session) -> None:
    first, second = add_fleet(session, "plant-a"), add_fleet(session, "plant-b")
    session.add_all([model_version(first), model_version(second)])
    session.commit()

    assert session.scalar(sa.select(sa.func.count()).select_from(ModelVersionRow)) == 2


def test_rows_must_belong_to_an_existing_fleet(session: Session) -> None:
    assert_rejected(
        session,
        ModelFloorRow(fleet_id=9999, model="detector", floor=1, targets_version=1, updated_at=NOW),
    )


def test_deleting_a_fleet_deletes_what_belongs_to_it(session: Session) -> None:
    doomed, kept = add_fleet(session, "doomed"), add_fleet(session, "kept")
    for fleet in (doomed, kept):
        session.add_all(
            [
                model_version(fleet),
                ModelFloorRow(
                    fleet_id=fleet.id,
                    model="detector",
                    floor=1,
                    targets_version=2,
                    updated_at=NOW,
                ),
                TufMetadataRow(
                    fleet_id=fleet.id,
                    role="targets",
                    version=1,
                    body=b'{"signed": {}}',
                    expires_at=NOW + timedelta(days=90),
                    created_at=NOW,
                ),
            ]
        )
    session.commit()

    session.delete(doomed)
    session.commit()
    session.expunge_all()

    for row_type in (ModelVersionRow, ModelFloorRow, TufMetadataRow):
        fleet_ids = session.scalars(sa.select(row_type.fleet_id)).all()
        assert fleet_ids == [kept.id], row_type.__name__


def test_tuf_metadata_versions_are_unique_and_the_latest_is_found(session: Session) -> None:
    fleet = add_fleet(session)
    for version in (1, 2, 3):
        session.add(
            TufMetadataRow(
                fleet_id=fleet.id,
                role="timestamp",
                version=version,
                body=f'{{"version": {version}}}'.encode(),
                expires_at=NOW + timedelta(days=1),
                created_at=NOW,
            )
        )
    session.commit()

    latest = session.scalars(
        sa.select(TufMetadataRow)
        .where(TufMetadataRow.fleet_id == fleet.id, TufMetadataRow.role == "timestamp")
        .order_by(TufMetadataRow.version.desc())
        .limit(1)
    ).one()
    assert (latest.version, latest.body) == (3, b'{"version": 3}')
    assert latest.expires_at == NOW + timedelta(days=1)

    session.expunge_all()
    assert_rejected(
        session,
        TufMetadataRow(
            fleet_id=fleet.id,
            role="timestamp",
            version=3,
            body=b"{}",
            expires_at=NOW,
            created_at=NOW,
        ),
    )


def test_token_hashes_are_unique(session: Session) -> None:
    def token(token_id: str) -> ApiTokenRow:
        return ApiTokenRow(
            id=token_id,
            name="ci",
            role="operator",
            token_hash="f" * 64,
            created_at=NOW,
            created_by="alice",
        )

    session.add(token("tok1"))
    session.commit()
    assert_rejected(session, token("tok2"))


def test_artifact_lengths_cannot_be_negative(session: Session) -> None:
    assert_rejected(
        session, ArtifactRow(sha256="b" * 64, length=-1, created_at=NOW, uploaded_by="alice")
    )


def test_audit_ids_increase(session: Session) -> None:
    first, second = audit_entry("a"), audit_entry("b")
    session.add(first)
    session.flush()
    session.add(second)
    session.commit()
    assert 0 < first.id < second.id


def test_audit_log_refuses_updates(session: Session) -> None:
    session.add(audit_entry())
    session.commit()

    with pytest.raises(IntegrityError, match="append-only"):
        session.execute(sa.update(AuditRow).values(outcome="denied"))
    session.rollback()

    entry = session.scalars(sa.select(AuditRow)).one()
    entry.actor = "mallory"
    with pytest.raises(IntegrityError, match="append-only"):
        session.commit()
    session.rollback()

    assert session.scalars(sa.select(AuditRow.actor)).one() == "alice"


def test_audit_log_refuses_deletes(session: Session, migrated_engine: sa.Engine) -> None:
    session.add(audit_entry())
    session.commit()

    with pytest.raises(IntegrityError, match="append-only"):
        session.execute(sa.delete(AuditRow))
    session.rollback()

    session.delete(session.scalars(sa.select(AuditRow)).one())
    with pytest.raises(IntegrityError, match="append-only"):
        session.commit()
    session.rollback()

    if migrated_engine.dialect.name == "postgresql":
        with pytest.raises(IntegrityError, match="append-only"):
            session.execute(sa.text("TRUNCATE audit_log"))
        session.rollback()

    assert session.scalar(sa.select(sa.func.count()).select_from(AuditRow)) == 1
