"""The agent's aggregation task with a real outbox in a temp dir and a manual clock: events
land in the outbox once (a replay after a restart too), shutdown drains, the hand-off's
overflow is counted, an outbox that refuses events holds them, a bad rules file is
reported and never raised."""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import anyio
import pytest

from edge_node.agent.aggregation_task import AggregationTask, AggregationTaskConfig
from edge_node.aggregation.model import Box as AggBox
from edge_node.aggregation.model import Detection as AggDetection
from edge_node.aggregation.model import Observation, Provenance
from edge_node.aggregation.wire import decode_event
from edge_node.clock import ManualClock
from edge_node.errors import InvalidInputError, OutboxFullError
from edge_node.outbox import BatchAppend, Kind, Outbox
from protos.bundle.results import Box, Decoded, Detection, InferenceResult
from protos.health_schema import SCHEMA, check_report

T0 = datetime(2026, 12, 1, 9, 0, tzinfo=UTC)
FPS = 10

RULES = """\
version: 1
cameras: [gate]
rules:
  - id: yard
    type: zone_intrusion
    camera: gate
    zone: [[0.5, 0], [1, 0], [1, 1], [0.5, 1]]
    classes: [person]
"""


def frame(n: int, x: float, *, stream: str = "gate", start: datetime = T0) -> InferenceResult:
    """Frame `n` of a person whose feet (bottom-centre) are at (x, 0.8)."""
    box = Box(max(0.0, x - 0.1), 0.4, min(1.0, x + 0.1), 0.8)
    return InferenceResult(
        stream=stream,
        frame_id=n,
        captured_at=start + timedelta(seconds=n / FPS),
        model="detector",
        version="2.0.1",
        decoded=Decoded("detection", (Detection(0, "person", 0.9, box),)),
        queue_s=0.001,
        preprocess_s=0.002,
        inference_s=0.01,
        decode_s=0.001,
    )


def walk_in(start: datetime = T0) -> list[InferenceResult]:
    """Left to right across the zone's edge at x = 0.5: 10 frames, 5 of them inside."""
    return [frame(n, 0.1 + 0.08 * n, start=start) for n in range(10)]


def after(results: list[InferenceResult], seconds: float = 1.0) -> float:
    """Node time `seconds` after the last result's capture."""
    return results[-1].captured_at.timestamp() + seconds


@pytest.fixture
def rules(tmp_path: Path) -> Path:
    path = tmp_path / "rules.yaml"
    path.write_text(RULES)
    return path


@pytest.fixture
def outbox(tmp_path: Path) -> Iterator[Outbox]:
    with Outbox.open(
        tmp_path / "outbox.db", node_id="node-1", budget_bytes=1 << 20, clock=ManualClock(T0)
    ) as opened:
        yield opened


def task_for(rules: Path, outbox: Outbox, **config: object) -> AggregationTask:
    settings = AggregationTaskConfig(enabled=True, rules_file=rules, tick_s=0.01)
    task = AggregationTask(replace(settings, **config), outbox, ManualClock(T0))  # type: ignore[arg-type]
    return task


def events_in(outbox: Outbox) -> list[tuple[str, bytes]]:
    return [(r.id, r.payload) for r in outbox.pending(100, 1 << 20, ["event"])]


def test_an_intrusion_lands_in_the_outbox_once_under_its_event_id(
    rules: Path, outbox: Outbox
) -> None:
    task = task_for(rules, outbox)
    assert task.start()
    results = walk_in()
    for result in results:
        task.offer(result)
    assert task.drain_once(after(results)) == 1
    assert task.drain_once(after(results, 2.0)) == 0  # nothing new
    [(record_id, payload)] = events_in(outbox)
    event = decode_event(payload)
    assert record_id == event.event_id  # the idempotency key is the record's id
    assert (event.type, event.rule_id) == ("zone.intrusion", "yard")
    assert event.provenance == (Provenance("node", "detector", "2.0.1"),)
    assert event.evidence[0].camera == "gate"
    # The first frame whose feet are in the zone: x = 0.1 + 0.08 * 5 = 0.5.
    assert event.at == pytest.approx(results[5].captured_at.timestamp(), abs=1e-6)
    assert task.stats.events_stored == 1


def test_a_restart_that_replays_the_same_frames_stores_nothing_twice(
    rules: Path, outbox: Outbox
) -> None:
    results = walk_in()
    first = task_for(rules, outbox)
    assert first.start()
    for result in results:
        first.offer(result)
    first.drain_once(after(results))
    # A new task (a restarted agent: no rule state) sees the same frames again.
    second = task_for(rules, outbox)
    assert second.start()
    for result in results:
        second.offer(result)
    assert second.drain_once(after(results)) == 0
    assert second.stats.events_replayed == 1
    assert len(events_in(outbox)) == 1


