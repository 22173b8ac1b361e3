from __future__ import annotations

import copy
from typing import Any

import pytest
from securesystemslib.formats import encode_canonical

from control_plane.errors import InvalidInputError
from control_plane.trust.custom import (
    FloorCustom,
    TargetPath,
    floor_target_path,
    model_target_path,
    parse_floor_custom,
    parse_model_custom,
    parse_target_path,
    reference_target_path,
    runtime_summary,
)

SHA = "ab" * 32


def example() -> dict[str, Any]:
    return {
        "edgefleet": 1,
        "kind": "model",
        "model": "detector",
        "version": "1.2.0",
        "release_counter": 3,
        "io": {
            "inputs": [{"name": "x", "dtype": "float32", "shape": [1, 3, 64, "N"]}],
            "outputs": [{"name": "y", "dtype": "float32", "shape": ["N", 10]}],
        },
        "opset": {"": 17, "ai.onnx.ml": 3},
        "min_agent_version": "0.1.0",
        "compat": {"execution_providers": ["CPUExecutionProvider"], "arch": ["x86_64", "aarch64"]},
        "reference": {
            "path": "models/detector/1.2.0/reference.npz",
            "sha256": SHA,
            "length": 1234,
            "atol": "0.0001",
            "rtol": "0.001",
        },
    }


def test_example_parses_and_round_trips() -> None:
    custom = parse_model_custom(example())
    assert custom.model == "detector"
    assert custom.version == "1.2.0"
    assert custom.release_counter == 3
    assert custom.io.inputs[0].shape == (1, 3, 64, "N")
    assert dict(custom.opset) == {"": 17, "ai.onnx.ml": 3}
    assert custom.compat.arch == ("x86_64", "aarch64")
    assert custom.reference.atol == pytest.approx(1e-4)
    assert custom.target_path == "models/detector/1.2.0/model.onnx"
    assert parse_model_custom(custom.to_dict()) == custom
    assert hash(parse_model_custom(custom.to_dict())) == hash(custom)


def test_to_dict_is_canonical_json_encodable() -> None:
    # TUF signs canonical JSON, which has no floats: tolerances travel as strings.
    data = parse_model_custom(example()).to_dict()
    assert data["reference"]["atol"] == "0.0001"
    assert encode_canonical(data) is not None


def test_numeric_tolerances_are_accepted() -> None:
    data = example()
    data["reference"]["atol"] = 1e-4
    data["reference"]["rtol"] = 0
    custom = parse_model_custom(data)
    assert custom.reference.atol == pytest.approx(1e-4)
    assert custom.reference.rtol == 0.0


def test_unknown_fields_are_ignored() -> None:
    data = example()
    data["future_field"] = {"anything": [1, 2]}
    data["io"]["inputs"][0]["layout"] = "NCHW"
    data["reference"]["note"] = "x"
    assert parse_model_custom(data) == parse_model_custom(example())


def test_opset_is_read_only() -> None:
    custom = parse_model_custom(example())
    with pytest.raises(TypeError):
        custom.opset[""] = 1  # type: ignore[index]


def _set(data: dict[str, Any], dotted: str, value: Any) -> None:
    *parents, last = dotted.split(".")
    node: Any = data
    for part in parents:
        node = node[int(part)] if isinstance(node, list) else node[part]
    if value is _DELETE:
        del node[last]
    elif isinstance(node, list):
        node[int(last)] = value
    else:
        node[last] = value


_DELETE = object()


