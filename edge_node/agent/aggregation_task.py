"""The agent's aggregation task: the node's own inference results through the rules
(``edge_node.aggregation``) into the outbox as durable ``event`` records.

The pipeline's worker threads call :meth:`AggregationTask.offer` for every result: a
bounded hand-off under a lock held for an append, never waiting on the rules or on I/O; a
result that finds it full is counted (``queue_overflow``) and left out. Every ``tick_s``
the task takes what was handed over, in a worker thread, turns each result into an
``Observation`` (``edge_node.aggregation.node_results``), offers it to the ``Aggregator``,
advances it to the node's clock, and appends each event's ``encode_event`` bytes to the
outbox under the event's own deterministic id, the events of one drain in one transaction
(``Outbox.append_many_once``; one commit's fsync per tick, not per event): the same event
raised again (a replay after a restart, a resend) is stored once here and once at the
control plane. Events are not best effort: one the outbox refuses (budget, full disk) is
held in memory, in order, and tried again on the next tick; only when that hold is full
too is the oldest lost, counted and logged as an error. On stop the task drains the
hand-off, flushes the aggregator (everything waiting for the watermark) and stores the
events before it returns; results offered after that are not aggregated.

A rules file that cannot be used (unreadable, not YAML, a field wrong) is logged as an
error naming the field and reported in health (``aggregation.state`` "failed",
``aggregation.error``); a rule that raises while running does the same. Either way the
aggregation stops and the node goes on serving inference: the rules are an operator's
file, and a typo in it must not take the cameras' inference down with it.

Cameras' results come the same way, but they are durable messages (QoS 1, acked only once
processed: ADR 0041), so they are never left out: the device gateway's worker thread calls
:meth:`AggregationTask.offer_observations` with each batch it took from the broker
(``Observation`` s already, through the same bounded hand-off, one lock a batch;
:meth:`AggregationTask.offer_observation` is the same for one), which waits for room when
the hand-off is full (counted ``observations_waited``; the worker signals each drain), at
most ``observation_wait_s`` (5 s), and says False when it still cannot take it (stopping,
or no room by then: counted ``observations_refused``, not ``offered``; the rules failed:
the device task counts it not aggregated), so the gateway leaves that message unacked for
the broker to deliver again. Only the gateway's worker ever waits there; the pipeline's
threads call ``offer``, which never does. It also calls
:meth:`AggregationTask.set_clock_offset` for each heartbeat's clock estimate. The offset
travels in the hand-off too, in order with the observations, so the engine (touched only
by the task's worker) applies it to the frames that came after it; when the hand-off is
full it is kept aside, latest per camera, and applied after that batch, so an estimate is
never lost to a burst of results.

Not here: the device gateway itself (``edge_node.devices``, started by the agent), the
rules themselves.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Literal

import anyio
import anyio.to_thread

from edge_node.aggregation.config import RulesFile, build_aggregator
from edge_node.aggregation.engine import Aggregator
from edge_node.aggregation.errors import RulesConfigError
from edge_node.aggregation.model import Event, Observation
from edge_node.aggregation.node_results import observation_from_result
from edge_node.aggregation.rules.base import TrackBook
from edge_node.aggregation.rules_file import load_rules_file
from edge_node.aggregation.wire import encode_event
from edge_node.clock import Clock
from edge_node.errors import (
    ClosedError,
    InvalidInputError,
)
from edge_node.outbox import Outbox
from protos.bundle.results import InferenceResult

__all__ = [
    "OBSERVATION_WAIT_S",
    "AggregationStats",
    "AggregationTask",
    "AggregationTaskConfig",
]

log = logging.getLogger(__name__)

MAX_QUEUE_SIZE: Final = 1_000_000
MAX_HELD_EVENTS: Final = 1_000_000
# How long a camera's observation waits for room in a full hand-off before it is refused
# (the gateway then leaves the message unacked). Below the gateway's half keepalive (15 s
# by default), so its queue, not the broker's connection, takes the rest of the wait.
OBSERVATION_WAIT_S: Final = 5.0
State = Literal["starting", "running", "failed", "stopped"]


@dataclass(frozen=True, slots=True)
class AggregationTaskConfig:
    """The ``aggregation:`` section of node.yaml (checked again here for direct callers).

    The task runs when ``enabled`` and a ``rules_file`` is named."""

    enabled: bool = False
    rules_file: Path | None = None
    tick_s: float = 0.05
    queue_size: int = 10_000
    max_held_events: int = 10_000

    def __post_init__(self) -> None:
        if self.enabled and self.rules_file is None:
            raise InvalidInputError(
                "aggregation.rules_file is required when aggregation is enabled",
                field="aggregation.rules_file",
            )
        _check("aggregation.tick_s", self.tick_s, 0.01, 60.0)
        _check("aggregation.queue_size", self.queue_size, 1, MAX_QUEUE_SIZE, integer=True)
        _check(
            "aggregation.max_held_events", self.max_held_events, 1, MAX_HELD_EVENTS, integer=True
        )


def _check(name: str, value: float, low: float, high: float, *, integer: bool = False) -> None:
    wrong_type = isinstance(value, bool) or not isinstance(value, int if integer else int | float)
    if wrong_type or not math.isfinite(value) or not low <= value <= high:
        raise InvalidInputError(
            f"{name} must be {'an integer' if integer else 'a number'} in [{low:g}, {high:g}], "
            f"got {value!r}",
            field=name,
        )


@dataclass
class AggregationStats:
    """Counts since the task started (what ``health()`` reports beside the engine's)."""

    offered: int = 0
    queue_overflow: int = 0
    # Results that carry nothing for the rules (classification, raw outputs).
    not_detections: int = 0
    events_stored: int = 0
    # Raised again while the same event was still pending in the outbox: stored once.
    events_replayed: int = 0
    events_lost: int = 0
    # Of `offered`: cameras' observations (the device gateway); clock offsets handed over.
    device_observations: int = 0
    clock_offsets: int = 0
    # Cameras' observations that found the hand-off full and waited for room (then taken
    # or refused); refused (stopping, or no room within the wait: not `offered`, left
    # unacked by the gateway for the broker to deliver again).
    observations_waited: int = 0
    observations_refused: int = 0


@dataclass(frozen=True, slots=True)
class _ClockOffset:
    source: str
    offset_s: float


class AggregationTask:
    def __init__(
        self,
        config: AggregationTaskConfig,
        outbox: Outbox,
        clock: Clock,
        *,
        load_rules: Callable[[Path], RulesFile] = load_rules_file,
        observation_wait_s: float = OBSERVATION_WAIT_S,
    ) -> None:
        self.config = config
        self.observation_wait_s = observation_wait_s
        self._outbox = outbox
        self._clock = clock
        self._load_rules = load_rules
        self._lock = threading.Lock()  # the hand-off: appends and swaps only
        # Signalled when the worker takes the hand-off (room) or it stops accepting.
        self._room = threading.Condition(self._lock)
        self._queue: deque[InferenceResult | Observation | _ClockOffset] = deque()
        # Offsets that found the hand-off full: the latest per camera, applied after it.
        self._offsets_aside: dict[str, float] = {}
        self._accepting = True
        # The engine and the held events, between the drain and the health report.
        self._engine_lock = threading.Lock()
        self._held: deque[Event] = deque()
        self._refused = False  # the outbox refused the last event tried
        self.aggregator: Aggregator | None = None
        self.state: State = "starting"
        self.error: str | None = None
        self.stats = AggregationStats()

    # ------------------------------------------------------------------ any thread

    def offer(self, result: InferenceResult) -> None:
        """Hand one result over (the pipeline's threads; O(1), never blocks on the rules)."""
        with self._lock:
            if not self._accepting:
                return
            self.stats.offered += 1
            if len(self._queue) >= self.config.queue_size:
                self.stats.queue_overflow += 1
                return
            self._queue.append(result)

    def offer_observation(
        self, observation: Observation, *, timeout_s: float | None = None
    ) -> bool:
        """Hand one camera observation over (the device gateway's worker only; never
        blocks on the rules). True once it is in the hand-off. A full hand-off is waited
        on (``observations_waited``) until the worker drains it, at most ``timeout_s``
        (default ``observation_wait_s``).
        False when it is not taken: the task takes nothing any more (stopped, or the rules
        failed) or there was still no room; never dropped silently: the caller must not
        ack the message it came in (unless ``state`` is "failed": the rules are off for
        good, and the device task counts it ``observations_not_aggregated``). Refusals
        other than "failed" are counted ``observations_refused``."""
        with self._room:
            if self._accepting and len(self._queue) >= self.config.queue_size:
                self.stats.observations_waited += 1
                self._room.wait_for(
                    lambda: not self._accepting or len(self._queue) < self.config.queue_size,
                    timeout=max(0.0, self.observation_wait_s if timeout_s is None else timeout_s),
                )
            if not self._accepting or len(self._queue) >= self.config.queue_size:
                if self.state != "failed":  # failed: the caller counts it not aggregated
                    self.stats.observations_refused += 1
                return False
            self.stats.offered += 1
            self.stats.device_observations += 1
            self._queue.append(observation)
            return True

    def offer_observations(
        self, observations: Sequence[Observation], *, timeout_s: float | None = None
    ) -> int:
        """`offer_observation` for a batch, in order, under one lock: as many as there is
        room for are taken at once; for the rest the hand-off is waited on as there (one
        wait of at most ``timeout_s`` for the whole batch). Returns how many were taken,
        a prefix of the batch; the caller must not ack the rest (see
        `offer_observation`)."""
        taken = 0
        n = len(observations)
        limit = self.config.queue_size
        wait = max(0.0, self.observation_wait_s if timeout_s is None else timeout_s)
        deadline: float | None = None
        with self._room:
            while taken < n:
                if self._accepting and len(self._queue) >= limit:
                    if deadline is None:
                        self.stats.observations_waited += 1
                        deadline = time.monotonic() + wait
                    self._room.wait_for(
                        lambda: not self._accepting or len(self._queue) < limit,
                        timeout=max(0.0, deadline - time.monotonic()),
                    )
                if not self._accepting or len(self._queue) >= limit:
                    if self.state != "failed":  # failed: the caller counts them
                        self.stats.observations_refused += n - taken
                    break
                room = min(n - taken, limit - len(self._queue))
                self._queue.extend(observations[taken : taken + room])
                taken += room
                self.stats.offered += room
                self.stats.device_observations += room
        return taken

    def set_clock_offset(self, source: str, offset_s: float) -> None:
        """A camera's clock minus the node's (its heartbeat's estimate), for its frames
        handed over after this call (any thread; applied by the task's worker)."""
        with self._lock:
            if not self._accepting:
                return
            self.stats.clock_offsets += 1
            if len(self._queue) >= self.config.queue_size:
                self._offsets_aside[source] = offset_s
            else:
                self._queue.append(_ClockOffset(source, offset_s))

    @property
    def accepting(self) -> bool:
        return self._accepting

    @property
    def queued(self) -> int:
        return len(self._queue)

    # ------------------------------------------------------------------ worker thread

    def start(self) -> bool:
        """Load the rules file and build the engine; False (logged, reported) when it
        cannot be used. Blocking (reads the file)."""
        path = self.config.rules_file
        assert path is not None  # checked by the config
        try:
            aggregator = build_aggregator(self._load_rules(path))
        except RulesConfigError as exc:
            where = str(path) if exc.field == str(path) else f"{path}: {exc.field}"
            self._fail(f"{where}: {exc.problem}")
            log.error(
                "aggregation off, the rules file cannot be used: %s; inference goes on without it",
                self.error,
            )
            return False
        with self._engine_lock:
            self.aggregator = aggregator
            self.state = "running"
        log.info("aggregation running %d rules from %s", len(aggregator.rules), path)
        return True

    def drain_once(self, now: float | None = None) -> int:
        """Aggregate what was handed over, advance to ``now`` (node clock, seconds; default
        the clock's) and store the events. Returns the events stored.

        Raises only ``ClosedError`` (the outbox closed: stopping)."""
        if self.state != "running":
            return 0
        at = self._clock.now().timestamp() if now is None else now
        events = self._aggregate(lambda engine: engine.advance(at), at)
        return self._store(events)

    def finish(self) -> int:
        """On stop: aggregate what is left, flush the engine, store everything; stop
        accepting results. Returns the events stored."""
        with self._lock:
            self._accepting = False
            self._room.notify_all()
        if self.state != "running":
            self._clear()
            return 0
        at = self._clock.now().timestamp()
        stored = self._store(self._aggregate(lambda engine: engine.flush(), at))
        with self._engine_lock:
            self.state = "stopped"
        return stored

    def _aggregate(self, then: Callable[[Aggregator], list[Event]], now: float) -> list[Event]:
        with self._lock:
            batch, self._queue = self._queue, deque()
            aside, self._offsets_aside = self._offsets_aside, {}
            self._room.notify_all()
        events: list[Event] = []
        with self._engine_lock:
            engine = self.aggregator
            assert engine is not None
            try:
                known = engine.aligner.config.known_sources
                # Consecutive observations go to the engine as one batch (`offer_many`:
                # the rules advanced once, not once an observation); an offset first
                # lets the frames before it through.
                run: list[Observation] = []
                for item in batch:
                    if isinstance(item, _ClockOffset):
                        if run:
                            events += engine.offer_many(run, now)
                            run = []
                        # A camera the rules file does not list: its frames are counted
                        # (unknown_source), its heartbeats are not.
                        if known is None or item.source in known:
                            engine.set_clock_offset(item.source, item.offset_s)
                        continue
                    if isinstance(item, Observation):
                        observation: Observation | None = item
                    else:
                        observation = observation_from_result(item)
                    if observation is None:
                        self.stats.not_detections += 1
                        continue
                    run.append(observation)
                if run:
                    events += engine.offer_many(run, now)
                for source, offset_s in aside.items():
                    if known is None or source in known:
                        engine.set_clock_offset(source, offset_s)
                events += then(engine)
            except Exception as exc:  # a rule's bug: aggregation stops, inference goes on
                log.exception("aggregation stopped by an error in the rules engine")
                self._fail(f"{type(exc).__name__}: {exc}")
        if self.state == "failed":
            self._clear()
        return events

    def _store(self, events: list[Event]) -> int:
        """The held events first, then these, in order, in one outbox transaction
        (``Outbox.append_many_once``); what the outbox refuses is held, with all after it."""
        held = self._held
        held.extend(events)
        stored = 0
        limit = self._outbox.max_payload_bytes
        while held:
            # An event over the payload limit is lost, as the single form reports it;
            # the others, up to the next such, go in one batch.
            batch: list[tuple[bytes, str]] = []
            for event in held:
                payload = encode_event(event)
                if len(payload) > limit:
                    break
                batch.append((payload, event.event_id))
            if not batch:
                lost = held.popleft()
                self.stats.events_lost += 1
                log.error(
                    "event %s lost: its payload is over the outbox's %d-byte limit",
                    lost.event_id,
                    limit,
                )
                continue
            done = self._outbox.append_many_once("event", batch)
            for record in done.records:
                held.popleft()
                if record is None:
                    self.stats.events_replayed += 1
                else:
                    stored += 1
            if done.records and self._refused:
                log.info("the outbox takes events again")
                self._refused = False
            error = done.error
            if error is not None:
                if not self._refused:  # once per refusal spell, not once per tick
                    log.warning(
                        "events not stored yet (%s); %d held, tried again every %.2gs",
                        error.message,
                        len(held),
                        self.config.tick_s,
                    )
                self._refused = True
                break
        over = len(held) - self.config.max_held_events
        for _ in range(max(0, over)):
            lost = held.popleft()
            self.stats.events_lost += 1
            log.error(
                "event %s (%s) lost: the outbox refuses events and %d are held already",
                lost.event_id,
                lost.type,
                self.config.max_held_events,
            )
        self.stats.events_stored += stored
        return stored

    def _fail(self, error: str) -> None:
        self.state = "failed"
        self.error = error[:400]

    def _clear(self) -> None:
        with self._lock:
            self._accepting = False
            self._queue.clear()
            self._offsets_aside.clear()
            self._room.notify_all()

    # ------------------------------------------------------------------ the agent's task

    async def run(self, stop: anyio.Event, *, inputs_closed: anyio.Event | None = None) -> None:
        """Load the rules, then ``drain_once`` every ``tick_s`` until ``stop``, then
        ``finish``. With ``inputs_closed`` (the device gateway's stop), ``finish`` waits
        for it, draining meanwhile, so what the gateway processes while it stops becomes
        events too. Never raises for the rules (see the module docstring)."""
        if not await anyio.to_thread.run_sync(self.start):
            self._clear()
            await stop.wait()
            return
        try:
            while not stop.is_set():
                await anyio.to_thread.run_sync(self.drain_once)
                with anyio.move_on_after(self.config.tick_s):
                    await stop.wait()
            while inputs_closed is not None and not inputs_closed.is_set():
                await anyio.to_thread.run_sync(self.drain_once)
                with anyio.move_on_after(self.config.tick_s):
                    await inputs_closed.wait()
            stored = await anyio.to_thread.run_sync(self.finish)
            log.info("aggregation drained: %d events stored at stop", stored)
        except ClosedError:
            return  # stopping: the outbox closed under the task

    # ------------------------------------------------------------------ health

    def health(self) -> dict[str, Any]:
        """The health report's ``aggregation`` section (health.proto ``Aggregation``)."""
        with self._engine_lock:
            engine = self.aggregator
            numbers = engine.health() if engine is not None else {}
            capped = _capped(engine) if engine is not None else {}
            held = len(self._held)
        stats = self.stats
        return {
            "state": self.state,
            "rules_file": str(self.config.rules_file),
            "error": self.error,
            "rules": 0 if engine is None else len(engine.rules),
            "offered": stats.offered,
            "queue_overflow": stats.queue_overflow,
            "queued": self.queued,
            "sightings": int(numbers.get("sightings", 0)),
            "events": {str(k)[:64]: int(v) for k, v in numbers.get("events", {}).items()},
            "events_stored": stats.events_stored,
            "events_replayed": stats.events_replayed,
            "events_held": held,
            "events_lost": stats.events_lost,
            **{
                key: int(numbers.get(key, 0))
                for key in (
                    "duplicates",
                    "late_applied",
                    "too_late",
                    "future",
                    "unknown_source",
                    "invalid_time",
                )
            },
            "capped": capped,
            "device_observations": stats.device_observations,
            "clock_offsets": stats.clock_offsets,
            "observations_waited": stats.observations_waited,
            "observations_refused": stats.observations_refused,
        }


def _capped(engine: Aggregator) -> dict[str, int]:
    """The state bounds that were hit, by where (only those above zero)."""
    aligner = engine.aligner.stats
    counts: dict[str, int] = {
        "aligner.released_early": aligner.released_early,
        "aligner.ids_evicted": aligner.ids_evicted,
        "aligner.sources_refused": aligner.sources_refused,
    }
    if engine.tracker is not None:
        tracker = engine.tracker.stats
        counts["tracker.tracks_evicted"] = tracker.tracks_evicted
        counts["tracker.sources_refused"] = tracker.sources_refused
    for rule in engine.rules:
        books = [v for v in getattr(rule, "__dict__", {}).values() if isinstance(v, TrackBook)]
        counts[f"{rule.rule_id}.evicted"] = sum(book.stats.evicted for book in books)
        for name in ("dropped", "closed_early", "distinct_capped"):
            value = getattr(rule, name, 0)
            if isinstance(value, int):
                counts[f"{rule.rule_id}.{name}"] = value
    return {key[:64]: value for key, value in sorted(counts.items()) if value}
