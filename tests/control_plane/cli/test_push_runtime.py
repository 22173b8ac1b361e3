"""`model push --runtime`: the signed version says how to run it (issue 12 §1).

Against a real control plane: the runtime spec ends up in the signed targets metadata,
the reference is a camera-sized frame through the same preprocessing the node runs, and
whatever every node would refuse is refused before anything is uploaded or published.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper
from PIL import Image
from tuf.api.metadata import Metadata, TargetFile, Targets

from control_plane.artifacts.local import LocalArtifactStore
from control_plane.cli.client import ApiClient, ApiError
from control_plane.cli.main import main
from control_plane.cli.release import ReleaseClient
from control_plane.errors import InvalidInputError
from control_plane.registry import sample_models
from control_plane.registry.reference_frame import generated_frame
from control_plane.trust import repository as tufrepo
from control_plane.trust.keys import OperatorKeyset, init_operator_keys
from protos.bundle.preprocess import Preprocessor
from protos.bundle.spec import TensorSig, resolve_input, runtime_of_custom
from tests.control_plane.conftest import LiveServer

FLEET = "yards"

RUNTIME = """\
preprocess:
  layout: NCHW
  mean: [0.485, 0.456, 0.406]
  std: [0.229, 0.224, 0.225]
output:
  decoder: classification
  top_k: 2
