"""The runtime spec: the operator's YAML and the signed form, every refusal naming its field,
and the checks against a model's input and output signatures."""

from __future__ import annotations

import json
from typing import Any

import pytest
import yaml

from protos.bundle.spec import (
    MAX_LABEL_CHARS,
    MAX_LABELS,
    PREPROCESS_METADATA_KEY,
    BundleError,
    OutputSpec,
    PreprocessConfig,
    RuntimeSpec,
    TensorSig,
    box_layout,
    check_declared_preprocess,
    check_outputs,
    parse_runtime_spec,
    resolve_input,
    runtime_of_custom,
    yolox_candidates,
)

OPERATOR_YAML = """
preprocess:
  layout: NCHW
  size: [480, 640]
  fit: letterbox
  pad_value: 0
  resize: nearest
  mean: [0.485, 0.456, 0.406]
  std: [0.229, 0.224, 0.225]
  scale: 0.00392156862745098
  channel_order: BGR
output:
  decoder: yolo
  score_threshold: 0.3
  iou_threshold: 0.5
  max_detections: 50
  box_format: xyxy
  objectness: true
labels: [person, car]
"""


def bundle_error(raw: object, where: str = "runtime") -> BundleError:
    with pytest.raises(BundleError) as caught:
        parse_runtime_spec(raw, where=where)
    return caught.value


def test_the_operator_yaml_form_parses_to_what_it_says() -> None:
    spec = parse_runtime_spec(yaml.safe_load(OPERATOR_YAML))

    assert spec.preprocess == PreprocessConfig(
        layout="NCHW",
        size=(480, 640),
        fit="letterbox",
        pad_value=0,
        resize="nearest",
        mean=(0.485, 0.456, 0.406),
        std=(0.229, 0.224, 0.225),
        scale=1 / 255,
        channel_order="BGR",
    )
    assert spec.output == OutputSpec(
        decoder="yolo",
        score_threshold=0.3,
        iou_threshold=0.5,
        max_detections=50,
        box_format="xyxy",
        objectness=True,
    )
    assert spec.labels == ("person", "car")
    assert spec.label(1) == "car"
    assert spec.label(7) == "class_7"


def _floats(value: object) -> list[object]:
    if isinstance(value, dict):
        return [f for v in value.values() for f in _floats(v)]
    if isinstance(value, list):
        return [f for v in value for f in _floats(v)]
    return [value] if isinstance(value, float) else []


@pytest.mark.parametrize(
    "spec",
    [
        RuntimeSpec(),
        parse_runtime_spec(yaml.safe_load(OPERATOR_YAML)),
        RuntimeSpec(
            PreprocessConfig(size=(224, 224), mean=(0.5,), std=(0.25,)),
            OutputSpec(decoder="classification", top_k=3, softmax=True, score_threshold=0.1),
            labels=("cat", "dog", "bird"),
        ),
        RuntimeSpec(
            PreprocessConfig(size=(416, 416), fit="letterbox", scale=1.0, dtype="float16"),
            OutputSpec(decoder="yolox", strides=(8, 16, 32, 64), score_threshold=0.05),
        ),
        RuntimeSpec(
            PreprocessConfig(layout="NHWC", dtype="uint8", scale=1, mean=(0,), std=(1,)),
            OutputSpec(decoder="raw", output="maps", threshold=0.3),
        ),
    ],
)
def test_the_signed_form_round_trips_through_canonical_json(spec: RuntimeSpec) -> None:
    signed = spec.to_signed()

    assert _floats(signed) == []  # canonical JSON has no floats (ADR 0006)
    assert parse_runtime_spec(signed) == spec
    assert parse_runtime_spec(json.loads(json.dumps(signed)), where="custom.runtime") == spec


def test_the_signed_form_carries_only_the_decoders_own_parameters() -> None:
    signed = OutputSpec(decoder="classification", top_k=2).to_signed()
    assert set(signed) == {"decoder", "top_k", "softmax", "score_threshold"}


def test_a_square_size_and_decimal_strings_are_accepted() -> None:
    spec = parse_runtime_spec(
        {"preprocess": {"size": 416, "scale": "0.5", "mean": "0.25"}, "output": {"decoder": "raw"}}
    )
    assert spec.preprocess.size == (416, 416)
    assert spec.preprocess.scale == 0.5
    assert spec.preprocess.mean == (0.25,)


