"""How far a candidate model's outputs agree with the active model's, frame by frame.

What it is for: the shadow stage (ADR 0031). A node runs a candidate version beside the
one it serves on a sample of frames; each output is decoded with its own version's signed
decoder, and the two are compared here: classification by top-1 agreement and top-k
overlap; detections by matching boxes of the same class at IoU >= 0.5 (recall and
precision of the candidate against the active model, and the mean score difference of the
matched boxes); raw outputs by their largest absolute difference and cosine similarity.
``compare_decoded`` / ``compare_raw`` judge one frame; ``AgreementTally`` folds frames
into the figures a health report carries (pooled over boxes, not averaged over frames, so a
frame with one box weighs less than a frame with twenty; raw frames counted at fixed
cosine and difference levels, so the control plane can judge a share of frames). The
active model is the reference: "recall" is the share of its boxes the candidate found too.

What it is not for: deciding whether a candidate is good enough (the rollout's gates), or
running models. Pure: numpy for the raw tensors, no I/O.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, Literal

import numpy as np

from protos.bundle.levels import ABS_DIFF_LEVELS, COSINE_LEVELS
from protos.bundle.results import Box, Decoded, Detection, ResultKind

__all__ = [
    "ABS_DIFF_LEVELS",
    "COSINE_LEVELS",
    "DEFAULT_IOU",
    "AgreementSummary",
    "AgreementTally",
    "FrameAgreement",
    "box_iou",
    "compare_decoded",
    "compare_raw",
    "match_detections",
]

DEFAULT_IOU: Final = 0.5
"""Boxes of the same class overlapping at least this much are the same object."""


Compared = ResultKind | Literal["incomparable"]


@dataclass(frozen=True, slots=True)
class FrameAgreement:
    """One frame's comparison; the fields of its `kind` are set, the others None or 0.

    `incomparable`: the two outputs cannot be compared (different kinds, raw tensors of
    other names or shapes); `why` says how."""

    kind: Compared
    top1: bool | None = None
    topk_overlap: float | None = None
    matched: int = 0
    reference_boxes: int = 0
    candidate_boxes: int = 0
    score_diff_sum: float = 0.0
    max_abs_diff: float | None = None
    cosine: float | None = None
    why: str = ""


def box_iou(a: Box, b: Box) -> float:
    """Intersection over union of two boxes (0 for boxes without area)."""
    width = min(a.x2, b.x2) - max(a.x1, b.x1)
    height = min(a.y2, b.y2) - max(a.y1, b.y1)
    if width <= 0 or height <= 0:
        return 0.0
    inter = width * height
    union = (a.x2 - a.x1) * (a.y2 - a.y1) + (b.x2 - b.x1) * (b.y2 - b.y1) - inter
    return inter / union if union > 0 else 0.0


def match_detections(
    reference: Sequence[Detection],
    candidate: Sequence[Detection],
    iou_threshold: float = DEFAULT_IOU,
) -> list[tuple[int, int]]:
    """(reference index, candidate index) pairs of the same object: the candidate's boxes
    best score first, each to the unmatched reference box of its class it overlaps most
    (at least `iou_threshold`), as detection benchmarks match. Detections without a box
    match nothing."""
    if not 0 < iou_threshold <= 1:
        raise ValueError(f"iou_threshold must be in (0, 1], got {iou_threshold}")
    taken: set[int] = set()
    pairs: list[tuple[int, int]] = []
    order = sorted(range(len(candidate)), key=lambda i: -candidate[i].score)
    for c in order:
        box = candidate[c].box
        if box is None:
            continue
        best, best_iou = -1, iou_threshold
        for r, ref in enumerate(reference):
            if r in taken or ref.box is None or ref.class_id != candidate[c].class_id:
                continue
            iou = box_iou(ref.box, box)
            if iou >= best_iou:
                best, best_iou = r, iou
        if best >= 0:
            taken.add(best)
            pairs.append((best, c))
    return pairs


def compare_decoded(
    reference: Decoded, candidate: Decoded, *, iou_threshold: float = DEFAULT_IOU
) -> FrameAgreement:
    """One frame's decoded outputs compared (classification or detection; for raw
    outputs use `compare_raw` on the tensors, a summary is too coarse)."""
    if reference.kind != candidate.kind:
        return FrameAgreement(
            "incomparable", why=f"{candidate.kind} output against {reference.kind}"
        )
    if reference.kind == "classification":
        ref = [d.class_id for d in reference.detections]
        cand = [d.class_id for d in candidate.detections]
        top1 = (ref[:1] == cand[:1]) if ref or cand else True
        both = max(len(set(ref)), len(set(cand)))
        overlap = len(set(ref) & set(cand)) / both if both else 1.0
        return FrameAgreement("classification", top1=top1, topk_overlap=overlap)
    if reference.kind == "detection":
        pairs = match_detections(reference.detections, candidate.detections, iou_threshold)
        diff = sum(
            abs(reference.detections[r].score - candidate.detections[c].score) for r, c in pairs
        )
        return FrameAgreement(
            "detection",
            matched=len(pairs),
            reference_boxes=sum(d.box is not None for d in reference.detections),
            candidate_boxes=sum(d.box is not None for d in candidate.detections),
            score_diff_sum=diff,
        )
    return FrameAgreement("incomparable", why="raw outputs are compared as tensors")


def compare_raw(reference: Mapping[str, Any], candidate: Mapping[str, Any]) -> FrameAgreement:
    """Raw outputs compared tensor by tensor (by name): the largest absolute difference
    and the cosine similarity of all of them taken as one vector. Two zero vectors are
    alike (1.0); a zero against a non-zero one is not (0.0)."""
    if set(reference) != set(candidate):
        return FrameAgreement(
            "incomparable", why=f"tensors {sorted(candidate)} against {sorted(reference)}"
        )
    refs: list[np.ndarray[Any, Any]] = []
    cands: list[np.ndarray[Any, Any]] = []
    for name in sorted(reference):
        a, b = np.asarray(reference[name]), np.asarray(candidate[name])
        if a.shape != b.shape or a.dtype.kind not in "fiub" or b.dtype.kind not in "fiub":
            return FrameAgreement(
                "incomparable",
                why=f"{name!r}: {b.dtype}{list(b.shape)} against {a.dtype}{list(a.shape)}",
            )
        refs.append(a.astype(np.float64).ravel())
        cands.append(b.astype(np.float64).ravel())
    a = np.concatenate(refs) if refs else np.zeros(0)
    b = np.concatenate(cands) if cands else np.zeros(0)
    if not (np.isfinite(a).all() and np.isfinite(b).all()):
        return FrameAgreement("incomparable", why="a tensor holds NaN or infinity")
    largest = float(np.abs(a - b).max()) if a.size else 0.0
    norms = float(np.linalg.norm(a)) * float(np.linalg.norm(b))
    if norms > 0:
        cosine = max(-1.0, min(1.0, float(np.dot(a, b)) / norms))
    else:
        cosine = 1.0 if not a.any() and not b.any() else 0.0
    return FrameAgreement("raw", max_abs_diff=largest, cosine=cosine)


@dataclass(frozen=True, slots=True)
class AgreementSummary:
    """Frames compared so far and what they say; a figure is None until a frame of its
    kind was compared (or, for `mean_score_diff`, a box was matched)."""

    kind: ResultKind | None
    frames: int
    incomparable: int
    top1_ratio: float | None = None
    topk_overlap: float | None = None
    recall: float | None = None
    precision: float | None = None
    mean_score_diff: float | None = None
    max_abs_diff: float | None = None
    min_cosine: float | None = None
    mean_cosine: float | None = None
    cosine_at_least: tuple[int, ...] = ()  # frames per `COSINE_LEVELS` (raw only)
    abs_diff_at_most: tuple[int, ...] = ()  # frames per `ABS_DIFF_LEVELS` (raw only)

    def to_report(self) -> dict[str, Any]:
        """The health report's `shadow.agreement` (numbers rounded to 6 places)."""

        def r(value: float | None) -> float | None:
            return None if value is None else round(value, 6)

        return {
            "kind": self.kind or "",
            "frames": self.frames,
            "incomparable": self.incomparable,
            "top1_ratio": r(self.top1_ratio),
            "topk_overlap": r(self.topk_overlap),
            "recall": r(self.recall),
            "precision": r(self.precision),
            "mean_score_diff": r(self.mean_score_diff),
            "max_abs_diff": r(self.max_abs_diff),
            "min_cosine": r(self.min_cosine),
            "mean_cosine": r(self.mean_cosine),
            "cosine_at_least": list(self.cosine_at_least),
            "abs_diff_at_most": list(self.abs_diff_at_most),
        }


