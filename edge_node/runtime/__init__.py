"""The edge node's inference runtime: ONNX Runtime sessions fed by many camera streams.

``config`` (what an operator writes), ``session`` (a loaded model checked against its
preprocessing), ``preprocess`` (frame → tensor), ``streams`` (admission, queues, priorities,
shedding — pure bookkeeping) and ``pipeline`` (worker threads, latency split, hot swap).
Nothing here imports ``control_plane``; importing this package starts nothing.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from edge_node.runtime.config import (
        PreprocessConfig,
        RuntimeConfig,
        SchedulerConfig,
        SessionConfig,
        StreamConfig,
        parse_preprocess_config,
        parse_runtime_config,
        parse_scheduler_config,
        parse_session_config,
        parse_stream_config,
        parse_streams,
    )
    from edge_node.runtime.errors import (
        BadFrameError,
        InferenceError,
        ModelLoadError,
        ModelSignatureError,
        RuntimeConfigError,
    )
    from edge_node.runtime.pipeline import (
        FrameResult,
        InferencePipeline,
        SessionRetirement,
        StopReport,
    )
    from edge_node.runtime.preprocess import Preprocessor
    from edge_node.runtime.session import ModelSession
    from edge_node.runtime.streams import Scheduler, StreamStats, SubmitOutcome
    from edge_node.runtime.timing import ManualTicker, SystemTicker, Ticker

__all__ = [
    "BadFrameError",
    "FrameResult",
    "InferenceError",
    "InferencePipeline",
    "ManualTicker",
    "ModelLoadError",
    "ModelSession",
    "ModelSignatureError",
    "PreprocessConfig",
    "Preprocessor",
    "RuntimeConfig",
    "RuntimeConfigError",
    "Scheduler",
    "SchedulerConfig",
    "SessionConfig",
    "SessionRetirement",
    "StopReport",
    "StreamConfig",
    "StreamStats",
    "SubmitOutcome",
    "SystemTicker",
    "Ticker",
    "parse_preprocess_config",
    "parse_runtime_config",
    "parse_scheduler_config",
    "parse_session_config",
    "parse_stream_config",
    "parse_streams",
]

# Public name -> (module, attribute), loaded on first use (PEP 562)
# so that importing a pure submodule (`config`, `streams`, `timing`) does not
# load ONNX Runtime through this package.
_EXPORTS: dict[str, tuple[str, str]] = {
    "BadFrameError": ("edge_node.runtime.errors", "BadFrameError"),
    "FrameResult": ("edge_node.runtime.pipeline", "FrameResult"),
    "InferenceError": ("edge_node.runtime.errors", "InferenceError"),
    "InferencePipeline": ("edge_node.runtime.pipeline", "InferencePipeline"),
    "ManualTicker": ("edge_node.runtime.timing", "ManualTicker"),
    "ModelLoadError": ("edge_node.runtime.errors", "ModelLoadError"),
    "ModelSession": ("edge_node.runtime.session", "ModelSession"),
    "ModelSignatureError": ("edge_node.runtime.errors", "ModelSignatureError"),
    "PreprocessConfig": ("edge_node.runtime.config", "PreprocessConfig"),
    "Preprocessor": ("edge_node.runtime.preprocess", "Preprocessor"),
    "RuntimeConfig": ("edge_node.runtime.config", "RuntimeConfig"),
    "RuntimeConfigError": ("edge_node.runtime.errors", "RuntimeConfigError"),
    "Scheduler": ("edge_node.runtime.streams", "Scheduler"),
    "SchedulerConfig": ("edge_node.runtime.config", "SchedulerConfig"),
    "SessionConfig": ("edge_node.runtime.config", "SessionConfig"),
    "SessionRetirement": ("edge_node.runtime.pipeline", "SessionRetirement"),
    "StopReport": ("edge_node.runtime.pipeline", "StopReport"),
    "StreamConfig": ("edge_node.runtime.config", "StreamConfig"),
    "StreamStats": ("edge_node.runtime.streams", "StreamStats"),
    "SubmitOutcome": ("edge_node.runtime.streams", "SubmitOutcome"),
    "SystemTicker": ("edge_node.runtime.timing", "SystemTicker"),
    "Ticker": ("edge_node.runtime.timing", "Ticker"),
    "parse_preprocess_config": ("edge_node.runtime.config", "parse_preprocess_config"),
    "parse_runtime_config": ("edge_node.runtime.config", "parse_runtime_config"),
    "parse_scheduler_config": ("edge_node.runtime.config", "parse_scheduler_config"),
    "parse_session_config": ("edge_node.runtime.config", "parse_session_config"),
    "parse_stream_config": ("edge_node.runtime.config", "parse_stream_config"),
    "parse_streams": ("edge_node.runtime.config", "parse_streams"),
}


def __getattr__(name: str) -> object:
    try:
        module, attribute = _EXPORTS[name]
    except KeyError:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
    value = getattr(importlib.import_module(module), attribute)
    globals()[name] = value  # later lookups skip __getattr__
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