@pytest.mark.parametrize(
    ("raw", "field"),
    [
        ({"preprocess": {"meen": [0.5]}, "output": {"decoder": "raw"}}, "runtime.preprocess.meen"),
        ({"output": {"decoder": "raw", "treshold": 1}}, "runtime.output.treshold"),
        ({"output": {"decoder": "raw"}, "labelz": []}, "runtime.labelz"),
        ({"preprocess": {"mean": "half"}, "output": {"decoder": "raw"}}, "runtime.preprocess.mean"),
        ({"preprocess": {"mean": [1, 2]}, "output": {"decoder": "raw"}}, "runtime.preprocess.mean"),
        (
            {"preprocess": {"scale": "nan"}, "output": {"decoder": "raw"}},
            "runtime.preprocess.scale",
        ),
        (
            {"preprocess": {"size": [1, 2, 3]}, "output": {"decoder": "raw"}},
            "runtime.preprocess.size",
        ),
        (
            {"preprocess": {"size": [0, 64]}, "output": {"decoder": "raw"}},
            "runtime.preprocess.size",
        ),
        (
            {"preprocess": {"layout": "CHW"}, "output": {"decoder": "raw"}},
            "runtime.preprocess.layout",
        ),
        ({"preprocess": {"fit": "crop"}, "output": {"decoder": "raw"}}, "runtime.preprocess.fit"),
        (
            {"preprocess": {"pad_value": 256}, "output": {"decoder": "raw"}},
            "runtime.preprocess.pad_value",
        ),
        (
            {"preprocess": {"pad_value": 1.5}, "output": {"decoder": "raw"}},
            "runtime.preprocess.pad_value",
        ),
        (
            {"preprocess": {"dtype": "uint8"}, "output": {"decoder": "raw"}},
            "runtime.preprocess.dtype",
        ),
        ({"preprocess": [], "output": {"decoder": "raw"}}, "runtime.preprocess"),
        ({"output": {"decoder": "classification", "top_k": "5"}}, "runtime.output.top_k"),
        ({"output": {"decoder": "classification", "top_k": 0}}, "runtime.output.top_k"),
        ({"output": {"decoder": "classification", "softmax": "yes"}}, "runtime.output.softmax"),
        ({"output": {"decoder": "yolo", "iou_threshold": 1.5}}, "runtime.output.iou_threshold"),
        ({"output": {"decoder": "yolo", "box_format": "xywh"}}, "runtime.output.box_format"),
        ({"output": {"decoder": "yolox", "strides": [8, 8]}}, "runtime.output.strides"),
        ({"output": {"decoder": "yolox", "strides": "8"}}, "runtime.output.strides"),
        ({"output": {"decoder": "ssd"}}, "runtime.output.decoder"),
        ({"output": {}}, "runtime.output.decoder"),
        ({"preprocess": {}}, "runtime.output"),
        ({"format": 2, "output": {"decoder": "raw"}}, "runtime.format"),
        ({"output": {"decoder": "classification"}, "labels": "cat"}, "runtime.labels"),
        ({"output": {"decoder": "classification"}, "labels": [1]}, "runtime.labels[0]"),
        ({"output": {"decoder": "raw"}, "labels": ["cat"]}, "runtime.labels"),
        ({"outputs": {"decoder": "raw"}}, "runtime.outputs"),
    ],
)
def test_every_refusal_names_the_field(raw: dict[str, Any], field: str) -> None:
    error = bundle_error(raw)
    assert error.field == field
    assert str(error).startswith(field.rsplit(".", 1)[0])


def test_a_nested_field_is_named_where_it_sits() -> None:
    """A value the dataclass refuses is named by its full path, like a type error is."""
    error = bundle_error(
        {"preprocess": {"size": [0, 64]}, "output": {"decoder": "raw"}}, where="custom.runtime"
    )
    assert error.field == "custom.runtime.preprocess.size"
    assert str(error).startswith("custom.runtime.preprocess.size: must be an integer")


@pytest.mark.parametrize(
    ("decoder", "foreign"),
    [
        ("classification", "iou_threshold"),
        ("yolo", "strides"),
        ("yolo", "top_k"),
        ("yolox", "objectness"),
        ("yolox", "box_format"),
        ("raw", "score_threshold"),
    ],
)
def test_another_decoders_parameter_is_refused(decoder: str, foreign: str) -> None:
    error = bundle_error({"output": {"decoder": decoder, foreign: 1}})
    assert error.field == f"runtime.output.{foreign}"
    assert "known:" in str(error)
    assert foreign not in str(error).split("known:")[1]


def test_labels_are_bounded_in_count_and_length() -> None:
    raw: dict[str, Any] = {"output": {"decoder": "classification"}}
    assert len(parse_runtime_spec({**raw, "labels": ["x"] * MAX_LABELS}).labels) == MAX_LABELS
    assert bundle_error({**raw, "labels": ["x"] * (MAX_LABELS + 1)}).field == "runtime.labels"
    assert bundle_error({**raw, "labels": ["ok", ""]}).field == "runtime.labels[1]"
    long = "x" * (MAX_LABEL_CHARS + 1)
    assert bundle_error({**raw, "labels": ["ok", "ok", long]}).field == "runtime.labels[2]"
    assert parse_runtime_spec({**raw, "labels": ["x" * MAX_LABEL_CHARS]}).labels