class AgreementTally:
    """Frames folded into one summary (O(1) per frame, constant memory). Not thread-safe:
    one runner thread adds, readers take `summary()` under the runner's own lock."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self._kind: ResultKind | None = None
        self._frames = 0
        self._incomparable = 0
        self._top1 = 0
        self._overlap = 0.0
        self._matched = 0
        self._reference_boxes = 0
        self._candidate_boxes = 0
        self._score_diff = 0.0
        self._max_abs: float | None = None
        self._min_cosine: float | None = None
        self._cosine_sum = 0.0
        self._cosine_at_least = [0] * len(COSINE_LEVELS)
        self._abs_diff_at_most = [0] * len(ABS_DIFF_LEVELS)

    def add(self, frame: FrameAgreement) -> None:
        if frame.kind == "incomparable":
            self._incomparable += 1
            return
        self._kind = frame.kind
        self._frames += 1
        if frame.kind == "classification":
            self._top1 += bool(frame.top1)
            self._overlap += frame.topk_overlap or 0.0
        elif frame.kind == "detection":
            self._matched += frame.matched
            self._reference_boxes += frame.reference_boxes
            self._candidate_boxes += frame.candidate_boxes
            self._score_diff += frame.score_diff_sum
        else:
            largest = frame.max_abs_diff or 0.0
            cosine = 1.0 if frame.cosine is None else frame.cosine
            self._max_abs = largest if self._max_abs is None else max(self._max_abs, largest)
            self._min_cosine = cosine if self._min_cosine is None else min(self._min_cosine, cosine)
            self._cosine_sum += cosine
            for i, level in enumerate(COSINE_LEVELS):
                self._cosine_at_least[i] += cosine >= level
            for i, level in enumerate(ABS_DIFF_LEVELS):
                self._abs_diff_at_most[i] += largest <= level

    def summary(self) -> AgreementSummary:
        frames = self._frames
        base = AgreementSummary(self._kind, frames, self._incomparable)
        if frames == 0:
            return base
        if self._kind == "classification":
            return dataclasses.replace(
                base, top1_ratio=self._top1 / frames, topk_overlap=self._overlap / frames
            )
        if self._kind == "detection":
            matched = self._matched
            return dataclasses.replace(
                base,
                # Nothing to find is found; nothing claimed is nothing wrong.
                recall=matched / self._reference_boxes if self._reference_boxes else 1.0,
                precision=matched / self._candidate_boxes if self._candidate_boxes else 1.0,
                mean_score_diff=self._score_diff / matched if matched else None,
            )
        return dataclasses.replace(
            base,
            max_abs_diff=self._max_abs,
            min_cosine=self._min_cosine,
            mean_cosine=self._cosine_sum / frames,
            cosine_at_least=tuple(self._cosine_at_least),
            abs_diff_at_most=tuple(self._abs_diff_at_most),
        )
