"""The update task when things go wrong (issue 12 §4): statuses that say why with the
numbers, retries on the task's own timer with backoff (not at every re-delivery, not only
at the next reconnect), and a full disk that never stops the task nor costs the model.

The full disk is simulated (`FullDisk`): the journal's atomic write fails with ENOSPC and
the model store sees no free space, through the two functions they write and measure
with; no root, no tmpfs. Time is the task's `ManualClock` (see test_update_task.py).
"""

from __future__ import annotations

import errno
import os
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import pytest

from edge_node.clock import ManualClock
from edge_node.fsutil import atomic_write
from edge_node.link.base import Backoff
from edge_node.testing.memory_link import MemoryNodeLink
from edge_node.testing.update_world import UpdateWorld as World
from edge_node.updater import journal as journal_module
from edge_node.updater import store as store_module
from edge_node.updater.store import DiskUsage
from edge_node.updater.watchdog import WatchdogConfig
from tests.edge_node.agent.test_update_task import (
    WATCH,
    Node,
    Runtime,
    applied,
    desired,
    journal,
    phases,
    ref,
    running,
    statuses,
    until,
)
from tests.edge_node.updater._world import make_world

pytestmark = pytest.mark.anyio

RETRY = Backoff(initial_s=50.0, cap_s=200.0)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def world(tmp_path: Path) -> World:
    w = make_world(tmp_path)
    w.write_trust_anchors()
    return w


@dataclass
class FullDisk:
    """The node's data dir filesystem: `full` fails every journal write with ENOSPC and
    leaves the model store no free byte."""

    full: bool = False
    refused_writes: int = 0

    def write(self, path: Path, data: bytes, *, mode: int = 0o644) -> None:
        if self.full:
            self.refused_writes += 1
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
        atomic_write(path, data, mode=mode)

    def usage(self, path: Path) -> DiskUsage:
        return DiskUsage(10**13, 0, 0 if self.full else 10**12)


@pytest.fixture
def disk(monkeypatch: pytest.MonkeyPatch) -> Iterator[FullDisk]:
    fake = FullDisk()
    monkeypatch.setattr(journal_module, "atomic_write", fake.write)
    monkeypatch.setattr(store_module, "_disk_usage", fake.usage)
    yield fake


def make_updater(
    w: World,
    runtime: Runtime,
    *,
    watchdog: WatchdogConfig = WATCH,
    link: MemoryNodeLink | None = None,
    **settings: object,
) -> Node:
    link = link or MemoryNodeLink(w.peer)
    clock = ManualClock(w.now)
    updater = w.update_task(runtime, clock=clock, link=link, watchdog=watchdog, **settings)
    return Node(updater, link, clock)


class CountingLink(MemoryNodeLink):
    def __init__(self, w: World) -> None:
        super().__init__(w.peer)
        self.fetched = 0

    async def fetch_artifact(
        self, target_path: str, sha256: str, offset: int = 0
    ) -> AsyncIterator[bytes]:
        self.fetched += 1
        async for chunk in super().fetch_artifact(target_path, sha256, offset):
            yield chunk


# ------------------------------------------------------------------- statuses


async def test_a_failed_self_test_reaches_the_control_plane_with_its_reason_and_numbers(
    world: World,
) -> None:
    node = make_updater(world, Runtime(), watchdog=WatchdogConfig(window_s=0))
    first = world.releases["1.0.0"]
    bad = world.release("2.0.0", add=3.0, counter=3, reference_add=4.0)
    async with running(node):
        await applied(world, node.updater, first)
        await node.updater.on_control(desired(world.assign(bad)))
        await until(lambda: phases(world)[-1:] == ["reverted"])
    failed, reverted = statuses(world)[-2:]
    assert (failed.phase, failed.reason) == ("failed", "self-test: output-mismatch")
    assert failed.detail.startswith("self-test: output-mismatch: ")
    assert "out of tolerance" in failed.detail
    assert float(failed.facts["max_abs_err"]) == pytest.approx(1.0)
    assert (reverted.reason, dict(reverted.facts)) == (failed.reason, dict(failed.facts))
    assert reverted.detail.endswith(f"serving {first.path}")


