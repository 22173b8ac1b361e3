"""The update world: a fleet's TUF repository and director in memory, and a stand-in for a
node's runtime, so the real update path (reconciler, update task) runs without a server.

Built from `tuf` and `securesystemslib` directly, as an operator and a control plane would
sign (real keys, real signatures, consistent snapshots), and served through a
`MemoryLinkPeer`; the edge node never imports the control plane. Models are tiny ONNX
graphs with their reference pairs: echo models of `SHAPE` with the older, preprocessed-only
pair, and image models (`release_image`) with a runtime spec signed into `custom.runtime`
and the reference `model push` makes today (a camera `frame`, the tensor
`protos.bundle.preprocess` made of it, and ONNX Runtime's outputs on that tensor).
Not here: a control plane's rules for accepting a push (the world signs whatever it is
told), test assertions.
"""

from __future__ import annotations

import asyncio
import errno
import hashlib
import io
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import anyio
import numpy as np
from securesystemslib.signer import CryptoSigner, Key
from tuf.api.metadata import (
    Metadata,
    MetaFile,
    Root,
    Snapshot,
    TargetFile,
    Targets,
    Timestamp,
)

from edge_node.agent.update_task import UpdateTask, UpdateTaskSettings
from edge_node.clock import ManualClock, TaskClock
from edge_node.enroll import EnrollmentFiles
from edge_node.fsutil import atomic_write
from edge_node.link.base import Backoff, NodeLink
from edge_node.testing.memory_link import MemoryLinkPeer, MemoryNodeLink
from edge_node.updater.config import UpdaterConfig
from edge_node.updater.director import ROOT_DIRECTOR_KEYS_FIELD
from edge_node.updater.host import ModelBundle, ModelHost, ShadowHost, ShadowSettings, Trial
from edge_node.updater.journal import Journal
from edge_node.updater.reconciler import (
    AssignmentTrust,
    Reconciler,
    ReconcilerLimits,
    SelfTest,
    UpdateReport,
)
from edge_node.updater.selftest import SelfTestResult, TrialLoader, self_test
from edge_node.updater.store import DiskUsage, ModelStore
from edge_node.updater.tuf_fetch import TufClient, floor_target_path
from edge_node.updater.watchdog import ModelHealth, WatchdogConfig
from protos.bundle.decoders import build_decoder
from protos.bundle.preprocess import Preprocessor
from protos.bundle.results import Decoded
from protos.bundle.spec import (
    OutputSpec,
    PreprocessConfig,
    RuntimeSpec,
    TensorSig,
    check_outputs,
    resolve_input,
)
from protos.edgefleet.fleet.v1.director_pb2 import (
    DirectorAssignment,
    ShadowTarget,
    SignedDirectorAssignment,
)

if TYPE_CHECKING:
    import numpy.typing as npt
    import onnx

__all__ = [
    "FLEET",
    "MODEL",
    "NODE",
    "SHAPE",
    "BareModel",
    "FakeModelHost",
    "Release",
    "UpdateWorld",
    "echo_model_bytes",
    "fragile_model_bytes",
    "frame_reference_bytes",
    "image_io",
    "image_model_bytes",
    "image_runtime",
    "model_target_path",
    "reference_frame",
    "reference_pair_bytes",
]

NODE: Final = "n-0123456789ab"
FLEET: Final = "gates"
MODEL: Final = "det"
SHAPE: Final = (1, 4)
"""Input and output shape of the world's echo models."""
ROOT, TARGETS, SNAPSHOT, TIMESTAMP = "root", "targets", "snapshot", "timestamp"  # TUF roles
_YEAR: Final = timedelta(days=365)
_MONTH: Final = timedelta(days=30)
_FORMAT: Final = 1  # the `edgefleet` format version of custom fields and assignments
_OPSET: Final = 17  # of the default ONNX domain, in every model the world builds
_ARCH: Final = ("x86_64", "aarch64")  # a release's `compat.arch`, as `model push` signs it


