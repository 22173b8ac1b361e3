"""The frame a version's self-test reference is made from: the operator's, or a generated one.

What it is for: ``model push --runtime`` records a camera-sized HxWx3 uint8 RGB frame in
the reference pair (``frame``), together with the tensor the signed preprocessing makes of
it; the node preprocesses the same frame itself and must get the same tensor. The frame
comes from ``--reference-frame`` (``.npy``, ``.png``, ``.jpg``) or from
:func:`generated_frame`: deterministic, with structure (gradients, edges, flat shapes of
distinct colours) so that a wrong resize, colour order or normalisation changes the tensor
visibly — noise would hide a swapped channel order, a flat image a wrong resize.

What it is not for: preprocessing (``protos.bundle.preprocess``) or decoding camera
streams (the node's capture). Pillow loads only for a ``.png``/``.jpg`` file.
"""

from __future__ import annotations

import zipfile
from pathlib import Path
from typing import Final

import numpy as np
import numpy.typing as npt

from control_plane.errors import InvalidInputError
from protos.bundle.preprocess import ImageError, check_image
from protos.bundle.spec import MAX_SIDE

__all__ = [
    "FRAME_SUFFIXES",
    "GENERATED_SIZE",
    "MAX_FRAME_FILE_BYTES",
    "generated_frame",
    "load_frame",
]

GENERATED_SIZE: Final = (480, 640)
"""(height, width) of the generated frame: a common camera resolution (VGA)."""
MAX_FRAME_FILE_BYTES: Final = 256 * 1024**2
FRAME_SUFFIXES: Final = (".npy", ".png", ".jpg", ".jpeg")
_FIELD: Final = "reference_frame"


def generated_frame(
    height: int = GENERATED_SIZE[0], width: int = GENERATED_SIZE[1]
) -> npt.NDArray[np.uint8]:
    """A deterministic HxWx3 uint8 RGB test image (the same bytes on every machine).

    Red rises left to right, green top to bottom, blue along the diagonal; on top, a
    white-bordered dark rectangle, a disc of saturated colour, a checkerboard patch and a
    bar of the three primaries (so RGB and BGR differ everywhere it matters).
    """
    if not (16 <= height <= MAX_SIDE and 16 <= width <= MAX_SIDE):
        raise ValueError(f"a generated frame is 16..{MAX_SIDE} pixels a side, got {height}x{width}")
    ys = np.arange(height, dtype=np.float64)[:, None]
    xs = np.arange(width, dtype=np.float64)[None, :]
    frame = np.empty((height, width, 3), dtype=np.uint8)
    frame[..., 0] = np.rint(255 * xs / (width - 1))
    frame[..., 1] = np.rint(255 * ys / (height - 1))
    frame[..., 2] = np.rint(255 * (xs / (width - 1) + ys / (height - 1)) / 2)

    def box(y0: float, x0: float, y1: float, x1: float) -> tuple[slice, slice]:
        return slice(int(y0 * height), int(y1 * height)), slice(int(x0 * width), int(x1 * width))

    frame[box(0.10, 0.08, 0.45, 0.40)] = (255, 255, 255)
    frame[box(0.13, 0.11, 0.42, 0.37)] = (20, 30, 40)
    cy, cx, radius = 0.35 * height, 0.68 * width, 0.18 * min(height, width)
    frame[(ys - cy) ** 2 + (xs - cx) ** 2 <= radius**2] = (230, 40, 170)
    rows, cols = box(0.58, 0.10, 0.90, 0.45)
    cell = max(1, min(height, width) // 24)
    checker = ((ys[rows] // cell + xs[:, cols] // cell) % 2).astype(bool)
    frame[rows, cols] = np.where(checker[..., None], 250, 5).astype(np.uint8)
    for i, colour in enumerate(((255, 0, 0), (0, 255, 0), (0, 0, 255))):
        frame[box(0.62, 0.55 + 0.12 * i, 0.88, 0.65 + 0.12 * i)] = colour
    return frame


def load_frame(
    path: Path, *, what: str = "reference frame", field: str = _FIELD
) -> npt.NDArray[np.uint8]:
    """The operator's reference frame: a ``.npy`` holding HxWx3 uint8 RGB, or a PNG/JPEG
    (converted to RGB). InvalidInputError names the file and what is wrong with it (``what``
    and ``field`` say which frame it is: a calibration image too is read here)."""
    where = str(path)
    suffix = path.suffix.lower()
    if suffix not in FRAME_SUFFIXES:
        raise InvalidInputError(
            f"{what} {where}: must be one of {', '.join(FRAME_SUFFIXES)}, got {path.name!r}",
            field=field,
            path=where,
        )
    try:
        size = path.stat().st_size
        if size > MAX_FRAME_FILE_BYTES:
            raise InvalidInputError(
                f"{what} {where} is {size} bytes, over {MAX_FRAME_FILE_BYTES}",
                field=field,
                path=where,
            )
        frame = _read_npy(path) if suffix == ".npy" else _read_image(path)
    except InvalidInputError:
        raise
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as exc:
        raise InvalidInputError(
            f"cannot read {what} {where}: {exc}", field=field, path=where
        ) from exc
    try:
        image = check_image(frame)
    except ImageError as exc:
        raise InvalidInputError(
            f"{what} {where}: {exc} (an RGB image, height x width x 3, uint8)",
            field=field,
            path=where,
        ) from exc
    height, width = image.shape[:2]
    if height > MAX_SIDE or width > MAX_SIDE:
        raise InvalidInputError(
            f"{what} {where} is {width}x{height}; at most {MAX_SIDE} a side",
            field=field,
            path=where,
        )
    return np.ascontiguousarray(image)


def _read_npy(path: Path) -> object:
    array = np.load(path, allow_pickle=False)
    if not isinstance(array, np.ndarray):
        raise ValueError("not a .npy array file")
    return array


def _read_image(path: Path) -> object:
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(path) as image:
            if image.width > MAX_SIDE or image.height > MAX_SIDE:
                raise ValueError(f"{image.width}x{image.height}; at most {MAX_SIDE} a side")
            return np.asarray(image.convert("RGB"), dtype=np.uint8)
    except (UnidentifiedImageError, Image.DecompressionBombError) as exc:
        raise ValueError(str(exc)) from exc
