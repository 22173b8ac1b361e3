"""Temperature, CPU frequency and throttling, read from Linux sysfs where the box exposes it.

What it is for: one ``read_thermal(root)`` that walks ``class/thermal/thermal_zone*``
(``type``, ``temp`` in m°C, passive/critical trip points), ``devices/system/cpu/cpu*/
cpufreq`` (kHz) and ``devices/system/cpu/cpu*/thermal_throttle`` (x86 throttle counters)
under ``root`` (``/sys``; tests pass a fake tree). Every file is optional: a box without
them (a VM, a container without /sys) reads as unknown (``None``), never as "cool" or
"not throttled". ``throttling`` turns two readings into a verdict.

What it is not for: other platforms' tools (``vcgencmd`` on a Raspberry Pi, ``tegrastats``
on a Jetson): they are processes, not files, and would need an adapter of their own.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Final

__all__ = ["CpuFreq", "ThermalReading", "ThermalZone", "read_thermal", "throttling"]

MAX_ZONES: Final = 32
MAX_CPUS: Final = 1024
_ZONE: Final = re.compile(r"^thermal_zone(\d+)$")
_CPU: Final = re.compile(r"^cpu(\d+)$")
_TRIP_TYPE: Final = re.compile(r"^trip_point_(\d+)_type$")


@dataclass(frozen=True, slots=True)
class ThermalZone:
    """One zone: its ``type`` (``x86_pkg_temp``, ``cpu-thermal``, …), temperature and the
    lowest passive and critical trip points, in °C (``None`` when not exposed)."""

    name: str
    temp_c: float | None
    passive_c: float | None
    critical_c: float | None

    @property
    def hot(self) -> bool | None:
        """At or over its passive trip point (where the kernel starts to throttle)."""
        if self.temp_c is None or self.passive_c is None:
            return None
        return self.temp_c >= self.passive_c


@dataclass(frozen=True, slots=True)
class CpuFreq:
    """CPU frequency over the CPUs that expose cpufreq, in kHz.

    ``current_khz``: mean of ``scaling_cur_freq``; ``lowest_khz``: the slowest CPU;
    ``limit_khz``: the lowest ``scaling_max_freq`` (the policy cap, which a thermal governor
    may lower); ``hardware_max_khz``: the highest ``cpuinfo_max_freq``.
    """

    cpus: int
    current_khz: int
    lowest_khz: int
    limit_khz: int | None
    hardware_max_khz: int | None


@dataclass(frozen=True, slots=True)
class ThermalReading:
    zones: tuple[ThermalZone, ...]
    cpu_freq: CpuFreq | None
    throttle_count: int | None
    """Sum of ``core_throttle_count`` and ``package_throttle_count`` over CPUs (x86)."""

    @property
    def max_temp_c(self) -> float | None:
        temps = [zone.temp_c for zone in self.zones if zone.temp_c is not None]
        return max(temps) if temps else None

    @property
    def hot(self) -> bool | None:
        """Any zone at or over its passive trip; ``None`` when no zone tells."""
        verdicts = [zone.hot for zone in self.zones if zone.hot is not None]
        return any(verdicts) if verdicts else None


def read_thermal(root: Path = Path("/sys")) -> ThermalReading:
    """Read what ``root`` exposes; missing or unreadable files read as ``None``."""
    return ThermalReading(
        zones=_zones(root / "class" / "thermal"),
        cpu_freq=_cpu_freq(root / "devices" / "system" / "cpu"),
        throttle_count=_throttle_count(root / "devices" / "system" / "cpu"),
    )


def throttling(previous: ThermalReading | None, current: ThermalReading) -> bool | None:
    """``True`` when the throttle counters rose since ``previous`` or a zone is at its
    passive trip; ``False`` when the box exposes either and neither holds; ``None``
    (unknown) when it exposes neither."""
    rose: bool | None = None
    if current.throttle_count is not None:
        before = previous.throttle_count if previous is not None else None
        rose = before is not None and current.throttle_count > before
    hot = current.hot
    if rose is None and hot is None:
        return None
    return bool(rose) or bool(hot)


def _numbered(directory: Path, pattern: re.Pattern[str], limit: int) -> list[Path]:
    try:
        entries = [
            (match, entry) for entry in directory.iterdir() if (match := pattern.match(entry.name))
        ]
    except OSError:
        return []
    entries.sort(key=lambda pair: int(pair[0].group(1)))
    return [entry for _, entry in entries[:limit]]


def _read_text(path: Path) -> str | None:
    try:
        return path.read_text(encoding="ascii", errors="replace").strip()
    except OSError:
        return None


def _read_int(path: Path) -> int | None:
    text = _read_text(path)
    if text is None:
        return None
    try:
        return int(text)
    except ValueError:
        return None


def _millicelsius(path: Path) -> float | None:
    value = _read_int(path)
    return None if value is None else value / 1000.0


def _zones(thermal: Path) -> tuple[ThermalZone, ...]:
    zones = []
    for zone in _numbered(thermal, _ZONE, MAX_ZONES):
        passive: list[float] = []
        critical: list[float] = []
        for trip in _numbered(zone, _TRIP_TYPE, 64):
            kind = _read_text(trip)
            temp = _millicelsius(zone / trip.name.replace("_type", "_temp"))
            if temp is None or temp <= 0:  # 0 or negative: an unused trip slot
                continue
            if kind == "passive":
                passive.append(temp)
            elif kind in ("critical", "hot"):
                critical.append(temp)
        zones.append(
            ThermalZone(
                name=(_read_text(zone / "type") or zone.name)[:64],
                temp_c=_millicelsius(zone / "temp"),
                passive_c=min(passive) if passive else None,
                critical_c=min(critical) if critical else None,
            )
        )
    return tuple(zones)


def _cpu_freq(cpus: Path) -> CpuFreq | None:
    current: list[int] = []
    limits: list[int] = []
    hardware: list[int] = []
    for cpu in _numbered(cpus, _CPU, MAX_CPUS):
        freq = cpu / "cpufreq"
        cur = _read_int(freq / "scaling_cur_freq")
        if cur is None or cur <= 0:
            continue
        current.append(cur)
        limit = _read_int(freq / "scaling_max_freq")
        if limit is not None and limit > 0:
            limits.append(limit)
        top = _read_int(freq / "cpuinfo_max_freq")
        if top is not None and top > 0:
            hardware.append(top)
    if not current:
        return None
    return CpuFreq(
        cpus=len(current),
        current_khz=round(sum(current) / len(current)),
        lowest_khz=min(current),
        limit_khz=min(limits) if limits else None,
        hardware_max_khz=max(hardware) if hardware else None,
    )


def _throttle_count(cpus: Path) -> int | None:
    total: int | None = None
    for cpu in _numbered(cpus, _CPU, MAX_CPUS):
        for name in ("core_throttle_count", "package_throttle_count"):
            value = _read_int(cpu / "thermal_throttle" / name)
            if value is not None:
                total = (total or 0) + value
    return total