def test_a_version_signed_before_bundles_has_no_runtime() -> None:
    assert runtime_of_custom({"release": 3}) is None
    spec = RuntimeSpec(output=OutputSpec(decoder="classification"))
    assert runtime_of_custom({"runtime": spec.to_signed()}) == spec
    with pytest.raises(BundleError) as caught:
        runtime_of_custom({"runtime": {"output": {"decoder": "nope"}}})
    assert caught.value.field == "custom.runtime.output.decoder"


# ------------------------------------------------------------------------ resolve_input


def sig(shape: list[object], dtype: str = "float32", name: str = "images") -> TensorSig:
    return TensorSig.of(name, dtype, shape)


def test_resolve_input_takes_the_models_size_and_channels() -> None:
    config, channels = resolve_input(PreprocessConfig(), [sig([1, 3, 416, 320])])
    assert (config.size, channels) == ((416, 320), 3)
    config, channels = resolve_input(
        PreprocessConfig(layout="NHWC", mean=(0.5,), std=(0.5,)), [sig(["N", 64, 96, 1])]
    )
    assert (config.size, channels) == ((64, 96), 1)


def test_a_dynamic_input_takes_the_configured_size() -> None:
    config, _ = resolve_input(PreprocessConfig(size=(480, 640)), [sig([1, 3, "h", -1])])
    assert config.size == (480, 640)


@pytest.mark.parametrize(
    ("config", "inputs", "field", "said"),
    [
        (PreprocessConfig(), [sig([1, 640, 640, 3])], "preprocess.layout", "looks NHWC"),
        (PreprocessConfig(), [sig([1, 3, 640])], "preprocess.layout", "rank 3"),
        (PreprocessConfig(), [sig([2, 3, 64, 64])], "preprocess", "batch"),
        (PreprocessConfig(), [sig([1, 3, 8, 8]), sig([1], name="k")], "preprocess", "2 inputs"),
        (PreprocessConfig(size=(480, 640)), [sig([1, 3, 416, 416])], "preprocess.size", "416"),
        (PreprocessConfig(), [sig([1, 3, "h", "w"])], "preprocess.size", "dynamic"),
        (PreprocessConfig(), [sig([1, 3, 8, 8], "float16")], "preprocess.dtype", "float16"),
        (
            PreprocessConfig(mean=(1, 2, 3)),
            [sig([1, 1, 8, 8])],
            "preprocess.mean",
            "1 channel",
        ),
    ],
)
def test_resolve_input_refuses_a_contradiction(
    config: PreprocessConfig, inputs: list[TensorSig], field: str, said: str
) -> None:
    with pytest.raises(BundleError) as caught:
        resolve_input(config, inputs)
    assert caught.value.field == field
    assert said in str(caught.value)


def test_a_size_mismatch_carries_both_sides() -> None:
    with pytest.raises(BundleError) as caught:
        resolve_input(PreprocessConfig(size=(480, 640)), [sig([1, 3, 416, 416])])
    assert (caught.value.model, caught.value.config) == (416, "size [480, 640]")


# ------------------------------------------------------------------------ check_outputs


def spec_of(
    decoder: Any, labels: int = 0, size: tuple[int, int] | None = None, **params: Any
) -> RuntimeSpec:
    return RuntimeSpec(
        PreprocessConfig(size=size),
        OutputSpec(decoder=decoder, **params),
        labels=tuple(f"c{i}" for i in range(labels)),
    )


@pytest.mark.parametrize(
    ("spec", "outputs"),
    [
        (spec_of("classification", 10), [sig([1, 10], name="p")]),
        (spec_of("classification", 10), [sig([10], name="p")]),
        (spec_of("classification"), [sig(["b", 1000], name="p")]),
        (spec_of("yolo", 80), [sig([1, 84, 8400], name="o")]),
        (spec_of("yolo", 80, objectness=True), [sig([1, 25200, 85], name="o")]),
        (spec_of("yolo"), [sig([1, 84, 8400], name="o")]),
        (spec_of("yolo"), [sig([1, "n", 85], name="o")]),
        (spec_of("yolo", 80), [sig([1, "n", 84], name="o")]),
        (spec_of("yolox", 80, size=(416, 416)), [sig([1, 3549, 85], name="o")]),
        (spec_of("yolox", 80), [sig([1, 8400, 85], name="o")]),  # size not known yet
        (spec_of("raw"), []),
        (spec_of("raw", output="b"), [sig([1], name="a"), sig([2], "int64", name="b")]),
    ],
)
def test_check_outputs_accepts_what_the_decoder_reads(
    spec: RuntimeSpec, outputs: list[TensorSig]
) -> None:
    check_outputs(spec, outputs)


