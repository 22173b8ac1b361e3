"""The pipeline end to end on real ONNX Runtime sessions: results, counters, hot swap, stop."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

from edge_node.clock import ManualClock
from edge_node.errors import ClosedError
from edge_node.runtime.config import PreprocessConfig, SchedulerConfig, SessionConfig, StreamConfig
from edge_node.runtime.pipeline import FrameResult, InferencePipeline
from edge_node.runtime.preprocess import DecodeTarget
from edge_node.runtime.session import ModelSession
from edge_node.runtime.timing import ManualTicker
from protos.bundle.decoders import Geometry
from protos.bundle.results import Decoded
from protos.bundle.spec import BundleError, OutputSpec, RuntimeSpec
from tests.edge_node.runtime._models import echo_model, failing_model

RAW = PreprocessConfig(scale=1.0, mean=(0.0,), std=(1.0,))  # the model sees the pixels as floats
CPU = SessionConfig()
SIZE = 8


def load(
    tmp_path: Path, add: float = 0.0, label: str | None = None, size: int = SIZE
) -> ModelSession:
    path = echo_model(tmp_path / f"echo-{add}-{size}.onnx", (1, 3, size, size), add=add)
    return ModelSession.load(path, CPU, RAW, label=label or f"v{add:g}")


def wait_until(condition: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "the condition did not hold in time"
        time.sleep(0.001)


def pixels(value: int) -> npt.NDArray[np.uint8]:
    return np.full((SIZE, SIZE, 3), value, dtype=np.uint8)


def value(result: FrameResult) -> float:
    """The one value an echo model's output holds for a flat frame (its raw summary)."""
    (tensor,) = result.decoded.tensors
    assert tensor.min == tensor.max, tensor
    return tensor.max


def compute_s(result: FrameResult) -> float:
    return result.preprocess_s + result.inference_s + result.decode_s


class Collector:
    def __init__(self) -> None:
        self.results: list[FrameResult] = []
        self._lock = threading.Lock()
        self.count = threading.Semaphore(0)

    def __call__(self, result: FrameResult) -> None:
        with self._lock:
            self.results.append(result)
        self.count.release()

    def wait_for(self, n: int, timeout: float = 10.0) -> None:
        for _ in range(n):
            assert self.count.acquire(timeout=timeout), "a result did not arrive in time"


@pytest.fixture
def collector() -> Iterator[Collector]:
    yield Collector()


@pytest.fixture(params=[0, 1, 2], ids=["inline", "staged-1", "staged-2"])
def threads(request: pytest.FixtureRequest) -> int:
    """Every pipeline test runs inline (workers preprocess) and staged (preprocess threads)."""
    value: int = request.param
    return value


def test_frames_flow_to_results_with_the_latency_split(
    tmp_path: Path, collector: Collector, threads: int
) -> None:
    ticker = ManualTicker()
    streams = [StreamConfig("a", queue_size=4), StreamConfig("b", queue_size=4)]
    pipeline = InferencePipeline(
        load(tmp_path, add=1.0),
        streams,
        ManualClock(),
        collector,
        ticker=ticker,
        preprocess_threads=threads,
    )
    pipeline.submit("a", pixels(10))
    pipeline.submit("b", pixels(20))
    ticker.advance(0.25)  # both frames wait a quarter second before a worker exists
    with pipeline:
        collector.wait_for(2)

    by_stream = {r.stream: r for r in collector.results}
    assert (by_stream["a"].decoded.kind, by_stream["a"].decoded.tensors[0].shape) == (
        "raw",
        (1, 3, 8, 8),
    )
    assert (value(by_stream["a"]), value(by_stream["b"])) == (11.0, 21.0)
    for result in collector.results:
        assert (result.model, result.version, result.model_label) == ("v1", None, "v1")
        assert result.queue_s == pytest.approx(0.25)
        assert compute_s(result) == 0.0  # the manual ticker did not move while computing
        assert result.captured_at == ManualClock().now()
    assert {s: st.processed for s, st in pipeline.stats().items()} == {"a": 1, "b": 1}


