"""A frame to the model's input: resize, normalise, lay out, cast — numpy only.

What it is for: turning a decoded HxWx3 uint8 RGB frame into the batch-of-one tensor a
model was validated to take (:class:`~protos.bundle.spec.PreprocessConfig`). The node runs
it on every frame and the operator's CLI on the reference frame it signs: one
implementation, so the self-test exercises what the frames get.

What it is not for: knowing the model, or decoding JPEG. The config is resolved against the
model's input signature first (:func:`~protos.bundle.spec.resolve_input`); here it is taken
as valid. An image that is not HxWx3 uint8 raises :class:`ImageError` (the node checks
frames before they get here).

``fit: letterbox`` resizes by one scale for both axes (``min(H/h, W/w)``), centres the image
and fills the rest with ``pad_value`` normalised like a pixel; :meth:`Preprocessor.geometry`
says where the frame went, for the decoders to map boxes back.

Resizing follows the half-pixel convention (OpenCV ``INTER_LINEAR``, ONNX ``Resize`` with
``half_pixel``); it does not antialias when shrinking, as OpenCV does not. Index tables are
cached per input size: a camera sends one size, so each frame only gathers and blends.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any, Final

import numpy as np
import numpy.typing as npt

from protos.bundle.geometry import Geometry
from protos.bundle.spec import PreprocessConfig

__all__ = ["ImageError", "Preprocessor", "check_image", "resize_image"]

_LUMA: Final = np.array([0.299, 0.587, 0.114], dtype=np.float32)  # ITU-R BT.601, RGB order
_PLAN_CACHE_SIZE: Final = 16


class ImageError(ValueError):
    """The image is not an HxWx3 uint8 array with pixels."""


def check_image(image: object) -> npt.NDArray[np.uint8]:
    if (
        not isinstance(image, np.ndarray)
        or image.ndim != 3
        or image.shape[2] != 3
        or image.dtype != np.uint8
        or image.shape[0] == 0
        or image.shape[1] == 0
    ):
        shown = getattr(image, "shape", type(image).__name__)
        raise ImageError(f"an image is HxWx3 uint8 with pixels, got {shown}")
    return image


# ----------------------------------------------------------------------------- resize


@dataclass(frozen=True, slots=True)
class _Plan:
    """Where every output pixel comes from, for one input size, output size and mode.

    Columns are gathered on the image viewed as ``(H, W*C)`` rows with flat indices
    ``x*C + c`` (one ``np.take`` instead of a slow fancy index over pixels), and the
    bilinear blend is separable: rows then columns, or columns then rows, whichever
    touches fewer values (shrinking the width first is cheaper for a wide camera frame).
    """

    mode: str
    rows0: npt.NDArray[np.intp]
    rows1: npt.NDArray[np.intp]
    row_weight: npt.NDArray[np.float32]  # (out_h, 1): broadcast over the flat row
    flat0: npt.NDArray[np.intp]  # (out_w * C,)
    flat1: npt.NDArray[np.intp]
    col_weight: npt.NDArray[np.float32]  # (out_w * C,)
    rows_first: bool
    out_shape: tuple[int, int, int]


def _axis_bilinear(
    size_in: int, size_out: int
) -> tuple[npt.NDArray[np.intp], npt.NDArray[np.intp], npt.NDArray[np.float32]]:
    source = (np.arange(size_out, dtype=np.float64) + 0.5) * (size_in / size_out) - 0.5
    source = np.clip(source, 0.0, size_in - 1)
    low = np.floor(source).astype(np.intp)
    high = np.minimum(low + 1, size_in - 1)
    return low, high, (source - low).astype(np.float32)


def _axis_nearest(size_in: int, size_out: int) -> npt.NDArray[np.intp]:
    source = np.floor((np.arange(size_out, dtype=np.float64) + 0.5) * (size_in / size_out))
    return np.minimum(source.astype(np.intp), size_in - 1)


def _flat(cols: npt.NDArray[np.intp], channels: int) -> npt.NDArray[np.intp]:
    return (cols[:, None] * channels + np.arange(channels, dtype=np.intp)).ravel()


def _plan(shape_in: tuple[int, int, int], shape_out: tuple[int, int], mode: str) -> _Plan:
    (h_in, w_in, channels), (h_out, w_out) = shape_in, shape_out
    out_shape = (h_out, w_out, channels)
    if mode == "nearest":
        rows, cols = _axis_nearest(h_in, h_out), _axis_nearest(w_in, w_out)
        flat = _flat(cols, channels)
        none = np.zeros(0, dtype=np.float32)
        return _Plan(mode, rows, rows, none, flat, flat, none, True, out_shape)
    rows0, rows1, row_w = _axis_bilinear(h_in, h_out)
    cols0, cols1, col_w = _axis_bilinear(w_in, w_out)
    return _Plan(
        mode,
        rows0,
        rows1,
        row_w[:, None],
        _flat(cols0, channels),
        _flat(cols1, channels),
        np.repeat(col_w, channels),
        rows_first=h_out * w_in <= h_in * w_out,
        out_shape=out_shape,
    )


class _Workspace:
    """Scratch arrays reused from frame to frame, one set per thread.

    Fresh multi-megabyte arrays per frame are not free: glibc hands big blocks back to the
    kernel on free, and every new one costs a page fault per 4 KiB (about 3 ms for one
    720p frame on the reference VM, more than the arithmetic). Reusing them avoids that.
    """

    def __init__(self) -> None:
        self._arrays: dict[str, npt.NDArray[Any]] = {}

    def get(self, key: str, shape: tuple[int, ...], dtype: type[Any]) -> npt.NDArray[Any]:
        array = self._arrays.get(key)
        if array is None or array.shape != shape or array.dtype != dtype:
            array = np.empty(shape, dtype=dtype)
            self._arrays[key] = array
        return array


class _ThreadWorkspaces(threading.local):
    def __init__(self) -> None:
        self.scratch = _Workspace()  # intermediates: never leave the preprocessor
        self.output = _Workspace()  # results handed out with reuse=True


def _blend_rows(
    flat: npt.NDArray[Any], plan: _Plan, ws: _Workspace, key: str
) -> npt.NDArray[np.float32]:
    shape = (len(plan.rows0), flat.shape[1])
    # mode="clip" (the indices are in range anyway): with the default "raise" np.take
    # gathers into a fresh buffer first and copies it into out.
    top = np.take(
        flat, plan.rows0, axis=0, mode="clip", out=ws.get(f"{key}.top", shape, flat.dtype.type)
    )
    bottom = np.take(
        flat, plan.rows1, axis=0, mode="clip", out=ws.get(f"{key}.bottom", shape, flat.dtype.type)
    )
    out: npt.NDArray[np.float32] = ws.get(f"{key}.rows", shape, np.float32)
    np.subtract(bottom, top, out=out, dtype=np.float32)
    out *= plan.row_weight
    out += top
    return out


def _blend_cols(
    flat: npt.NDArray[Any], plan: _Plan, ws: _Workspace, key: str
) -> npt.NDArray[np.float32]:
    shape = (flat.shape[0], len(plan.flat0))
    left = np.take(
        flat, plan.flat0, axis=1, mode="clip", out=ws.get(f"{key}.left", shape, flat.dtype.type)
    )
    right = np.take(
        flat, plan.flat1, axis=1, mode="clip", out=ws.get(f"{key}.right", shape, flat.dtype.type)
    )
    out: npt.NDArray[np.float32] = ws.get(f"{key}.cols", shape, np.float32)
    np.subtract(right, left, out=out, dtype=np.float32)
    out *= plan.col_weight
    out += left
    return out


def _apply(image: npt.NDArray[Any], plan: _Plan, ws: _Workspace) -> npt.NDArray[Any]:
    """The resized image; it may live in ``ws`` (valid until the next call with ``ws``)."""
    flat = image.reshape(image.shape[0], -1)  # (H, W*C), a view of a contiguous frame
    if plan.mode == "nearest":
        rows = np.take(
            flat,
            plan.rows0,
            axis=0,
            mode="clip",
            out=ws.get("nearest.rows", (len(plan.rows0), flat.shape[1]), flat.dtype.type),
        )
        out = ws.get("nearest.out", (len(plan.rows0), len(plan.flat0)), flat.dtype.type)
        return np.take(rows, plan.flat0, axis=1, mode="clip", out=out).reshape(plan.out_shape)
    if plan.rows_first:
        blended = _blend_cols(_blend_rows(flat, plan, ws, "first"), plan, ws, "second")
    else:
        blended = _blend_rows(_blend_cols(flat, plan, ws, "first"), plan, ws, "second")
    return blended.reshape(plan.out_shape)


def resize_image(
    image: npt.NDArray[Any], size: tuple[int, int], mode: str = "bilinear"
) -> npt.NDArray[Any]:
    """Resize HxWxC to ``size`` (height, width); bilinear returns float32, nearest keeps dtype."""
    image = np.ascontiguousarray(image)
    return _apply(image, _plan(image.shape, size, mode), _Workspace())


# ----------------------------------------------------------------------------- preprocessor


class Preprocessor:
    """Frame → model input for one resolved config. Thread-safe; reused for every frame.

    ``channels`` is the model's channel count: 3 (reordered to ``channel_order``) or 1 (BT.601
    luma of the RGB frame). Each calling thread keeps its own scratch arrays, so steady-state
    preprocessing allocates nothing but the output — and not even that with ``reuse=True``.
    A letterboxed output's border is written on every call (a reused buffer may have held a
    frame of another size).
    """

    def __init__(self, config: PreprocessConfig, channels: int) -> None:
        if config.size is None:
            raise ValueError("the preprocess config must be resolved (size known) first")
        if channels not in (1, 3):
            raise ValueError(f"channels must be 1 or 3, got {channels}")
        self.config = config
        self.channels = channels
        self.size: tuple[int, int] = config.size
        self.input_shape: tuple[int, ...] = (
            (1, channels, *config.size) if config.layout == "NCHW" else (1, *config.size, channels)
        )
        self._dtype: type[Any] = np.dtype(config.dtype).type
        mean = np.broadcast_to(np.asarray(config.mean, dtype=np.float64), (channels,))
        std = np.broadcast_to(np.asarray(config.std, dtype=np.float64), (channels,))
        # (x * scale - mean) / std  ==  x * gain + offset, one multiply-add per value.
        shape = (-1, 1, 1) if config.layout == "NCHW" else (1, 1, -1)
        self._gain = (config.scale / std).astype(np.float32).reshape(shape)
        self._offset = (-mean / std).astype(np.float32).reshape(shape)
        self._identity = bool(np.all(self._gain == 1) and np.all(self._offset == 0))
        self._letterbox = config.fit == "letterbox"
        # The border, per channel, as the model sees it (uint8 configs have gain 1, offset 0).
        self._pad = (config.pad_value * self._gain + self._offset).astype(self._dtype)
        self._plans: dict[tuple[int, int, int], _Plan] = {}
        self._plans_lock = threading.Lock()
        self._workspaces = _ThreadWorkspaces()

    def __call__(self, frame: npt.NDArray[np.uint8], *, reuse: bool = False) -> npt.NDArray[Any]:
        """The model input for ``frame``, shaped :attr:`input_shape`.

        With ``reuse=True`` the result is a buffer this thread gets again on its next call
        (the pipeline's workers pass it straight to ``InferenceSession.run``, which does not
        keep it); otherwise it is a new array the caller owns.
        """
        image = check_image(frame)
        workspaces = self._workspaces
        pixels = self._resize(image, workspaces.scratch)
        if self.channels == 3:
            if self.config.channel_order == "BGR":
                pixels = pixels[..., ::-1]
        else:
            pixels = (pixels @ _LUMA)[..., None]
        view = pixels.transpose(2, 0, 1) if self.config.layout == "NCHW" else pixels
        shape = self.input_shape[1:]
        out = (
            workspaces.output.get("out", shape, self._dtype)
            if reuse
            else np.empty(shape, dtype=self._dtype)
        )
        window = self._border(out, pixels.shape[0], pixels.shape[1]) if self._letterbox else out
        self._normalise(view, window, workspaces.scratch)
        return out[None]

    def geometry(self, frame_h: int, frame_w: int) -> Geometry:
        """Where a ``frame_h`` x ``frame_w`` frame lands in the model's input (what the
        decoders need to map boxes back to the frame)."""
        if frame_h < 1 or frame_w < 1:
            raise ImageError(f"a frame has pixels, got {frame_h}x{frame_w}")
        height, width = self.size
        if not self._letterbox:
            return Geometry.stretch(frame_h, frame_w, height, width)
        fitted_h, fitted_w = self._fitted(frame_h, frame_w)
        return Geometry(
            frame_h,
            frame_w,
            height,
            width,
            scale_x=fitted_w / frame_w,
            scale_y=fitted_h / frame_h,
            pad_x=float((width - fitted_w) // 2),
            pad_y=float((height - fitted_h) // 2),
        )

    def _fitted(self, frame_h: int, frame_w: int) -> tuple[int, int]:
        """The letterboxed image's size inside the input: one scale for both axes."""
        height, width = self.size
        scale = min(height / frame_h, width / frame_w)
        return (
            min(height, max(1, round(frame_h * scale))),
            min(width, max(1, round(frame_w * scale))),
        )

    def _border(self, out: npt.NDArray[Any], fitted_h: int, fitted_w: int) -> npt.NDArray[Any]:
        """Fill the letterbox border of ``out`` (C,H,W or H,W,C) with the pad value; return
        the centred window the image goes into."""
        height, width = self.size
        top, left = (height - fitted_h) // 2, (width - fitted_w) // 2
        bottom, right = top + fitted_h, left + fitted_w
        planes = out if self.config.layout == "NHWC" else out.transpose(1, 2, 0)  # H, W, C view
        pad = self._pad.reshape(-1)
        planes[:top] = pad
        planes[bottom:] = pad
        planes[top:bottom, :left] = pad
        planes[top:bottom, right:] = pad
        window = planes[top:bottom, left:right]
        return window if self.config.layout == "NHWC" else window.transpose(2, 0, 1)

    def _resize(self, image: npt.NDArray[np.uint8], ws: _Workspace) -> npt.NDArray[Any]:
        shape_in: tuple[int, int, int] = image.shape  # HxWx3, checked
        size = self._fitted(shape_in[0], shape_in[1]) if self._letterbox else self.size
        if shape_in[:2] == size:
            return image
        image = np.ascontiguousarray(image)  # a cropped view must not change the flat indexing
        plan = self._plans.get(shape_in)
        if plan is None:
            plan = _plan(shape_in, size, self.config.resize)
            with self._plans_lock:
                if len(self._plans) >= _PLAN_CACHE_SIZE:
                    self._plans.clear()  # a camera that keeps changing size: rebuild, stay bounded
                self._plans[shape_in] = plan
        return _apply(image, plan, ws)

    def _normalise(self, view: npt.NDArray[Any], out: npt.NDArray[Any], ws: _Workspace) -> None:
        """``view`` (laid out, uint8 or float32) into ``out`` of the model's dtype."""
        if self._dtype is np.uint8:
            if view.dtype != np.uint8:
                rounded = ws.get("rounded", view.shape, np.float32)
                np.rint(view, out=rounded)
                view = np.clip(rounded, 0, 255, out=rounded)
            np.copyto(out, view, casting="unsafe")
            return
        target = out if self._dtype is np.float32 else ws.get("normalised", out.shape, np.float32)
        if self._identity:
            np.copyto(target, view, casting="unsafe")
        else:
            np.multiply(view, self._gain, out=target)
            target += self._offset
        if target is not out:
            np.copyto(out, target, casting="same_kind")
