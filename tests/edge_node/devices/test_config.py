"""`DeviceGatewayConfig.from_mapping`: what node.yaml's ``devices:`` will hold, and the
field named when it is wrong."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from device_sdk.topics import ROOT
from edge_node.devices.config import (
    DEFAULT_TOPIC_ROOT,
    CameraSettings,
    DeviceGatewayConfig,
    DeviceGatewayConfigError,
    IntakeLimits,
)


def test_a_full_mapping() -> None:
    config = DeviceGatewayConfig.from_mapping(
        {
            "host": "broker.local",
            "port": 8883,
            "username": "node-1",
            "password": "s3cret",
            "tls": True,
            "ca_file": "/etc/edgefleet/ca.pem",
            "client_id": "node-1-devices",
            "session_expiry_s": 600,
            "limits": {"rate_per_s": 30, "burst": 60, "max_future_s": 10},
            "cameras": {
                "cam-a": {"target_fps": 12, "skip_policy": "even", "send_frames": True},
                "cam-b": None,
            },
        }
    )
    assert config.host == "broker.local" and config.port == 8883 and config.tls
    assert config.ca_file == Path("/etc/edgefleet/ca.pem")
    assert config.limits == IntakeLimits(rate_per_s=30.0, burst=60, max_future_s=10.0)
    assert dict(config.cameras) == {
        "cam-a": CameraSettings(target_fps=12.0, skip_policy="even", send_frames=True),
        "cam-b": CameraSettings(),
    }
    assert "s3cret" not in repr(config)


def test_the_defaults_are_the_sdks() -> None:
    config = DeviceGatewayConfig.from_mapping({})
    assert config.topic_root == DEFAULT_TOPIC_ROOT == ROOT
    assert (config.host, config.port, config.cameras) == ("127.0.0.1", 1883, {})


@pytest.mark.parametrize(
    ("raw", "field"),
    [
        ({"prot": 1883}, "devices.prot"),
        ({"port": "1883"}, "devices.port"),
        ({"port": 70000}, "devices.port"),
        ({"tls": "yes"}, "devices.tls"),
        ({"ca_file": "ca.pem", "tls": True}, "devices.ca_file"),
        ({"ca_file": "/ca.pem"}, "devices.tls"),
        ({"password": "x"}, "devices.password"),
        ({"topic_root": "edgefleet/+"}, "devices.topic_root"),
        ({"limits": {"burst": 0}}, "devices.limits.burst"),
        ({"limits": {"rate_per_s": -1}}, "devices.limits.rate_per_s"),
        ({"limits": {"per_second": 1}}, "devices.limits.per_second"),
        ({"cameras": ["cam-a"]}, "devices.cameras"),
        ({"cameras": {"cam/a": None}}, "devices.cameras.cam/a"),
        ({"cameras": {"cam-a": {"target_fps": -1}}}, "devices.cameras.cam-a.target_fps"),
        ({"cameras": {"cam-a": {"skip_policy": "odd"}}}, "devices.cameras.cam-a.skip_policy"),
        ({"cameras": {"cam-a": {"fps": 5}}}, "devices.cameras.cam-a.fps"),
        ({"max_queue": 0}, "devices.max_queue"),
        ({"receive_maximum": 0}, "devices.receive_maximum"),
        ({"receive_maximum": 65536}, "devices.receive_maximum"),
    ],
)
def test_a_bad_setting_is_named(raw: dict[str, Any], field: str) -> None:
    with pytest.raises(DeviceGatewayConfigError) as caught:
        DeviceGatewayConfig.from_mapping(raw)
    assert caught.value.fields["field"] == field
    assert str(caught.value).startswith(field.rsplit(".", 1)[0])


def test_not_a_mapping() -> None:
    with pytest.raises(DeviceGatewayConfigError, match="devices: must be a mapping"):
        DeviceGatewayConfig.from_mapping(["host"])
