"""Output decoders: a model's output tensors to :class:`~protos.bundle.results.Decoded`.

Chosen by the version's signed ``custom.runtime.output`` (:class:`~protos.bundle.spec.OutputSpec`);
:func:`build_decoder` makes one per loaded version, and its ``decode`` runs for every frame
on the node (and on the operator's machine, to compare two models). Each decoder is pure
numpy: no ONNX Runtime, no I/O. Boxes come back in the frame's coordinates, normalised to
[0, 1], through the :class:`Geometry` the preprocessor used for that frame.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any, Final, Protocol

import numpy as np
import numpy.typing as npt

from protos.bundle.geometry import Geometry
from protos.bundle.results import Box, Decoded, Detection, TensorSummary
from protos.bundle.spec import BundleError, RuntimeSpec, box_layout, yolox_candidates

__all__ = ["Decoder", "Geometry", "build_decoder", "nms"]

Array = npt.NDArray[Any]
IntArray = npt.NDArray[np.intp]
FloatArray = npt.NDArray[np.float64]

MAX_NMS_CANDIDATES: Final = 30_000
"""Boxes over the threshold beyond this many (the best kept) are not even considered: a
bound on what one frame's NMS may cost (Ultralytics' own NMS uses the same figure)."""
_GRID_CACHE_SIZE: Final = 8


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
    threshold the fraction of values above it.

    It runs for every frame of a version without a decoder of its own: a small output is
    summarised in Python floats, a large one by the ufuncs' reductions called directly
    (``ndarray.min``/``mean`` go through Python helpers), and dtype names are cached."""

    def __init__(self, spec: RuntimeSpec) -> None:
        self._name = spec.output.output
        self._threshold = spec.output.threshold

    def decode(self, outputs: Mapping[str, Array], geometry: Geometry) -> Decoded:
        items = (
            [(self._name, _output(outputs, self._name))]
            if self._name is not None
            else [(name, np.asarray(value)) for name, value in outputs.items()]
        )
        threshold = self._threshold
        summaries = []
        for name, value in items:
            size = value.size
            low = high = mean = float("nan")
            above = None
            if size > 0 and value.dtype.kind in "fiub":
                data = value.astype(np.float64, copy=False)
                low, high, mean = _min_max_mean(data, size)
                if threshold is not None:
                    above = round(float(np.count_nonzero(data > threshold)) / size, 6)
            summaries.append(
                TensorSummary(
                    name=str(name),
                    shape=value.shape,  # an ndarray's: already a tuple of ints
                    dtype=_dtype_name(value.dtype),
                    min=low,
                    max=high,
                    mean=mean,
                    threshold=threshold,
                    above=above,
                )
            )
        return Decoded("raw", tensors=tuple(summaries))


def _min_max_mean(data: FloatArray, size: int) -> tuple[float, float, float]:
    """A small output (a classifier's scores) in Python floats, several times cheaper than
    three numpy reductions; a large one, or one with a NaN or both infinities (their sum
    is NaN), in numpy, as ``ndarray.min``/``max``/``mean`` compute them."""
    if size <= _SMALL_OUTPUT:
        values = data.ravel().tolist()
        total = sum(values)
        if total == total:
            return min(values), max(values), total / size
    return (
        float(_MINIMUM(data, axis=None)),
        float(_MAXIMUM(data, axis=None)),
        float(_ADD(data, axis=None)) / size,
    )


_SMALL_OUTPUT: Final = 64
_MINIMUM: Final = np.minimum.reduce
_MAXIMUM: Final = np.maximum.reduce
_ADD: Final = np.add.reduce
_DTYPE_NAMES: dict[np.dtype[Any], str] = {}
_DTYPE_NAMES_MAX: Final = 64


