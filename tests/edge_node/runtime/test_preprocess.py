"""Preprocessing numerics: scale/mean/std, channel order, layout, dtype, resize, bad frames."""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

from edge_node.runtime.config import PreprocessConfig
from edge_node.runtime.errors import BadFrameError
from edge_node.runtime.preprocess import (
    MAX_FRAME_PIXELS,
    Preprocessor,
    check_frame,
    decode_frame,
    resize_image,
)
from protos.bundle.preprocess import ImageError


def frame(h: int = 2, w: int = 3) -> npt.NDArray[np.uint8]:
    rng = np.random.default_rng(7)
    return rng.integers(0, 256, size=(h, w, 3), dtype=np.uint8)


def test_scale_mean_std_per_channel_in_nchw() -> None:
    config = PreprocessConfig(
        size=(2, 3), mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225), scale=1 / 255
    )
    image = frame()
    out = Preprocessor(config, channels=3)(image)

    assert out.shape == (1, 3, 2, 3)
    assert out.dtype == np.float32
    assert out.flags.c_contiguous
    mean = np.array(config.mean).reshape(3, 1, 1)
    std = np.array(config.std).reshape(3, 1, 1)
    expected = (image.transpose(2, 0, 1) / 255.0 - mean) / std
    np.testing.assert_allclose(out[0], expected, rtol=1e-5, atol=1e-5)


def test_bgr_reverses_channels_and_nhwc_keeps_them_last() -> None:
    config = PreprocessConfig(
        size=(2, 3), layout="NHWC", channel_order="BGR", scale=1, mean=(10, 20, 30), std=(1, 2, 4)
    )
    image = frame()
    out = Preprocessor(config, channels=3)(image)

    assert out.shape == (1, 2, 3, 3)
    bgr = image[..., ::-1].astype(np.float64)
    expected = (bgr - np.array([10, 20, 30])) / np.array([1, 2, 4])
    np.testing.assert_allclose(out[0], expected, rtol=1e-6)


def test_one_channel_model_gets_luma() -> None:
    config = PreprocessConfig(size=(2, 3), mean=(0.0,), std=(1.0,), scale=1)
    image = frame()
    out = Preprocessor(config, channels=1)(image)

    assert out.shape == (1, 1, 2, 3)
    luma = image.astype(np.float64) @ np.array([0.299, 0.587, 0.114])
    np.testing.assert_allclose(out[0, 0], luma, rtol=1e-5)


@pytest.mark.parametrize("dtype", ["float16", "uint8"])
def test_output_dtype(dtype: Any) -> None:
    normalise = dtype != "uint8"
    config = PreprocessConfig(
        size=(4, 4),
        dtype=dtype,
        scale=1 / 255 if normalise else 1,
        mean=(0.5,) if normalise else (0.0,),
        std=(0.5,) if normalise else (1.0,),
    )
    image = frame(4, 4)
    out = Preprocessor(config, channels=3)(image)
    assert out.dtype == np.dtype(dtype)
    if dtype == "uint8":
        np.testing.assert_array_equal(out[0], image.transpose(2, 0, 1))
    else:
        expected = (image.transpose(2, 0, 1) / 255.0 - 0.5) / 0.5
        np.testing.assert_allclose(out[0].astype(np.float64), expected, atol=2e-3)


def _reference_bilinear(image: npt.NDArray[Any], out_h: int, out_w: int) -> npt.NDArray[Any]:
    """A slow, obvious half-pixel bilinear resize to check the vectorised one against."""
    in_h, in_w = image.shape[:2]
    result = np.zeros((out_h, out_w, image.shape[2]))
    for y in range(out_h):
        sy = min(max((y + 0.5) * in_h / out_h - 0.5, 0), in_h - 1)
        y0 = int(np.floor(sy))
        y1, wy = min(y0 + 1, in_h - 1), sy - int(np.floor(sy))
        for x in range(out_w):
            sx = min(max((x + 0.5) * in_w / out_w - 0.5, 0), in_w - 1)
            x0 = int(np.floor(sx))
            x1, wx = min(x0 + 1, in_w - 1), sx - x0
            top = image[y0, x0] * (1 - wx) + image[y0, x1] * wx
            bottom = image[y1, x0] * (1 - wx) + image[y1, x1] * wx
            result[y, x] = top * (1 - wy) + bottom * wy
    return result


@pytest.mark.parametrize(("out_h", "out_w"), [(5, 7), (16, 9), (3, 3), (1, 1), (12, 12)])
def test_bilinear_matches_the_reference(out_h: int, out_w: int) -> None:
    image = frame(6, 6)
    out = resize_image(image, (out_h, out_w), "bilinear")
    assert out.shape == (out_h, out_w, 3)
    np.testing.assert_allclose(out, _reference_bilinear(image, out_h, out_w), atol=1e-3)


def test_bilinear_upsampling_by_two_has_half_pixel_weights() -> None:
    image = np.array([[0, 100]], dtype=np.uint8)[..., None].repeat(3, axis=2)  # 1x2
    out = resize_image(image, (1, 4), "bilinear")
    np.testing.assert_allclose(out[0, :, 0], [0, 25, 75, 100])


def test_nearest_picks_centres_and_keeps_dtype() -> None:
    image = np.arange(16, dtype=np.uint8).reshape(4, 4, 1).repeat(3, axis=2)
    out = resize_image(image, (2, 2), "nearest")
    assert out.dtype == np.uint8
    np.testing.assert_array_equal(out[..., 0], [[5, 7], [13, 15]])


