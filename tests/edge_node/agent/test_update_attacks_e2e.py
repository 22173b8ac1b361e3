"""Attacks on model updates end to end: a real control plane on loopback (REST + gRPC,
SQLite), a fleet pushed and signed as an operator does, and a node agent under camera
load that must refuse what it cannot trust or cannot hold, keep serving its model, say
why on the control plane — and converge once the cause is gone.

Covered here: assignments signed by a key that is not the director's; a stale (older)
assignment re-delivered after a newer one; a disk too full for the download; an expired
TUF timestamp (the freshness loop frozen), then thawed; targets metadata signed by a key
the fleet root does not trust, served by a control plane that lost its own check. The
cases the node refuses with lower-level tests only are in `tests/edge_node/updater/`.

Each case says in a comment which check of the node it exercises and how the test would
fail without it.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import anyio
import pytest

from control_plane.cli.client import ApiError
from control_plane.registry import sample_models
from control_plane.trust import repository
from control_plane.trust.keys import generate_signer
from edge_node.updater import store as store_module
from edge_node.updater.config import UpdaterConfig
from edge_node.updater.store import DiskUsage, ModelStore
from tests.control_plane.link.desired_support import FLEET
from tests.edge_node.agent.test_updates_e2e import (
    journal,
    node_of,
    running_agent,
    service_config,
    serving,
    settled,
    store_path,
)
from tests.edge_node.agent.update_support import (
    MODEL,
    QUICK_WATCH,
    FleetPlane,
    fleet_plane,
    freshness_duty,
    target_path,
    until,
)

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

MARGIN = 1 << 20
TIMESTAMP_TTL = timedelta(seconds=6)
"""Short enough to expire within a test; the freshness duty re-signs it at half-life."""


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


class Disk:
    """The free space the node's model store sees: the real figure, or `free` bytes."""

    def __init__(self) -> None:
        self.free: int | None = None
        self._real = store_module._disk_usage

    def usage(self, path: Path) -> DiskUsage:
        real = self._real(path)
        if self.free is None:
            return real
        return DiskUsage(real.total, real.total - self.free, self.free)


@pytest.fixture
def disk(monkeypatch: pytest.MonkeyPatch) -> Iterator[Disk]:
    """The agent builds its `ModelStore` without a `disk_usage` seam, so the store's
    default is replaced for this test (stores built before the patch are unaffected)."""
    fake = Disk()
    monkeypatch.setattr(store_module, "_disk_usage", fake.usage)
    yield fake


def statuses_since(fp: FleetPlane, node_id: str, seen: int) -> list[dict[str, Any]]:
    return fp.statuses.of(node_id)[seen:]


