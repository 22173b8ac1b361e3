"""`model quantize` and `model compare` (issue 16 §1): real models, real images, real ORT.

The model is :func:`sample_models.tiny_detector` (Conv → Relu → pool → Gemm → Sigmoid,
deterministic weights) read as a four-class classifier through a runtime spec; the images
are PNGs written with Pillow, read back through the node's own preprocessing.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import yaml
from onnx import numpy_helper
from PIL import Image

from control_plane.cli.main import main
from control_plane.cli.runtime_file import load_runtime_file
from control_plane.registry import sample_models
from control_plane.registry.onnx_inspect import ReferencePair, save_reference
from control_plane.registry.reference_frame import load_frame
from control_plane.trust.custom import check_runtime
from protos.bundle.preprocess import Preprocessor
from protos.bundle.spec import TensorSig

SIZE = 32


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, Any, str]:
    capsys.readouterr()
    code = main(["-o", "json", "model", *args])
    out, err = capsys.readouterr()
    return code, (json.loads(out) if code == 0 else out), err


def images(folder: Path, count: int, *, dark: bool = False, seed: int = 1) -> Path:
    folder.mkdir()
    rng = np.random.default_rng(seed)
    for i in range(count):
        level, spread = (12, 4) if dark else (int(rng.integers(10, 245)), int(rng.integers(10, 60)))
        pixels = np.clip(rng.normal(level, spread, (48, 64, 3)), 0, 255).astype(np.uint8)
        Image.fromarray(pixels).save(folder / f"{i:02d}.png")
    return folder


@pytest.fixture
def fp32(tmp_path: Path) -> Path:
    return sample_models.tiny_detector(tmp_path / "fp32.onnx", size=SIZE)


@pytest.fixture
def runtime(tmp_path: Path) -> Path:
    path = tmp_path / "runtime.yaml"
    path.write_text(yaml.safe_dump(sample_models.tiny_detector_runtime()))
    return path


@pytest.fixture
def calibration(tmp_path: Path) -> Path:
    return images(tmp_path / "calibration", 12)


def scaled(source: Path, target: Path, initializer: str, factor: float) -> Path:
    """`source` with one weight tensor multiplied by `factor`: a deliberately broken model."""
    model = onnx.load(str(source))
    for i, tensor in enumerate(model.graph.initializer):
        if tensor.name == initializer:
            array = numpy_helper.to_array(tensor) * np.float32(factor)
            model.graph.initializer[i].CopyFrom(numpy_helper.from_array(array, initializer))
    onnx.save(model, str(target))
    return target


def test_static_quantization_writes_a_checked_int8_qdq_model_that_agrees(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, fp32: Path, runtime: Path, calibration: Path
) -> None:
    out = tmp_path / "int8.onnx"
    (calibration / ".DS_Store").write_bytes(b"\x00\x01")  # hidden files are not samples
    code, report, err = run(
        capsys, "quantize", str(fp32), "--calibration", str(calibration),
        "--runtime", str(runtime), "--out", str(out),
    )  # fmt: skip
    assert code == 0, err
    assert report["samples"] == 12
    # Every setting is pinned, whatever the installed release's defaults are.
    assert report["settings"] == {
        "method": "static",
        "format": "QDQ",
        "activation_type": "QInt8",
        "weight_type": "QInt8",
        "calibration": "MinMax",
        "per_channel": False,
        "reduce_range": False,
        "nodes_excluded": [],
    }
    model = onnx.load(str(out))
    onnx.checker.check_model(model, full_check=True)
    ops = [n.op_type for n in model.graph.node]
    assert "QuantizeLinear" in ops and "DequantizeLinear" in ops
    int8_weights = [t for t in model.graph.initializer if t.data_type == onnx.TensorProto.INT8]
    # Activations too are QInt8 (older releases defaulted to QUInt8): int8 zero points only.
    zero_points = [
        t
        for t in model.graph.initializer
        if t.name.endswith("_zero_point") and not t.name.endswith("_quantized_zero_point")
    ]  # (the biases' are int32)
    assert zero_points and {t.data_type for t in zero_points} == {onnx.TensorProto.INT8}
    assert {t.name.split("_quantized")[0] for t in int8_weights} >= {"conv_w", "fc_w"}
    # Run both ourselves, on a calibration image through the node's preprocessing.
    spec = load_runtime_file(runtime)
    resolved, channels = check_runtime(
        spec,
        [TensorSig.of("images", "float32", (1, 3, SIZE, SIZE))],
        [TensorSig.of("scores", "float32", (1, 4))],
    )
    tensor = Preprocessor(resolved, channels)(load_frame(calibration / "03.png"))
    want = ort.InferenceSession(str(fp32)).run(None, {"images": tensor})[0]
    got = ort.InferenceSession(str(out)).run(None, {"images": tensor})[0]
    assert np.abs(got - want).max() < 0.02
    agreement = report["agreement"]
    assert agreement["samples"] == 12 and agreement["warnings"] == []
    (scores,) = agreement["outputs"]
    assert scores["cosine_p5"] > 0.999 and scores["sqnr_db_p5"] > 30
    assert agreement["decoded"]["kind"] == "classification"
    assert agreement["decoded"]["top1_ratio"] == 1.0
    assert report["coverage"]["images"] == 12 and report["coverage"]["warnings"] == []
    # Per layer: the dequantized tensors against the float ones, worst first, per sample.
    layers = {row["tensor"]: row for row in report["layers"]}
    assert {"images", "relu", "logits", "scores"} <= set(layers)
    assert layers["logits"]["node"] == "fc" and layers["logits"]["op"] == "Gemm"
    assert layers["images"]["node"] == "(input)"
    assert set(layers["images"]) == {"tensor", "node", "op", "sqnr_db_p5", "sqnr_db_p50"}
    p5 = [row["sqnr_db_p5"] for row in report["layers"]]
    assert p5 == sorted(p5) and 20 < p5[0] < 80
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".edgefleet-quantize")]


def test_per_channel_and_excluded_nodes_and_dynamic(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, fp32: Path, runtime: Path, calibration: Path
) -> None:
    out = tmp_path / "mixed.onnx"
    code, report, err = run(
        capsys, "quantize", str(fp32), "--calibration", str(calibration), "--runtime",
        str(runtime), "--out", str(out), "--per-channel", "--exclude", "fc",
    )  # fmt: skip
    assert code == 0, err
    assert report["settings"]["per_channel"] and report["settings"]["nodes_excluded"] == ["fc"]
    model = onnx.load(str(out))
    (fc,) = [n for n in model.graph.node if n.name == "fc"]
    assert fc.input[1] == "fc_w"  # the float weight itself, no DequantizeLinear before it
    conv_scale = [t for t in model.graph.initializer if t.name.startswith("conv_w_scale")]
    assert conv_scale and numpy_helper.to_array(conv_scale[0]).shape == (8,)  # per channel

    dynamic = tmp_path / "dynamic.onnx"
    code, report, err = run(
        capsys, "quantize", str(fp32), "--calibration", str(calibration), "--runtime",
        str(runtime), "--out", str(dynamic), "--method", "dynamic",
    )  # fmt: skip
    assert code == 0, err
    assert "DynamicQuantizeLinear" in {n.op_type for n in onnx.load(str(dynamic)).graph.node}
    assert report["layers"] is None  # nothing to match without QDQ pairs
    assert report["agreement"]["outputs"][0]["cosine_p5"] > 0.999


def test_calibration_method_and_int16_activations(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, fp32: Path, runtime: Path, calibration: Path
) -> None:
    base = ["quantize", str(fp32), "--calibration", str(calibration), "--runtime", str(runtime)]
    out = tmp_path / "percentile.onnx"
    code, report, err = run(capsys, *base, "--out", str(out), "--calibration-method", "percentile")
    assert code == 0, err
    assert report["settings"]["calibration"] == "Percentile"
    assert report["settings"]["activation_type"] == "QInt8"
    assert report["opset"] == 17

    int16 = tmp_path / "int16.onnx"
    code, report, err = run(
        capsys, *base, "--out", str(int16), "--per-channel", "--activations", "int16"
    )
    assert code == 0, err
    assert report["settings"]["activation_type"] == "QInt16"
    assert report["opset"] == 21  # ORT raised it (16-bit Q/DQ), and the report says so
    model = onnx.load(str(int16))
    # Below opset 21 the 16-bit Q/DQ are ORT's com.microsoft ops; checked, compared, matched.
    domains = {n.domain for n in model.graph.node if n.op_type == "QuantizeLinear"}
    assert domains == {"com.microsoft"}
    assert report["agreement"]["outputs"][0]["cosine_p5"] > 0.999
    assert report["layers"], "the per-layer SQNR matches com.microsoft Q/DQ pairs too"
    code, compared, err = run(capsys, "compare", str(fp32), str(int16), "--data",
                              str(calibration), "--runtime", str(runtime))  # fmt: skip
    assert code == 0, err
    assert compared["outputs"][0]["cosine_p5"] > 0.999

    capsys.readouterr()
    assert main(["model", *base, "--out", str(out), "--activations", "int16"]) == 0
    assert "activations QInt16" in capsys.readouterr().out  # the table says it too

    refused = tmp_path / "refused.onnx"
    for flags, needle in (
        (["--method", "dynamic", "--calibration-method", "entropy"], "--method static"),
        (["--method", "dynamic", "--activations", "int16"], "--method static"),
        (["--calibration-method", "kl"], "minmax, percentile, entropy"),
        (["--activations", "int4"], "int8, int16"),
    ):
        code, _, err = run(capsys, *base, "--out", str(refused), *flags)
        assert code != 0 and needle in err, (flags, err)
        assert not refused.exists()


def test_compare_flags_a_broken_model_and_passes_the_same_one(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, fp32: Path, runtime: Path, calibration: Path
) -> None:
    broken = scaled(fp32, tmp_path / "broken.onnx", "fc_w", -4.0)
    code, report, err = run(
        capsys, "compare", str(fp32), str(broken), "--data", str(calibration),
        "--runtime", str(runtime),
    )  # fmt: skip
    assert code == 0, err
    (scores,) = report["outputs"]
    assert scores["cosine_p5"] < 0.9 and scores["max_abs"] > 0.3
    assert any("cosine similarity" in w for w in report["warnings"])
    assert report["decoded"]["top1_ratio"] < 0.5
    assert any("top-1" in w for w in report["warnings"])

    code, report, err = run(capsys, "compare", str(fp32), str(fp32), "--data", str(calibration),
                            "--runtime", str(runtime))  # fmt: skip
    assert code == 0, err
    (scores,) = report["outputs"]
    assert scores["max_abs"] == 0 and scores["cosine_p5"] == 1.0 and scores["sqnr_db_p5"] == "inf"
    assert report["warnings"] == []


def test_compare_on_tensors_and_as_a_table(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, fp32: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = tmp_path / "tensors"
    folder.mkdir()
    rng = np.random.default_rng(0)
    for i in range(3):
        np.save(folder / f"{i}.npy", rng.standard_normal((1, 3, SIZE, SIZE)).astype(np.float32))
    other = sample_models.tiny_detector(tmp_path / "other.onnx", size=SIZE, seed=5)
    code, report, err = run(capsys, "compare", str(fp32), str(other), "--data", str(folder))
    assert code == 0, err
    assert report["kind"] == "tensors" and report["coverage"] is None
    assert report["decoded"] is None and report["samples"] == 3
    monkeypatch.setenv("COLUMNS", "200")
    capsys.readouterr()
    assert main(["model", "compare", str(fp32), str(other), "--data", str(folder)]) == 0
    table = capsys.readouterr().out
    assert "per output, 3 samples" in table and "cosine_p5" in table and "scores" in table
    assert "latency (1 thread, 3 runs each)" in table and '"p50_ms"' not in table


def test_a_narrow_calibration_set_is_warned_about(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, fp32: Path, runtime: Path
) -> None:
    dark = images(tmp_path / "night", 10, dark=True)
    code, report, err = run(
        capsys, "quantize", str(fp32), "--calibration", str(dark), "--runtime", str(runtime),
        "--out", str(tmp_path / "int8.onnx"),
    )  # fmt: skip
    assert code == 0, err
    warnings = report["coverage"]["warnings"]
    assert any(w.startswith("narrow brightness") for w in warnings)
    assert "100% of the images are dark" in warnings
    assert report["coverage"]["bands"] == {"dark": 10, "mid": 0, "bright": 0}


def bad_folder(tmp_path: Path, case: str) -> Path:
    folder = tmp_path / case
    if case == "missing":
        return folder
    if case == "file":
        folder.write_text("x")
        return folder
    folder.mkdir()
    if case == "empty":
        return folder
    for i in range(8):
        Image.fromarray(np.full((20, 20, 3), 100 + i, np.uint8)).save(folder / f"{i}.png")
    if case == "text":
        (folder / "notes.txt").write_text("not an image")
    elif case == "undecodable":
        (folder / "9.png").write_bytes(b"\x89PNG\r\n\x1a\nnot really")
    elif case == "mixed":
        np.save(folder / "t.npy", np.zeros((1, 3, SIZE, SIZE), np.float32))
    elif case == "few":
        for path in sorted(folder.iterdir())[3:]:
            path.unlink()
    return folder


@pytest.mark.parametrize(
    ("case", "message"),
    [
        ("missing", "does not exist"),
        ("file", "is not a directory"),
        ("empty", "is empty"),
        ("text", "'notes.txt' is neither an image"),
        ("undecodable", "cannot read image"),
        ("mixed", "mixes images (8) and .npy tensors (1)"),
        ("few", "holds 3 sample(s); at least 8"),
    ],
)
def test_bad_calibration_folders_are_refused_and_nothing_is_written(
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    fp32: Path,
    runtime: Path,
    case: str,
    message: str,
) -> None:
    out = tmp_path / "int8.onnx"
    folder = bad_folder(tmp_path, case)
    code, _, err = run(
        capsys, "quantize", str(fp32), "--calibration", str(folder), "--runtime", str(runtime),
        "--out", str(out),
    )  # fmt: skip
    assert code == 1
    assert message in " ".join(err.split())
    assert not out.exists()


def test_inputs_that_do_not_fit_the_model_are_refused(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, fp32: Path, runtime: Path, calibration: Path
) -> None:
    out = tmp_path / "int8.onnx"
    args = ["quantize", str(fp32), "--out", str(out)]
    # Images without the runtime spec that makes them the model's input.
    code, _, err = run(capsys, *args, "--calibration", str(calibration))
    assert code == 1 and "give it with --runtime" in " ".join(err.split())
    # Tensors of another shape than the model's input.
    tensors = tmp_path / "tensors"
    tensors.mkdir()
    for i in range(8):
        np.save(tensors / f"{i}.npy", np.zeros((1, 3, 16, 16), np.float32))
    code, _, err = run(capsys, *args, "--calibration", str(tensors))
    assert code == 1 and "the model's input 'images' is float32[1, 3, 32, 32]" in " ".join(
        err.split()
    )
    # A node that is not in the graph, and a model quantized already.
    code, _, err = run(
        capsys, *args, "--calibration", str(calibration), "--runtime", str(runtime),
        "--exclude", "head",
    )  # fmt: skip
    assert code == 1 and "--exclude 'head': the model has no node of that name" in err
    assert not out.exists()
    int8 = tmp_path / "first.onnx"
    assert run(capsys, "quantize", str(fp32), "--calibration", str(calibration), "--runtime",
               str(runtime), "--out", str(int8))[0] == 0  # fmt: skip
    code, _, err = run(
        capsys, "quantize", str(int8), "--calibration", str(calibration), "--runtime",
        str(runtime), "--out", str(out),
    )  # fmt: skip
    assert code == 1 and "is quantized already" in err
    # Two models that are not versions of one model.
    bigger = sample_models.tiny_detector(tmp_path / "bigger.onnx", size=48)
    code, _, err = run(capsys, "compare", str(fp32), str(bigger), "--data", str(calibration),
                       "--runtime", str(runtime))  # fmt: skip
    assert code == 1 and "B's inputs" in err
    assert not out.exists()


def test_a_detector_is_compared_by_its_boxes(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, calibration: Path
) -> None:
    boxes = sample_models.tiny_box_detector(tmp_path / "boxes.onnx", size=48)
    runtime = tmp_path / "yolo.yaml"
    runtime.write_text(
        yaml.safe_dump(
            {
                "preprocess": {"layout": "NCHW", "mean": 0.5, "std": 0.5},
                "output": {"decoder": "yolo", "objectness": False, "score_threshold": 0.5},
                "labels": list(sample_models.TINY_DETECTOR_LABELS),
            }
        )
    )
    int8 = tmp_path / "boxes-int8.onnx"
    code, report, err = run(
        capsys, "quantize", str(boxes), "--calibration", str(calibration), "--runtime",
        str(runtime), "--out", str(int8),
    )  # fmt: skip
    assert code == 0, err
    decoded = report["agreement"]["decoded"]
    assert decoded["kind"] == "detection" and decoded["frames"] == 12
    assert decoded["recall"] == 1.0 and decoded["precision"] == 1.0
    # Boxes (pixels, up to ~40) and scores (0..1) share one output and so one int8 scale:
    # scores move by a scale step or so (~0.06 here) — the head issue 16's --auto-exclude is for.
    assert 0 < decoded["mean_score_diff"] < 0.1
    # Scores pushed under the deployed threshold: B finds none of A's boxes.
    faint = scaled(boxes, tmp_path / "faint.onnx", "bias", 0.3)
    code, report, err = run(capsys, "compare", str(boxes), str(faint), "--data",
                            str(calibration), "--runtime", str(runtime))  # fmt: skip
    assert code == 0, err
    assert report["decoded"]["recall"] == 0.0
    assert "B finds 0.0% of A's boxes, below 90%" in report["warnings"]


def concat_head(path: Path, size: int = 640) -> Path:
    """A detector-like head: boxes in input pixels (up to ~450) and sigmoid class scores
    concatenated into one [1, 8, 2] output, as YOLO exports do. Quantized whole, the concat
    shares one int8 scale (~2 per step) between both, and every score rounds to 0."""
    from onnx import TensorProto, helper

    labels, n = 4, 2
    boxes = np.array([[0.7, 0.25], [0.6, 0.7], [0.2, 0.3], [0.6, 0.25]], np.float32) * size
    logits = np.full((labels, n), -3.0, np.float32)
    logits[0, 0], logits[1, 1] = 2.2, 1.4  # a person (0.9) and a vehicle (0.8)
    moves = np.zeros((3, 4 * n), np.float32)
    moves[0, 0] = size / 8  # the person's cx follows the first channel's mean
    tensors = {
        "flat": np.array([1, 3], np.int64),
        "box_w": moves,
        "box_b": boxes.reshape(-1),
        "score_w": np.zeros((3, labels * n), np.float32),
        "score_b": logits.reshape(-1),
        "box_shape": np.array([1, 4, n], np.int64),
        "score_shape": np.array([1, labels, n], np.int64),
    }
    node = helper.make_node
    graph = helper.make_graph(
        [
            node("GlobalAveragePool", ["images"], ["pooled"], name="pool"),
            node("Reshape", ["pooled", "flat"], ["features"], name="flatten"),
            node("MatMul", ["features", "box_w"], ["box_m"], name="box_fc"),
            node("Add", ["box_m", "box_b"], ["box_a"], name="box_bias"),
            node("Reshape", ["box_a", "box_shape"], ["box"], name="box_reshape"),
            node("MatMul", ["features", "score_w"], ["score_m"], name="score_fc"),
            node("Add", ["score_m", "score_b"], ["score_a"], name="score_bias"),
            node("Sigmoid", ["score_a"], ["score_s"], name="score_sigmoid"),
            node("Reshape", ["score_s", "score_shape"], ["score"], name="score_reshape"),
            node("Concat", ["box", "score"], ["output0"], name="head", axis=1),
        ],
        "concat_head",
        [helper.make_tensor_value_info("images", TensorProto.FLOAT, [1, 3, size, size])],
        [helper.make_tensor_value_info("output0", TensorProto.FLOAT, [1, 4 + labels, n])],
        [numpy_helper.from_array(v, k) for k, v in tensors.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=True)
    onnx.save(model, str(path))
    return path


def test_a_concatenated_head_fails_whole_and_passes_with_the_concat_in_float(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """onnxruntime#14233's failure, seen by the decoded agreement and not by the tensor
    figures (the boxes dominate the signal), and fixed by keeping one node in float."""
    calibration = images(tmp_path / "frames", 8, seed=7)  # 640x640 inputs: few
    head = concat_head(tmp_path / "head.onnx")
    runtime = tmp_path / "yolo.yaml"
    runtime.write_text(
        yaml.safe_dump(
            {
                "preprocess": {"layout": "NCHW", "mean": 0.5, "std": 0.5},
                "output": {"decoder": "yolo", "objectness": False, "score_threshold": 0.5},
                "labels": list(sample_models.TINY_DETECTOR_LABELS),
            }
        )
    )
    args = ["quantize", str(head), "--calibration", str(calibration), "--runtime", str(runtime)]
    code, report, err = run(capsys, *args, "--out", str(tmp_path / "whole.onnx"))
    assert code == 0, err
    agreement = report["agreement"]
    assert agreement["decoded"]["recall"] == 0.0
    assert agreement["outputs"][0]["cosine_p5"] > 0.999  # the tensor looks fine
    assert "B finds 0.0% of A's boxes, below 90%" in agreement["warnings"]
    # Nor does the per-layer SQNR see it: the boxes dominate the concat's signal.
    (output,) = [row for row in report["layers"] if row["tensor"] == "output0"]
    assert output["node"] == "head" and output["sqnr_db_p5"] > 40
    code, report, err = run(
        capsys, *args, "--out", str(tmp_path / "mixed.onnx"), "--exclude", "head"
    )
    assert code == 0, err
    agreement = report["agreement"]
    assert agreement["decoded"]["recall"] == 1.0 and agreement["decoded"]["precision"] == 1.0
    assert agreement["warnings"] == []


def test_samples_are_held_in_memory_only_when_they_fit(tmp_path: Path, fp32: Path) -> None:
    from control_plane.registry.model_data import open_samples
    from control_plane.registry.onnx_inspect import inspect_model

    folder = tmp_path / "tensors"
    folder.mkdir()
    for i in range(3):
        np.save(folder / f"{i}.npy", np.full((1, 3, SIZE, SIZE), i, np.float32))
    samples = open_samples(folder, inspect_model(fp32), None)
    assert samples.hold(limit_bytes=3 * 3 * SIZE * SIZE * 4 - 1) is samples  # too big
    held = samples.hold()
    assert held.held is not None and [s.name for s in held] == ["0.npy", "1.npy", "2.npy"]
    for path in folder.iterdir():
        path.unlink()  # held: the files are not read again
    assert [float(s.inputs["images"].max()) for s in held] == [0.0, 1.0, 2.0]


def test_errors_are_judged_per_sample() -> None:
    """SQNR is 10·log10(Σa²/Σ(b-a)²) per sample; the 5th percentile is a sample's value."""
    from control_plane.errors import InvalidInputError
    from control_plane.registry.model_compare import OutputErrors

    errors = OutputErrors("y")
    errors.add(np.array([1.0, 1.0]), np.array([1.1, 0.9]))  # signal 2, noise 0.02: 20 dB
    errors.add(np.array([3.0, 4.0]), np.array([3.0, 4.0]))  # no error: inf
    errors.add(np.array([1.0, 0.0]), np.array([0.0, 1.0]))  # orthogonal: cosine 0, -3.01 dB
    report = errors.to_report()
    assert report["sqnr_db_p5"] == -3.01 and report["sqnr_db_p50"] == 20.0
    assert report["cosine_min"] == 0.0 and report["cosine_p5"] == 0.0
    assert report["max_abs"] == 1.0
    assert report["mean_abs"] == pytest.approx((0.2 + 0 + 2) / 6)
    with pytest.raises(InvalidInputError, match="B gave shape"):
        errors.add(np.zeros(2), np.zeros(3))