def test_real_timings_are_positive(tmp_path: Path, collector: Collector, threads: int) -> None:
    with InferencePipeline(
        load(tmp_path), [StreamConfig("cam")], ManualClock(), collector, preprocess_threads=threads
    ) as pipeline:
        pipeline.submit("cam", pixels(1))
        collector.wait_for(1)
    result = collector.results[0]
    assert result.inference_s > 0
    assert result.preprocess_s >= 0
    assert result.decode_s >= 0


class JpegLikeDecoder:
    """Accepts bytes starting with the JPEG marker; raises on anything else."""

    def decode(self, data: bytes, target: DecodeTarget | None = None) -> npt.NDArray[np.uint8]:
        if not data.startswith(b"\xff\xd8"):
            raise ValueError("not a JPEG")
        return pixels(data[2])


def test_bad_frames_are_counted_and_skipped_never_raised(
    tmp_path: Path, collector: Collector, threads: int
) -> None:
    pipeline = InferencePipeline(
        load(tmp_path),
        [StreamConfig("cam", queue_size=16)],
        ManualClock(),
        collector,
        decoder=JpegLikeDecoder(),
        preprocess_threads=threads,
    )
    bad = [
        np.zeros((8, 8), dtype=np.uint8),
        np.zeros((8, 8, 4), dtype=np.uint8),
        np.zeros((8, 8, 3), dtype=np.float64),
        b"corrupt",
        b"",
        "not a frame",
    ]
    with pipeline:
        for frame in bad:
            pipeline.submit("cam", frame)
        pipeline.submit("cam", b"\xff\xd8\x07")  # a good encoded frame: pixels of 7
        pipeline.submit("cam", pixels(3))
        collector.wait_for(2)
        report = pipeline.stop()

    assert report.drained
    stats = pipeline.stats()["cam"]
    assert stats.bad == {"shape": 2, "dtype": 1, "corrupt": 1, "empty": 1, "type": 1}
    assert stats.processed == 2
    assert sorted(value(r) for r in collector.results) == [3.0, 7.0]


def test_encoded_frames_without_a_decoder_are_counted(
    tmp_path: Path, collector: Collector, threads: int
) -> None:
    with InferencePipeline(
        load(tmp_path),
        [StreamConfig("cam")],
        ManualClock(),
        collector,
        decoder=None,
        preprocess_threads=threads,
    ) as pipeline:
        pipeline.submit("cam", b"\xff\xd8\xff\xe0")
        pipeline.submit("cam", pixels(1))
        collector.wait_for(1)
    assert pipeline.stats()["cam"].bad == {"unsupported_encoding": 1}


def test_inference_failures_are_counted(tmp_path: Path, collector: Collector, threads: int) -> None:
    session = ModelSession.load(
        failing_model(tmp_path / "f.onnx"), CPU, PreprocessConfig(size=(4, 4))
    )
    pipeline = InferencePipeline(
        session,
        [StreamConfig("cam", queue_size=4)],
        ManualClock(),
        collector,
        preprocess_threads=threads,
    )
    with pipeline:
        for _ in range(3):
            pipeline.submit("cam", pixels(1))
        pipeline.stop()
    assert pipeline.stats()["cam"].failed == {"inference_error": 3}
    assert collector.results == []


class BrightFramesUndecodable:
    """A decoder that cannot read the outputs of bright frames (values over 100)."""

    def __init__(self, session: ModelSession) -> None:
        self._inner = session.decoder

    def decode(self, outputs: Mapping[str, Any], geometry: Geometry) -> Decoded:
        if float(np.asarray(outputs["y"]).max()) > 100:
            raise BundleError("classification expects [1, C] scores", field="output")
        return self._inner.decode(outputs, geometry)


