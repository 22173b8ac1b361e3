"""The shadow candidate at run time: a second model on a sample of the served frames, off
the serving path (ADR 0031).

What it is for: :class:`ShadowRunner` owns a loaded candidate session and one thread at
background CPU priority (``lower_this_thread``: the frames preempt it). The pipeline's
inference workers hand it each served frame with the active model's outputs
(:meth:`ShadowRunner.offer`, O(1), never blocking): the sampler picks ``sample_per_mille``
of them, the CPU budget skips one when the candidate has used its share
(``max_cpu_percent`` of a core, on the thread's own CPU time), and a hand-off of one frame
drops a sample while the candidate is still busy with the last (counted), so a served
frame never waits for it. The thread decodes the frame with the candidate's own
preprocessing, runs it, decodes the outputs with the candidate's own signed decoder and
compares them with the active model's (:mod:`protos.bundle.agreement`; raw outputs as
tensors). It times the candidate on its CPU time into a latency sketch.

Latency, like with like (ADR 0031 amendment): the served model's own latency (queue,
preprocess, inference and decode in wall time, on a thread at normal priority, with the
node's thread pool) is not what the candidate's is. With a `reference` -- the active
model's bytes loaded the way the candidate is (one intra-op thread) -- the thread runs both
on each sampled frame, one after the other in an order that alternates frame by frame (so
neither always finds the frame in cache), and times each the same way: its CPU time to
decode, preprocess, run and decode the outputs. It reports the reference's sketch beside
the candidate's and the median of the per-frame ratios (candidate over reference), so a
candidate twice as slow reads as 2 whatever the served model's queueing and threads.

What it is not for: deciding which candidate runs or whether it passed its self-test (the
updater's shadow stage), or serving: nothing it computes reaches the results interface.
The candidate session must start no thread pool (one intra-op thread, sequential), so
that its CPU time is the thread's and its priority stays low.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

import numpy.typing as npt

from edge_node.errors import ClosedError
from edge_node.runtime.preprocess import DecodeTarget, FrameData, FrameDecoder, decode_frame
from edge_node.runtime.priority import Background, lower_this_thread
from edge_node.runtime.session import ModelSession
from edge_node.runtime.shadow_budget import CpuBudget, FrameSampler
from protos.bundle.agreement import (
    AgreementTally,
    FrameAgreement,
    compare_decoded,
    compare_raw,
)
from protos.bundle.results import Decoded
from protos.latency_sketch import LatencySketch

__all__ = ["HANDOFF_FRAMES", "ShadowCounts", "ShadowRunner"]

_log = logging.getLogger(__name__)

HANDOFF_FRAMES: Final = 1
"""Sampled frames waiting for the candidate: one (a busy candidate drops the next)."""
_JOIN_S: Final = 5.0


@dataclass(frozen=True, slots=True)
class _Sample:
    data: FrameData
    outputs: Mapping[str, npt.NDArray[Any]]
    decoded: Decoded
    against: str


@dataclass(frozen=True, slots=True)
class ShadowCounts:
    """Counts since the runner started (`frames_*` are sampled frames)."""

    frames_sampled: int
    frames_compared: int
    samples_dropped: int
    samples_skipped_cpu: int
    samples_failed: int


class ShadowRunner:
    """Runs `session` beside the served model; `close()` stops it (safe to call twice).

    `reference`: the active model loaded as the candidate is (one intra-op thread), timed
    on the same frames the same way (closed with the runner); it is run only on frames
    served by a model of its label. `cpu_time` is the runner thread's CPU clock
    (``time.thread_time``), `wall` a monotonic clock: both injectable so a test can hold
    the budget."""

    def __init__(
        self,
        session: ModelSession,
        *,
        sample_per_mille: int,
        max_cpu_percent: int,
        decoder: FrameDecoder | None = None,
        reference: ModelSession | None = None,
        priority: Background = "nice",
        cpu_time: Callable[[], float] = time.thread_time,
        wall: Callable[[], float] = time.monotonic,
    ) -> None:
        if session.closed:
            raise ClosedError(f"model session {session.label} is closed", label=session.label)
        self.session = session
        self.sample_per_mille = sample_per_mille
        self.max_cpu_percent = max_cpu_percent
        self._decoder = decoder
        self._target = DecodeTarget.of(session.preprocessor)
        self._reference = reference
        self._reference_target = (
            None if reference is None else DecodeTarget.of(reference.preprocessor)
        )
        self._priority: Background = priority
        self._cpu_time = cpu_time
        self._wall = wall
        self._sampler = FrameSampler(sample_per_mille)
        self._budget = CpuBudget(max_cpu_percent, wall())
        self._tally = AgreementTally()
        self._sketch = LatencySketch()
        self._reference_sketch = LatencySketch()
        self._ratios = LatencySketch()
        self._paired = 0
        self._against = ""
        self._queue: deque[_Sample] = deque()
        self._lock = threading.Lock()
        self._ready = threading.Condition(self._lock)
        self._closed = False
        self._busy = False
        self._sampled = 0
        self._compared = 0
        self._dropped = 0
        self._skipped_cpu = 0
        self._failed = 0
        self._thread = threading.Thread(
            target=self._run, name=f"edgefleet shadow {session.label}", daemon=True
        )
        self._thread.start()

    @property
    def label(self) -> str:
        return self.session.label

    @property
    def reference(self) -> ModelSession | None:
        """The active model's session timed beside the candidate (None: timed alone)."""
        return self._reference

    # -- the serving side (inference workers) ------------------------------------------

    def offer(
        self,
        data: FrameData,
        outputs: Mapping[str, npt.NDArray[Any]],
        decoded: Decoded,
        against: str,
    ) -> None:
        """A frame just served by `against` (its outputs and decoded result). Never blocks
        beyond a short lock; the frame is taken, or counted as not taken."""
        with self._lock:
            if self._closed or not self._sampler.pick():
                return
            self._sampled += 1
            if not self._budget.allows(self._wall()):
                self._skipped_cpu += 1
                return
            if self._busy or len(self._queue) >= HANDOFF_FRAMES:
                self._dropped += 1
                return
            self._queue.append(_Sample(data, outputs, decoded, against))
            self._ready.notify()

    # -- the candidate's thread ----------------------------------------------------------

    def _run(self) -> None:
        lower_this_thread(self._priority)
        while True:
            with self._lock:
                while not self._queue and not self._closed:
                    self._ready.wait()
                if self._closed:
                    return
                sample = self._queue.popleft()
                self._busy = True
            started = self._cpu_time()
            try:
                frame, computed, referenced = self._compare(sample, started)
            except Exception as exc:  # a candidate that cannot run a frame: counted
                spent = self._cpu_time() - started
                with self._lock:
                    self._failed += 1
                    failed = self._failed
                    self._done(spent)
                if failed == 1 or failed % 1000 == 0:
                    _log.warning(
                        "shadow %s failed on a frame (%d so far): %s", self.label, failed, exc
                    )
                continue
            spent = self._cpu_time() - started
            with self._lock:
                if sample.against != self._against:
                    # Another model serves now: its agreement is a new question.
                    self._against = sample.against
                    self._tally.reset()
                    self._reference_sketch = LatencySketch()
                    self._ratios = LatencySketch()
                self._tally.add(frame)
                self._compared += 1
                self._sketch.add(computed * 1000.0)
                if referenced is not None:
                    self._reference_sketch.add(referenced * 1000.0)
                    if referenced > 0 and computed > 0:
                        self._ratios.add(computed / referenced)
                self._done(spent)

    def _done(self, spent_s: float) -> None:
        """Under the lock: the sample's CPU time is booked as its counts become visible."""
        self._busy = False
        self._budget.spend(spent_s, self._wall())

    def _compare(
        self, sample: _Sample, started: float
    ) -> tuple[FrameAgreement, float, float | None]:
        """Run the candidate on the sample; its agreement, its CPU seconds of compute and,
        with a reference of the model that served the frame, the reference's, timed the
        same way (the order alternates frame by frame)."""
        reference = self._reference
        if reference is None or reference.label != sample.against or reference.closed:
            outputs, decoded, computed = self._timed(self.session, self._target, sample)
            referenced = None
        else:
            self._paired += 1
            if self._paired % 2:
                outputs, decoded, computed = self._timed(self.session, self._target, sample)
                referenced = self._timed(reference, self._reference_target, sample)[2]
            else:
                referenced = self._timed(reference, self._reference_target, sample)[2]
                outputs, decoded, computed = self._timed(self.session, self._target, sample)
        if sample.decoded.kind == "raw" and decoded.kind == "raw":
            return compare_raw(sample.outputs, outputs), computed, referenced
        return compare_decoded(sample.decoded, decoded), computed, referenced

    def _timed(
        self, session: ModelSession, target: DecodeTarget | None, sample: _Sample
    ) -> tuple[Mapping[str, npt.NDArray[Any]], Decoded, float]:
        """`session` on the sample's frame: its outputs, decoded result and CPU seconds
        (frame decode, preprocessing, run and output decode)."""
        started = self._cpu_time()
        image = decode_frame(sample.data, self._decoder, target)
        outputs = session.run(session.preprocessor(image, reuse=True))
        decoded = session.decode(outputs, int(image.shape[0]), int(image.shape[1]))
        return outputs, decoded, self._cpu_time() - started

    # -- reading and stopping ------------------------------------------------------------

    def counts(self) -> ShadowCounts:
        with self._lock:
            return ShadowCounts(
                self._sampled, self._compared, self._dropped, self._skipped_cpu, self._failed
            )

    def figures(self) -> dict[str, Any]:
        """The running figures of the health report's `shadow` section; `latency` is a
        copy of the candidate's latency sketch (milliseconds), for the report to sum up,
        `reference_latency` the reference's on the same frames (None without one), and
        `latency_ratio_p50` the median per-frame ratio of the two (None before a pair)."""
        with self._lock:
            cpu = self._budget.cpu_percent(self._wall())
            return {
                "against": self._against,
                "frames_sampled": self._sampled,
                "frames_compared": self._compared,
                "samples_dropped": self._dropped,
                "samples_skipped_cpu": self._skipped_cpu,
                "samples_failed": self._failed,
                "cpu_percent": None if cpu is None else round(cpu, 3),
                "agreement": self._tally.summary().to_report(),
                "latency": self._sketch.copy(),
                "reference_latency": None
                if self._reference is None
                else self._reference_sketch.copy(),
                "latency_ratio_p50": None
                if not self._ratios.count
                else round(self._ratios.quantile(0.5) or 0.0, 3),
            }

    def close(self, timeout_s: float = _JOIN_S) -> None:
        """Stop the thread (a frame being run finishes first) and close the session."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._queue.clear()
            self._ready.notify_all()
        self._thread.join(timeout_s)
        self.session.close()
        if self._reference is not None:
            self._reference.close()
