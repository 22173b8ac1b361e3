"""The edge node's inference runtime: ONNX Runtime sessions fed by many camera streams.

``config`` (what an operator writes), ``session`` (a loaded model checked against its
preprocessing), ``preprocess`` (frame → tensor), ``streams`` (admission, queues, priorities,
shedding — pure bookkeeping) and ``pipeline`` (worker threads, latency split, hot swap).
Nothing here imports ``control_plane``; importing this package starts nothing.
"""

from __future__ import annotations

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
from edge_node.runtime.pipeline import FrameResult, InferencePipeline, SessionRetirement, StopReport
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
