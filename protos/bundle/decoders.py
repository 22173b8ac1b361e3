"""Output decoders: a model's output tensors to :class:`~protos.bundle.results.Decoded`.

Chosen by the version's signed ``custom.runtime.output`` (:class:`~protos.bundle.spec.OutputSpec`);
:func:`build_decoder` makes one per loaded version, and its ``decode`` runs for every frame
on the node (and on the operator's machine, to compare two models). Each decoder is pure
numpy: no ONNX Runtime, no I/O. Boxes come back in the frame's coordinates, normalised to
[0, 1], through the :class:`Geometry` the preprocessor used for that frame.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from protos.bundle.results import Decoded, Detection, TensorSummary
from protos.bundle.spec import BundleError, RuntimeSpec

__all__ = ["Decoder", "Geometry", "build_decoder"]

Array = npt.NDArray[Any]


@dataclass(frozen=True, slots=True)
class Geometry:
    """How a frame was fitted into the model's input: a model-input pixel ``(x, y)`` is
    frame pixel ``((x - pad_x) / scale_x, (y - pad_y) / scale_y)``."""

    frame_h: int
    frame_w: int
    input_h: int
    input_w: int
    scale_x: float
    scale_y: float
    pad_x: float = 0.0
    pad_y: float = 0.0

    @classmethod
    def stretch(cls, frame_h: int, frame_w: int, input_h: int, input_w: int) -> Geometry:
        return cls(frame_h, frame_w, input_h, input_w, input_w / frame_w, input_h / frame_h)

    def to_frame(self, xs: Array, ys: Array) -> tuple[Array, Array]:
        """Model-input pixel coordinates to normalised frame coordinates, clipped to [0, 1]."""
        fx = (np.asarray(xs, dtype=np.float64) - self.pad_x) / self.scale_x / self.frame_w
        fy = (np.asarray(ys, dtype=np.float64) - self.pad_y) / self.scale_y / self.frame_h
        return np.clip(fx, 0.0, 1.0), np.clip(fy, 0.0, 1.0)


class Decoder(Protocol):
    def decode(self, outputs: Mapping[str, Array], geometry: Geometry) -> Decoded:
        """Raises :class:`BundleError` when the outputs are not what the spec says."""
        ...


def _output(outputs: Mapping[str, Array], name: str | None) -> Array:
    if name is None:
        if not outputs:
            raise BundleError("the model returned no outputs", field="output.output")
        return np.asarray(next(iter(outputs.values())))
    try:
        return np.asarray(outputs[name])
    except KeyError:
        raise BundleError(
            f"the model returned no output {name!r} (it has {sorted(outputs)})",
            field="output.output",
        ) from None


class RawDecoder:
    """Every output (or the named one) summarised: shape, dtype, min, max, mean, and with a
    threshold the fraction of values above it."""

    def __init__(self, spec: RuntimeSpec) -> None:
        self._name = spec.output.output
        self._threshold = spec.output.threshold

    def decode(self, outputs: Mapping[str, Array], geometry: Geometry) -> Decoded:
        items = (
            [(self._name, _output(outputs, self._name))]
            if self._name is not None
            else [(name, np.asarray(value)) for name, value in outputs.items()]
        )
        summaries = []
        for name, value in items:
            numeric = value.dtype.kind in "fiub" and value.size > 0
            data = value.astype(np.float64, copy=False) if numeric else None
            above = None
            if data is not None and self._threshold is not None:
                above = round(float(np.count_nonzero(data > self._threshold)) / data.size, 6)
            summaries.append(
                TensorSummary(
                    name=str(name),
                    shape=tuple(int(d) for d in value.shape),
                    dtype=str(value.dtype),
                    min=float(data.min()) if data is not None else float("nan"),
                    max=float(data.max()) if data is not None else float("nan"),
                    mean=float(data.mean()) if data is not None else float("nan"),
                    threshold=self._threshold,
                    above=above,
                )
            )
        return Decoded("raw", tensors=tuple(summaries))


class ClassificationDecoder:
    """The ``top_k`` classes of ``[1, C]`` (or ``[C]``) scores, best first."""

    def __init__(self, spec: RuntimeSpec) -> None:
        self._spec = spec
        out = spec.output
        self._name, self._k, self._softmax, self._min = (
            out.output,
            out.top_k,
            out.softmax,
            out.score_threshold,
        )

    def decode(self, outputs: Mapping[str, Array], geometry: Geometry) -> Decoded:
        scores = _output(outputs, self._name)
        if scores.ndim == 2 and scores.shape[0] == 1:
            scores = scores[0]
        if scores.ndim != 1 or scores.size == 0:
            raise BundleError(
                f"classification expects [1, C] scores, got shape {list(scores.shape)}",
                field="output",
            )
        values = scores.astype(np.float64)
        if self._softmax:
            values = np.exp(values - values.max())
            values /= values.sum()
        k = min(self._k, values.size)
        top = np.argpartition(-values, k - 1)[:k]
        top = top[np.argsort(-values[top], kind="stable")]
        spec = self._spec
        return Decoded(
            "classification",
            detections=tuple(
                Detection(int(i), spec.label(int(i)), float(values[i]))
                for i in top
                if values[i] >= self._min
            ),
        )


def build_decoder(spec: RuntimeSpec) -> Decoder:
    """The decoder the spec names, ready for every frame of one version."""
    decoder = spec.output.decoder
    if decoder == "raw":
        return RawDecoder(spec)
    if decoder == "classification":
        return ClassificationDecoder(spec)
    raise BundleError(f"decoder {decoder!r} is not built yet", field="output.decoder")
