"""A really full data-dir filesystem under `python -m edge_node run` (issue 12 §4).

The issue's outage: with the data dir's filesystem full, the journal write that ends the
watch window failed with ENOSPC, the agent exited, and every restart exited again at once
(then reverted the healthy model as `restarted-on-watch`). test_update_task_failures.py
simulates the full disk inside one process; here the data dir is a small tmpfs filled to
the last byte by a filler file, and the agent is a real process: it stays up and serving
through the end of its watch window, says `disk-full`, a restart on the still-full disk
serves the same model and blames nothing on it, and once the filler goes the journal
follows on its own (no reconnect, no new pin).

Mounting a tmpfs needs root (CAP_SYS_ADMIN); elsewhere the test is skipped.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest

from control_plane.services import ServiceConfig
from edge_node.updater.journal import ModelRef, Phase
from tests.edge_node.agent.test_kill_at_every_phase import (
    agent_process,
    journal,
    stop,
    write_config,
)
from tests.edge_node.agent.update_support import fleet_plane, target_path, until

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

_TMPFS_BYTES = 48 << 20
WINDOW_S = 6.0


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def small_fs(tmp_path: Path) -> Iterator[Path]:
    """A 48 MiB tmpfs mounted on `tmp_path/node` (skips where mounting is not allowed)."""
    mount_point = tmp_path / "node"
    mount_point.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={_TMPFS_BYTES},mode=0700", "tmpfs", str(mount_point)],
        capture_output=True,
        check=False,
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode(errors='replace').strip()}")
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", "-l", str(mount_point)], check=False)


def fill(mount_point: Path) -> Path:
    """Write a filler file until the filesystem refuses a byte; return its path."""
    filler = mount_point / "filler"
    chunk = b"\0" * (1 << 20)
    with filler.open("wb", buffering=0) as out:
        with contextlib.suppress(OSError):
            for _ in range(_TMPFS_BYTES >> 20):
                out.write(chunk)
        for size in (4096, 512, 1):  # the last pages
            with contextlib.suppress(OSError):
                while True:
                    out.write(b"\0" * size)
    with pytest.raises(OSError) as full:
        (mount_point / "probe").write_bytes(b"x" * 4096)
    assert full.value.errno == errno.ENOSPC
    return filler


async def test_a_full_data_dir_filesystem_never_stops_the_agent_nor_costs_the_model(
    tmp_path: Path, sqlite_url: str, small_fs: Path
) -> None:
    data = tmp_path / "server"
    service = ServiceConfig(
        data_dir=data,
        database_url=sqlite_url,
        artifacts_url=(data / "artifacts").as_uri(),
        refresh_interval_s=3600,
    )
    data_dir = small_fs
    log = tmp_path / "agent.log"
    async with fleet_plane(service, tmp_path / "ops") as fp:
        model = ModelRef(target_path("1.0.0"), fp.sha256["1.0.0"])
        config = write_config(
            fp,
            tmp_path,
            updater={
                "selftest_latency_budget_ms": 5000,
                "retry_initial_s": 0.5,
                "retry_max_s": 2,
                "watchdog": {"window_s": WINDOW_S, "max_errors": 3},
                "space_margin_mb": 1,  # the store's margin, on a 48 MiB disk
            },
            outbox_budget_mb=8,
        )

        def statuses() -> list[dict[str, object]]:
            return [s for s in fp.statuses.of(node_id) if s["target_path"] == model.path]

        async with agent_process(config, log, "--bootstrap-token", fp.token()) as agent:
            identity = data_dir / "identity.json"
            await until(identity.exists, timeout=30)
            node_id = json.loads(identity.read_text())["node_id"]
            await until(lambda: fp.services.nodes.inventory.get_node(node_id).online, timeout=30)
            await fp.pin(node_id, "1.0.0")
            await until(
                lambda: any(str(s["detail"]).startswith("on watch until") for s in statuses()),
                timeout=30,
            )
            # On watch: the disk fills up before the window ends.
            filler = fill(data_dir)
            await until(
                lambda: any(s["reason"] == "disk-full" for s in statuses()), timeout=WINDOW_S + 20
            )
            full = next(s for s in statuses() if s["reason"] == "disk-full")
            assert full["phase"] == "active", full
            assert "journal cannot be written" in str(full["detail"]), full
            await anyio.sleep(2)  # its timer tries the journal again, the disk still full
            assert agent.returncode is None, log.read_text()
            assert journal(data_dir).probation is not None  # the disk still says on watch
            assert await stop(agent) == 0, log.read_text()  # a clean stop, even so

        # A restart on the still-full disk serves the same model and blames nothing on it.
        since, logged = len(statuses()), len(log.read_text())
        store = data_dir / "models" / "sha256" / model.sha256 / "model.onnx"

        def serving() -> bool:
            return any(
                "serving model" in line and f"from {store}" in line
                for line in log.read_text()[logged:].splitlines()
            )

        async with agent_process(config, log) as again:
            await until(serving, timeout=30)
            await anyio.sleep(2)
            assert again.returncode is None, log.read_text()
            assert "reverted" not in [s["phase"] for s in statuses()[since:]], statuses()
            # Room again: the journal follows on the agent's own timer.
            filler.unlink()
            await until(lambda: journal(data_dir).probation is None, timeout=30)
            assert await stop(again) == 0, log.read_text()
        state = journal(data_dir)
        assert (state.active, state.failed, state.phase) == (model, None, Phase.IDLE)
        assert "reverted" not in [s["phase"] for s in statuses()]
