"""The shadow runner and its budget with real ONNX Runtime sessions (models built with
`onnx.helper`): agreement of an identical and of a diverging candidate, the CPU cap, the
one-frame hand-off, and served frames that never wait for the candidate."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pytest
from onnx import TensorProto, helper

from edge_node.clock import SystemClock
from edge_node.runtime.config import SessionConfig, StreamConfig
from edge_node.runtime.pipeline import InferencePipeline
from edge_node.runtime.preprocess import DecodeTarget
from edge_node.runtime.session import ModelSession
from edge_node.runtime.shadow import ShadowRunner
from edge_node.runtime.shadow_budget import CpuBudget, FrameSampler
from protos.bundle.results import InferenceResult
from protos.bundle.spec import OutputSpec, PreprocessConfig, RuntimeSpec
from tests.edge_node.runtime._models import _save, echo_model

SIZE = (8, 8)
RAW = RuntimeSpec(preprocess=PreprocessConfig(size=SIZE))


def frame(seed: int) -> npt.NDArray[np.uint8]:
    rng = np.random.default_rng(seed)
    return rng.integers(0, 256, (12, 16, 3), dtype=np.uint8)


def classifier(path: Path, *, negate: bool = False) -> Path:
    """[1, 3, 8, 8] -> [1, 3] channel means (negated: the opposite ranking)."""
    nodes = [helper.make_node("ReduceMean", ["images"], ["m"], axes=[2, 3], keepdims=0)]
    nodes.append(helper.make_node("Neg" if negate else "Identity", ["m"], ["scores"]))
    graph = helper.make_graph(
        nodes,
        "classifier",
        inputs=[helper.make_tensor_value_info("images", TensorProto.FLOAT, [1, 3, *SIZE])],
        outputs=[helper.make_tensor_value_info("scores", TensorProto.FLOAT, [1, 3])],
    )
    return _save(graph, path)


CLASSES = RuntimeSpec(
    preprocess=PreprocessConfig(size=SIZE),
    output=OutputSpec(decoder="classification", top_k=2, score_threshold=0.0),
    labels=("r", "g", "b"),
)


def session(path: Path, spec: RuntimeSpec, version: str) -> ModelSession:
    return ModelSession.load(path, SessionConfig(), runtime=spec, model="m", version=version)


class Served:
    """The active model's side: run a frame and offer it to the runner, as the pipeline's
    tap does."""

    def __init__(self, active: ModelSession, runner: ShadowRunner) -> None:
        self.active, self.runner = active, runner

    def serve(self, image: npt.NDArray[np.uint8]) -> None:
        outputs = self.active.run(self.active.preprocessor(image))
        decoded = self.active.decode(outputs, image.shape[0], image.shape[1])
        self.runner.offer(image, outputs, decoded, self.active.label)


def wait_for(runner: ShadowRunner, compared: int) -> None:
    deadline = time.monotonic() + 10
    while runner.counts().frames_compared + runner.counts().samples_failed < compared:
        assert time.monotonic() < deadline, runner.counts()
        time.sleep(0.002)


def test_sampler_is_even_and_budget_bounded() -> None:
    sampler = FrameSampler(50)
    picks = [sampler.pick() for _ in range(100)]
    assert picks.count(True) == 5 and picks[0] and picks[20]
    budget = CpuBudget(10, now=0.0)  # 10 % of a core: 0.1 s of credit at most
    assert budget.allows(0.0)
    budget.spend(0.5, now=0.0)  # one expensive sample overdraws it (0.1 - 0.5)
    assert not budget.allows(3.9)  # repaid at 0.1 s per s
    assert budget.allows(4.1)
    assert budget.cpu_percent(5.0) == pytest.approx(10.0)
    with pytest.raises(ValueError):
        FrameSampler(0)
    with pytest.raises(ValueError):
        CpuBudget(101, now=0.0)


def test_an_identical_candidate_agrees_fully(tmp_path: Path) -> None:
    active = session(echo_model(tmp_path / "a.onnx", (1, 3, *SIZE)), RAW, "1")
    same = session(echo_model(tmp_path / "b.onnx", (1, 3, *SIZE), add=-0.0), RAW, "2")
    runner = ShadowRunner(same, sample_per_mille=1000, max_cpu_percent=100)
    served = Served(active, runner)
    try:
        for i in range(5):
            served.serve(frame(i))
            wait_for(runner, i + 1)
        figures = runner.figures()
    finally:
        runner.close()
    agreement = figures["agreement"]
    assert (figures["frames_compared"], figures["against"]) == (5, "m@1")
    assert (agreement["kind"], agreement["min_cosine"], agreement["max_abs_diff"]) == (
        "raw",
        1.0,
        0.0,
    )
    assert figures["latency"].count == 5
    assert same.closed


def test_a_diverging_classifier_disagrees(tmp_path: Path) -> None:
    active = session(classifier(tmp_path / "a.onnx"), CLASSES, "1")
    same = session(classifier(tmp_path / "b.onnx"), CLASSES, "2")
    flipped = session(classifier(tmp_path / "c.onnx", negate=True), CLASSES, "3")
    summaries = {}
    for name, candidate in (("same", same), ("flipped", flipped)):
        runner = ShadowRunner(candidate, sample_per_mille=1000, max_cpu_percent=100)
        served = Served(active, runner)
        try:
            for i in range(10):
                served.serve(frame(i))
                wait_for(runner, i + 1)
            summaries[name] = runner.figures()["agreement"]
        finally:
            runner.close()
    assert (summaries["same"]["top1_ratio"], summaries["same"]["topk_overlap"]) == (1.0, 1.0)
    assert summaries["flipped"]["top1_ratio"] == 0.0  # its best is the active's worst
    assert summaries["flipped"]["kind"] == "classification"


class _Cpu:
    """A CPU clock a test moves: each reading of the runner thread costs `step` s."""

    def __init__(self, step: float) -> None:
        self.step, self.now = step, 0.0
        self._lock = threading.Lock()

    def __call__(self) -> float:
        with self._lock:
            self.now += self.step
            return self.now


def test_the_cpu_cap_skips_samples(tmp_path: Path) -> None:
    active = session(echo_model(tmp_path / "a.onnx", (1, 3, *SIZE)), RAW, "1")
    candidate = session(echo_model(tmp_path / "b.onnx", (1, 3, *SIZE), add=1.0), RAW, "2")
    wall = [0.0]
    # Each sample "costs" 0.25 s of CPU (three readings 0.125 s apart), the cap is 10 %.
    runner = ShadowRunner(
        candidate,
        sample_per_mille=1000,
        max_cpu_percent=10,
        cpu_time=_Cpu(0.125),
        wall=lambda: wall[0],
    )
    served = Served(active, runner)
    try:
        served.serve(frame(0))
        wait_for(runner, 1)  # its cost is booked as it is counted
        for i in range(5):  # no wall time passes: over the cap, every one is skipped
            served.serve(frame(i))
        assert runner.counts().samples_skipped_cpu == 5
        wall[0] = 3.0  # 0.3 s of credit came back: one more may run
        served.serve(frame(9))
        wait_for(runner, 2)
        counts = runner.counts()
        figures = runner.figures()
    finally:
        runner.close()
    assert (counts.frames_sampled, counts.frames_compared, counts.samples_skipped_cpu) == (7, 2, 5)
    assert figures["agreement"]["max_abs_diff"] == pytest.approx(1.0)
    assert figures["agreement"]["min_cosine"] < 1.0


class _GatedDecoder:
    """A JPEG decoder stand-in whose decode waits for `gate` (a candidate stuck on a frame)."""

    def __init__(self) -> None:
        self.gate = threading.Event()
        self.entered = threading.Event()

    def decode(self, data: bytes, target: DecodeTarget | None = None) -> npt.NDArray[np.uint8]:
        self.entered.set()
        assert self.gate.wait(10)
        return frame(len(data))


def test_served_frames_never_wait_for_a_busy_candidate(tmp_path: Path) -> None:
    active_path = echo_model(tmp_path / "a.onnx", (1, 3, *SIZE))
    decoder = _GatedDecoder()
    candidate = session(echo_model(tmp_path / "b.onnx", (1, 3, *SIZE)), RAW, "2")
    runner = ShadowRunner(candidate, sample_per_mille=1000, max_cpu_percent=100, decoder=decoder)
    results: list[InferenceResult] = []
    done = threading.Semaphore(0)

    def on_result(result: InferenceResult) -> None:
        results.append(result)
        done.release()

    plain: list[InferenceResult] = []
    images = [frame(i) for i in range(8)]
    for shadowed in (False, True):
        pipeline = InferencePipeline(
            session(active_path, RAW, "1"),
            [StreamConfig("cam", queue_size=16)],
            SystemClock(),
            on_result,
        )
        if shadowed:
            # The candidate's own frames are bytes its (stuck) decoder must read.
            pipeline.set_tap(lambda data, out, dec, label: runner.offer(b"jpeg", out, dec, label))
        with pipeline:
            for image in images:
                assert pipeline.submit("cam", image).queued
                assert done.acquire(timeout=10)
        if not shadowed:
            plain, results = list(results), []
    try:
        assert decoder.entered.wait(10)  # the candidate took one frame and is stuck on it
        counts = runner.counts()
        assert (counts.frames_sampled, counts.samples_dropped) == (8, 7)
        # What was served is what the same frames gave without a candidate beside them.
        assert [r.decoded for r in results] == [r.decoded for r in plain]
        assert len(results) == 8
    finally:
        decoder.gate.set()
        runner.close()


def test_a_candidate_that_fails_on_a_frame_is_counted(tmp_path: Path) -> None:
    active = session(echo_model(tmp_path / "a.onnx", (1, 3, *SIZE)), RAW, "1")
    candidate = session(echo_model(tmp_path / "b.onnx", (1, 3, *SIZE)), RAW, "2")
    runner = ShadowRunner(candidate, sample_per_mille=1000, max_cpu_percent=100)
    try:
        outputs = active.run(active.preprocessor(frame(0)))
        decoded = active.decode(outputs, 12, 16)
        runner.offer(b"not an image", outputs, decoded, active.label)  # no decoder for bytes
        wait_for(runner, 1)
        assert runner.counts().samples_failed == 1
        assert runner.figures()["frames_compared"] == 0
    finally:
        runner.close()
    runner.close()  # twice is fine


def matmul_chain(path: Path, steps: int) -> Path:
    """[1, 3, 32, 32] -> the same shape, through `steps` MatMuls by a fixed 32x32 matrix:
    the work grows with `steps`, nothing else does."""
    weight = np.eye(32, dtype=np.float32) * 0.5
    nodes = []
    name = "images"
    for i in range(steps):
        nodes.append(helper.make_node("MatMul", [name, "w"], [f"t{i}"]))
        name = f"t{i}"
    nodes.append(helper.make_node("Identity", [name], ["y"]))
    graph = helper.make_graph(
        nodes,
        "chain",
        inputs=[helper.make_tensor_value_info("images", TensorProto.FLOAT, [1, 3, 32, 32])],
        outputs=[helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3, 32, 32])],
        initializer=[helper.make_tensor("w", TensorProto.FLOAT, [32, 32], weight.ravel())],
    )
    return _save(graph, path)


def paired_ratio(tmp_path: Path, candidate_steps: int, frames: int = 24) -> dict[str, object]:
    """The runner's latency figures of a candidate of `candidate_steps` beside an active
    model of 8, with the active model's bytes as the reference (one thread each, as the
    agent loads them)."""
    spec = RuntimeSpec(preprocess=PreprocessConfig(size=(32, 32)))
    one = SessionConfig(intra_op_threads=1, inter_op_threads=1, execution_mode="sequential")
    active_path = matmul_chain(tmp_path / "active.onnx", 8)
    load = ModelSession.load
    active = load(active_path, SessionConfig(), runtime=spec, model="m", version="1")
    reference = load(active_path, one, runtime=spec, model="m", version="1")
    candidate = load(
        matmul_chain(tmp_path / f"c{candidate_steps}.onnx", candidate_steps),
        one,
        runtime=spec,
        model="m",
        version="2",
    )
    runner = ShadowRunner(
        candidate, sample_per_mille=1000, max_cpu_percent=100, reference=reference
    )
    served = Served(active, runner)
    try:
        for i in range(frames):
            served.serve(frame(i))
            wait_for(runner, i + 1)
        figures = runner.figures()
    finally:
        runner.close()
        active.close()
    assert reference.closed and candidate.closed
    return figures


def test_shadow_latency_is_paired_with_the_active_model_on_the_same_frames(
    tmp_path: Path,
) -> None:
    """Identical bytes read as a ratio near 1 (not the served model's queue and threads
    against the candidate's CPU time); a candidate with 64x the work reads clearly slower."""
    same = paired_ratio(tmp_path, 8)
    assert same["frames_compared"] == 24
    assert same["latency"].count == same["reference_latency"].count == 24  # type: ignore[attr-defined]
    ratio = same["latency_ratio_p50"]
    assert isinstance(ratio, float) and 0.5 <= ratio <= 2.0, ratio
    slower = paired_ratio(tmp_path, 512)["latency_ratio_p50"]
    assert isinstance(slower, float) and slower >= 3 * ratio, (slower, ratio)


def test_without_a_reference_only_the_candidate_is_timed(tmp_path: Path) -> None:
    active = session(echo_model(tmp_path / "a.onnx", (1, 3, *SIZE)), RAW, "1")
    other = session(echo_model(tmp_path / "r.onnx", (1, 3, *SIZE)), RAW, "9")
    same = session(echo_model(tmp_path / "b.onnx", (1, 3, *SIZE), add=-0.0), RAW, "2")
    # A reference of another label than the served model's is not timed.
    runner = ShadowRunner(same, sample_per_mille=1000, max_cpu_percent=100, reference=other)
    try:
        Served(active, runner).serve(frame(0))
        wait_for(runner, 1)
        figures = runner.figures()
    finally:
        runner.close()
    assert figures["latency"].count == 1
    assert figures["reference_latency"].count == 0
    assert figures["latency_ratio_p50"] is None
    assert other.closed
