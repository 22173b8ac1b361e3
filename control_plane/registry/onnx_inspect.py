"""Inspect an ONNX model and compute its reference input/output pair, before it is signed.

This is the operator-side adapter over ``onnx`` and ``onnxruntime`` used by
``edgefleet model push``: it refuses files a node could never run, extracts the I/O
signature and opsets that go into the TUF target's ``custom`` field, and records the
reference pair the node's self-test replays — from a camera-sized frame through the
model bundle's preprocessing when the version carries a runtime spec
(:func:`make_frame_reference`), from given or generated tensors otherwise
(:func:`make_reference`). It decides nothing about releases.
"""

from __future__ import annotations

import hashlib
import io
import zipfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnx.checker
import onnx.defs
import onnx.helper
import onnx.shape_inference
from google.protobuf.message import DecodeError

from control_plane.errors import InvalidInputError, InvalidModelError, PayloadTooLargeError
from control_plane.fsutil import atomic_write
from protos.bundle.preprocess import Preprocessor
from protos.bundle.spec import TensorSig

__all__ = [
    "DEFAULT_MAX_MODEL_BYTES",
    "MIN_OPSET",
    "ModelInfo",
    "ReferencePair",
    "TensorSpec",
    "inspect_model",
    "load_reference",
    "make_frame_reference",
    "make_reference",
    "outputs_match",
    "save_reference",
]

DEFAULT_MAX_MODEL_BYTES = 2 * 1024**3
MIN_OPSET = 7
"""Oldest default-domain opset accepted: older models predate today's broadcasting rules."""

_CHUNK = 1024 * 1024
_UNKNOWN_DIM = "?"
_INPUT_PREFIX = "input/"
_OUTPUT_PREFIX = "output/"
_FRAME_MEMBER = "frame"
# Fixed zip member metadata so the same arrays always give the same .npz bytes
# (np.savez stamps members with the current time).
_ZIP_EPOCH = (1980, 1, 1, 0, 0, 0)
_ZIP_UNIX = 3

_FLOAT_DTYPES = frozenset({"float16", "float32", "float64"})
_INT_DTYPES = frozenset({"int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64"})

Dim = int | str
Shape = tuple[Dim, ...]


@dataclass(frozen=True)
class TensorSpec:
    """One graph input or output.

    ``dtype`` is numpy's name (``"float32"``, ``"int64"``, ``"bool"``, ``"string"``...).
    ``shape`` holds ints for fixed dims, the symbol for symbolic dims (``"batch"``) and
    ``"?"`` for dims of unknown size. The rank is always known: ``onnx.checker``
    requires graph inputs and outputs to declare a shape.
    """

    name: str
    dtype: str
    shape: Shape

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "dtype": self.dtype, "shape": list(self.shape)}

    def to_sig(self) -> TensorSig:
        """As the model bundle's checks see it (what the node sees: numpy names,
        symbolic and unknown dims dynamic)."""
        return TensorSig.of(self.name, self.dtype, self.shape)


@dataclass(frozen=True)
class ModelInfo:
    """What a release records about a model: signature, opsets, provenance and digest."""

    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    opset: dict[str, int]
    """Domain -> version; ``""`` is the default (``ai.onnx``) domain."""
    ir_version: int
    producer: str
    sha256: str
    length: int
    metadata: Mapping[str, str] = field(default_factory=dict)
    """The model's own metadata (``metadata_props``), e.g. ``edgefleet.preprocess``."""

    def to_custom_io(self) -> dict[str, list[dict[str, Any]]]:
        """The JSON-ready I/O signature for the TUF target's ``custom`` field."""
        return {
            "inputs": [spec.to_dict() for spec in self.inputs],
            "outputs": [spec.to_dict() for spec in self.outputs],
        }


