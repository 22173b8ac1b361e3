"""`RuntimeHost`: the agent's runtime side of the `ModelHost` port (design §5, hot swap).

It loads a verified model with its bundle into an ONNX Runtime session — the version's
signed preprocessing and output decoder, the node's session options (threads, execution
providers, graph optimisation: the only per-box overrides) — self-tests that very session
when the update path asks for a trial, starts the inference pipeline with it or hot-swaps
it in (in-flight frames finish on the old session), and reports the served model's run
counters and where its runtime settings came from (`runtime_use`, for health reports).
node.yaml's `runtime.preprocess` serves only versions without a signed spec and a local
`model_path`. It is the `ShadowHost` too (ADR 0031): a shadow candidate is loaded with one
intra-op thread (so its CPU time is its thread's) and self-tested at background priority,
then run by a `ShadowRunner` on the frames the pipeline's tap hands it; it never serves.
Beside it the served model's bytes are loaded the same way, as the runner's `reference`:
timed on the same sampled frames, so the candidate's latency is compared with like.
Not here: which model to serve, or when (the update task).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any, Final, TypeVar

import anyio
import anyio.to_thread

from edge_node.clock import Clock
from edge_node.config import AgentConfig
from edge_node.errors import ClosedError
from edge_node.runtime.config import PreprocessConfig, SessionConfig
from edge_node.runtime.errors import ModelLoadError
from edge_node.runtime.pipeline import InferencePipeline
from edge_node.runtime.preprocess import default_decoder
from edge_node.runtime.priority import Background, background_safe, run_in_background
from edge_node.runtime.session import ModelSession, RuntimeSource
from edge_node.runtime.shadow import ShadowRunner
from edge_node.telemetry.report import sketch_summary
from edge_node.updater.host import ModelBundle, ShadowSettings, Trial
from edge_node.updater.selftest import SelfTestResult
from edge_node.updater.watchdog import ModelHealth
from protos.bundle.results import InferenceResult

__all__ = ["RuntimeHost", "RuntimeUse"]

log = logging.getLogger(__name__)

_STOP_S: Final = 5.0
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class RuntimeUse:
    """Where the served model's runtime settings come from (the health report's
    `model_runtime`): `config` "signed" (the version's spec) or "node" (node.yaml's
    preprocess), the session settings node.yaml overrides, and whether node.yaml's
    preprocess is set but not used."""

    config: RuntimeSource
    session_overrides: tuple[str, ...] = ()
    node_preprocess_ignored: bool = False

    def to_report(self) -> dict[str, Any]:
        return {
            "config": self.config,
            "session_overrides": list(self.session_overrides),
            "node_preprocess_ignored": self.node_preprocess_ignored,
        }


def session_overrides(config: SessionConfig) -> tuple[str, ...]:
    """The session settings `config` sets away from the defaults, by name."""
    default = SessionConfig()
    return tuple(
        f.name for f in fields(SessionConfig) if getattr(config, f.name) != getattr(default, f.name)
    )


class RuntimeHost:
    def __init__(
        self,
        config: AgentConfig,
        clock: Clock,
        *,
        on_result: Callable[[InferenceResult], None],
        stopping: anyio.Event,
    ) -> None:
        """`on_result` sees every frame's decoded result; once `stopping` is set, nothing
        more is served."""
        self._config = config
        self._clock = clock
        self._on_result = on_result
        self._stopping = stopping
        self._pipeline: InferencePipeline | None = None
        self._standby: ModelSession | None = None  # loaded, but no stream to serve
        self._model: str | None = None
        self._use: RuntimeUse | None = None
        self._overrides = session_overrides(config.runtime.session)
        # node.yaml sets a preprocess section (anything but the defaults).
        self._node_preprocess = config.runtime.preprocess != PreprocessConfig()
        self._warned_ignored: set[str] = set()
        self._lock = anyio.Lock()
        self._shadow: ShadowRunner | None = None

    @property
    def pipeline(self) -> InferencePipeline | None:
        """The runtime, once a model is loaded and a stream is configured."""
        return self._pipeline

    @property
    def model(self) -> str | None:
        """The label (`name@version`) of the model served (or kept ready) now."""
        return self._model

    def runtime_use(self) -> RuntimeUse | None:
        """Where the served model's runtime settings come from (None before any serves)."""
        return self._use

    def _load(self, bundle: ModelBundle) -> ModelSession:
        runtime = self._config.runtime
        return ModelSession.load(
            bundle.path,
            runtime.session,
            runtime.preprocess,
            runtime=bundle.runtime,
            model=bundle.model,
            version=bundle.version,
        )

    async def serve(
        self, bundle: ModelBundle, *, trial: Trial | None = None
    ) -> SelfTestResult | None:
        """Serve `bundle` (start the runtime, or hot-swap); see `ModelHost.serve`.

        With `trial`, the session loaded for serving is self-tested first (in a worker
        thread: the old model serves meanwhile) and, if it passes, that same session
        serves. Raises `ModelLoadError` / `ModelSignatureError` when the model cannot
        serve with its bundle; the current model (if any) keeps serving then. With no
        camera stream configured the model is loaded and checked all the same, and kept
        ready (nothing to run it on yet).
        """
        config = self._config
        if self._stopping.is_set():
            raise ClosedError("the agent is stopping")
        loaded: list[ModelSession] = []

        def load() -> ModelSession:
            session = self._load(bundle)
            loaded.append(session)
            return session

        result: SelfTestResult | None = None
        if trial is None:
            session = await self._beside_frames(load, f"load {bundle.label}")
        else:
            result = await self._beside_frames(lambda: trial(load), f"trial {bundle.label}")
            if not result.ok or not loaded:
                for unused in loaded:
                    unused.close()
                if result.ok:  # a trial that never loaded the model proves nothing
                    raise ModelLoadError(
                        f"the self-test of {bundle.label} did not load it", path=str(bundle.path)
                    )
                return result
            *extra, session = loaded
            for unused in extra:
                unused.close()
        async with self._lock:
            if self._stopping.is_set():
                session.close()
                raise ClosedError("the agent is stopping")
            if not config.runtime.streams:
                standby, self._standby = self._standby, session
                if standby is not None:
                    standby.close()
            elif self._pipeline is None:
                pipeline = InferencePipeline(
                    session,
                    config.runtime.streams,
                    self._clock,
                    self._on_result,
                    scheduler_config=config.runtime.scheduler,
                    workers=config.runtime_workers,
                    preprocess_threads=config.runtime_preprocess_threads,
                )
                pipeline.start()
                self._pipeline = pipeline
                if self._shadow is not None:
                    pipeline.set_tap(self._shadow.offer)
            else:
                self._pipeline.swap_session(session)  # in-flight frames finish on the old one
            self._model = session.label
            self._use = RuntimeUse(
                session.runtime_source,
                self._overrides,
                self._node_preprocess and session.runtime_source == "signed",
            )
        if self._use.node_preprocess_ignored and session.label not in self._warned_ignored:
            self._warned_ignored.add(session.label)
            log.warning(
                "node.yaml sets runtime.preprocess, but %s carries a signed runtime spec: "
                "serving it with the signed preprocessing (node.yaml's applies only to "
                "versions without one and to a local model_path)",
                session.label,
            )
        log.info(
            "serving model %s (%s runtime config%s) from %s",
            session.label,
            session.runtime_source,
            "; node session settings: " + ", ".join(self._overrides) if self._overrides else "",
            bundle.path,
        )
        return result

    async def _beside_frames(self, work: Callable[[], T], name: str) -> T:
        """`work()` in a worker thread; while a model serves frames, at the node's
        `runtime.trial_priority` (background by default), when its session options let
        a session built there serve (`background_safe`): the frames then preempt the
        next version's load and self-test, and the self-test times itself on the
        thread's CPU time (`work_time`)."""
        mode = self._config.runtime_trial_priority
        if (
            self._pipeline is None
            or mode == "normal"
            or not background_safe(self._config.runtime.session)
        ):
            return await anyio.to_thread.run_sync(work)
        return await anyio.to_thread.run_sync(
            lambda: run_in_background(work, name=f"edgefleet {name}", mode=mode)
        )

    # ------------------------------------------------------------------ shadow

    async def run_shadow(
        self, bundle: ModelBundle, settings: ShadowSettings, *, trial: Trial
    ) -> SelfTestResult:
        """Load and self-test `bundle` at background priority, then run it in shadow on
        the served frames; see `ShadowHost.run_shadow`."""
        if self._stopping.is_set():
            raise ClosedError("the agent is stopping")
        runtime = self._config.runtime
        # One intra-op thread, sequential: no thread pool (it would run at the priority of
        # the thread that built it) and the CPU time the budget counts is the thread's.
        options = dataclasses.replace(
            runtime.session, intra_op_threads=1, inter_op_threads=1, execution_mode="sequential"
        )
        loaded: list[ModelSession] = []

        def load() -> ModelSession:
            session = ModelSession.load(
                bundle.path,
                options,
                runtime.preprocess,
                runtime=bundle.runtime,
                model=bundle.model,
                version=bundle.version,
            )
            loaded.append(session)
            return session

        mode = self._shadow_priority()
        result = await anyio.to_thread.run_sync(
            lambda: run_in_background(
                lambda: trial(load), name=f"edgefleet shadow trial {bundle.label}", mode=mode
            )
        )
        if not result.ok or not loaded:
            for unused in loaded:
                unused.close()
            if result.ok:
                raise ModelLoadError(
                    f"the self-test of {bundle.label} did not load it", path=str(bundle.path)
                )
            return result
        *extra, session = loaded
        for unused in extra:
            unused.close()
        reference = await anyio.to_thread.run_sync(
            lambda: run_in_background(
                lambda: self._reference(options), name="edgefleet shadow reference", mode=mode
            )
        )
        runner = ShadowRunner(
            session,
            sample_per_mille=settings.sample_per_mille,
            max_cpu_percent=settings.max_cpu_percent,
            decoder=default_decoder(),
            reference=reference,
            priority=mode,
        )
        async with self._lock:
            if self._stopping.is_set():
                runner.close()
                raise ClosedError("the agent is stopping")
            previous, self._shadow = self._shadow, runner
            if self._pipeline is not None:
                self._pipeline.set_tap(runner.offer)
        if previous is not None:
            await anyio.to_thread.run_sync(previous.close)
        log.info("shadow %s runs beside %s", runner.label, self._model or "nothing yet")
        return result

    def _reference(self, options: SessionConfig) -> ModelSession | None:
        """The served model's bytes loaded with the candidate's `options`, for the runner
        to time on the same frames (None: nothing serves, or it did not load: the
        candidate is then timed alone)."""
        pipeline = self._pipeline
        served = pipeline.session if pipeline is not None else self._standby
        if served is None:
            return None
        try:
            return ModelSession.load(
                served.path,
                options,
                served.preprocess,
                runtime=served.runtime,
                model=served.model,
                version=served.version,
            )
        except Exception as exc:  # the candidate runs on; only its latency is unpaired
            log.warning("shadow reference %s did not load: %s", served.label, exc)
            return None

    async def stop_shadow(self) -> None:
        """Detach the candidate from the frames, stop its thread and close its session."""
        async with self._lock:
            runner, self._shadow = self._shadow, None
            if self._pipeline is not None:
                self._pipeline.set_tap(None)
        if runner is not None:
            await anyio.to_thread.run_sync(runner.close)

    def shadow_figures(self) -> dict[str, Any] | None:
        """The running candidate's counts, agreement and latency (None when none runs)."""
        runner = self._shadow
        if runner is None:
            return None
        figures = runner.figures()
        figures["latency"] = sketch_summary(figures["latency"], with_sketch=True)
        reference = figures.pop("reference_latency")
        if reference is not None:
            figures["reference_latency"] = sketch_summary(reference, with_sketch=True)
        if figures["latency_ratio_p50"] is None:
            del figures["latency_ratio_p50"]
        return figures

    @property
    def shadow(self) -> ShadowRunner | None:
        """The candidate running in shadow, if any."""
        return self._shadow

    def _shadow_priority(self) -> Background:
        mode = self._config.runtime_trial_priority
        return "nice" if mode == "normal" else mode

    def health(self) -> ModelHealth | None:
        """Run counters of the model being served (the update task's watchdog reads them)."""
        pipeline = self._pipeline
        session = pipeline.session if pipeline is not None else self._standby
        if session is None:
            return None
        runs, failures = session.run_counts()
        return ModelHealth(str(session.path), runs, failures)

    async def stop_serving(self) -> None:
        """Serve nothing (see `ModelHost.stop_serving`): the pipeline stops, its in-flight
        frames finish, and every session closes; the next `serve` starts a new pipeline."""
        await self.close()  # takes the lock itself (via stop_shadow)
        self._model = None
        self._use = None
        log.warning("serving no model")

    async def close(self) -> None:
        """Stop the pipeline (its in-flight frames finish) and close every session."""
        await self.stop_shadow()
        pipeline, self._pipeline = self._pipeline, None
        if pipeline is not None:
            await anyio.to_thread.run_sync(pipeline.stop, _STOP_S)
        standby, self._standby = self._standby, None
        if standby is not None:
            standby.close()
