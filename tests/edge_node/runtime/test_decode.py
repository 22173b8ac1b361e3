"""Decoding camera frames at reduced size (JPEG DCT scaling) when the model's input is smaller."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pytest
from PIL import Image, ImageDraw

from edge_node.clock import ManualClock
from edge_node.runtime.config import PreprocessConfig, SessionConfig, StreamConfig
from edge_node.runtime.pipeline import FrameResult, InferencePipeline
from edge_node.runtime.preprocess import (
    DecodeTarget,
    PillowDecoder,
    Preprocessor,
    decode_frame,
)
from edge_node.runtime.session import ModelSession
from tests.edge_node.runtime._models import echo_model


def scene(width: int, height: int) -> npt.NDArray[np.uint8]:
    """A camera-like picture: smooth gradients, soft texture and a few solid shapes."""
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    texture = 128 + 90 * np.sin(x / 37.0) * np.cos(y / 23.0)
    pixels = np.stack([x * 255 / width, y * 255 / height, texture], axis=-1).astype(np.uint8)
    image = Image.fromarray(pixels)
    draw = ImageDraw.Draw(image)
    for i in range(6):
        left, top = width * (0.05 + 0.14 * i), height * (0.1 + 0.06 * i)
        draw.rectangle(
            [left, top, left + width * 0.1, top + height * 0.3], fill=(255 - 40 * i, 40 * i, 90)
        )
    return np.asarray(image)


def encode(pixels: npt.NDArray[np.uint8], fmt: str = "JPEG") -> bytes:
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, fmt, **({"quality": 90} if fmt == "JPEG" else {}))
    return out.getvalue()


VGA = encode(scene(640, 480))


@pytest.mark.parametrize(
    ("size", "decoded"),
    [
        ((48, 192), (240, 320)),  # PP-OCR's classifier: 1/2 (1/4 would be 160 < 192 wide)
        ((120, 160), (120, 160)),  # exactly 1/4
        ((121, 160), (240, 320)),  # one row more than 1/4 gives: 1/2
        ((60, 80), (60, 80)),  # 1/8, the most a JPEG allows
        ((30, 40), (60, 80)),
        ((300, 300), (480, 640)),  # 1/2 would be 240 rows < 300: full size
        ((480, 640), (480, 640)),
        ((960, 1280), (480, 640)),  # a bigger model input: never an upscale here
    ],
)
def test_a_jpeg_is_decoded_at_the_largest_reduction_that_still_covers_the_model_input(
    size: tuple[int, int], decoded: tuple[int, int]
) -> None:
    image = PillowDecoder().decode(VGA, DecodeTarget(size))
    assert image.shape == (*decoded, 3) and image.dtype == np.uint8
    assert image.shape[0] >= min(size[0], 480) and image.shape[1] >= min(size[1], 640)


def test_without_a_target_or_with_reduction_off_the_frame_is_decoded_in_full() -> None:
    target = DecodeTarget((48, 192))
    assert PillowDecoder().decode(VGA).shape == (480, 640, 3)
    assert PillowDecoder(reduce=False).decode(VGA, target).shape == (480, 640, 3)
    assert decode_frame(VGA, PillowDecoder(), None).shape == (480, 640, 3)
    assert decode_frame(VGA, PillowDecoder(), target).shape == (240, 320, 3)


def test_letterbox_needs_only_the_fitted_size() -> None:
    hd = encode(scene(1280, 720))
    # letterboxed into 416x416 the frame becomes 416x234: 1/2 (640x360) still covers it
    assert DecodeTarget((416, 416), "letterbox").minimum(1280, 720) == (416, 234)
    assert PillowDecoder().decode(hd, DecodeTarget((416, 416), "letterbox")).shape == (360, 640, 3)
    # stretched, all 416 rows are needed: 720 / 2 = 360 < 416, so full size
    assert PillowDecoder().decode(hd, DecodeTarget((416, 416), "stretch")).shape == (720, 1280, 3)


def test_minimum_is_never_more_than_the_frame() -> None:
    assert DecodeTarget((640, 640)).minimum(320, 240) == (320, 240)
    assert DecodeTarget((640, 640), "letterbox").minimum(320, 240) == (320, 240)
    assert DecodeTarget((48, 192)).minimum(640, 480) == (192, 48)


def test_formats_without_dct_scaling_and_grey_jpegs() -> None:
    png = encode(scene(640, 480), "PNG")
    assert PillowDecoder().decode(png, DecodeTarget((48, 192))).shape == (480, 640, 3)
    grey = io.BytesIO()
    Image.fromarray(scene(640, 480)[..., 0]).save(grey, "JPEG")
    image = PillowDecoder().decode(grey.getvalue(), DecodeTarget((48, 192)))
    assert image.shape == (240, 320, 3)
    np.testing.assert_array_equal(image[..., 0], image[..., 2])  # grey, as RGB


@pytest.mark.parametrize("size", [(48, 192), (120, 160), (240, 320)])
def test_the_model_input_stays_close_to_a_full_decode_and_resize(size: tuple[int, int]) -> None:
    """The reduced decode averages each 2x2 (4x4, ...) block where the full path samples the
    full frame bilinearly: the tensors differ by little, mostly at sharp edges."""
    pre = Preprocessor(PreprocessConfig(size=size, scale=1.0), channels=3)  # grey levels
    full = pre(PillowDecoder().decode(VGA))
    reduced_image = PillowDecoder().decode(VGA, DecodeTarget(size))
    assert reduced_image.shape[:2] != (480, 640)  # it was reduced
    difference = np.abs(pre(reduced_image) - full)
    assert float(difference.mean()) < 1.5
    assert float(np.percentile(difference, 99)) < 16
    assert full.shape == pre(reduced_image).shape


class ShapeRecordingDecoder(PillowDecoder):
    def __init__(self) -> None:
        super().__init__()
        self.shapes: list[tuple[int, ...]] = []

    def decode(self, data: bytes, target: DecodeTarget | None = None) -> npt.NDArray[np.uint8]:
        image = super().decode(data, target)
        self.shapes.append(image.shape)
        return image


@pytest.mark.parametrize("threads", [0, 1])
def test_the_pipeline_decodes_for_the_serving_model_input(tmp_path: Path, threads: int) -> None:
    session = ModelSession.load(
        echo_model(tmp_path / "m.onnx", (1, 3, 8, 8)), SessionConfig(), PreprocessConfig()
    )
    decoder = ShapeRecordingDecoder()
    results: list[FrameResult] = []
    with InferencePipeline(
        session,
        [StreamConfig("cam", queue_size=4)],
        ManualClock(),
        results.append,
        decoder=decoder,
        preprocess_threads=threads,
    ) as pipeline:
        pipeline.submit("cam", encode(scene(64, 64)))
        pipeline.submit("cam", encode(scene(100, 60)))
        report = pipeline.stop(timeout_s=10)
    assert report.drained and len(results) == 2
    assert decoder.shapes == [(8, 8, 3), (15, 25, 3)]  # 1/8 each: 60/8 and 100/8 rounded up