@dataclass(frozen=True)
class ReferencePair:
    """Inputs fed to the model and the outputs ONNX Runtime gave, keyed by tensor name.

    ``frame`` is the HxWx3 uint8 RGB image the inputs were made from, for a version with
    a runtime spec: the node preprocesses it itself and must get the same input. None for
    tensors given or generated directly (an old-style pair).
    """

    inputs: dict[str, np.ndarray[Any, Any]]
    outputs: dict[str, np.ndarray[Any, Any]]
    frame: np.ndarray[Any, Any] | None = None


# --------------------------------------------------------------------------- inspection


def inspect_model(path: Path, *, max_bytes: int = DEFAULT_MAX_MODEL_BYTES) -> ModelInfo:
    """Validate the ONNX file at ``path`` and describe it.

    Raises ``InvalidModelError`` for anything a node could not load (not ONNX,
    truncated, fails ``onnx.checker`` with ``full_check``, external data, no inputs
    or outputs, unsupported opset), ``PayloadTooLargeError`` over ``max_bytes`` and
    ``InvalidInputError`` when the path is not a readable file.
    """
    where = str(path)
    try:
        size = path.stat().st_size
    except OSError as exc:
        raise InvalidInputError(f"cannot read model file {where}: {exc}", path=where) from exc
    if not path.is_file():
        raise InvalidInputError(f"model path {where} is not a regular file", path=where)
    if size > max_bytes:
        raise PayloadTooLargeError(
            f"model file is {size} bytes, over the {max_bytes}-byte limit",
            path=where,
            length=size,
            limit=max_bytes,
        )
    sha256, length = _hash_file(path, max_bytes=max_bytes)
    model = _parse_model(path, expected_length=length)
    _refuse_external_data(model, where)
    opset = _opsets(model, where)
    inputs, outputs = _signature(model.graph, where)
    producer = " ".join(p for p in (model.producer_name, model.producer_version) if p)
    ir_version = int(model.ir_version)
    metadata = {p.key: p.value for p in model.metadata_props}
    # The checker loads its own copy from the path (that is what lets it handle big
    # models); do not hold a second one meanwhile.
    del model

    try:
        onnx.checker.check_model(where, full_check=True)
    except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError) as exc:
        raise InvalidModelError(
            f"model fails the ONNX checker: {_one_line(exc)}", path=where, reason=str(exc)
        ) from exc
    return ModelInfo(
        inputs=inputs,
        outputs=outputs,
        opset=opset,
        ir_version=ir_version,
        producer=producer,
        sha256=sha256,
        length=length,
        metadata=metadata,
    )


def _signature(
    graph: onnx.GraphProto, where: str
) -> tuple[tuple[TensorSpec, ...], tuple[TensorSpec, ...]]:
    # Before IR 4 every initializer is also listed as a graph input; those are
    # weights with defaults, not something a node feeds.
    initialized = {t.name for t in graph.initializer} | {
        t.values.name for t in graph.sparse_initializer
    }
    inputs = tuple(
        _tensor_spec(v, "input", where) for v in graph.input if v.name not in initialized
    )
    outputs = tuple(_tensor_spec(v, "output", where) for v in graph.output)
    if not inputs:
        raise InvalidModelError("model has no inputs", path=where)
    if not outputs:
        raise InvalidModelError("model has no outputs", path=where)
    return inputs, outputs


def _hash_file(path: Path, *, max_bytes: int) -> tuple[str, int]:
    digest = hashlib.sha256()
    length = 0
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            length += len(chunk)
            if length > max_bytes:  # the file grew after stat()
                raise PayloadTooLargeError(
                    f"model file is over the {max_bytes}-byte limit",
                    path=str(path),
                    limit=max_bytes,
                )
            digest.update(chunk)
    return digest.hexdigest(), length


