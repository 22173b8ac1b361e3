"""Frames as the runtime gets them: checked, and decoded from JPEG/PNG bytes.

What it is for: a camera frame is a decoded HxWx3 uint8 RGB array, or encoded bytes that a
decoder (Pillow) turns into one. A frame that cannot be used raises
:class:`~edge_node.runtime.errors.BadFrameError` with a ``reason`` the pipeline counts.
Turning the image into the model's input is the model bundle's job
(:mod:`protos.bundle.preprocess`, one implementation shared with the operator's CLI); it
is re-exported here for the runtime.

Decoding at reduced size: a JPEG can be decoded at 1/2, 1/4 or 1/8 of its size by scaling
its DCT blocks (Pillow's ``Image.draft``), much cheaper than a full decode. When the model's
input is smaller than the frame, the decoder is told the smallest image the preprocessing
can use (:class:`DecodeTarget`: the model's input size and fit) and decodes at the largest
reduction that stays at least that size on both axes; the preprocessor then resizes as
usual. It never shrinks below the target, so nothing is upscaled that the decoder shrank.
"""

from __future__ import annotations

import importlib
import io
import math
from dataclasses import dataclass
from typing import Any, Final, Protocol

import numpy as np
import numpy.typing as npt

from edge_node.runtime.errors import BadFrameError
from protos.bundle.preprocess import Preprocessor, resize_image
from protos.bundle.spec import Fit

__all__ = [
    "MAX_ENCODED_BYTES",
    "MAX_FRAME_PIXELS",
    "DecodeTarget",
    "FrameData",
    "FrameDecoder",
    "PillowDecoder",
    "Preprocessor",
    "check_frame",
    "decode_frame",
    "default_decoder",
    "resize_image",
]

MAX_FRAME_PIXELS: Final = 8192 * 4096
"""Larger frames are refused (``too_large``): a bound on what one frame may cost."""
MAX_ENCODED_BYTES: Final = 32 * 1024 * 1024

FrameData = npt.NDArray[np.uint8] | bytes
"""What a stream submits: a decoded HxWx3 uint8 RGB image, or encoded (JPEG) bytes."""


@dataclass(frozen=True, slots=True)
class DecodeTarget:
    """What the model's preprocessing will make of a decoded frame: its input ``size``
    (height, width) and ``fit``. A decoder may hand back any image at least
    :meth:`minimum` on both axes instead of the full frame."""

    size: tuple[int, int]
    fit: Fit = "stretch"

    @classmethod
    def of(cls, preprocessor: Preprocessor) -> DecodeTarget:
        return cls(preprocessor.size, preprocessor.config.fit)

    def minimum(self, width: int, height: int) -> tuple[int, int]:
        """The smallest ``(width, height)`` a ``width`` x ``height`` frame may be decoded at:
        the model's input for ``stretch``, the frame scaled to fit inside it for
        ``letterbox`` (rounded up); never more than the frame itself."""
        model_h, model_w = self.size
        if self.fit == "letterbox":
            ratio = min(model_h / height, model_w / width)
            return min(width, math.ceil(width * ratio)), min(height, math.ceil(height * ratio))
        return min(width, model_w), min(height, model_h)


class FrameDecoder(Protocol):
    def decode(self, data: bytes, target: DecodeTarget | None = None) -> npt.NDArray[np.uint8]:
        """Encoded bytes to an HxWx3 uint8 RGB array; any exception means corrupt.

        With a ``target`` the decoder may return a smaller image, at least
        ``target.minimum(width, height)`` on both axes (the preprocessor resizes it)."""
        ...