labels: [person, vehicle, bicycle, animal]
"""


@pytest.fixture
def database_url(sqlite_url: str) -> str:
    """The storage backend is not what these tests are about: SQLite only."""
    return sqlite_url


@pytest.fixture
def keys(tmp_path: Path) -> Path:
    init_operator_keys(tmp_path / "keys", root_keys=1, root_threshold=1, passphrase=None)
    return tmp_path / "keys"


@pytest.fixture
def keyset(keys: Path) -> OperatorKeyset:
    from control_plane.trust.keys import load_operator_keyset

    return load_operator_keyset(keys, None)


@pytest.fixture
def api(live_server: LiveServer, keyset: OperatorKeyset) -> Any:
    with live_server.api() as client:
        ReleaseClient(client, keyset).create_fleet(FLEET)
        yield client


class Cli:
    def __init__(self, server: LiveServer, capsys: pytest.CaptureFixture[str], keys: Path) -> None:
        self.server, self.capsys, self.keys = server, capsys, keys

    def run(self, *args: str) -> tuple[int, str, str]:
        self.capsys.readouterr()
        code = main(["--server", self.server.url, "--token", self.server.admin_token, *args])
        out, err = self.capsys.readouterr()
        return code, out, err

    def push(self, model: Path, *extra: str, version: str = "1.0.0") -> tuple[int, str, str]:
        return self.run(
            "--output",
            "json",
            "model",
            "push",
            str(model),
            "--fleet",
            FLEET,
            "--name",
            "det",
            "--version",
            version,
            "--keys",
            str(self.keys),
            *extra,
        )


@pytest.fixture
def cli(
    live_server: LiveServer,
    capsys: pytest.CaptureFixture[str],
    keys: Path,
    api: ApiClient,
    monkeypatch: pytest.MonkeyPatch,
) -> Cli:
    monkeypatch.setenv("COLUMNS", "200")  # tables as wide as their rows: no wrapped cells
    return Cli(live_server, capsys, keys)


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def stored_files(server: LiveServer) -> list[Path]:
    store = server.services.store
    assert isinstance(store, LocalArtifactStore)
    return sorted(p for p in (store.root / "sha256").rglob("*") if p.is_file())


def signed_targets(api: ApiClient) -> Metadata[Targets]:
    return tufrepo.parse_metadata(api.metadata(FLEET, "targets.json"), Targets)


def stored_reference(server: LiveServer, api: ApiClient, version: str) -> dict[str, Any]:
    target = signed_targets(api).signed.targets[f"models/det/{version}/reference.npz"]
    store = server.services.store
    assert isinstance(store, LocalArtifactStore)
    with np.load(store.path_of(target.hashes["sha256"]), allow_pickle=False) as archive:
        return {key: archive[key] for key in archive.files}


def ort_outputs(model: Path, inputs: dict[str, Any]) -> dict[str, Any]:
    session = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(names, inputs), strict=True))


def dynamic_model(path: Path) -> Path:
    """images float32 [N, 3, H, W] -> scores [N, 3] (the mean of each channel)."""
    graph = helper.make_graph(
        [helper.make_node("ReduceMean", ["images"], ["scores"], axes=[2, 3], keepdims=0)],
        "dynamic",
        [helper.make_tensor_value_info("images", TensorProto.FLOAT, ["N", 3, "H", "W"])],
        [helper.make_tensor_value_info("scores", TensorProto.FLOAT, ["N", 3])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path.write_bytes(model.SerializeToString())
    return path


def declaring_model(path: Path) -> Path:
    """The sample detector, declaring in its own metadata that it was trained on inputs
    normalised with mean 0.5, std 0.5 (RUNTIME says ImageNet's)."""
    model = onnx.load(sample_models.tiny_detector(path))
    entry = model.metadata_props.add()
    entry.key, entry.value = "edgefleet.preprocess", json.dumps({"mean": 0.5, "std": 0.5})
    onnx.save(model, path)
    return path


def transposed_model(path: Path) -> Path:
    """images [1, 3, 8, 8] -> scores declared [a, b], really [3, 1]: the outputs'
    signature passes the static check, the classification decoder cannot read them."""
    graph = helper.make_graph(
        [
            helper.make_node("ReduceMean", ["images"], ["means"], axes=[2, 3], keepdims=0),
            helper.make_node("Transpose", ["means"], ["scores"], perm=[1, 0]),
        ],
        "transposed",
        [helper.make_tensor_value_info("images", TensorProto.FLOAT, [1, 3, 8, 8])],
        [helper.make_tensor_value_info("scores", TensorProto.FLOAT, ["a", "b"])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path.write_bytes(model.SerializeToString())
    return path


# ----------------------------------------------------------------------- signed and used


def test_a_push_with_a_runtime_signs_it_and_makes_the_reference_from_a_frame(
    cli: Cli, live_server: LiveServer, api: ApiClient, tmp_path: Path
) -> None:
    model = sample_models.tiny_detector(tmp_path / "det.onnx")
    code, out, err = cli.push(model, "--runtime", str(write(tmp_path / "rt.yaml", RUNTIME)))
    assert code == 0, err
    pushed = json.loads(out)
    assert pushed["runtime"]["decoder"] == "classification"
    assert pushed["reference"]["frame"] == [480, 640]
    assert pushed["reference"]["inputs"] == {"images": [1, 3, 32, 32]}
    assert pushed["reference"]["decoded"]["kind"] == "classification"

    # Read back from the signed TUF targets metadata: the canonical form, reals as
    # decimal strings, the size resolved to the model's.
    custom = signed_targets(api).signed.targets["models/det/1.0.0/model.onnx"].custom
    assert custom["runtime"] == {
        "format": 1,
        "preprocess": {
            "layout": "NCHW",
            "size": [32, 32],
            "resize": "bilinear",
            "fit": "stretch",
            "pad_value": 114,
            "mean": ["0.485", "0.456", "0.406"],
            "std": ["0.229", "0.224", "0.225"],
            "scale": "0.00392156862745098",
            "dtype": "float32",
            "channel_order": "RGB",
        },
        "output": {
            "decoder": "classification",
            "top_k": 2,
            "softmax": False,
            "score_threshold": "0.25",
        },
        "labels": ["person", "vehicle", "bicycle", "animal"],
    }

    # The reference: a camera-sized frame, the tensor the node's preprocessing makes of
    # it with the signed config, and ONNX Runtime's outputs on that tensor.
    reference = stored_reference(live_server, api, "1.0.0")
    assert sorted(reference) == ["frame", "input/images", "output/scores"]
    frame = reference["frame"]
    assert (frame.shape, frame.dtype) == ((480, 640, 3), np.uint8)
    np.testing.assert_array_equal(frame, generated_frame())
    spec = runtime_of_custom(custom)
    assert spec is not None
    config, channels = resolve_input(
        spec.preprocess, [TensorSig("images", "float32", (1, 3, 32, 32))]
    )
    np.testing.assert_array_equal(reference["input/images"], Preprocessor(config, channels)(frame))
    np.testing.assert_allclose(
        reference["output/scores"],
        ort_outputs(model, {"images": reference["input/images"]})["scores"],
        rtol=1e-6,
    )

    # model show: the REST view summarises it, the CLI shows it in words.
    shown = api.json("GET", f"/v1/fleets/{FLEET}/models/det/versions/1.0.0")
    assert shown["runtime"]["preprocess"]["size"] == [32, 32]
    assert shown["runtime"]["params"] == {"top_k": 2, "softmax": False, "score_threshold": 0.25}
    assert (shown["runtime"]["labels"], shown["runtime"]["first_labels"][:2]) == (
        4,
        ["person", "vehicle"],
    )
    code, out, err = cli.run("model", "show", "det", "--fleet", FLEET, "--version", "1.0.0")
    assert code == 0, err
    assert "NCHW float32 RGB, size 32x32" in out
    assert "classification (top_k 2, softmax false, score_threshold 0.25)" in out
    assert "4 (person, vehicle, bicycle, animal)" in out
    code, out, err = cli.run("model", "show", "det", "--fleet", FLEET)
    assert code == 0, err
    assert "classification, 4 labels" in out


def test_a_dynamic_model_takes_its_size_from_the_runtime(
    cli: Cli, live_server: LiveServer, api: ApiClient, tmp_path: Path
) -> None:
    model = dynamic_model(tmp_path / "dyn.onnx")
    runtime = write(
        tmp_path / "rt.yaml",
        "preprocess: {size: [96, 128], mean: 0.5, std: 0.5}\n"
        "output: {decoder: classification, top_k: 1}\n"
        "labels: [r, g, b]\n",
    )
    frame = generated_frame(240, 320)
    Image.fromarray(frame).save(tmp_path / "frame.png")
    code, _, err = cli.push(
        model, "--runtime", str(runtime), "--reference-frame", str(tmp_path / "frame.png")
    )
    assert code == 0, err
    custom = signed_targets(api).signed.targets["models/det/1.0.0/model.onnx"].custom
    assert custom["runtime"]["preprocess"]["size"] == [96, 128]
    reference = stored_reference(live_server, api, "1.0.0")
    np.testing.assert_array_equal(reference["frame"], frame)  # the operator's, lossless
    assert reference["input/images"].shape == (1, 3, 96, 128)
    spec = runtime_of_custom(custom)
    assert spec is not None
    expected = Preprocessor(spec.preprocess, 3)(frame)
    np.testing.assert_array_equal(reference["input/images"], expected)


def test_a_dynamic_model_without_a_runtime_or_an_input_is_refused(
    live_server: LiveServer, api: ApiClient, keyset: OperatorKeyset, tmp_path: Path
) -> None:
    model = dynamic_model(tmp_path / "dyn.onnx")
    with pytest.raises(InvalidInputError, match="--runtime") as refused:
        ReleaseClient(api, keyset).push_model(FLEET, model, name="det", version="1.0.0")
    assert "proves nothing" in refused.value.message
    assert stored_files(live_server) == []
    assert signed_targets(api).signed.version == 1


def test_an_old_style_push_still_works_and_shows_no_runtime(
    cli: Cli, live_server: LiveServer, api: ApiClient, tmp_path: Path
) -> None:
    model = sample_models.tiny_detector(tmp_path / "det.onnx")
    images = np.full((1, 3, 32, 32), 0.5, np.float32)
    np.save(tmp_path / "in.npy", images)
    code, out, err = cli.push(model, "--reference-input", str(tmp_path / "in.npy"))
    assert code == 0, err
    assert json.loads(out)["runtime"] is None
    custom = signed_targets(api).signed.targets["models/det/1.0.0/model.onnx"].custom
    assert "runtime" not in custom
    reference = stored_reference(live_server, api, "1.0.0")
    assert sorted(reference) == ["input/images", "output/scores"]
    np.testing.assert_array_equal(reference["input/images"], images)
    assert api.json("GET", f"/v1/fleets/{FLEET}/models/det/versions/1.0.0")["runtime"] is None
    code, out, err = cli.run("model", "show", "det", "--fleet", FLEET, "--version", "1.0.0")
    assert code == 0, err
    assert "none signed" in out


# ----------------------------------------------------------------------------- refusals


@pytest.mark.parametrize(
    ("model_kind", "runtime", "shown"),
    [
        pytest.param(
            "fixed",
            RUNTIME.replace("layout: NCHW", "layout: NHWC"),
            ["runtime.preprocess.layout", "32 on axis 3", "looks NCHW", "layout NHWC"],
            id="layout-contradicts-the-input",
        ),
        pytest.param(
            "fixed",
            RUNTIME.replace("layout: NCHW", "layout: NCHW\n  size: [64, 64]"),
            ["runtime.preprocess.size", "the model has 32", "size [64, 64]"],
            id="size-contradicts-a-fixed-input",
        ),
        pytest.param(
            "fixed",
            RUNTIME.replace(
                "layout: NCHW", "layout: NCHW\n  dtype: uint8\n  scale: 1\n  mean: 0\n  std: 1"
            ).replace("  mean: [0.485, 0.456, 0.406]\n  std: [0.229, 0.224, 0.225]\n", ""),
            ["runtime.preprocess.dtype", "the model has float32", "dtype uint8"],
            id="dtype-contradicts-the-input",
        ),
        pytest.param(
            "dynamic",
            "output: {decoder: raw}\n",
            ["runtime.preprocess.size", "dynamic height/width", "set preprocess.size"],
            id="dynamic-input-needs-a-size",
        ),
        pytest.param(
            "fixed",
            RUNTIME.replace("decoder: classification", "decoder: ssd"),
            ["runtime.output.decoder", "classification, yolo, yolox, raw", "'ssd'"],
            id="unknown-decoder",
        ),
        pytest.param(
            "fixed",
            RUNTIME.replace("top_k: 2", "top_k: 2\n  iou_threshold: 0.5"),
            ["runtime.output", "unknown key(s) iou_threshold"],
            id="unknown-decoder-parameter",
        ),
        pytest.param(
            "fixed",
            RUNTIME.replace("labels: [person, vehicle, bicycle, animal]", "labels: [a, b, c]"),
            ["runtime.labels", "4 classes", "3 labels"],
            id="class-count-against-labels",
        ),
        pytest.param(
            "fixed",
            RUNTIME.replace("top_k: 2", "top_k: 2\n  output: boxes"),
            ["runtime.output.output", "['scores']", "'boxes'"],
            id="output-tensor-not-in-the-model",
        ),
        pytest.param(
            "transposed",
            RUNTIME.replace("labels: [person, vehicle, bicycle, animal]\n", ""),
            ["runtime.output", "cannot read the model's outputs", "[3, 1]"],
            id="decoder-fails-on-the-real-outputs",
        ),
        pytest.param(
            "declaring",
            RUNTIME,
            ["runtime.preprocess.mean", "edgefleet.preprocess", "the model has 0.5"],
            id="normalisation-the-model-declares-otherwise",
        ),
        pytest.param(
            "fixed",
            "preprocess: {layout: NCHW\n",
            ["not valid YAML"],
            id="not-yaml",
        ),
        pytest.param("fixed", "[1, 2]\n", ["must hold a mapping"], id="not-a-mapping"),
        pytest.param("fixed", None, ["cannot read runtime file"], id="missing-file"),
    ],
)
def test_what_every_node_would_refuse_is_refused_before_any_upload(
    cli: Cli,
    live_server: LiveServer,
    api: ApiClient,
    tmp_path: Path,
    model_kind: str,
    runtime: str | None,
    shown: list[str],
) -> None:
    builders = {
        "fixed": lambda p: sample_models.tiny_detector(p),
        "dynamic": dynamic_model,
        "transposed": transposed_model,
        "declaring": declaring_model,
    }
    model = builders[model_kind](tmp_path / "m.onnx")
    path = tmp_path / "runtime.yaml"
    if runtime is not None:
        path.write_text(runtime)
    code, _, err = cli.push(model, "--runtime", str(path))
    assert code == 1
    message = " ".join(err.split())  # rich wraps long lines
    for part in shown:
        assert part in message, (part, message)
    assert stored_files(live_server) == []
    assert signed_targets(api).signed.version == 1
    assert api.json("GET", f"/v1/fleets/{FLEET}/models") == []


def test_reference_options_that_do_not_go_together_are_refused(
    cli: Cli, live_server: LiveServer, tmp_path: Path
) -> None:
    model = sample_models.tiny_detector(tmp_path / "det.onnx")
    np.save(tmp_path / "in.npy", np.zeros((1, 3, 32, 32), np.float32))
    np.save(tmp_path / "frame.npy", generated_frame())
    runtime = write(tmp_path / "rt.yaml", RUNTIME)
    code, _, err = cli.push(
        model, "--runtime", str(runtime), "--reference-input", str(tmp_path / "in.npy")
    )
    assert code == 1
    assert "--reference-frame" in err
    code, _, err = cli.push(model, "--reference-frame", str(tmp_path / "frame.npy"))
    assert code == 1
    assert "needs --runtime" in err
    assert stored_files(live_server) == []


def test_the_server_refuses_a_signed_runtime_that_contradicts_the_signature(
    api: ApiClient, keyset: OperatorKeyset, tmp_path: Path
) -> None:
    """A client that skips the CLI's checks: the control plane runs them on push too."""
    model = sample_models.tiny_detector(tmp_path / "det.onnx")
    ReleaseClient(api, keyset).push_model(FLEET, model, name="det", version="1.0.0")
    current = signed_targets(api)
    new = Metadata[Targets].from_bytes(tufrepo.to_bytes(current))
    new.signed.version += 1
    old = new.signed.targets["models/det/1.0.0/model.onnx"]
    custom = json.loads(json.dumps(old.custom))
    custom.update(version="2.0.0", release_counter=2)
    custom["reference"]["path"] = "models/det/2.0.0/reference.npz"
    custom["runtime"] = {
        "preprocess": {"size": [64, 64]},
        "output": {"decoder": "classification"},
    }
    new.signed.targets["models/det/2.0.0/model.onnx"] = TargetFile(
        old.length, dict(old.hashes), "models/det/2.0.0/model.onnx", {"custom": custom}
    )
    ref = new.signed.targets["models/det/1.0.0/reference.npz"]
    new.signed.targets["models/det/2.0.0/reference.npz"] = TargetFile(
        ref.length, dict(ref.hashes), "models/det/2.0.0/reference.npz"
    )
    keyset.sign_targets(new)
    with pytest.raises(ApiError) as refused:
        api.push_targets(FLEET, tufrepo.to_bytes(new))
    assert refused.value.status == 400
    assert refused.value.problem["field"] == "custom.runtime.preprocess.size"
    assert "the model has 32" in refused.value.detail
    assert signed_targets(api).signed.version == current.signed.version
