"""The device gateway's settings: the local broker, the cameras this node knows (its
allow-list) with the configuration each is sent, and the bounds on what a camera may send.

`DeviceGatewayConfig.from_mapping` reads the mapping node.yaml will hold under ``devices:``
and names the field at fault (``devices.cameras.cam-a.target_fps: ...``). Pure: no I/O
(file paths are checked for form, not read). Not here: the MQTT client (``gateway``).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from types import MappingProxyType
from typing import Any, Final, Literal

from edge_node.errors import InvalidInputError

__all__ = [
    "DEFAULT_TOPIC_ROOT",
    "CameraSettings",
    "DeviceGatewayConfig",
    "DeviceGatewayConfigError",
    "IntakeLimits",
    "SkipPolicy",
]

# device_sdk.topics.ROOT (a test keeps the two equal).
DEFAULT_TOPIC_ROOT: Final = "edgefleet/dev"
_DEVICE_ID: Final = re.compile(r"[^/+#\x00]{1,128}")
_TOPIC_ROOT: Final = re.compile(r"[^+#\x00]{1,200}")
SkipPolicy = Literal["default", "latest_wins", "even"]
_SKIP_POLICIES: Final = ("default", "latest_wins", "even")


class DeviceGatewayConfigError(InvalidInputError):
    """A device gateway setting cannot be used as written; ``fields["field"]`` names it."""

    title = "invalid device gateway settings"


@dataclass(frozen=True, slots=True)
class CameraSettings:
    """What the node asks one camera to do (device.proto's DeviceConfig, less the
    version, which the gateway stamps): ``target_fps`` 0 is the camera's own rate."""

    target_fps: float = 0.0
    skip_policy: SkipPolicy = "default"
    send_frames: bool = False


