"""`DeviceClient`: what camera firmware calls to send results, heartbeats and frames to
its edge node over MQTT, and to take the node's configuration.

The firmware's calls only build the protobuf message and put it in the SDK's buffer
(`device_sdk.buffer`, optionally on flash); one thread of the client's own connects,
reconnects with capped, fully jittered backoff, publishes at QoS 1 within a window, and
removes a message only on its PUBACK. Not a general MQTT client: the topics and messages
are the device contract's (`device_sdk.topics`, device.proto).
"""

from __future__ import annotations

import contextlib
import logging
import secrets
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from google.protobuf.message import DecodeError
from google.protobuf.timestamp_pb2 import Timestamp

from device_sdk import __version__
from device_sdk.backoff import Backoff, BackoffPolicy
from device_sdk.buffer import BufferStats, Message, Priority, SendBuffer
from device_sdk.clock import Clock, SystemClock
from device_sdk.errors import BrokerError, ClientClosedError, InvalidMessageError
from device_sdk.ids import uuid7
from device_sdk.pacing import FramePacer, SourceConfig
from device_sdk.proto.edgefleet.device.v1 import device_pb2
from device_sdk.ring import FileRing
from device_sdk.timesync import ClockEstimate, ClockEstimator
from device_sdk.topics import CONFIG, FRAME, HEARTBEAT, RESULTS, ROOT, TIME, device_topic
from device_sdk.transport import Acked, Connector, Link, Lost, MqttSettings, PahoConnector

__all__ = ["ClientConfig", "ClientStats", "Detection", "DeviceClient"]

PROTOCOL_VERSION = 1
_SLACK = 1e-6
_log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Detection:
    """One object the camera's model saw. `bbox` is (x_min, y_min, x_max, y_max),
    normalised to the frame (0..1, origin top left); `track_id` None = untracked."""

    class_name: str
    score: float
    bbox: tuple[float, float, float, float]
    track_id: int | None = None
    attributes: Mapping[str, str] = field(default_factory=dict)

    def to_proto(self) -> device_pb2.Detection:
        # Float rounding (0.8 + 0.2 = 1.0000000000000002) is forgiven, nothing more.
        if not all(-_SLACK <= v <= 1.0 + _SLACK for v in self.bbox):
            raise InvalidMessageError(f"bbox {self.bbox} is not normalised to the frame")
        x_min, y_min, x_max, y_max = (min(max(v, 0.0), 1.0) for v in self.bbox)
        if not (x_min <= x_max and y_min <= y_max):
            raise InvalidMessageError(f"bbox {self.bbox} has its corners swapped")
        if not 0.0 <= self.score <= 1.0:
            raise InvalidMessageError(f"score {self.score} is not in [0, 1]")
        if self.track_id is not None and not 0 < self.track_id < 2**64:
            raise InvalidMessageError(f"track id {self.track_id} must be in 1..2**64-1")
        return device_pb2.Detection(
            class_name=self.class_name,
            score=self.score,
            bbox=device_pb2.BoundingBox(x_min=x_min, y_min=y_min, x_max=x_max, y_max=y_max),
            track_id=self.track_id or 0,
            attributes=dict(self.attributes),
        )


@dataclass(frozen=True, slots=True)
class ClientConfig:
    device_id: str
    mqtt: MqttSettings = field(default_factory=MqttSettings)
    # The buffer's bound, as file-ring bytes (payload plus ~30 bytes a message).
    buffer_bytes: int = 256 * 1024
    # A directory on flash for the file ring (None: memory only, lost at reboot).
    ring_directory: Path | str | None = None
    # fsync every buffered message (off: faster, but a power cut may lose the last few).
    ring_sync: bool = True
    # How long each kind is worth sending (wall-clock seconds from buffering).
    result_ttl_s: float = 3600.0
    heartbeat_ttl_s: float = 600.0
    frame_ttl_s: float = 10.0
    heartbeat_interval_s: float = 10.0
    # Publishes awaiting PUBACK at once; a PUBACK later than ack_timeout_s drops the
    # connection (the messages are resent on the next one).
    max_inflight: int = 20
    connect_timeout_s: float = 10.0
    ack_timeout_s: float = 30.0
    backoff: BackoffPolicy = field(default_factory=BackoffPolicy)
    # How often the client's thread looks at the socket and the buffer (latency floor).
    poll_interval_s: float = 0.02
    firmware_version: str = ""
    topic_root: str = ROOT
    # The MQTT client id (None: the device id and the boot's first 8 hex digits, so a
    # half-open connection of the last boot never takes over this one's session).
    client_id: str | None = None

    def __post_init__(self) -> None:
        device_topic(self.device_id, RESULTS, root=self.topic_root)  # validates the id
        if self.buffer_bytes < 1024 or self.max_inflight < 1:
            raise InvalidMessageError("buffer_bytes must be >= 1024 and max_inflight >= 1")
        for name in ("result_ttl_s", "heartbeat_ttl_s", "frame_ttl_s", "ack_timeout_s"):
            if getattr(self, name) <= 0:
                raise InvalidMessageError(f"{name} must be positive")