def model_target_path(model: str, version: str) -> str:
    """`models/<model>/<version>/model.onnx`, as docs/protocol.md names model targets."""
    return f"models/{model}/{version}/model.onnx"


def _reference_target_path(model: str, version: str) -> str:
    return f"models/{model}/{version}/reference.npz"


def echo_model_bytes(add: float, shape: tuple[int, ...] = SHAPE) -> bytes:
    """An ONNX model `y = images + add` (float32); distinct `add`, distinct bytes.

    Needs `onnx` (the `dev` and `cli` extras have it; a box's `node` extra does not)."""
    from onnx import TensorProto, helper, numpy_helper

    graph = helper.make_graph(
        [helper.make_node("Add", ["images", "c"], ["y"])],
        "echo",
        inputs=[helper.make_tensor_value_info("images", TensorProto.FLOAT, list(shape))],
        outputs=[helper.make_tensor_value_info("y", TensorProto.FLOAT, list(shape))],
        initializer=[numpy_helper.from_array(np.array(add, dtype=np.float32), "c")],
    )
    return _serialized(graph)


def fragile_model_bytes(shape: tuple[int, ...] = SHAPE) -> bytes:
    """An ONNX model fine on its reference input (values in [0, 1)) and on dark frames,
    which fails on a frame with a white pixel (1.0 after scaling): it indexes past the
    end of a table, which ONNX Runtime refuses. A model that passes its self-test and
    then fails on the cameras (the watchdog's case).

    Needs `onnx` (the `dev` and `cli` extras have it; a box's `node` extra does not)."""
    from onnx import TensorProto, helper, numpy_helper

    images = helper.make_tensor_value_info("images", TensorProto.FLOAT, list(shape))
    graph = helper.make_graph(
        [
            helper.make_node("ReduceMax", ["images"], ["peak"], keepdims=0),
            helper.make_node("Floor", ["peak"], ["floored"]),
            helper.make_node("Cast", ["floored"], ["index"], to=TensorProto.INT64),
            helper.make_node("Gather", ["table", "index"], ["score"], axis=0),
        ],
        "fragile",
        inputs=[images],
        outputs=[helper.make_tensor_value_info("score", TensorProto.FLOAT, [])],
        initializer=[numpy_helper.from_array(np.array([0.5], dtype=np.float32), "table")],
    )
    return _serialized(graph)


def _serialized(graph: onnx.GraphProto) -> bytes:
    import onnx
    from onnx import helper

    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", _OPSET)])
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=True)
    return bytes(model.SerializeToString())


def reference_pair_bytes(add: float, shape: tuple[int, ...] = SHAPE) -> bytes:
    """The reference pair (`.npz` with `input/images`, `output/y`) of `echo_model_bytes(add)`."""
    x = np.arange(int(np.prod(shape)), dtype=np.float32).reshape(shape)
    buffer = io.BytesIO()
    arrays: dict[str, Any] = {"input/images": x, "output/y": x + np.float32(add)}
    np.savez(buffer, **arrays)
    return buffer.getvalue()


def image_model_bytes(size: tuple[int, int], add: float = 0.0) -> bytes:
    """An image model `y = images + add` on a float32 [1, 3, height, width] input: its
    output shows exactly what it was fed (size and normalisation).

    Needs `onnx` (the `dev` and `cli` extras have it; a box's `node` extra does not)."""
    return echo_model_bytes(add, (1, 3, *size))


def image_io(size: tuple[int, int]) -> dict[str, Any]:
    """`custom.io` of `image_model_bytes(size)`, as `model push` signs it."""
    tensor = {"dtype": "float32", "shape": [1, 3, *size]}
    return {"inputs": [{"name": "images", **tensor}], "outputs": [{"name": "y", **tensor}]}