# -------------------------------------------------------------------- retries


async def test_a_trial_cut_by_the_link_is_retried_on_the_timer_without_a_redelivery(
    world: World,
) -> None:
    node = make_updater(world, Runtime(), watchdog=WatchdogConfig(window_s=0), retry=RETRY)
    updater = node.updater
    rel = world.releases["1.0.0"]
    world.peer.artifacts[rel.sha256] = rel.data[:10]
    async with running(node):
        await updater.on_control(desired(world.assign(rel)))
        # (the download's own attempts back off on the task's clock too)
        await until(lambda: phases(world)[-1:] == ["reverted"], clock=node.clock, step_s=1)
        assert updater.retry_pending
        world.peer.artifacts[rel.sha256] = rel.data
        await until(lambda: journal(world).active == ref(rel), clock=node.clock, step_s=50)
    assert updater.applied == 2  # the first try and the timer's retry: nothing re-delivered


async def test_redeliveries_before_the_backoff_do_not_retry(world: World) -> None:
    """A reconnect answers the Hello with the assignment, and an MQTT node gets the
    retained doorbell too: neither makes a failed trial run again before its backoff."""
    link = CountingLink(world)
    node = make_updater(
        world, Runtime(), watchdog=WatchdogConfig(window_s=0), retry=RETRY, link=link
    )
    updater = node.updater
    rel = world.releases["1.0.0"]
    world.peer.artifacts[rel.sha256] = rel.data[:10]
    signed = world.assign(rel)
    async with running(node):
        await updater.on_control(desired(signed))
        await until(lambda: phases(world)[-1:] == ["reverted"], clock=node.clock, step_s=1)
        fetched, sent = link.fetched, len(statuses(world))
        for _ in range(3):  # the Hello's answer, the doorbell, the Hello's answer again
            await updater.on_control(desired(signed))
            await until(lambda: updater.retry_pending)
        assert (link.fetched, len(statuses(world))) == (fetched, sent)
        world.peer.artifacts[rel.sha256] = rel.data
        await until(lambda: journal(world).active == ref(rel), clock=node.clock, step_s=50)
    assert phases(world)[sent:].count("downloading") == 1  # one retry, after the backoff


async def test_a_model_that_fails_on_its_merits_is_not_retried_by_the_timer(
    world: World,
) -> None:
    node = make_updater(world, Runtime(), watchdog=WatchdogConfig(window_s=0), retry=RETRY)
    updater = node.updater
    bad = world.release("2.0.0", add=3.0, counter=3, reference_add=4.0)
    async with running(node):
        await updater.on_control(desired(world.assign(bad)))
        await until(lambda: phases(world)[-1:] == ["reverted"])
        assert not updater.retry_pending
        node.clock.advance(timedelta(hours=1))
        await updater.on_control(desired(world.assign(bad, sequence=world.sequence)))
        await until(lambda: updater.applied == 2)
    assert phases(world).count("downloading") == 1


async def test_a_renewal_keeps_the_timers_retry_and_never_adds_one(world: World) -> None:
    node = make_updater(world, Runtime(), watchdog=WatchdogConfig(window_s=0), retry=RETRY)
    updater = node.updater
    rel = world.releases["1.0.0"]
    bad = world.release("2.0.0", add=3.0, counter=3, reference_add=4.0)
    world.peer.artifacts[rel.sha256] = rel.data[:10]
    async with running(node):
        await updater.on_control(desired(world.assign(rel)))
        await until(lambda: phases(world)[-1:] == ["reverted"], clock=node.clock, step_s=1)
        # Renewed while its retry waits: the retry is still due on the timer.
        await updater.on_control(desired(world.assign(rel, renewal=True)))
        await until(lambda: updater.applied == 2 and updater.retry_pending)
        world.peer.artifacts[rel.sha256] = rel.data
        await until(lambda: journal(world).active == ref(rel), clock=node.clock, step_s=50)
        # A version that failed on its merits, renewed: never tried again.
        await updater.on_control(desired(world.assign(bad)))
        await until(lambda: phases(world)[-1:] == ["reverted"])
        tries = phases(world).count("downloading")
        await updater.on_control(desired(world.assign(bad, renewal=True)))
        await until(lambda: journal(world).director_sequence == 4)
        node.clock.advance(timedelta(hours=1))
        assert not updater.retry_pending
    assert phases(world).count("downloading") == tries
    assert journal(world).active == ref(rel)


