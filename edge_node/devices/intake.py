"""The device intake: one MQTT message from a camera in, a decision out. Pure.

`DeviceIntake.take(topic, payload, received_at, now)` checks, in this order (cheapest
first, so a flood costs little): the size, the topic (``<root>/<device>/<leaf>``), the
allow-list, the camera's token bucket, then decodes the `DeviceEnvelope` and checks its
protocol version, that its device id is the topic's and its body the topic's leaf, the
content (scores, boxes, detection count, the capture time against the node's clock with
the camera's clock estimate applied) and, last, that its message id is new. A message
that fails is counted under the first reason that fails, per camera, and dropped;
nothing here raises on bad input.

An accepted result becomes an `Observation` (the camera's message id as its id, its
model and version, and the firmware its latest heartbeat named, as provenance). An
accepted heartbeat asks for a `TimeSync` answer and carries the camera's clock offset
(its estimate against this node, once it has one) for the aggregation's aligner.

Not here: MQTT (``gateway``), the encoding of replies (``replies``), the aggregation.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from dataclasses import fields as dataclass_fields
from types import MappingProxyType
from typing import Any, Final

from google.protobuf.message import DecodeError

from device_sdk.proto.edgefleet.device.v1 import device_pb2
from edge_node.aggregation.model import (
    Detection,
    Observation,
    make_box,
    make_detection,
    make_observation,
    make_provenance,
)
from edge_node.devices.config import DeviceGatewayConfig
from edge_node.devices.limits import RecentIds, TokenBucket
from edge_node.devices.replies import PROTOCOL_VERSION

__all__ = ["REASONS", "ClockOffset", "DeviceIntake", "Outcome", "TimeSyncDue"]

REASONS: Final = (
    "oversize",  # payload over max_payload_bytes, or more than max_detections
    "wrong_topic",  # not <root>/<device>/{results,heartbeat,frame}, or a body of another leaf
    "unknown_device",  # not on this node's allow-list
    "rate_limited",  # the camera's token bucket was empty
    # not a DeviceEnvelope, no body or id, a score or box out of range, a text field with
    # a NUL or over 256 characters
    "malformed",
    "protocol_version",  # a protocol_version this node does not know
    "device_mismatch",  # the envelope's device id is not the topic's
    "timestamp_future",  # captured after the node's now + max_future_s
    "timestamp_past",  # captured before the node's now - max_past_s (or never stamped)
    "duplicate",  # a message id already taken (a QoS 1 resend, a reboot replay)
)
_LEAVES: Final = {"results": "frame_result", "heartbeat": "heartbeat", "frame": "frame"}
_SLACK: Final = 1e-6  # float rounding at a box's edge is forgiven, nothing more
_MAX_UNKNOWN_LISTED: Final = 16
_MAX_VERSION: Final = 2**64 - 1  # DeviceConfig.version is a uint64
# A camera's text that reaches an event (its message id as the evidence's observation id,
# class names, model, version, firmware, attributes): the control plane's event store
# refuses a whole event over one NUL or a field over 256 characters (events.wire), so a
# camera could make every event it takes part in unreadable. Refused here, as malformed.
_MAX_TEXT: Final = 256
_NO_ATTRIBUTES: Final[Mapping[str, str]] = MappingProxyType({})


def _is_text(*values: str) -> bool:
    return all(len(v) <= _MAX_TEXT and "\x00" not in v for v in values)


@dataclass(frozen=True, slots=True)
class TimeSyncDue:
    """Answer this heartbeat on ``<root>/<device>/time`` (times in µs, UNIX epoch)."""

    device_id: str
    heartbeat_id: str
    device_sent_at_us: int
    node_received_at_us: int


@dataclass(frozen=True, slots=True)
class ClockOffset:
    """The camera's clock minus the node's, in seconds (its heartbeat's estimate)."""

    device_id: str
    offset_s: float
    error_s: float


@dataclass(frozen=True, slots=True)
class Outcome:
    """What to do with one message: at most one of observation / heartbeat effects."""

    observation: Observation | None = None
    time_sync: TimeSyncDue | None = None
    clock: ClockOffset | None = None
    # The camera reported a config version above the node's: republish its config.
    config_due: str | None = None
    rejected: str | None = None
    # With an observation: its (device id, message id), for `DeviceIntake.forget`.
    key: tuple[str, str] | None = None


_OUTCOME_FIELDS: Final = ("observation", "time_sync", "clock", "config_due", "rejected", "key")
if tuple(f.name for f in dataclass_fields(Outcome)) != _OUTCOME_FIELDS:
    raise TypeError("Outcome's fields changed: change _accepted too")
_OUTCOME_SLOTS: Final = tuple(Outcome.__dict__[name].__set__ for name in _OUTCOME_FIELDS)


def _accepted(
    observation: Observation, key: tuple[str, str], _s: tuple[Any, ...] = _OUTCOME_SLOTS
) -> Outcome:
    """``Outcome(observation=observation, key=key)``, through the slots (the hot path of
    a burst; see `edge_node.aggregation.model.make_box`): the same object."""
    outcome: Outcome = object.__new__(Outcome)
    _s[0](outcome, observation)
    _s[1](outcome, None)
    _s[2](outcome, None)
    _s[3](outcome, None)
    _s[4](outcome, None)
    _s[5](outcome, key)
    return outcome


@dataclass
class _Camera:
    bucket: TokenBucket
    config_version: int
    accepted: Counter[str] = field(default_factory=Counter)
    rejected: Counter[str] = field(default_factory=Counter)
    offset_s: float = 0.0
    error_s: float | None = None  # None: no estimate yet (the offset is taken as 0)
    firmware: str = ""
    boot_id: str = ""
    reported_config_version: int = 0
    last_seen: float | None = None  # node clock, UNIX seconds


class DeviceIntake:
    """Decides on each camera message; holds the per-camera state and the counters.

    ``config_version`` is the DeviceConfig version each camera starts with (the gateway
    passes the node's clock in milliseconds at its start: ADR 0041)."""

    def __init__(self, config: DeviceGatewayConfig, *, now: float, config_version: int) -> None:
        self.config = config
        limits = config.limits
        self._prefix = config.topic_root.split("/")
        self._cameras = {
            device_id: _Camera(TokenBucket(limits.rate_per_s, limits.burst, now), config_version)
            for device_id in config.cameras
        }
        self._recent = RecentIds(limits.dedupe_max_ids, limits.dedupe_horizon_s)
        self.messages = 0
        self.accepted: Counter[str] = Counter()
        self.rejected: Counter[str] = Counter({reason: 0 for reason in REASONS})
        self._unknown: dict[str, None] = {}  # the first few unknown device ids, in order

    def config_version(self, device_id: str) -> int:
        return self._cameras[device_id].config_version

    def take(self, topic: str, payload: bytes, received_at: float, now: float) -> Outcome:
        """One message that arrived at `received_at` (node clock, UNIX seconds) and
        `now` (monotonic seconds, for the rate and the id memory)."""
        self.messages += 1
        camera: _Camera | None = None
        device_id = ""
        try:
            if len(payload) > self.config.limits.max_payload_bytes:
                return self._reject("oversize", None)
            parsed = self._parse_topic(topic)
            if parsed is None:
                return self._reject("wrong_topic", None)
            device_id, leaf = parsed
            camera = self._cameras.get(device_id)
            if camera is None:
                if len(self._unknown) < _MAX_UNKNOWN_LISTED:
                    self._unknown[device_id[:64]] = None
                return self._reject("unknown_device", None)
            if not camera.bucket.take(now):
                return self._reject("rate_limited", camera)
            outcome = self._decide(device_id, leaf, camera, payload, received_at, now)
        except (DecodeError, ValueError, OverflowError):
            # Protobuf refuses bytes it cannot parse; ValueError/OverflowError: a
            # Timestamp outside its range. Either way the camera's fault, counted.
            return self._reject("malformed", camera)
        if outcome.rejected is not None:
            return self._reject(outcome.rejected, camera)
        camera.last_seen = received_at
        return outcome

    def forget(self, key: tuple[str, str]) -> None:
        """Take back an accepted observation the node could not process (its message is
        left unacked): its id is forgotten, so the broker's redelivery is taken, not
        refused as a duplicate. Counted ``accepted`` again then, once per delivery."""
        self._recent.forget(key)

    def health(self) -> dict[str, Any]:
        """Counters for the node's health report (JSON-able)."""
        return {
            "messages": self.messages,
            "accepted": dict(self.accepted),
            "rejected": dict(self.rejected),
            "remembered_ids": len(self._recent),
            "ids_evicted_early": self._recent.evicted_early,
            "unknown_devices": list(self._unknown),
            "cameras": {
                device_id: {
                    "accepted": dict(c.accepted),
                    "rejected": dict(c.rejected),
                    "clock_offset_s": c.offset_s if c.error_s is not None else None,
                    "clock_error_s": c.error_s,
                    "firmware": c.firmware,
                    "boot_id": c.boot_id,
                    "config_version": c.config_version,
                    "reported_config_version": c.reported_config_version,
                    "last_seen": c.last_seen,
                }
                for device_id, c in self._cameras.items()
            },
        }

    # --------------------------------------------------------------------- internals

    def _reject(self, reason: str, camera: _Camera | None) -> Outcome:
        self.rejected[reason] += 1
        if camera is not None:
            camera.rejected[reason] += 1
        return Outcome(rejected=reason)

    def _parse_topic(self, topic: str) -> tuple[str, str] | None:
        levels = topic.split("/")
        n = len(self._prefix)
        if len(levels) != n + 2 or levels[:n] != self._prefix:
            return None
        device_id, leaf = levels[n], levels[n + 1]
        if not device_id or leaf not in _LEAVES:
            return None
        return device_id, leaf

    def _decide(
        self,
        device_id: str,
        leaf: str,
        camera: _Camera,
        payload: bytes,
        received_at: float,
        now: float,
    ) -> Outcome:
        envelope = device_pb2.DeviceEnvelope.FromString(payload)
        if envelope.protocol_version != PROTOCOL_VERSION:
            return Outcome(rejected="protocol_version")
        if envelope.device_id != device_id:
            return Outcome(rejected="device_mismatch")
        body = envelope.WhichOneof("body")
        if body is None or not envelope.message_id or not _is_text(envelope.message_id):
            return Outcome(rejected="malformed")
        if body == "heartbeat" and not _is_text(
            envelope.heartbeat.firmware_version, envelope.boot_id
        ):
            return Outcome(rejected="malformed")
        if body != _LEAVES[leaf]:
            return Outcome(rejected="wrong_topic")
        if body == "frame_result":
            observation = self._observation(device_id, camera, envelope, received_at)
            if isinstance(observation, str):
                return Outcome(rejected=observation)
            if self._recent.seen_before((device_id, envelope.message_id), now):
                return Outcome(rejected="duplicate")
            self._accept(camera, "results")
            return _accepted(observation, (device_id, envelope.message_id))
        if self._recent.seen_before((device_id, envelope.message_id), now):
            return Outcome(rejected="duplicate")
        if body == "frame":
            # Edge inference on a camera's frames is not wired yet: taken and counted.
            self._accept(camera, "frames")
            return Outcome()
        self._accept(camera, "heartbeats")
        return self._heartbeat(device_id, camera, envelope, received_at)

    def _accept(self, camera: _Camera, kind: str) -> None:
        self.accepted[kind] += 1
        camera.accepted[kind] += 1

    def _heartbeat(
        self,
        device_id: str,
        camera: _Camera,
        envelope: device_pb2.DeviceEnvelope,
        received_at: float,
    ) -> Outcome:
        beat = envelope.heartbeat
        camera.firmware = beat.firmware_version[:128]
        camera.boot_id = envelope.boot_id[:64]
        camera.reported_config_version = beat.config_version
        clock: ClockOffset | None = None
        if beat.clock.samples > 0:
            camera.offset_s = beat.clock.offset_us / 1e6
            camera.error_s = beat.clock.error_us / 1e6
            clock = ClockOffset(device_id, camera.offset_s, camera.error_s)
        config_due = None
        # Above the node's: its clock went back (a version at the top of uint64 cannot be
        # outbid and is left alone).
        if camera.config_version < beat.config_version < _MAX_VERSION:
            camera.config_version = beat.config_version + 1
            config_due = device_id
        sync = TimeSyncDue(
            device_id=device_id,
            heartbeat_id=envelope.message_id,
            device_sent_at_us=envelope.sent_at.ToMicroseconds(),
            node_received_at_us=round(received_at * 1e6),
        )
        return Outcome(time_sync=sync, clock=clock, config_due=config_due)

    def _observation(
        self,
        device_id: str,
        camera: _Camera,
        envelope: device_pb2.DeviceEnvelope,
        received_at: float,
    ) -> Observation | str:
        """The observation, or the reason it is refused: ``oversize``, then ``malformed``
        text, then the capture time, then ``malformed`` boxes and scores (the first that
        fails, in that order). One pass over the detections (the hot path of a burst)."""
        result = envelope.frame_result
        limits = self.config.limits
        raw = result.detections
        if len(raw) > limits.max_detections:
            return "oversize"
        model, model_version = result.model, result.model_version
        text_ok = (
            len(model) <= _MAX_TEXT
            and len(model_version) <= _MAX_TEXT
            and "\x00" not in model
            and "\x00" not in model_version
        )
        shape_ok = True
        low, high = -_SLACK, 1.0 + _SLACK
        detections: list[Detection] = []
        append = detections.append
        for d in raw:
            class_name = d.class_name
            if len(class_name) > _MAX_TEXT or "\x00" in class_name:
                text_ok = False
                break
            attributes: Mapping[str, str] = _NO_ATTRIBUTES
            if d.attributes:
                attributes = dict(d.attributes)
                if not _is_text(*attributes, *attributes.values()):
                    text_ok = False
                    break
            if not shape_ok:
                continue  # text is still checked: a malformed text is reported first
            b = d.bbox
            x1, y1, x2, y2, score = b.x_min, b.y_min, b.x_max, b.y_max, d.score
            # Chained comparisons are False for NaN, so they refuse non-finite values too.
            if not (
                low <= x1 <= high
                and low <= y1 <= high
                and low <= x2 <= high
                and low <= y2 <= high
                and 0.0 <= score <= 1.0
            ):
                shape_ok = False
                continue
            x1 = 0.0 if x1 < 0.0 else 1.0 if x1 > 1.0 else x1
            y1 = 0.0 if y1 < 0.0 else 1.0 if y1 > 1.0 else y1
            x2 = 0.0 if x2 < 0.0 else 1.0 if x2 > 1.0 else x2
            y2 = 0.0 if y2 < 0.0 else 1.0 if y2 > 1.0 else y2
            if x1 > x2 or y1 > y2:
                shape_ok = False
                continue
            track_id = d.track_id
            append(
                make_detection(
                    class_name,
                    score,
                    make_box(x1, y1, x2, y2),
                    str(track_id) if track_id else None,
                    attributes,
                )
            )
        if not text_ok:
            return "malformed"
        if not result.HasField("captured_at"):
            return "timestamp_past"
        captured_at = result.captured_at.ToMicroseconds() / 1e6
        on_node = captured_at - camera.offset_s
        if on_node > received_at + limits.max_future_s:
            return "timestamp_future"
        if on_node < received_at - limits.max_past_s:
            return "timestamp_past"
        if not shape_ok:
            return "malformed"
        return make_observation(
            device_id,
            envelope.message_id,
            result.frame_seq,
            captured_at,
            tuple(detections),
            make_provenance("device", model, model_version, camera.firmware),
        )
