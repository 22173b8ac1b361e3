"""`ModelHost`: the one port through which an update reaches the model that serves.

The reconciler hands it a verified model *with its bundle* (`ModelBundle`: the file and
what was signed with it — name, version, runtime spec) to serve: a trial, whose self-test
runs on the very session that will serve, or a revert. The agent's update task serves the
journal's model through it at start and reads the served model's run counters for the
watchdog. The agent's runtime implements it (`edge_node.agent.runtime_host.RuntimeHost`).
`ModelBundle.to_record` / `bundle_from_record` are the bundle as the model store keeps it
beside the model, so a restarted node serves its model offline as it was signed.
`ShadowHost` is the port of the shadow stage (ADR 0031): a verified candidate loaded,
self-tested and run beside the served model on a sample of frames, never served.
Not here: loading sessions, hot swap, the self-test's rules (`selftest`).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Protocol

from edge_node.errors import InvalidInputError
from edge_node.updater.selftest import SelfTestResult, TrialLoader
from edge_node.updater.watchdog import ModelHealth
from protos.bundle.spec import BundleError, RuntimeSpec, parse_runtime_spec

__all__ = [
    "BUNDLE_RECORD_FORMAT",
    "ModelBundle",
    "ModelHost",
    "ShadowHost",
    "ShadowSettings",
    "Trial",
    "bundle_from_record",
    "name_and_version",
]

BUNDLE_RECORD_FORMAT: Final = 1
_TARGET: Final = re.compile(r"models/(?P<model>[^/]+)/(?P<version>[^/]+)/model\.onnx")


@dataclass(frozen=True, slots=True)
class ModelBundle:
    """A model as the node serves it: the file and what was signed with it.

    `runtime` is the version's signed runtime spec; None for a version signed before
    bundles or a local `runtime.model_path`, which run with the node's own preprocess
    config. `version` is None for a local file (its label is then the file name).
    """

    path: Path
    model: str
    version: str | None = None
    sha256: str | None = None
    runtime: RuntimeSpec | None = None
    target_path: str | None = None

    @classmethod
    def local(cls, path: Path) -> ModelBundle:
        """A local model file (`runtime.model_path`): no release, no signed spec."""
        path = Path(path)
        return cls(path, path.name)

    @property
    def label(self) -> str:
        """`name@version` (the file name for a local model): how logs, latency and drift
        name it."""
        return self.model if self.version is None else f"{self.model}@{self.version}"

    def to_record(self) -> dict[str, Any]:
        """The JSON-ready record the model store keeps beside the model (no path: the
        store knows where the model is)."""
        return {
            "format": BUNDLE_RECORD_FORMAT,
            "target_path": self.target_path,
            "sha256": self.sha256,
            "model": self.model,
            "version": self.version,
            "runtime": None if self.runtime is None else self.runtime.to_signed(),
        }


def bundle_from_record(record: Mapping[str, Any], path: Path) -> ModelBundle:
    """The bundle a store record describes, for the model at `path`; `InvalidInputError`
    naming the field when the record is not one this build reads."""
    if record.get("format") != BUNDLE_RECORD_FORMAT:
        raise InvalidInputError(
            f"bundle record format {record.get('format')!r} is not {BUNDLE_RECORD_FORMAT}",
            field="format",
        )
    values: dict[str, str | None] = {}
    for key in ("target_path", "sha256", "model", "version"):
        value = record.get(key)
        if value is not None and not (isinstance(value, str) and 0 < len(value) <= 512):
            raise InvalidInputError(f"bundle record {key}: expected a short string", field=key)
        values[key] = value
    model = values["model"]
    if model is None:
        raise InvalidInputError("bundle record model: missing", field="model")
    raw = record.get("runtime")
    try:
        runtime = None if raw is None else parse_runtime_spec(raw, where="runtime")
    except BundleError as exc:
        raise InvalidInputError(f"bundle record {exc.message}", field=exc.field) from exc
    return ModelBundle(
        Path(path),
        model,
        values["version"],
        values["sha256"],
        runtime,
        values["target_path"],
    )


def name_and_version(target_path: str) -> tuple[str, str | None]:
    """`models/<name>/<version>/model.onnx` -> (name, version); any other path is its
    own name with no version."""
    match = _TARGET.fullmatch(target_path)
    if match is None:
        return target_path, None
    return match["model"], match["version"]


Trial = Callable[[TrialLoader], SelfTestResult]
"""A trial's self-test: given the function that loads the model as it will serve (the
serving session, its options and its bundle's preprocessing), load it, test it and say
whether it may serve. Blocking: the host runs it in a worker thread."""


class ModelHost(Protocol):
    async def serve(
        self, bundle: ModelBundle, *, trial: Trial | None = None
    ) -> SelfTestResult | None:
        """Serve `bundle` from now on (start the runtime, or hot-swap), run as its bundle
        says: its signed preprocessing and output decoder, the node's session options.

        With `trial`, the session built to serve is handed to it first (loaded once) and
        serves only when the result is ok; the result is returned either way, and on a
        failed one the model that served before keeps serving. Without `trial`, returns
        None. Raises when it cannot serve (it does not load, the node is stopping): the
        model that served before keeps serving then.
        """
        ...

    def health(self) -> ModelHealth | None:
        """Run counters of the model serving now (None before any serves)."""
        ...

    async def stop_serving(self) -> None:
        """Serve nothing from now on (a revoked model with nothing allowed to replace it,
        ADR 0035); in-flight frames finish. A later `serve` starts again."""
        ...


@dataclass(frozen=True, slots=True)
class ShadowSettings:
    """How a shadow candidate runs, as the director signed it: frames per mille of those
    served (1-1000) and its cap on one CPU core, in percent (1-100)."""

    sample_per_mille: int
    max_cpu_percent: int

    def __post_init__(self) -> None:
        if not 1 <= self.sample_per_mille <= 1000:
            raise InvalidInputError(
                f"sample_per_mille must be 1-1000, got {self.sample_per_mille}",
                field="sample_per_mille",
            )
        if not 1 <= self.max_cpu_percent <= 100:
            raise InvalidInputError(
                f"max_cpu_percent must be 1-100, got {self.max_cpu_percent}",
                field="max_cpu_percent",
            )


class ShadowHost(Protocol):
    async def run_shadow(
        self, bundle: ModelBundle, settings: ShadowSettings, *, trial: Trial
    ) -> SelfTestResult:
        """Load `bundle` beside the served model (at background priority), hand the
        session to `trial` (the self-test) and, when it passes, run it on a sample of the
        served frames as `settings` say, off the serving path, replacing any candidate
        running before. Returns the self-test's result; on a failed one nothing runs.
        Raises when the candidate cannot load at all."""
        ...

    async def stop_shadow(self) -> None:
        """Stop the candidate and unload it (nothing to do when none runs)."""
        ...

    def shadow_figures(self) -> Mapping[str, Any] | None:
        """What the running candidate measured so far (the health report's counts,
        agreement and latency), None when none runs."""
        ...