@dataclass(frozen=True, slots=True)
class ClientStats:
    connected: bool
    connects: int
    connect_failures: int
    last_error: str | None
    frames_captured: int
    frames_skipped: int
    # Node messages this client ignored (undecodable, unknown protocol version).
    bad_node_messages: int
    buffer: BufferStats
    clock: ClockEstimate


def _stamp(unix_s: float) -> Timestamp:
    stamp = Timestamp()
    stamp.FromNanoseconds(round(unix_s * 1e9))
    return stamp


def _unix(moment: datetime | float) -> float:
    if isinstance(moment, datetime):
        if moment.tzinfo is None:
            raise InvalidMessageError("capture times must be timezone-aware (UTC)")
        return moment.timestamp()
    return float(moment)


class DeviceClient:
    """The camera's client. `start()` once, then from any thread:

    - `admit_frame(captured_at)` before running the model on a frame: False when the
      node's target fps says skip it (counted in the heartbeat);
    - `publish_result(...)`, `publish_frame(...)` (a no-op while the node wants no
      frames); heartbeats are sent by the client every `heartbeat_interval_s`;
    - `config` (what the node asked for, applied), `stats()`, `flush()`, `close()`.
    """

    def __init__(
        self,
        config: ClientConfig,
        *,
        connector: Connector | None = None,
        clock: Clock | None = None,
        uniform: Callable[[float, float], float] | None = None,
        on_config: Callable[[SourceConfig], None] | None = None,
    ) -> None:
        self.settings = config
        self._connector = connector or PahoConnector(config.mqtt)
        self._clock = clock or SystemClock()
        self._on_config = on_config
        self.boot_id = secrets.token_hex(8)
        self.client_id = config.client_id or f"{config.device_id}-{self.boot_id[:8]}"
        journal = (
            FileRing(Path(config.ring_directory), config.buffer_bytes, sync=config.ring_sync)
            if config.ring_directory is not None
            else None
        )
        self._buffer = SendBuffer(config.buffer_bytes, journal=journal)
        self._backoff = Backoff(config.backoff, uniform=uniform)
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._wake = threading.Event()
        self._stopping = False
        self._thread: threading.Thread | None = None
        self._started_mono = self._clock.monotonic()
        self._next_heartbeat_mono = self._started_mono
        self._source = SourceConfig()
        self._pacer = FramePacer()
        self._estimator = ClockEstimator()
        self._connected = False
        self._connects = 0
        self._connect_failures = 0
        self._last_error: str | None = None
        self._frames_captured = 0
        self._frames_skipped = 0
        self._bad_node_messages = 0
        self._topics = {
            leaf: device_topic(config.device_id, leaf, root=config.topic_root)
            for leaf in (RESULTS, HEARTBEAT, FRAME, CONFIG, TIME)
        }

    # -- lifecycle -----------------------------------------------------------------

    def start(self) -> None:
        if self._thread is not None:
            raise RuntimeError("DeviceClient.start() called twice")
        self._thread = threading.Thread(
            target=self._run, name=f"device-sdk-{self.settings.device_id}", daemon=True
        )
        self._thread.start()

    def flush(self, timeout_s: float) -> bool:
        """Wait until every buffered message is acked; False if `timeout_s` passed first."""
        with self._changed:
            return self._changed.wait_for(lambda: len(self._buffer) == 0, timeout=timeout_s)

    def close(self, timeout_s: float | None = None) -> None:
        """Stop the client's thread and close the file ring (what is unsent stays there).
        Waits up to `timeout_s` (default: a connect attempt's timeout and a bit) for the
        thread, which may be inside a connect. Safe to call twice."""
        with self._lock:
            if self._stopping:
                return
            self._stopping = True
        self._wake.set()
        if self._thread is not None:
            self._thread.join(
                self.settings.connect_timeout_s + 2.0 if timeout_s is None else timeout_s
            )
            if self._thread.is_alive():
                _log.warning("device SDK thread still running after close(); ring left open")
                return
        with self._lock:
            self._buffer.close()

    def __enter__(self) -> DeviceClient:
        self.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    # -- what the firmware calls ---------------------------------------------------

    @property
    def config(self) -> SourceConfig:
        """The node's configuration as applied (version 0: none received yet)."""
        with self._lock:
            return self._source

    @property
    def connected(self) -> bool:
        return self._connected

    def admit_frame(self, captured_at: datetime | float) -> bool:
        """Whether to process this captured frame under the node's target fps."""
        at = _unix(captured_at)
        with self._lock:
            self._frames_captured += 1
            admitted = self._pacer.admit(at, self._source)
            if not admitted:
                self._frames_skipped += 1
            return admitted

    def publish_result(
        self,
        frame_seq: int,
        captured_at: datetime | float,
        detections: Iterable[Detection | device_pb2.Detection],
        *,
        model: str = "",
        model_version: str = "",
        width: int = 0,
        height: int = 0,
    ) -> str | None:
        """Buffer one frame's results; its message id, or None if the buffer dropped it."""
        result = device_pb2.FrameResult(
            frame_seq=frame_seq,
            captured_at=_stamp(_unix(captured_at)),
            detections=[d.to_proto() if isinstance(d, Detection) else d for d in detections],
            model=model,
            model_version=model_version,
            width=width,
            height=height,
        )
        return self._enqueue(
            RESULTS, Priority.RESULT, self.settings.result_ttl_s, frame_result=result
        )

    def publish_frame(
        self, frame_seq: int, captured_at: datetime | float, jpeg: bytes
    ) -> str | None:
        """Buffer a JPEG of the frame if the node asked for frames (else None, not sent)."""
        if not jpeg.startswith(b"\xff\xd8"):
            raise InvalidMessageError("a frame must be a JPEG (it starts with FF D8)")
        if not self.config.send_frames:
            return None
        frame = device_pb2.Frame(
            frame_seq=frame_seq, captured_at=_stamp(_unix(captured_at)), jpeg=jpeg
        )
        return self._enqueue(FRAME, Priority.FRAME, self.settings.frame_ttl_s, frame=frame)

    def publish_heartbeat(self) -> str | None:
        """Buffer a heartbeat now (the client also sends one every heartbeat_interval_s)."""
        with self._lock:
            stats = self._buffer.stats()
            estimate = self._estimator.estimate()
            beat = device_pb2.Heartbeat(
                clock=device_pb2.ClockEstimate(
                    offset_us=estimate.offset_us,
                    error_us=estimate.error_us,
                    samples=estimate.samples,
                ),
                config_version=self._source.version,
                firmware_version=self.settings.firmware_version,
                sdk_version=__version__,
                frames_captured=self._frames_captured,
                frames_skipped=self._frames_skipped,
                uptime_ms=int((self._clock.monotonic() - self._started_mono) * 1000),
                buffer=device_pb2.BufferStats(
                    queued_messages=stats.queued_messages,
                    queued_bytes=stats.queued_bytes,
                    capacity_bytes=stats.capacity_bytes,
                    dropped={k: v for k, v in stats.dropped.items() if v},
                    persistent=stats.persistent,
                ),
            )
        return self._enqueue(
            HEARTBEAT, Priority.HEARTBEAT, self.settings.heartbeat_ttl_s, heartbeat=beat
        )

    def stats(self) -> ClientStats:
        with self._lock:
            return ClientStats(
                connected=self._connected,
                connects=self._connects,
                connect_failures=self._connect_failures,
                last_error=self._last_error,
                frames_captured=self._frames_captured,
                frames_skipped=self._frames_skipped,
                bad_node_messages=self._bad_node_messages,
                buffer=self._buffer.stats(),
                clock=self._estimator.estimate(),
            )

    # -- inside --------------------------------------------------------------------

    def _enqueue(
        self,
        leaf: str,
        priority: Priority,
        ttl_s: float,
        **body: device_pb2.FrameResult | device_pb2.Heartbeat | device_pb2.Frame,
    ) -> str | None:
        now = self._clock.time()
        message_id = uuid7(now)
        envelope = device_pb2.DeviceEnvelope(
            protocol_version=PROTOCOL_VERSION,
            message_id=message_id,
            device_id=self.settings.device_id,
            boot_id=self.boot_id,
            sent_at=_stamp(now),  # when buffered: a resend is the same bytes
            **body,  # type: ignore[arg-type]  # one of the oneof's three bodies
        )
        message = Message(
            message_id, self._topics[leaf], priority, envelope.SerializeToString(), now + ttl_s
        )
        with self._changed:
            if self._stopping:
                raise ClientClosedError("the DeviceClient is closed")
            admitted = self._buffer.put(message, now)
            self._changed.notify_all()
        return message_id if admitted else None

    def _run(self) -> None:
        while not self._stopping:
            try:
                self._connect_and_serve()
            except Exception as exc:  # a bug or a failing flash must not end the thread
                _log.exception("device SDK thread: unexpected error; reconnecting")
                with self._lock:
                    self._last_error = f"unexpected: {exc!r}"
                self._wake.wait(self._backoff.next_delay())

    def _connect_and_serve(self) -> None:
        while not self._stopping:
            self._maybe_heartbeat()
            try:
                link = self._connector.connect(self.client_id, self.settings.connect_timeout_s)
            except BrokerError as exc:
                with self._lock:
                    self._connect_failures += 1
                    self._last_error = str(exc)
                self._wake.wait(self._backoff.next_delay())
                continue
            with self._lock:
                self._connected = True
                self._connects += 1
                self._last_error = None
            self._backoff.connected(self._clock.monotonic())
            try:
                self._serve(link)
            finally:
                link.close()
                with self._changed:
                    self._connected = False
                    self._buffer.requeue()
                    self._changed.notify_all()
                self._backoff.disconnected(self._clock.monotonic())
            if not self._stopping:
                self._wake.wait(self._backoff.next_delay())

    def _serve(self, link: Link) -> None:
        """Publish and take acks until the link is lost, an ack is late, or close()."""
        link.subscribe([self._topics[CONFIG], self._topics[TIME]])
        in_flight: dict[int, tuple[str, float]] = {}  # packet id -> (message id, sent at)
        while not self._stopping:
            self._maybe_heartbeat()
            now_mono = self._clock.monotonic()
            with self._lock:
                room = self.settings.max_inflight - len(in_flight)
                batch = self._buffer.take(room, self._clock.time()) if room > 0 else []
            try:
                for message in batch:
                    packet_id = link.publish(message.topic, message.payload)
                    in_flight[packet_id] = (message.message_id, now_mono)
            except BrokerError as exc:
                self._last_error = str(exc)
                return
            for event in link.poll(self.settings.poll_interval_s):
                if isinstance(event, Acked):
                    entry = in_flight.pop(event.packet_id, None)
                    if entry is not None:
                        with self._changed:
                            if event.refused:
                                self._buffer.refuse(entry[0])
                            else:
                                self._buffer.ack(entry[0])
                            self._changed.notify_all()
                elif isinstance(event, Lost):
                    self._last_error = event.reason
                    return
                else:
                    self._on_node_message(event.topic, event.payload)
            oldest = min((sent for _, sent in in_flight.values()), default=None)
            late = oldest is not None and now_mono - oldest > self.settings.ack_timeout_s
            if late:
                self._last_error = f"no PUBACK within {self.settings.ack_timeout_s}s"
                return

    def _maybe_heartbeat(self) -> None:
        now = self._clock.monotonic()
        if now >= self._next_heartbeat_mono:
            self._next_heartbeat_mono = now + self.settings.heartbeat_interval_s
            with contextlib.suppress(ClientClosedError):  # close() came first
                self.publish_heartbeat()

    def _on_node_message(self, topic: str, payload: bytes) -> None:
        received_us = int(self._clock.time() * 1e6)
        try:
            envelope = device_pb2.NodeEnvelope.FromString(payload)
        except DecodeError:
            envelope = None
        if envelope is None or envelope.protocol_version != PROTOCOL_VERSION:
            with self._lock:
                self._bad_node_messages += 1
            return
        body = envelope.WhichOneof("body")
        if body == "config" and topic == self._topics[CONFIG]:
            applied = SourceConfig.from_proto(envelope.config)
            with self._lock:
                if applied.version <= self._source.version:
                    return  # a replay of the retained config, or an older one
                self._source = applied
            _log.info("device config %s applied: %s", applied.version, applied)
            if self._on_config is not None:
                self._on_config(applied)
        elif body == "time_sync" and topic == self._topics[TIME]:
            sync = envelope.time_sync
            with self._lock:
                self._estimator.add(
                    device_sent_us=sync.device_sent_at.ToMicroseconds(),
                    node_received_us=sync.node_received_at.ToMicroseconds(),
                    node_sent_us=envelope.sent_at.ToMicroseconds(),
                    device_received_us=received_us,
                )