def image_runtime(
    size: tuple[int, int] | None = None,
    mean: tuple[float, ...] = (0.0,),
    std: tuple[float, ...] = (1.0,),
    *,
    output: OutputSpec | None = None,
    labels: tuple[str, ...] = (),
) -> RuntimeSpec:
    """A runtime spec for an image model: `size` None takes the model's own."""
    return RuntimeSpec(
        preprocess=PreprocessConfig(size=size, mean=mean, std=std),
        output=output or OutputSpec(decoder="raw", threshold=0.5),
        labels=labels,
    )


def reference_frame(height: int = 48, width: int = 64) -> npt.NDArray[np.uint8]:
    """A deterministic RGB frame with structure (gradients, a bright block), not noise:
    what `model push` uses when the operator gives no `--reference-frame`."""
    ys, xs = np.mgrid[0:height, 0:width]
    frame = np.empty((height, width, 3), dtype=np.uint8)
    frame[..., 0] = (xs * 255 // max(1, width - 1)).astype(np.uint8)
    frame[..., 1] = (ys * 255 // max(1, height - 1)).astype(np.uint8)
    frame[..., 2] = ((xs + ys) * 4 % 256).astype(np.uint8)
    frame[height // 4 : height // 2, width // 4 : width // 2] = 250
    return frame


def frame_reference_bytes(
    model: bytes, preprocess: PreprocessConfig, frame: npt.NDArray[np.uint8] | None = None
) -> bytes:
    """The reference pair `model push` makes today: `frame`, `input/<name>` (the tensor
    `protos.bundle.preprocess` makes of it with `preprocess`, resolved against the model)
    and `output/<name>` (ONNX Runtime's outputs on that tensor)."""
    import onnxruntime as ort

    frame = reference_frame() if frame is None else frame
    session = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    (model_input,) = session.get_inputs()
    sig = TensorSig.of(model_input.name, "float32", model_input.shape)
    resolved, channels = resolve_input(preprocess, [sig])
    tensor = Preprocessor(resolved, channels)(frame)
    names = [o.name for o in session.get_outputs()]
    outputs = session.run(names, {model_input.name: tensor})
    arrays: dict[str, Any] = {"frame": frame, f"input/{model_input.name}": tensor}
    arrays.update({f"output/{name}": value for name, value in zip(names, outputs, strict=True)})
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    return buffer.getvalue()


class BareModel:
    """A model in a bare one-thread CPU ONNX Runtime session with its bundle's
    preprocessing and decoder (a `TrialModel`): what `FakeModelHost` self-tests, standing
    in for the runtime's serving session. The preprocessing is resolved on first use (an
    echo model of `SHAPE` takes no frames, and never needs it)."""

    def __init__(
        self,
        path: Path,
        runtime: RuntimeSpec | None = None,
        preprocess: PreprocessConfig | None = None,
    ) -> None:
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        options.inter_op_num_threads = 1
        self._session = ort.InferenceSession(
            str(path), sess_options=options, providers=["CPUExecutionProvider"]
        )
        self._path = Path(path)
        self._names = [o.name for o in self._session.get_outputs()]
        self._runtime = runtime
        self._config = runtime.preprocess if runtime is not None else preprocess
        self._preprocessor: Preprocessor | None = None
        if runtime is not None:
            check_outputs(
                runtime,
                [TensorSig.of(o.name, "float32", o.shape) for o in self._session.get_outputs()],
            )

    def _prepared(self) -> Preprocessor:
        if self._preprocessor is None:
            model_input = self._session.get_inputs()[0]
            sig = TensorSig.of(model_input.name, "float32", model_input.shape)
            resolved, channels = resolve_input(self._config or PreprocessConfig(), [sig])
            self._preprocessor = Preprocessor(resolved, channels)
        return self._preprocessor

    def run_inputs(self, inputs: Mapping[str, Any]) -> dict[str, Any]:
        values = self._session.run(self._names, dict(inputs))
        return {name: np.asarray(v) for name, v in zip(self._names, values, strict=True)}

    def prepare(self, frame: npt.NDArray[np.uint8]) -> dict[str, Any]:
        return {self._session.get_inputs()[0].name: self._prepared()(frame)}

    def decode(self, outputs: Mapping[str, Any], frame_h: int, frame_w: int) -> Decoded:
        preprocessor = self._prepared()
        spec = self._runtime or RuntimeSpec(preprocess=preprocessor.config)
        return build_decoder(spec).decode(outputs, preprocessor.geometry(frame_h, frame_w))


@dataclass
class Release:
    version: str
    path: str
    data: bytes
    sha256: str


@dataclass
class FakeModelHost:
    """A node's runtime as the update path sees it (`ModelHost`): it records what it
    was told to serve (`served` paths, `bundles`), runs a trial's self-test on a
    `BareModel` of the bundle (the node's preprocess config `preprocess` for a version
    without a spec), refuses the paths in `refuse`, holds each swap at `gate` while it
    is set, and reports the run counters a test puts in `counters` (by model path);
    `stop_serving` clears `serving`.

    As a `ShadowHost` it self-tests a shadow candidate the same way and records what runs
    in shadow (`shadows`: the bundle and settings, None once stopped)."""

    served: list[Path] = field(default_factory=list)
    bundles: list[ModelBundle] = field(default_factory=list)
    counters: dict[str, tuple[int, int]] = field(default_factory=dict)
    refuse: set[Path] = field(default_factory=set)
    gate: anyio.Event | None = None
    preprocess: PreprocessConfig | None = None
    busy: int = 0
    most_busy: int = 0
    shadows: list[tuple[ModelBundle, ShadowSettings] | None] = field(default_factory=list)
    serving: bool = False
    """A model serves: `served[-1]`, unless `stop_serving` came after it."""
    stops: int = 0
    """How many times `stop_serving` was called."""

    async def serve(
        self, bundle: ModelBundle, *, trial: Trial | None = None
    ) -> SelfTestResult | None:
        self.busy += 1
        self.most_busy = max(self.most_busy, self.busy)
        try:
            if self.gate is not None:
                with anyio.fail_after(10):
                    await self.gate.wait()
            result = None
            if trial is not None:
                preprocess = self.preprocess
                result = await anyio.to_thread.run_sync(
                    trial, lambda: BareModel(bundle.path, bundle.runtime, preprocess)
                )
                if not result.ok:
                    return result
            if bundle.path in self.refuse:
                raise RuntimeError(f"cannot load {bundle.path.name}")
            self.served.append(bundle.path)
            self.bundles.append(bundle)
            self.serving = True
            return result
        finally:
            self.busy -= 1

    async def stop_serving(self) -> None:
        self.serving = False
        self.stops += 1

    def health(self) -> ModelHealth | None:
        if not self.served or not self.serving:
            return None
        model = str(self.served[-1])
        frames, errors = self.counters.get(model, (0, 0))
        return ModelHealth(model, frames, errors)

    async def run_shadow(
        self, bundle: ModelBundle, settings: ShadowSettings, *, trial: Trial
    ) -> SelfTestResult:
        preprocess = self.preprocess
        result = await anyio.to_thread.run_sync(
            trial, lambda: BareModel(bundle.path, bundle.runtime, preprocess)
        )
        if result.ok:
            self.shadows.append((bundle, settings))
        return result

    async def stop_shadow(self) -> None:
        if self.shadows and self.shadows[-1] is not None:
            self.shadows.append(None)

    def shadow_figures(self) -> Mapping[str, Any] | None:
        running = self.shadow
        return None if running is None else {"against": "-", "frames_compared": 0}

    @property
    def shadow(self) -> tuple[ModelBundle, ShadowSettings] | None:
        """What runs in shadow now."""
        return self.shadows[-1] if self.shadows else None


def _signers() -> dict[str, CryptoSigner]:
    return {role: CryptoSigner.generate_ed25519() for role in (ROOT, TARGETS, SNAPSHOT, TIMESTAMP)}


@dataclass
class UpdateWorld:
    """One fleet (`FLEET`) with one model (`MODEL`) and one node (`NODE`) whose data dir
    is `tmp/node`. `peer` serves what `publish()` wrote; `assign()` signs as the director.

    `now` is the fleet's time (its metadata expires a month after it); keep it near the
    real time, since `tuf.ngclient` checks expiry against the system clock.
    """

    tmp: Path
    now: datetime
    peer: MemoryLinkPeer
    director: CryptoSigner
    signers: dict[str, CryptoSigner]
    root: Metadata[Root]
    targets: Metadata[Targets]
    artifacts: dict[str, bytes] = field(default_factory=dict)
    releases: dict[str, Release] = field(default_factory=dict)
    snapshot: Metadata[Snapshot] | None = None
    timestamp: Metadata[Timestamp] | None = None
    sequence: int = 0
    free: int = 10**12
    """Free bytes the node's model store sees."""
    full: bool = False
    """The node's disk is full: journal writes fail with ENOSPC, the store sees 0 free."""
    reports: list[UpdateReport] = field(default_factory=list)
    """What the reconcilers built by `reconciler()` reported, in order."""
    host: FakeModelHost = field(default_factory=FakeModelHost)
    """The default host of `reconciler()`."""

    @classmethod
    def create(
        cls, tmp: Path, *, now: datetime | None = None, versions: tuple[str, ...] = ()
    ) -> UpdateWorld:
        """Root, targets, snapshot and timestamp published; the node's data dir holds the
        fleet root (`tuf-root.json`), as enrollment leaves it. Each of `versions` is
        released in order (the n-th adds n to its input, with release counter n)."""
        now = now or datetime.now(UTC)
        signers = _signers()
        root = Root(expires=now + _YEAR, consistent_snapshot=True)
        for role, signer in signers.items():
            root.add_key(signer.public_key, role)
        root_md = Metadata(root)
        root_md.sign(signers[ROOT])
        targets = Metadata(Targets(version=1, expires=now + _MONTH))
        targets.sign(signers[TARGETS])
        peer = MemoryLinkPeer()
        peer.metadata["1.root.json"] = root_md.to_bytes()
        node = tmp / "node"
        node.mkdir(parents=True, exist_ok=True)
        (node / "tuf-root.json").write_bytes(root_md.to_bytes())
        world = cls(tmp, now, peer, CryptoSigner.generate_ed25519(), signers, root_md, targets)
        world.publish()
        for counter, version in enumerate(versions, start=1):
            world.release(version, add=float(counter), counter=counter)
        return world

    @property
    def activated(self) -> list[Path]:
        """What the default host was told to serve, in order."""
        return self.host.served

    # ------------------------------------------------------------ operator

    def release(
        self,
        version: str,
        add: float,
        counter: int,
        *,
        reference_add: float | None = None,
        content: bytes | None = None,
        reference: bytes | None = None,
        runtime: RuntimeSpec | Mapping[str, Any] | str | None = None,
        io: Mapping[str, Any] | None = None,
        extra: Mapping[str, Any] | None = None,
    ) -> Release:
        """Sign and publish `MODEL` `version` (an echo model adding `add`, or `content`)
        with release counter `counter` and a reference pair (of `reference_add`, or the
        `reference` bytes given). `runtime` goes into `custom.runtime` (a spec, signed in
        its canonical form, or a raw JSON value signed as it is: a malformed one for
        tests; canonical JSON has no floats);
        `io` replaces the echo model's `custom.io`; `extra` adds keys to the custom
        (fields the node does not read, such as `release_check`)."""
        data = content if content is not None else echo_model_bytes(add)
        if reference is None:
            reference = reference_pair_bytes(add if reference_add is None else reference_add)
        path = model_target_path(MODEL, version)
        ref_path = _reference_target_path(MODEL, version)
        # What `edgefleet model push` signs (tests/edge_node/updater/
        # test_world_matches_control_plane.py holds the two equal); `io` and `opset` are
        # the echo model's, whatever `content` is, unless `io` is given.
        tensor = {"dtype": "float32", "shape": list(SHAPE)}
        echo_io = {"inputs": [{"name": "images", **tensor}], "outputs": [{"name": "y", **tensor}]}
        custom: dict[str, Any] = {
            "edgefleet": _FORMAT,
            "kind": "model",
            "model": MODEL,
            "version": version,
            "release_counter": counter,
            "io": dict(io) if io is not None else echo_io,
            "opset": {"": _OPSET},
            "min_agent_version": "0.1.0",
            "compat": {"execution_providers": ["CPUExecutionProvider"], "arch": list(_ARCH)},
            "reference": {
                "path": ref_path,
                "sha256": hashlib.sha256(reference).hexdigest(),
                "length": len(reference),
                "atol": "0.0001",
                "rtol": "0.001",
            },
        }
        if isinstance(runtime, RuntimeSpec):
            custom["runtime"] = runtime.to_signed()
        elif runtime is not None:
            custom["runtime"] = runtime if isinstance(runtime, str) else dict(runtime)
        custom.update(extra or {})
        model_file = TargetFile.from_data(path, data)
        model_file.unrecognized_fields["custom"] = custom
        self._sign_targets([model_file, TargetFile.from_data(ref_path, reference)], data, reference)
        rel = Release(version, path, data, hashlib.sha256(data).hexdigest())
        self.releases[version] = rel
        return rel

    def release_image(
        self,
        version: str,
        counter: int,
        *,
        size: tuple[int, int],
        mean: tuple[float, ...] = (0.0,),
        std: tuple[float, ...] = (1.0,),
        add: float = 0.0,
        signed: bool = True,
        reference_preprocess: PreprocessConfig | None = None,
        output: OutputSpec | None = None,
    ) -> Release:
        """Sign and publish an image model (`image_model_bytes(size, add)`) with its
        runtime spec (`mean`/`std`, its size) in `custom.runtime` — or, with
        `signed=False`, without one, as before bundles — and the reference pair made from
        `reference_frame()` with that preprocessing (or `reference_preprocess`: a CLI
        that normalised differently)."""
        data = image_model_bytes(size, add)
        spec = image_runtime(size, mean, std, output=output)
        reference = frame_reference_bytes(data, reference_preprocess or spec.preprocess)
        return self.release(
            version,
            add,
            counter,
            content=data,
            reference=reference,
            runtime=spec if signed else None,
            io=image_io(size),
        )

    def raise_floor(self, floor: int) -> None:
        """Forbid `MODEL` releases with a counter below `floor` (a signed floor target)."""
        custom = {"edgefleet": _FORMAT, "kind": "floor", "model": MODEL, "floor": floor}
        # Canonical JSON (sorted keys, no spaces), as the control plane writes floor files.
        content = json.dumps(custom, sort_keys=True, separators=(",", ":")).encode()
        target = TargetFile.from_data(floor_target_path(MODEL), content)
        target.unrecognized_fields["custom"] = custom
        self._sign_targets([target], content)

    def _sign_targets(self, files: list[TargetFile], *contents: bytes) -> None:
        for content in contents:
            self.artifacts[hashlib.sha256(content).hexdigest()] = content
        new = Metadata[Targets].from_bytes(self.targets.to_bytes())
        new.signatures.clear()
        new.signed.version += 1
        new.signed.expires = self.now + _MONTH
        for target in files:
            new.signed.targets[target.path] = target
        new.sign(self.signers[TARGETS])
        self.targets = new
        self.publish()

    # -------------------------------------------------------- control plane

    def publish(self) -> None:
        """Serve the current targets with a new snapshot and timestamp, and the artifacts."""
        version = self.targets.signed.version
        self.peer.metadata[f"{version}.targets.json"] = self.targets.to_bytes()
        snapshot = Metadata(
            Snapshot(
                version=1 if self.snapshot is None else self.snapshot.signed.version + 1,
                expires=self.now + _MONTH,
                meta={"targets.json": MetaFile(version=version)},
            )
        )
        snapshot.sign(self.signers[SNAPSHOT])
        timestamp = Metadata(
            Timestamp(
                version=1 if self.timestamp is None else self.timestamp.signed.version + 1,
                expires=self.now + _MONTH,
                snapshot_meta=MetaFile(version=snapshot.signed.version),
            )
        )
        timestamp.sign(self.signers[TIMESTAMP])
        self.peer.metadata[f"{snapshot.signed.version}.snapshot.json"] = snapshot.to_bytes()
        self.peer.metadata["timestamp.json"] = timestamp.to_bytes()
        self.snapshot, self.timestamp = snapshot, timestamp
        self.peer.artifacts.update(self.artifacts)

    def list_director_keys(self, keys: list[Key]) -> None:
        """Publish root N+1 listing `keys` as the director's (ADR 0045), signed by root."""
        root = Metadata[Root].from_bytes(self.root.to_bytes())
        root.signatures.clear()
        root.signed.version += 1
        root.signed.unrecognized_fields[ROOT_DIRECTOR_KEYS_FIELD] = {
            key.keyid: key.to_dict() for key in keys
        }
        root.sign(self.signers[ROOT])
        self.peer.metadata[f"{root.signed.version}.root.json"] = root.to_bytes()
        self.root = root

    def assign(
        self,
        rel: Release,
        *,
        signer: CryptoSigner | None = None,
        node_id: str = NODE,
        sequence: int | None = None,
        length: int | None = None,
        renewal: bool = False,
        shadow: Release | None = None,
        sample_per_mille: int = 100,
        max_cpu_percent: int = 10,
        shadow_sha256: str | None = None,
    ) -> SignedDirectorAssignment:
        """The director's signed "`node_id` shall run `rel`", valid for an hour; the next
        sequence unless one is given. `renewal` marks it as a renewal of the one before;
        `shadow` adds a candidate to run in shadow (`shadow_sha256` replaces its hash);
        `signer` replaces the director's key (a rotated or a stolen one)."""
        signer = signer or self.director
        if sequence is None:
            self.sequence += 1
            sequence = self.sequence
        assignment = DirectorAssignment(
            fleet=FLEET,
            node_id=node_id,
            sequence=sequence,
            target_path=rel.path,
            sha256=rel.sha256,
            length=len(rel.data) if length is None else length,
            format_version=_FORMAT,
            renewal=renewal,
        )
        if shadow is not None:
            assignment.shadow.CopyFrom(
                ShadowTarget(
                    target_path=shadow.path,
                    sha256=shadow.sha256 if shadow_sha256 is None else shadow_sha256,
                    length=len(shadow.data),
                    sample_per_mille=sample_per_mille,
                    max_cpu_percent=max_cpu_percent,
                )
            )
        assignment.issued_at.FromDatetime(self.now - timedelta(minutes=1))
        assignment.expires_at.FromDatetime(self.now + timedelta(hours=1))
        payload = assignment.SerializeToString(deterministic=True)
        signature = signer.sign(payload)
        return SignedDirectorAssignment(
            assignment=payload,
            keyid=signer.public_key.keyid,
            signature=bytes.fromhex(signature.signature),
        )

    # ----------------------------------------------------------------- node

    @property
    def node_dir(self) -> Path:
        return self.tmp / "node"

    @property
    def store(self) -> ModelStore:
        """The node's model store (`tmp/node/models`), seeing `free` bytes free."""
        return ModelStore(self.node_dir / "models", disk_usage=self.disk_usage)

    def disk_usage(self, path: Path) -> DiskUsage:
        """What the node's filesystem reports: `free`, or nothing while `full`."""
        return DiskUsage(10**13, 0, 0 if self.full else self.free)

    def write_journal(self, path: Path, data: bytes) -> None:
        """The journal's atomic write on the node's disk: ENOSPC while `full`."""
        if self.full:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
        atomic_write(path, data, mode=0o600)

    @property
    def journal(self) -> Journal:
        return Journal(
            self.node_dir / "journal.json", ManualClock(self.now), write=self.write_journal
        )

    def write_trust_anchors(self, directory: Path | None = None) -> None:
        """What enrollment leaves in a node's data dir: the fleet root and the director key."""
        directory = directory or self.node_dir
        directory.mkdir(parents=True, exist_ok=True)
        (directory / "tuf-root.json").write_bytes(self.root.to_bytes())
        key = self.director.public_key
        (directory / "director-key.json").write_text(
            json.dumps({"keyid": key.keyid, **key.to_dict()})
        )

    def reconciler(
        self,
        *,
        link: NodeLink | None = None,
        selftest: SelfTest | None = None,
        host: ModelHost | None = None,
        store: ModelStore | None = None,
        watchdog_s: float = 0.0,
        clock: ManualClock | None = None,
        retry: Backoff | None = None,
        shadow_host: ShadowHost | None = None,
    ) -> Reconciler:
        """A reconciler of the node over `link` (default: a fresh `MemoryNodeLink` to
        `peer`), whose reports go to `reports` and whose download backoff takes no time.
        `clock` (default: a fresh one at `now` whose sleeps advance it) is the
        reconciler's and its journal's; `retry` the backoff of a failed trial's retry
        (default: none, a retry is due at once); `shadow_host` runs shadow candidates
        (default: the default host). Call it on the running event loop (TUF runs in its
        worker threads)."""
        link = link or MemoryNodeLink(self.peer)
        tuf = TufClient(
            link,
            asyncio.get_running_loop(),
            metadata_dir=self.node_dir / "tuf",
            trusted_root=self.node_dir / "tuf-root.json",
        )

        async def report(report: UpdateReport) -> None:
            self.reports.append(report)

        def default_selftest(
            load: TrialLoader, ref: Path, atol: float, rtol: float
        ) -> SelfTestResult:
            return self_test(
                load, ref, atol=atol, rtol=rtol, latency_budget_s=5.0, memory_budget_bytes=1 << 34
            )

        clock = clock or ManualClock(self.now, sleeps_advance=True)
        return Reconciler(
            journal=Journal(self.node_dir / "journal.json", clock, write=self.write_journal),
            store=store or self.store,
            source=link,
            tuf_client_factory=tuf.refresh,
            cached_view=tuf.cached_view,
            trust=AssignmentTrust(NODE, FLEET, self.director.public_key),
            clock=clock,
            selftest=selftest or default_selftest,
            host=host or self.host,
            shadow_host=shadow_host or self.host,
            report=report,
            limits=ReconcilerLimits(
                space_margin_bytes=1000,
                download_attempts=2,
                watchdog_s=watchdog_s,
                retry_backoff=retry or Backoff(initial_s=0.0, cap_s=0.0),
            ),
        )

    def update_task(
        self,
        host: ModelHost,
        *,
        clock: TaskClock,
        link: NodeLink | None = None,
        watchdog: WatchdogConfig | None = None,
        shadow_host: ShadowHost | None = None,
        **settings: Any,
    ) -> UpdateTask:
        """The node's update task over `link` (default: a fresh `MemoryNodeLink` to
        `peer`), enrolled in `tmp/node` (see `write_trust_anchors`); `settings` go to
        `UpdateTaskSettings` (e.g. `initial_model`, `retry`)."""
        updater = UpdaterConfig(
            watchdog=watchdog or WatchdogConfig(), selftest_latency_budget_s=5.0
        )
        values: dict[str, Any] = {"memory_budget_bytes": 1 << 34, "agent_version": "0.1.0"}
        values.update(settings)
        return UpdateTask(
            UpdateTaskSettings(updater, data_dir=self.node_dir, **values),
            files=EnrollmentFiles(directory=self.node_dir, node_id=NODE, fleet=FLEET),
            link=link or MemoryNodeLink(self.peer),
            clock=clock,
            host=host,
            shadow_host=shadow_host,
        )

    def phases(self) -> list[str]:
        return [r.phase.value for r in self.reports]
