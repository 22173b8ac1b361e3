"""Where a frame went inside the model's input, and the way back.

What it is for: the preprocessor says how it fitted a frame into the model's input
(:meth:`~protos.bundle.preprocess.Preprocessor.geometry`: stretched, or letterboxed with a
scale and padding); a decoder maps the boxes it finds, in model-input pixels, back to the
frame with :meth:`Geometry.to_frame`. Numpy only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

__all__ = ["Geometry"]

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
        """The frame resized to the whole input, aspect ratio ignored."""
        return cls(frame_h, frame_w, input_h, input_w, input_w / frame_w, input_h / frame_h)

    def to_frame(self, xs: Array, ys: Array) -> tuple[Array, Array]:
        """Model-input pixel coordinates to normalised frame coordinates, clipped to [0, 1]."""
        fx = (np.asarray(xs, dtype=np.float64) - self.pad_x) / (self.scale_x * self.frame_w)
        fy = (np.asarray(ys, dtype=np.float64) - self.pad_y) / (self.scale_y * self.frame_h)
        return np.clip(fx, 0.0, 1.0), np.clip(fy, 0.0, 1.0)
