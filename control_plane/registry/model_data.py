"""The data `model quantize` calibrates on and `model compare` compares on: a folder of samples.

What it is for: reading a folder of camera images (``.png``, ``.jpg``) or model-input
tensors (``.npy``) into the model's input, checking every file before any work is done, and
measuring how much of the world the images cover (brightness and contrast spread). Images
become tensors through the model bundle's :class:`~protos.bundle.preprocess.Preprocessor`
and the operator's ``runtime.yaml`` — the very code and config every node runs on its
frames — so calibration ranges are measured on what the model will see (ADR 0046).

What it is not for: running models (``model_compare``) or quantizing (``quantization``).
Samples are read lazily, file by file, when iterated: a folder is checked (and its coverage
measured) once up front and never held in memory whole.
"""

from __future__ import annotations

import zipfile
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Final, Literal

import numpy as np
import numpy.typing as npt

from control_plane.errors import InvalidInputError
from control_plane.registry.onnx_inspect import ModelInfo, TensorSpec
from control_plane.registry.reference_frame import load_frame
from control_plane.trust.custom import check_runtime
from protos.bundle.geometry import Geometry
from protos.bundle.preprocess import Preprocessor
from protos.bundle.spec import RuntimeSpec

__all__ = [
    "IMAGE_SUFFIXES",
    "MAX_SAMPLES",
    "MIN_CALIBRATION_SAMPLES",
    "NARROW_BRIGHTNESS",
    "NARROW_CONTRAST",
    "Coverage",
    "Sample",
    "SampleSet",
    "open_samples",
]

IMAGE_SUFFIXES: Final = (".png", ".jpg", ".jpeg")
TENSOR_SUFFIXES: Final = (".npy",)
MAX_SAMPLES: Final = 1000
"""More files than this in one folder are refused (every file is decoded twice)."""
MAX_HELD_BYTES: Final = 512 * 1024**2
"""The most sample tensors :meth:`SampleSet.hold` keeps in memory."""
MIN_CALIBRATION_SAMPLES: Final = 8
"""Fewer calibration samples than this give ranges that say nothing about the world."""
NARROW_BRIGHTNESS: Final = 40.0
"""Brightness levels (of 255) between the 5th and 95th percentile below which a set is narrow."""
NARROW_CONTRAST: Final = 8.0
"""Contrast levels (luma standard deviation) between the 5th and 95th percentile likewise."""
ONE_BAND: Final = 0.9
"""A share of images in one brightness band (dark, mid, bright) at or above which we warn."""
_BANDS: Final = (("dark", 85.0), ("mid", 170.0), ("bright", 256.0))
_LUMA: Final = np.array([0.299, 0.587, 0.114], dtype=np.float64)  # BT.601, RGB order

Kind = Literal["images", "tensors"]


@dataclass(frozen=True, slots=True)
class Sample:
    """One file as the model's input; ``geometry`` (images only) maps boxes back to it."""

    name: str
    inputs: dict[str, npt.NDArray[Any]]
    geometry: Geometry


@dataclass(frozen=True, slots=True)
class Coverage:
    """How much of the world a set of images covers: mean luma (brightness) and its standard
    deviation (contrast) per image, at the 5th, 50th and 95th percentiles, the images per
    brightness band and per class folder, and what is narrow about it."""

    images: int
    brightness: tuple[float, float, float]
    contrast: tuple[float, float, float]
    bands: dict[str, int]
    warnings: tuple[str, ...]
    classes: dict[str, int] | None = None
    """Images per class folder (``DIR/<label>/``); None for a flat folder."""

    def to_report(self) -> dict[str, Any]:
        return {
            "images": self.images,
            "classes": None if self.classes is None else dict(self.classes),
            "brightness_p5_p50_p95": [round(v, 1) for v in self.brightness],
            "contrast_p5_p50_p95": [round(v, 1) for v in self.contrast],
            "bands": dict(self.bands),
            "warnings": list(self.warnings),
        }


