"""Helpers the benchmarks share: free ports, child processes that always end, RSS watching.

Measurement plumbing only; nothing here knows about edgefleet's domain.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import statistics
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

import psutil

MB = 1_000_000
"""Benchmarks report decimal megabytes (10**6 bytes), as disk and network vendors do."""

REPO_ROOT = Path(__file__).resolve().parent.parent
BENCH_DIR = REPO_ROOT / ".bench"
"""Scratch space (gitignored, removed by ``make clean``)."""


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def median(values: Sequence[float]) -> float:
    return float(statistics.median(values)) if values else float("nan")


def pct(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile, interpolated linearly between the two nearest values (as
    ``numpy.percentile`` does by default); NaN when there are none."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    return float(ordered[low] + (rank - low) * (ordered[high] - ordered[low]))


def wait_http(url: str, timeout_s: float, proc: subprocess.Popen[bytes] | None = None) -> None:
    """Poll ``url`` until it answers 2xx; fail early if ``proc`` exits, late after the timeout."""
    deadline = time.monotonic() + timeout_s
    last: Exception | None = None
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"process {proc.args!r} exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                if 200 <= response.status < 300:
                    return
        except (urllib.error.URLError, OSError) as exc:
            last = exc
        time.sleep(0.1)
    raise TimeoutError(f"{url} did not answer within {timeout_s} s (last error: {last})")


class ChildProcess:
    """A ``Popen`` whose output goes to a log file and which is always ended on exit."""

    def __init__(
        self, args: Sequence[str], *, log: Path, env: Mapping[str, str], cwd: Path | None = None
    ) -> None:
        self.args = list(args)
        self.log = log
        self.env = dict(env)
        self.cwd = cwd
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def __enter__(self) -> ChildProcess:
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with self.log.open("wb") as out:
            self.proc = subprocess.Popen(
                self.args, stdout=out, stderr=subprocess.STDOUT, env=self.env, cwd=self.cwd
            )
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def stop(self, grace_s: float = 10.0) -> None:
        proc = self.proc
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=grace_s)

    def tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


@dataclass(frozen=True, slots=True)
class Measured:
    """One child process run to completion: exit code, wall time, its own peak RSS."""

    returncode: int
    wall_s: float
    max_rss_bytes: int
    output: str


def run_measured(
    args: Sequence[str], *, env: Mapping[str, str], timeout_s: float, log: Path
) -> Measured:
    """Run ``args`` and return its wall time and *its own* peak RSS.

    The peak is the kernel's high-water mark (``VmHWM``) of the child, read every few
    milliseconds while it runs; the mark only rises, so a late read loses nothing but the
    last few milliseconds. ``ru_maxrss`` from ``wait4``/``RUSAGE_CHILDREN`` is no good
    here: Linux seeds it at ``exec`` with the memory of the process that forked, so a
    large benchmark process would appear as the child's peak.
    """
    log.parent.mkdir(parents=True, exist_ok=True)
    peak = 0
    with log.open("wb") as out:
        started = time.perf_counter()
        # Popen returns once the child has exec'd, so every read below is of the new image.
        proc = subprocess.Popen(list(args), stdout=out, stderr=subprocess.STDOUT, env=dict(env))
        deadline = time.monotonic() + timeout_s
        try:
            while True:
                peak = max(peak, _read_hwm(proc.pid) or 0)
                pid, status, _ = os.wait4(proc.pid, os.WNOHANG)
                if pid:
                    wall = time.perf_counter() - started
                    proc.returncode = os.waitstatus_to_exitcode(status)
                    break
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{args!r} ran past {timeout_s} s")
                time.sleep(0.005)
        finally:
            if proc.returncode is None:
                proc.kill()
                proc.wait(timeout=10)
    return Measured(
        returncode=proc.returncode,
        wall_s=wall,
        max_rss_bytes=peak,
        output=log.read_text(errors="replace"),
    )


class RssWatcher:
    """Samples a process's RSS every ``interval_s`` in a thread and keeps the peak.

    ``reset()`` takes a baseline and, where Linux allows (``/proc/PID/clear_refs``),
    also resets the kernel's high-water mark (``VmHWM``), so a spike shorter than the
    sampling interval still counts: the peak is the larger of the sampled and the kernel's.
    """

    def __init__(self, pid: int, interval_s: float = 0.02) -> None:
        self._process = psutil.Process(pid)
        self._pid = pid
        self._interval_s = interval_s
        self._lock = threading.Lock()
        self._baseline = 0
        self._peak = 0
        self._hwm_reset = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"rss-{pid}", daemon=True)

    def __enter__(self) -> RssWatcher:
        self.reset()
        self._thread.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def current(self) -> int:
        try:
            return int(self._process.memory_info().rss)
        except psutil.Error:
            return 0

    def reset(self) -> int:
        """Take the current RSS as the baseline (and the peak so far); return it."""
        self._hwm_reset = _clear_hwm(self._pid)
        rss = self.current()
        with self._lock:
            self._baseline = rss
            self._peak = rss
        return rss

    @property
    def baseline(self) -> int:
        with self._lock:
            return self._baseline

    def peak(self) -> int:
        with self._lock:
            sampled = self._peak
        hwm = _read_hwm(self._pid) if self._hwm_reset else None
        return max(sampled, hwm or 0, self.current())

    def growth(self) -> int:
        return self.peak() - self.baseline

    def _run(self) -> None:
        while not self._stop.wait(self._interval_s):
            rss = self.current()
            with self._lock:
                self._peak = max(self._peak, rss)


def _clear_hwm(pid: int) -> bool:
    with contextlib.suppress(OSError):
        Path(f"/proc/{pid}/clear_refs").write_text("5")
        return True
    return False


def _read_hwm(pid: int) -> int | None:
    with contextlib.suppress(OSError, ValueError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return None


@contextlib.contextmanager
def timed() -> Iterator[list[float]]:
    """``with timed() as t: ...`` then ``t[0]`` holds the elapsed seconds."""
    box: list[float] = []
    started = time.perf_counter()
    try:
        yield box
    finally:
        box.append(time.perf_counter() - started)


# ----------------------------------------------------------------------------- services
# Added for the node-link benchmarks (bench.link_ingest, bench.link_fanout): a throwaway
# PostgreSQL database, a private Mosquitto, CPU pinning. Still nothing about edgefleet.

POSTGRES_ADMIN_URL = os.environ.get(
    "EDGEFLEET_BENCH_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/postgres"
)
"""Where throwaway benchmark databases are created (trust auth on loopback by default)."""


def mosquitto_binary() -> str:
    import shutil

    return shutil.which("mosquitto") or "/usr/sbin/mosquitto"


@contextlib.contextmanager
def throwaway_postgres(
    admin_url: str = POSTGRES_ADMIN_URL, prefix: str = "edgefleet_bench"
) -> Iterator[tuple[str, str]]:
    """A new, randomly named PostgreSQL database, dropped (``WITH (FORCE)``) on exit.

    Yields ``(sqlalchemy_url, database_name)``; the URL uses the psycopg 3 driver.
    """
    import secrets

    import psycopg

    name = f"{prefix}_{secrets.token_hex(6)}"
    with psycopg.connect(admin_url, autocommit=True, connect_timeout=5) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    base = admin_url.rsplit("/", 1)[0].replace("postgresql://", "postgresql+psycopg://", 1)
    try:
        yield f"{base}/{name}", name
    finally:
        with psycopg.connect(admin_url, autocommit=True, connect_timeout=5) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def postgres_backends_cpu_s(database: str) -> float:
    """CPU seconds (user+sys) of the PostgreSQL backends serving ``database`` right now.

    Backends show their database in their process title (``postgres: user db host ...``).
    Backends that ended are not counted, so take both readings while the clients are up.
    """
    total = 0.0
    for proc in psutil.process_iter(["name", "cmdline"]):
        try:
            title = " ".join(proc.info["cmdline"] or [])
            if title.startswith("postgres:") and f" {database} " in f"{title} ":
                times = proc.cpu_times()
                total += times.user + times.system
        except (psutil.Error, TypeError):
            continue
    return total


def can_pin() -> bool:
    """Whether processes can be given a core each: two or more CPUs and Linux affinity."""
    return (os.cpu_count() or 1) >= 2 and hasattr(os, "sched_setaffinity")


def pinned(args: Sequence[str], cpu: int | None) -> list[str]:
    """``args`` run on CPU ``cpu`` only (``taskset -c``), or unchanged when it cannot be."""
    import shutil

    if cpu is None or not can_pin() or shutil.which("taskset") is None:
        return list(args)
    return ["taskset", "-c", str(cpu), *args]


def pin_self(cpu: int | None) -> None:
    """Keep this process (all its threads, present and future) on CPU ``cpu``."""
    if cpu is not None and can_pin():
        os.sched_setaffinity(0, {cpu})


def wait_port(port: int, timeout_s: float, proc: subprocess.Popen[bytes] | None = None) -> None:
    """Until something accepts TCP connections on 127.0.0.1:``port``; bounded."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"process {proc.args!r} exited with {proc.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.05)
    raise TimeoutError(f"nothing listened on 127.0.0.1:{port} within {timeout_s} s")