def test_latency_is_timed_per_run_after_a_warm_up(tmp_path: Path, fp32: Path) -> None:
    from control_plane.registry.model_compare import compare_models, cpu_features
    from control_plane.registry.model_data import open_samples
    from control_plane.registry.onnx_inspect import inspect_model

    folder = tmp_path / "tensors"
    folder.mkdir()
    for i in range(4):
        np.save(folder / f"{i}.npy", np.full((1, 3, SIZE, SIZE), i / 4, np.float32))
    ticks = iter(range(0, 10**9, 1_000_000))  # every reading 1 ms after the last
    samples = open_samples(folder, inspect_model(fp32), None)
    latency = compare_models(fp32, fp32, samples, timer=lambda: next(ticks)).latency
    # 4 timed runs each (the warm-up is not timed), each 1 ms on this clock.
    assert latency["a"] == {"runs": 4, "p50_ms": 1.0, "p99_ms": 1.0}
    assert latency["b"] == latency["a"] and latency["threads"] == 1
    x86 = "processor\t: 0\nflags\t\t: fpu sse avx2 avx512f avx512_vnni\n"
    assert cpu_features(x86)["int8_features"] == ["avx2", "avx512_vnni", "avx512f"]
    arm = "Features\t: fp asimd asimddp i8mm\n"
    assert cpu_features(arm)["int8_features"] == ["asimddp", "i8mm"]
    assert cpu_features("")["int8_features"] == []


