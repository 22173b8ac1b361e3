"""One loaded model: an ONNX Runtime session built from explicit options, checked at load.

What it is for: :meth:`ModelSession.load` creates the ``InferenceSession`` with every
option set from :class:`~edge_node.runtime.config.SessionConfig` (threads, graph
optimisation, execution mode, spinning: the node's, the only per-box settings), picks the
configured execution providers that this build of ONNX Runtime has (always ending with the
CPU provider), and checks the preprocessing against the model's single image input before a
frame is run: rank, channel axis, spatial size, element type and, where the model carries
it in its metadata (``edgefleet.preprocess``), the normalisation. The preprocessing and the
output decoder are the version's signed runtime spec when it has one
(:class:`~protos.bundle.spec.RuntimeSpec`, its outputs checked against the model too), else
the node's :class:`~edge_node.runtime.config.PreprocessConfig` and a ``raw`` decoder. A
mismatch raises :class:`~edge_node.runtime.errors.ModelSignatureError` naming both sides.

What it is not for: scheduling frames or swapping versions (``pipeline``), or deciding
whether a model may run (the updater's trust checks come first). One session per model
version, reused for every frame, thread-safe for concurrent ``run`` calls.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Final, Literal

import numpy.typing as npt
import onnxruntime as ort

from edge_node.errors import ClosedError
from edge_node.runtime.config import ElementType, PreprocessConfig, SessionConfig
from edge_node.runtime.errors import InferenceError, ModelLoadError, ModelSignatureError
from edge_node.runtime.preprocess import Preprocessor
from protos.bundle.decoders import Decoder, Geometry, build_decoder
from protos.bundle.results import Decoded
from protos.bundle.spec import (
    PREPROCESS_METADATA_KEY,
    BundleError,
    RuntimeSpec,
    TensorSig,
    check_declared_preprocess,
    check_outputs,
    resolve_input,
)

__all__ = [
    "CPU_PROVIDER",
    "PREPROCESS_METADATA_KEY",
    "ModelSession",
    "RuntimeSource",
    "choose_providers",
]

_log = logging.getLogger(__name__)

CPU_PROVIDER: Final = "CPUExecutionProvider"

_GRAPH_LEVELS: Final = {
    "disable": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
    "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
    "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
    "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
}
_EXECUTION_MODES: Final = {
    "sequential": ort.ExecutionMode.ORT_SEQUENTIAL,
    "parallel": ort.ExecutionMode.ORT_PARALLEL,
}
_ELEMENT_TYPES: Final[dict[str, ElementType]] = {
    "tensor(float)": "float32",
    "tensor(float16)": "float16",
    "tensor(uint8)": "uint8",
}
_GEOMETRY_CACHE_SIZE: Final = 16
_ORT_WARNING_LEVEL: Final = 2  # ONNX Runtime's own log: warnings and errors only

RuntimeSource = Literal["signed", "node"]
"""Where a session's preprocessing and decoder come from: the version's signed runtime
spec, or the node's preprocess config (a version signed before bundles, a local model)."""


def choose_providers(
    requested: Sequence[str], available: Sequence[str]
) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """``(use, unavailable)``: the requested providers this build has, in order, then CPU."""
    use = [p for p in requested if p in available]
    unavailable = tuple(p for p in requested if p not in available)
    if CPU_PROVIDER not in use:
        use.append(CPU_PROVIDER)
    return tuple(use), unavailable


def session_options(config: SessionConfig) -> ort.SessionOptions:
    """Every option we rely on, set explicitly rather than left to ONNX Runtime's defaults."""
    options = ort.SessionOptions()
    options.intra_op_num_threads = config.intra_op_threads
    options.inter_op_num_threads = config.inter_op_threads
    options.graph_optimization_level = _GRAPH_LEVELS[config.graph_optimization]
    options.execution_mode = _EXECUTION_MODES[config.execution_mode]
    options.add_session_config_entry(
        "session.intra_op.allow_spinning", "1" if config.allow_spinning else "0"
    )
    options.add_session_config_entry(
        "session.inter_op.allow_spinning", "1" if config.allow_spinning else "0"
    )
    options.log_severity_level = _ORT_WARNING_LEVEL
    return options