def test_outputs_that_do_not_decode_are_counted_and_the_worker_goes_on(
    tmp_path: Path, collector: Collector
) -> None:
    session = load(tmp_path, add=1.0)
    session.decoder = BrightFramesUndecodable(session)
    pipeline = InferencePipeline(
        session, [StreamConfig("cam", queue_size=8)], ManualClock(), collector
    )
    with pipeline:
        for value_ in (10, 200, 250, 20):
            pipeline.submit("cam", pixels(value_))
        collector.wait_for(2)
        report = pipeline.stop()
    assert report.drained
    stats = pipeline.stats()["cam"]
    assert (stats.failed, stats.processed) == ({"decode_error": 2}, 2)
    assert sorted(value(r) for r in collector.results) == [11.0, 21.0]


def test_a_signed_runtime_spec_names_the_results_and_decodes_them(
    tmp_path: Path, collector: Collector
) -> None:
    path = echo_model(tmp_path / "m.onnx", (1, 3, SIZE, SIZE), add=0.5)
    spec = RuntimeSpec(
        preprocess=PreprocessConfig(scale=1.0 / 255.0, mean=(0.5,), std=(0.5,)),
        output=OutputSpec(decoder="raw", threshold=0.9),
    )
    session = ModelSession.load(path, CPU, RAW, runtime=spec, model="det", version="1.2.0")
    with InferencePipeline(session, [StreamConfig("cam")], ManualClock(), collector) as pipeline:
        pipeline.submit("cam", np.full((3 * SIZE, 4 * SIZE, 3), 255, dtype=np.uint8))
        collector.wait_for(1)
    (result,) = collector.results
    assert (result.model, result.version, result.model_label) == ("det", "1.2.0", "det@1.2.0")
    (tensor,) = result.decoded.tensors
    # (255/255 - 0.5) / 0.5 + 0.5: the signed normalisation, not the node's RAW.
    assert (tensor.shape, tensor.max, tensor.threshold, tensor.above) == (
        (1, 3, SIZE, SIZE),
        1.5,
        0.9,
        1.0,
    )


def test_a_failing_result_callback_does_not_stop_the_worker(tmp_path: Path, threads: int) -> None:
    seen: list[int] = []
    done = threading.Event()

    def on_result(result: FrameResult) -> None:
        seen.append(result.frame_id)
        if result.frame_id == 0:
            raise RuntimeError("aggregation is down")
        done.set()

    with InferencePipeline(
        load(tmp_path),
        [StreamConfig("cam", queue_size=4)],
        ManualClock(),
        on_result,
        preprocess_threads=threads,
    ) as pipeline:
        pipeline.submit("cam", pixels(1))
        pipeline.submit("cam", pixels(2))
        assert done.wait(10)
    assert seen == [0, 1]
    assert pipeline.callback_errors == 1


