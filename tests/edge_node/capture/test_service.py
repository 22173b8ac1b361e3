"""Capture against real adapters: a fake camera on loopback and a drop directory on disk."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from datetime import datetime
from pathlib import Path

import anyio
import pytest

from edge_node.capture import (
    CaptureService,
    Credentials,
    DirectorySourceConfig,
    HttpSourceConfig,
    StreamSource,
)
from edge_node.capture.sources import DirectorySource
from edge_node.clock import SystemClock
from edge_node.runtime.config import PreprocessConfig, SessionConfig, StreamConfig
from edge_node.runtime.pipeline import FrameResult, InferencePipeline
from edge_node.runtime.session import ModelSession
from tests.conftest import free_port
from tests.edge_node.capture.camera import FakeCamera, fake_camera, jpeg
from tests.edge_node.runtime._models import echo_model

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


class RecordingSink:
    def __init__(self) -> None:
        self.frames: list[tuple[float, str, bytes]] = []

    def submit(self, stream: str, frame: object, *, captured_at: datetime | None = None) -> None:
        assert isinstance(frame, bytes) and captured_at is not None
        self.frames.append((time.monotonic(), stream, frame))


async def until(condition: Callable[[], object], timeout: float = 5.0) -> None:
    with anyio.fail_after(timeout):
        while not condition():
            await anyio.sleep(0.02)


async def run_while(service: CaptureService, body: Callable[[], Awaitable[None]]) -> None:
    """Run the service around ``body``, then check that it stops within a second."""
    stop = anyio.Event()
    with anyio.fail_after(15):
        async with anyio.create_task_group() as group:
            group.start_soon(service.run, stop)
            await body()
            stop.set()
            stopped_at = time.monotonic()
    assert time.monotonic() - stopped_at < 1.0  # a stop never waits for a camera


def http(camera: FakeCamera, **options: object) -> HttpSourceConfig:
    return HttpSourceConfig(url=camera.url, **options)  # type: ignore[arg-type]


async def test_snapshots_reach_the_sink_at_about_the_target_fps() -> None:
    sink = RecordingSink()
    with fake_camera() as camera:
        service = CaptureService(
            [StreamSource("door", http(camera), fps=10.0)], lambda: sink, SystemClock()
        )

        async def body() -> None:
            await anyio.sleep(1.5)

        started = time.monotonic()
        with anyio.fail_after(4):
            await run_while(service, body)
        elapsed = time.monotonic() - started
    count = len(sink.frames)
    assert 0.6 * 10 * elapsed <= count <= 10 * elapsed + 2
    assert {stream for _, stream, _ in sink.frames} == {"door"}
    assert all(data == jpeg() for _, _, data in sink.frames)
    stats = service.stats()["door"]
    assert stats.captured == count and stats.failures == {}


async def test_a_camera_answering_500_is_counted_polled_with_bounded_backoff_and_recovers() -> None:
    sink = RecordingSink()
    with fake_camera(mode="error") as camera:
        source = http(camera, backoff_initial_s=0.05, backoff_max_s=0.2)
        service = CaptureService(
            [StreamSource("door", source, fps=50.0)], lambda: sink, SystemClock()
        )

        async def body() -> None:
            await anyio.sleep(1.5)
            errors = len(camera.requests)
            assert service.stats()["door"].failures == {"http_500": errors}
            assert service.stats()["door"].consecutive_failures == errors
            gaps = [b - a for a, b in zip(camera.requests, camera.requests[1:], strict=False)]
            assert max(gaps) <= 0.2 + 0.15  # capped ...
            assert min(gaps[3:]) >= 0.1 - 0.02  # ... and no hammering of a dead camera
            assert 5 <= errors <= 1.5 / 0.08
            camera.mode = "ok"
            await until(lambda: sink.frames)

        with anyio.fail_after(6):
            await run_while(service, body)
    assert service.stats()["door"].consecutive_failures == 0


async def test_a_hanging_camera_times_out_and_a_stop_does_not_wait_for_it() -> None:
    sink = RecordingSink()
    with fake_camera(mode="slow", slow_s=3.0) as camera:
        source = http(camera, timeout_s=0.2, backoff_initial_s=0.05, backoff_max_s=0.1)
        service = CaptureService([StreamSource("door", source)], lambda: sink, SystemClock())

        async def body() -> None:
            await until(lambda: service.stats()["door"].failures.get("timeout", 0) >= 2)
            camera.requests.clear()
            await until(lambda: camera.requests)  # a request is hanging now

        started = time.monotonic()
        with anyio.fail_after(5):
            await run_while(service, body)
        assert time.monotonic() - started < 2.5
    assert sink.frames == []


@pytest.mark.parametrize(
    ("options", "given", "reason"),
    [
        ({"mode": "html"}, None, "not_image"),
        ({"credentials": ("viewer", "s3cret")}, None, "auth"),
        ({"credentials": ("viewer", "s3cret")}, Credentials("viewer", "wrong"), "auth"),
    ],
)
async def test_refusals_are_counted_by_reason(
    options: dict[str, object], given: Credentials | None, reason: str
) -> None:
    sink = RecordingSink()
    with fake_camera(**options) as camera:
        source = http(camera, credentials=given, backoff_initial_s=0.05, backoff_max_s=0.1)
        service = CaptureService([StreamSource("door", source, 20.0)], lambda: sink, SystemClock())

        async def body() -> None:
            await until(lambda: service.stats()["door"].failures.get(reason, 0) >= 2)

        await run_while(service, body)
    assert sink.frames == []


async def test_basic_auth_credentials_are_sent() -> None:
    sink = RecordingSink()
    with fake_camera(credentials=("viewer", "s3cret")) as camera:
        source = http(camera, credentials=Credentials("viewer", "s3cret"))
        service = CaptureService([StreamSource("door", source, 20.0)], lambda: sink, SystemClock())

        async def body() -> None:
            await until(lambda: len(sink.frames) >= 2)

        await run_while(service, body)
    assert service.stats()["door"].failures == {}


async def test_a_camera_that_is_down_is_counted_as_connect_failures() -> None:
    source = HttpSourceConfig(
        url=f"http://127.0.0.1:{free_port()}/snap.jpg", backoff_initial_s=0.05, backoff_max_s=0.1
    )
    service = CaptureService([StreamSource("door", source, 20.0)], RecordingSink, SystemClock())

    async def body() -> None:
        await until(lambda: service.stats()["door"].failures.get("connect", 0) >= 3)

    await run_while(service, body)


async def test_nothing_is_fetched_before_a_pipeline_exists() -> None:
    with fake_camera() as camera:
        service = CaptureService(
            [StreamSource("door", http(camera), 20.0)], lambda: None, SystemClock()
        )

        async def body() -> None:
            await anyio.sleep(0.5)

        await run_while(service, body)
        assert camera.requests == []


@pytest.fixture
def pipeline(tmp_path: Path) -> Iterator[tuple[InferencePipeline, list[FrameResult]]]:
    model = echo_model(tmp_path / "echo.onnx", (1, 3, 8, 8))
    session = ModelSession.load(
        model, SessionConfig(), PreprocessConfig(scale=1.0, mean=(0.0,), std=(1.0,))
    )
    results: list[FrameResult] = []
    with InferencePipeline(session, [StreamConfig("door")], SystemClock(), results.append) as p:
        yield p, results


async def test_corrupt_jpeg_bytes_are_counted_bad_by_the_pipeline_and_capture_goes_on(
    pipeline: tuple[InferencePipeline, list[FrameResult]],
) -> None:
    runtime, results = pipeline
    with fake_camera(mode="garbage") as camera:
        service = CaptureService(
            [StreamSource("door", http(camera), 20.0)], lambda: runtime, SystemClock()
        )

        async def body() -> None:
            await until(lambda: runtime.stats()["door"].bad.get("corrupt", 0) >= 2)
            camera.mode = "ok"
            await until(lambda: len(results) >= 2)

        await run_while(service, body)
    assert results[-1].decoded.tensors[0].shape == (1, 3, 8, 8)
    assert results[-1].decoded.tensors[0].mean == pytest.approx(128, abs=3)


# ------------------------------------------------------------------ drop directory


def drop(directory: Path, name: str, data: bytes, age_s: float) -> Path:
    path = directory / name
    path.write_bytes(data)
    when = time.time() - age_s
    os.utime(path, (when, when))
    return path


async def test_the_newest_file_wins_and_read_files_are_deleted(tmp_path: Path) -> None:
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    for age, value in ((30, 10), (20, 20), (10, 30)):
        drop(inbox, f"snap-{value}.jpg", jpeg(value), age)
    (inbox / "notes.txt").write_text("not a frame")
    sink = RecordingSink()
    source = DirectorySourceConfig(directory=inbox, after_read="delete", settle_s=0.0)
    service = CaptureService([StreamSource("yard", source, 20.0)], lambda: sink, SystemClock())

    async def body() -> None:
        await until(lambda: sink.frames)
        await anyio.sleep(0.2)

    await run_while(service, body)
    assert [data for _, _, data in sink.frames] == [jpeg(30)]
    assert service.stats()["yard"].superseded == 2
    assert sorted(p.name for p in inbox.iterdir()) == ["notes.txt"]


async def test_files_appearing_are_taken_in_turn_and_moved(tmp_path: Path) -> None:
    inbox, done = tmp_path / "inbox", tmp_path / "done"
    inbox.mkdir()
    sink = RecordingSink()
    source = DirectorySourceConfig(directory=inbox, after_read="move", move_to=done, settle_s=0.05)
    service = CaptureService([StreamSource("yard", source, 20.0)], lambda: sink, SystemClock())

    async def body() -> None:
        for value in (1, 2, 3):
            drop(inbox, f"{value}.jpg", jpeg(value * 40), age_s=0.0)
            await until(lambda value=value: len(sink.frames) == value)  # type: ignore[misc]

    await run_while(service, body)
    assert [data for _, _, data in sink.frames] == [jpeg(40), jpeg(80), jpeg(120)]
    assert sorted(p.name for p in done.iterdir()) == ["1.jpg", "2.jpg", "3.jpg"]
    assert list(inbox.iterdir()) == []


async def test_a_file_still_being_written_is_not_read_early(tmp_path: Path) -> None:
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    data = jpeg(200, size=(64, 64))
    sink = RecordingSink()
    source = DirectorySourceConfig(directory=inbox, settle_s=0.3)
    service = CaptureService([StreamSource("yard", source, 20.0)], lambda: sink, SystemClock())
    finished = threading.Event()
    finished_at: list[float] = []

    def slow_writer() -> None:  # an FTP upload: a piece every 50 ms for about a second
        with (inbox / "up.jpg").open("wb") as out:
            step = max(1, len(data) // 20)
            for start in range(0, len(data), step):
                out.write(data[start : start + step])
                out.flush()
                last_write = time.monotonic()
                time.sleep(0.05)
        finished_at.append(last_write)
        finished.set()

    async def body() -> None:
        writer = threading.Thread(target=slow_writer)
        writer.start()
        try:
            await until(lambda: sink.frames, timeout=5.0)
        finally:
            writer.join(5)

    await run_while(service, body)
    assert finished.is_set()
    assert [frame for _, _, frame in sink.frames] == [data]
    # Not before settle_s after the last write (less the file system's timestamp grain).
    assert sink.frames[0][0] >= finished_at[0] + 0.3 - 0.02


async def test_empty_and_stale_files_are_counted_and_deleted_but_a_fresh_empty_one_waits(
    tmp_path: Path,
) -> None:
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    drop(inbox, "dead.jpg", b"", age_s=120)  # an upload that never wrote a byte
    drop(inbox, "new.jpg", jpeg(40), age_s=5)
    sink = RecordingSink()
    source = DirectorySourceConfig(
        directory=inbox, after_read="delete", settle_s=0.0, empty_after_s=60.0
    )
    service = CaptureService([StreamSource("yard", source, 20.0)], lambda: sink, SystemClock())

    async def body() -> None:
        await until(lambda: sink.frames)
        drop(inbox, "late.jpg", jpeg(80), age_s=60)  # older than the frame just taken
        drop(inbox, "coming.jpg", b"", age_s=0)  # created; its data comes in a moment
        await until(lambda: service.stats()["yard"].discarded.get("stale"))
        await anyio.sleep(0.2)  # several scans: the fresh empty file is left alone
        assert (inbox / "coming.jpg").exists()
        (inbox / "coming.jpg").write_bytes(jpeg(120))
        await until(lambda: len(sink.frames) == 2)

    await run_while(service, body)
    assert [data for _, _, data in sink.frames] == [jpeg(40), jpeg(120)]
    stats = service.stats()["yard"]
    assert stats.discarded == {"empty": 1, "stale": 1}
    assert (stats.superseded, stats.failures) == (0, {})
    assert list(inbox.iterdir()) == []


async def test_files_set_aside_are_counted_once_and_kept_in_keep_mode(tmp_path: Path) -> None:
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    drop(inbox, "dead.jpg", b"", age_s=120)
    drop(inbox, "a.jpg", jpeg(40), age_s=5)
    sink = RecordingSink()
    source = DirectorySourceConfig(directory=inbox, settle_s=0.0, empty_after_s=60.0)
    service = CaptureService([StreamSource("yard", source, 20.0)], lambda: sink, SystemClock())

    async def body() -> None:
        await until(lambda: service.stats()["yard"].discarded.get("empty") and sink.frames)
        await anyio.sleep(0.3)  # several more scans

    await run_while(service, body)
    assert service.stats()["yard"].discarded == {"empty": 1}
    assert sorted(p.name for p in inbox.iterdir()) == ["a.jpg", "dead.jpg"]


async def test_a_missing_directory_is_counted_and_retried_until_it_appears(tmp_path: Path) -> None:
    inbox = tmp_path / "inbox"
    sink = RecordingSink()
    source = DirectorySourceConfig(directory=inbox, settle_s=0.0)
    service = CaptureService([StreamSource("yard", source, 20.0)], lambda: sink, SystemClock())

    async def body() -> None:
        await until(lambda: service.stats()["yard"].failures.get("missing_directory", 0) >= 2)
        inbox.mkdir()
        drop(inbox, "a.jpg", jpeg(), age_s=5)
        await until(lambda: sink.frames)

    await run_while(service, body)


async def test_a_source_that_cannot_be_set_up_is_counted_and_retried_not_raised() -> None:
    calls: list[float] = []

    def broken(spec: StreamSource, counters: object) -> DirectorySource:
        calls.append(time.monotonic())
        raise OSError("no such CA bundle")

    source = DirectorySourceConfig(directory=Path("/nonexistent"))
    service = CaptureService(
        [StreamSource("yard", source)], RecordingSink, SystemClock(), source_factory=broken
    )

    async def body() -> None:
        await until(lambda: calls)
        await anyio.sleep(0.1)

    await run_while(service, body)
    assert service.stats()["yard"].failures == {"setup_error": 1}
