"""The freshness duty: snapshot and timestamp are re-signed before they lapse."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families
from securesystemslib.signer import Key
from tuf.api.metadata import Metadata, Targets, Timestamp

from control_plane.access.service import SYSTEM
from control_plane.api.app import create_app
from control_plane.clock import ManualClock
from control_plane.errors import UnavailableError
from control_plane.services import ServiceConfig, Services, build_services
from control_plane.trust import repository as tufrepo
from control_plane.trust.keys import OperatorKeyset, init_operator_keys


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def services(tmp_path: Path, database_url: str, clock: ManualClock) -> Iterator[Services]:
    config = ServiceConfig(
        data_dir=tmp_path / "server",
        database_url=database_url,
        artifacts_url=(tmp_path / "server" / "artifacts").as_uri(),
        snapshot_ttl=timedelta(days=7),
        timestamp_ttl=timedelta(days=1),
    )
    built = build_services(config, clock=clock)
    yield built
    built.close()


def make_fleet(services: Services, clock: ManualClock, tmp_path: Path) -> OperatorKeyset:
    keyset = init_operator_keys(tmp_path / "keys", root_keys=1, root_threshold=1, passphrase=None)
    registry = services.registry
    info = registry.create_fleet(SYSTEM, "parks")
    keys = {
        role: Key.from_dict(data["keyid"], {k: v for k, v in data.items() if k != "keyid"})
        for role, data in info.online_keys.items()
    }
    root = tufrepo.build_root(
        root_keys=keyset.root_public_keys,
        root_threshold=1,
        release_keys=[keyset.release_public_key],
        snapshot_key=keys["snapshot"],
        timestamp_key=keys["timestamp"],
        expires=clock.now() + timedelta(days=365),
    )
    keyset.sign_root(root)
    targets = tufrepo.initial_targets(expires=clock.now() + timedelta(days=90))
    keyset.sign_targets(targets)
    registry.activate_fleet(SYSTEM, "parks", tufrepo.to_bytes(root), tufrepo.to_bytes(targets))
    return keyset


def timestamp(services: Services) -> Metadata[Timestamp]:
    return tufrepo.parse_metadata(
        services.registry.metadata_file("parks", "timestamp.json"), Timestamp
    )


def test_nothing_is_resigned_while_fresh(
    services: Services, clock: ManualClock, tmp_path: Path
) -> None:
    make_fleet(services, clock, tmp_path)
    clock.advance(timedelta(hours=6))
    assert services.registry.refresh_expiring() == []
    assert timestamp(services).signed.version == 1


def test_timestamp_is_resigned_at_half_its_lifetime(
    services: Services, clock: ManualClock, tmp_path: Path
) -> None:
    make_fleet(services, clock, tmp_path)
    before = timestamp(services)
    clock.advance(timedelta(hours=13))
    assert services.registry.refresh_expiring() == ["parks"]
    after = timestamp(services)
    assert after.signed.version == before.signed.version + 1
    assert after.signed.expires == clock.now() + timedelta(days=1)
    # only the timestamp was due: it points at the same snapshot
    assert after.signed.snapshot_meta.version == before.signed.snapshot_meta.version
    # and it is idempotent within the window
    assert services.registry.refresh_expiring() == []


def test_refresh_keeps_going_day_after_day(
    services: Services, clock: ManualClock, tmp_path: Path
) -> None:
    make_fleet(services, clock, tmp_path)
    for _ in range(10):
        clock.advance(timedelta(hours=13))
        services.registry.refresh_expiring()
        assert timestamp(services).signed.expires > clock.now()


def test_snapshot_gets_a_new_version_near_its_own_expiry(
    services: Services, clock: ManualClock, tmp_path: Path
) -> None:
    make_fleet(services, clock, tmp_path)
    clock.advance(timedelta(days=3, hours=13))
    services.registry.refresh_expiring()
    assert timestamp(services).signed.snapshot_meta.version == 2


def test_missing_online_keys_fail_loudly_and_are_never_replaced(
    services: Services, clock: ManualClock, tmp_path: Path, database_url: str
) -> None:
    keyset = make_fleet(services, clock, tmp_path)
    current = tufrepo.parse_metadata(
        services.registry.metadata_file("parks", "targets.json"), Targets
    )
    next_targets = tufrepo.resigned_targets(current, clock.now() + timedelta(days=90))
    keyset.sign_targets(next_targets)
    keys_dir = services.config.data_dir / "online-keys" / "parks"
    for key in keys_dir.iterdir():
        key.unlink()
    restarted = build_services(services.config, clock=clock)
    try:
        clock.advance(timedelta(hours=13))
        assert restarted.registry.refresh_expiring() == []
        assert list(keys_dir.iterdir()) == []
        with pytest.raises(UnavailableError, match="restore"):
            restarted.registry.push_targets(SYSTEM, "parks", tufrepo.to_bytes(next_targets))
        assert restarted.registry.get_fleet("parks").versions["targets"] == 1
        # reads still work and show the keys the root names
        info = restarted.registry.get_fleet("parks")
        assert set(info.online_keys) == {"snapshot", "timestamp"}
        assert list(keys_dir.iterdir()) == []
    finally:
        restarted.close()


def test_a_stalled_freshness_loop_fails_readiness_before_nodes_refuse(
    services: Services, clock: ManualClock, tmp_path: Path
) -> None:
    make_fleet(services, clock, tmp_path)
    app = TestClient(create_app(services, run_background=False))
    assert app.get("/readyz").json()["checks"]["tuf_metadata"] == "ok"
    # Nobody re-signs (the loop is stalled): 18 h into the timestamp's day, 6 h are left,
    # the margin (a quarter of 24 h). Nodes would still accept it, readiness does not.
    clock.advance(timedelta(hours=18))
    ready = app.get("/readyz")
    assert ready.status_code == 503
    reason = ready.json()["checks"]["tuf_metadata"]
    assert reason.startswith("expiring: fleet parks: timestamp v1 expires at ")
    assert reason.endswith(", within 6h")
    clock.advance(timedelta(hours=7))
    assert "timestamp v1 expired at" in app.get("/readyz").json()["checks"]["tuf_metadata"]
    # The loop runs again: ready again.
    assert services.registry.refresh_expiring() == ["parks"]
    assert app.get("/readyz").status_code == 200


def test_metrics_show_each_roles_expiry_per_fleet(
    services: Services, clock: ManualClock, tmp_path: Path
) -> None:
    make_fleet(services, clock, tmp_path)
    text = TestClient(create_app(services, run_background=False)).get("/metrics").text
    expiry = {
        (s.labels["fleet"], s.labels["role"]): s.value
        for family in text_string_to_metric_families(text)
        if family.name == "edgefleet_tuf_metadata_expires_timestamp_seconds"
        for s in family.samples
    }
    now = clock.now().timestamp()
    assert set(expiry) == {("parks", r) for r in ("root", "targets", "snapshot", "timestamp")}
    assert expiry["parks", "timestamp"] == pytest.approx(now + 24 * 3600)
    assert expiry["parks", "snapshot"] == pytest.approx(now + 7 * 24 * 3600)
    assert expiry["parks", "targets"] == pytest.approx(now + 90 * 24 * 3600)
