"""The `custom` field edgefleet puts in TUF targets (DESIGN §3), and the target path layout.

Parsing is strict about the fields we use and ignores keys it does not know, so a newer
CLI can add fields without breaking an older control plane. No I/O, no repository rules.
A model's optional `runtime` (how it is run: `protos.bundle.spec`) is parsed by the model
bundle's own parser and checked against the signed I/O signature with the functions every
node runs when it loads the model; a version signed without one stays valid. Its optional
`release_check` (the comparison with a float baseline, `model push --baseline`) is checked
for shape and for a verdict that follows from its figures; versions without one stay valid.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Final

from control_plane.errors import InvalidInputError
from protos.bundle.spec import (
    BundleError,
    PreprocessConfig,
    RuntimeSpec,
    TensorSig,
    check_declared_preprocess,
    check_outputs,
    parse_runtime_spec,
    resolve_input,
)

FORMAT_VERSION: Final = 1
"""The `edgefleet` key of every custom dict: the version of this wire format."""

KIND_MODEL: Final = "model"
KIND_FLOOR: Final = "floor"

MODEL_NAME_PATTERN: Final = re.compile(r"[a-z0-9][a-z0-9._-]{0,127}")
VERSION_PATTERN: Final = re.compile(r"[0-9A-Za-z][0-9A-Za-z.+_-]{0,63}")
AGENT_VERSION_PATTERN: Final = re.compile(
    r"[0-9]{1,9}\.[0-9]{1,9}\.[0-9]{1,9}(?:[-+][0-9A-Za-z.+-]{1,64})?"
)
SHA256_PATTERN: Final = re.compile(r"[0-9a-f]{64}")

MODEL_FILE_NAME: Final = "model.onnx"
REFERENCE_FILE_NAME: Final = "reference.npz"

# ONNX tensor element types, spelled the numpy way (as onnx.helper.tensor_dtype_to_np_dtype
# names them, plus the types numpy lacks).
DTYPES: Final = frozenset(
    {
        "float16",
        "float32",
        "float64",
        "bfloat16",
        "int4",
        "int8",
        "int16",
        "int32",
        "int64",
        "uint4",
        "uint8",
        "uint16",
        "uint32",
        "uint64",
        "bool",
        "string",
        "complex64",
        "complex128",
        "float8e4m3fn",
        "float8e4m3fnuz",
        "float8e5m2",
        "float8e5m2fnuz",
        "float4e2m1",
    }
)

_MAX_TENSORS: Final = 256
_MAX_RANK: Final = 32
_MAX_LIST: Final = 64
_MAX_NAME: Final = 256


# ----------------------------------------------------------------------------- paths


def validate_model_name(model: str, *, field_name: str = "model") -> str:
    if not isinstance(model, str) or not MODEL_NAME_PATTERN.fullmatch(model):
        raise InvalidInputError(
            f"{field_name}: {model!r} is not a model name "
            "(1-128 of a-z 0-9 . _ -, starting with a letter or digit)",
            field=field_name,
        )
    return model


def validate_version(version: str, *, field_name: str = "version") -> str:
    if not isinstance(version, str) or not VERSION_PATTERN.fullmatch(version):
        raise InvalidInputError(
            f"{field_name}: {version!r} is not a version "
            "(1-64 of A-Z a-z 0-9 . + _ -, starting with a letter or digit)",
            field=field_name,
        )
    return version


def model_target_path(model: str, version: str) -> str:
    """`models/<model>/<version>/model.onnx`."""
    validate_model_name(model)
    validate_version(version)
    return f"models/{model}/{version}/{MODEL_FILE_NAME}"


def reference_target_path(model: str, version: str) -> str:
    """`models/<model>/<version>/reference.npz`: the self-test input/output pair."""
    validate_model_name(model)
    validate_version(version)
    return f"models/{model}/{version}/{REFERENCE_FILE_NAME}"


def floor_target_path(model: str) -> str:
    """`floors/<model>.json`: the release counter below which a model may not run."""
    validate_model_name(model)
    return f"floors/{model}.json"


@dataclass(frozen=True, slots=True)
class TargetPath:
    """A target path taken apart: kind is "model", "reference" or "floor"."""

    kind: str
    model: str
    version: str | None = None


_MODEL_PATH = re.compile(r"models/(?P<model>[^/]+)/(?P<version>[^/]+)/(?P<file>[^/]+)")
_FLOOR_PATH = re.compile(r"floors/(?P<model>[^/]+)\.json")


def parse_target_path(path: str) -> TargetPath | None:
    """Recognise one of our target paths; None for anything else."""
    match = _MODEL_PATH.fullmatch(path)
    if match is not None:
        model, version, name = match["model"], match["version"], match["file"]
        if not MODEL_NAME_PATTERN.fullmatch(model) or not VERSION_PATTERN.fullmatch(version):
            return None
        if name == MODEL_FILE_NAME:
            return TargetPath("model", model, version)
        if name == REFERENCE_FILE_NAME:
            return TargetPath("reference", model, version)
        return None
    match = _FLOOR_PATH.fullmatch(path)
    if match is not None and MODEL_NAME_PATTERN.fullmatch(match["model"]):
        return TargetPath("floor", match["model"])
    return None


def target_label(path: str | None) -> str | None:
    """How people name what a node runs: ``name@version`` for a model target
    (``models/<name>/<version>/model.onnx``), the file's name for anything else (a model
    served from a local file); None for no target ("" or None)."""
    if not path:
        return None
    parsed = parse_target_path(path)
    if parsed is not None and parsed.kind == "model":
        return f"{parsed.model}@{parsed.version}"
    return path.rstrip("/").rsplit("/", 1)[-1] or path


# ------------------------------------------------------------------------ dataclasses


@dataclass(frozen=True, slots=True)
class TensorSpec:
    """One model input or output: dims are ints or symbolic names (e.g. "N")."""

    name: str
    dtype: str
    shape: tuple[int | str, ...]

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "dtype": self.dtype, "shape": list(self.shape)}

    def to_sig(self) -> TensorSig:
        """As the model bundle's checks see it (symbolic dims are dynamic)."""
        return TensorSig.of(self.name, self.dtype, self.shape)