def _parse_model(path: Path, *, expected_length: int) -> onnx.ModelProto:
    where = str(path)
    data = path.read_bytes()
    if len(data) != expected_length:
        raise InvalidInputError("model file changed while it was being read", path=where)
    if not data:
        raise InvalidModelError("not an ONNX model: the file is empty", path=where)
    model = onnx.ModelProto()
    try:
        model.ParseFromString(data)
    except DecodeError as exc:
        if _looks_like_onnx(data):
            raise InvalidModelError(
                f"ONNX model is truncated or corrupt: {exc}", path=where
            ) from exc
        raise InvalidModelError(
            "not an ONNX model: the file is not a serialized ModelProto", path=where
        ) from exc
    if not model.HasField("graph"):
        if model.ir_version > 0:
            raise InvalidModelError(
                "ONNX model is truncated or corrupt: it has no graph", path=where
            )
        raise InvalidModelError("not an ONNX model: no IR version and no graph", path=where)
    return model


def _looks_like_onnx(data: bytes) -> bool:
    """True when ``data`` starts like a ModelProto: field 1 (ir_version) as a small varint.

    Every ONNX serializer writes ``ir_version`` first, so a file that starts this way
    but does not parse was most likely cut short or damaged, not some other format.
    """
    return len(data) >= 2 and data[0] == 0x08 and 1 <= data[1] <= 0x7F


def _refuse_external_data(model: onnx.ModelProto, where: str) -> None:
    for tensor in _all_tensors(model):
        if tensor.data_location == onnx.TensorProto.EXTERNAL or tensor.external_data:
            raise InvalidModelError(
                f"tensor {tensor.name!r} keeps its data in an external file; edgefleet "
                "ships one self-contained file: re-save the model with all tensors "
                "inside it (onnx.save_model(..., save_as_external_data=False))",
                path=where,
                tensor=tensor.name,
            )


def _all_tensors(model: onnx.ModelProto) -> Iterator[onnx.TensorProto]:
    yield from _graph_tensors(model.graph)
    for function in model.functions:
        for node in function.node:
            yield from _node_tensors(node)
    for info in model.training_info:
        yield from _graph_tensors(info.initialization)
        yield from _graph_tensors(info.algorithm)


def _graph_tensors(graph: onnx.GraphProto) -> Iterator[onnx.TensorProto]:
    yield from graph.initializer
    for sparse in graph.sparse_initializer:
        yield sparse.values
        yield sparse.indices
    for node in graph.node:
        yield from _node_tensors(node)


def _node_tensors(node: onnx.NodeProto) -> Iterator[onnx.TensorProto]:
    for attr in node.attribute:
        if attr.HasField("t"):
            yield attr.t
        yield from attr.tensors
        if attr.HasField("sparse_tensor"):
            yield attr.sparse_tensor.values
            yield attr.sparse_tensor.indices
        for sparse in attr.sparse_tensors:
            yield sparse.values
            yield sparse.indices
        if attr.HasField("g"):
            yield from _graph_tensors(attr.g)
        for sub in attr.graphs:
            yield from _graph_tensors(sub)


def _opsets(model: onnx.ModelProto, where: str) -> dict[str, int]:
    if not model.opset_import:
        # Serializers write opset_import right after the graph: a file cut exactly at
        # the end of the graph parses cleanly but has none.
        raise InvalidModelError(
            "ONNX model is truncated or corrupt: it imports no opset at all", path=where
        )
    opset: dict[str, int] = {}
    for entry in model.opset_import:
        domain = "" if entry.domain == "ai.onnx" else entry.domain
        opset[domain] = int(entry.version)
    default = opset.get("")
    if default is None:
        raise InvalidModelError("model imports no default-domain (ai.onnx) opset", path=where)
    newest = onnx.defs.onnx_opset_version()
    if default < MIN_OPSET:
        raise InvalidModelError(
            f"model uses opset {default}; the oldest supported is {MIN_OPSET}: "
            "convert it with onnx.version_converter",
            path=where,
            opset=default,
            minimum=MIN_OPSET,
        )
    if default > newest:
        raise InvalidModelError(
            f"model uses opset {default}, newer than this onnx {onnx.__version__} "
            f"supports ({newest}): upgrade onnx or export with an older opset",
            path=where,
            opset=default,
            maximum=newest,
        )
    return dict(sorted(opset.items()))


