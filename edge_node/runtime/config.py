"""The runtime's configuration: frozen dataclasses, checked when built, and parsers from dicts.

What it is for: every knob of the inference runtime (ONNX Runtime session options, the
preprocessing a model expects, the camera streams and the scheduler's shedding rules) is
written out here, so nothing depends on a library default that can change under us. The
``parse_*`` functions take plain dicts (what a YAML or JSON file gives) and reject unknown
keys: a misspelt ``meen`` must fail loudly, not silently fall back to a default mean, because
a normalisation mismatch is the classic silent accuracy bug.

What it is not for: checking a config against a model. Only the loaded model knows its input
signature; :meth:`edge_node.runtime.session.ModelSession.load` does that.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Literal, TypeVar, get_args

from edge_node.runtime.errors import RuntimeConfigError
from protos.bundle.spec import (
    BundleError,
    ChannelOrder,
    ElementType,
    Layout,
    PreprocessConfig,
    ResizeMode,
)
from protos.bundle.spec import parse_preprocess_config as _parse_preprocess
from protos.fields import Fields, optional

__all__ = [
    "ChannelOrder",
    "ElementType",
    "ExecutionMode",
    "GraphOptimization",
    "Layout",
    "PreprocessConfig",
    "ResizeMode",
    "RuntimeConfig",
    "SchedulerConfig",
    "SessionConfig",
    "StreamConfig",
    "parse_preprocess_config",
    "parse_runtime_config",
    "parse_scheduler_config",
    "parse_session_config",
    "parse_stream_config",
    "parse_streams",
    "preprocess_threads_for",
]

GraphOptimization = Literal["disable", "basic", "extended", "all"]
ExecutionMode = Literal["sequential", "parallel"]

MAX_THREADS: Final = 256
MAX_SIDE: Final = 8192
MAX_FPS: Final = 1000.0
MAX_QUEUE_SIZE: Final = 1024
MAX_PRIORITY: Final = 1000
MAX_STREAMS: Final = 256
_STREAM_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$")

T = TypeVar("T")


_F: Final = Fields(RuntimeConfigError)  # every check and converter below raises RuntimeConfigError


@dataclass(frozen=True, slots=True)
class SessionConfig:
    """ONNX Runtime session options, all set explicitly on every session we create.

    Thread counts are never left to ONNX Runtime's default (one thread per core), which on a
    shared edge box fights the camera and aggregation threads for the same cores.
    ``allow_spinning`` is off by default, unlike ONNX Runtime's: spinning intra-op threads
    busy-wait between and after runs, and on a 2-core box running cameras and aggregation
    too, that stolen core cost the pipeline up to a third of its throughput in
    ``bench.runtime_overhead`` (docs/benchmarks.md). Turn it on for a dedicated box.
    """

    intra_op_threads: int = 1
    inter_op_threads: int = 1
    graph_optimization: GraphOptimization = "all"
    execution_providers: tuple[str, ...] = ("CPUExecutionProvider",)
    execution_mode: ExecutionMode = "sequential"
    allow_spinning: bool = False

    def __post_init__(self) -> None:
        _F.check_int("session.intra_op_threads", self.intra_op_threads, 1, MAX_THREADS)
        _F.check_int("session.inter_op_threads", self.inter_op_threads, 1, MAX_THREADS)
        _F.check_choice(
            "session.graph_optimization", self.graph_optimization, get_args(GraphOptimization)
        )
        _F.check_choice("session.execution_mode", self.execution_mode, get_args(ExecutionMode))
        providers = self.execution_providers
        if (
            not isinstance(providers, tuple)
            or not providers
            or not all(isinstance(p, str) and p.endswith("ExecutionProvider") for p in providers)
            or len(set(providers)) != len(providers)
        ):
            raise _F.fail(
                "session.execution_providers",
                "must be a non-empty list of distinct names like 'CPUExecutionProvider'",
                providers,
            )
        if not isinstance(self.allow_spinning, bool):
            raise _F.fail("session.allow_spinning", "must be true or false", self.allow_spinning)


@dataclass(frozen=True, slots=True)
class StreamConfig:
    """One camera stream: its rate cap, priority (higher is served first) and queue bound.

    ``target_fps=None`` admits every frame; ``motion_threshold`` (mean absolute difference of
    a downscaled grey frame, in grey levels 0-255) skips frames that did not change.
    """

    name: str
    target_fps: float | None = None
    priority: int = 0
    queue_size: int = 2
    motion_threshold: float | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not _STREAM_NAME.match(self.name):
            raise _F.fail(
                "stream.name", "must be 1-128 characters of letters, digits and _.:-", self.name
            )
        if self.target_fps is not None:
            _F.check_positive(f"streams.{self.name}.target_fps", self.target_fps, MAX_FPS)
        _F.check_int(f"streams.{self.name}.priority", self.priority, -MAX_PRIORITY, MAX_PRIORITY)
        _F.check_int(f"streams.{self.name}.queue_size", self.queue_size, 1, MAX_QUEUE_SIZE)
        if self.motion_threshold is not None:
            _F.check_positive(f"streams.{self.name}.motion_threshold", self.motion_threshold, 255.0)


@dataclass(frozen=True, slots=True)
class SchedulerConfig:
    """How the scheduler sheds load when the box cannot keep up.

    ``max_backlog_frames`` bounds the frames queued across all streams (memory: a 1080p frame
    is 6 MB); when a new frame would exceed it, the oldest frame of the lowest-priority
    stream holding frames is dropped (``shed``). ``shed_after_s``: a queued frame that has
    waited this long while a higher-priority frame is being served is dropped (``shed``) —
    it would only be served stale. ``None`` disables either rule.
    """

    max_backlog_frames: int | None = None
    shed_after_s: float | None = 1.0

    def __post_init__(self) -> None:
        if self.max_backlog_frames is not None:
            _F.check_int(
                "scheduler.max_backlog_frames",
                self.max_backlog_frames,
                1,
                MAX_QUEUE_SIZE * MAX_STREAMS,
            )
        if self.shed_after_s is not None:
            _F.check_positive("scheduler.shed_after_s", self.shed_after_s, 3600.0)


@dataclass(frozen=True, slots=True)
class RuntimeConfig:
    """Everything the runtime section of a node's config file holds."""

    session: SessionConfig = field(default_factory=SessionConfig)
    preprocess: PreprocessConfig = field(default_factory=PreprocessConfig)
    streams: tuple[StreamConfig, ...] = ()
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)


