"""Issue 14 §3: the SDK's file ring across a device reboot, end to end to the node.

A camera runs as a process of its own (`camera_process`) with a file ring, publishing to
a PRIVATE Mosquitto, with the node's real `DeviceGateway` on the other side:

1. broker up: the camera's first boot sends 5 results, acked, to the gateway;
2. the broker is killed (SIGKILL, its PID) and so is that boot; the next boot, with the
   broker still down, buffers 15 more on flash;
3. that boot is SIGKILLed (its PID: a power cut, nothing closed) and the camera started
   again with the same ring: the 15 results read back from flash (heartbeats beside them);
4. the broker comes back (the same port and persistence file).

Every result arrives exactly once as an observation (the gateway's id memory drops any
copy the ring sends again), under the message ids the first boot printed.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from edge_node.aggregation.model import Observation
from edge_node.devices.config import CameraSettings, DeviceGatewayConfig
from edge_node.devices.gateway import DeviceGateway
from tests.mqtt_support import BrokerFactory, broker_factory  # noqa: F401

REPO = Path(__file__).resolve().parents[3]
DEVICE = "cam-ring"


def eventually(condition: Callable[[], bool], what: str, timeout_s: float = 15.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"waited {timeout_s:.0f} s for {what}"
        time.sleep(0.02)


class Camera:
    """One boot of the camera process; its stdout lines read on a thread."""

    def __init__(self, port: int, ring: Path, first: int, count: int) -> None:
        self.lines: list[str] = []
        self._lock = threading.Lock()
        self.proc = subprocess.Popen(
            [
                *(sys.executable, "-m", "tests.edge_node.devices.camera_process"),
                *(str(port), DEVICE, str(ring), str(first), str(count)),
            ],
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            with self._lock:
                self.lines.append(line.rstrip("\n"))

    def seen(self) -> list[str]:
        with self._lock:
            return list(self.lines)

    def ids(self) -> dict[int, str]:
        return {int(p[1]): p[2] for p in (s.split() for s in self.seen()) if p[0] == "id"}

    def queued(self) -> int | None:
        last = [s for s in self.seen() if s.startswith("queued ")]
        return int(last[-1].split()[1]) if last else None

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=10)
        self._reader.join(5)


@pytest.fixture
def cameras() -> Iterator[list[Camera]]:
    started: list[Camera] = []
    try:
        yield started
    finally:
        for camera in started:
            camera.kill()


def test_buffered_results_survive_a_broker_outage_and_a_camera_sigkill_exactly_once(
    tmp_path: Path,
    broker_factory: BrokerFactory,  # noqa: F811
    cameras: list[Camera],
) -> None:
    broker = broker_factory()
    lock = threading.Lock()
    observations: list[Observation] = []

    def observed(observation: Observation) -> None:
        with lock:
            observations.append(observation)

    def by_frame() -> dict[int, list[str]]:
        with lock:
            out: dict[int, list[str]] = {}
            for o in observations:
                out.setdefault(o.frame_seq, []).append(o.observation_id)
            return out

    config = DeviceGatewayConfig(
        cameras={DEVICE: CameraSettings()},
        port=broker.port,
        client_id="gw-ring",
        session_expiry_s=600,  # the broker keeps the gateway's session across its restart
    )
    gateway = DeviceGateway(config, observed)
    ring = tmp_path / "ring"
    try:
        gateway.start()
        assert gateway.wait_ready(10)
        # 1. Broker up: the first boot's first 5 results arrive.
        first = Camera(broker.port, ring, 0, 5)
        cameras.append(first)
        eventually(lambda: len(by_frame()) == 5, "the first 5 results")
        eventually(lambda: first.queued() == 0, "the first 5 acked")
        broker.wait_for_save()  # the gateway's session is on the broker's disk
        # 2. The broker dies, and the camera reboots; the next boot buffers 15 on flash.
        broker.kill()
        first.kill()
        second = Camera(broker.port, ring, 5, 15)
        cameras.append(second)
        eventually(lambda: "buffered" in second.seen(), "15 results buffered with no broker")
        eventually(lambda: (second.queued() or 0) >= 15, "15 results queued")
        # 3. Power cut: SIGKILL while the broker is still down; the next boot has only
        # its flash. It reads back the 15 (none was ever acked).
        second.kill()
        third = Camera(broker.port, ring, 0, 0)
        cameras.append(third)
        eventually(lambda: (third.queued() or 0) >= 15, "the 15 read back from the ring")
        # 4. The broker comes back: everything arrives, once.
        broker.start()
        eventually(lambda: len(by_frame()) == 20, "all 20 results at the gateway", 20)
        eventually(lambda: third.queued() == 0, "the ring drained")
        time.sleep(0.5)  # a copy sent again would have arrived by now
    finally:
        gateway.stop(2)

    frames = by_frame()
    assert sorted(frames) == list(range(20))
    assert all(len(ids) == 1 for ids in frames.values()), frames  # exactly once each
    printed = {**first.ids(), **second.ids()}
    assert {seq: ids[0] for seq, ids in frames.items()} == printed  # the SDK's ids kept
    health = gateway.health()
    assert health["accepted"]["results"] == 20
    assert sum(health["rejected"].values()) == health["rejected"]["duplicate"]