def test_class_folders_are_counted_against_the_labels(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, fp32: Path, runtime: Path
) -> None:
    folder = tmp_path / "by-class"
    folder.mkdir()
    images(folder / "person", 5, seed=2)
    images(folder / "vehicle", 4, seed=3)
    images(folder / "persn", 1, seed=4)
    code, report, err = run(
        capsys, "quantize", str(fp32), "--calibration", str(folder), "--runtime", str(runtime),
        "--out", str(tmp_path / "int8.onnx"),
    )  # fmt: skip
    assert code == 0, err
    coverage = report["coverage"]
    assert report["samples"] == 10 and coverage["images"] == 10
    assert coverage["classes"] == {"person": 5, "persn": 1, "vehicle": 4}
    assert "class folder(s) persn name no label of the runtime spec" in coverage["warnings"]
    assert "no images of bicycle, animal" in coverage["warnings"]
    # Files beside class folders, and folders below them, are refused.
    (folder / "loose.png").write_bytes((folder / "person" / "00.png").read_bytes())
    code, _, err = run(capsys, "compare", str(fp32), str(fp32), "--data", str(folder),
                       "--runtime", str(runtime))  # fmt: skip
    assert code == 1 and "mixes class folders ('persn') and files ('loose.png')" in err
    (folder / "loose.png").unlink()
    (folder / "person" / "deeper").mkdir()
    code, _, err = run(capsys, "compare", str(fp32), str(fp32), "--data", str(folder),
                       "--runtime", str(runtime))  # fmt: skip
    assert code == 1 and "holds a folder ('deeper')" in " ".join(err.split())