def _dtype_name(dtype: np.dtype[Any]) -> str:
    """``str(dtype)``, cached (numpy builds it in Python each time); bounded."""
    name = _DTYPE_NAMES.get(dtype)
    if name is None:
        name = str(dtype)
        if len(_DTYPE_NAMES) < _DTYPE_NAMES_MAX:
            _DTYPE_NAMES[dtype] = name
    return name


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
        labels = len(self._spec.labels)
        if labels and scores.size != labels:
            raise BundleError(
                f"classification: the model returned {scores.size} class scores, "
                f"the version has {labels} labels",
                field="labels",
                model=scores.size,
                config=labels,
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


# ------------------------------------------------------------------------- detectors


def nms(
    boxes: FloatArray, scores: FloatArray, classes: IntArray, iou_threshold: float, limit: int
) -> IntArray:
    """Greedy class-wise non-maximum suppression: the indices kept, best first, at most
    ``limit``. ``boxes`` is ``(M, 4)`` x1, y1, x2, y2. A box is dropped when its IoU with a
    better box of its class is over ``iou_threshold``; equal scores keep the lower index
    first, so the result never depends on the sort's whims.

    Each class's boxes are kept apart, best first; a round takes the best head of all
    classes and suppresses within its class only, so the work per kept box is one
    vectorised pass over the boxes of its class.
    """
    count = scores.size
    if count == 0:
        return np.zeros(0, dtype=np.intp)
    order = np.argsort(-scores, kind="stable")
    rank = np.empty(count, dtype=np.intp)
    rank[order] = np.arange(count)
    by_class = order[np.argsort(classes[order], kind="stable")]  # by class, then by rank
    starts = np.flatnonzero(np.diff(classes[by_class], prepend=classes[by_class[0]] - 1))
    groups = np.split(by_class, starts[1:])
    heads = rank[by_class[starts]]  # each class's best remaining box, by rank
    x1, y1, x2, y2 = boxes[:, 0], boxes[:, 1], boxes[:, 2], boxes[:, 3]
    areas = (x2 - x1) * (y2 - y1)
    keep: list[int] = []
    while len(keep) < limit:
        group_index = int(heads.argmin())
        if heads[group_index] == count:
            break  # every class is exhausted
        group = groups[group_index]
        best = int(group[0])
        keep.append(best)
        rest = group[1:]
        if rest.size:
            w = np.minimum(x2[rest], x2[best]) - np.maximum(x1[rest], x1[best])
            h = np.minimum(y2[rest], y2[best]) - np.maximum(y1[rest], y1[best])
            inter = np.maximum(w, 0.0) * np.maximum(h, 0.0)
            union = areas[rest] + areas[best] - inter
            rest = rest[inter <= iou_threshold * union]  # IoU <= threshold, no division
        groups[group_index] = rest
        heads[group_index] = rank[rest[0]] if rest.size else count
    return np.asarray(keep, dtype=np.intp)


class _BoxDecoder:
    """``[1, N, K]`` or ``[1, K, N]`` candidate boxes to detections (yolo; yolox decodes
    its grid first). The orientation follows :func:`~protos.bundle.spec.box_layout`.

    Per frame: keep the candidates whose score could pass (objectness first when there is
    one), work out class and score on those only, NMS, map to the frame. Class scores are
    taken as probabilities in [0, 1] (what the exports emit), so a candidate whose
    objectness is under the threshold cannot pass.
    """

    kind_name = "yolo"

    def __init__(self, spec: RuntimeSpec, *, objectness: bool) -> None:
        out = spec.output
        self._spec = spec
        self._name = out.output
        self._objectness = objectness
        self._extra = 5 if objectness else 4
        self._threshold = out.score_threshold
        self._iou = out.iou_threshold
        self._limit = out.max_detections
        self._xyxy = out.box_format == "xyxy"

    def decode(self, outputs: Mapping[str, Array], geometry: Geometry) -> Decoded:
        tensor = _output(outputs, self._name)
        rows = self._rows(tensor, geometry)  # (K, N): one row per box value, a view
        class_rows = rows[self._extra :]
        if self._objectness:
            index = np.flatnonzero(rows[4] >= self._threshold)
            block = class_rows[:, index]
            classes = np.argmax(block, axis=0)
            scores = block[classes, np.arange(index.size)] * rows[4, index].astype(np.float64)
        else:
            best = class_rows.max(axis=0)
            index = np.flatnonzero(best >= self._threshold)
            classes = np.argmax(class_rows[:, index], axis=0)
            scores = best[index].astype(np.float64)
        passing = np.flatnonzero(scores >= self._threshold)
        index, classes, scores = index[passing], classes[passing], scores[passing]
        boxes = self._boxes(rows[:4, index].astype(np.float64), index, geometry)
        finite = np.flatnonzero(np.isfinite(boxes).all(axis=1))
        if finite.size > MAX_NMS_CANDIDATES:
            finite = finite[np.argsort(-scores[finite], kind="stable")[:MAX_NMS_CANDIDATES]]
        boxes, scores, classes = boxes[finite], scores[finite], classes[finite]
        kept = nms(boxes, scores, classes, self._iou, self._limit)
        return Decoded(
            "detection", detections=self._detections(boxes, scores, classes, kept, geometry)
        )

    def _rows(self, tensor: Array, geometry: Geometry) -> Array:
        shape = list(tensor.shape)
        if tensor.ndim != 3 or shape[0] != 1:
            raise BundleError(
                f"{self.kind_name} expects one [1, N, K] or [1, K, N] box tensor, "
                f"got shape {shape}",
                field="output",
            )
        if tensor.dtype.kind != "f":
            raise BundleError(
                f"{self.kind_name} expects float box values, got {tensor.dtype}",
                field="output.decoder",
            )
        transposed, _ = box_layout(
            (shape[1], shape[2]),
            objectness=self._objectness,
            labels=len(self._spec.labels),
            where=f"output {shape}",
        )
        boxes: Array = tensor[0]
        return boxes if transposed else boxes.T

    def _boxes(self, values: FloatArray, index: IntArray, geometry: Geometry) -> FloatArray:
        """``(M, 4)`` x1, y1, x2, y2 in model-input pixels from the 4 box rows."""
        a, b, c, d = values
        if self._xyxy:
            return np.stack(
                [np.minimum(a, c), np.minimum(b, d), np.maximum(a, c), np.maximum(b, d)], axis=1
            )
        half_w, half_h = np.abs(c) / 2, np.abs(d) / 2
        return np.stack([a - half_w, b - half_h, a + half_w, b + half_h], axis=1)

    def _detections(
        self,
        boxes: FloatArray,
        scores: FloatArray,
        classes: IntArray,
        kept: IntArray,
        geometry: Geometry,
    ) -> tuple[Detection, ...]:
        boxes = boxes[kept]
        x1, y1 = geometry.to_frame(boxes[:, 0], boxes[:, 1])
        x2, y2 = geometry.to_frame(boxes[:, 2], boxes[:, 3])
        label = self._spec.label
        return tuple(
            Detection(class_id, label(class_id), score, Box(*corners))
            for class_id, score, *corners in zip(
                classes[kept].tolist(),
                scores[kept].tolist(),
                x1.tolist(),
                y1.tolist(),
                x2.tolist(),
                y2.tolist(),
                strict=True,
            )
        )


class YoloDecoder(_BoxDecoder):
    """YOLOv5/v8-style exports: boxes already in input pixels (``box_format``), the
    class scores after them (after the objectness for YOLOv5)."""

    def __init__(self, spec: RuntimeSpec) -> None:
        super().__init__(spec, objectness=spec.output.objectness)


class YoloxDecoder(_BoxDecoder):
    """YOLOX exports without ``decode_in_inference``: raw grid predictions, one row per
    cell of each stride's grid in turn (row-major, ``x`` fastest), decoded as YOLOX does:
    ``xy = (p + cell) * stride``, ``wh = exp(p) * stride``; then as yolo with objectness.
    The grid is ``ceil(h/s) x ceil(w/s)`` of the model input per stride."""

    kind_name = "yolox"

    def __init__(self, spec: RuntimeSpec) -> None:
        super().__init__(spec, objectness=True)
        self._xyxy = False
        self._strides = spec.output.strides
        self._grids: dict[tuple[int, int], tuple[FloatArray, FloatArray, FloatArray]] = {}
        self._lock = threading.Lock()

    def _rows(self, tensor: Array, geometry: Geometry) -> Array:
        rows = super()._rows(tensor, geometry)
        size = (geometry.input_h, geometry.input_w)
        cells = yolox_candidates(size, self._strides)
        if rows.shape[1] != cells:
            raise BundleError(
                f"yolox: the model returned {rows.shape[1]} candidate boxes; an input of "
                f"{list(size)} at strides {list(self._strides)} has {cells} grid cells",
                field="output.strides",
                model=rows.shape[1],
                config=cells,
            )
        return rows

    def _boxes(self, values: FloatArray, index: IntArray, geometry: Geometry) -> FloatArray:
        cell_x, cell_y, strides = self._grid(geometry)
        stride = strides[index]
        with np.errstate(over="ignore"):  # an absurd size is dropped as not finite
            decoded = np.stack(
                [
                    (values[0] + cell_x[index]) * stride,
                    (values[1] + cell_y[index]) * stride,
                    np.exp(values[2]) * stride,
                    np.exp(values[3]) * stride,
                ]
            )
        return super()._boxes(decoded, index, geometry)

    def _grid(self, geometry: Geometry) -> tuple[FloatArray, FloatArray, FloatArray]:
        """Each candidate's cell (x, y) and stride, for this input size (cached)."""
        size = (geometry.input_h, geometry.input_w)
        grid = self._grids.get(size)
        if grid is not None:
            return grid
        xs, ys, strides = [], [], []
        for stride in self._strides:
            height, width = -(-size[0] // stride), -(-size[1] // stride)
            row, col = np.divmod(np.arange(height * width, dtype=np.float64), width)
            xs.append(col)
            ys.append(row)
            strides.append(np.full(height * width, float(stride)))
        grid = (np.concatenate(xs), np.concatenate(ys), np.concatenate(strides))
        with self._lock:
            if len(self._grids) >= _GRID_CACHE_SIZE:
                self._grids.clear()  # a node serving many input sizes: rebuild, stay bounded
            self._grids[size] = grid
        return grid


def build_decoder(spec: RuntimeSpec) -> Decoder:
    """The decoder the spec names, ready for every frame of one version."""
    decoder = spec.output.decoder
    if decoder == "raw":
        return RawDecoder(spec)
    if decoder == "classification":
        return ClassificationDecoder(spec)
    if decoder == "yolo":
        return YoloDecoder(spec)
    if decoder == "yolox":
        return YoloxDecoder(spec)
    raise BundleError(f"decoder {decoder!r} is not built yet", field="output.decoder")