class ModelSession:
    """A loaded, validated model. Build with :meth:`load`; ``close`` when retired.

    ``model`` and ``version`` name the release (``version`` is None for a local file);
    ``label`` is ``name@version``, how logs, latency and drift name it.
    """

    def __init__(
        self,
        session: Any,
        *,
        path: Path,
        label: str,
        config: SessionConfig,
        preprocess: PreprocessConfig,
        channels: int,
        unavailable_providers: tuple[str, ...],
        model: str | None = None,
        version: str | None = None,
        runtime: RuntimeSpec | None = None,
    ) -> None:
        self._session: Any = session
        self._closed = False
        self._lock = threading.Lock()
        self._runs = 0
        self._failures = 0
        self.path = path
        self.label = label
        self.model = model or label
        self.version = version
        self.config = config
        self.runtime = runtime
        """The version's signed runtime spec (None: the node's preprocess config serves)."""
        self.runtime_source: RuntimeSource = "node" if runtime is None else "signed"
        self.preprocess = preprocess
        """The preprocess config resolved against the model (``size`` is always set)."""
        self.preprocessor = Preprocessor(preprocess, channels)
        self.decoder: Decoder = build_decoder(
            runtime if runtime is not None else RuntimeSpec(preprocess=preprocess)
        )
        """The version's output decoder (``raw`` for a version without a runtime spec)."""
        self.providers: tuple[str, ...] = tuple(session.get_providers())
        self.unavailable_providers = unavailable_providers
        model_input = session.get_inputs()[0]
        self.input_name: str = model_input.name
        self.input_shape: tuple[int | str | None, ...] = tuple(model_input.shape)
        self.output_names: tuple[str, ...] = tuple(o.name for o in session.get_outputs())
        self._output_list = list(self.output_names)  # named: ONNX Runtime need not list them
        self._geometries: dict[tuple[int, int], Geometry] = {}

    @classmethod
    def load(
        cls,
        path: Path | str,
        session_config: SessionConfig,
        preprocess_config: PreprocessConfig | None = None,
        *,
        runtime: RuntimeSpec | None = None,
        model: str | None = None,
        version: str | None = None,
        label: str | None = None,
        available_providers: Sequence[str] | None = None,
    ) -> ModelSession:
        """Create the session and check its preprocessing against the model's input.

        The preprocessing is ``runtime.preprocess`` when the version carries a signed
        runtime spec (its decoder is checked against the model's outputs too), else
        ``preprocess_config`` (the node's); one of the two is needed. The session's
        ``label`` is ``model@version``, or ``model`` alone for a model without a release;
        ``label`` given without ``model`` names such a model (default: the file name).
        ``available_providers`` defaults to
        ``onnxruntime.get_available_providers()``; requested providers missing from it are
        logged and skipped, CPU is always last.
        """
        path = Path(path)
        if runtime is not None:
            preprocess_config = runtime.preprocess
        elif preprocess_config is None:
            raise ModelLoadError(
                f"{path.name}: no preprocess config (the version carries no runtime spec)",
                path=str(path),
            )
        name = model or label or path.name
        label = name if version is None else f"{name}@{version}"
        available = (
            ort.get_available_providers() if available_providers is None else available_providers
        )
        providers, unavailable = choose_providers(session_config.execution_providers, available)
        if unavailable:
            _log.warning(
                "execution providers %s are not available in this ONNX Runtime build "
                "(available: %s); using %s for %s",
                ", ".join(unavailable),
                ", ".join(available),
                ", ".join(providers),
                path.name,
            )
        try:
            session = ort.InferenceSession(
                str(path), sess_options=session_options(session_config), providers=list(providers)
            )
        except Exception as exc:  # ONNX Runtime raises its own pybind types for every failure
            raise ModelLoadError(
                f"ONNX Runtime cannot load {path}: {type(exc).__name__}: {exc}", path=str(path)
            ) from exc
        resolved, channels = resolve_preprocess(session, preprocess_config, path)
        if runtime is not None:
            _check_decoder(session, runtime, path)
        try:
            loaded = cls(
                session,
                path=path,
                label=label,
                config=session_config,
                preprocess=resolved,
                channels=channels,
                unavailable_providers=unavailable,
                model=name,
                version=version,
                runtime=runtime,
            )
        except BundleError as exc:  # a decoder this build does not have
            raise ModelLoadError(
                f"{label}: {exc.message}", path=str(path), field=exc.field
            ) from exc
        _log.info(
            "loaded model %s (%s runtime config): input %s %s, providers %s, "
            "threads intra=%d inter=%d, opt=%s",
            loaded.label,
            loaded.runtime_source,
            loaded.input_name,
            list(loaded.input_shape),
            ", ".join(loaded.providers),
            session_config.intra_op_threads,
            session_config.inter_op_threads,
            session_config.graph_optimization,
        )
        return loaded

    @property
    def closed(self) -> bool:
        return self._closed

    def run(self, batch: npt.NDArray[Any]) -> dict[str, npt.NDArray[Any]]:
        """Run one input batch; outputs by name. Safe from several threads at once."""
        return self._run({self.input_name: batch})

    def run_inputs(self, inputs: Mapping[str, npt.NDArray[Any]]) -> dict[str, npt.NDArray[Any]]:
        """Run named inputs (the self-test's reference pair); outputs by name."""
        return self._run(dict(inputs))

    def _run(self, feed: dict[str, npt.NDArray[Any]]) -> dict[str, npt.NDArray[Any]]:
        """``feed`` is this call's own dict (ONNX Runtime only reads it)."""
        session = self._session
        if session is None:
            raise ClosedError(f"model session {self.label} is closed", label=self.label)
        try:
            outputs = session.run(self._output_list, feed)
        except Exception as exc:  # ONNX Runtime's pybind errors share no useful base class
            with self._lock:
                self._runs += 1
                self._failures += 1
            first = next(iter(feed.values()), None)
            raise InferenceError(
                f"{self.label}: inference failed: {type(exc).__name__}: {exc}",
                label=self.label,
                shape=None if first is None else tuple(first.shape),
                dtype=None if first is None else str(first.dtype),
            ) from exc
        with self._lock:
            self._runs += 1
        return dict(zip(self.output_names, outputs, strict=True))

    def prepare(self, frame: npt.NDArray[Any]) -> dict[str, npt.NDArray[Any]]:
        """The model's inputs for one HxWx3 uint8 RGB frame (a new array, not reused)."""
        return {self.input_name: self.preprocessor(frame)}

    def geometry(self, frame_h: int, frame_w: int) -> Geometry:
        """How a ``frame_h`` x ``frame_w`` frame maps onto the model's input (stretched or
        letterboxed, as the preprocessor fits it). Cached per frame size (a camera sends
        one), bounded."""
        key = (frame_h, frame_w)
        geometry = self._geometries.get(key)
        if geometry is None:
            geometry = self.preprocessor.geometry(frame_h, frame_w)
            if len(self._geometries) >= _GEOMETRY_CACHE_SIZE:
                self._geometries.clear()
            self._geometries[key] = geometry
        return geometry

    def decode(
        self, outputs: Mapping[str, npt.NDArray[Any]], frame_h: int, frame_w: int
    ) -> Decoded:
        """A frame's outputs decoded as the version says; boxes in the frame's coordinates.
        Raises :class:`~protos.bundle.spec.BundleError` when the outputs do not fit."""
        return self.decoder.decode(outputs, self.geometry(frame_h, frame_w))

    def run_counts(self) -> tuple[int, int]:
        """``(runs, failures)`` of this session so far: the updater's watchdog judges a
        freshly swapped-in model by them. A run that raised counts in both."""
        with self._lock:
            return self._runs, self._failures

    def close(self) -> None:
        """Release the session (its memory goes when the last running call returns)."""
        with self._lock:
            self._closed = True
            self._session = None

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        return f"<ModelSession {self.label} {state} providers={list(self.providers)}>"


