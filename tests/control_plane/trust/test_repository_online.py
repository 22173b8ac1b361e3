"""Snapshot, timestamp and freshness: the control plane's online duties."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from tuf.api.metadata import Metadata, Root, Snapshot, Targets, Timestamp

from control_plane.errors import InvalidInputError, RollbackError
from control_plane.trust import repository as repo
from tests.control_plane.trust.helpers import MONTH, NOW, Fleet

DAY = timedelta(days=1)


@pytest.fixture
def fleet() -> Fleet:
    return Fleet.create()


def test_first_snapshot_and_timestamp(fleet: Fleet) -> None:
    snapshot = repo.make_snapshot(fleet.targets, previous=None, expires=NOW + 7 * DAY)
    assert snapshot.signed.version == 1
    assert snapshot.signed.meta["targets.json"].version == 1
    assert snapshot.signed.expires == NOW + 7 * DAY
    assert snapshot.signatures == {}
    timestamp = repo.make_timestamp(1, previous=None, expires=NOW + DAY)
    assert timestamp.signed.version == 1
    assert timestamp.signed.snapshot_meta.version == 1
    assert timestamp.signatures == {}


def test_versions_advance(fleet: Fleet) -> None:
    first = repo.make_snapshot(fleet.targets, previous=None, expires=NOW + DAY)
    fleet.release_model()
    second = repo.make_snapshot(fleet.targets, previous=first, expires=NOW + DAY)
    assert second.signed.version == 2
    assert second.signed.meta["targets.json"].version == 2
    # A freshness re-sign: same targets, new snapshot version.
    third = repo.make_snapshot(fleet.targets, previous=second, expires=NOW + 2 * DAY)
    assert third.signed.version == 3
    assert third.signed.meta["targets.json"].version == 2

    ts1 = repo.make_timestamp(2, previous=None, expires=NOW + DAY)
    ts2 = repo.make_timestamp(2, previous=ts1, expires=NOW + 2 * DAY)
    ts3 = repo.make_timestamp(3, previous=ts2, expires=NOW + 2 * DAY)
    assert [t.signed.version for t in (ts1, ts2, ts3)] == [1, 2, 3]
    assert ts3.signed.snapshot_meta.version == 3


def test_snapshot_rollback_refused(fleet: Fleet) -> None:
    old_targets = fleet.targets
    fleet.release_model()
    current = repo.make_snapshot(fleet.targets, previous=None, expires=NOW + DAY)
    with pytest.raises(RollbackError):
        repo.make_snapshot(old_targets, previous=current, expires=NOW + DAY)


def test_timestamp_rollback_refused() -> None:
    current = repo.make_timestamp(5, previous=None, expires=NOW + DAY)
    with pytest.raises(RollbackError):
        repo.make_timestamp(4, previous=current, expires=NOW + DAY)


def test_needs_refresh() -> None:
    timestamp = repo.make_timestamp(1, previous=None, expires=NOW + DAY)
    margin = timedelta(hours=6)
    assert not repo.needs_refresh(timestamp, NOW, margin)
    assert not repo.needs_refresh(timestamp, NOW + DAY - margin - timedelta(seconds=1), margin)
    assert repo.needs_refresh(timestamp, NOW + DAY - margin, margin)
    assert repo.needs_refresh(timestamp, NOW + 2 * DAY, margin)
    assert repo.needs_refresh(timestamp, NOW + DAY, timedelta(0))


def test_to_bytes_is_compact_and_round_trips(fleet: Fleet) -> None:
    fleet.release_model()
    data = repo.to_bytes(fleet.targets)
    assert b"\n" not in data and b", " not in data
    assert json.loads(data)["signed"]["version"] == 2
    again = repo.parse_metadata(data, Targets)
    assert repo.to_bytes(again) == data
    fleet.root.signed.verify_delegate("targets", again.signed_bytes, again.signatures)


@pytest.mark.parametrize("kind", [Root, Snapshot, Timestamp])
def test_parse_metadata_checks_the_type(fleet: Fleet, kind: type) -> None:
    with pytest.raises(InvalidInputError, match="expected"):
        repo.parse_metadata(repo.to_bytes(fleet.targets), kind)


def test_parse_metadata_returns_the_type(fleet: Fleet) -> None:
    md: Metadata[Root] = repo.parse_metadata(repo.to_bytes(fleet.root), Root)
    assert md.signed.version == 1


def test_naive_now_is_a_programming_error(fleet: Fleet) -> None:
    with pytest.raises(ValueError, match="timezone-aware"):
        repo.needs_refresh(fleet.targets, NOW.replace(tzinfo=None), MONTH)
