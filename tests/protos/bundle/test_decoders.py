"""Output decoders on hand-made tensors: top-k, boxes (threshold, NMS, limits, layouts),
YOLOX's grid, raw summaries, and the refusals when the outputs are not what the spec says."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

from protos.bundle.decoders import Geometry, build_decoder, nms
from protos.bundle.results import Box, Decoded
from protos.bundle.spec import BundleError, OutputSpec, RuntimeSpec

Array = npt.NDArray[Any]
SQUARE = Geometry.stretch(100, 100, 100, 100)  # input pixels == frame pixels, 100 x 100


def spec(decoder: Any, labels: Sequence[str] = (), **params: Any) -> RuntimeSpec:
    return RuntimeSpec(output=OutputSpec(decoder=decoder, **params), labels=tuple(labels))


def boxes_tensor(
    rows: Sequence[Sequence[float]], *, transposed: bool = False, candidates: int = 16
) -> Array:
    """Candidates as [1, N, K] (or [1, K, N]): one row per box, K values each, then rows
    of zeros up to ``candidates`` (a real export has many more boxes than values per box,
    which is how the axis of K is told without labels)."""
    width = len(rows[0])
    padded = [*rows, *[[0.0] * width] * max(0, candidates - len(rows))]
    tensor = np.asarray(padded, dtype=np.float32)[None]
    return np.ascontiguousarray(tensor.transpose(0, 2, 1)) if transposed else tensor


def decode(
    runtime: RuntimeSpec, tensor: Array, geometry: Geometry = SQUARE, name: str = "out"
) -> Decoded:
    return build_decoder(runtime).decode({name: tensor}, geometry)


def summary(decoded: Decoded) -> list[tuple[str, float, tuple[float, ...]]]:
    return [
        (
            d.label,
            round(d.score, 4),
            ()
            if d.box is None
            else tuple(round(v, 4) for v in (d.box.x1, d.box.y1, d.box.x2, d.box.y2)),
        )
        for d in decoded.detections
    ]


# ------------------------------------------------------------------------- classification


def test_classification_top_k_with_labels_and_softmax() -> None:
    logits = np.array([[1.0, 3.0, 0.0, 2.0]], dtype=np.float32)
    runtime = spec("classification", ["a", "b", "c", "d"], top_k=2, softmax=True, score_threshold=0)
    decoded = decode(runtime, logits)

    e = np.exp([1.0, 3.0, 0.0, 2.0])
    p = e / e.sum()
    assert decoded.kind == "classification"
    assert [(d.class_id, d.label) for d in decoded.detections] == [(1, "b"), (3, "d")]
    assert [d.score for d in decoded.detections] == pytest.approx([p[1], p[3]])
    assert all(d.box is None for d in decoded.detections)


def test_classification_threshold_and_unlabelled_classes() -> None:
    scores = np.array([0.05, 0.6, 0.3, 0.05], dtype=np.float32)  # [C], no batch axis
    decoded = decode(spec("classification", top_k=4, score_threshold=0.2), scores)
    assert [(d.label, round(d.score, 3)) for d in decoded.detections] == [
        ("class_1", 0.6),
        ("class_2", 0.3),
    ]


@pytest.mark.parametrize(
    ("labels", "tensor", "field"),
    [
        (["a", "b"], np.zeros((1, 3), np.float32), "labels"),
        ([], np.zeros((2, 3), np.float32), "output"),
        ([], np.zeros((1, 0), np.float32), "output"),
    ],
)
def test_classification_refuses_outputs_it_cannot_read(
    labels: list[str], tensor: Array, field: str
) -> None:
    with pytest.raises(BundleError) as caught:
        decode(spec("classification", labels), tensor)
    assert caught.value.field == field


# ------------------------------------------------------------------------------- yolo

# cx, cy, w, h, then the class scores of classes 0 and 1
A = [20, 20, 20, 20, 0.9, 0.0]  # class 0, box 10..30
A_OVERLAP = [22, 20, 20, 20, 0.8, 0.0]  # class 0, IoU with A = 18*20 / (2*400 - 360) = 0.82
A_OTHER_CLASS = [21, 20, 20, 20, 0.0, 0.7]  # class 1, on top of A
FAR = [70, 70, 10, 10, 0.1, 0.6]  # class 1, far away
WEAK = [50, 50, 10, 10, 0.2, 0.1]  # under the threshold


def test_yolo_threshold_nms_and_classes() -> None:
    runtime = spec("yolo", ["person", "car"], score_threshold=0.25, iou_threshold=0.45)
    decoded = decode(runtime, boxes_tensor([WEAK, A_OVERLAP, FAR, A, A_OTHER_CLASS]))

    assert decoded.kind == "detection"
    assert summary(decoded) == [
        ("person", 0.9, (0.1, 0.1, 0.3, 0.3)),  # A: A_OVERLAP suppressed, same class
        ("car", 0.7, (0.11, 0.1, 0.31, 0.3)),  # a different class on top is kept
        ("car", 0.6, (0.65, 0.65, 0.75, 0.75)),
    ]
    assert [d.class_id for d in decoded.detections] == [0, 1, 1]


def test_an_iou_threshold_over_the_overlap_keeps_both() -> None:
    # Two candidates of 6 values: with the labels, K is known whichever axis is longer.
    runtime = spec("yolo", ["person", "car"], iou_threshold=0.9)
    decoded = decode(runtime, boxes_tensor([A, A_OVERLAP], candidates=0))
    assert [d.score for d in decoded.detections] == pytest.approx([0.9, 0.8])


def test_yolo_stops_at_max_detections_best_first() -> None:
    rows = [[10 + 15 * i, 50, 10, 10, 0.3 + 0.1 * i] for i in range(6)]  # apart, one class
    decoded = decode(spec("yolo", max_detections=3), boxes_tensor(rows))
    assert [round(d.score, 4) for d in decoded.detections] == [0.8, 0.7, 0.6]
    assert [d.box.x1 for d in decoded.detections if d.box] == pytest.approx([0.8, 0.65, 0.5])


@pytest.mark.parametrize("labels", [("person", "car"), ()])
def test_both_orientations_decode_the_same(labels: tuple[str, ...]) -> None:
    rows = [WEAK, A_OVERLAP, FAR, A, A_OTHER_CLASS, [40, 40, 5, 5, 0.5, 0.4], WEAK, WEAK]
    runtime = spec("yolo", labels)
    as_nk = decode(runtime, boxes_tensor(rows, candidates=0))
    as_kn = decode(runtime, boxes_tensor(rows, transposed=True, candidates=0))
    assert boxes_tensor(rows, transposed=True, candidates=0).shape == (1, 6, 8)
    assert len(as_nk.detections) == 4
    assert as_kn == as_nk


def test_the_transposed_layout_of_a_yolov8_export() -> None:
    """[1, 4 + C, N] as YOLOv8 exports it: many more candidates than values per box."""
    rows = [[10.0 * i + 5, 50, 4, 4, 0.0, 0.0, 0.0] for i in range(10)]
    rows[3][4 + 2] = 0.75
    rows[7][4 + 0] = 0.5
    tensor = boxes_tensor(rows, transposed=True, candidates=0)
    assert tensor.shape == (1, 7, 10)
    decoded = decode(spec("yolo"), tensor)
    assert [(d.class_id, d.score) for d in decoded.detections] == [(2, 0.75), (0, 0.5)]
    assert decoded.detections[0].box == Box(
        pytest.approx(0.33), pytest.approx(0.48), pytest.approx(0.37), pytest.approx(0.52)
    )


def test_xyxy_boxes_decode_like_their_cxcywh_twins() -> None:
    as_xyxy = [[10, 10, 30, 30, 0.9, 0.0], [60, 60, 80, 70, 0.0, 0.8]]
    as_cxcywh = [[20, 20, 20, 20, 0.9, 0.0], [70, 65, 20, 10, 0.0, 0.8]]
    decoded = decode(spec("yolo", box_format="xyxy"), boxes_tensor(as_xyxy))
    assert decoded == decode(spec("yolo"), boxes_tensor(as_cxcywh))
    assert summary(decoded)[1] == ("class_1", 0.8, (0.6, 0.6, 0.8, 0.7))


def test_objectness_multiplies_the_class_score() -> None:
    rows = [[20, 20, 10, 10, 0.5, 0.9, 0.1], [70, 70, 10, 10, 0.2, 1.0, 0.0]]
    decoded = decode(spec("yolo", ["a", "b"], objectness=True), boxes_tensor(rows))
    # 0.5 * 0.9 passes; the second's objectness 0.2 caps it at 0.2 < 0.25.
    assert [(d.label, d.score) for d in decoded.detections] == [("a", pytest.approx(0.45))]


def test_boxes_are_mapped_to_the_frame_through_the_geometry() -> None:
    # A 200 x 400 frame (h x w) stretched to a 100 x 100 input.
    geometry = Geometry.stretch(200, 400, 100, 100)
    decoded = decode(spec("yolo"), boxes_tensor([[50, 25, 20, 10, 0.9, 0.0]]), geometry)
    assert summary(decoded) == [("class_0", 0.9, (0.4, 0.2, 0.6, 0.3))]
    # Off the input's edge: clipped to the frame.
    edge = decode(spec("yolo"), boxes_tensor([[95, 5, 20, 20, 0.9, 0.0]]))
    assert summary(edge) == [("class_0", 0.9, (0.85, 0.0, 1.0, 0.15))]


def test_equal_scores_keep_the_first_candidate() -> None:
    twin = [A[0] + 1, *A[1:]]
    decoded = decode(spec("yolo"), boxes_tensor([twin, A]))
    assert summary(decoded) == [("class_0", 0.9, (0.11, 0.1, 0.31, 0.3))]


def test_non_finite_candidates_are_dropped_not_fatal() -> None:
    rows = [[math.inf, 20, 20, 20, 0.9, 0.0], [20, 20, 20, 20, math.nan, 0.0], A_OTHER_CLASS]
    assert [d.label for d in decode(spec("yolo"), boxes_tensor(rows)).detections] == ["class_1"]


def test_nothing_over_the_threshold_is_an_empty_detection() -> None:
    decoded = decode(spec("yolo"), boxes_tensor([WEAK, WEAK]))
    assert decoded == Decoded("detection")


@pytest.mark.parametrize(
    ("runtime", "tensor", "field"),
    [
        (spec("yolo"), np.zeros((8, 6), np.float32), "output"),
        (spec("yolo"), np.zeros((2, 8, 6), np.float32), "output"),
        (spec("yolo"), np.zeros((1, 8, 6), np.int32), "output.decoder"),
        (spec("yolo", ["a", "b", "c"]), np.zeros((1, 8, 6), np.float32), "labels"),
        (spec("yolo"), np.zeros((1, 8, 4), np.float32), "output"),
        (spec("yolo", objectness=True), np.zeros((1, 8, 5), np.float32), "output"),
        (spec("yolo", output="boxes"), np.zeros((1, 8, 6), np.float32), "output.output"),
    ],
)
def test_yolo_refuses_outputs_it_cannot_read(
    runtime: RuntimeSpec, tensor: Array, field: str
) -> None:
    with pytest.raises(BundleError) as caught:
        decode(runtime, tensor)
    assert caught.value.field == field


def test_nms_is_class_wise_greedy_and_bounded() -> None:
    # Three boxes in a row, 2 px apart: neighbours overlap 0.67, the outer two 0.43.
    boxes = np.array(
        [[2, 0, 12, 10], [0, 0, 10, 10], [4, 0, 14, 10], [2, 0, 12, 10], [50, 50, 60, 60]],
        dtype=np.float64,
    )
    scores = np.array([0.9, 0.95, 0.8, 0.5, 0.7])
    classes = np.array([0, 0, 0, 1, 0])
    # Greedy: 1 (best) suppresses its neighbour 0; 0, suppressed, no longer suppresses 2.
    # Class 1's box 3 sits on 0 but is another class.
    assert nms(boxes, scores, classes, 0.5, 10).tolist() == [1, 2, 4, 3]
    assert nms(boxes, scores, classes, 0.5, 2).tolist() == [1, 2]
    assert nms(boxes, scores, classes, 0.3, 10).tolist() == [1, 4, 3]
    assert nms(boxes, scores, classes, 0.7, 10).tolist() == [1, 0, 2, 4, 3]
    empty = np.zeros((0, 4))
    assert nms(empty, np.zeros(0), np.zeros(0, np.intp), 0.5, 10).tolist() == []


# ------------------------------------------------------------------------------- yolox


def yolox_tensor(cells: int, *, classes: int = 2) -> Array:
    tensor = np.zeros((1, cells, 5 + classes), dtype=np.float32)
    tensor[0, :, 4] = 0.01  # objectness of the background
    return tensor


def test_yolox_decodes_the_grid_as_yolox_does() -> None:
    # 64 x 64 input, strides 8, 16, 32: grids of 8x8, 4x4, 2x2 = 84 cells.
    tensor = yolox_tensor(84)
    cell = 64 + 1 * 4 + 2  # stride 16, row y=1, column x=2
    tensor[0, cell, :5] = [0.5, 0.25, math.log(2), 0.0, 0.8]
    tensor[0, cell, 5:] = [0.1, 0.5]
    decoded = decode(spec("yolox"), tensor, Geometry.stretch(64, 64, 64, 64))

    # cx = (0.5 + 2) * 16 = 40, cy = (0.25 + 1) * 16 = 20, w = 2 * 16 = 32, h = 1 * 16 = 16
    x1, y1, x2, y2 = 40 - 16, 20 - 8, 40 + 16, 20 + 8
    assert [(d.class_id, d.score) for d in decoded.detections] == [(1, pytest.approx(0.4))]
    box = decoded.detections[0].box
    assert box is not None
    assert (box.x1, box.y1, box.x2, box.y2) == pytest.approx((x1 / 64, y1 / 64, x2 / 64, y2 / 64))


def test_yolox_grid_is_row_major_on_a_wide_input() -> None:
    # 32 x 64 (h x w) at stride 8 alone: 4 rows of 8 cells; index 21 is x=5, y=2.
    tensor = yolox_tensor(32)
    tensor[0, 21, :5] = [0.0, 0.0, 0.0, 0.0, 0.9]
    tensor[0, 21, 5] = 1.0
    decoded = decode(spec("yolox", strides=(8,)), tensor, Geometry.stretch(32, 64, 32, 64))
    box = decoded.detections[0].box
    assert box is not None
    # cx = 5 * 8 = 40, cy = 2 * 8 = 16, w = h = 8
    assert (box.x1, box.y1, box.x2, box.y2) == pytest.approx((36 / 64, 12 / 32, 44 / 64, 20 / 32))


def test_yolox_refuses_a_grid_that_does_not_fit_the_input() -> None:
    with pytest.raises(BundleError) as caught:
        decode(spec("yolox"), yolox_tensor(85), Geometry.stretch(64, 64, 64, 64))
    assert caught.value.field == "output.strides"
    assert (caught.value.model, caught.value.config) == (85, 84)
    assert "[64, 64]" in str(caught.value)


def test_yolox_absurd_sizes_are_dropped() -> None:
    tensor = yolox_tensor(84)
    tensor[0, 0, :5] = [0.0, 0.0, 1000.0, 1.0, 0.9]  # exp(1000) overflows
    tensor[0, 0, 5] = 1.0
    assert decode(spec("yolox"), tensor, Geometry.stretch(64, 64, 64, 64)).detections == ()


# --------------------------------------------------------------------------------- raw


def test_raw_summarises_with_the_fraction_over_the_threshold() -> None:
    maps = np.array([[0.0, 0.1], [0.5, 0.9]], dtype=np.float32)
    extra = np.arange(3, dtype=np.int64)
    decoded = build_decoder(spec("raw", threshold=0.3)).decode({"maps": maps, "n": extra}, SQUARE)

    assert decoded.kind == "raw"
    first, second = decoded.tensors
    assert (first.name, first.shape, first.dtype) == ("maps", (2, 2), "float32")
    assert (first.min, first.max, first.mean) == pytest.approx((0.0, 0.9, 0.375))
    assert (first.threshold, first.above) == (0.3, 0.5)
    assert (second.name, second.max, second.above) == ("n", 2.0, pytest.approx(2 / 3))


def test_raw_named_output() -> None:
    outputs = {"a": np.zeros(2), "b": np.ones(3)}
    decoded = build_decoder(spec("raw", output="b")).decode(outputs, SQUARE)
    assert [t.name for t in decoded.tensors] == ["b"]
    assert decoded.tensors[0].above is None
    with pytest.raises(BundleError) as caught:
        build_decoder(spec("raw", output="c")).decode(outputs, SQUARE)
    assert caught.value.field == "output.output"


@pytest.mark.parametrize("size", [1, 2, 4, 64, 65, 1000])
def test_raw_summary_is_numpys_for_small_and_large_outputs(size: int) -> None:
    # Small outputs are summarised in Python floats, large ones by numpy: the same figures.
    rng = np.random.default_rng(size)
    outputs = {
        "f": rng.normal(0, 3, size).astype(np.float32),
        "i": rng.integers(-50, 50, size, dtype=np.int64),
        "b": rng.random(size) > 0.5,
    }
    for tensor in build_decoder(spec("raw")).decode(outputs, SQUARE).tensors:
        data = outputs[tensor.name].astype(np.float64)
        assert (tensor.min, tensor.max) == (data.min(), data.max())
        assert tensor.mean == pytest.approx(data.mean(), rel=1e-12, abs=1e-12)
        assert tensor.dtype == str(outputs[tensor.name].dtype)
        assert tensor.shape == (size,)


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        ([1.0, math.nan, 2.0], (math.nan, math.nan, math.nan)),
        ([math.inf, -math.inf, 1.0], (-math.inf, math.inf, math.nan)),
        ([math.inf, 1.0], (1.0, math.inf, math.inf)),
    ],
)
def test_raw_summary_of_non_finite_outputs_is_numpys(
    values: list[float], expected: tuple[float, float, float]
) -> None:
    with np.errstate(invalid="ignore"):
        (tensor,) = build_decoder(spec("raw")).decode({"x": np.array(values)}, SQUARE).tensors
    got = (tensor.min, tensor.max, tensor.mean)
    assert [math.isnan(v) for v in got] == [math.isnan(v) for v in expected]
    assert [v for v in got if not math.isnan(v)] == [v for v in expected if not math.isnan(v)]


def test_raw_summary_of_empty_and_non_numeric_outputs() -> None:
    outputs = {"empty": np.zeros((0, 3), np.float32), "text": np.array(["a", "b"])}
    empty, text = build_decoder(spec("raw", threshold=0.5)).decode(outputs, SQUARE).tensors
    assert (empty.shape, empty.dtype, empty.above) == ((0, 3), "float32", None)
    assert math.isnan(empty.mean) and math.isnan(text.max)
    assert text.dtype == "<U1"
