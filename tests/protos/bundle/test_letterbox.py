"""Letterbox preprocessing and the geometry that maps the model's boxes back to the frame."""

from __future__ import annotations

import tracemalloc
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

from protos.bundle.decoders import Geometry, build_decoder
from protos.bundle.preprocess import ImageError, Preprocessor
from protos.bundle.spec import OutputSpec, PreprocessConfig, RuntimeSpec

MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)


def letterbox(size: tuple[int, int], channels: int = 3, **params: Any) -> Preprocessor:
    return Preprocessor(PreprocessConfig(size=size, fit="letterbox", **params), channels)


def frame(h: int, w: int, value: int = 200) -> npt.NDArray[np.uint8]:
    return np.full((h, w, 3), value, dtype=np.uint8)


def test_a_wide_frame_is_centred_and_padded_above_and_below() -> None:
    pre = letterbox((8, 8), mean=MEAN, std=STD, pad_value=114)
    out = pre(frame(4, 8))[0]  # 4x8 -> scale 1, 2 rows of padding each side

    pad = (114 / 255 - np.array(MEAN)) / np.array(STD)
    inside = (200 / 255 - np.array(MEAN)) / np.array(STD)
    for channel in range(3):
        np.testing.assert_allclose(out[channel, :2], pad[channel], atol=1e-6)
        np.testing.assert_allclose(out[channel, 6:], pad[channel], atol=1e-6)
        np.testing.assert_allclose(out[channel, 2:6], inside[channel], atol=1e-6)


def test_a_tall_frame_is_padded_left_and_right_in_nhwc() -> None:
    pre = letterbox((6, 12), layout="NHWC", scale=1, pad_value=7)
    out = pre(frame(12, 8))[0]  # scale 0.5 -> 6x4 inside a 6x12 input, 4 columns each side

    assert out.shape == (6, 12, 3)
    assert np.all(out[:, :4] == 7) and np.all(out[:, 8:] == 7)
    np.testing.assert_allclose(out[:, 4:8], 200)


@pytest.mark.parametrize("dtype", ["uint8", "float16"])
def test_the_pad_value_in_every_dtype(dtype: str) -> None:
    params: dict[str, Any] = {"dtype": dtype, "pad_value": 0}
    if dtype == "uint8":
        params.update(scale=1, mean=(0,), std=(1,))
    pre = letterbox((10, 10), **params)
    out = pre(frame(5, 10, 255))[0]
    assert out.dtype == np.dtype(dtype)
    # 5 of 10 rows are the image: rows 2-6, the pad above (2 rows) and below (3 rows).
    expected = 255 if dtype == "uint8" else 1.0
    assert np.all(out[:, :2] == 0) and np.all(out[:, 7:] == 0)
    assert np.all(out[:, 2:7] == expected)


def test_one_channel_pad_is_normalised_like_luma() -> None:
    pre = letterbox((4, 4), mean=(0.5,), std=(0.25,), pad_value=51, channels=1)
    out = pre(frame(2, 4))[0]
    assert out.shape == (1, 4, 4)
    np.testing.assert_allclose(out[0, 0], (51 / 255 - 0.5) / 0.25, atol=1e-6)


def _window(tensor: npt.NDArray[Any], pad: float) -> tuple[int, int, int, int]:
    """(left, top, right, bottom) in input pixels of what is not padding (NCHW)."""
    rows, cols = np.nonzero(np.any(tensor[0] != pad, axis=0))
    return int(cols.min()), int(rows.min()), int(cols.max()) + 1, int(rows.max()) + 1


@pytest.mark.parametrize(("frame_h", "frame_w"), [(480, 640), (640, 480), (333, 1000), (416, 416)])
def test_the_geometry_maps_the_padded_images_corners_to_the_frames(
    frame_h: int, frame_w: int
) -> None:
    pre = letterbox((416, 416), scale=1, pad_value=0)
    tensor = pre(frame(frame_h, frame_w, 255))
    left, top, right, bottom = _window(tensor, 0.0)
    geometry = pre.geometry(frame_h, frame_w)

    xs, ys = geometry.to_frame(np.array([left, right]), np.array([top, bottom]))
    np.testing.assert_allclose(xs, [0, 1], atol=1e-9)
    np.testing.assert_allclose(ys, [0, 1], atol=1e-9)
    assert (geometry.input_h, geometry.input_w) == (416, 416)
    assert min(left, top) == 0  # the image touches two opposite edges


def test_stretch_geometry_is_the_plain_one() -> None:
    pre = Preprocessor(PreprocessConfig(size=(416, 320)), channels=3)
    assert pre.geometry(480, 640) == Geometry.stretch(480, 640, 416, 320)
    with pytest.raises(ImageError):
        pre.geometry(0, 640)


def test_a_drawn_box_comes_back_where_it_was_drawn() -> None:
    """Frame -> letterbox -> a box found in the input -> the geometry -> the frame."""
    image = np.zeros((480, 640, 3), dtype=np.uint8)
    image[120:360, 160:480] = 255  # the box: x 0.25-0.75, y 0.25-0.75 of the frame
    pre = letterbox((320, 320), scale=1, pad_value=0, resize="nearest")
    tensor = pre(image)
    rows, cols = np.nonzero(tensor[0, 0] == 255)
    x1, y1 = cols.min(), rows.min()
    x2, y2 = cols.max() + 1, rows.max() + 1

    # The same box as a yolo output (cx, cy, w, h in input pixels) through the decoder.
    out = np.zeros((1, 20, 6), dtype=np.float32)
    out[0, 0] = [(x1 + x2) / 2, (y1 + y2) / 2, x2 - x1, y2 - y1, 0.9, 0.0]
    runtime = RuntimeSpec(output=OutputSpec(decoder="yolo"))
    decoded = build_decoder(runtime).decode({"o": out}, pre.geometry(480, 640))
    box = decoded.detections[0].box
    assert box is not None
    assert (box.x1, box.y1, box.x2, box.y2) == pytest.approx((0.25, 0.25, 0.75, 0.75), abs=1 / 320)


def test_a_reused_buffer_gets_the_border_of_each_frame() -> None:
    pre = letterbox((8, 8), scale=1, pad_value=9)
    pre(frame(4, 8, 100), reuse=True)  # pads rows
    out = pre(frame(8, 4, 100), reuse=True)[0]  # pads columns now; the old rows are image
    assert np.all(out[:, :, :2] == 9) and np.all(out[:, :, 6:] == 9)
    assert np.all(out[:, :, 2:6] == 100)


@pytest.mark.parametrize("fit", ["stretch", "letterbox"])
def test_the_steady_state_allocates_no_frame_sized_array(fit: Any) -> None:
    pre = Preprocessor(
        PreprocessConfig(size=(320, 320), fit=fit, mean=MEAN, std=STD, dtype="float16"),
        channels=3,
    )
    image = np.random.default_rng(3).integers(0, 256, (480, 640, 3), dtype=np.uint8)
    pre(image, reuse=True)  # the first call makes the plan and the workspaces
    tracemalloc.start()
    try:
        pre(image, reuse=True)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    # numpy's casting buffers (8192 values) remain; one 320x320x3 float32 image is 1.2 MB.
    assert peak < 128 * 1024