@pytest.mark.parametrize(
    ("dotted", "value", "field"),
    [
        ("edgefleet", 2, "custom.edgefleet"),
        ("edgefleet", True, "custom.edgefleet"),
        ("edgefleet", _DELETE, "custom.edgefleet"),
        ("kind", "floor", "custom.kind"),
        ("model", "Detector", "custom.model"),
        ("model", "-x", "custom.model"),
        ("model", "a" * 129, "custom.model"),
        ("version", "", "custom.version"),
        ("version", "1.0/evil", "custom.version"),
        ("release_counter", 0, "custom.release_counter"),
        ("release_counter", "3", "custom.release_counter"),
        ("release_counter", True, "custom.release_counter"),
        ("release_counter", _DELETE, "custom.release_counter"),
        ("io", [], "custom.io"),
        ("io.inputs", [], "custom.io.inputs"),
        ("io.outputs", _DELETE, "custom.io.outputs"),
        ("io.inputs.0.dtype", "float33", "custom.io.inputs[0].dtype"),
        ("io.inputs.0.name", "", "custom.io.inputs[0].name"),
        ("io.inputs.0.shape", "1x3", "custom.io.inputs[0].shape"),
        ("io.inputs.0.shape", [1, -1], "custom.io.inputs[0].shape[1]"),
        ("io.inputs.0.shape", [1, True], "custom.io.inputs[0].shape[1]"),
        ("io.inputs.0.shape", [1, 2.0], "custom.io.inputs[0].shape[1]"),
        ("io.inputs.0.shape", [1, ""], "custom.io.inputs[0].shape[1]"),
        ("opset", {}, "custom.opset"),
        ("opset", {"": 0}, "custom.opset['']"),
        ("opset", {"": "17"}, "custom.opset['']"),
        ("min_agent_version", "latest", "custom.min_agent_version"),
        ("compat.arch", [], "custom.compat.arch"),
        ("compat.execution_providers", ["CPU", "CPU"], "custom.compat.execution_providers"),
        ("compat.execution_providers", [""], "custom.compat.execution_providers[0]"),
        ("reference", _DELETE, "custom.reference"),
        ("reference.path", "../../etc/passwd", "custom.reference.path"),
        ("reference.path", "models/detector/1.2.0/model.onnx", "custom.reference.path"),
        ("reference.sha256", "AB" * 32, "custom.reference.sha256"),
        ("reference.sha256", "ab", "custom.reference.sha256"),
        ("reference.length", -1, "custom.reference.length"),
        ("reference.atol", "-1", "custom.reference.atol"),
        ("reference.atol", "nan", "custom.reference.atol"),
        ("reference.atol", "inf", "custom.reference.atol"),
        ("reference.rtol", "x", "custom.reference.rtol"),
        ("reference.rtol", None, "custom.reference.rtol"),
    ],
)
def test_bad_field_is_named(dotted: str, value: Any, field: str) -> None:
    data = copy.deepcopy(example())
    _set(data, dotted, value)
    with pytest.raises(InvalidInputError) as info:
        parse_model_custom(data)
    assert info.value.fields["field"] == field
    assert field in str(info.value)


def test_duplicate_tensor_names_refused() -> None:
    data = example()
    data["io"]["inputs"].append(dict(data["io"]["inputs"][0]))
    with pytest.raises(InvalidInputError, match="duplicate tensor names"):
        parse_model_custom(data)


@pytest.mark.parametrize("value", [None, [], "model", 3])
def test_not_an_object(value: object) -> None:
    with pytest.raises(InvalidInputError, match="expected an object"):
        parse_model_custom(value)


def test_floor_custom() -> None:
    floor = parse_floor_custom({"edgefleet": 1, "kind": "floor", "model": "detector", "floor": 4})
    assert floor == FloorCustom(model="detector", floor=4)
    assert floor.target_path == "floors/detector.json"
    assert parse_floor_custom({**floor.to_dict(), "reason": "CVE"}) == floor


@pytest.mark.parametrize(
    ("data", "field"),
    [
        ({"edgefleet": 1, "kind": "model", "model": "d", "floor": 4}, "custom.kind"),
        ({"edgefleet": 1, "kind": "floor", "model": "d", "floor": 0}, "custom.floor"),
        ({"edgefleet": 1, "kind": "floor", "model": "d", "floor": 1.5}, "custom.floor"),
        ({"edgefleet": 1, "kind": "floor", "model": "D", "floor": 4}, "custom.model"),
        ({"edgefleet": 1, "kind": "floor", "model": "d"}, "custom.floor"),
    ],
)
def test_bad_floor_custom(data: dict[str, Any], field: str) -> None:
    with pytest.raises(InvalidInputError) as info:
        parse_floor_custom(data)
    assert info.value.fields["field"] == field


def test_paths() -> None:
    assert model_target_path("detector", "1.2.0") == "models/detector/1.2.0/model.onnx"
    assert reference_target_path("detector", "1.2.0") == "models/detector/1.2.0/reference.npz"
    assert floor_target_path("detector") == "floors/detector.json"
    assert parse_target_path("models/detector/1.2.0/model.onnx") == TargetPath(
        "model", "detector", "1.2.0"
    )
    assert parse_target_path("models/detector/1.2.0/reference.npz") == TargetPath(
        "reference", "detector", "1.2.0"
    )
    assert parse_target_path("floors/detector.json") == TargetPath("floor", "detector")
    for other in [
        "models/detector/1.2.0/other.bin",
        "models/../1.2.0/model.onnx",
        "models/detector/../model.onnx",
        "models/detector/1.2.0/x/model.onnx",
        "floors/Detector.json",
        "floors/a/b.json",
        "readme.txt",
    ]:
        assert parse_target_path(other) is None, other


@pytest.mark.parametrize(
    ("model", "version"),
    [("Detector", "1"), ("det/x", "1"), ("", "1"), ("d", ".1"), ("d", "1/2"), ("d", "1" * 65)],
)
def test_path_helpers_validate(model: str, version: str) -> None:
    with pytest.raises(InvalidInputError):
        model_target_path(model, version)


# ------------------------------------------------------------------- custom.runtime


