"""A small in-memory fleet repository for the trust tests: real keys, real signatures."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from securesystemslib.signer import CryptoSigner
from tuf.api.metadata import Metadata, Root, TargetFile, Targets

from control_plane.trust import repository as repo
from control_plane.trust.custom import (
    Compat,
    IOSignature,
    ModelCustom,
    ReferenceInfo,
    TensorSpec,
    model_target_path,
    reference_target_path,
)

NOW = datetime(2025, 6, 1, 12, 0, tzinfo=UTC)
YEAR = timedelta(days=365)
MONTH = timedelta(days=30)


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def model_custom(
    model: str,
    version: str,
    counter: int,
    reference: bytes,
    **overrides: Any,
) -> ModelCustom:
    values: dict[str, Any] = {
        "model": model,
        "version": version,
        "release_counter": counter,
        "io": IOSignature(
            inputs=(TensorSpec("x", "float32", (1, 3, 64, "N")),),
            outputs=(TensorSpec("y", "float32", (1, 10)),),
        ),
        "opset": {"": 17, "ai.onnx.ml": 3},
        "min_agent_version": "0.1.0",
        "compat": Compat(("CPUExecutionProvider",), ("x86_64", "aarch64")),
        "reference": ReferenceInfo(
            path=reference_target_path(model, version),
            sha256=sha256(reference),
            length=len(reference),
            atol=1e-4,
            rtol=1e-3,
        ),
    }
    values.update(overrides)
    return ModelCustom(**values)


@dataclass
class Fleet:
    """An operator and a control plane in one object, sharing an artifact store."""

    root_signers: list[CryptoSigner]
    release: CryptoSigner
    snapshot: CryptoSigner
    timestamp: CryptoSigner
    root: Metadata[Root]
    targets: Metadata[Targets]
    artifacts: dict[str, bytes] = field(default_factory=dict)
    now: datetime = NOW

    @classmethod
    def create(cls, *, root_keys: int = 3, root_threshold: int = 2, now: datetime = NOW) -> Fleet:
        root_signers = [CryptoSigner.generate_ed25519() for _ in range(root_keys)]
        release = CryptoSigner.generate_ed25519()
        snapshot = CryptoSigner.generate_ed25519()
        timestamp = CryptoSigner.generate_ed25519()
        root = repo.build_root(
            root_keys=[s.public_key for s in root_signers],
            root_threshold=root_threshold,
            release_keys=[release.public_key],
            snapshot_key=snapshot.public_key,
            timestamp_key=timestamp.public_key,
            expires=now + YEAR,
        )
        for signer in root_signers[:root_threshold]:
            root.sign(signer, append=True)
        targets = repo.initial_targets(now + MONTH)
        targets.sign(release)
        return cls(root_signers, release, snapshot, timestamp, root, targets, now=now)

    # ------------------------------------------------------------- control plane

    def artifact_length(self, digest: str) -> int | None:
        data = self.artifacts.get(digest)
        return None if data is None else len(data)

    def upload(self, path: str, data: bytes) -> TargetFile:
        self.artifacts[sha256(data)] = data
        return TargetFile.from_data(path, data)

    def accept(self, md: Metadata[Targets]) -> repo.TargetsChange:
        change = repo.verify_targets_update(
            root=self.root,
            current=self.targets,
            new_bytes=repo.to_bytes(md),
            now=self.now,
            artifact_length=self.artifact_length,
        )
        self.targets = change.metadata
        return change

    # ------------------------------------------------------------------ operator

    def model_targets(
        self,
        model: str = "detector",
        version: str = "1.0.0",
        counter: int | None = None,
        *,
        content: bytes | None = None,
        reference: bytes | None = None,
        upload: bool = True,
        **custom_overrides: Any,
    ) -> Metadata[Targets]:
        """The next targets with one more model version, signed by the release key."""
        content = content if content is not None else f"onnx {model} {version}".encode()
        reference = reference if reference is not None else f"npz {model} {version}".encode()
        if counter is None:
            counter = repo.next_release_counter(self.targets, model)
        model_path = model_target_path(model, version)
        ref_path = reference_target_path(model, version)
        if upload:
            model_file = self.upload(model_path, content)
            ref_file = self.upload(ref_path, reference)
        else:
            model_file = TargetFile.from_data(model_path, content)
            ref_file = TargetFile.from_data(ref_path, reference)
        md = repo.add_model_to_targets(
            self.targets,
            model_file=model_file,
            reference_file=ref_file,
            custom=model_custom(model, version, counter, reference, **custom_overrides),
            expires=self.now + MONTH,
        )
        md.sign(self.release)
        return md

    def release_model(self, *args: Any, **kwargs: Any) -> repo.TargetsChange:
        return self.accept(self.model_targets(*args, **kwargs))

    def next_unchecked(self) -> Metadata[Targets]:
        """A copy of the current targets with the version bumped and no checks at all."""
        md = Metadata[Targets].from_bytes(repo.to_bytes(self.targets))
        md.signed.version += 1
        md.signatures.clear()
        return md