def test_shutdown_drains_the_hand_off_and_flushes_what_waits_for_the_watermark(
    rules: Path, outbox: Outbox
) -> None:
    task = task_for(rules, outbox)
    for result in walk_in():
        task.offer(result)
    stop = anyio.Event()
    stop.set()  # stopping before the first tick: only the drain at stop can store it

    async def main() -> None:
        await task.run(stop)

    anyio.run(main)
    assert len(events_in(outbox)) == 1
    assert task.state == "stopped"
    assert task.queued == 0
    task.offer(frame(11, 0.9))  # after the drain: not aggregated, not queued
    assert task.queued == 0


def test_a_full_hand_off_counts_what_it_leaves_out_and_never_blocks(
    rules: Path, outbox: Outbox
) -> None:
    task = task_for(rules, outbox, queue_size=50)
    offered = 0

    def camera(stream: str) -> None:
        for n in range(100):
            task.offer(frame(n, 0.2, stream=stream))

    threads = [threading.Thread(target=camera, args=(f"cam-{i}",)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=10)
    offered = 400
    assert (task.stats.offered, task.queued, task.stats.queue_overflow) == (offered, 50, 350)
    assert task.start()
    task.drain_once(T0.timestamp() + 20)
    health = task.health()
    assert (health["offered"], health["queue_overflow"], health["queued"]) == (400, 350, 0)
    # The rules file allows camera "gate" only: the others are the aligner's unknown sources.
    assert health["unknown_source"] == 50


def fill(outbox: Outbox) -> list[str]:
    """Fill the outbox with other events until it has no room for one more of ours."""
    ids: list[str] = []
    for size in (3_000, 100):
        with pytest.raises(OutboxFullError):
            for _ in range(100):
                ids.append(outbox.append("event", b"x" * size).id)
    return ids


def test_events_the_outbox_refuses_are_held_in_order_and_stored_later(
    rules: Path, tmp_path: Path
) -> None:
    with Outbox.open(
        tmp_path / "small.db",
        node_id="node-1",
        budget_bytes=16_384,
        wal_reserve_bytes=0,
        max_payload_bytes=4_000,
        clock=ManualClock(T0),
    ) as small:
        fillers = fill(small)
        task = task_for(rules, small)
        assert task.start()
        results = walk_in()
        for result in results:
            task.offer(result)
        assert task.drain_once(after(results)) == 0
        assert task.health()["events_held"] == 1
        assert task.stats.events_lost == 0
        small.ack(fillers)  # the control plane took the others: room again
        assert task.drain_once(after(results, 2.0)) == 1
        assert task.health()["events_held"] == 0
        [(_, payload)] = events_in(small)
        assert decode_event(payload).type == "zone.intrusion"


def test_past_its_bound_the_hold_loses_the_oldest_counted(rules: Path, tmp_path: Path) -> None:
    with Outbox.open(
        tmp_path / "small.db",
        node_id="node-1",
        budget_bytes=16_384,
        wal_reserve_bytes=0,
        max_payload_bytes=4_000,
        clock=ManualClock(T0),
    ) as small:
        fill(small)
        task = task_for(rules, small, max_held_events=1)
        assert task.start()
        for walk in range(3):  # three visits, three intrusions
            results = walk_in(T0 + timedelta(seconds=10 * walk))
            for result in results:
                task.offer(result)
            task.drain_once(after(results))
        assert (task.health()["events_held"], task.stats.events_lost) == (1, 2)


@pytest.mark.parametrize(
    ("text", "names"),
    [
        (
            RULES.replace("[0.5, 0], [1, 0], [1, 1], [0.5, 1]", "[0, 0], [1, 1], [0.5, 0.5]"),
            "rules[0].zone: the polygon has no area",
        ),
        ("rules: [{id: x, type: zone}]\n", "rules[0].type"),
        ("version: [\n", "not YAML"),
    ],
)
def test_a_bad_rules_file_is_reported_by_field_and_the_task_just_waits(
    tmp_path: Path, outbox: Outbox, text: str, names: str, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "rules.yaml"
    path.write_text(text)
    task = task_for(path, outbox)
    stop = anyio.Event()

    async def main() -> None:
        async with anyio.create_task_group() as group:
            group.start_soon(task.run, stop)
            with anyio.fail_after(5):
                while task.state == "starting":
                    await anyio.sleep(0.001)
            task.offer(frame(1, 0.9))  # inference goes on; the result is not queued
            stop.set()

    anyio.run(main)
    health = task.health()
    assert health["state"] == "failed"
    assert health["error"].startswith(f"{path}: ")
    assert names in health["error"]
    assert (health["rules"], task.queued) == (0, 0)
    assert any(names in r.getMessage() and r.levelname == "ERROR" for r in caplog.records)
    check_report({"schema": SCHEMA, "aggregation": health})


def test_a_missing_rules_file_names_the_file(tmp_path: Path, outbox: Outbox) -> None:
    task = task_for(tmp_path / "absent.yaml", outbox)
    assert not task.start()
    assert task.error is not None
    assert task.error.startswith(f"{tmp_path / 'absent.yaml'}: cannot be read")


def test_the_health_section_fits_the_schema(rules: Path, outbox: Outbox) -> None:
    task = task_for(rules, outbox)
    assert task.start()
    results = walk_in()
    for result in [*results, results[3]]:  # one resend
        task.offer(result)
    task.drain_once(after(results))
    # Silent past the idle timeout (2 s): its last frame no longer waits for a next one.
    task.drain_once(after(results, 4.0))
    health = task.health()
    check_report({"schema": SCHEMA, "aggregation": health})
    assert health["events"] == {"zone.intrusion": 1}
    assert (health["duplicates"], health["sightings"], health["rules"]) == (1, 10, 1)
    assert health["state"] == "running"


def test_the_config_is_checked() -> None:
    with pytest.raises(InvalidInputError, match=r"aggregation\.rules_file"):
        AggregationTaskConfig(enabled=True)
    with pytest.raises(InvalidInputError, match=r"aggregation\.queue_size"):
        AggregationTaskConfig(queue_size=0)


CAMERA = Provenance("device", "people-cam", "1.4", "fw-2.3")


def seen(n: int, x: float, *, clock_s: float) -> Observation:
    """A camera's frame `n` (track 7, feet at (x, 0.8)), stamped `clock_s` on its clock."""
    box = AggBox(max(0.0, x - 0.1), 0.4, min(1.0, x + 0.1), 0.8)
    return Observation(
        "gate", f"m-{n}", n, clock_s, (AggDetection("person", 0.9, box, "7"),), CAMERA
    )


def test_a_cameras_observations_are_aggregated_with_the_offset_handed_over_before_them(
    rules: Path, outbox: Outbox
) -> None:
    task = task_for(rules, outbox)
    assert task.start()
    skew = 3600.0  # the camera's clock is an hour ahead
    t0 = T0.timestamp()
    # Taken at face value: before the camera's first estimate (the node's clock, near).
    assert task.offer_observation(seen(0, 0.1, clock_s=t0))
    task.set_clock_offset("gate", skew)
    for n in range(1, 10):
        assert task.offer_observation(seen(n, 0.1 + 0.08 * n, clock_s=t0 + skew + n / FPS))
    assert task.drain_once(t0 + 2) == 1
    [(_, payload)] = events_in(outbox)
    event = decode_event(payload)
    assert event.provenance == (CAMERA,)
    assert event.evidence[0].frame_seq == 5
    assert event.at == pytest.approx(t0 + 5 / FPS, abs=1e-6)  # the node's time of frame 5
    health = task.health()
    assert (health["offered"], health["device_observations"], health["clock_offsets"]) == (
        10,
        10,
        1,
    )
    assert (health["too_late"], health["future"]) == (0, 0)


def test_an_offset_that_finds_the_hand_off_full_is_kept_and_applied_after_it(
    rules: Path, outbox: Outbox
) -> None:
    task = task_for(rules, outbox, queue_size=2)
    t0 = T0.timestamp()
    assert task.offer_observation(seen(0, 0.1, clock_s=t0))
    assert task.offer_observation(seen(1, 0.1, clock_s=t0 + 0.1))
    # Over, and no room within the wait: refused (the gateway leaves it unacked).
    assert not task.offer_observation(seen(2, 0.1, clock_s=t0 + 0.2), timeout_s=0.0)
    task.set_clock_offset("gate", 60.0)  # full too: set aside, not lost
    task.set_clock_offset("gate", 120.0)  # the latest wins
    task.set_clock_offset("yard-cam", 5.0)  # not in the rules file's cameras: not counted there
    assert (task.stats.observations_refused, task.queued, task.stats.clock_offsets) == (1, 2, 3)
    assert task.stats.queue_overflow == 0
    assert task.start()
    task.drain_once(t0 + 1)
    assert task.aggregator is not None
    assert task.aggregator.aligner.clock_offsets() == {"gate": 120.0}
    assert task.health()["unknown_source"] == 0
    # Once the rules failed or the task stopped, nothing more is taken.
    task.finish()
    assert not task.offer_observation(seen(3, 0.1, clock_s=t0 + 0.3))
    assert (task.stats.device_observations, task.stats.observations_refused) == (2, 2)


def _until(condition: object, what: str) -> None:
    """Wait (bounded) for another thread to reach a state; never for a timeout to pass."""
    assert callable(condition)
    done = threading.Event()
    for _ in range(1000):
        if condition():
            return
        done.wait(0.005)
    raise AssertionError(f"timed out waiting for {what}")


def test_a_cameras_observation_waits_for_room_and_is_taken_once_the_worker_drains(
    rules: Path, outbox: Outbox
) -> None:
    task = task_for(rules, outbox, queue_size=2)
    assert task.start()
    t0 = T0.timestamp()
    assert task.offer_observation(seen(0, 0.1, clock_s=t0))
    assert task.offer_observation(seen(1, 0.1, clock_s=t0 + 0.1))
    taken: list[bool] = []
    gateway = threading.Thread(
        target=lambda: taken.append(task.offer_observation(seen(2, 0.1, clock_s=t0 + 0.2)))
    )
    gateway.start()
    _until(lambda: task.stats.observations_waited == 1, "the offer to wait")
    assert taken == [] and task.queued == 2  # waiting, not dropped, not yet taken
    # The node's own results never wait: a full hand-off counts them and goes on.
    task.offer(frame(1, 0.2))
    assert task.stats.queue_overflow == 1
    task.drain_once(t0 + 1)  # the worker takes the hand-off: room, signalled
    gateway.join(timeout=10)
    assert not gateway.is_alive()
    assert taken == [True]
    assert task.queued == 1
    health = task.health()
    assert (health["observations_waited"], health["observations_refused"]) == (1, 0)
    assert (health["device_observations"], health["queue_overflow"]) == (3, 1)
    assert health["offered"] == 4  # 3 camera observations and the node's one result
    check_report({"schema": SCHEMA, "aggregation": health})


def test_a_waiting_observation_is_refused_when_the_task_stops_or_no_room_comes(
    rules: Path, outbox: Outbox
) -> None:
    task = task_for(rules, outbox, queue_size=1)
    assert task.start()
    t0 = T0.timestamp()
    assert task.offer_observation(seen(0, 0.1, clock_s=t0))
    # No room within the wait: refused, not counted as offered or taken.
    assert not task.offer_observation(seen(1, 0.1, clock_s=t0 + 0.1), timeout_s=0.0)
    assert (task.stats.offered, task.stats.device_observations, task.queued) == (1, 1, 1)
    taken: list[bool] = []
    gateway = threading.Thread(
        target=lambda: taken.append(task.offer_observation(seen(2, 0.1, clock_s=t0 + 0.2)))
    )
    gateway.start()
    _until(lambda: task.stats.observations_waited == 2, "the offer to wait")
    task.finish()  # stopping wakes the waiter: refused, for the broker to redeliver
    gateway.join(timeout=10)
    assert not gateway.is_alive()
    assert taken == [False]
    assert (task.stats.observations_waited, task.stats.observations_refused) == (2, 2)
    assert task.stats.device_observations == 1


def test_the_events_of_one_drain_go_to_the_outbox_in_one_batch(
    rules: Path, outbox: Outbox, monkeypatch: pytest.MonkeyPatch
) -> None:
    batches: list[list[str]] = []
    real = outbox.append_many_once

    def spy(kind: Kind, items: Sequence[tuple[bytes, str]]) -> BatchAppend:
        batches.append([record_id for _, record_id in items])
        return real(kind, items)

    monkeypatch.setattr(outbox, "append_many_once", spy)
    task = task_for(rules, outbox)
    assert task.start()
    walks = [walk_in(T0 + timedelta(seconds=10 * walk)) for walk in range(3)]
    for results in walks:
        for result in results:
            task.offer(result)
    assert task.drain_once(after(walks[-1])) == 3
    assert len(batches) == 1  # one transaction for the three events
    assert batches[0] == [record_id for record_id, _ in events_in(outbox)]
    assert (task.stats.events_stored, task.stats.events_replayed) == (3, 0)


def test_an_event_over_the_payload_limit_is_lost_counted_and_not_held(
    rules: Path, tmp_path: Path
) -> None:
    with Outbox.open(
        tmp_path / "tiny.db",
        node_id="node-1",
        budget_bytes=16_384,
        wal_reserve_bytes=0,
        max_payload_bytes=16,
        clock=ManualClock(T0),
    ) as tiny:
        task = task_for(rules, tiny)
        assert task.start()
        results = walk_in()
        for result in results:
            task.offer(result)
        assert task.drain_once(after(results)) == 0
        assert (task.health()["events_held"], task.stats.events_lost) == (0, 1)
        assert events_in(tiny) == []