def test_auto_exclude_keeps_the_concat_in_float_and_nothing_else(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, fp32: Path, runtime: Path
) -> None:
    frames = images(tmp_path / "frames", 8, seed=7)
    head = concat_head(tmp_path / "head.onnx")
    yolo = tmp_path / "yolo.yaml"
    yolo.write_text(
        yaml.safe_dump(
            {
                "preprocess": {"layout": "NCHW", "mean": 0.5, "std": 0.5},
                "output": {"decoder": "yolo", "objectness": False, "score_threshold": 0.5},
                "labels": list(sample_models.TINY_DETECTOR_LABELS),
            }
        )
    )
    out = tmp_path / "auto.onnx"
    code, report, err = run(
        capsys, "quantize", str(head), "--calibration", str(frames), "--runtime", str(yolo),
        "--out", str(out), "--auto-exclude", "--target", "0.99",
    )  # fmt: skip
    assert code == 0, err
    search = report["auto_exclude"]
    assert search["score_before"] == 0.0 and search["reached"] and search["score"] >= 0.99
    assert search["kept_in_float"] == ["head"]
    (only,) = search["rounds"]
    assert only["kept_in_float"] == "head" and only["tried"] >= 2  # found by trial, not rank
    assert report["settings"]["nodes_excluded"] == ["head"]
    assert report["agreement"]["decoded"]["recall"] == 1.0
    assert "Concat" in {n.op_type for n in onnx.load(str(out)).graph.node}
    # A model that agrees already keeps everything quantized.
    code, report, err = run(
        capsys, "quantize", str(fp32), "--calibration", str(frames), "--runtime", str(runtime),
        "--out", str(tmp_path / "int8.onnx"), "--auto-exclude",
    )  # fmt: skip
    assert code == 0, err
    assert report["auto_exclude"]["kept_in_float"] == [] and report["auto_exclude"]["reached"]
    # What it cannot do is refused.
    for extra, message in (
        (["--method", "dynamic"], "--auto-exclude needs --method static"),
        (["--target", "1.5"], "--target is an agreement in (0, 1], got 1.5"),
    ):
        code, _, err = run(
            capsys, "quantize", str(fp32), "--calibration", str(frames), "--runtime",
            str(runtime), "--out", str(tmp_path / "x.onnx"), "--auto-exclude", *extra,
        )  # fmt: skip
        assert code == 1 and message in err
    assert not (tmp_path / "x.onnx").exists()


