"""`edgefleet server`: settings for the gRPC link, and a real process that serves REST and
gRPC in one event loop and stops both on SIGTERM.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

import grpc
import httpx
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from control_plane.errors import InvalidInputError
from control_plane.settings import ServerSettings
from tests.conftest import free_port, wait_for_port


def test_grpc_is_off_unless_configured(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("EDGEFLEET_GRPC", raising=False)
    assert ServerSettings().grpc_link_config() is None


def test_grpc_settings_split_names_from_addresses(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EDGEFLEET_GRPC", "0.0.0.0:50051")
    monkeypatch.setenv("EDGEFLEET_GRPC_ENROLL", "0.0.0.0:50052")
    monkeypatch.setenv("EDGEFLEET_GRPC_HOSTNAMES", "cp.example.com, 10.0.0.5,::1")
    config = ServerSettings().grpc_link_config()
    assert config is not None
    assert (config.node_address, config.enroll_address) == ("0.0.0.0:50051", "0.0.0.0:50052")
    assert config.hostnames == ("cp.example.com",)
    assert config.ips == ("10.0.0.5", "::1")


@pytest.mark.parametrize(
    "values",
    [{"grpc": "nope"}, {"grpc_enroll": "127.0.0.1:9"}, {"grpc": "127.0.0.1:0", "grpc_enroll": "x"}],
)
def test_bad_grpc_settings_fail_fast(values: dict[str, str]) -> None:
    with pytest.raises(ValueError, match="grpc"):
        ServerSettings(**values)  # type: ignore[arg-type]


def test_rollout_webhooks_need_their_secret_file(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("EDGEFLEET_ROLLOUT_WEBHOOKS", "https://chat.example/a, https://pager/b")
    monkeypatch.delenv("EDGEFLEET_ROLLOUT_WEBHOOK_SECRET_FILE", raising=False)
    with pytest.raises(InvalidInputError, match="SECRET_FILE"):
        ServerSettings().webhook_config()
    secret = tmp_path / "hook.key"
    secret.write_text("0123456789abcdef0123\n")
    monkeypatch.setenv("EDGEFLEET_ROLLOUT_WEBHOOK_SECRET_FILE", str(secret))
    config = ServerSettings().webhook_config()
    assert config is not None
    assert config.urls == ("https://chat.example/a", "https://pager/b")
    assert config.secret == b"0123456789abcdef0123"
    monkeypatch.setenv("EDGEFLEET_ROLLOUT_INTERVAL_S", "5")
    assert ServerSettings().rollout_config().interval_s == 5.0


def test_the_gates_evaluation_interval_is_a_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    assert ServerSettings().rollout_config().evaluation_interval == timedelta(minutes=1)
    monkeypatch.setenv("EDGEFLEET_ROLLOUT_EVALUATION_INTERVAL_S", "300")
    assert ServerSettings().rollout_config().evaluation_interval == timedelta(minutes=5)
    monkeypatch.setenv("EDGEFLEET_ROLLOUT_EVALUATION_INTERVAL_S", "0.5")
    with pytest.raises(ValueError, match="rollout_evaluation_interval_s"):
        ServerSettings()
    monkeypatch.setenv("EDGEFLEET_ROLLOUT_EVALUATION_INTERVAL_S", "60")
    monkeypatch.setenv("EDGEFLEET_ROLLOUT_INTERVAL_S", "40")
    with pytest.raises(InvalidInputError, match="EDGEFLEET_ROLLOUT_LEASE_S") as bad:
        ServerSettings().rollout_config()
    assert "at least two intervals" in bad.value.message


@pytest.mark.slow
def test_the_server_serves_rest_and_grpc_and_stops_on_sigterm(tmp_path: Path) -> None:
    http, node, enroll = free_port(), free_port(), free_port()
    data = tmp_path / "data"
    env = {**os.environ, "EDGEFLEET_LOG_LEVEL": "warning"}
    env.pop("EDGEFLEET_GRPC", None)
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "control_plane.cli.main",
            "server",
            "--data-dir",
            str(data),
            "--http",
            f"127.0.0.1:{http}",
            "--grpc",
            f"127.0.0.1:{node}",
            "--grpc-enroll",
            f"127.0.0.1:{enroll}",
            "--grpc-hostname",
            "localhost",
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        for port in (http, node, enroll):
            assert wait_for_port(port, timeout=30), proc.stdout.read1() if proc.stdout else ""
        ca_pem = httpx.get(f"http://127.0.0.1:{http}/v1/ca.pem", timeout=10).content
        assert ca_pem == (data / "ca" / "ca.crt").read_bytes()
        with grpc.secure_channel(
            f"127.0.0.1:{enroll}",
            grpc.ssl_channel_credentials(ca_pem),
            options=[("grpc.ssl_target_name_override", "localhost")],
        ) as channel:
            answer = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(), timeout=10
            )
        assert answer.status == health_pb2.HealthCheckResponse.SERVING

        started = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
        assert time.monotonic() - started < 15
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
        if proc.stdout is not None:
            proc.stdout.close()


def test_tune_gc_freezes_the_start_up_heap_and_collects_young_objects_less_often() -> None:
    import gc

    from control_plane.server import GC_YOUNG_THRESHOLD, tune_gc

    def young_collections_while_allocating(count: int) -> int:
        seen: list[int] = []

        def note(phase: str, info: dict[str, int]) -> None:
            if phase == "start" and info["generation"] == 0:
                seen.append(1)

        gc.callbacks.append(note)
        try:
            kept = [[] for _ in range(count)]  # container objects: what the collector counts
        finally:
            gc.callbacks.remove(note)
        del kept
        return len(seen)

    before = gc.get_threshold()
    assert before[0] < 5_000 < GC_YOUNG_THRESHOLD  # the test relies on these
    gc.collect()
    assert young_collections_while_allocating(5_000) >= 2  # CPython's default: every 700
    try:
        tune_gc()
        assert gc.get_freeze_count() > 0
        assert gc.get_threshold() == (GC_YOUNG_THRESHOLD, before[1], before[2])
        assert young_collections_while_allocating(5_000) == 0
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)
