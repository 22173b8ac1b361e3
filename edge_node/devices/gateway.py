"""`DeviceGateway`: the node's MQTT client on its local broker, between the cameras
(device_sdk) and the aggregation.

It subscribes ``<root>/+/results``, ``/heartbeat`` and ``/frame`` at QoS 1, hands each
message to the pure `DeviceIntake`, passes every accepted `Observation` (and each
camera's clock offset) to the callbacks it was given, answers heartbeats with a
`TimeSync` on ``<root>/<device>/time``, and keeps every allow-listed camera's
`DeviceConfig` retained on ``<root>/<device>/config``. Not here: any decision (the
intake's), the aggregation, node.yaml.

Threads: paho's network thread (`GatewayClient`: paho reading in large chunks, a PUBLISH
decoded straight to its topic, payload and id) only queues what arrives (a tuple
appended, with the node's clock at arrival, for the TimeSync; the worker is woken only
when the queue was empty); one worker thread of the gateway's own takes what is queued
in batches (at most ``MAX_BATCH``, and half the queue), decides on the whole batch under
one lock, publishes the replies, hands the batch's observations on in one call
(``on_observations``; in order with the clock offsets between them) and only then acks
the batch's messages (one write for all their PUBACKs, `GatewayClient.ack_many`), so a
slow callback delays intake but never paho's keepalive, and a worker that dies mid-batch
has acked none of it. The queue and the batch in hand together hold at most
``max_queue`` messages, and each is acked to the broker (manual QoS 1 ack) only once
processed: a node that stops or dies with messages queued gets them again from its
persistent session, and the intake's id memory drops what it had already taken. Nothing
is acked unprocessed: the CONNECT's Receive Maximum (``receive_maximum``, at most
``max_queue``) asks the broker to keep no more unacked than that; one that sends more
anyway (Mosquitto 2.0.11 does once acks flow) finds a full queue and paho's thread waits
for room (TCP then holds the broker back), at most half the keepalive; a message that
still finds none is counted ``deferred`` and left
unacked, for the broker's next session with the gateway (ADR 0041).
The observation callback may refuse one by returning False (the aggregation had no room
within its wait, or is stopping; the batch callback by returning how many of the batch
it took, the rest refused): that message is not processed, so it is not acked,
counted ``deferred`` (and ``observations_refused``) like one the queue could not take, its
id is forgotten by the intake, and the broker delivers it again on its next session.
A callback that raises is logged and counted, never fatal (the message is acked, lost;
for the batch callback, the observations it was given).
The callbacks run on that worker thread: an asyncio agent passes ones that hand over to
its loop (``loop.call_soon_threadsafe``), and the aggregation's `now` is the agent's.
"""

from __future__ import annotations

import collections
import logging
import ssl
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any, Final

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from paho.mqtt.reasoncodes import ReasonCode

from edge_node.aggregation.model import Observation
from edge_node.devices.config import DeviceGatewayConfig, DeviceGatewayConfigError
from edge_node.devices.intake import DeviceIntake, Outcome
from edge_node.devices.mqtt_client import GatewayClient
from edge_node.devices.replies import config_message, time_sync_message
from edge_node.errors import ClosedError

__all__ = ["MAX_BATCH", "ClockSink", "DeviceGateway", "ObservationSink", "ObservationsSink"]

log = logging.getLogger(__name__)

# Returns False when it did not take the observation (leave the message unacked);
# True or None when it did.
ObservationSink = Callable[[Observation], bool | None]
# The batch form: returns how many it took, in order (the rest are refused, left
# unacked); None when it took them all.
ObservationsSink = Callable[[Sequence[Observation]], int | None]
ClockSink = Callable[[str, float], None]  # (device id, camera clock minus node clock, s)

_LEAVES = ("results", "heartbeat", "frame")
# Messages the worker takes off the queue at once (and never more than half the queue):
# one lock, one intake pass, one hand-off and one run of acks for all of them.
MAX_BATCH: Final = 256