@dataclass(frozen=True)
class SampleSet:
    """A checked folder of samples for one model; iterate for :class:`Sample` s (lazily)."""

    directory: Path
    kind: Kind
    files: tuple[Path, ...]
    input: TensorSpec
    preprocessor: Preprocessor | None
    runtime: RuntimeSpec | None
    """The runtime spec with its size resolved against the model (None without one)."""
    coverage: Coverage | None
    """Measured for images; None for tensors (their values are not pixels)."""

    held: tuple[Sample, ...] | None = None
    """The samples themselves, once :meth:`hold` kept them in memory."""

    def __len__(self) -> int:
        return len(self.files)

    def __iter__(self) -> Iterator[Sample]:
        if self.held is not None:
            yield from self.held
            return
        for path in self.files:
            yield self._load(path)

    def hold(self, limit_bytes: int = MAX_HELD_BYTES) -> SampleSet:
        """The same set with its tensors kept in memory, when they fit in ``limit_bytes``
        (else this set, read from disk again on every pass): for work that passes over the
        samples many times (``--auto-exclude``)."""
        if self.held is not None or not self.files:
            return self
        first = self._load(self.files[0])
        size = sum(t.nbytes for t in first.inputs.values()) * len(self.files)
        if size > limit_bytes:
            return self
        return replace(self, held=(first, *(self._load(p) for p in self.files[1:])))

    def _load(self, path: Path) -> Sample:
        if self.preprocessor is not None:
            frame = load_frame(path, what="image", field="data")
            tensor = self.preprocessor(frame)
            geometry = self.preprocessor.geometry(*frame.shape[:2])
        else:
            tensor = _read_tensor(path, self.input)
            height, width = _spatial(tensor)
            geometry = Geometry.stretch(height, width, height, width)
        return Sample(str(path.relative_to(self.directory)), {self.input.name: tensor}, geometry)


def open_samples(
    directory: Path,
    info: ModelInfo,
    runtime: RuntimeSpec | None,
    *,
    minimum: int = 1,
    what: str = "data",
) -> SampleSet:
    """Check ``directory`` against the model and measure its coverage.

    The folder holds images (which need ``runtime``: they reach the model only through its
    preprocessing) or ``.npy`` tensors shaped as the model's one input, not both, directly
    or in one folder per class (``DIR/person/…``, counted against the spec's labels);
    hidden files are skipped, anything else is refused. Every file is read once here, so a file
    that does not decode or does not fit is refused by name before anything is written.
    InvalidInputError otherwise names the folder and what is wrong.
    """
    files, classes = _list(directory, what)
    if len(info.inputs) != 1:
        raise _refuse(
            f"the model has {len(info.inputs)} inputs; {what} folders feed models with one",
            directory,
        )
    spec = info.inputs[0]
    images = [p for p in files if p.suffix.lower() in IMAGE_SUFFIXES]
    tensors = [p for p in files if p.suffix.lower() in TENSOR_SUFFIXES]
    other = [p for p in files if p not in images and p not in tensors]
    if other:
        raise _refuse(
            f"{what} folder {directory}: {other[0].name!r} is neither an image "
            f"({', '.join(IMAGE_SUFFIXES)}) nor a tensor (.npy)"
            + (f" (and {len(other) - 1} more)" if len(other) > 1 else ""),
            directory,
        )
    if images and tensors:
        raise _refuse(
            f"{what} folder {directory} mixes images ({len(images)}) and .npy tensors "
            f"({len(tensors)}); give one kind",
            directory,
        )
    if len(files) < minimum:
        raise _refuse(
            f"{what} folder {directory} holds {len(files)} sample(s); at least {minimum} "
            "are needed",
            directory,
        )
    if len(files) > MAX_SAMPLES:
        raise _refuse(
            f"{what} folder {directory} holds {len(files)} samples; at most {MAX_SAMPLES}",
            directory,
        )
    signed: RuntimeSpec | None = None
    preprocessor: Preprocessor | None = None
    if runtime is not None:
        resolved, channels = check_runtime(
            runtime,
            [t.to_sig() for t in info.inputs],
            [t.to_sig() for t in info.outputs],
            where="runtime",
            metadata=info.metadata,
        )
        signed = replace(runtime, preprocess=resolved)
        if images:
            preprocessor = Preprocessor(resolved, channels)
    if not images:
        for path in tensors:
            _read_tensor(path, spec)
        return SampleSet(directory, "tensors", tuple(files), spec, None, signed, None)
    if preprocessor is None:
        raise _refuse(
            f"{what} folder {directory} holds images: they become the model's input only "
            "through a runtime spec's preprocessing, give it with --runtime runtime.yaml",
            directory,
        )
    brightness = np.empty(len(images))
    contrast = np.empty(len(images))
    for i, path in enumerate(images):  # one frame in memory at a time
        luma = load_frame(path, what="image", field="data").astype(np.float64) @ _LUMA
        brightness[i], contrast[i] = luma.mean(), luma.std()
    labels = () if signed is None else signed.labels
    coverage = _coverage(brightness, contrast, classes, labels)
    return SampleSet(directory, "images", tuple(files), spec, preprocessor, signed, coverage)


def _entries(folder: Path, what: str) -> list[Path]:
    try:
        return sorted(p for p in folder.iterdir() if not p.name.startswith("."))
    except OSError as exc:
        raise _refuse(f"cannot read {what} folder {folder}: {exc.strerror or exc}", folder) from exc