def _tensor_spec(value: onnx.ValueInfoProto, role: str, where: str) -> TensorSpec:
    kind = value.type.WhichOneof("value")
    if kind != "tensor_type":
        raise InvalidModelError(
            f"{role} {value.name!r} is a {kind or 'untyped value'}, not a tensor; "
            "only tensor inputs and outputs are supported",
            path=where,
            tensor=value.name,
        )
    tensor_type = value.type.tensor_type
    dtype = _dtype_name(tensor_type.elem_type)
    if dtype is None:
        raise InvalidModelError(
            f"{role} {value.name!r} has no element type", path=where, tensor=value.name
        )
    if not tensor_type.HasField("shape"):  # the checker refuses this; be sure anyway
        raise InvalidModelError(
            f"{role} {value.name!r} declares no shape", path=where, tensor=value.name
        )
    return TensorSpec(
        name=value.name, dtype=dtype, shape=tuple(_dim(d) for d in tensor_type.shape.dim)
    )


def _dim(dim: onnx.TensorShapeProto.Dimension) -> Dim:
    which = dim.WhichOneof("value")
    # Some exporters (PaddlePaddle's, e.g. PP-OCR) write a dynamic dimension as -1.
    if which == "dim_value" and dim.dim_value >= 0:
        return int(dim.dim_value)
    if which == "dim_param" and dim.dim_param:
        return str(dim.dim_param)
    return _UNKNOWN_DIM


def _dtype_name(elem_type: int) -> str | None:
    if elem_type == onnx.TensorProto.UNDEFINED:
        return None
    if elem_type == onnx.TensorProto.STRING:
        return "string"
    try:
        return str(onnx.helper.tensor_dtype_to_np_dtype(elem_type).name)
    except (KeyError, ValueError):
        return onnx.TensorProto.DataType.Name(elem_type).lower()


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())


# ------------------------------------------------------------------ reference pair


def make_reference(
    path: Path,
    info: ModelInfo,
    *,
    reference_input: Path | None = None,
    seed: int = 0,
) -> ReferencePair:
    """Run the model once on CPU and record what it answered.

    The inputs come from ``reference_input`` (``.npy`` for single-input models, ``.npz``
    keyed by input name) or are generated from ``numpy.random.default_rng(seed)``:
    floats uniform in [0, 1), integers in [0, 10), booleans. A dynamic leading (batch)
    dim becomes 1, one frame per run as nodes run it; any other dynamic dim is refused
    (a generated 1x3x1x1 image would make a self-test that proves nothing): such a model
    needs a runtime spec (:func:`make_frame_reference`) or ``reference_input``. Raises
    ``InvalidInputError`` for an input file that does not fit the model and
    ``InvalidModelError`` when ONNX Runtime cannot load or run the model.
    """
    if reference_input is None:
        inputs = _generate_inputs(info.inputs, seed)
    else:
        inputs = _load_inputs(reference_input, info.inputs)
    outputs = _run(path, inputs)
    return ReferencePair(inputs=inputs, outputs=outputs)


def make_frame_reference(
    path: Path,
    info: ModelInfo,
    frame: np.ndarray[Any, Any],
    preprocessor: Preprocessor,
) -> ReferencePair:
    """The reference pair of a version with a runtime spec: ``frame`` (HxWx3 uint8 RGB)
    through ``preprocessor`` (the signed config, resolved against the model) and the
    model's outputs on that tensor, with the frame itself recorded beside them."""
    if len(info.inputs) != 1:
        raise InvalidInputError(
            f"a runtime spec feeds one image input; the model has {len(info.inputs)}",
            field="runtime.preprocess",
        )
    spec = info.inputs[0]
    tensor = preprocessor(frame)
    _check_input(tensor, spec, {}, "the preprocessed reference frame")
    outputs = _run(path, {spec.name: tensor})
    return ReferencePair(
        inputs={spec.name: tensor}, outputs=outputs, frame=np.ascontiguousarray(frame)
    )


