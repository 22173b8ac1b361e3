"""The agent's update task over an in-memory link and fleet (`edge_node.testing.update_world`):
serial applies, status messages (and their resend on reconnect), serving the journal's
model at start, and the watchdog that reverts a failing model without the control plane.

Time is a `ManualClock`: a test moves it where a watch window, a watchdog poll or a
retry's backoff must pass (`until(..., clock=...)`), and nothing sleeps for it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import anyio
import pytest

from edge_node.agent.update_task import JOURNAL_PATH, PULL_DESIRED, UpdateTask
from edge_node.clock import ManualClock
from edge_node.link.base import Backoff, LinkUnavailableError
from edge_node.testing.memory_link import MemoryNodeLink
from edge_node.testing.update_world import FakeModelHost, Release
from edge_node.testing.update_world import UpdateWorld as World
from edge_node.updater.journal import Journal, JournalState, ModelRef
from edge_node.updater.watchdog import WatchdogConfig
from protos.edgefleet.fleet.v1 import link_pb2
from protos.edgefleet.fleet.v1.director_pb2 import SignedDirectorAssignment
from tests.edge_node.updater._world import make_world
from tests.edge_node.updater.test_revocation import refresh_cache

pytestmark = pytest.mark.anyio

# Windows, polls and backoffs of minutes: they pass only on the task's manual clock.
WATCH = WatchdogConfig(window_s=600, max_errors=3, max_error_ratio=0.5, min_frames=4, poll_s=2.0)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def world(tmp_path: Path) -> World:
    w = make_world(tmp_path)
    w.write_trust_anchors()
    return w


# The agent's side: what is served, and the served model's run counters.
Runtime = FakeModelHost


def desired(signed: SignedDirectorAssignment) -> link_pb2.ControlMessage:
    return link_pb2.ControlMessage(
        protocol_version=1, desired=link_pb2.DesiredState(assignment=signed)
    )


def statuses(w: World) -> list[link_pb2.UpdateStatus]:
    """The update statuses the node sent, less each one it sent again right after a
    Hello (a change of what it runs is announced by a Hello, which resets the status
    upstream, so the last status follows it again): each step is listed once."""
    sent: list[link_pb2.UpdateStatus] = []
    after_hello = False
    for message in w.peer.sent:
        kind = message.WhichOneof("body")
        if kind == "update_status":
            status = message.update_status
            if not (after_hello and sent and status == sent[-1]):
                sent.append(status)
        after_hello = kind == "hello"
    return sent


def phases(w: World) -> list[str]:
    return [s.phase for s in statuses(w)]


def journal(w: World) -> JournalState:
    return Journal(w.tmp / "node" / JOURNAL_PATH).load()


def ref(rel: Release) -> ModelRef:
    return ModelRef(rel.path, rel.sha256)


async def until(
    condition: Callable[[], object],
    timeout: float = 10.0,
    *,
    clock: ManualClock | None = None,
    step_s: float = 0.0,
) -> None:
    """Poll `condition` (the update steps run in worker threads), bounded; with `clock`,
    move it by `step_s` before a poll that finds the task asleep on it: the time the
    condition needs passes, and none passes while a step runs (however slow the machine,
    a step is never pushed past a watch window or a backoff)."""
    with anyio.fail_after(timeout):
        while not condition():
            if clock is not None and clock.sleepers > 0:
                clock.advance(timedelta(seconds=step_s))
            await anyio.sleep(0.01)


@dataclass
class Node:
    updater: UpdateTask
    link: MemoryNodeLink
    clock: ManualClock


def make_updater(
    w: World,
    runtime: Runtime,
    *,
    watchdog: WatchdogConfig = WATCH,
    **settings: object,
) -> Node:
    link = MemoryNodeLink(w.peer)
    clock = ManualClock(w.now)
    updater = w.update_task(
        runtime,
        clock=clock,
        link=link,
        watchdog=watchdog,
        **settings,
    )
    return Node(updater, link, clock)


@asynccontextmanager
async def running(node: Node) -> AsyncIterator[anyio.Event]:
    """The updater started (its link connected) and run until the block ends."""
    updater = node.updater
    await node.link.connect(link_pb2.Hello())
    stop = anyio.Event()
    async with anyio.create_task_group() as group:
        await updater.start()
        group.start_soon(updater.run, stop)
        try:
            yield stop
        finally:
            stop.set()


async def applied(w: World, updater: UpdateTask, rel: Release) -> None:
    await updater.on_control(desired(w.assign(rel)))
    await until(lambda: journal(w).active == ref(rel))


# ------------------------------------------------------------------------ cases


async def test_every_phase_is_an_update_status_with_target_and_sequence(world: World) -> None:
    runtime = Runtime()
    node = make_updater(world, runtime, watchdog=WatchdogConfig(window_s=0))
    updater = node.updater
    rel = world.releases["1.0.0"]
    async with running(node):
        await applied(world, updater, rel)
        await until(lambda: phases(world)[-1:] == ["active"])
    sent = statuses(world)
    assert [s.phase for s in sent] == ["downloading", "verifying", "self-testing", "active"]
    assert {(s.target_path, s.director_sequence) for s in sent} == {(rel.path, 1)}
    assert all(s.HasField("at") for s in sent)
    assert runtime.served == [updater.reconciler.store.path_of(rel.sha256)]
    assert journal(world).probation is None  # no watchdog window configured
    running_now = updater.running()
    assert (running_now.active_target, running_now.director_sequence) == (rel.path, 1)


async def test_the_last_status_is_sent_again_after_a_reconnect(world: World) -> None:
    runtime = Runtime()
    node = make_updater(world, runtime, watchdog=WatchdogConfig(window_s=0))
    updater = node.updater
    async with running(node):
        world.peer.up = False  # the link drops: statuses cannot go out now
        await updater.on_control(desired(world.assign(world.releases["1.0.0"])))
        await until(lambda: journal(world).active is not None)
        assert statuses(world) == []
        world.peer.up = True
        await node.link.connect(link_pb2.Hello())
        await updater.on_connect()
        await updater.on_connect()  # every reconnect: a Hello resets it upstream
    assert phases(world) == ["active", "active"]


async def test_a_pull_desired_doorbell_is_answered_with_a_hello(world: World) -> None:
    """The MQTT doorbell may say only "look": the node says Hello (the control plane
    answers it with the current assignment) and repeats its last status."""
    runtime = Runtime()
    node = make_updater(
        world,
        runtime,
        watchdog=WatchdogConfig(window_s=0),
        agent_version="9.9.9",
    )
    updater = node.updater
    pull = link_pb2.ControlMessage(protocol_version=1, command=link_pb2.Command(name=PULL_DESIRED))
    async with running(node):
        await applied(world, updater, world.releases["1.0.0"])
        await until(lambda: phases(world)[-1:] == ["active"])
        before = len(world.peer.sent)
        await updater.on_control(pull)
        after = [m.WhichOneof("body") for m in world.peer.sent[before:]]
        await updater.on_control(
            link_pb2.ControlMessage(protocol_version=1, command=link_pb2.Command(name="other"))
        )
    assert after == ["hello", "update_status"]
    assert world.peer.sent[before].hello.agent_version == "9.9.9"
    assert len(world.peer.sent) == before + 2  # an unknown command is ignored


async def test_assignments_are_applied_one_at_a_time_and_the_newest_wins(world: World) -> None:
    runtime = Runtime(gate=anyio.Event())
    node = make_updater(world, runtime, watchdog=WatchdogConfig(window_s=0))
    updater = node.updater
    first, second = world.releases["1.0.0"], world.releases["1.1.0"]
    third = world.release("2.0.0", add=7.0, counter=3)
    async with running(node):
        await updater.on_control(desired(world.assign(first)))
        await until(lambda: runtime.busy == 1)  # the first apply is swapping its model in
        await updater.on_control(desired(world.assign(second)))
        await updater.on_control(desired(world.assign(third)))  # replaces the waiting one
        assert runtime.gate is not None
        runtime.gate.set()
        await until(lambda: journal(world).active == ref(third))
    assert runtime.most_busy == 1
    assert updater.applied == 2  # `second` was superseded before it started
    state = journal(world)
    assert (state.previous, state.director_sequence) == (ref(first), 3)


async def test_a_restarted_updater_serves_the_journals_model_again(world: World) -> None:
    rel = world.releases["1.0.0"]
    first_run = Runtime()
    node = make_updater(world, first_run, watchdog=WatchdogConfig(window_s=0))
    updater = node.updater
    async with running(node):
        await applied(world, updater, rel)

    restarted = Runtime()
    again_node = make_updater(world, restarted, initial_model=world.tmp / "factory.onnx")
    again = again_node.updater
    state = await again.start()
    assert state.active == ref(rel)
    # The journal's model, not the configured one: an assignment replaced that.
    assert restarted.served == [again.reconciler.store.path_of(rel.sha256)]


async def test_without_an_active_model_the_configured_one_is_served(world: World) -> None:
    runtime = Runtime()
    factory = world.tmp / "factory.onnx"
    await make_updater(world, runtime, initial_model=factory).updater.start()
    assert runtime.served == [factory]


async def test_the_watchdog_reverts_a_failing_model_at_once(world: World) -> None:
    runtime = Runtime()
    node = make_updater(world, runtime)
    updater = node.updater
    first, second = world.releases["1.0.0"], world.releases["1.1.0"]
    async with running(node):
        await applied(world, updater, first)
        # Its window passes.
        await until(lambda: journal(world).probation is None, clock=node.clock, step_s=600)
        assert statuses(world)[-1].detail == "watchdog window passed"

        await applied(world, updater, second)
        assert journal(world).probation is not None
        bad = str(updater.reconciler.store.path_of(second.sha256))
        runtime.counters[bad] = (40, 3)  # 3 frames failed: the limit
        # The next poll (well inside the window) sees it.
        await until(lambda: journal(world).active == ref(first), clock=node.clock, step_s=2.0)
    store = updater.reconciler.store
    assert runtime.served[-1] == store.path_of(first.sha256)
    last = statuses(world)[-1]
    assert (last.phase, last.target_path) == ("reverted", second.path)
    assert last.detail.startswith("watchdog-errors: 3 inference errors in 40 frames")
    assert last.detail.endswith(f"serving {first.path}")
    state = journal(world)
    assert (state.failed, state.attempts, state.probation) == (ref(second), 1, None)
    assert store.installed() == {first.sha256}  # the reverted model is collected


async def test_a_stop_on_watch_pauses_it_and_the_next_start_watches_again(
    world: World,
) -> None:
    long_watch = WatchdogConfig(window_s=3600, max_errors=3, poll_s=2.0)
    rel = world.releases["1.0.0"]
    node = make_updater(world, Runtime(), watchdog=long_watch)
    updater = node.updater
    async with running(node):
        await applied(world, updater, rel)
    probation = journal(world).probation
    assert probation is not None and probation.paused

    runtime = Runtime()
    again_node = make_updater(world, runtime, watchdog=long_watch)
    again = again_node.updater
    async with running(again_node):
        assert journal(world).active == ref(rel)  # a clean stop is not the model's fault
        assert runtime.served == [again.reconciler.store.path_of(rel.sha256)]
        runtime.counters[str(runtime.served[-1])] = (5, 5)  # watched again: it trips
        await until(lambda: phases(world)[-1:] == ["failed"], clock=again_node.clock, step_s=2.0)
    # Nothing to go back to: reported, and the model keeps serving (not a dark box).
    last = statuses(world)[-1]
    assert last.detail.startswith("watchdog-errors: 5 inference errors")
    assert "no previous model" in last.detail
    state = journal(world)
    assert (state.active, state.probation) == (ref(rel), None)


async def test_a_model_that_cannot_be_served_at_start_falls_back(world: World) -> None:
    first, second = world.releases["1.0.0"], world.releases["1.1.0"]
    node = make_updater(world, Runtime(), watchdog=WatchdogConfig(window_s=0))
    updater = node.updater
    async with running(node):
        await applied(world, updater, first)
        await applied(world, updater, second)
    store = updater.reconciler.store
    runtime = Runtime(refuse={store.path_of(second.sha256)})
    again_node = make_updater(world, runtime, watchdog=WatchdogConfig(window_s=0))
    again = again_node.updater
    await again_node.link.connect(link_pb2.Hello())
    state = await again.start()
    assert state.active == ref(first)
    assert runtime.served == [store.path_of(first.sha256)]
    last = statuses(world)[-1]
    assert (last.phase, last.target_path) == ("reverted", second.path)
    assert last.detail.startswith("active-load-failed: RuntimeError: cannot load")


async def test_without_the_director_key_assignments_are_refused_clearly(world: World) -> None:
    (world.tmp / "node" / "director-key.json").unlink()
    runtime = Runtime()
    node = make_updater(world, runtime)
    updater = node.updater
    async with running(node):
        await updater.on_control(desired(world.assign(world.releases["1.0.0"])))
        await until(lambda: phases(world) == ["failed"])
    status = statuses(world)[0]
    assert status.detail.startswith("no-director-key: ")
    assert (status.target_path, status.director_sequence) == ("", 0)
    assert runtime.served == [] and journal(world) == JournalState()


async def test_a_corrupt_journal_is_kept_aside_and_the_node_starts_empty(world: World) -> None:
    path = world.tmp / "node" / JOURNAL_PATH
    path.parent.mkdir(parents=True)
    path.write_text("{torn")
    runtime = Runtime()
    node = make_updater(world, runtime, watchdog=WatchdogConfig(window_s=0))
    updater = node.updater
    async with running(node):
        state = journal(world)
        assert state.active is None and state.updated_at is not None
        await applied(world, updater, world.releases["1.0.0"])
    assert [p.name for p in path.parent.iterdir() if ".corrupt-" in p.name]
    assert statuses(world)[0].detail.startswith("journal-corrupt: ")


async def test_other_control_messages_are_left_alone(world: World) -> None:
    node = make_updater(world, Runtime())
    updater = node.updater
    await updater.on_control(link_pb2.ControlMessage(ack=link_pb2.Ack(record_ids=["x"])))
    await updater.on_control(link_pb2.ControlMessage(desired=link_pb2.DesiredState()))
    assert updater.applied == 0


async def test_a_change_of_model_is_announced_by_a_fresh_hello(world: World) -> None:
    node = make_updater(world, Runtime(), watchdog=WatchdogConfig(window_s=0))
    updater = node.updater
    rel = world.releases["1.0.0"]
    async with running(node):
        await applied(world, updater, rel)
        await until(lambda: [m.WhichOneof("body") for m in world.peer.sent][-2:-1] == ["hello"])
        # A re-delivery changes nothing: no Hello for it.
        sent = len(world.peer.sent)
        await updater.on_control(desired(world.assign(rel, sequence=1)))
        await until(lambda: updater.applied == 2)
    kinds = [m.WhichOneof("body") for m in world.peer.sent]
    assert kinds[-2:] == ["hello", "update_status"]
    assert len(world.peer.sent) == sent
    assert world.peer.sent[-1].update_status.phase == "active"  # sent again after it


async def test_a_refusal_for_missing_metadata_is_tried_again_by_itself(world: World) -> None:
    """The control plane's metadata cannot be had (here: its timestamp.json is gone):
    the node does not wait for the assignment to come again, it retries with backoff."""
    runtime = Runtime()
    node = make_updater(
        world,
        runtime,
        watchdog=WatchdogConfig(window_s=0),
        retry=Backoff(initial_s=50, cap_s=200),
    )
    updater = node.updater
    rel = world.releases["1.0.0"]
    timestamp = world.peer.metadata.pop("timestamp.json")
    async with running(node):
        await updater.on_control(desired(world.assign(rel)))
        await until(lambda: updater.retry_pending)
        await anyio.wait_all_tasks_blocked()
        assert updater.applied == 1  # its backoff has not passed on the task's clock
        # Tried again once its backoff passed, still refused.
        await until(lambda: updater.applied >= 2, clock=node.clock, step_s=200)
        assert journal(world).active is None
        assert "metadata-unavailable" in statuses(world)[-1].detail
        world.peer.metadata["timestamp.json"] = timestamp
        await until(lambda: journal(world).active == ref(rel), clock=node.clock, step_s=200)
        assert not updater.retry_pending
    assert phases(world)[-1] == "active"


async def test_a_refusal_is_not_retried_over_a_newer_assignment(world: World) -> None:
    """A newer assignment that came while a refused one was being applied wins: the
    refused one is not tried again after it (it would be refused as stale, and its
    failure would stand as the node's last status)."""
    runtime = Runtime()
    node = make_updater(world, runtime, watchdog=WatchdogConfig(window_s=0), retry=Backoff(50, 100))
    updater = node.updater
    old, new = world.releases["1.0.0"], world.releases["1.1.0"]
    fetch = node.link.fetch_metadata
    entered, release = anyio.Event(), anyio.Event()

    async def failing_fetch(filename: str) -> bytes:
        entered.set()
        with anyio.fail_after(10):
            await release.wait()
        raise LinkUnavailableError("the control plane is away (test)")

    node.link.fetch_metadata = failing_fetch  # type: ignore[method-assign]
    async with running(node):
        await updater.on_control(desired(world.assign(old)))
        await entered.wait()  # the first apply is inside its metadata refresh...
        await updater.on_control(desired(world.assign(new)))  # ...when the newer one comes
        node.link.fetch_metadata = fetch  # type: ignore[method-assign]
        release.set()  # the first is refused (metadata-unavailable); the newer one passes
        await until(lambda: journal(world).active == ref(new))
        # Past every backoff: the refused one does not come back.
        node.clock.advance(timedelta(seconds=1000))
        await anyio.wait_all_tasks_blocked()
        assert phases(world)[-1] == "active", phases(world)
        assert not updater.retry_pending
        assert updater.applied == 2


async def test_with_nothing_to_go_back_to_the_configured_model_serves(
    world: World, tmp_path: Path
) -> None:
    """The active model cannot be served at start and there is no previous one: the
    node serves runtime.model_path (when set) rather than nothing."""
    only = world.releases["1.0.0"]
    node = make_updater(world, Runtime(), watchdog=WatchdogConfig(window_s=0))
    async with running(node):
        await applied(world, node.updater, only)
    store = node.updater.reconciler.store
    configured = tmp_path / "configured.onnx"
    configured.write_bytes(b"stand-in")  # the test runtime does not read it
    runtime = Runtime(refuse={store.path_of(only.sha256)})
    again_node = make_updater(
        world, runtime, watchdog=WatchdogConfig(window_s=0), initial_model=configured
    )
    await again_node.link.connect(link_pb2.Hello())
    await again_node.updater.start()
    assert runtime.served == [configured]
    assert statuses(world)[-1].phase == "failed"


async def test_a_restart_on_a_revoked_version_serves_the_allowed_previous_and_says_so(
    world: World,
) -> None:
    """ADR 0035 through the update task: the floor in the cached metadata, offline."""
    old, new = world.releases["1.0.0"], world.releases["1.1.0"]
    node = make_updater(world, Runtime(), watchdog=WatchdogConfig(window_s=0))
    async with running(node):
        await applied(world, node.updater, new)
        await applied(world, node.updater, old)  # pinned back: previous is 1.1.0
    world.raise_floor(2)  # `model revoke det 1.0.0`, seen by a refresh before the restart
    await refresh_cache(world)
    world.peer.metadata.clear()  # offline

    restarted = Runtime()
    again = make_updater(world, restarted)
    await again.link.connect(link_pb2.Hello())
    state = await again.updater.start()

    assert state.active == ref(new)
    assert restarted.served == [again.updater.reconciler.store.path_of(new.sha256)]
    status = statuses(world)[-1]
    assert (status.phase, status.reason, status.target_path) == (
        "reverted",
        "revoked-active",
        old.path,
    )
    assert dict(status.facts) == {"floor": "2", "model": "det", "release_counter": "1"}