# ------------------------------------------------------------------ full disk


async def test_a_full_disk_at_the_end_of_the_watch_window_never_stops_the_task(
    world: World, disk: FullDisk
) -> None:
    """The issue's outage: the journal write that ends the watch window failed and the
    agent exited. Now the task goes on serving, says `disk-full`, and writes the journal
    on its timer once there is room."""
    runtime = Runtime()
    node = make_updater(world, runtime, watchdog=WATCH)
    rel = world.releases["1.0.0"]
    async with running(node):
        await applied(world, node.updater, rel)
        disk.full = True
        await until(
            lambda: "watchdog window passed" in statuses(world)[-1].detail,
            clock=node.clock,
            step_s=60,
        )
        last = statuses(world)[-1]
        assert (last.phase, last.reason) == ("active", "disk-full")
        assert "journal cannot be written" in last.detail
        assert journal(world).probation is not None  # the disk still says on watch
        assert runtime.served == [node.updater.reconciler.store.path_of(rel.sha256)]
        # Still full: tried again on its timer, still held, nothing stops.
        tried = disk.refused_writes
        await until(lambda: disk.refused_writes > tried, clock=node.clock, step_s=10)
        disk.full = False
        await until(lambda: journal(world).probation is None, clock=node.clock, step_s=10)
        await until(lambda: "written again" in statuses(world)[-1].detail)
    assert statuses(world)[-1].reason == ""


async def test_a_restart_after_that_outage_serves_the_model_and_keeps_it(
    world: World, disk: FullDisk
) -> None:
    """The restarts after that outage reverted the healthy model as `restarted-on-watch`.
    Now, whether the disk is still full or was freed just before the restart, the model
    that passed its window serves on, and the journal follows once it can."""
    first, second = world.releases["1.0.0"], world.releases["1.1.0"]
    for still_full in (True, False):
        node = make_updater(world, Runtime(), watchdog=WATCH)
        async with running(node):
            await applied(world, node.updater, first if still_full else second)
            disk.full = True
            await until(
                lambda: "watchdog window passed" in statuses(world)[-1].detail,
                clock=node.clock,
                step_s=60,
            )
        # (a stop with the disk full cannot write the journal either)
        assert journal(world).probation is not None
        disk.full = still_full
        runtime = Runtime()
        again = make_updater(world, runtime, watchdog=WATCH)
        async with running(again):
            active = first if still_full else second
            assert runtime.served == [again.updater.reconciler.store.path_of(active.sha256)]
            assert "reverted" not in phases(world)[-3:]
            disk.full = False
            await until(lambda: journal(world).probation is None, clock=again.clock, step_s=10)
        final = journal(world)
        assert (final.active, final.failed, final.probation) == (ref(active), None, None)
        assert final.previous == (None if still_full else ref(first))


async def test_an_assignment_refused_for_lack_of_space_is_applied_once_there_is_room(
    world: World, disk: FullDisk
) -> None:
    node = make_updater(world, Runtime(), watchdog=WatchdogConfig(window_s=0), retry=RETRY)
    updater = node.updater
    rel = world.releases["1.0.0"]
    disk.full = True
    async with running(node):
        await updater.on_control(desired(world.assign(rel)))
        await until(lambda: statuses(world)[-1:] and statuses(world)[-1].reason == "disk-full")
        assert updater.retry_pending and journal(world).active is None
        disk.full = False  # room again: no reconnect, no new pin
        await until(lambda: journal(world).active == ref(rel), clock=node.clock, step_s=50)
    assert phases(world)[-1] == "active"