def reference_pair(
    path: Path, model: Path, *, mean: tuple[float, ...], std: tuple[float, ...],
    order: str = "RGB", outputs_of: Path | None = None,
) -> Path:  # fmt: skip
    """What the training framework would hand over: a frame, the input it made of it with
    its own normalisation, and the outputs of `outputs_of` (default: `model`) on it."""
    rng = np.random.default_rng(11)
    frame = rng.integers(0, 256, (48, 64, 3), dtype=np.uint8)
    spec = load_runtime_file_dict(sample_models.tiny_detector_runtime(mean=mean, std=std))
    spec = {**spec, "preprocess": {**spec["preprocess"], "channel_order": order}}
    runtime_path = path.with_suffix(".yaml")
    runtime_path.write_text(yaml.safe_dump(spec))
    parsed = load_runtime_file(runtime_path)
    resolved, channels = check_runtime(
        parsed,
        [TensorSig.of("images", "float32", (1, 3, SIZE, SIZE))],
        [TensorSig.of("scores", "float32", (1, 4))],
        where="runtime",
    )
    tensor = Preprocessor(resolved, channels)(frame)
    session = ort.InferenceSession(str(outputs_of or model), providers=["CPUExecutionProvider"])
    (scores,) = session.run(["scores"], {"images": tensor})
    save_reference(
        ReferencePair(inputs={"images": tensor}, outputs={"scores": scores}, frame=frame), path
    )
    return path