def preprocess_threads_for(cpus: int) -> int:
    """The default number of preprocess threads for a process that may use ``cpus`` CPUs:
    one (decode and preprocessing overlap with inference) when there are two or more, none
    on a single core, where a hand-off between threads only adds work (ADR 0027)."""
    return 1 if cpus >= 2 else 0


# ----------------------------------------------------------------------------- parsing


def _number(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise _F.fail(name, "must be a number", value)
    return float(value)


def _strings(name: str, value: Any) -> tuple[str, ...]:
    if isinstance(value, str | bytes) or not isinstance(value, Sequence):
        raise _F.fail(name, "must be a list of strings", value)
    return tuple(_F.to_str(name, v) for v in value)


def parse_session_config(raw: object) -> SessionConfig:
    reader = _F.reader("session", raw)
    default = SessionConfig()
    config = SessionConfig(
        intra_op_threads=reader.take("intra_op_threads", _F.to_int, default.intra_op_threads),
        inter_op_threads=reader.take("inter_op_threads", _F.to_int, default.inter_op_threads),
        graph_optimization=reader.take(
            "graph_optimization", _F.choice(GraphOptimization), default.graph_optimization
        ),
        execution_providers=reader.take(
            "execution_providers", _strings, default.execution_providers
        ),
        execution_mode=reader.take(
            "execution_mode", _F.choice(ExecutionMode), default.execution_mode
        ),
        allow_spinning=reader.take("allow_spinning", _F.to_bool, default.allow_spinning),
    )
    reader.finish()
    return config


def parse_preprocess_config(raw: object) -> PreprocessConfig:
    """A node's own preprocess section: used only for a model signed without a runtime
    spec (before model bundles) or served from a local ``model_path``."""
    try:
        return _parse_preprocess(raw)
    except BundleError as exc:
        raise RuntimeConfigError(exc.message, field=exc.field) from exc


def parse_stream_config(raw: object) -> StreamConfig:
    reader = _F.reader("stream", raw)
    name = reader.require("name", _F.to_str)
    reader = _F.reader(f"streams.{name}", raw)
    reader.take("name", _F.to_str, name)
    default = StreamConfig(name=name)
    config = StreamConfig(
        name=name,
        target_fps=reader.take("target_fps", optional(_number), default.target_fps),
        priority=reader.take("priority", _F.to_int, default.priority),
        queue_size=reader.take("queue_size", _F.to_int, default.queue_size),
        motion_threshold=reader.take(
            "motion_threshold", optional(_number), default.motion_threshold
        ),
    )
    reader.finish()
    return config


def parse_streams(raw: object) -> tuple[StreamConfig, ...]:
    if isinstance(raw, str | bytes) or not isinstance(raw, Sequence):
        raise _F.fail("streams", "must be a list of streams", raw)
    if len(raw) > MAX_STREAMS:
        raise _F.fail("streams", f"at most {MAX_STREAMS} streams", len(raw))
    streams = tuple(parse_stream_config(item) for item in raw)
    names = [s.name for s in streams]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise _F.fail("streams", "stream names must be unique", duplicates)
    return streams


def parse_scheduler_config(raw: object) -> SchedulerConfig:
    reader = _F.reader("scheduler", raw)
    default = SchedulerConfig()
    config = SchedulerConfig(
        max_backlog_frames=reader.take(
            "max_backlog_frames", optional(_F.to_int), default.max_backlog_frames
        ),
        shed_after_s=reader.take("shed_after_s", optional(_number), default.shed_after_s),
    )
    reader.finish()
    return config


def parse_runtime_config(raw: object) -> RuntimeConfig:
    """The whole runtime section: ``{session, preprocess, streams, scheduler}``."""
    reader = _F.reader("runtime", raw)
    config = RuntimeConfig(
        session=reader.take("session", lambda _, v: parse_session_config(v), SessionConfig()),
        preprocess=reader.take(
            "preprocess", lambda _, v: parse_preprocess_config(v), PreprocessConfig()
        ),
        streams=reader.take("streams", lambda _, v: parse_streams(v), ()),
        scheduler=reader.take(
            "scheduler", lambda _, v: parse_scheduler_config(v), SchedulerConfig()
        ),
    )
    reader.finish()
    return config
