"""What the operating system says about the node: one ``SystemProbe.sample()`` per call.

What it is for: the adapter between the telemetry core and psutil, the data directory's
filesystem and sysfs. It returns plain numbers (``SystemSample``) and decides nothing;
CPU percentages, the RSS trend and the throttling verdict are worked out from successive
samples by ``Telemetry``. A source that fails (no /sys, a data dir on a vanished mount)
reads as ``None`` rather than failing the health report.

What it is not for: the ONNX Runtime arena (Python's ORT API does not expose it; it is part
of RSS) or other processes than this one.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import psutil

from edge_node.runtime.timing import SystemTicker, Ticker
from edge_node.telemetry.thermal import ThermalReading, read_thermal

__all__ = ["SystemProbe", "SystemSample"]


@dataclass(frozen=True, slots=True)
class SystemSample:
    """One reading. ``monotonic_s`` is on the probe's ticker; CPU seconds are cumulative."""

    monotonic_s: float
    rss_bytes: int
    process_cpu_s: float
    threads: int
    system_memory_total_bytes: int
    system_memory_available_bytes: int
    system_cpu_percent: float | None
    """Mean over all cores since the previous sample; ``None`` on the first."""
    cpu_cores: int
    boot_time_s: float | None
    """Epoch seconds the system booted at."""
    disk_free_bytes: int | None
    disk_total_bytes: int | None
    thermal: ThermalReading


class SystemProbe:
    """Samples this process and the box. Each call does a few syscalls and small file
    reads (well under a millisecond here), so call it from a worker thread, not the loop.

    ``data_dir``: whose filesystem's free space is reported; ``sysfs_root``: where
    ``/sys`` is (tests pass a fake tree); ``process``: the process to watch (this one).
    """

    def __init__(
        self,
        data_dir: Path | None = None,
        *,
        sysfs_root: Path = Path("/sys"),
        process: psutil.Process | None = None,
        ticker: Ticker | None = None,
        thermal_reader: Callable[[Path], ThermalReading] = read_thermal,
    ) -> None:
        self._data_dir = data_dir
        self._sysfs_root = sysfs_root
        self._process = process
        self._ticker = ticker or SystemTicker()
        self._read_thermal = thermal_reader
        self._system_cpu_primed = False

    def sample(self) -> SystemSample:
        process = self._process
        if process is None:
            process = self._process = psutil.Process()
        with process.oneshot():
            memory = process.memory_info()
            times = process.cpu_times()
            threads = process.num_threads()
        system = psutil.virtual_memory()
        system_cpu = psutil.cpu_percent(interval=None)
        primed, self._system_cpu_primed = self._system_cpu_primed, True
        free = total = None
        if self._data_dir is not None:
            try:
                usage = shutil.disk_usage(self._data_dir)
            except OSError:
                pass
            else:
                free, total = usage.free, usage.total
        try:
            boot: float | None = psutil.boot_time()
        except (OSError, RuntimeError):
            boot = None
        return SystemSample(
            monotonic_s=self._ticker.monotonic(),
            rss_bytes=int(memory.rss),
            process_cpu_s=float(times.user + times.system),
            threads=threads,
            system_memory_total_bytes=int(system.total),
            system_memory_available_bytes=int(system.available),
            system_cpu_percent=float(system_cpu) if primed else None,
            cpu_cores=os.cpu_count() or 1,
            boot_time_s=boot,
            disk_free_bytes=free,
            disk_total_bytes=total,
            thermal=self._read_thermal(self._sysfs_root),
        )