# ----------------------------------------------------------------------------- validation


def resolve_preprocess(
    session: Any, config: PreprocessConfig, path: Path
) -> tuple[PreprocessConfig, int]:
    """Check ``config`` against the model's one image input; return it with ``size`` set.

    Also returns the model's channel count (1 or 3). The check is the model bundle's
    (:func:`protos.bundle.spec.resolve_input`), the same one ``model push`` runs.
    """
    inputs = [
        TensorSig.of(i.name, _ELEMENT_TYPES.get(i.type, i.type), i.shape)
        for i in session.get_inputs()
    ]
    try:
        resolved, channels = resolve_input(config, inputs)
    except BundleError as exc:
        raise ModelSignatureError(
            f"{path.name}: {exc.message}", path=str(path), model=exc.model, config=exc.config
        ) from exc
    _check_metadata(session, resolved, path)
    return resolved, channels


def _check_decoder(session: Any, runtime: RuntimeSpec, path: Path) -> None:
    """The signed decoder must be able to read the model's outputs (as ``model push``
    checked): a missing tensor, a rank or class count it cannot read."""
    outputs = [
        TensorSig.of(o.name, _ELEMENT_TYPES.get(o.type, _numpy_name(o.type)), o.shape)
        for o in session.get_outputs()
    ]
    try:
        check_outputs(runtime, outputs)
    except BundleError as exc:
        raise ModelSignatureError(
            f"{path.name}: {exc.message}", path=str(path), model=exc.model, config=exc.config
        ) from exc


def _numpy_name(ort_type: str) -> str:
    """``tensor(int64)`` -> ``int64``: the numpy-style name ``TensorSig`` holds."""
    name = ort_type.removeprefix("tensor(").removesuffix(")")
    return {"float": "float32", "double": "float64"}.get(name, name)


def _check_metadata(session: Any, config: PreprocessConfig, path: Path) -> None:
    """What the model declares about its preprocessing must agree with ``config`` (the
    bundle's check, the one ``model push`` runs)."""
    meta: Mapping[str, str] = session.get_modelmeta().custom_metadata_map
    try:
        check_declared_preprocess(config, meta)
    except BundleError as exc:
        raise ModelSignatureError(
            f"{path.name}: {exc.message}", path=str(path), model=exc.model, config=exc.config
        ) from exc