def test_resize_inside_the_preprocessor_and_constant_stays_constant() -> None:
    image = np.full((37, 53, 3), 200, dtype=np.uint8)
    for mode in ("bilinear", "nearest"):
        config = PreprocessConfig(size=(16, 24), resize=mode, scale=1)
        out = Preprocessor(config, channels=3)(image)
        assert out.shape == (1, 3, 16, 24)
        np.testing.assert_allclose(out, 200.0)


def test_uint8_model_after_bilinear_resize_rounds() -> None:
    config = PreprocessConfig(size=(1, 4), dtype="uint8", scale=1, mean=(0.0,), std=(1.0,))
    image = np.array([[0, 101]], dtype=np.uint8)[..., None].repeat(3, axis=2)
    out = Preprocessor(config, channels=3)(image)
    np.testing.assert_array_equal(out[0, 0, 0], [0, 25, 76, 101])


@pytest.mark.parametrize(
    ("bad", "reason"),
    [
        (np.zeros((4, 4), dtype=np.uint8), "shape"),
        (np.zeros((4, 4, 4), dtype=np.uint8), "shape"),
        (np.zeros((1, 4, 4, 3), dtype=np.uint8), "shape"),
        (np.zeros((4, 4, 3), dtype=np.float32), "dtype"),
        (np.zeros((0, 4, 3), dtype=np.uint8), "empty"),
        (b"", "empty"),
        ("a string", "type"),
        (None, "type"),
        ([[1, 2, 3]], "type"),
    ],
)
def test_bad_frames_raise_with_a_reason(bad: object, reason: str) -> None:
    with pytest.raises(BadFrameError) as caught:
        check_frame(bad)
    assert caught.value.reason == reason
    assert caught.value.fields["reason"] == reason


def test_oversized_frames_are_refused_before_any_work() -> None:
    huge = np.lib.stride_tricks.as_strided(
        np.zeros(1, dtype=np.uint8), shape=(MAX_FRAME_PIXELS + 1, 1, 3), strides=(0, 0, 0)
    )
    with pytest.raises(BadFrameError) as caught:
        check_frame(huge)
    assert caught.value.reason == "too_large"


def test_preprocessor_rejects_bad_frames_too() -> None:
    pre = Preprocessor(PreprocessConfig(size=(4, 4)), channels=3)
    with pytest.raises(ImageError):
        pre(np.zeros((4, 4, 3), dtype=np.int16))


class _FakeDecoder:
    def decode(self, data: bytes, target: object = None) -> npt.NDArray[np.uint8]:
        if not data.startswith(b"\xff\xd8"):
            raise OSError("cannot identify image file")
        return np.zeros((2, 2, 3), dtype=np.uint8)


def test_encoded_frames_without_a_decoder_are_unsupported() -> None:
    with pytest.raises(BadFrameError) as caught:
        decode_frame(b"\xff\xd8\xff\xe0", None)
    assert caught.value.reason == "unsupported_encoding"


def test_corrupt_bytes_are_a_bad_frame_not_a_crash() -> None:
    with pytest.raises(BadFrameError) as caught:
        decode_frame(b"garbage", _FakeDecoder())
    assert caught.value.reason == "corrupt"
    assert isinstance(caught.value.__cause__, OSError)
    assert decode_frame(b"\xff\xd8ok", _FakeDecoder()).shape == (2, 2, 3)


def test_reuse_hands_back_the_same_buffer_fresh_calls_do_not() -> None:
    pre = Preprocessor(PreprocessConfig(size=(4, 4), scale=1), channels=3)
    first = pre(frame(9, 7), reuse=True)
    first_values = first.copy()
    second = pre(np.zeros((9, 7, 3), dtype=np.uint8), reuse=True)
    assert np.shares_memory(first, second)
    np.testing.assert_array_equal(second, 0)
    owned = [pre(frame(9, 7)), pre(frame(9, 7))]
    assert not np.shares_memory(owned[0], owned[1])
    np.testing.assert_array_equal(owned[0], first_values)


def test_each_thread_gets_its_own_buffers() -> None:
    pre = Preprocessor(PreprocessConfig(size=(16, 16), scale=1), channels=3)
    errors: list[str] = []

    def work(value: int) -> None:
        image = np.full((31, 17, 3), value, dtype=np.uint8)
        for _ in range(300):
            out = pre(image, reuse=True)
            if not np.all(out == value):
                errors.append(f"thread {value} saw another thread's pixels")
                return

    threads = [threading.Thread(target=work, args=(v,)) for v in (10, 200)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []


def test_wide_and_tall_frames_take_both_blend_orders() -> None:
    wide, tall = frame(6, 20), frame(20, 6)
    for image, size in ((wide, (5, 7)), (tall, (7, 5)), (wide, (12, 40)), (tall, (40, 12))):
        out = resize_image(image, size, "bilinear")
        np.testing.assert_allclose(out, _reference_bilinear(image, *size), atol=1e-3)


def test_a_cropped_view_is_resized_correctly() -> None:
    big = frame(20, 20)
    crop = big[3:13, 5:17]  # not contiguous
    pre = Preprocessor(PreprocessConfig(size=(5, 6), scale=1), channels=3)
    expected = _reference_bilinear(np.ascontiguousarray(crop), 5, 6).transpose(2, 0, 1)
    np.testing.assert_allclose(pre(crop)[0], expected, atol=1e-3)
