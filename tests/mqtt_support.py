"""A private Mosquitto per test: its own config, free loopback port and state directory.

Tests that need passwords and ACLs, or that kill and restart the broker, use this; the
shared broker on 127.0.0.1:1883 is never touched. With no ``mosquitto`` binary a test
skips locally and fails in CI (`missing_service`).
"""

from __future__ import annotations

import getpass
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion

from tests.conftest import free_port, missing_service, wait_for_port

MOSQUITTO = shutil.which("mosquitto") or "/usr/sbin/mosquitto"
# Where Debian (any architecture) and a source install put the dynamic security plugin.
DYNSEC_PLUGIN = next(
    (
        path
        for pattern in ("lib/*/mosquitto_dynamic_security.so", "lib/mosquitto_dynamic_security.so")
        for root in (Path("/usr"), Path("/usr/local"))
        for path in sorted(root.glob(pattern))
    ),
    Path("/usr/lib/x86_64-linux-gnu/mosquitto_dynamic_security.so"),
)


class Broker:
    """One private broker process. `kill()` is SIGKILL; `start()` again reuses the port."""

    def __init__(
        self,
        directory: Path,
        *,
        passwd: Path | None = None,
        acl: Path | None = None,
        persistence: bool = True,
        dynsec: Path | None = None,
        listener: Sequence[str] = (),
        extra: Sequence[str] = (),
    ) -> None:
        """`dynsec`: the dynamic security plugin's state file (no passwd/acl then);
        `listener`: lines for the listener (TLS); `extra`: further lines."""
        self.directory = directory
        self.port = free_port()
        self.passwd = passwd
        self.acl = acl
        self.persistence = persistence
        self.dynsec = dynsec
        self.listener = tuple(listener)
        self.extra = tuple(extra)
        self.proc: subprocess.Popen[bytes] | None = None
        directory.mkdir(parents=True, exist_ok=True)
        self.config = directory / "mosquitto.conf"
        self.log = directory / "mosquitto.log"

    def _write_config(self) -> None:
        secured = self.passwd is not None or self.dynsec is not None
        lines = [
            "per_listener_settings false",
            f"allow_anonymous {'false' if secured else 'true'}",
            f"listener {self.port} 127.0.0.1",
            *self.listener,
            *self.extra,
            "max_queued_messages 100000",
            "log_dest stderr",
            "log_type error",
            "log_type warning",
            "log_type notice",
            "log_type information",
        ]
        if os.geteuid() == 0:
            lines.append(f"user {getpass.getuser()}")  # do not drop to `mosquitto`
        if self.passwd is not None:
            lines.append(f"password_file {self.passwd}")
        if self.acl is not None:
            lines.append(f"acl_file {self.acl}")
        if self.dynsec is not None:
            lines += [f"plugin {DYNSEC_PLUGIN}", f"plugin_opt_config_file {self.dynsec}"]
        if self.persistence:
            lines += [
                "persistence true",
                f"persistence_location {self.directory}/",
                "autosave_interval 1",
            ]
        self.config.write_text("\n".join(lines) + "\n")

    def start(self) -> Broker:
        if not Path(MOSQUITTO).exists():
            missing_service(f"mosquitto ({MOSQUITTO})")
        if self.dynsec is not None and not DYNSEC_PLUGIN.exists():
            missing_service(f"mosquitto's dynamic security plugin ({DYNSEC_PLUGIN})")
        self._write_config()
        log = self.log.open("ab")
        try:
            self.proc = subprocess.Popen(
                [MOSQUITTO, "-c", str(self.config)], stdout=log, stderr=log
            )
        finally:
            log.close()
        if not wait_for_port(self.port, timeout=15):
            self.kill()
            raise RuntimeError(f"mosquitto did not start:\n{self.log_text()}")
        return self

    def kill(self) -> None:
        """SIGKILL: no clean shutdown, no last save of the persistence file."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=10)
        self.proc = None

    def reload(self) -> None:
        """SIGHUP: re-read the password and ACL files."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGHUP)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.kill()
        self.proc = None

    def log_text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def wait_for_save(self, timeout: float = 10.0) -> None:
        """Until the broker next writes its persistence file (autosave runs every second)
        and the write is complete: mosquitto logs "Saving" before it writes
        `mosquitto.db.new`, then renames it over `mosquitto.db`. A SIGKILL between the two
        leaves the previous file (or none, the first time), so wait for the rename.
        """
        database = self.directory / "mosquitto.db"
        written = self.directory / "mosquitto.db.new"

        def identity() -> tuple[int, int] | None:
            try:
                info = database.stat()
            except FileNotFoundError:
                return None
            return info.st_ino, info.st_mtime_ns

        before = identity()
        start = len(self.log_text())
        deadline = time.monotonic() + timeout
        while "Saving in-memory database" not in self.log_text()[start:]:
            if time.monotonic() > deadline:
                raise TimeoutError(f"mosquitto did not save its state:\n{self.log_text()}")
            time.sleep(0.05)
        while written.exists() or identity() in (None, before):
            if time.monotonic() > deadline:
                raise TimeoutError(f"mosquitto did not finish saving:\n{self.log_text()}")
            time.sleep(0.01)


BrokerFactory = Callable[..., Broker]


@pytest.fixture
def broker_factory(tmp_path: Path) -> Iterator[BrokerFactory]:
    """Start private brokers: `broker_factory(passwd=..., acl=..., persistence=...)`."""
    started: list[Broker] = []

    def make(
        *,
        passwd: Path | None = None,
        acl: Path | None = None,
        persistence: bool = True,
        start: bool = True,
        **options: Any,
    ) -> Broker:
        broker = Broker(
            tmp_path / f"broker-{len(started)}",
            passwd=passwd,
            acl=acl,
            persistence=persistence,
            **options,
        )
        started.append(broker)
        return broker.start() if start else broker

    try:
        yield make
    finally:
        for broker in started:
            broker.kill()


def try_connect(port: int, username: str, password: str, timeout: float = 10.0) -> int:
    """The CONNACK reason code a fresh MQTT 5 client gets (0 = accepted)."""
    result: list[int] = []
    client = mqtt.Client(
        CallbackAPIVersion.VERSION2,
        client_id=f"probe-{time.monotonic_ns()}",
        protocol=mqtt.MQTTv5,
        reconnect_on_failure=False,
    )
    client.username_pw_set(username, password)
    client.on_connect = lambda _c, _u, _f, reason, _p: result.append(reason.value)
    client.connect("127.0.0.1", port)
    deadline = time.monotonic() + timeout
    while not result and time.monotonic() < deadline:
        client.loop(0.1)
    client.disconnect()
    if not result:
        raise TimeoutError("no CONNACK")
    return result[0]
