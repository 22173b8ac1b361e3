"""The runtime contract of a model version: ``custom.runtime`` in its signed TUF target.

What it is for: one definition, on both sides, of how a version is run — how a decoded
HxWx3 RGB frame becomes the model's input (``PreprocessConfig``), how the model's outputs
become results (``OutputSpec``: a decoder and its parameters) and the class labels. The CLI
parses an operator's ``runtime.yaml`` with :func:`parse_runtime_spec`, refuses what every
node would refuse with :func:`resolve_input` and :func:`check_outputs` (the same functions
the node runs when it loads the model), and signs :meth:`RuntimeSpec.to_signed`. The node
parses the verified custom field with the same parser.

The signed form is canonical JSON, which has no floating-point numbers (ADR 0006): every
real number is written as a decimal string (``repr(float)``); the parser takes a string,
an int or a float. Unknown keys are refused (a misspelt ``meen`` must not silently fall
back to a default mean), except at the top level of the signed form, where a newer CLI's
additions are ignored by an older node only if they are listed under ``"optional"``.
A version signed without ``runtime`` (before bundles) is run with the node's own
preprocess config (``None`` from :func:`runtime_of_custom`).

Pure: no numpy, no framework. Errors are :class:`BundleError` (a ``ValueError``) naming the
field; each side wraps it into its own error type.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Final, Literal, TypeVar, get_args

from protos.fields import Fields, optional

__all__ = [
    "DECODERS",
    "PREPROCESS_METADATA_KEY",
    "RUNTIME_FORMAT",
    "BundleError",
    "ChannelOrder",
    "ElementType",
    "Fit",
    "Layout",
    "OutputSpec",
    "PreprocessConfig",
    "ResizeMode",
    "RuntimeSpec",
    "TensorSig",
    "box_layout",
    "check_declared_preprocess",
    "check_outputs",
    "parse_output_spec",
    "parse_preprocess_config",
    "parse_runtime_spec",
    "resolve_input",
    "runtime_of_custom",
    "yolox_candidates",
]

RUNTIME_FORMAT: Final = 1
"""``custom.runtime.format``: the version of this contract."""
PREPROCESS_METADATA_KEY: Final = "edgefleet.preprocess"
"""An ONNX model's own metadata key declaring what preprocessing it was trained with (a
JSON object with any of ``layout``, ``channel_order``, ``dtype``, ``mean``, ``std``,
``scale``): :func:`check_declared_preprocess`."""

Layout = Literal["NCHW", "NHWC"]
ResizeMode = Literal["bilinear", "nearest"]
Fit = Literal["stretch", "letterbox"]
ElementType = Literal["float32", "float16", "uint8"]
ChannelOrder = Literal["RGB", "BGR"]
Decoder = Literal["classification", "yolo", "yolox", "raw"]
BoxFormat = Literal["cxcywh", "xyxy"]

DECODERS: Final[tuple[str, ...]] = get_args(Decoder)
MAX_SIDE: Final = 8192
MAX_LABELS: Final = 4096
MAX_LABEL_CHARS: Final = 128
MAX_TOP_K: Final = 100
MAX_DETECTIONS: Final = 1000
_MAX_NAME: Final = 256

T = TypeVar("T")


class BundleError(ValueError):
    """A runtime spec that cannot be used as written, or one that does not fit the model.

    ``field`` names the offending key (``preprocess.mean``, ``output.top_k``, ...);
    ``model``/``config`` hold both sides of a mismatch with the model when there is one.
    """

    def __init__(
        self, message: str, *, field: str, model: object = None, config: object = None
    ) -> None:
        super().__init__(message)
        self.message = message
        self.field = field
        self.model = model
        self.config = config


_F: Final = Fields(BundleError)  # every check and converter below raises BundleError


# ------------------------------------------------------------------------- dataclasses


@dataclass(frozen=True, slots=True)
class PreprocessConfig:
    """How a decoded HxWx3 uint8 RGB frame becomes the model's input tensor.

    Resize to ``size`` (``(height, width)``; ``None`` takes the model's fixed spatial size
    when resolved against it) by ``fit``: ``stretch`` ignores the aspect ratio,
    ``letterbox`` keeps it and pads the rest with ``pad_value`` (centred, as YOLO exports
    expect). Then per channel, in the model's ``channel_order``:
    ``(pixel * scale - mean) / std``, cast to ``dtype``, laid out as ``layout`` with a batch
    of one. ``mean`` and ``std`` hold one value (every channel) or one per channel. A
    ``uint8`` input takes raw pixels, so it must say ``scale 1, mean 0, std 1``: a
    normalisation cannot be silently dropped.
    """

    layout: Layout = "NCHW"
    size: tuple[int, int] | None = None
    resize: ResizeMode = "bilinear"
    mean: tuple[float, ...] = (0.0, 0.0, 0.0)
    std: tuple[float, ...] = (1.0, 1.0, 1.0)
    scale: float = 1.0 / 255.0
    dtype: ElementType = "float32"
    channel_order: ChannelOrder = "RGB"
    fit: Fit = "stretch"
    pad_value: int = 114

    def __post_init__(self) -> None:
        _F.check_choice("preprocess.layout", self.layout, get_args(Layout))
        _F.check_choice("preprocess.resize", self.resize, get_args(ResizeMode))
        _F.check_choice("preprocess.dtype", self.dtype, get_args(ElementType))
        _F.check_choice("preprocess.channel_order", self.channel_order, get_args(ChannelOrder))
        _F.check_choice("preprocess.fit", self.fit, get_args(Fit))
        _F.check_int("preprocess.pad_value", self.pad_value, 0, 255)
        if self.size is not None:
            if not isinstance(self.size, tuple) or len(self.size) != 2:
                raise _F.fail("preprocess.size", "must be [height, width] or null", self.size)
            for side in self.size:
                _F.check_int("preprocess.size", side, 1, MAX_SIDE)
        _F.check_positive("preprocess.scale", self.scale)
        for name, values in (("preprocess.mean", self.mean), ("preprocess.std", self.std)):
            if (
                not isinstance(values, tuple)
                or len(values) not in (1, 3)
                or not all(
                    isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)
                    for v in values
                )
            ):
                raise _F.fail(name, "must be 1 or 3 finite numbers (one per channel)", values)
        if any(v <= 0 for v in self.std):
            raise _F.fail("preprocess.std", "every value must be > 0", self.std)
        if self.dtype == "uint8" and (
            self.scale != 1 or any(v != 0 for v in self.mean) or any(v != 1 for v in self.std)
        ):
            raise _F.fail(
                "preprocess.dtype",
                "a uint8 input takes raw pixels: set scale 1, mean [0], std [1]",
                {"scale": self.scale, "mean": self.mean, "std": self.std},
            )

    @property
    def channels_in_config(self) -> int:
        """How many channels mean/std describe (1 means: the same for every channel)."""
        return max(len(self.mean), len(self.std))

    def to_signed(self) -> dict[str, Any]:
        """The canonical-JSON form: reals as decimal strings, ``size`` as [h, w] or null."""
        return {
            "layout": self.layout,
            "size": None if self.size is None else list(self.size),
            "resize": self.resize,
            "fit": self.fit,
            "pad_value": self.pad_value,
            "mean": [_decimal(v) for v in self.mean],
            "std": [_decimal(v) for v in self.std],
            "scale": _decimal(self.scale),
            "dtype": self.dtype,
            "channel_order": self.channel_order,
        }


@dataclass(frozen=True, slots=True)
class OutputSpec:
    """Which decoder turns the model's outputs into results, and its parameters.

    - ``classification``: ``output`` is ``[1, C]`` (or ``[C]``) scores; the ``top_k`` best
      with ``score >= score_threshold``; ``softmax`` first when the model emits logits.
    - ``yolo``: one ``[1, N, K]`` or ``[1, K, N]`` tensor of candidate boxes,
      ``K = 4 + objectness + classes`` (``box_format`` cxcywh or xyxy, in input pixels);
      the axis that is K is found by :func:`box_layout` (from the labels, else the smaller
      one). Score = best class score (times objectness); ``score_threshold``, class-wise
      NMS at ``iou_threshold``, at most ``max_detections``, best first. YOLOv8 exports:
      objectness false; YOLOv5: true.
    - ``yolox``: as yolo with objectness and cxcywh, but the boxes are raw grid offsets
      decoded with ``strides`` over the input size (YOLOX's exports without
      ``decode_in_inference``); N must be :func:`yolox_candidates` of the input size.
    - ``raw``: a summary per output tensor (shape, min, max, mean; with ``threshold``, the
      fraction of values above it — e.g. text pixels of a segmentation map).
    ``output`` names the tensor read (``None``: the model's first output).
    """

    decoder: Decoder = "raw"
    output: str | None = None
    top_k: int = 5
    softmax: bool = False
    score_threshold: float = 0.25
    iou_threshold: float = 0.45
    max_detections: int = 100
    box_format: BoxFormat = "cxcywh"
    objectness: bool = False
    strides: tuple[int, ...] = (8, 16, 32)
    threshold: float | None = None

    def __post_init__(self) -> None:
        _F.check_choice("output.decoder", self.decoder, DECODERS)
        if self.output is not None and (
            not isinstance(self.output, str) or not 0 < len(self.output) <= _MAX_NAME
        ):
            raise _F.fail("output.output", "must be a tensor name", self.output)
        _F.check_int("output.top_k", self.top_k, 1, MAX_TOP_K)
        if not isinstance(self.softmax, bool):
            raise _F.fail("output.softmax", "must be true or false", self.softmax)
        _F.check_fraction("output.score_threshold", self.score_threshold)
        _F.check_fraction("output.iou_threshold", self.iou_threshold)
        _F.check_int("output.max_detections", self.max_detections, 1, MAX_DETECTIONS)
        _F.check_choice("output.box_format", self.box_format, get_args(BoxFormat))
        if not isinstance(self.objectness, bool):
            raise _F.fail("output.objectness", "must be true or false", self.objectness)
        if (
            not isinstance(self.strides, tuple)
            or not 1 <= len(self.strides) <= 8
            or len(set(self.strides)) != len(self.strides)
        ):
            raise _F.fail("output.strides", "must be 1-8 distinct strides", self.strides)
        for stride in self.strides:
            _F.check_int("output.strides", stride, 1, 1024)
        if self.threshold is not None and (
            isinstance(self.threshold, bool)
            or not isinstance(self.threshold, int | float)
            or not math.isfinite(self.threshold)
        ):
            raise _F.fail("output.threshold", "must be a finite number or null", self.threshold)

    @property
    def is_detector(self) -> bool:
        return self.decoder in ("yolo", "yolox")

    def to_signed(self) -> dict[str, Any]:
        """Only the parameters of this decoder, reals as decimal strings."""
        out: dict[str, Any] = {"decoder": self.decoder}
        if self.output is not None:
            out["output"] = self.output
        for key in _DECODER_PARAMS[self.decoder]:
            value = getattr(self, key)
            if isinstance(value, int):  # bool is an int too
                out[key] = value
            elif isinstance(value, float):
                out[key] = _decimal(value)
            elif isinstance(value, tuple):
                out[key] = list(value)
            elif value is None:
                out[key] = None
            else:
                out[key] = value
        return out


_DECODER_PARAMS: Final[dict[str, tuple[str, ...]]] = {
    "classification": ("top_k", "softmax", "score_threshold"),
    "yolo": ("score_threshold", "iou_threshold", "max_detections", "box_format", "objectness"),
    "yolox": ("score_threshold", "iou_threshold", "max_detections", "strides"),
    "raw": ("threshold",),
}
"""The parameters each decoder takes; any other is refused (it would be silently ignored)."""


@dataclass(frozen=True, slots=True)
class RuntimeSpec:
    """``custom.runtime``: preprocessing, output decoding and the class labels."""

    preprocess: PreprocessConfig = field(default_factory=PreprocessConfig)
    output: OutputSpec = field(default_factory=OutputSpec)
    labels: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not isinstance(self.labels, tuple) or len(self.labels) > MAX_LABELS:
            raise _F.fail("labels", f"must be a list of at most {MAX_LABELS} names", self.labels)
        for i, label in enumerate(self.labels):
            if not isinstance(label, str) or not 0 < len(label) <= MAX_LABEL_CHARS:
                raise _F.fail(f"labels[{i}]", f"must be 1-{MAX_LABEL_CHARS} characters", label)
        if self.labels and self.output.decoder == "raw":
            raise _F.fail(
                "labels", "the raw decoder names no classes: leave labels out", len(self.labels)
            )

    def label(self, class_id: int) -> str:
        """The label of ``class_id``, or ``class_<id>`` when the version carries none."""
        if 0 <= class_id < len(self.labels):
            return self.labels[class_id]
        return f"class_{class_id}"

    def to_signed(self) -> dict[str, Any]:
        return {
            "format": RUNTIME_FORMAT,
            "preprocess": self.preprocess.to_signed(),
            "output": self.output.to_signed(),
            "labels": list(self.labels),
        }


@dataclass(frozen=True, slots=True)
class TensorSig:
    """A model input or output as both sides see it: dims are ints, or None when dynamic
    (a symbolic name, a 0 or a negative ``dim_value``). ``dtype`` is a numpy-style name."""

    name: str
    dtype: str
    shape: tuple[int | None, ...]

    @classmethod
    def of(cls, name: str, dtype: str, shape: Sequence[object]) -> TensorSig:
        """From any shape spelling: ints > 0 are fixed, anything else is dynamic."""
        dims = tuple(
            d if isinstance(d, int) and not isinstance(d, bool) and d > 0 else None for d in shape
        )
        return cls(name, dtype, dims)


# ----------------------------------------------------------------------------- parsing


def _decimal(value: float) -> str:
    return repr(float(value))


def _number(name: str, value: Any) -> float:
    """A real: an int, a float, or (the signed form) a decimal string."""
    if isinstance(value, str) and 0 < len(value) <= 32:
        try:
            number = float(value)
        except ValueError:
            raise _F.fail(name, "must be a decimal number", value) from None
    elif isinstance(value, int | float) and not isinstance(value, bool):
        number = float(value)
    else:
        raise _F.fail(name, "must be a number", value)
    if not math.isfinite(number):
        raise _F.fail(name, "must be finite", value)
    return number


def _list(name: str, value: Any, limit: int) -> Sequence[Any]:
    if isinstance(value, str | bytes) or not isinstance(value, Sequence):
        raise _F.fail(name, "must be a list", value)
    if len(value) > limit:
        raise _F.fail(name, f"at most {limit} entries", len(value))
    return value


def _numbers(name: str, value: Any) -> tuple[float, ...]:
    if isinstance(value, int | float | str) and not isinstance(value, bool):
        return (_number(name, value),)
    return tuple(_number(name, v) for v in _list(name, value, 3))


def _ints(name: str, value: Any) -> tuple[int, ...]:
    return tuple(_F.to_int(name, v) for v in _list(name, value, 8))


def _size(name: str, value: Any) -> tuple[int, int] | None:
    if value is None:
        return None
    if isinstance(value, int) and not isinstance(value, bool):
        return (value, value)  # a square input: `size: 416`
    items = _list(name, value, 2)
    if len(items) != 2:
        raise _F.fail(name, "must be [height, width], one side for a square, or null", value)
    return (_F.to_int(name, items[0]), _F.to_int(name, items[1]))


def _placed(where: str, own: str, build: Callable[[], T]) -> T:
    """``build()``, with a dataclass's own field names (``preprocess.size``) rewritten to
    where the mapping sits (``custom.runtime.preprocess.size``): one spelling per field."""
    try:
        return build()
    except BundleError as exc:
        if where == own or not exc.field.startswith(own):
            raise
        placed = where + exc.field[len(own) :]
        message = exc.message
        if message.startswith(exc.field):
            message = placed + message[len(exc.field) :]
        raise BundleError(message, field=placed, model=exc.model, config=exc.config) from None


def parse_preprocess_config(raw: object, *, where: str = "preprocess") -> PreprocessConfig:
    """A preprocess mapping (an operator's YAML, or the signed form) to a config."""
    reader = _F.reader(where, raw)
    default = PreprocessConfig()
    config = _placed(
        where,
        "preprocess",
        lambda: PreprocessConfig(
            layout=reader.take("layout", _F.choice(Layout), default.layout),
            size=reader.take("size", _size, default.size),
            resize=reader.take("resize", _F.choice(ResizeMode), default.resize),
            mean=reader.take("mean", _numbers, default.mean),
            std=reader.take("std", _numbers, default.std),
            scale=reader.take("scale", _number, default.scale),
            dtype=reader.take("dtype", _F.choice(ElementType), default.dtype),
            channel_order=reader.take(
                "channel_order", _F.choice(ChannelOrder), default.channel_order
            ),
            fit=reader.take("fit", _F.choice(Fit), default.fit),
            pad_value=reader.take("pad_value", _F.to_int, default.pad_value),
        ),
    )
    reader.finish()
    return config


def parse_output_spec(raw: object, *, where: str = "output") -> OutputSpec:
    """An output mapping: ``decoder`` and only the parameters that decoder takes."""
    reader = _F.reader(where, raw)
    if not reader.has("decoder"):
        raise _F.fail(f"{where}.decoder", f"is required (one of {', '.join(DECODERS)})", None)
    decoder: Decoder = reader.take("decoder", _F.choice(Decoder), "raw")
    default = OutputSpec(decoder=decoder)
    params = _DECODER_PARAMS[decoder]
    converters: dict[str, Callable[[str, Any], Any]] = {
        "top_k": _F.to_int,
        "softmax": _F.to_bool,
        "score_threshold": _number,
        "iou_threshold": _number,
        "max_detections": _F.to_int,
        "box_format": _F.choice(BoxFormat),
        "objectness": _F.to_bool,
        "strides": _ints,
        "threshold": optional(_number),
    }
    values: dict[str, Any] = {
        key: reader.take(key, converters[key], getattr(default, key)) for key in params
    }
    output = reader.take("output", optional(_F.to_str), None)
    reader.finish(allowed=("decoder", "output", *params))
    return _placed(where, "output", lambda: replace(default, output=output, **values))


def parse_runtime_spec(
    raw: object, *, where: str = "runtime", also_known: Sequence[str] = ()
) -> RuntimeSpec:
    """An operator's runtime file or the signed ``custom.runtime``.

    ``{format?, preprocess, output, labels?}``; ``format``, when present, must be one this
    build reads. ``also_known``: keys the caller resolved before (``labels_file``), listed
    as known when a key is not.
    """
    reader = _F.reader(where, raw)
    fmt = reader.take("format", _F.to_int, RUNTIME_FORMAT)
    if fmt != RUNTIME_FORMAT:
        raise _F.fail(
            f"{where}.format",
            f"format {fmt} is not understood by this build (it reads {RUNTIME_FORMAT})",
            fmt,
        )
    preprocess = reader.take(
        "preprocess", lambda n, v: parse_preprocess_config(v, where=n), PreprocessConfig()
    )
    output = reader.take("output", lambda n, v: parse_output_spec(v, where=n), OutputSpec())
    no_labels: tuple[str, ...] = ()
    labels = reader.take("labels", _labels, no_labels)
    # A misspelt key is named before a missing one (`outputs:` is not "output is required").
    reader.finish(allowed=("preprocess", "output", "labels", *also_known))
    if not reader.has("output"):
        raise _F.fail(f"{where}.output", "is required (the output decoder)", None)
    return _placed(f"{where}.labels", "labels", lambda: RuntimeSpec(preprocess, output, labels))


def _labels(name: str, value: Any) -> tuple[str, ...]:
    items = _list(name, value, MAX_LABELS)
    for i, item in enumerate(items):
        if isinstance(item, int | float) and not isinstance(item, bool):
            raise _F.fail(f"{name}[{i}]", "must be a string (quote a number in YAML: '0')", item)
    return tuple(_F.to_str(name, item) for item in items)


def runtime_of_custom(custom: Mapping[str, Any]) -> RuntimeSpec | None:
    """The runtime spec a verified target's custom carries; None for a version signed
    before bundles (the node then runs it with its own preprocess config)."""
    raw = custom.get("runtime")
    if raw is None:
        return None
    return parse_runtime_spec(raw, where="custom.runtime")


# ---------------------------------------------------------------- checks against a model

_FLOAT_TYPES: Final = frozenset({"float32", "float16", "float64", "bfloat16"})


def _mismatch(what: str, model_side: object, config_side: object, field_name: str) -> BundleError:
    return BundleError(
        f"{what}: the model has {model_side}, the runtime config says {config_side}",
        field=field_name,
        model=model_side,
        config=config_side,
    )


def resolve_input(
    config: PreprocessConfig, inputs: Sequence[TensorSig]
) -> tuple[PreprocessConfig, int]:
    """Check ``config`` against the model's one image input; return it with ``size`` set,
    and the model's channel count (1 or 3). Raises :class:`BundleError` naming both sides.

    The node runs this when it loads a model, the CLI when it pushes one: what a node
    would refuse is refused at push.
    """
    if len(inputs) != 1:
        names = [i.name for i in inputs]
        raise _mismatch(
            "number of inputs", f"{len(inputs)} inputs {names}", "one image", "preprocess"
        )
    model_input = inputs[0]
    shape = list(model_input.shape)
    shown = ["?" if d is None else d for d in shape]
    where = f"input {model_input.name!r} {shown}"

    if len(shape) != 4:
        raise _mismatch(
            f"{where}: rank",
            f"rank {len(shape)}",
            f"{config.layout} (rank 4)",
            "preprocess.layout",
        )
    batch = shape[0]
    if batch is not None and batch != 1:
        raise _mismatch(f"{where}: batch dimension", batch, "1 frame per run", "preprocess")

    channel_axis, spatial_axes = (1, (2, 3)) if config.layout == "NCHW" else (3, (1, 2))
    channels = shape[channel_axis]
    if channels not in (1, 3):
        other_layout, other_axis = ("NHWC", 3) if config.layout == "NCHW" else ("NCHW", 1)
        hint = (
            f" (it looks {other_layout}: {shape[other_axis]} on axis {other_axis})"
            if shape[other_axis] in (1, 3)
            else ""
        )
        raise _mismatch(
            f"{where}: channel axis",
            f"{'?' if channels is None else channels} on axis {channel_axis}{hint}",
            f"layout {config.layout} (1 or 3 channels on axis {channel_axis})",
            "preprocess.layout",
        )
    assert isinstance(channels, int)
    if config.channels_in_config not in (1, channels):
        raise _mismatch(
            f"{where}: channel count",
            f"{channels} channel(s)",
            f"mean {list(config.mean)} / std {list(config.std)}",
            "preprocess.mean",
        )

    fixed = [shape[a] for a in spatial_axes]
    if config.size is None:
        height, width = fixed
        if height is None or width is None:
            raise _mismatch(
                f"{where}: spatial size",
                f"a dynamic height/width {['?' if d is None else d for d in fixed]}",
                "no size (set preprocess.size for a model with a dynamic input)",
                "preprocess.size",
            )
        size = (height, width)
    else:
        for d, want, side in zip(fixed, config.size, ("height", "width"), strict=True):
            if d is not None and d != want:
                raise _mismatch(
                    f"{where}: {side}", d, f"size {list(config.size)}", "preprocess.size"
                )
        size = config.size

    if model_input.dtype != config.dtype:
        raise _mismatch(
            f"{where}: element type", model_input.dtype, f"dtype {config.dtype}", "preprocess.dtype"
        )
    return replace(config, size=size), channels


def check_declared_preprocess(config: PreprocessConfig, metadata: Mapping[str, str]) -> None:
    """Check ``config`` against what the model declares in its own metadata
    (:data:`PREPROCESS_METADATA_KEY`), if it declares anything; raises
    :class:`BundleError` naming both sides. Run at push and at every load on the node.

    A declared mean/std of one value stands for every channel; reals agree within a
    relative 1e-4 (a declaration written with fewer digits).
    """
    raw = metadata.get(PREPROCESS_METADATA_KEY)
    if raw is None:
        return
    try:
        declared = json.loads(raw)
        if not isinstance(declared, dict):
            raise TypeError("not a JSON object")
    except (ValueError, TypeError) as exc:
        raise BundleError(
            f"the model's metadata {PREPROCESS_METADATA_KEY} is not a JSON object: {exc}",
            field="preprocess",
        ) from exc
    what = f"metadata {PREPROCESS_METADATA_KEY}"
    for key in ("layout", "channel_order", "dtype"):
        if key in declared and declared[key] != getattr(config, key):
            raise _mismatch(
                f"{what}: {key}", declared[key], getattr(config, key), f"preprocess.{key}"
            )
    for key in ("mean", "std", "scale"):
        if key not in declared:
            continue
        want = declared[key] if isinstance(declared[key], list) else [declared[key]]
        have = list(getattr(config, key)) if key != "scale" else [config.scale]
        if len(want) == 1 and len(have) > 1:
            want = want * len(have)
        if len(have) == 1 and len(want) > 1:
            have = have * len(want)
        if len(want) != len(have) or not all(
            isinstance(w, int | float)
            and not isinstance(w, bool)
            and math.isclose(w, h, rel_tol=1e-4, abs_tol=1e-6)
            for w, h in zip(want, have, strict=True)
        ):
            raise _mismatch(
                f"{what}: {key}", declared[key], getattr(config, key), f"preprocess.{key}"
            )


def _pick_output(spec: OutputSpec, outputs: Sequence[TensorSig]) -> TensorSig:
    if not outputs:
        raise BundleError("the model has no outputs", field="output.output")
    if spec.output is None:
        return outputs[0]
    for tensor in outputs:
        if tensor.name == spec.output:
            return tensor
    names = [t.name for t in outputs]
    raise _mismatch("output tensor", f"outputs {names}", f"output {spec.output!r}", "output.output")


def check_outputs(spec: RuntimeSpec, outputs: Sequence[TensorSig]) -> None:
    """Refuse a decoder the model's outputs cannot feed: a missing tensor, a non-float
    one, a rank or class count the decoder cannot read (:func:`box_layout` for boxes), and
    for yolox with a known input size a grid that does not fit it. Dynamic dims are taken
    on trust here; the decoder checks the real tensor on every run."""
    output = spec.output
    if output.decoder == "raw":
        if output.output is not None:
            _pick_output(output, outputs)
        return
    tensor = _pick_output(output, outputs)
    shown = ["?" if d is None else d for d in tensor.shape]
    where = f"output {tensor.name!r} {shown}"
    if tensor.dtype not in _FLOAT_TYPES:
        raise _mismatch(
            f"{where}: element type", tensor.dtype, f"decoder {output.decoder}", "output.decoder"
        )
    labels = len(spec.labels)
    if output.decoder == "classification":
        dims = tensor.shape
        if len(dims) == 2 and dims[0] not in (None, 1):
            raise _mismatch(f"{where}: batch dimension", dims[0], "1 frame per run", "output")
        if len(dims) not in (1, 2):
            raise _mismatch(
                f"{where}: rank", f"rank {len(dims)}", "classification ([1, C] scores)", "output"
            )
        classes = dims[-1]
        if classes is not None and labels and classes != labels:
            raise _mismatch(f"{where}: classes", f"{classes} classes", f"{labels} labels", "labels")
        return
    # yolo / yolox: [1, N, K] or [1, K, N]
    dims = tensor.shape
    if len(dims) != 3:
        raise _mismatch(
            f"{where}: rank", f"rank {len(dims)}", f"{output.decoder} ([1, N, K] boxes)", "output"
        )
    if dims[0] not in (None, 1):
        raise _mismatch(f"{where}: batch dimension", dims[0], "1 frame per run", "output")
    objectness = output.decoder == "yolox" or output.objectness
    first, second = dims[1], dims[2]
    if first is not None and second is not None:
        transposed, _ = box_layout(
            (first, second), objectness=objectness, labels=labels, where=where
        )
        candidates = second if transposed else first
        size = spec.preprocess.size
        if output.decoder == "yolox" and size is not None:
            want = yolox_candidates(size, output.strides)
            if candidates != want:
                raise _mismatch(
                    f"{where}: grid cells",
                    f"{candidates} candidate boxes",
                    f"{want} (input {list(size)} at strides {list(output.strides)})",
                    "output.strides",
                )
    elif not labels:
        # The smaller dim is K, so a fixed dim too small for K leaves no class scores
        # whatever the dynamic one turns out to be.
        extra = 5 if objectness else 4
        fixed = first if first is not None else second
        if fixed is not None and fixed <= extra:
            raise _mismatch(
                f"{where}: box width",
                f"{fixed} on a fixed axis",
                f"more than {extra} values per box ({extra} box values + class scores)",
                "output",
            )


def box_layout(
    dims: tuple[int, int], *, objectness: bool, labels: int, where: str = "output"
) -> tuple[bool, int]:
    """How a ``[1, A, B]`` box tensor is laid out: ``(transposed, K)``, ``transposed`` when
    it is ``[1, K, N]``, with ``K = 4 + objectness + classes`` values per candidate box.

    With labels, K is known and picks the axis (``[1, N, K]`` when both match). Without,
    the smaller axis is K (a detector proposes more boxes than it has classes; ``[1, N, K]``
    on a tie), and it must leave at least one class score. :func:`check_outputs` and the
    decoders both use this rule.
    """
    extra = 5 if objectness else 4
    first, second = dims
    if labels:
        want = extra + labels
        if second == want:
            return False, want
        if first == want:
            return True, want
        raise _mismatch(
            f"{where}: box width",
            f"{first} or {second} values per box",
            f"{want} ({extra} box values + {labels} labels)",
            "labels",
        )
    k = min(first, second)
    if k <= extra:
        raise _mismatch(
            f"{where}: box width",
            f"{k} values per box (the smaller of {first}, {second})",
            f"more than {extra} ({extra} box values + class scores)",
            "output",
        )
    return first < second, k


def yolox_candidates(size: tuple[int, int], strides: Sequence[int]) -> int:
    """The number of grid cells a YOLOX head predicts for an input of ``size`` (h, w):
    ``ceil(h/s) * ceil(w/s)`` summed over the strides (a stride-2 conv rounds up)."""
    height, width = size
    return sum(-(-height // s) * -(-width // s) for s in strides)