@dataclass(frozen=True, slots=True)
class IOSignature:
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]

    def to_dict(self) -> dict[str, Any]:
        return {
            "inputs": [t.to_dict() for t in self.inputs],
            "outputs": [t.to_dict() for t in self.outputs],
        }


@dataclass(frozen=True, slots=True)
class Compat:
    """Where the model may run: execution providers it was tested with, CPU architectures."""

    execution_providers: tuple[str, ...]
    arch: tuple[str, ...]

    def to_dict(self) -> dict[str, Any]:
        return {"execution_providers": list(self.execution_providers), "arch": list(self.arch)}


@dataclass(frozen=True, slots=True)
class ReferenceInfo:
    """The reference input/output pair for the on-node self-test, and its tolerance.

    On the wire `atol`/`rtol` are decimal strings ("0.0001"): TUF signs canonical JSON,
    which has no floating-point numbers. Parsing also takes an int or a float.
    """

    path: str
    sha256: str
    length: int
    atol: float
    rtol: float

    def to_dict(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "sha256": self.sha256,
            "length": self.length,
            "atol": repr(self.atol),
            "rtol": repr(self.rtol),
        }


@dataclass(frozen=True, slots=True)
class ModelCustom:
    """The custom field of `models/<model>/<version>/model.onnx`.

    Construction does not validate; `parse_model_custom(c.to_dict())` does, and the
    repository helpers run it before they put a hand-built value into metadata.
    """

    model: str
    version: str
    release_counter: int
    io: IOSignature
    # Read-only view; excluded from the hash because a mapping is not hashable.
    opset: Mapping[str, int] = field(hash=False)
    min_agent_version: str
    compat: Compat
    reference: ReferenceInfo
    runtime: RuntimeSpec | None = None
    """How the version is run (signed as `runtime`); None for a version signed without."""
    release_check: ReleaseCheck | None = None
    """Its comparison with a float baseline (`model push --baseline`); None without one."""
    format_version: int = FORMAT_VERSION

    def __post_init__(self) -> None:
        object.__setattr__(self, "opset", MappingProxyType(dict(self.opset)))

    @property
    def target_path(self) -> str:
        return model_target_path(self.model, self.version)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "edgefleet": self.format_version,
            "kind": KIND_MODEL,
            "model": self.model,
            "version": self.version,
            "release_counter": self.release_counter,
            "io": self.io.to_dict(),
            "opset": dict(self.opset),
            "min_agent_version": self.min_agent_version,
            "compat": self.compat.to_dict(),
            "reference": self.reference.to_dict(),
        }
        if self.runtime is not None:
            out["runtime"] = self.runtime.to_signed()
        if self.release_check is not None:
            out["release_check"] = self.release_check.to_dict()
        return out