@dataclass(frozen=True, slots=True)
class IntakeLimits:
    """Bounds on what a camera may send; each refusal is counted by reason."""

    # A whole MQTT payload (a JPEG frame included).
    max_payload_bytes: int = 1 << 20
    max_detections: int = 500
    # A result's capture time, on the node's clock (the camera's clock estimate applied),
    # may be at most this far ahead of the node's now, or behind it. The SDK keeps results
    # an hour by default (result_ttl_s), so a day back is impossible, not merely late.
    max_future_s: float = 30.0
    max_past_s: float = 24 * 3600.0
    # Per camera: a token bucket of `burst` messages refilled at `rate_per_s`
    # (25 fps of results plus heartbeats and frames fits the default).
    rate_per_s: float = 60.0
    burst: int = 120
    # The message ids remembered to drop a redelivery: at most `dedupe_max_ids`, each for
    # `dedupe_horizon_s` (an hour: the SDK's default result TTL, so a camera's replay
    # after a reboot is recognised).
    dedupe_max_ids: int = 50_000
    dedupe_horizon_s: float = 3600.0

    def __post_init__(self) -> None:
        for name in ("max_payload_bytes", "max_detections", "burst", "dedupe_max_ids"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise DeviceGatewayConfigError(
                    f"limits.{name}: must be a positive integer (got {value!r})",
                    field=f"limits.{name}",
                )
        for name in ("max_future_s", "max_past_s", "rate_per_s", "dedupe_horizon_s"):
            value = getattr(self, name)
            if not _positive_number(value):
                raise DeviceGatewayConfigError(
                    f"limits.{name}: must be a positive number (got {value!r})",
                    field=f"limits.{name}",
                )


_NO_CAMERAS: Final[Mapping[str, CameraSettings]] = MappingProxyType({})


@dataclass(frozen=True, slots=True)
class DeviceGatewayConfig:
    """The local broker (MQTT 5) and the cameras. ``cameras`` is the allow-list: a
    message from any other device id is counted ``unknown_device`` and dropped (the broker
    authenticates devices; this is the node's own list of whom it aggregates)."""

    cameras: Mapping[str, CameraSettings] = field(default_factory=lambda: _NO_CAMERAS)
    host: str = "127.0.0.1"
    port: int = 1883
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    # TLS: `tls` (the system's CAs) or `ca_file`; `cert_file` + `key_file` for a client cert.
    tls: bool = False
    ca_file: Path | None = None
    cert_file: Path | None = None
    key_file: Path | None = None
    # A persistent session (the broker keeps the cameras' messages while the node is
    # away for up to `session_expiry_s`); the client id must then be the node's own.
    client_id: str = "edgefleet-device-gateway"
    session_expiry_s: int = 3600
    keepalive_s: int = 30
    connect_timeout_s: float = 10.0
    topic_root: str = DEFAULT_TOPIC_ROOT
    # Messages taken from the broker and not yet processed (QoS 1 acks wait for them).
    max_queue: int = 1000
    # MQTT 5 flow control: the most unacked QoS 1 messages the broker may send at once
    # (the CONNECT's Receive Maximum; at most `max_queue` is sent). A full queue makes
    # paho's thread wait for room, at most half the keepalive; what still finds no room
    # is left unacked (`deferred`) for the broker to send again (ADR 0041).
    receive_maximum: int = 100
    limits: IntakeLimits = field(default_factory=IntakeLimits)

    def __post_init__(self) -> None:
        object.__setattr__(self, "cameras", MappingProxyType(dict(self.cameras)))
        for device_id in self.cameras:
            if _DEVICE_ID.fullmatch(device_id) is None:
                raise _fail("cameras", "a device id is one MQTT topic level", device_id)
        if not (isinstance(self.port, int) and 0 < self.port < 65536):
            raise _fail("port", "must be a TCP port", self.port)
        if not self.host:
            raise _fail("host", "must be a host name or address", self.host)
        if self.password is not None and self.username is None:
            raise _fail("password", "a password needs a username", "***")
        if (self.cert_file is None) != (self.key_file is None):
            raise _fail("cert_file", "a client certificate needs cert_file and key_file", None)
        if (self.ca_file is not None or self.cert_file is not None) and not self.tls:
            raise _fail("tls", "ca_file and cert_file are for TLS: set tls as well", self.tls)
        if _TOPIC_ROOT.fullmatch(self.topic_root) is None or self.topic_root.endswith("/"):
            raise _fail("topic_root", "must be topic levels without wildcards", self.topic_root)
        if not self.client_id:
            raise _fail("client_id", "must not be empty", self.client_id)
        for name in ("session_expiry_s", "keepalive_s", "max_queue", "receive_maximum"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise _fail(name, "must be a whole number >= 0", value)
        if self.max_queue < 1 or self.keepalive_s < 1:
            raise _fail("max_queue", "max_queue and keepalive_s must be >= 1", self.max_queue)
        if not 1 <= self.receive_maximum <= 65535:
            raise _fail("receive_maximum", "must be 1 to 65535", self.receive_maximum)
        if not _positive_number(self.connect_timeout_s):
            raise _fail("connect_timeout_s", "must be a positive number", self.connect_timeout_s)

    @classmethod
    def from_mapping(cls, raw: object, *, where: str = "devices") -> DeviceGatewayConfig:
        """Parse the settings mapping (node.yaml's ``devices:``); unknown keys are errors."""
        options = _mapping(where, raw)
        known = {f.name for f in fields(cls)}
        _no_unknown(where, options, known)
        values: dict[str, Any] = {}
        for name in ("host", "username", "password", "client_id", "topic_root"):
            if name in options:
                values[name] = _string(f"{where}.{name}", options[name])
        for name in ("port", "session_expiry_s", "keepalive_s", "max_queue", "receive_maximum"):
            if name in options:
                values[name] = _integer(f"{where}.{name}", options[name])
        if "tls" in options:
            values["tls"] = _boolean(f"{where}.tls", options["tls"])
        for name in ("ca_file", "cert_file", "key_file"):
            if options.get(name) is not None:
                values[name] = _path(f"{where}.{name}", options[name])
        if "connect_timeout_s" in options:
            values["connect_timeout_s"] = _number(
                f"{where}.connect_timeout_s", options["connect_timeout_s"]
            )
        if "limits" in options:
            values["limits"] = _limits(f"{where}.limits", options["limits"])
        if "cameras" in options:
            values["cameras"] = _cameras(f"{where}.cameras", options["cameras"])
        try:
            return cls(**values)
        except DeviceGatewayConfigError as exc:
            name = exc.fields.get("field", "")
            raise DeviceGatewayConfigError(
                f"{where}.{exc.message}", field=f"{where}.{name}"
            ) from exc


def _limits(where: str, raw: object) -> IntakeLimits:
    options = _mapping(where, raw)
    _no_unknown(where, options, {f.name for f in fields(IntakeLimits)})
    values: dict[str, Any] = {}
    for f in fields(IntakeLimits):
        if f.name in options:
            parse = _integer if f.type == "int" else _number
            values[f.name] = parse(f"{where}.{f.name}", options[f.name])
    try:
        return IntakeLimits(**values)
    except DeviceGatewayConfigError as exc:
        name = str(exc.fields.get("field", "")).removeprefix("limits.")
        raise DeviceGatewayConfigError(
            exc.message.replace("limits.", f"{where}.", 1), field=f"{where}.{name}"
        ) from exc


def _cameras(where: str, raw: object) -> dict[str, CameraSettings]:
    options = _mapping(where, raw)
    cameras: dict[str, CameraSettings] = {}
    for device_id, settings in options.items():
        here = f"{where}.{device_id}"
        if _DEVICE_ID.fullmatch(device_id) is None:
            raise _fail(here, "a device id is one MQTT topic level (no / + #)", device_id)
        if settings is None:
            cameras[device_id] = CameraSettings()
            continue
        camera = _mapping(here, settings)
        _no_unknown(here, camera, {f.name for f in fields(CameraSettings)})
        fps = _number(f"{here}.target_fps", camera.get("target_fps", 0.0), allow_zero=True)
        skip = camera.get("skip_policy", "default")
        if skip not in _SKIP_POLICIES:
            raise _fail(f"{here}.skip_policy", f"must be one of {', '.join(_SKIP_POLICIES)}", skip)
        frames = _boolean(f"{here}.send_frames", camera.get("send_frames", False))
        cameras[device_id] = CameraSettings(target_fps=fps, skip_policy=skip, send_frames=frames)
    return cameras


# ------------------------------------------------------------------------ field parsers


def _fail(where: str, message: str, value: object) -> DeviceGatewayConfigError:
    return DeviceGatewayConfigError(f"{where}: {message} (got {value!r})", field=where)


def _positive_number(value: object) -> bool:
    return (
        not isinstance(value, bool)
        and isinstance(value, int | float)
        and math.isfinite(value)
        and value > 0
    )


def _mapping(where: str, raw: object) -> Mapping[str, Any]:
    if not isinstance(raw, Mapping) or not all(isinstance(k, str) for k in raw):
        raise _fail(where, "must be a mapping", raw)
    return raw


def _no_unknown(where: str, options: Mapping[str, Any], known: set[str]) -> None:
    unknown = sorted(set(options) - known)
    if unknown:
        raise DeviceGatewayConfigError(
            f"{where}: unknown setting(s) {', '.join(unknown)}", field=f"{where}.{unknown[0]}"
        )


def _string(where: str, value: object) -> str:
    if not isinstance(value, str) or not value:
        raise _fail(
            where, "must be a non-empty string", value if "password" not in where else "***"
        )
    return value


def _integer(where: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise _fail(where, "must be a whole number", value)
    return value


def _number(where: str, value: object, *, allow_zero: bool = False) -> float:
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or value < 0
        or (value == 0 and not allow_zero)
    ):
        raise _fail(where, "must be a number >= 0" if allow_zero else "must be a number > 0", value)
    return float(value)


def _boolean(where: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise _fail(where, "must be true or false", value)
    return value


def _path(where: str, value: object) -> Path:
    if not isinstance(value, str) or not value:
        raise _fail(where, "must be a path", value)
    path = Path(value)
    if not path.is_absolute():
        raise _fail(where, "must be an absolute path", value)
    return path
