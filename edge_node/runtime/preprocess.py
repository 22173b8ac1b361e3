"""Frames as the runtime gets them: checked, and decoded from JPEG/PNG bytes.

What it is for: a camera frame is a decoded HxWx3 uint8 RGB array, or encoded bytes that a
decoder (Pillow) turns into one. A frame that cannot be used raises
:class:`~edge_node.runtime.errors.BadFrameError` with a ``reason`` the pipeline counts.
Turning the image into the model's input is the model bundle's job
(:mod:`protos.bundle.preprocess`, one implementation shared with the operator's CLI); it
is re-exported here for the runtime.
"""

from __future__ import annotations

import importlib
import io
from typing import Any, Final, Protocol

import numpy as np
import numpy.typing as npt

from edge_node.runtime.errors import BadFrameError
from protos.bundle.preprocess import Preprocessor, resize_image

__all__ = [
    "MAX_ENCODED_BYTES",
    "MAX_FRAME_PIXELS",
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


class FrameDecoder(Protocol):
    def decode(self, data: bytes) -> npt.NDArray[np.uint8]:
        """Encoded bytes to an HxWx3 uint8 RGB array; any exception means corrupt."""
        ...


class PillowDecoder:
    """Decodes JPEG/PNG with Pillow (a dependency since camera sources; still imported lazily)."""

    def __init__(self) -> None:
        self._image: Any = importlib.import_module("PIL.Image")

    def decode(self, data: bytes) -> npt.NDArray[np.uint8]:
        with self._image.open(io.BytesIO(data)) as image:
            width, height = image.size  # read from the header, before any pixel is decoded
            if width * height > MAX_FRAME_PIXELS:
                raise BadFrameError(
                    f"encoded frame is {width}x{height}, over {MAX_FRAME_PIXELS} pixels",
                    reason="too_large",
                    pixels=width * height,
                )
            return np.asarray(image.convert("RGB"), dtype=np.uint8)


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


def decode_frame(data: FrameData, decoder: FrameDecoder | None) -> npt.NDArray[np.uint8]:
    """The frame as an HxWx3 uint8 array: arrays pass through, bytes go to ``decoder``."""
    if isinstance(data, np.ndarray):
        return data
    if decoder is None:
        raise BadFrameError(
            "encoded frame but no image decoder is installed (install Pillow)",
            reason="unsupported_encoding",
        )
    try:
        image = decoder.decode(data)
    except BadFrameError:
        raise
    except Exception as exc:  # a decoder raises whatever its library raises on bad input
        raise BadFrameError(
            f"cannot decode frame: {type(exc).__name__}: {exc}", reason="corrupt"
        ) from exc
    checked = check_frame(image)
    assert isinstance(checked, np.ndarray)
    return checked
