"""`model push --baseline FP32.onnx --data DIR [--force]`: the release gate (issue 16 §1).

Against a real control plane: the comparison (`model compare`'s) runs on this machine, its
report is signed into the version's custom, `model show` displays it, a version below the
threshold is refused before anything is uploaded unless `--force` (audited, and recorded
as forced), and the server refuses a report whose shape or verdict does not hold.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from tuf.api.metadata import Metadata, TargetFile, Targets

from control_plane.cli.client import ApiClient, ApiError
from control_plane.errors import InvalidInputError
from control_plane.registry import sample_models
from control_plane.registry.onnx_inspect import inspect_model
from control_plane.trust import repository as tufrepo
from control_plane.trust.custom import parse_model_custom, parse_release_check
from control_plane.trust.keys import OperatorKeyset
from tests.control_plane.cli import test_push_runtime as push_tests
from tests.control_plane.cli.test_push_runtime import FLEET, Cli, signed_targets
from tests.control_plane.cli.test_quantize_compare import SIZE, images, reference_pair, scaled

# A live control plane on SQLite, a fleet, operator keys and the CLI: `model push`'s own.
database_url = push_tests.database_url
keys = push_tests.keys
keyset = push_tests.keyset
api = push_tests.api
cli = push_tests.cli


@pytest.fixture
def fp32(tmp_path: Path) -> Path:
    return sample_models.tiny_detector(tmp_path / "fp32.onnx", size=SIZE)


@pytest.fixture
def runtime(tmp_path: Path) -> Path:
    path = tmp_path / "runtime.yaml"
    path.write_text(yaml.safe_dump(sample_models.tiny_detector_runtime()))
    return path


@pytest.fixture
def data(tmp_path: Path) -> Path:
    return images(tmp_path / "held-out", 12, seed=7)


def gate(fp32: Path, runtime: Path, data: Path, *extra: str) -> list[str]:
    return ["--runtime", str(runtime), "--baseline", str(fp32), "--data", str(data), *extra]


def test_a_passed_check_is_signed_with_the_version_and_shown(
    cli: Cli, api: ApiClient, tmp_path: Path, fp32: Path, runtime: Path, data: Path
) -> None:
    close = scaled(fp32, tmp_path / "close.onnx", "fc_w", 1.001)
    code, out, err = cli.push(close, *gate(fp32, runtime, data))
    assert code == 0, err
    check = json.loads(out)["release_check"]
    assert (check["verdict"], check["forced"], check["kind"]) == ("passed", False, "classification")
    assert (check["judged_on"], check["value"], check["threshold"]) == ("top1_ratio", "1.0", "0.99")
    assert check["baseline_sha256"] == inspect_model(fp32).sha256
    assert check["samples"] == 12 and check["data"] == "images"
    assert (
        check["coverage"]["images"] == 12 and len(check["coverage"]["brightness_p5_p50_p95"]) == 3
    )
    assert (
        check["outputs"][0]["output"] == "scores" and float(check["outputs"][0]["cosine_p5"]) > 0.99
    )
    assert check["onnxruntime"] and check["cpu"]["machine"]
    # Signed: in the targets metadata the operator's release key signed, as pushed.
    custom = signed_targets(api).signed.targets["models/det/1.0.0/model.onnx"].custom
    assert custom["release_check"] == check
    assert parse_model_custom(custom).release_check == parse_release_check(check)

    code, out, err = cli.run("-o", "json", "model", "show", "det", "--fleet", FLEET,
                             "--version", "1.0.0")  # fmt: skip
    assert code == 0, err
    assert json.loads(out)["custom"]["release_check"] == check
    code, out, err = cli.run("model", "show", "det", "--fleet", FLEET, "--version", "1.0.0")
    assert code == 0, err
    assert "passed: top1_ratio 1.0 >= 0.99 on 12 images (baseline " in out
    assert "output scores: max_abs" in out and "decoded: top1_ratio 1.0" in out
    assert '"release_check": "(see release_check)"' in out
    # A version pushed without a baseline says so.
    code, _, err = cli.push(close, "--runtime", str(runtime), version="1.0.1")
    assert code == 0, err
    code, out, err = cli.run("model", "show", "det", "--fleet", FLEET, "--version", "1.0.1")
    assert code == 0 and "- (pushed without --baseline)" in out


def test_below_the_threshold_the_push_is_refused_and_nothing_is_published(
    cli: Cli, api: ApiClient, tmp_path: Path, fp32: Path, runtime: Path, data: Path
) -> None:
    broken = scaled(fp32, tmp_path / "broken.onnx", "fc_w", -4.0)
    before = signed_targets(api).signed.version
    code, _, err = cli.push(broken, *gate(fp32, runtime, data))
    message = " ".join(err.split())
    assert code == 1
    assert "release check failed: broken.onnx against the baseline fp32.onnx: top1_ratio" in message
    assert "is below the threshold 0.99 on 12 images; nothing was uploaded" in message
    assert "--force (audited" in message
    assert signed_targets(api).signed.version == before
    assert not api.artifact_exists(inspect_model(broken).sha256)
    # Without a decoder (tensors, no runtime spec) the check is raw: the weakest output's
    # 5th-percentile cosine, against the operator's threshold.
    folder = tmp_path / "tensors"
    folder.mkdir()
    rng = np.random.default_rng(3)
    for i in range(4):
        np.save(folder / f"{i}.npy", rng.standard_normal((1, 3, SIZE, SIZE)).astype(np.float32))
    raw = ["--baseline", str(fp32), "--data", str(folder)]
    code, _, err = cli.push(broken, *raw, "--min-agreement", "-0.5")
    assert code == 1 and "--min-agreement is an agreement in [0, 1], got -0.5" in err
    code, _, err = cli.push(broken, *raw, "--min-agreement", "0.9999")
    message = " ".join(err.split())
    assert (
        code == 1
        and "cosine_p5" in message
        and "below the threshold 0.9999 on 4 tensors" in message
    )
    close = scaled(fp32, tmp_path / "close.onnx", "fc_w", 1.001)
    code, out, err = cli.push(close, *raw, "--min-agreement", "0.999")
    assert code == 0, err
    check = json.loads(out)["release_check"]
    assert (check["kind"], check["judged_on"], check["threshold"]) == ("raw", "cosine_p5", "0.999")
    assert "decoded" not in check and "coverage" not in check and check["data"] == "tensors"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--force"], "--baseline-reference and --force go with --baseline FP32.onnx"),
        (["--baseline", "{fp32}"], "--baseline needs --data DIR"),
        (["--baseline", "{model}", "--data", "{data}"], "is the model pushed itself"),
        (["--baseline", "{fp32}", "--data", "{data}"], "give it with --runtime runtime.yaml"),
        (["--baseline", "{bigger}", "--data", "{data}", "--runtime", "{runtime}"], "B's inputs"),
    ],
)
def test_bad_gate_options_are_refused_before_anything_is_sent(
    cli: Cli,
    api: ApiClient,
    tmp_path: Path,
    fp32: Path,
    runtime: Path,
    data: Path,
    args: list[str],
    message: str,
) -> None:
    model = scaled(fp32, tmp_path / "model.onnx", "fc_w", 1.001)
    bigger = sample_models.tiny_detector(tmp_path / "bigger.onnx", size=48)
    paths = {"fp32": fp32, "model": model, "data": data, "runtime": runtime, "bigger": bigger}
    code, _, err = cli.push(model, *[a.format(**paths) for a in args])
    assert code == 1 and message in " ".join(err.split())
    assert "models/det/1.0.0/model.onnx" not in signed_targets(api).signed.targets


def test_force_pushes_below_the_threshold_audited_and_recorded_as_forced(
    cli: Cli, api: ApiClient, tmp_path: Path, fp32: Path, runtime: Path, data: Path
) -> None:
    broken = scaled(fp32, tmp_path / "broken.onnx", "fc_w", -4.0)
    code, out, err = cli.push(broken, *gate(fp32, runtime, data, "--force"))
    assert code == 0, err
    check = json.loads(out)["release_check"]
    assert (check["verdict"], check["forced"]) == ("failed", True)
    assert float(check["value"]) < 0.99
    code, out, err = cli.run("-o", "json", "audit", "list", "--action",
                             "model.release_check.forced")  # fmt: skip
    assert code == 0, err
    (entry,) = json.loads(out)
    assert entry["target"] == f"fleet:{FLEET}/det@1.0.0" and entry["outcome"] == "ok"
    assert entry["details"]["value"] == check["value"]
    assert entry["details"]["threshold"] == "0.99"
    code, out, err = cli.run("model", "show", "det", "--fleet", FLEET, "--version", "1.0.0")
    assert code == 0 and "failed (forced through with --force): top1_ratio" in out
    # --force on a passing model records nothing forced, and audits no forcing.
    close = scaled(fp32, tmp_path / "close.onnx", "fc_w", 1.001)
    code, out, err = cli.push(close, *gate(fp32, runtime, data, "--force"), version="1.0.1")
    assert code == 0, err
    assert json.loads(out)["release_check"]["forced"] is False
    code, out, _ = cli.run("-o", "json", "audit", "list", "--action", "model.release_check.forced")
    assert len(json.loads(out)) == 1


def _republished(
    api: ApiClient, keyset: OperatorKeyset, change: dict[str, Any]
) -> Metadata[Targets]:
    """The signed targets with det 1.0.0's entries copied to 2.0.0, its release check
    changed by `change` (None values removed), signed by the operator's own key."""
    current = signed_targets(api)
    new = Metadata[Targets].from_bytes(tufrepo.to_bytes(current))
    new.signed.version += 1
    old = new.signed.targets["models/det/1.0.0/model.onnx"]
    custom = json.loads(json.dumps(old.custom))
    custom.update(version="2.0.0", release_counter=2)
    custom["reference"]["path"] = "models/det/2.0.0/reference.npz"
    report = {**custom["release_check"], **change}
    custom["release_check"] = {k: v for k, v in report.items() if v is not None}
    new.signed.targets["models/det/2.0.0/model.onnx"] = TargetFile(
        old.length, dict(old.hashes), "models/det/2.0.0/model.onnx", {"custom": custom}
    )
    ref = new.signed.targets["models/det/1.0.0/reference.npz"]
    new.signed.targets["models/det/2.0.0/reference.npz"] = TargetFile(
        ref.length, dict(ref.hashes), "models/det/2.0.0/reference.npz"
    )
    keyset.sign_targets(new)
    return new