def load_runtime_file_dict(spec: dict[str, Any]) -> dict[str, Any]:
    return json.loads(json.dumps(spec))


def test_the_float_baseline_is_checked_first_and_a_normalisation_mismatch_named(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, fp32: Path, runtime: Path, calibration: Path
) -> None:
    out = tmp_path / "int8.onnx"
    args = ["quantize", str(fp32), "--calibration", str(calibration), "--runtime", str(runtime),
            "--out", str(out)]  # fmt: skip
    imagenet = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
    same = reference_pair(tmp_path / "same.npz", fp32, mean=imagenet[0], std=imagenet[1])
    code, report, err = run(capsys, *args, "--reference", str(same))
    assert code == 0, err
    baseline = report["float_baseline"]
    assert baseline["matches"] and baseline["preprocess"] == {"matches": True}
    assert baseline["outputs"][0]["cosine"] >= 0.9999 and baseline["outputs"][0]["max_abs"] < 1e-5
    out.unlink()
    # Exported from a framework that fed BGR in [-1, 1]: the runtime spec says ImageNet RGB.
    other = reference_pair(tmp_path / "bgr.npz", fp32, mean=(0.5,), std=(0.5,), order="BGR")
    code, _, err = run(capsys, *args, "--reference", str(other))
    message = " ".join(err.split())
    assert (
        code == 1 and "normalisation mismatch: the reference frame through the runtime" in message
    )
    assert "reproduced by [-1,1] (scale 1/255, mean 0.5, std 0.5), BGR" in message
    assert not out.exists()
    # The right input, but outputs the FP32 model does not give (another export).
    wrong = reference_pair(tmp_path / "wrong.npz", fp32, mean=imagenet[0], std=imagenet[1],
                           outputs_of=sample_models.tiny_detector(tmp_path / "o.onnx", size=SIZE,
                                                                  seed=5))  # fmt: skip
    code, _, err = run(capsys, *args, "--reference", str(wrong))
    message = " ".join(err.split())
    assert code == 1 and "does not reproduce the reference outputs: 'scores' has cosine" in message
    assert not out.exists()
    # A pair that is not the model's.
    np.savez(tmp_path / "bad.npz", **{"input/x": np.zeros(3, np.float32)})
    code, _, err = run(capsys, *args, "--reference", str(tmp_path / "bad.npz"))
    assert code == 1 and "holds inputs ['x'] and outputs []" in err
    assert not out.exists()