@dataclass(frozen=True, slots=True)
class FloorCustom:
    """The custom field (and content) of `floors/<model>.json`: counters < floor are forbidden."""

    model: str
    floor: int
    format_version: int = FORMAT_VERSION

    @property
    def target_path(self) -> str:
        return floor_target_path(self.model)

    def to_dict(self) -> dict[str, Any]:
        return {
            "edgefleet": self.format_version,
            "kind": KIND_FLOOR,
            "model": self.model,
            "floor": self.floor,
        }


# --------------------------------------------------------------------------- parsing


def parse_model_custom(data: object) -> ModelCustom:
    """Validate a model target's custom dict; InvalidInputError names the bad field."""
    obj = _mapping(data, "custom")
    _header(obj, KIND_MODEL)
    model = validate_model_name(_str(obj, "model"), field_name="custom.model")
    version = validate_version(_str(obj, "version"), field_name="custom.version")
    counter = _int(obj, "release_counter", minimum=1)
    io = _io(_mapping(_get(obj, "io", "io"), "io"))
    opset = _opset(_mapping(_get(obj, "opset", "opset"), "opset"))
    agent = _str(obj, "min_agent_version")
    if not AGENT_VERSION_PATTERN.fullmatch(agent):
        raise _bad("min_agent_version", f"{agent!r} is not a version like 1.2.3")
    compat = _compat(_mapping(_get(obj, "compat", "compat"), "compat"))
    reference = _reference(_mapping(_get(obj, "reference", "reference"), "reference"))
    runtime = _runtime(obj.get("runtime"), io)
    check = obj.get("release_check")
    release_check = None if check is None else parse_release_check(check)
    return ModelCustom(
        model=model,
        version=version,
        release_counter=counter,
        io=io,
        opset=opset,
        min_agent_version=agent,
        compat=compat,
        reference=reference,
        runtime=runtime,
        release_check=release_check,
    )


def check_runtime(
    runtime: RuntimeSpec,
    inputs: Sequence[TensorSig],
    outputs: Sequence[TensorSig],
    *,
    where: str = "custom.runtime",
    metadata: Mapping[str, str] | None = None,
) -> tuple[PreprocessConfig, int]:
    """Refuse a runtime spec that every node would refuse when it loads the model.

    The checks are the model bundle's (`resolve_input`, `check_outputs`, and with the
    model's own `metadata`, `check_declared_preprocess`), the very ones the node runs.
    Returns the preprocess config with its size resolved and the model's channel count.
    InvalidInputError names the field (`<where>.preprocess.size`) and carries both sides
    of the mismatch (`model`, `config`).
    """
    try:
        resolved, channels = resolve_input(runtime.preprocess, inputs)
        check_outputs(runtime, outputs)
        if metadata is not None:
            check_declared_preprocess(resolved, metadata)
    except BundleError as exc:
        raise bundle_input_error(exc, where, f"{where}.{exc.field}: {exc.message}") from exc
    return resolved, channels