def _generate_inputs(specs: tuple[TensorSpec, ...], seed: int) -> dict[str, np.ndarray[Any, Any]]:
    rng = np.random.default_rng(seed)
    inputs: dict[str, np.ndarray[Any, Any]] = {}
    for spec in specs:
        dynamic = [i for i, d in enumerate(spec.shape) if not (isinstance(d, int) and d > 0)]
        if any(i > 0 for i in dynamic):
            raise InvalidInputError(
                f"input {spec.name!r} has dynamic dimensions {list(spec.shape)}: a generated "
                "reference would fill them with 1 (a 1x1 image), and a self-test on that "
                "proves nothing. Push with --runtime FILE (the reference is then a "
                "camera-sized frame through the signed preprocessing, at preprocess.size) "
                "or give a real input with --reference-input",
                field="reference_input",
                tensor=spec.name,
                shape=[str(d) for d in spec.shape],
            )
        shape = tuple(d if isinstance(d, int) and d > 0 else 1 for d in spec.shape)
        if spec.dtype in _FLOAT_DTYPES:
            inputs[spec.name] = rng.random(shape).astype(spec.dtype)
        elif spec.dtype in _INT_DTYPES:
            inputs[spec.name] = rng.integers(0, 10, size=shape).astype(spec.dtype)
        elif spec.dtype == "bool":
            inputs[spec.name] = rng.integers(0, 2, size=shape).astype(np.bool_)
        else:
            raise InvalidInputError(
                f"cannot generate a reference value for input {spec.name!r} of type "
                f"{spec.dtype}: give one with --reference-input",
                tensor=spec.name,
                dtype=spec.dtype,
            )
    return inputs


def _load_inputs(source: Path, specs: tuple[TensorSpec, ...]) -> dict[str, np.ndarray[Any, Any]]:
    where = str(source)
    suffix = source.suffix.lower()
    try:
        if suffix == ".npy":
            if len(specs) != 1:
                raise InvalidInputError(
                    f"the model has {len(specs)} inputs; a .npy holds one: give a .npz "
                    f"keyed by input name ({', '.join(s.name for s in specs)})",
                    path=where,
                )
            array = np.load(source, allow_pickle=False)
            if not isinstance(array, np.ndarray):
                raise InvalidInputError(f"{where} is not a .npy array file", path=where)
            inputs = {specs[0].name: array}
        elif suffix == ".npz":
            with np.load(source, allow_pickle=False) as archive:
                if not isinstance(archive, np.lib.npyio.NpzFile):
                    raise InvalidInputError(f"{where} is not a .npz archive", path=where)
                inputs = {key: archive[key] for key in archive.files}
        else:
            raise InvalidInputError(
                f"reference input must be a .npy or .npz file, got {source.name!r}", path=where
            )
    except InvalidInputError:
        raise
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as exc:
        raise InvalidInputError(f"cannot read reference input {where}: {exc}", path=where) from exc

    expected = [s.name for s in specs]
    missing = [n for n in expected if n not in inputs]
    extra = sorted(n for n in inputs if n not in expected)
    if missing or extra:
        raise InvalidInputError(
            f"reference input names do not match the model's inputs {expected}: "
            f"missing {missing}, unexpected {extra}",
            path=where,
            missing=missing,
            unexpected=extra,
        )
    bound: dict[str, int] = {}
    for spec in specs:
        _check_input(inputs[spec.name], spec, bound, where)
    return {spec.name: inputs[spec.name] for spec in specs}


