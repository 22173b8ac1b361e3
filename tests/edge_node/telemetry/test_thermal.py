"""Temperature, cpufreq and throttling from a fake sysfs tree, missing files included."""

from __future__ import annotations

from pathlib import Path

import pytest

from edge_node.telemetry.thermal import read_thermal, throttling


def write(root: Path, relative: str, text: str) -> None:
    path = root / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text + "\n")


def zone(
    root: Path,
    index: int,
    kind: str | None,
    temp_mc: int | str | None,
    trips: dict[int, tuple[str, int]],
) -> None:
    base = f"class/thermal/thermal_zone{index}"
    (root / base).mkdir(parents=True, exist_ok=True)
    if kind is not None:
        write(root, f"{base}/type", kind)
    if temp_mc is not None:
        write(root, f"{base}/temp", str(temp_mc))
    for number, (trip_type, trip_mc) in trips.items():
        write(root, f"{base}/trip_point_{number}_type", trip_type)
        write(root, f"{base}/trip_point_{number}_temp", str(trip_mc))


def cpu(root: Path, index: int, cur: int | None, limit: int | None, top: int | None) -> None:
    base = f"devices/system/cpu/cpu{index}/cpufreq"
    (root / base).mkdir(parents=True, exist_ok=True)
    for name, value in (
        ("scaling_cur_freq", cur),
        ("scaling_max_freq", limit),
        ("cpuinfo_max_freq", top),
    ):
        if value is not None:
            write(root, f"{base}/{name}", str(value))


def throttle(root: Path, index: int, core: int, package: int | None = None) -> None:
    base = f"devices/system/cpu/cpu{index}/thermal_throttle"
    write(root, f"{base}/core_throttle_count", str(core))
    if package is not None:
        write(root, f"{base}/package_throttle_count", str(package))


@pytest.fixture
def pi_like(tmp_path: Path) -> Path:
    """A board like a Raspberry Pi 4: one CPU zone with a passive trip, cpufreq, no counters."""
    zone(tmp_path, 0, "cpu-thermal", 61_300, {0: ("passive", 80_000), 1: ("critical", 90_000)})
    zone(tmp_path, 1, "gpu-thermal", 58_000, {})
    for index in range(4):
        cpu(tmp_path, index, 1_500_000, 1_500_000, 1_800_000)
    return tmp_path


def test_a_full_tree_reads_zones_frequencies_and_trip_points(pi_like: Path) -> None:
    reading = read_thermal(pi_like)
    assert [z.name for z in reading.zones] == ["cpu-thermal", "gpu-thermal"]
    assert reading.zones[0].temp_c == pytest.approx(61.3)
    assert (reading.zones[0].passive_c, reading.zones[0].critical_c) == (80.0, 90.0)
    assert reading.zones[1].passive_c is None and reading.zones[1].hot is None
    assert reading.max_temp_c == pytest.approx(61.3)
    assert reading.hot is False
    assert reading.cpu_freq is not None
    assert reading.cpu_freq.cpus == 4
    assert reading.cpu_freq.current_khz == 1_500_000
    assert reading.cpu_freq.limit_khz == 1_500_000
    assert reading.cpu_freq.hardware_max_khz == 1_800_000
    assert reading.throttle_count is None
    assert throttling(None, reading) is False


def test_a_zone_at_its_passive_trip_is_throttling(pi_like: Path) -> None:
    zone(pi_like, 0, "cpu-thermal", 80_500, {0: ("passive", 80_000)})
    reading = read_thermal(pi_like)
    assert reading.hot is True
    assert throttling(None, reading) is True


def test_x86_throttle_counters_throttle_when_they_rise(tmp_path: Path) -> None:
    zone(tmp_path, 0, "x86_pkg_temp", 45_000, {})  # no trip points: temperature alone says nothing
    for index in range(2):
        cpu(tmp_path, index, 2_100_000, 3_000_000, 3_000_000)
        throttle(tmp_path, index, core=3, package=7)
    first = read_thermal(tmp_path)
    assert first.throttle_count == 20
    assert throttling(None, first) is False  # nothing to compare with yet
    assert throttling(first, read_thermal(tmp_path)) is False
    throttle(tmp_path, 1, core=5, package=7)
    second = read_thermal(tmp_path)
    assert throttling(first, second) is True


def test_nothing_exposed_reads_as_unknown(tmp_path: Path) -> None:
    for root in (tmp_path, tmp_path / "no-such-dir"):
        reading = read_thermal(root)
        assert reading.zones == ()
        assert reading.cpu_freq is None
        assert reading.throttle_count is None
        assert reading.max_temp_c is None and reading.hot is None
        assert throttling(None, reading) is None
        assert throttling(reading, reading) is None


def test_missing_and_garbled_files_read_as_none(tmp_path: Path) -> None:
    zone(tmp_path, 0, None, None, {})  # a zone directory with nothing in it
    zone(tmp_path, 2, "soc", "not-a-number", {0: ("passive", 0), 1: ("passive", 70_000)})
    zone(tmp_path, 10, "board", 30_000, {0: ("active", 50_000)})
    (tmp_path / "class/thermal/cooling_device0").mkdir(parents=True)  # not a zone
    cpu(tmp_path, 0, 1_000_000, None, None)
    cpu(tmp_path, 1, None, 2_000_000, 2_000_000)  # no current frequency: not counted
    (tmp_path / "devices/system/cpu/cpufreq").mkdir(parents=True)  # not a cpu
    reading = read_thermal(tmp_path)
    assert [z.name for z in reading.zones] == ["thermal_zone0", "soc", "board"]  # numeric order
    assert reading.zones[0].temp_c is None
    assert reading.zones[1].temp_c is None and reading.zones[1].passive_c == 70.0
    assert reading.zones[2].passive_c is None  # an active trip is a fan, not throttling
    assert reading.max_temp_c == 30.0
    assert reading.hot is None
    assert reading.cpu_freq is not None
    assert (reading.cpu_freq.cpus, reading.cpu_freq.lowest_khz) == (1, 1_000_000)
    assert reading.cpu_freq.limit_khz is None and reading.cpu_freq.hardware_max_khz is None
    assert throttling(None, reading) is None


def test_the_real_sysfs_reads_without_failing() -> None:
    reading = read_thermal()
    assert throttling(reading, read_thermal()) in (True, False, None)