def bundle_input_error(
    exc: BundleError, where: str, message: str | None = None
) -> InvalidInputError:
    """A model-bundle error as this package's InvalidInputError, its field under ``where``.

    The bundle's parser names fields under the ``where`` it was given, its dataclass
    checks (``preprocess.std``) and model checks without it: both come out as
    ``<where>.preprocess.std``. ``model``/``config`` carry both sides of a mismatch.
    """
    field_name = exc.field if exc.field.startswith(where) else f"{where}.{exc.field}"
    if message is None:
        message = exc.message
        if not message.startswith(where):
            message = (
                f"{where}.{message}"
                if message.startswith(exc.field)
                else f"{field_name}: {message}"
            )
    return InvalidInputError(
        message, field=field_name, model=_shown(exc.model), config=_shown(exc.config)
    )


def runtime_summary(runtime: RuntimeSpec, *, labels_shown: int = 5) -> dict[str, Any]:
    """What an operator reads about a version's runtime spec (`model show`, the REST
    version view): the preprocessing, the decoder and its parameters, how many labels and
    the first few. Reals are plain numbers here; the signed form is `to_signed()`."""
    pre = runtime.preprocess
    out = runtime.output
    params = {
        key: list(value) if isinstance(value, tuple) else value
        for key in out.to_signed()
        if key not in ("decoder", "output")
        for value in (getattr(out, key),)
    }
    return {
        "preprocess": {
            "layout": pre.layout,
            "size": None if pre.size is None else list(pre.size),
            "fit": pre.fit,
            "resize": pre.resize,
            **({"pad_value": pre.pad_value} if pre.fit == "letterbox" else {}),
            "channel_order": pre.channel_order,
            "dtype": pre.dtype,
            "scale": pre.scale,
            "mean": list(pre.mean),
            "std": list(pre.std),
        },
        "decoder": out.decoder,
        "output": out.output,
        "params": params,
        "labels": len(runtime.labels),
        "first_labels": list(runtime.labels[:labels_shown]),
    }


def _shown(value: object) -> str | None:
    return None if value is None else str(value)


def _runtime(raw: object, io: IOSignature) -> RuntimeSpec | None:
    if raw is None:  # signed before model bundles: the node runs it with its own config
        return None
    try:
        runtime = parse_runtime_spec(raw, where="custom.runtime")
    except BundleError as exc:
        raise bundle_input_error(exc, "custom.runtime") from exc
    check_runtime(
        runtime,
        [t.to_sig() for t in io.inputs],
        [t.to_sig() for t in io.outputs],
        where="custom.runtime",
    )
    return runtime


def parse_floor_custom(data: object) -> FloorCustom:
    """Validate a floor target's custom dict."""
    obj = _mapping(data, "custom")
    _header(obj, KIND_FLOOR)
    model = validate_model_name(_str(obj, "model"), field_name="custom.model")
    floor = _int(obj, "floor", minimum=1)
    return FloorCustom(model=model, floor=floor)


def _bad(field_name: str, problem: str) -> InvalidInputError:
    return InvalidInputError(f"custom.{field_name}: {problem}", field=f"custom.{field_name}")


