"""`RuntimeHost`: the agent's runtime side of the `ModelHost` port (design §5, hot swap).

It loads a verified model into an ONNX Runtime session, starts the inference pipeline
with it or hot-swaps it in (in-flight frames finish on the old session), and reports the
served model's run counters. Not here: which model to serve, or when (the update task).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Final

import anyio
import anyio.to_thread

from edge_node.clock import Clock
from edge_node.config import AgentConfig
from edge_node.errors import ClosedError
from edge_node.runtime.pipeline import FrameResult, InferencePipeline
from edge_node.runtime.session import ModelSession
from edge_node.updater.watchdog import ModelHealth

__all__ = ["RuntimeHost"]

log = logging.getLogger(__name__)

_STOP_S: Final = 5.0


class RuntimeHost:
    def __init__(
        self,
        config: AgentConfig,
        clock: Clock,
        *,
        on_result: Callable[[FrameResult], None],
        stopping: anyio.Event,
    ) -> None:
        """`on_result` sees every frame's result; once `stopping` is set, nothing more
        is served."""
        self._config = config
        self._clock = clock
        self._on_result = on_result
        self._stopping = stopping
        self._pipeline: InferencePipeline | None = None
        self._standby: ModelSession | None = None  # loaded, but no stream to serve
        self._model: str | None = None
        self._lock = anyio.Lock()

    @property
    def pipeline(self) -> InferencePipeline | None:
        """The runtime, once a model is loaded and a stream is configured."""
        return self._pipeline

    @property
    def model(self) -> str | None:
        """The path of the model served (or kept ready) now, for the health report."""
        return self._model

    async def serve(self, path: Path) -> None:
        """Serve the model at `path` (start the runtime, or hot-swap).

        Raises `ModelLoadError` / `ModelSignatureError` when the model cannot serve with
        the configured preprocessing; the current model (if any) keeps serving then.
        With no camera stream configured the model is loaded and checked all the same,
        and kept ready (nothing to run it on yet).
        """
        config = self._config
        if self._stopping.is_set():
            raise ClosedError("the agent is stopping")
        session = await anyio.to_thread.run_sync(
            lambda: ModelSession.load(path, config.runtime.session, config.runtime.preprocess)
        )
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
            else:
                self._pipeline.swap_session(session)  # in-flight frames finish on the old one
            self._model = str(path)
        log.info("serving model %s", path)

    def health(self) -> ModelHealth | None:
        """Run counters of the model being served (the update task's watchdog reads them)."""
        pipeline = self._pipeline
        session = pipeline.session if pipeline is not None else self._standby
        if session is None:
            return None
        runs, failures = session.run_counts()
        return ModelHealth(str(session.path), runs, failures)

    async def close(self) -> None:
        """Stop the pipeline (its in-flight frames finish) and close every session."""
        pipeline, self._pipeline = self._pipeline, None
        if pipeline is not None:
            await anyio.to_thread.run_sync(pipeline.stop, _STOP_S)
        standby, self._standby = self._standby, None
        if standby is not None:
            standby.close()