def _list(directory: Path, what: str) -> tuple[list[Path], dict[str, int] | None]:
    """The sample files, and per class folder (``DIR/<label>/…``) how many, if so laid out."""
    if not directory.exists():
        raise _refuse(f"{what} folder {directory} does not exist", directory)
    if not directory.is_dir():
        raise _refuse(f"{what} folder {directory} is not a directory", directory)
    entries = _entries(directory, what)
    folders = [p for p in entries if p.is_dir()]
    if not folders:
        if not entries:
            raise _refuse(f"{what} folder {directory} is empty", directory)
        return entries, None
    if len(folders) != len(entries):
        loose = next(p for p in entries if not p.is_dir())
        raise _refuse(
            f"{what} folder {directory} mixes class folders ({folders[0].name!r}) and files "
            f"({loose.name!r}); put every sample in its class's folder, or none",
            directory,
        )
    files: list[Path] = []
    classes: dict[str, int] = {}
    for folder in folders:
        inside = _entries(folder, what)
        nested = [p for p in inside if p.is_dir()]
        if nested:
            raise _refuse(
                f"{what} folder {folder} holds a folder ({nested[0].name!r}); samples are "
                "read one level deep (DIR/<label>/image.png)",
                directory,
            )
        classes[folder.name] = len(inside)
        files += inside
    if not files:
        raise _refuse(f"{what} folder {directory} is empty", directory)
    return files, classes


def _read_tensor(path: Path, spec: TensorSpec) -> npt.NDArray[Any]:
    where = str(path)
    try:
        array = np.load(path, allow_pickle=False)
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as exc:
        raise InvalidInputError(
            f"cannot read tensor {where}: {exc}", field="data", path=where
        ) from exc
    if not isinstance(array, np.ndarray):
        raise InvalidInputError(f"{where} is not a .npy array file", field="data", path=where)
    fits = (
        array.dtype.name == spec.dtype
        and array.ndim == len(spec.shape)
        and all(
            not isinstance(dim, int) or dim == size
            for size, dim in zip(array.shape, spec.shape, strict=True)
        )
    )
    if not fits:
        raise InvalidInputError(
            f"tensor {where} is {array.dtype.name}{list(array.shape)}; the model's input "
            f"{spec.name!r} is {spec.dtype}{list(spec.shape)}",
            field="data",
            path=where,
        )
    return array


def _spatial(tensor: npt.NDArray[Any]) -> tuple[int, int]:
    """(height, width) of an image-like tensor for box geometry; 1x1 for anything else."""
    if tensor.ndim == 4:
        channels_first = tensor.shape[1] in (1, 3)
        h, w = tensor.shape[2:] if channels_first else tensor.shape[1:3]
        return int(h), int(w)
    return 1, 1


def _coverage(
    brightness: npt.NDArray[np.float64],
    contrast: npt.NDArray[np.float64],
    classes: dict[str, int] | None = None,
    labels: tuple[str, ...] = (),
) -> Coverage:
    count = len(brightness)
    b = tuple(float(np.percentile(brightness, q)) for q in (5, 50, 95))
    c = tuple(float(np.percentile(contrast, q)) for q in (5, 50, 95))
    bands: dict[str, int] = {}
    low = 0.0
    for name, high in _BANDS:
        bands[name] = int(np.count_nonzero((brightness >= low) & (brightness < high)))
        low = high
    warnings = []
    if b[2] - b[0] < NARROW_BRIGHTNESS:
        warnings.append(
            f"narrow brightness: 90% of the images have a mean brightness between {b[0]:.0f} "
            f"and {b[2]:.0f} (of 255); add images from every condition the cameras see "
            "(night, dusk, glare)"
        )
    if c[2] - c[0] < NARROW_CONTRAST:
        warnings.append(
            f"narrow contrast: 90% of the images have a contrast between {c[0]:.1f} and "
            f"{c[2]:.1f}; add flat (fog, night) and busy scenes"
        )
    for name, inside in bands.items():
        if count > 1 and inside / count >= ONE_BAND:
            warnings.append(f"{inside / count:.0%} of the images are {name}")
    if classes is not None and labels:
        strangers = [name for name in classes if name not in labels]
        if strangers:
            warnings.append(
                f"class folder(s) {', '.join(strangers)} name no label of the runtime spec"
            )
        missing = [label for label in labels if not classes.get(label)]
        if missing:
            warnings.append(f"no images of {', '.join(missing)}")
    return Coverage(count, (b[0], b[1], b[2]), (c[0], c[1], c[2]), bands, tuple(warnings), classes)


def _refuse(message: str, directory: Path) -> InvalidInputError:
    return InvalidInputError(message, field="data", path=str(directory))