def _mapping(value: object, field_name: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise _bad(field_name, f"expected an object, got {type(value).__name__}")
    return value


def _get(obj: Mapping[str, Any], key: str, field_name: str) -> Any:
    if key not in obj:
        raise _bad(field_name, "missing")
    return obj[key]


def _str(obj: Mapping[str, Any], key: str, *, path: str | None = None) -> str:
    name = path or key
    value = _get(obj, key, name)
    if not isinstance(value, str) or not value:
        raise _bad(name, f"expected a non-empty string, got {value!r}")
    if len(value) > _MAX_NAME:
        raise _bad(name, f"longer than {_MAX_NAME} characters")
    return value


def _int(obj: Mapping[str, Any], key: str, *, minimum: int, path: str | None = None) -> int:
    name = path or key
    value = _get(obj, key, name)
    # bool is an int in Python; in a wire format it is a mistake.
    if not isinstance(value, int) or isinstance(value, bool):
        raise _bad(name, f"expected an integer, got {value!r}")
    if value < minimum:
        raise _bad(name, f"must be >= {minimum}, got {value}")
    return value


def _header(obj: Mapping[str, Any], kind: str) -> None:
    fmt = _get(obj, "edgefleet", "edgefleet")
    if not isinstance(fmt, int) or isinstance(fmt, bool):
        raise _bad("edgefleet", f"expected the format version {FORMAT_VERSION}, got {fmt!r}")
    if fmt != FORMAT_VERSION:
        raise _bad(
            "edgefleet",
            f"format version {fmt} is not understood by this build (it reads {FORMAT_VERSION})",
        )
    got = _get(obj, "kind", "kind")
    if got != kind:
        raise _bad("kind", f"expected {kind!r}, got {got!r}")


def _str_list(value: object, field_name: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not value:
        raise _bad(field_name, "expected a non-empty list of strings")
    if len(value) > _MAX_LIST:
        raise _bad(field_name, f"more than {_MAX_LIST} entries")
    for i, item in enumerate(value):
        if not isinstance(item, str) or not item or len(item) > _MAX_NAME:
            raise _bad(f"{field_name}[{i}]", f"expected a non-empty string, got {item!r}")
    if len(set(value)) != len(value):
        raise _bad(field_name, "duplicate entries")
    return tuple(value)


def _tensors(value: object, field_name: str) -> tuple[TensorSpec, ...]:
    if not isinstance(value, list) or not value:
        raise _bad(field_name, "expected a non-empty list of tensors")
    if len(value) > _MAX_TENSORS:
        raise _bad(field_name, f"more than {_MAX_TENSORS} tensors")
    specs: list[TensorSpec] = []
    for i, item in enumerate(value):
        where = f"{field_name}[{i}]"
        obj = _mapping(item, where)
        name = _str(obj, "name", path=f"{where}.name")
        dtype = _str(obj, "dtype", path=f"{where}.dtype")
        if dtype not in DTYPES:
            raise _bad(f"{where}.dtype", f"unknown element type {dtype!r}")
        shape = _get(obj, "shape", f"{where}.shape")
        if not isinstance(shape, list) or len(shape) > _MAX_RANK:
            raise _bad(f"{where}.shape", f"expected a list of at most {_MAX_RANK} dims")
        for j, dim in enumerate(shape):
            if isinstance(dim, bool) or not isinstance(dim, int | str):
                raise _bad(f"{where}.shape[{j}]", f"expected an int or a name, got {dim!r}")
            if isinstance(dim, int) and dim < 0:
                raise _bad(f"{where}.shape[{j}]", f"negative dimension {dim}")
            if isinstance(dim, str) and not (0 < len(dim) <= _MAX_NAME):
                raise _bad(f"{where}.shape[{j}]", "symbolic dimensions need a name")
        specs.append(TensorSpec(name=name, dtype=dtype, shape=tuple(shape)))
    names = [s.name for s in specs]
    if len(set(names)) != len(names):
        raise _bad(field_name, "duplicate tensor names")
    return tuple(specs)


def _io(obj: Mapping[str, Any]) -> IOSignature:
    return IOSignature(
        inputs=_tensors(_get(obj, "inputs", "io.inputs"), "io.inputs"),
        outputs=_tensors(_get(obj, "outputs", "io.outputs"), "io.outputs"),
    )


def _opset(obj: Mapping[str, Any]) -> dict[str, int]:
    if not obj:
        raise _bad("opset", "expected at least one domain")
    if len(obj) > _MAX_LIST:
        raise _bad("opset", f"more than {_MAX_LIST} domains")
    result: dict[str, int] = {}
    for domain in obj:
        if not isinstance(domain, str) or len(domain) > _MAX_NAME:
            raise _bad("opset", f"domain {domain!r} is not a string")
        result[domain] = _int(obj, domain, minimum=1, path=f"opset[{domain!r}]")
    return result


def _compat(obj: Mapping[str, Any]) -> Compat:
    return Compat(
        execution_providers=_str_list(
            _get(obj, "execution_providers", "compat.execution_providers"),
            "compat.execution_providers",
        ),
        arch=_str_list(_get(obj, "arch", "compat.arch"), "compat.arch"),
    )


def _tolerance(obj: Mapping[str, Any], key: str) -> float:
    name = f"reference.{key}"
    value = _get(obj, key, name)
    if isinstance(value, str) and 0 < len(value) <= 32:
        try:
            number = float(value)
        except ValueError:
            raise _bad(name, f"expected a decimal number, got {value!r}") from None
    elif isinstance(value, int | float) and not isinstance(value, bool):
        number = float(value)
    else:
        raise _bad(name, f"expected a decimal number (as a string), got {value!r}")
    if not math.isfinite(number) or number < 0:
        raise _bad(name, f"must be a finite number >= 0, got {value!r}")
    return number


def _reference(obj: Mapping[str, Any]) -> ReferenceInfo:
    path = _str(obj, "path", path="reference.path")
    parsed = parse_target_path(path)
    if parsed is None or parsed.kind != "reference":
        raise _bad("reference.path", f"{path!r} is not models/<model>/<version>/reference.npz")
    sha256 = _str(obj, "sha256", path="reference.sha256")
    if not SHA256_PATTERN.fullmatch(sha256):
        raise _bad("reference.sha256", "expected 64 lowercase hex digits")
    return ReferenceInfo(
        path=path,
        sha256=sha256,
        length=_int(obj, "length", minimum=0, path="reference.length"),
        atol=_tolerance(obj, "atol"),
        rtol=_tolerance(obj, "rtol"),
    )


# ---------------------------------------------------------------- release check


RELEASE_VERDICTS: Final = ("passed", "failed")
RELEASE_KINDS: Final = {"classification": "top1_ratio", "detection": "recall", "raw": "cosine_p5"}
"""Each output kind and the figure its release check is judged on."""
_OUTPUT_FIGURES: Final = ("max_abs", "mean_abs", "cosine_min", "cosine_p5", "sqnr_db_p5")
_DECODED_FIGURES: Final = ("top1_ratio", "topk_overlap", "recall", "precision", "mean_score_diff")
_MAX_WARNINGS: Final = 16
_MAX_CLASSES: Final = 256


@dataclass(frozen=True, slots=True)
class ReleaseCheck:
    """`custom.release_check`: the comparison of a version with its float baseline on the
    operator's data, as `model push --baseline` measured and judged it (ADR 0048).

    Numbers are decimal strings ("0.9931", "inf"): canonical JSON has no floats. Parsing
    checks the shape and that the verdict is what the figure and threshold say; the node
    reads none of it (a rollout's `require_release_check` does)."""

    verdict: str
    forced: bool
    kind: str
    judged_on: str
    value: str
    threshold: str
    baseline_sha256: str
    samples: int
    data: str
    outputs: tuple[Mapping[str, str], ...]
    decoded: Mapping[str, str] | None
    coverage: Mapping[str, Any] | None
    onnxruntime: str
    machine: str
    int8_features: tuple[str, ...]

    @property
    def passed(self) -> bool:
        """Passed on its own figures, not forced through."""
        return self.verdict == "passed" and not self.forced

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "verdict": self.verdict,
            "forced": self.forced,
            "kind": self.kind,
            "judged_on": self.judged_on,
            "value": self.value,
            "threshold": self.threshold,
            "baseline_sha256": self.baseline_sha256,
            "samples": self.samples,
            "data": self.data,
            "outputs": [dict(o) for o in self.outputs],
            "onnxruntime": self.onnxruntime,
            "cpu": {"machine": self.machine, "int8_features": list(self.int8_features)},
        }
        if self.decoded is not None:
            out["decoded"] = dict(self.decoded)
        if self.coverage is not None:
            out["coverage"] = json_copy(self.coverage)
        return out


def json_copy(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {k: json_copy(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_copy(v) for v in value]
    return value


def decimal_of(field_name: str, value: object) -> float:
    """A signed decimal string ("0.99", "inf", "-inf") as a float; `_bad` otherwise."""
    if not isinstance(value, str) or not 0 < len(value) <= 32:
        raise _bad(field_name, f"expected a decimal number as a string, got {value!r}")
    try:
        number = float(value)
    except ValueError:
        raise _bad(field_name, f"expected a decimal number, got {value!r}") from None
    if math.isnan(number):
        raise _bad(field_name, "NaN is not a figure")
    return number


def _figures(obj: Mapping[str, Any], names: Sequence[str], where: str) -> dict[str, str]:
    figures: dict[str, str] = {}
    for name in names:
        if name in obj:
            decimal_of(f"{where}.{name}", obj[name])
            figures[name] = obj[name]
    return figures


def parse_release_check(raw: object) -> ReleaseCheck:
    """Validate `custom.release_check`; InvalidInputError names the field."""
    where = "release_check"
    obj = _mapping(raw, where)
    verdict = _str(obj, "verdict", path=f"{where}.verdict")
    if verdict not in RELEASE_VERDICTS:
        raise _bad(f"{where}.verdict", f"expected passed or failed, got {verdict!r}")
    forced = _get(obj, "forced", f"{where}.forced")
    if not isinstance(forced, bool):
        raise _bad(f"{where}.forced", f"expected true or false, got {forced!r}")
    kind = _str(obj, "kind", path=f"{where}.kind")
    if kind not in RELEASE_KINDS:
        raise _bad(f"{where}.kind", f"expected one of {', '.join(RELEASE_KINDS)}, got {kind!r}")
    judged_on = _str(obj, "judged_on", path=f"{where}.judged_on")
    if judged_on != RELEASE_KINDS[kind]:
        raise _bad(f"{where}.judged_on", f"a {kind} check is judged on {RELEASE_KINDS[kind]!r}")
    value = decimal_of(f"{where}.value", _get(obj, "value", f"{where}.value"))
    threshold = decimal_of(f"{where}.threshold", _get(obj, "threshold", f"{where}.threshold"))
    if not 0 <= threshold <= 1:
        raise _bad(f"{where}.threshold", f"must be in [0, 1], got {obj['threshold']!r}")
    if (value >= threshold) != (verdict == "passed"):
        raise _bad(
            f"{where}.verdict",
            f"{verdict!r} does not follow from {judged_on} {obj['value']} against the "
            f"threshold {obj['threshold']}",
        )
    if forced and verdict == "passed":
        raise _bad(f"{where}.forced", "only a failed check is forced")
    sha = _str(obj, "baseline_sha256", path=f"{where}.baseline_sha256")
    if not SHA256_PATTERN.fullmatch(sha):
        raise _bad(f"{where}.baseline_sha256", "expected 64 lowercase hex digits")
    samples = _int(obj, "samples", minimum=1, path=f"{where}.samples")
    data = _str(obj, "data", path=f"{where}.data")
    if data not in ("images", "tensors"):
        raise _bad(f"{where}.data", f"expected images or tensors, got {data!r}")
    raw_outputs = _get(obj, "outputs", f"{where}.outputs")
    if not isinstance(raw_outputs, list) or not 0 < len(raw_outputs) <= _MAX_TENSORS:
        raise _bad(f"{where}.outputs", f"expected a list of 1-{_MAX_TENSORS} outputs")
    outputs = []
    for i, item in enumerate(raw_outputs):
        at = f"{where}.outputs[{i}]"
        entry = _mapping(item, at)
        name = _str(entry, "output", path=f"{at}.output")
        figures = _figures(entry, _OUTPUT_FIGURES, at)
        if "cosine_p5" not in figures:
            raise _bad(f"{at}.cosine_p5", "missing")
        outputs.append(MappingProxyType({"output": name, **figures}))
    decoded: Mapping[str, str] | None = None
    if obj.get("decoded") is not None:
        at = f"{where}.decoded"
        decoded = MappingProxyType(_figures(_mapping(obj["decoded"], at), _DECODED_FIGURES, at))
    if kind != "raw" and (decoded is None or judged_on not in decoded):
        raise _bad(f"{where}.decoded.{judged_on}", f"a {kind} check needs it")
    coverage = None if obj.get("coverage") is None else _release_coverage(obj["coverage"])
    ort_version = _str(obj, "onnxruntime", path=f"{where}.onnxruntime")
    cpu = _mapping(_get(obj, "cpu", f"{where}.cpu"), f"{where}.cpu")
    machine = _str(cpu, "machine", path=f"{where}.cpu.machine")
    features = cpu.get("int8_features", [])
    if not isinstance(features, list) or len(features) > _MAX_LIST:
        raise _bad(f"{where}.cpu.int8_features", "expected a list of CPU flags")
    for i, flag in enumerate(features):
        if not isinstance(flag, str) or not 0 < len(flag) <= 64:
            raise _bad(f"{where}.cpu.int8_features[{i}]", f"expected a CPU flag, got {flag!r}")
    return ReleaseCheck(
        verdict=verdict,
        forced=forced,
        kind=kind,
        judged_on=judged_on,
        value=obj["value"],
        threshold=obj["threshold"],
        baseline_sha256=sha,
        samples=samples,
        data=data,
        outputs=tuple(outputs),
        decoded=decoded,
        coverage=coverage,
        onnxruntime=ort_version,
        machine=machine,
        int8_features=tuple(features),
    )


def _release_coverage(raw: object) -> Mapping[str, Any]:
    where = "release_check.coverage"
    obj = _mapping(raw, where)
    images = _int(obj, "images", minimum=1, path=f"{where}.images")
    out: dict[str, Any] = {"images": images}
    for key in ("brightness_p5_p50_p95", "contrast_p5_p50_p95"):
        values = _get(obj, key, f"{where}.{key}")
        if not isinstance(values, list) or len(values) != 3:
            raise _bad(f"{where}.{key}", "expected three decimal strings")
        for i, value in enumerate(values):
            decimal_of(f"{where}.{key}[{i}]", value)
        out[key] = list(values)
    classes = obj.get("classes")
    if classes is not None:
        counts = _mapping(classes, f"{where}.classes")
        if len(counts) > _MAX_CLASSES:
            raise _bad(f"{where}.classes", f"more than {_MAX_CLASSES} classes")
        for name in counts:
            if not isinstance(name, str) or not 0 < len(name) <= _MAX_NAME:
                raise _bad(f"{where}.classes", f"class {name!r} is not a name")
            _int(counts, name, minimum=0, path=f"{where}.classes[{name!r}]")
        out["classes"] = dict(counts)
    warnings = obj.get("warnings", [])
    if not isinstance(warnings, list) or len(warnings) > _MAX_WARNINGS:
        raise _bad(f"{where}.warnings", f"expected a list of at most {_MAX_WARNINGS} lines")
    for i, line in enumerate(warnings):
        if not isinstance(line, str) or len(line) > 1000:
            raise _bad(f"{where}.warnings[{i}]", "expected a line of text")
    out["warnings"] = list(warnings)
    return MappingProxyType(out)