def rss_bytes(pid: int) -> int:
    try:
        return int(psutil.Process(pid).memory_info().rss)
    except psutil.Error:
        return 0


class PrivateMosquitto(ChildProcess):
    """A Mosquitto of our own on a free loopback port: never the shared one on 1883.

    Anonymous unless ``passwd`` is given; ``acl`` optional; no persistence (a benchmark
    broker starts empty). ``reload()`` (SIGHUP) re-reads the password and ACL files.
    """

    def __init__(
        self,
        directory: Path,
        *,
        passwd: Path | None = None,
        acl: Path | None = None,
        extra: Sequence[str] = (),
    ) -> None:
        self.directory = directory
        self.port = free_port()
        directory.mkdir(parents=True, exist_ok=True)
        lines = [
            f"listener {self.port} 127.0.0.1",
            f"allow_anonymous {'false' if passwd else 'true'}",
            "persistence false",
            "max_queued_messages 100000",
            "log_dest stderr",
            "log_type error",
            "log_type warning",
            "connection_messages false",
            *extra,
        ]
        if os.geteuid() == 0:
            import getpass

            lines.append(f"user {getpass.getuser()}")  # do not drop to `mosquitto`
        if passwd is not None:
            lines.append(f"password_file {passwd}")
        if acl is not None:
            lines.append(f"acl_file {acl}")
        self.config = directory / "mosquitto.conf"
        self.config.write_text("\n".join(lines) + "\n")
        binary = mosquitto_binary()
        super().__init__(
            [binary, "-c", str(self.config)], log=directory / "mosquitto.log", env=os.environ
        )

    def start(self, timeout_s: float = 15.0) -> PrivateMosquitto:
        if not Path(self.args[0]).exists():
            raise RuntimeError(f"no mosquitto binary at {self.args[0]}")
        self.__enter__()
        try:
            wait_port(self.port, timeout_s, self.proc)
        except BaseException:
            self.stop()
            raise
        return self

    def reload(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGHUP)


def git_describe() -> str:
    """The commit a figure was measured on (`git describe --always --dirty`)."""
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        return subprocess.run(
            ["git", "describe", "--always", "--dirty"],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        ).stdout.strip()
    return "unknown"
