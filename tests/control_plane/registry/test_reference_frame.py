"""The frame a self-test reference is made from: generated with structure, or the operator's."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from control_plane.errors import InvalidInputError
from control_plane.registry.reference_frame import GENERATED_SIZE, generated_frame, load_frame


def test_the_generated_frame_is_camera_sized_and_the_same_everywhere() -> None:
    frame = generated_frame()
    assert frame.shape == (*GENERATED_SIZE, 3) == (480, 640, 3)
    assert frame.dtype == np.uint8
    # The same bytes every time (its digest is signed with the version).
    again = generated_frame()
    assert hashlib.sha256(frame.tobytes()).digest() == hashlib.sha256(again.tobytes()).digest()


def test_the_generated_frame_has_structure_a_wrong_preprocessing_would_change() -> None:
    frame = generated_frame().astype(np.int64)
    # The channels differ (an RGB/BGR swap changes the tensor) ...
    assert np.abs(frame[..., 0] - frame[..., 2]).mean() > 20
    # ... it is neither flat nor noise: neighbours mostly agree, and there are edges.
    steps = np.abs(np.diff(frame, axis=1))
    assert np.median(steps) <= 2
    assert (steps > 100).sum() > 100
    # A few hundred distinct colours at least (gradients), not a handful.
    assert len(np.unique(frame.reshape(-1, 3), axis=0)) > 1000


def test_other_sizes_and_their_limits() -> None:
    assert generated_frame(96, 128).shape == (96, 128, 3)
    with pytest.raises(ValueError):
        generated_frame(8, 8)


def test_a_npy_frame_is_taken_as_it_is(tmp_path: Path) -> None:
    frame = generated_frame(120, 160)
    np.save(tmp_path / "f.npy", frame)
    np.testing.assert_array_equal(load_frame(tmp_path / "f.npy"), frame)


def test_png_and_jpeg_frames_become_rgb(tmp_path: Path) -> None:
    frame = generated_frame(120, 160)
    Image.fromarray(frame).save(tmp_path / "f.png")
    np.testing.assert_array_equal(load_frame(tmp_path / "f.png"), frame)
    Image.fromarray(frame).convert("L").save(tmp_path / "grey.jpg", quality=95)
    grey = load_frame(tmp_path / "grey.jpg")
    assert grey.shape == (120, 160, 3)
    assert grey.dtype == np.uint8
    np.testing.assert_array_equal(grey[..., 0], grey[..., 2])


@pytest.mark.parametrize(
    ("name", "content", "shown"),
    [
        ("f.txt", None, "must be one of"),
        ("f.png", b"not a png", "cannot read reference frame"),
        ("f.npy", np.zeros((4, 4), np.uint8), "HxWx3 uint8"),
        ("f.npy", np.zeros((4, 4, 3), np.float32), "HxWx3 uint8"),
        ("f.npy", np.zeros((0, 4, 3), np.uint8), "HxWx3 uint8"),
    ],
)
def test_bad_frames_are_refused(
    tmp_path: Path, name: str, content: bytes | np.ndarray | None, shown: str
) -> None:
    path = tmp_path / name
    if isinstance(content, np.ndarray):
        np.save(path, content)
    else:
        path.write_bytes(content or b"x")
    with pytest.raises(InvalidInputError) as refused:
        load_frame(path)
    assert shown in refused.value.message
    assert refused.value.fields["field"] == "reference_frame"


def test_a_missing_or_pickled_frame_is_refused(tmp_path: Path) -> None:
    with pytest.raises(InvalidInputError, match="cannot read reference frame"):
        load_frame(tmp_path / "absent.npy")
    np.save(tmp_path / "p.npy", np.array([object()], dtype=object), allow_pickle=True)
    with pytest.raises(InvalidInputError, match="cannot read reference frame"):
        load_frame(tmp_path / "p.npy")