class PillowDecoder:
    """Decodes JPEG/PNG with Pillow (a dependency since camera sources; still imported lazily).

    With a target smaller than the frame, a JPEG is decoded at reduced size (``draft``);
    other formats are decoded in full. ``reduce=False`` always decodes in full.
    """

    def __init__(self, *, reduce: bool = True) -> None:
        self._image: Any = importlib.import_module("PIL.Image")
        self._reduce = reduce

    def decode(self, data: bytes, target: DecodeTarget | None = None) -> npt.NDArray[np.uint8]:
        image = self._image.open(io.BytesIO(data))
        try:
            width, height = image.size  # read from the header, before any pixel is decoded
            if width * height > MAX_FRAME_PIXELS:
                raise BadFrameError(
                    f"encoded frame is {width}x{height}, over {MAX_FRAME_PIXELS} pixels",
                    reason="too_large",
                    pixels=width * height,
                )
            if target is not None and self._reduce:
                need_w, need_h = target.minimum(width, height)
                if need_w < width and need_h < height:
                    # draft picks the largest 1/2, 1/4, 1/8 reduction at least this size
                    # (a no-op for formats without one); checked anyway, and undone if a
                    # Pillow that rounds otherwise went below it.
                    image.draft("RGB", (need_w, need_h))
                    reduced_w, reduced_h = image.size
                    if reduced_w < need_w or reduced_h < need_h:
                        image.close()
                        image = self._image.open(io.BytesIO(data))
            return np.asarray(image.convert("RGB"), dtype=np.uint8)
        finally:
            image.close()


def default_decoder() -> FrameDecoder | None:
    """Pillow's decoder if Pillow can be imported, else ``None`` (encoded frames are refused)."""
    try:
        return PillowDecoder()
    except ImportError:
        return None


def check_frame(frame: object) -> FrameData:
    """Cheap checks a frame must pass before it is queued; raises :class:`BadFrameError`."""
    if isinstance(frame, bytes | bytearray | memoryview):
        size = len(frame) if not isinstance(frame, memoryview) else frame.nbytes
        if size == 0:
            raise BadFrameError("encoded frame is empty", reason="empty")
        if size > MAX_ENCODED_BYTES:
            raise BadFrameError(
                f"encoded frame is {size} bytes, over {MAX_ENCODED_BYTES}",
                reason="too_large",
                size=size,
            )
        return bytes(frame) if not isinstance(frame, bytes) else frame
    if not isinstance(frame, np.ndarray):
        raise BadFrameError(
            f"a frame is an ndarray or bytes, not {type(frame).__name__}", reason="type"
        )
    if frame.ndim != 3 or frame.shape[2] != 3:
        raise BadFrameError(
            f"a frame is HxWx3, got shape {frame.shape}", reason="shape", shape=frame.shape
        )
    if frame.dtype != np.uint8:
        raise BadFrameError(
            f"a frame is uint8, got {frame.dtype}", reason="dtype", dtype=str(frame.dtype)
        )
    height, width = frame.shape[0], frame.shape[1]
    if height == 0 or width == 0:
        raise BadFrameError(f"frame has no pixels: {frame.shape}", reason="empty")
    if height * width > MAX_FRAME_PIXELS:
        raise BadFrameError(
            f"frame is {width}x{height}, over {MAX_FRAME_PIXELS} pixels",
            reason="too_large",
            pixels=height * width,
        )
    return frame


def decode_frame(
    data: FrameData, decoder: FrameDecoder | None, target: DecodeTarget | None = None
) -> npt.NDArray[np.uint8]:
    """The frame as an HxWx3 uint8 array: arrays pass through, bytes go to ``decoder``
    (which may decode at reduced size for ``target``, see :class:`DecodeTarget`)."""
    if isinstance(data, np.ndarray):
        return data
    if decoder is None:
        raise BadFrameError(
            "encoded frame but no image decoder is installed (install Pillow)",
            reason="unsupported_encoding",
        )
    try:
        image = decoder.decode(data, target)
    except BadFrameError:
        raise
    except Exception as exc:  # a decoder raises whatever its library raises on bad input
        raise BadFrameError(
            f"cannot decode frame: {type(exc).__name__}: {exc}", reason="corrupt"
        ) from exc
    checked = check_frame(image)
    assert isinstance(checked, np.ndarray)
    return checked
