"""The agreement core: every decoder kind, one frame and many."""

from __future__ import annotations

import numpy as np
import pytest

from protos.bundle.agreement import (
    AgreementTally,
    box_iou,
    compare_decoded,
    compare_raw,
    match_detections,
)
from protos.bundle.results import Box, Decoded, Detection


def cls(*ids: int) -> Decoded:
    return Decoded(
        "classification",
        detections=tuple(Detection(i, f"c{i}", 1.0 - n / 10) for n, i in enumerate(ids)),
    )


def det(*boxes: tuple[int, float, tuple[float, float, float, float]]) -> Decoded:
    return Decoded(
        "detection", detections=tuple(Detection(c, f"c{c}", s, Box(*b)) for c, s, b in boxes)
    )


def test_box_iou() -> None:
    a = Box(0.0, 0.0, 0.5, 0.5)
    assert box_iou(a, a) == pytest.approx(1.0)
    assert box_iou(a, Box(0.25, 0.0, 0.75, 0.5)) == pytest.approx(1 / 3)
    assert box_iou(a, Box(0.6, 0.6, 0.9, 0.9)) == 0.0
    assert box_iou(Box(0.1, 0.1, 0.1, 0.4), Box(0.1, 0.1, 0.1, 0.4)) == 0.0


def test_classification_top1_and_overlap() -> None:
    same = compare_decoded(cls(3, 1, 2), cls(3, 1, 2))
    assert (same.top1, same.topk_overlap) == (True, 1.0)
    other = compare_decoded(cls(3, 1, 2), cls(1, 3, 7))
    assert other.top1 is False
    assert other.topk_overlap == pytest.approx(2 / 3)
    assert compare_decoded(cls(), cls()).top1 is True  # both below their thresholds
    assert compare_decoded(cls(3), cls()).top1 is False


def test_detections_match_by_class_and_iou() -> None:
    ref = det((0, 0.9, (0.1, 0.1, 0.3, 0.3)), (1, 0.8, (0.5, 0.5, 0.9, 0.9)))
    # Same first box (score 0.1 lower); the second shifted past IoU 0.5; a third extra.
    cand = det(
        (0, 0.8, (0.1, 0.1, 0.3, 0.3)),
        (1, 0.8, (0.7, 0.7, 1.0, 1.0)),
        (2, 0.5, (0.0, 0.0, 0.1, 0.1)),
    )
    frame = compare_decoded(ref, cand)
    assert (frame.matched, frame.reference_boxes, frame.candidate_boxes) == (1, 2, 3)
    assert frame.score_diff_sum == pytest.approx(0.1)
    # Another class at the same place is another object.
    assert compare_decoded(ref, det((5, 0.9, (0.1, 0.1, 0.3, 0.3)))).matched == 0


def test_each_reference_box_is_matched_once_best_candidate_first() -> None:
    ref = det((0, 0.9, (0.0, 0.0, 0.4, 0.4)))
    cand = det((0, 0.5, (0.0, 0.0, 0.4, 0.4)), (0, 0.9, (0.0, 0.0, 0.38, 0.4)))
    assert match_detections(ref.detections, cand.detections) == [(0, 1)]


def test_raw_tensors() -> None:
    x = np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4)
    same = compare_raw({"y": x}, {"y": x.copy()})
    assert (same.kind, same.max_abs_diff, same.cosine) == ("raw", 0.0, pytest.approx(1.0))
    flipped = compare_raw({"y": x}, {"y": -x})
    assert flipped.cosine == pytest.approx(-1.0)
    assert flipped.max_abs_diff == pytest.approx(2.0)
    zeros = np.zeros((3, 4), np.float32)
    assert compare_raw({"y": zeros}, {"y": zeros}).cosine == 1.0
    assert compare_raw({"y": zeros}, {"y": x}).cosine == 0.0
    assert compare_raw({"y": x}, {"z": x}).kind == "incomparable"
    assert compare_raw({"y": x}, {"y": x[:2]}).kind == "incomparable"
    assert compare_raw({"y": x}, {"y": np.full_like(x, np.nan)}).kind == "incomparable"


def test_kinds_that_differ_are_incomparable() -> None:
    frame = compare_decoded(cls(1), det())
    assert frame.kind == "incomparable" and "detection" in frame.why
    assert compare_decoded(Decoded("raw"), Decoded("raw")).kind == "incomparable"


def test_tally_classification() -> None:
    tally = AgreementTally()
    assert tally.summary().top1_ratio is None
    for cand in (cls(1, 2), cls(1, 2), cls(2, 1), cls(9, 8)):
        tally.add(compare_decoded(cls(1, 2), cand))
    tally.add(compare_decoded(cls(1), det()))
    summary = tally.summary()
    assert (summary.kind, summary.frames, summary.incomparable) == ("classification", 4, 1)
    assert summary.top1_ratio == pytest.approx(0.5)
    assert summary.topk_overlap == pytest.approx(0.75)
    report = summary.to_report()
    assert report["top1_ratio"] == 0.5 and report["recall"] is None


def test_tally_detection_pools_boxes() -> None:
    tally = AgreementTally()
    box = (0.1, 0.1, 0.3, 0.3)
    many = det(*[(0, 0.9, (0.05 * i, 0.0, 0.05 * i + 0.04, 0.04)) for i in range(19)])
    tally.add(compare_decoded(many, many))  # 19 boxes, all found
    tally.add(compare_decoded(det((0, 0.9, box)), det()))  # one box missed
    summary = tally.summary()
    assert summary.recall == pytest.approx(19 / 20)
    assert summary.precision == 1.0
    assert summary.mean_score_diff == 0.0
    empty = AgreementTally()
    empty.add(compare_decoded(det(), det()))
    assert (empty.summary().recall, empty.summary().precision) == (1.0, 1.0)
    assert empty.summary().mean_score_diff is None


def test_tally_raw_and_reset() -> None:
    tally = AgreementTally()
    x = np.arange(4, dtype=np.float32)
    tally.add(compare_raw({"y": x}, {"y": x}))
    tally.add(compare_raw({"y": x}, {"y": x + 1}))
    summary = tally.summary()
    assert summary.max_abs_diff == 1.0
    assert summary.min_cosine is not None and summary.min_cosine < 1.0
    assert summary.mean_cosine is not None and summary.min_cosine < summary.mean_cosine <= 1.0
    # Frame by frame at fixed levels: x against x+1 has a cosine of about 0.956 and a
    # largest difference of 1, so it counts at 0.9 and within 1 and 10 only.
    assert summary.cosine_at_least == (2, 1, 1, 1, 1, 1)
    assert summary.abs_diff_at_most == (1, 1, 1, 1, 1, 1, 2, 2)
    assert summary.to_report()["cosine_at_least"] == [2, 1, 1, 1, 1, 1]
    tally.reset()
    assert tally.summary().frames == 0