def _check_input(
    array: np.ndarray[Any, Any], spec: TensorSpec, bound: dict[str, int], where: str
) -> None:
    dtype_ok = array.dtype.kind == "U" if spec.dtype == "string" else array.dtype.name == spec.dtype
    if not dtype_ok:
        raise InvalidInputError(
            f"reference input {spec.name!r} has dtype {array.dtype.name}, "
            f"the model expects {spec.dtype}",
            path=where,
            tensor=spec.name,
        )
    declared = spec.shape
    mismatch = len(array.shape) != len(declared)
    for size, dim in zip(array.shape, declared, strict=False):
        if isinstance(dim, int):
            mismatch = mismatch or size != dim
        elif dim != _UNKNOWN_DIM:
            # A symbol names one size for the whole call: "batch" is the same everywhere.
            mismatch = mismatch or bound.setdefault(dim, size) != size
    if mismatch:
        raise InvalidInputError(
            f"reference input {spec.name!r} has shape {list(array.shape)}, "
            f"the model expects {list(declared)}",
            path=where,
            tensor=spec.name,
        )


def _run(path: Path, inputs: Mapping[str, np.ndarray[Any, Any]]) -> dict[str, np.ndarray[Any, Any]]:
    import onnxruntime as ort

    options = ort.SessionOptions()
    # One thread each: the reference is computed once, and the same settings on
    # every machine keep the recorded numbers as reproducible as ORT allows.
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    options.log_severity_level = 3
    # ORT raises its own exception classes (plus ValueError/RuntimeError from the
    # Python wrapper); none share a base below Exception, so translate them all here.
    try:
        session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    except Exception as exc:
        raise InvalidModelError(
            f"ONNX Runtime cannot load the model: {_one_line(exc)}", path=str(path)
        ) from exc
    names = [o.name for o in session.get_outputs()]
    try:
        results = session.run(names, dict(inputs))
    except Exception as exc:
        raise InvalidModelError(
            f"ONNX Runtime failed to run the model on the reference input: {_one_line(exc)}",
            path=str(path),
        ) from exc
    outputs: dict[str, np.ndarray[Any, Any]] = {}
    for name, value in zip(names, results, strict=True):
        if not isinstance(value, np.ndarray):
            raise InvalidModelError(
                f"output {name!r} is a {type(value).__name__}, not a tensor", path=str(path)
            )
        outputs[name] = value
    return outputs


def save_reference(pair: ReferencePair, path: Path) -> tuple[str, int]:
    """Write ``pair`` as an uncompressed ``.npz`` atomically; return (sha256, length).

    Keys are ``input/<name>``, ``output/<name>`` and, for a pair made from a frame,
    ``frame``. The same arrays always give the same bytes (sorted members, fixed
    timestamps), so the digest can be signed.
    """
    members = {f"{_INPUT_PREFIX}{k}": v for k, v in pair.inputs.items()}
    members.update({f"{_OUTPUT_PREFIX}{k}": v for k, v in pair.outputs.items()})
    if pair.frame is not None:
        members[_FRAME_MEMBER] = pair.frame
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_STORED, allowZip64=True) as zf:
        for key in sorted(members):
            member = zipfile.ZipInfo(f"{key}.npy", date_time=_ZIP_EPOCH)
            member.compress_type = zipfile.ZIP_STORED
            member.create_system = _ZIP_UNIX
            member.external_attr = 0o644 << 16
            with zf.open(member, "w", force_zip64=True) as fid:
                np.lib.format.write_array(fid, np.asanyarray(members[key]), allow_pickle=False)
    data = buffer.getvalue()
    atomic_write(path, data, mode=0o644)
    return hashlib.sha256(data).hexdigest(), len(data)


def load_reference(path: Path) -> ReferencePair:
    """Read a pair written by ``save_reference`` (never unpickles)."""
    where = str(path)
    inputs: dict[str, np.ndarray[Any, Any]] = {}
    outputs: dict[str, np.ndarray[Any, Any]] = {}
    frame: np.ndarray[Any, Any] | None = None
    try:
        with np.load(path, allow_pickle=False) as archive:
            if not isinstance(archive, np.lib.npyio.NpzFile):
                raise InvalidInputError(f"{where} is not a .npz archive", path=where)
            for key in archive.files:
                if key.startswith(_INPUT_PREFIX):
                    inputs[key.removeprefix(_INPUT_PREFIX)] = archive[key]
                elif key.startswith(_OUTPUT_PREFIX):
                    outputs[key.removeprefix(_OUTPUT_PREFIX)] = archive[key]
                elif key == _FRAME_MEMBER:
                    frame = archive[key]
                else:
                    raise InvalidInputError(
                        f"unexpected member {key!r} in reference pair {where}", path=where
                    )
    except InvalidInputError:
        raise
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as exc:
        raise InvalidInputError(f"cannot read reference pair {where}: {exc}", path=where) from exc
    return ReferencePair(inputs=inputs, outputs=outputs, frame=frame)