@pytest.mark.parametrize(
    ("spec", "outputs", "field", "said"),
    [
        (spec_of("classification", 9), [sig([1, 10])], "labels", "10 classes"),
        (spec_of("classification"), [sig([2, 10])], "output", "batch"),
        (spec_of("classification"), [sig([1, 10, 1])], "output", "rank 3"),
        (spec_of("classification"), [sig([1, 10], "int64")], "output.decoder", "int64"),
        (spec_of("classification", output="x"), [sig([1, 10])], "output.output", "'x'"),
        (spec_of("yolo", 79), [sig([1, 84, 8400])], "labels", "83"),
        (spec_of("yolo", 80, objectness=True), [sig([1, 84, 8400])], "labels", "85"),
        (spec_of("yolo"), [sig([1, 8400])], "output", "rank 2"),
        (spec_of("yolo"), [sig([3, 84, 8400])], "output", "batch"),
        # The smaller axis is K: 4 values leave no class score, however long the other is.
        (spec_of("yolo"), [sig([1, 4, 8400])], "output", "4 values per box"),
        (spec_of("yolox"), [sig([1, 8400, 5])], "output", "5 values per box"),
        (spec_of("yolo"), [sig([1, "n", 4])], "output", "box width"),
        (spec_of("yolox", 80, size=(640, 640)), [sig([1, 3549, 85])], "output.strides", "8400"),
        (spec_of("raw", output="x"), [sig([1], name="a")], "output.output", "'x'"),
    ],
)
def test_check_outputs_refuses_what_the_decoder_cannot_read(
    spec: RuntimeSpec, outputs: list[TensorSig], field: str, said: str
) -> None:
    with pytest.raises(BundleError) as caught:
        check_outputs(spec, outputs)
    assert caught.value.field == field
    assert said in str(caught.value)


def test_box_layout_picks_the_axis_of_k() -> None:
    assert box_layout((84, 8400), objectness=False, labels=80) == (True, 84)
    assert box_layout((8400, 84), objectness=False, labels=80) == (False, 84)
    assert box_layout((85, 85), objectness=True, labels=80) == (False, 85)  # a tie: [1, N, K]
    # Without labels the smaller axis is K.
    assert box_layout((6, 30), objectness=False, labels=0) == (True, 6)
    assert box_layout((30, 6), objectness=False, labels=0) == (False, 6)
    assert box_layout((6, 6), objectness=False, labels=0) == (False, 6)
    with pytest.raises(BundleError, match="more than 5"):
        box_layout((5, 30), objectness=True, labels=0)


def test_yolox_grid_cells_round_up() -> None:
    assert yolox_candidates((640, 640), (8, 16, 32)) == 6400 + 1600 + 400
    assert yolox_candidates((416, 416), (8, 16, 32)) == 2704 + 676 + 169
    assert yolox_candidates((20, 36), (8,)) == 3 * 5


@pytest.mark.parametrize(
    ("declared", "config", "refused"),
    [
        ({"mean": 0.5, "std": 0.5}, PreprocessConfig(mean=(0.5,) * 3, std=(0.5,)), None),
        ({"mean": [0.485, 0.456, 0.406]}, PreprocessConfig(mean=(0.4850001, 0.456, 0.406)), None),
        ({"layout": "NHWC"}, PreprocessConfig(), "preprocess.layout"),
        ({"channel_order": "BGR"}, PreprocessConfig(), "preprocess.channel_order"),
        ({"mean": [0.5, 0.5]}, PreprocessConfig(mean=(0.5,) * 3), "preprocess.mean"),
        ({"std": True}, PreprocessConfig(std=(1.0,)), "preprocess.std"),
        ({"scale": 1}, PreprocessConfig(), "preprocess.scale"),
        ({}, PreprocessConfig(), None),
    ],
)
def test_what_a_model_declares_about_its_preprocessing_must_agree(
    declared: dict[str, Any], config: PreprocessConfig, refused: str | None
) -> None:
    metadata = {PREPROCESS_METADATA_KEY: json.dumps(declared), "other": "x"}
    if refused is None:
        check_declared_preprocess(config, metadata)
        return
    with pytest.raises(BundleError) as caught:
        check_declared_preprocess(config, metadata)
    assert caught.value.field == refused
    assert PREPROCESS_METADATA_KEY in caught.value.message
    assert caught.value.model is not None and caught.value.config is not None


def test_a_declaration_that_is_not_a_json_object_is_refused() -> None:
    check_declared_preprocess(PreprocessConfig(), {})  # nothing declared: nothing to check
    for raw in ("[1]", "{not json"):
        with pytest.raises(BundleError, match="not a JSON object"):
            check_declared_preprocess(PreprocessConfig(), {PREPROCESS_METADATA_KEY: raw})