def test_hot_swap_under_load_loses_nothing(
    tmp_path: Path, collector: Collector, threads: int
) -> None:
    """Two producers feed frames while the model is swapped 20 times: every accepted frame
    yields exactly one result, computed by the session its result names. Versions alternate
    between 8x8 and 4x4 inputs: a tensor run on a session it was not prepared for fails."""
    sessions = [
        load(tmp_path, add=float(k), label=f"v{k}", size=SIZE if k % 2 else SIZE // 2)
        for k in range(21)
    ]
    streams = [StreamConfig("a", queue_size=1024), StreamConfig("b", queue_size=1024)]
    pipeline = InferencePipeline(
        sessions[0], streams, ManualClock(), collector, workers=2, preprocess_threads=threads
    )
    accepted: dict[str, list[int]] = {"a": [], "b": []}
    swaps_done = threading.Event()
    start = threading.Barrier(3)

    def produce(stream: str) -> None:
        start.wait()
        for i in range(20_000):  # bounded, whatever happens to the swapper
            if swaps_done.is_set() and i >= 100:
                return
            outcome = pipeline.submit(stream, pixels(i % 200))
            if outcome.queued:
                accepted[stream].append(outcome.frame_id)
            time.sleep(0)  # let the workers and the swapper in

    producers = [threading.Thread(target=produce, args=(s,)) for s in ("a", "b")]
    retirements = []
    with pipeline:
        for p in producers:
            p.start()
        start.wait()
        for new in sessions[1:]:
            collector.wait_for(5)  # frames run on every version, and some are in flight
            retirements.append(pipeline.swap_session(new))
        swaps_done.set()
        for p in producers:
            p.join(30)
        report = pipeline.stop(timeout_s=30)

    assert report.drained
    stats = pipeline.stats()
    for stream in ("a", "b"):
        ids = sorted(r.frame_id for r in collector.results if r.stream == stream)
        assert ids == sorted(accepted[stream])  # exactly one result per accepted frame
        assert ids == list(range(len(ids)))  # and every submitted frame was accepted
        assert stats[stream].processed == len(ids)
        assert stats[stream].dropped == {} and stats[stream].failed == {}
    for result in collector.results:
        version = int(result.model.removeprefix("v"))
        assert value(result) == result.frame_id % 200 + version
    assert all(r.wait(10) for r in retirements)
    assert all(s.closed for s in sessions)  # the retired ones, and the last one at stop
    assert {r.model for r in collector.results} >= {"v0", "v20"}


class BlockingDecoder:
    """Holds a frame inside preprocessing (so on the session) until released."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.release = threading.Event()

    def decode(self, data: bytes, target: DecodeTarget | None = None) -> npt.NDArray[np.uint8]:
        self.entered.set()
        assert self.release.wait(10)
        return pixels(data[0])


def test_in_flight_frames_finish_on_the_old_session(
    tmp_path: Path, collector: Collector, threads: int
) -> None:
    old, new = load(tmp_path, add=100.0, label="old"), load(tmp_path, add=200.0, label="new")
    decoder = BlockingDecoder()
    with InferencePipeline(
        old,
        [StreamConfig("cam", queue_size=4)],
        ManualClock(),
        collector,
        decoder=decoder,
        preprocess_threads=threads,
    ) as pipeline:
        pipeline.submit("cam", bytes([5]))
        assert decoder.entered.wait(10)
        retirement = pipeline.swap_session(new)
        assert not retirement.done and not old.closed  # a frame still runs on it
        assert pipeline.session is new
        decoder.release.set()
        collector.wait_for(1)
        assert retirement.wait(10) and old.closed
        pipeline.submit("cam", pixels(5))
        collector.wait_for(1)

    assert [(r.model, value(r)) for r in collector.results] == [
        ("old", 105.0),
        ("new", 205.0),
    ]


def test_swap_rules(tmp_path: Path, collector: Collector, threads: int) -> None:
    first, second = load(tmp_path, add=1.0), load(tmp_path, add=2.0)
    pipeline = InferencePipeline(
        first, [StreamConfig("cam")], ManualClock(), collector, preprocess_threads=threads
    )
    with pytest.raises(Exception, match="already active"):
        pipeline.swap_session(first)
    retirement = pipeline.swap_session(second)
    assert retirement.done and first.closed  # nothing was running on it
    with pytest.raises(ClosedError):
        pipeline.swap_session(first)
    pipeline.stop()
    with pytest.raises(ClosedError):
        pipeline.swap_session(load(tmp_path, add=3.0))
    with pytest.raises(ClosedError):
        pipeline.start()


def test_stop_drains_queued_frames(tmp_path: Path, collector: Collector, threads: int) -> None:
    session = load(tmp_path)
    pipeline = InferencePipeline(
        session,
        [StreamConfig("cam", queue_size=64)],
        ManualClock(),
        collector,
        preprocess_threads=threads,
    )
    for i in range(50):
        pipeline.submit("cam", pixels(i))
    pipeline.start()
    report = pipeline.stop(timeout_s=30)

    assert report.drained and report.discarded == 0 and report.workers_running == 0
    assert sorted(r.frame_id for r in collector.results) == list(range(50))
    assert session.closed
    assert pipeline.stop() is report  # idempotent
    outcome = pipeline.submit("cam", pixels(1))
    assert (outcome.status, outcome.reason) == ("dropped", "stopped")


def test_stop_past_its_deadline_drops_what_is_left(tmp_path: Path, threads: int) -> None:
    gate = threading.Event()
    entered = threading.Event()

    def slow(result: FrameResult) -> None:
        entered.set()
        gate.wait(10)

    session = load(tmp_path)
    pipeline = InferencePipeline(
        session,
        [StreamConfig("cam", queue_size=16)],
        ManualClock(),
        slow,
        scheduler_config=SchedulerConfig(shed_after_s=None),
        preprocess_threads=threads,
    )
    pipeline.start()
    for i in range(10):
        pipeline.submit("cam", pixels(i))
    assert entered.wait(10)
    report = pipeline.stop(timeout_s=0.2)
    gate.set()

    assert not report.drained
    assert report.discarded == 9
    assert pipeline.stats()["cam"].dropped == {"shutdown": 9}
    assert session.closed  # its in-flight frame had finished; the callback ran after release


# -- the staged pipeline (preprocess threads in front of the inference workers) ------------


class RecordingDecoder:
    """Bytes ``[v]`` decode to a frame of pixels ``v``; records each call's target size."""

    def __init__(self, ticker: ManualTicker | None = None, step_s: float = 0.0) -> None:
        self.targets: list[tuple[int, int] | None] = []
        self.hold: dict[int, threading.Event] = {}  # value -> released before decoding it
        self._ticker, self._step_s = ticker, step_s

    def decode(self, data: bytes, target: DecodeTarget | None = None) -> npt.NDArray[np.uint8]:
        gate = self.hold.get(data[0])
        if gate is not None:
            assert gate.wait(10)
        self.targets.append(target.size if target is not None else None)
        if self._ticker is not None:
            self._ticker.advance(self._step_s)
        return pixels(data[0])


def test_a_tensor_prepared_for_the_old_session_runs_on_the_old_session(
    tmp_path: Path, collector: Collector
) -> None:
    """Frame 0 runs, frame 1 is prepared (8x8, raw pixels) and waits in the hand-off, frame 2
    is queued; then a 4x4 model with another normalisation is swapped in. Frame 1 must run on
    the old session (on the new one it would fail: wrong size), frame 2 on the new one."""
    old = ModelSession.load(
        echo_model(tmp_path / "old.onnx", (1, 3, 8, 8), add=100.0), CPU, RAW, label="old"
    )
    new = ModelSession.load(
        echo_model(tmp_path / "new.onnx", (1, 3, 4, 4), add=200.0),
        CPU,
        PreprocessConfig(scale=2.0, mean=(0.0,), std=(1.0,)),
        label="new",
    )
    decoder = RecordingDecoder()
    first_done, release = threading.Event(), threading.Event()

    def on_result(result: FrameResult) -> None:
        collector(result)
        if result.frame_id == 0:
            first_done.set()
            assert release.wait(10)  # hold the only worker: frame 1 waits in the hand-off

    pipeline = InferencePipeline(
        old,
        [StreamConfig("cam", queue_size=8)],
        ManualClock(),
        on_result,
        preprocess_threads=1,
        decoder=decoder,
    )
    with pipeline:
        pipeline.submit("cam", bytes([1]))
        assert first_done.wait(10)
        pipeline.submit("cam", bytes([2]))
        wait_until(lambda: pipeline.prepared_frames() == 1)
        retirement = pipeline.swap_session(new)
        pipeline.submit("cam", bytes([3]))
        assert pipeline.backlog() == 1  # the hand-off is full: frame 2 stays in the scheduler
        assert not retirement.done and not old.closed  # frame 1 still holds the old session
        release.set()
        collector.wait_for(2)
        assert retirement.wait(10) and old.closed

    results = sorted(collector.results, key=lambda r: r.frame_id)
    assert [(r.model, r.decoded.tensors[0].shape, value(r)) for r in results] == [
        ("old", (1, 3, 8, 8), 101.0),
        ("old", (1, 3, 8, 8), 102.0),
        ("new", (1, 3, 4, 4), 206.0),  # 3 * scale 2 + 200
    ]
    assert decoder.targets == [(8, 8), (8, 8), (4, 4)]  # decoded for the session it ran on
    stats = pipeline.stats()["cam"]
    assert (stats.processed, stats.failed, stats.dropped) == (3, {}, {})


def test_staged_latency_split_counts_the_hand_off_wait_as_queue(
    tmp_path: Path, collector: Collector
) -> None:
    """Preprocessing takes 0.1 s a frame; frame 1 is ready while the worker is still busy
    with frame 0 for 0.5 s more: those 0.5 s are queue time, not preprocessing."""
    ticker = ManualTicker()
    decoder = RecordingDecoder(ticker, step_s=0.1)
    callback_entered = threading.Event()
    decoder.hold[2] = callback_entered  # frame 1 is decoded once frame 0's timings are taken
    pipeline: InferencePipeline

    def on_result(result: FrameResult) -> None:
        collector(result)
        if result.frame_id == 0:
            callback_entered.set()
            wait_until(lambda: pipeline.prepared_frames() == 1)
            ticker.advance(0.5)

    pipeline = InferencePipeline(
        load(tmp_path),
        [StreamConfig("cam", queue_size=4)],
        ManualClock(),
        on_result,
        ticker=ticker,
        preprocess_threads=1,
        decoder=decoder,
    )
    pipeline.submit("cam", bytes([1]))
    pipeline.submit("cam", bytes([2]))
    with pipeline:
        collector.wait_for(2)

    first, second = sorted(collector.results, key=lambda r: r.frame_id)
    assert (first.queue_s, first.preprocess_s, first.inference_s) == pytest.approx((0, 0.1, 0))
    # picked at +0.1 (after frame 0's decode), ready at +0.2, run at +0.7
    assert (second.queue_s, second.preprocess_s, second.inference_s) == pytest.approx(
        (0.1 + 0.5, 0.1, 0)
    )
    assert pipeline.stats()["cam"].processed == 2


def test_staged_stop_drops_prepared_frames_past_the_deadline_and_closes_the_session(
    tmp_path: Path,
) -> None:
    gate, entered = threading.Event(), threading.Event()

    def slow(result: FrameResult) -> None:
        entered.set()
        gate.wait(10)

    session = load(tmp_path)
    pipeline = InferencePipeline(
        session,
        [StreamConfig("cam", queue_size=16)],
        ManualClock(),
        slow,
        scheduler_config=SchedulerConfig(shed_after_s=None),
        preprocess_threads=1,
    )
    pipeline.start()
    for i in range(10):
        pipeline.submit("cam", pixels(i))
    assert entered.wait(10)
    wait_until(lambda: pipeline.prepared_frames() == 1)
    assert pipeline.backlog() == 8
    report = pipeline.stop(timeout_s=0.2)
    gate.set()

    assert report.discarded == 9  # 8 queued + 1 prepared
    assert pipeline.prepared_frames() == 0
    stats = pipeline.stats()["cam"]
    assert stats.dropped == {"shutdown": 9} and stats.processed == 1
    wait_until(lambda: session.closed)  # the dropped tensor's hold on it was released too


def test_preprocess_threads_are_bounded(tmp_path: Path, collector: Collector) -> None:
    with pytest.raises(Exception, match="preprocess_threads"):
        InferencePipeline(
            load(tmp_path), [StreamConfig("cam")], ManualClock(), collector, preprocess_threads=-1
        )