# -------------------------------------------------------------------- comparison


def outputs_match(
    expected: Mapping[str, np.ndarray[Any, Any]],
    actual: Mapping[str, np.ndarray[Any, Any]],
    atol: float,
    rtol: float,
) -> tuple[bool, str]:
    """Compare outputs as ``numpy.isclose`` does: ``|actual - expected| <= atol + rtol*|expected|``.

    NaN matches NaN and an infinity matches the same infinity; non-numeric tensors
    (bool, string) must be equal. Names, shapes and dtypes must agree exactly. Returns
    (ok, message); the message gives the largest absolute and relative errors.
    """
    if not (atol >= 0 and rtol >= 0):
        raise ValueError(f"tolerances must be non-negative, got atol={atol}, rtol={rtol}")
    problems: list[str] = []
    missing = sorted(set(expected) - set(actual))
    extra = sorted(set(actual) - set(expected))
    if missing:
        problems.append(f"missing outputs {missing}")
    if extra:
        problems.append(f"unexpected outputs {extra}")
    worst_abs = 0.0
    worst_rel = 0.0
    for name in expected:
        if name not in actual:
            continue
        want = np.asarray(expected[name])
        got = np.asarray(actual[name])
        if want.dtype != got.dtype:
            problems.append(f"output {name!r} has dtype {got.dtype}, expected {want.dtype}")
            continue
        if want.shape != got.shape:
            problems.append(
                f"output {name!r} has shape {list(got.shape)}, expected {list(want.shape)}"
            )
            continue
        if want.dtype.kind not in "fiu":
            differing = int(np.count_nonzero(want != got))
            if differing:
                problems.append(f"output {name!r}: {differing} of {want.size} elements differ")
            continue
        abs_err, rel_err, differing = _errors(want, got, atol, rtol)
        worst_abs = max(worst_abs, abs_err)
        worst_rel = max(worst_rel, rel_err)
        if differing:
            problems.append(
                f"output {name!r}: {differing} of {want.size} elements outside tolerance "
                f"(max abs err {abs_err:.3g}, max rel err {rel_err:.3g})"
            )
    tolerance = f"atol={atol:g}, rtol={rtol:g}"
    if problems:
        return False, f"outputs differ ({tolerance}): " + "; ".join(problems)
    return True, (
        f"{len(expected)} output(s) match ({tolerance}; "
        f"max abs err {worst_abs:.3g}, max rel err {worst_rel:.3g})"
    )


def _errors(
    want: np.ndarray[Any, Any], got: np.ndarray[Any, Any], atol: float, rtol: float
) -> tuple[float, float, int]:
    """Largest absolute and relative error, and how many elements are out of tolerance."""
    if want.size == 0:
        return 0.0, 0.0, 0
    e = want.astype(np.float64)
    a = got.astype(np.float64)
    close = np.isclose(a, e, rtol=rtol, atol=atol, equal_nan=True)
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        diff = np.abs(a - e)
        same = (a == e) | (np.isnan(a) & np.isnan(e))
        diff = np.where(same, 0.0, diff)
        diff = np.where(np.isnan(diff), np.inf, diff)  # NaN on one side only
        scale = np.abs(e)
        # Relative error only where the expected value is non-zero; zeros are judged by atol.
        rel = np.where(scale > 0, diff / np.where(scale > 0, scale, 1.0), 0.0)
    return float(diff.max()), float(rel.max()), int(close.size - np.count_nonzero(close))