async def refusal(
    fp: FleetPlane,
    node_id: str,
    reason: str,
    deliver: Callable[[], object],
    *,
    again_every_s: float | None = None,
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Run `deliver`, wait for the node's "failed: `reason`" status; return it and every
    status the node sent since `deliver`. With `again_every_s`, deliver again that often
    while waiting: right after a (re)connect the control plane's answer to the node's
    Hello may replace a delivery still waiting in the node's one-slot mailbox."""
    seen = len(fp.statuses.of(node_id))

    async def send() -> None:
        delivered = deliver()
        if inspect.isawaitable(delivered):
            await delivered

    await send()

    def failed() -> dict[str, Any] | None:
        for status in statuses_since(fp, node_id, seen):
            if status["phase"] == "failed" and str(status["detail"]).startswith(reason):
                return status
        return None

    if again_every_s is not None:
        with anyio.fail_after(20):
            while failed() is None:
                with anyio.move_on_after(again_every_s):
                    await until(lambda: failed() is not None, timeout=again_every_s + 1)
                if failed() is None:
                    await send()
    await until(lambda: failed() is not None)
    status = failed()
    assert status is not None
    return status, statuses_since(fp, node_id, seen)


def store_intact(data_dir: Path, *versions_sha256: str) -> None:
    """Exactly these models are in the node's store, hashing right; nothing staged."""
    store = ModelStore(data_dir / "models")
    assert store.installed() == set(versions_sha256)
    assert all(store.verify(sha) for sha in versions_sha256)
    assert list(store.staging_dir.iterdir()) == []


# ------------------------------------------------------------------------- cases


async def test_forged_stale_and_oversized_assignments_are_refused(
    tmp_path: Path, sqlite_url: str, disk: Disk
) -> None:
    data_dir = tmp_path / "node"
    async with fleet_plane(service_config(tmp_path, sqlite_url), tmp_path / "ops") as fp:
        model = sample_models.tiny_detector(tmp_path / "det-2.onnx", seed=2)
        await fp.push(model, "2.0.0")
        updater = UpdaterConfig(
            watchdog=QUICK_WATCH, selftest_latency_budget_s=5.0, space_margin_bytes=MARGIN
        )
        async with running_agent(fp, data_dir, updater=updater) as agent:
            node_id = node_of(agent)
            await fp.pin(node_id, "1.0.0")
            await settled(fp, agent, "1.0.0")
            first = fp.services.director.current(node_id)
            assert first is not None and journal(data_dir).director_sequence == 1
            on_first = store_path(data_dir, fp.sha256["1.0.0"])

            # Signed by a key the node never got (a stolen database, a rogue replica):
            # right node, next sequence, a real target. Without the signature check the
            # node would download and serve 1.1.0.
            rogue = generate_signer()
            forged = fp.signed_for(rogue, node_id, "1.1.0", sequence=2)
            status, since = await refusal(
                fp, node_id, "unknown-key", lambda: fp.deliver(node_id, forged)
            )
            # Nothing unverified is repeated upstream; nothing was fetched for it.
            assert (status["target_path"], status["director_sequence"]) == ("", 0)
            assert [s for s in since if s["target_path"] == target_path("1.1.0")] == []

            # The same forgery claiming the director's key id: the signature itself is
            # checked, not only the id it names.
            forged.keyid = first.keyid
            _, since = await refusal(
                fp, node_id, "bad-signature", lambda: fp.deliver(node_id, forged)
            )
            assert [s for s in since if s["target_path"] == target_path("1.1.0")] == []
            assert serving(agent) == on_first
            assert journal(data_dir).director_sequence == 1  # a forgery burns no sequence

            # A newer pin, then the older assignment again (a replay by whoever recorded
            # the traffic, a stale retained message): genuine signature, still valid, and
            # its model still in the store as `previous` — without the sequence check the
            # node would roll back to 1.0.0.
            await fp.pin(node_id, "1.1.0")
            await settled(fp, agent, "1.1.0")
            on_second = store_path(data_dir, fp.sha256["1.1.0"])
            _, since = await refusal(fp, node_id, "stale", lambda: fp.deliver(node_id, first))
            assert [s["phase"] for s in since] == ["failed"]
            assert serving(agent) == on_second
            state = journal(data_dir)
            assert state.director_sequence == 2
            assert state.active is not None and state.active.path == target_path("1.1.0")

            # A disk one byte short of model + reference pair + margin: refused before the
            # sequence is accepted and before any byte is written, the models in use kept.
            # Without the up-front check, which counts both files, each download's own
            # check (one file at a time) passes here and the node installs 2.0.0 on a disk
            # that cannot hold it; on a fuller disk that check refuses later — after
            # "downloading", with the sequence burnt, so the same assignment would never
            # be applied once space is free. All three are asserted below.
            info = fp.services.registry.get_version(FLEET, MODEL, "2.0.0")
            needed = info.length + int(info.custom["reference"]["length"])
            disk.free = needed + MARGIN - 1
            status, since = await refusal(
                fp, node_id, "disk-full", lambda: fp.pin(node_id, "2.0.0")
            )
            assert status["target_path"] == target_path("2.0.0")
            assert status["director_sequence"] == 3
            assert [s["phase"] for s in since] == ["failed"], since
            assert f"{needed} bytes needed, {needed + MARGIN - 1} free" in status["detail"]
            assert serving(agent) == on_second
            assert journal(data_dir).director_sequence == 2
            store_intact(data_dir, fp.sha256["1.0.0"], fp.sha256["1.1.0"])

            # Space freed; the same assignment (what the node is sent at its next Hello)
            # now goes through.
            disk.free = None
            third = fp.services.director.current(node_id)
            assert third is not None
            fp.deliver(node_id, third)
            await settled(fp, agent, "2.0.0")
            assert journal(data_dir).director_sequence == 3

        # After a restart the accepted sequence still holds: it lives in the journal.
        async with running_agent(fp, data_dir, bootstrap_token=None, updater=updater) as agent:
            assert serving(agent) == store_path(data_dir, fp.sha256["2.0.0"])
            # Delivered (again) until refused: just after the restart the link may not be
            # registered yet, and the answer to its Hello may replace a waiting delivery.
            await refusal(
                fp,
                node_id,
                "stale",
                lambda: fp.services.delivery.deliver(node_id, FLEET, first),
                again_every_s=1.0,
            )
            assert serving(agent) == store_path(data_dir, fp.sha256["2.0.0"])

        state = journal(data_dir)
        assert state.active is not None and state.active.path == target_path("2.0.0")
        assert state.previous is not None and state.previous.path == target_path("1.1.0")
        assert (state.director_sequence, state.trial) == (3, None)
        store_intact(data_dir, fp.sha256["1.1.0"], fp.sha256["2.0.0"])


async def test_expired_timestamp_and_untrusted_targets_are_refused(
    tmp_path: Path, sqlite_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    data_dir = tmp_path / "node"
    config = dataclasses.replace(service_config(tmp_path, sqlite_url), timestamp_ttl=TIMESTAMP_TTL)
    async with (
        fleet_plane(config, tmp_path / "ops") as fp,
        freshness_duty(fp) as duty,
        running_agent(fp, data_dir) as agent,
    ):
        node_id = node_of(agent)
        await fp.pin(node_id, "1.0.0")
        await settled(fp, agent, "1.0.0")
        on_first = store_path(data_dir, fp.sha256["1.0.0"])

        # The freshness loop stops (a stuck control plane, an attacker holding back
        # new metadata to keep the node on what it has): timestamp.json lapses. A pin
        # made meanwhile is refused — without ngclient's expiry check the node would
        # take 1.1.0 on metadata nobody vouches for any more.
        await duty.freeze()
        expires = fp.timestamp_expires()
        await anyio.sleep(max(0.0, (expires - datetime.now(UTC)).total_seconds()) + 0.2)
        assert fp.timestamp_expires() == expires  # nothing re-signed it meanwhile
        status, since = await refusal(
            fp, node_id, "metadata-expired", lambda: fp.pin(node_id, "1.1.0")
        )
        assert "timestamp.json is expired" in status["detail"]
        assert [s["phase"] for s in since] == ["failed"]
        assert serving(agent) == on_first
        assert journal(data_dir).director_sequence == 1

        # Thawed: a fresh timestamp, and the same assignment (what the node is sent at
        # its next Hello) goes through — it was refused before its sequence was taken.
        duty.frozen = False
        await until(lambda: fp.timestamp_expires() > datetime.now(UTC) + TIMESTAMP_TTL / 4)
        second = fp.services.director.current(node_id)
        assert second is not None
        fp.deliver(node_id, second)
        await settled(fp, agent, "1.1.0")
        assert journal(data_dir).director_sequence == 2

        # A release signed by a key the fleet root does not name. The control plane
        # refuses the push; one that lost that check (patched out here: a compromised
        # or buggy server) publishes it with valid snapshot and timestamp signatures,
        # and the node's own TUF verification refuses the targets — without it the node
        # would run 2.0.0.
        rogue = generate_signer()
        model = sample_models.tiny_detector(tmp_path / "det-2.onnx", seed=2)
        with pytest.raises(ApiError) as refused_push:
            await fp.push_signed_by(rogue, model, "2.0.0")
        assert refused_push.value.status == 403
        real_check = repository._check_threshold

        def targets_unchecked(delegator: Any, role: str, md: Any, **kwargs: Any) -> None:
            if role != "targets":
                real_check(delegator, role, md, **kwargs)

        monkeypatch.setattr(repository, "_check_threshold", targets_unchecked)
        await fp.push_signed_by(rogue, model, "2.0.0")
        monkeypatch.undo()
        status, since = await refusal(
            fp, node_id, "metadata-untrusted", lambda: fp.pin(node_id, "2.0.0")
        )
        assert "targets was signed by 0/1 keys" in status["detail"], status
        assert [s["phase"] for s in since] == ["failed"]
        assert serving(agent) == store_path(data_dir, fp.sha256["1.1.0"])
        state = journal(data_dir)
        assert state.director_sequence == 2
        assert state.active is not None and state.active.path == target_path("1.1.0")
        assert duty.resigned > 0