# What paho's thread queues: (topic, payload, mid, qos, received_at (node clock, UNIX
# seconds), generation (the connection it came on: an ack is for that connection only)).
_Inbound = tuple[str, bytes, int, int, float, int]


class DeviceGateway:
    """`start()`, then `health()` at any time, `stop(deadline_s)` once (safe twice)."""

    def __init__(
        self,
        config: DeviceGatewayConfig,
        on_observation: ObservationSink | None = None,
        *,
        on_observations: ObservationsSink | None = None,
        on_clock_offset: ClockSink | None = None,
        time_fn: Callable[[], float] = time.time,
        monotonic_fn: Callable[[], float] = time.monotonic,
    ) -> None:
        if (on_observation is None) == (on_observations is None):
            raise TypeError("DeviceGateway needs on_observation or on_observations (one)")
        self.config = config
        self._on_observation = on_observation
        self._on_observations = on_observations
        self._max_batch = max(1, min(MAX_BATCH, config.max_queue // 2))
        self._on_clock_offset = on_clock_offset
        self._time = time_fn
        self._monotonic = monotonic_fn
        # The DeviceConfig version: the node's clock in ms at start (ADR 0041).
        self._intake = DeviceIntake(
            config, now=monotonic_fn(), config_version=int(time_fn() * 1000)
        )
        # The queue and the counters (paho's thread and the worker); the intake's state
        # has a lock of its own, so paho's thread queues while the worker decides.
        self._lock = threading.Lock()
        self._intake_lock = threading.Lock()
        self._queue: collections.deque[_Inbound] = collections.deque()
        self._in_work = 0  # taken off the queue by the worker, not yet done with
        self._wake = threading.Condition(self._lock)
        self._room = threading.Condition(self._lock)  # the worker took one off the queue
        self._ready = threading.Event()
        self._stopping = False
        self._abandoned = False  # stop()'s deadline passed
        self._started = False
        self._generation = 0
        self._connected = False
        self._worker: threading.Thread | None = None
        self._client: GatewayClient | None = None
        self._counts: collections.Counter[str] = collections.Counter(
            connects=0,
            connect_failures=0,
            disconnects=0,
            queue_full=0,
            deferred=0,
            callback_errors=0,
            internal_errors=0,
            observations=0,
            observations_refused=0,
            time_syncs=0,
            configs_published=0,
            publish_failures=0,
        )
        self._last_error: str | None = None

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        """Connect in the background (paho reconnects on its own) and start the worker."""
        with self._lock:
            if self._stopping:
                raise ClosedError("the device gateway is stopped")
            if self._started:
                raise RuntimeError("DeviceGateway.start() called twice")
            self._started = True
        client = self._new_client()
        self._client = client
        self._worker = threading.Thread(target=self._work, name="device-gateway", daemon=True)
        self._worker.start()
        properties = Properties(PacketTypes.CONNECT)  # type: ignore[no-untyped-call]
        properties.SessionExpiryInterval = self.config.session_expiry_s
        properties.ReceiveMaximum = self.receive_maximum
        client.connect_async(
            self.config.host,
            self.config.port,
            keepalive=self.config.keepalive_s,
            clean_start=False,
            properties=properties,
        )
        client.loop_start()

    @property
    def receive_maximum(self) -> int:
        """The Receive Maximum sent on CONNECT: never more than the queue holds."""
        return min(self.config.receive_maximum, self.config.max_queue)

    def wait_ready(self, timeout_s: float) -> bool:
        """True once connected and subscribed (the configs are published by then)."""
        return self._ready.wait(timeout_s)

    def stop(self, deadline_s: float = 5.0) -> bool:
        """Stop taking messages, process what is queued within `deadline_s`, disconnect.
        True if the queue was drained; what was left is unacked, so the broker's session
        delivers it again. Safe to call twice."""
        with self._wake:
            if self._stopping:
                return not self._queue and not self._in_work
            self._stopping = True
            self._wake.notify_all()
            self._room.notify_all()
        drained = True
        if self._worker is not None:
            self._worker.join(max(0.0, deadline_s))
            drained = not self._worker.is_alive()
        with self._lock:
            left = len(self._queue) + self._in_work
            self._queue.clear()
            # A worker still busy past the deadline hands nothing more on: the rest of
            # its batch stays unacked, for the broker's session to deliver again.
            self._abandoned = True
        if left:
            log.warning("device gateway stopped with %d messages unprocessed", left)
        client = self._client
        if client is not None:
            client.disconnect()
            client.loop_stop()
        return drained and left == 0

    def __enter__(self) -> DeviceGateway:
        self.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop()

    def health(self) -> dict[str, Any]:
        """Connection, queue and intake counters (per reason and per camera), JSON-able."""
        with self._intake_lock:
            report = self._intake.health()
        with self._lock:
            report.update(
                connected=self._connected,
                # Taken from the broker and not yet done with (queued, or in the batch).
                queued=len(self._queue) + self._in_work,
                max_queue=self.config.max_queue,
                last_error=self._last_error,
                **dict(self._counts),
            )
        return report

    # ------------------------------------------------------------------ paho side

    def _new_client(self) -> GatewayClient:
        c = self.config
        client = GatewayClient(
            CallbackAPIVersion.VERSION2,
            client_id=c.client_id,
            protocol=mqtt.MQTTv5,
            manual_ack=True,
        )
        client.connect_timeout = c.connect_timeout_s
        client.reconnect_delay_set(1, 30)
        client.max_queued_messages_set(c.max_queue)  # replies held while disconnected
        if c.username is not None:
            client.username_pw_set(c.username, c.password)
        if c.tls:
            try:
                client.tls_set(
                    ca_certs=str(c.ca_file) if c.ca_file else None,
                    certfile=str(c.cert_file) if c.cert_file else None,
                    keyfile=str(c.key_file) if c.key_file else None,
                    cert_reqs=ssl.CERT_REQUIRED,
                )
            except (OSError, ValueError, ssl.SSLError) as exc:  # unreadable, or not PEM
                raise DeviceGatewayConfigError(
                    f"devices: cannot use the TLS files: {exc}", field="devices.ca_file"
                ) from exc
        client.on_connect = self._on_connect
        client.on_disconnect = self._on_disconnect
        client.on_subscribe = self._on_subscribe
        client.on_message = self._on_message
        client.on_publish_raw = self._on_publish
        return client

    def _on_connect(
        self,
        client: mqtt.Client,
        _userdata: object,
        _flags: object,
        reason: ReasonCode,
        _properties: object,
    ) -> None:
        if reason.is_failure:
            with self._lock:
                self._counts["connect_failures"] += 1
                self._last_error = f"the broker refused the connection: {reason}"
            log.warning("device gateway: %s", self._last_error)
            return
        with self._lock:
            self._generation += 1
            self._connected = True
            self._counts["connects"] += 1
            self._last_error = None
        root = self.config.topic_root
        client.subscribe([(f"{root}/+/{leaf}", 1) for leaf in _LEAVES])
        for device_id in self.config.cameras:
            self._publish_config(client, device_id)

    def _on_subscribe(self, *_: object) -> None:
        self._ready.set()

    def _on_disconnect(
        self, _c: object, _u: object, _f: object, reason: object, _p: object
    ) -> None:
        with self._lock:
            self._ready.clear()  # first: whoever sees connected False sees this too
            self._connected = False
            self._counts["disconnects"] += 1
            if not self._stopping:
                self._last_error = f"disconnected: {reason}"

    def _on_message(
        self, _client: mqtt.Client, _userdata: object, message: mqtt.MQTTMessage
    ) -> None:
        """paho's path, for what `GatewayClient` leaves to it (QoS 2, odd packets)."""
        self._on_publish(message.topic, bytes(message.payload), message.mid, message.qos)

    def _on_publish(self, topic: str, payload: bytes, mid: int, qos: int) -> None:
        received_at = self._time()
        limit = self.config.max_queue
        queue = self._queue
        with self._wake:
            if len(queue) + self._in_work >= limit and not self._stopping:
                # Never ack what was not processed: wait for room (paho's thread stops
                # reading, so TCP holds the broker back), within half the keepalive so
                # that the connection's pings are not missed for long.
                self._counts["queue_full"] += 1
                deadline = time.monotonic() + self.config.keepalive_s / 2  # a real wait
                while len(queue) + self._in_work >= limit and not self._stopping:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        break
                    self._room.wait(left)
            if self._stopping:
                return  # unacked: the broker's session delivers it again
            if len(queue) + self._in_work >= limit:
                # Unacked: the broker sends it again on its next session with the
                # gateway (a reconnect or a restart; ADR 0041), never on this one.
                self._counts["deferred"] += 1
                self._last_error = "the queue stayed full: messages left unacked"
                log.warning("device gateway: queue full, %s left unacked", topic[:200])
                return
            queue.append((topic, payload, mid, qos, received_at, self._generation))
            if len(queue) == 1:  # the worker waits only on an empty queue
                self._wake.notify()

    # ------------------------------------------------------------------ worker side

    def _work(self) -> None:
        queue = self._queue
        while True:
            with self._wake:
                while not queue and not self._stopping:
                    self._wake.wait()
                if not queue:
                    return  # stopping, and everything is done
                n = min(len(queue), self._max_batch)
                batch = [queue.popleft() for _ in range(n)]
                self._in_work = n
                generation = self._generation
            try:
                done = self._process(batch)
                client = self._client
                if client is not None:
                    # One write for the batch's PUBACKs. Unprocessed: unacked, the
                    # broker's next session delivers it.
                    acks = [
                        item
                        for item, processed in zip(batch, done, strict=True)
                        if processed and item[5] == generation and item[3] > 0
                    ]
                    client.ack_many(item[2] for item in acks if item[3] == 1)
                    for item in acks:
                        if item[3] > 1:  # QoS 2 (the subscriptions are QoS 1)
                            client.ack(item[2], item[3])
            finally:
                with self._lock:
                    self._in_work = 0
                    self._room.notify_all()

    def _process(self, batch: list[_Inbound]) -> list[bool]:
        """Decide on the whole batch, act on it, hand its observations on: for each
        message, whether it was processed (to be acked)."""
        monotonic = self._monotonic
        take = self._intake.take
        outcomes: list[Outcome | None] = []
        with self._intake_lock:
            for topic, payload, _mid, _qos, received_at, _gen in batch:
                try:
                    outcomes.append(take(topic, payload, received_at, monotonic()))
                except Exception:  # a bug must not stop the intake; the message is lost
                    outcomes.append(None)
                    with self._lock:
                        self._counts["internal_errors"] += 1
                    log.exception("device gateway: the intake failed on %s", topic[:200])
        done = [True] * len(batch)
        run: list[int] = []  # positions of observations not handed on yet, in order
        refusing = False
        for at, outcome in enumerate(outcomes):
            if self._abandoned:  # stopped past its deadline: the rest is left unacked
                done[at:] = [False] * (len(done) - at)
                return done
            if outcome is None or outcome.rejected is not None:
                continue
            if outcome.observation is not None:
                if refusing:  # the aggregation refused one before it in this batch
                    done[at] = False
                    self._refuse([outcome])
                else:
                    run.append(at)
                continue
            if run:  # a heartbeat's offset goes after the observations before it
                refusing = self._hand_on(run, outcomes, done)
                run = []
            try:
                self._act(outcome)
            except Exception:
                with self._lock:
                    self._counts["internal_errors"] += 1
                log.exception("device gateway: answering %s failed", batch[at][0][:200])
        if run and not self._abandoned:
            self._hand_on(run, outcomes, done)
        elif run:
            for at in run:
                done[at] = False
        return done

    def _hand_on(self, run: list[int], outcomes: list[Outcome | None], done: list[bool]) -> bool:
        """Hand the observations at `run` on; those refused are marked not done. True
        when one was refused."""
        observations = []
        for at in run:
            outcome = outcomes[at]
            assert outcome is not None and outcome.observation is not None
            observations.append(outcome.observation)
        with self._lock:
            self._counts["observations"] += len(observations)
        if self._on_observations is not None:
            taken = self._call(self._on_observations, observations)
            taken = len(observations) if taken is None else max(0, min(taken, len(observations)))
        else:
            assert self._on_observation is not None
            taken = len(observations)
            for n, observation in enumerate(observations):
                if self._abandoned or self._call(self._on_observation, observation) is False:
                    taken = n
                    break
        if taken == len(observations):
            return False
        refused = [outcomes[at] for at in run[taken:]]
        for at in run[taken:]:
            done[at] = False
        self._refuse([o for o in refused if o is not None])
        return True

    def _refuse(self, refused: list[Outcome]) -> None:
        """Observations the aggregation did not take: unacked, their ids forgotten."""
        with self._intake_lock:
            for outcome in refused:
                if outcome.key is not None:
                    self._intake.forget(outcome.key)
        with self._lock:
            self._counts["observations_refused"] += len(refused)
            self._counts["deferred"] += len(refused)
            self._last_error = "the aggregation refused results: messages left unacked"
        log.warning(
            "device gateway: %d results not taken by the aggregation (first %s), left unacked",
            len(refused),
            refused[0].key if refused else None,
        )

    def _act(self, outcome: Outcome) -> None:
        """Reply to a heartbeat and pass its clock offset on."""
        client = self._client
        assert client is not None
        if outcome.time_sync is not None:
            sync = outcome.time_sync
            topic = f"{self.config.topic_root}/{sync.device_id}/time"
            payload = time_sync_message(
                sync.heartbeat_id,
                sync.device_sent_at_us,
                sync.node_received_at_us,
                message_id=str(uuid.uuid4()),
                sent_at_us=round(self._time() * 1e6),  # last: the answer leaves now
            )
            self._publish(client, topic, payload, retain=False, counter="time_syncs")
        if outcome.config_due is not None:
            self._publish_config(client, outcome.config_due)
        if outcome.clock is not None and self._on_clock_offset is not None:
            self._call(self._on_clock_offset, outcome.clock.device_id, outcome.clock.offset_s)

    def _call(self, callback: Callable[..., Any], *args: Any) -> Any:
        try:
            return callback(*args)
        except Exception:
            with self._lock:
                self._counts["callback_errors"] += 1
            log.exception("device gateway: a callback raised; the message is dropped")
            return None

    def _publish_config(self, client: mqtt.Client, device_id: str) -> None:
        with self._intake_lock:
            version = self._intake.config_version(device_id)
        payload = config_message(
            self.config.cameras[device_id],
            version,
            message_id=str(uuid.uuid4()),
            sent_at_us=round(self._time() * 1e6),
        )
        topic = f"{self.config.topic_root}/{device_id}/config"
        self._publish(client, topic, payload, retain=True, counter="configs_published")

    def _publish(
        self, client: mqtt.Client, topic: str, payload: bytes, *, retain: bool, counter: str
    ) -> None:
        info = client.publish(topic, payload, qos=1, retain=retain)
        with self._lock:
            # Not connected (paho keeps it, within max_queue, for the next connection) or
            # its queue full: a late TimeSync is worthless and the retained config is
            # published again on every connect, so a failure is only counted.
            self._counts[counter if info.rc == mqtt.MQTT_ERR_SUCCESS else "publish_failures"] += 1