@pytest.mark.parametrize(
    ("change", "field", "detail"),
    [
        ({"value": "0.5"}, "custom.release_check.verdict", "'passed' does not follow from"),
        ({"forced": True}, "custom.release_check.forced", "only a failed check is forced"),
        ({"value": 1}, "custom.release_check.value", "expected a decimal number as a string"),
        ({"threshold": "1.5"}, "custom.release_check.threshold", "must be in [0, 1]"),
        ({"kind": "segmentation"}, "custom.release_check.kind", "expected one of"),
        ({"judged_on": "recall"}, "custom.release_check.judged_on", "judged on 'top1_ratio'"),
        ({"baseline_sha256": "xyz"}, "custom.release_check.baseline_sha256", "64 lowercase"),
        ({"outputs": []}, "custom.release_check.outputs", "expected a list of 1-256"),
        ({"decoded": None}, "custom.release_check.decoded.top1_ratio", "needs it"),
        ({"samples": 0}, "custom.release_check.samples", "must be >= 1"),
        ({"cpu": None}, "custom.release_check.cpu", "missing"),
    ],
)
def test_the_server_refuses_a_report_it_cannot_sign_for(
    cli: Cli,
    api: ApiClient,
    keyset: OperatorKeyset,
    tmp_path: Path,
    fp32: Path,
    runtime: Path,
    data: Path,
    change: dict[str, Any],
    field: str,
    detail: str,
) -> None:
    close = scaled(fp32, tmp_path / "close.onnx", "fc_w", 1.001)
    assert cli.push(close, *gate(fp32, runtime, data))[0] == 0
    before = signed_targets(api).signed.version
    with pytest.raises(ApiError) as refused:
        api.push_targets(FLEET, tufrepo.to_bytes(_republished(api, keyset, change)))
    assert refused.value.status == 400
    assert refused.value.problem["field"] == field
    assert detail in refused.value.detail
    assert signed_targets(api).signed.version == before
    # The same parser on this side: what the CLI builds is checked before it is signed.
    with pytest.raises(InvalidInputError):
        report = {**signed_targets(api).signed.targets["models/det/1.0.0/model.onnx"].custom[
            "release_check"], **change}  # fmt: skip
        parse_release_check({k: v for k, v in report.items() if v is not None})


def test_the_baseline_reproduces_its_reference_first(
    cli: Cli, api: ApiClient, tmp_path: Path, fp32: Path, runtime: Path, data: Path
) -> None:
    close = scaled(fp32, tmp_path / "close.onnx", "fc_w", 1.001)
    bgr = reference_pair(tmp_path / "bgr.npz", fp32, mean=(0.5,), std=(0.5,), order="BGR")
    code, _, err = cli.push(close, *gate(fp32, runtime, data, "--baseline-reference", str(bgr)))
    message = " ".join(err.split())
    assert code == 1 and "normalisation mismatch" in message and "0.5, std 0.5), BGR" in message
    assert "models/det/1.0.0/model.onnx" not in signed_targets(api).signed.targets
    imagenet = reference_pair(
        tmp_path / "imagenet.npz", fp32, mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225)
    )
    code, out, err = cli.push(
        close, *gate(fp32, runtime, data, "--baseline-reference", str(imagenet))
    )
    assert code == 0, err
    assert json.loads(out)["release_check"]["verdict"] == "passed"