def runtime_example() -> dict[str, Any]:
    """A signed runtime spec that fits example()'s x [1, 3, 64, N] -> y [N, 10]."""
    return {
        "format": 1,
        "preprocess": {
            "layout": "NCHW",
            "size": [64, 96],
            "mean": ["0.485", "0.456", "0.406"],
            "std": ["0.229", "0.224", "0.225"],
            "scale": "0.00392156862745098",
            "dtype": "float32",
        },
        "output": {"decoder": "classification", "top_k": 3, "score_threshold": "0.2"},
        "labels": [f"class-{i}" for i in range(10)],
    }


def with_runtime(runtime: Any) -> dict[str, Any]:
    data = example()
    data["runtime"] = runtime
    return data


def test_a_version_without_runtime_has_none_and_writes_none() -> None:
    custom = parse_model_custom(example())
    assert custom.runtime is None
    assert "runtime" not in custom.to_dict()
    assert parse_model_custom(with_runtime(None)).runtime is None


def test_runtime_parses_round_trips_and_stays_canonical() -> None:
    custom = parse_model_custom(with_runtime(runtime_example()))
    assert custom.runtime is not None
    assert custom.runtime.preprocess.size == (64, 96)
    assert custom.runtime.preprocess.mean == pytest.approx((0.485, 0.456, 0.406))
    assert custom.runtime.output.decoder == "classification"
    assert len(custom.runtime.labels) == 10
    data = custom.to_dict()
    # What is signed is the bundle's canonical form: reals as decimal strings.
    assert data["runtime"] == custom.runtime.to_signed()
    assert data["runtime"]["preprocess"]["mean"] == ["0.485", "0.456", "0.406"]
    assert data["runtime"]["output"]["score_threshold"] == "0.2"
    assert encode_canonical(data) is not None
    assert parse_model_custom(data) == custom
    assert hash(parse_model_custom(data)) == hash(custom)


def test_runtime_summary_names_preprocess_decoder_and_labels() -> None:
    custom = parse_model_custom(with_runtime(runtime_example()))
    assert custom.runtime is not None
    summary = runtime_summary(custom.runtime, labels_shown=3)
    assert summary["preprocess"]["size"] == [64, 96]
    assert summary["preprocess"]["mean"] == pytest.approx([0.485, 0.456, 0.406])
    assert summary["decoder"] == "classification"
    assert summary["params"] == {"top_k": 3, "softmax": False, "score_threshold": 0.2}
    assert summary["labels"] == 10
    assert summary["first_labels"] == ["class-0", "class-1", "class-2"]


@pytest.mark.parametrize(
    ("dotted", "value", "field", "shown"),
    [
        # refused by the bundle's parser
        ("output.decoder", "ssd", "custom.runtime.output.decoder", "ssd"),
        ("output.iou_threshold", "0.5", "custom.runtime.output.iou_threshold", "unknown"),
        ("preprocess.meen", [0.5], "custom.runtime.preprocess.meen", "unknown"),
        ("preprocess.std", ["0"], "custom.runtime.preprocess.std", "> 0"),
        ("format", 2, "custom.runtime.format", "format 2"),
        ("output", _DELETE, "custom.runtime.output", "required"),
        # parsed, but every node would refuse it on this model's signature
        ("preprocess.size", [32, 96], "custom.runtime.preprocess.size", "the model has 64"),
        ("preprocess.size", None, "custom.runtime.preprocess.size", "dynamic"),
        ("preprocess.layout", "NHWC", "custom.runtime.preprocess.layout", "NCHW"),
        ("preprocess.dtype", "float16", "custom.runtime.preprocess.dtype", "float32"),
        ("labels", ["a", "b"], "custom.runtime.labels", "10 classes"),
        ("output.output", "z", "custom.runtime.output.output", "'y'"),
    ],
)
def test_bad_runtime_is_refused_naming_the_field(
    dotted: str, value: Any, field: str, shown: str
) -> None:
    runtime = runtime_example()
    _set(runtime, dotted, value)
    with pytest.raises(InvalidInputError) as info:
        parse_model_custom(with_runtime(runtime))
    assert info.value.fields["field"] == field
    message = str(info.value)
    # "custom.runtime.preprocess.size: ..." or "custom.runtime.preprocess: unknown key(s) meen"
    assert message.startswith(field) or message.startswith(field.rpartition(".")[0] + ": ")
    assert field.rpartition(".")[2] in message
    assert shown in message


def test_a_contradiction_carries_both_sides() -> None:
    runtime = runtime_example()
    runtime["preprocess"]["size"] = [32, 96]
    with pytest.raises(InvalidInputError) as info:
        parse_model_custom(with_runtime(runtime))
    assert info.value.fields["model"] == "64"
    assert info.value.fields["config"] == "size [32, 96]"


@pytest.mark.parametrize("value", ["NCHW", [], 3])
def test_runtime_that_is_not_a_mapping_is_refused(value: object) -> None:
    with pytest.raises(InvalidInputError) as info:
        parse_model_custom(with_runtime(value))
    assert info.value.fields["field"] == "custom.runtime"
