"""The operator's side of a release: verify, sign, upload, publish — never trusting the server.

Release keys stay on the operator's machine. Every push re-reads the fleet's targets
metadata, checks it against the fleet root the operator's own root keys signed,
adds the new targets, signs, and posts conditionally; a 409 means someone else
pushed first, so it re-reads and retries (bounded). A push with a runtime spec (how the
version is run) refuses, before anything is uploaded, what every node would refuse, and
makes the self-test reference from a camera-sized frame through that spec.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, replace
from datetime import timedelta
from pathlib import Path
from typing import Any

from securesystemslib.signer import CryptoSigner, Key, SSlibKey
from tuf.api.exceptions import UnsignedMetadataError
from tuf.api.metadata import Metadata, Root, TargetFile, Targets, Timestamp
from tuf.api.serialization import DeserializationError

from control_plane.cli.client import ApiClient, ApiError
from control_plane.clock import Clock, SystemClock
from control_plane.errors import ConflictError, InvalidInputError, SignatureError
from control_plane.registry import onnx_inspect
from control_plane.trust import custom as tufcustom
from control_plane.trust import repository as tufrepo
from control_plane.trust.keys import OperatorKeyset
from protos.bundle.results import Decoded
from protos.bundle.spec import BundleError, RuntimeSpec

ROOT_TTL = timedelta(days=365)
TARGETS_TTL = timedelta(days=180)
EXPIRY_WARNING = timedelta(days=30)
MAX_PUSH_ATTEMPTS = 5
# Root versions walked from 1.root.json; a fleet rotates its root a handful of times.
MAX_ROOT_VERSIONS = 1000

Progress = Callable[[str, int, int], None]
"""progress(label, advance_bytes, total_bytes)"""


@dataclass(frozen=True, slots=True)
class ReleaseResult:
    fleet: str
    model: str
    version: str
    release_counter: int
    target_path: str
    sha256: str
    length: int
    targets_version: int
    attempts: int
    warnings: list[str]
    runtime: dict[str, Any] | None = None
    """`custom.runtime_summary` of the signed runtime spec; None for a version without."""
    reference: dict[str, Any] | None = None
    """What the self-test reference was made from and, with a runtime spec, what the
    decoder read in the model's outputs on it."""
    release_check: dict[str, Any] | None = None
    """The signed `custom.release_check` (`model push --baseline`); None without one."""
    moves: dict[str, Any] | None = None
    """`moves_of` the push's answer: the nodes an earlier revoke left on a revoked
    version that this version took in (ADR 0035); None when the push moved or left none."""


def _no_progress(label: str, advance: int, total: int) -> None:
    return None


def model_custom(
    info: onnx_inspect.ModelInfo,
    *,
    name: str,
    version: str,
    release_counter: int,
    reference_sha256: str,
    reference_length: int,
    min_agent_version: str,
    execution_providers: tuple[str, ...],
    atol: float,
    rtol: float,
    runtime: RuntimeSpec | None = None,
    release_check: tufcustom.ReleaseCheck | None = None,
) -> tufcustom.ModelCustom:
    """The custom field `push_model` signs into the model's target (checked by
    `parse_model_custom`); its reference pair is `reference_target_path(name, version)`."""
    extra: dict[str, Any] = {} if runtime is None else {"runtime": runtime.to_signed()}
    if release_check is not None:
        extra["release_check"] = release_check.to_dict()
    return tufcustom.parse_model_custom(
        {
            "edgefleet": tufcustom.FORMAT_VERSION,
            "kind": tufcustom.KIND_MODEL,
            "model": name,
            "version": version,
            "release_counter": release_counter,
            "io": info.to_custom_io(),
            "opset": dict(info.opset),
            "min_agent_version": min_agent_version,
            "compat": {
                "execution_providers": list(execution_providers),
                "arch": ["x86_64", "aarch64"],
            },
            # Canonical JSON has no floats: tolerances travel as decimal strings.
            "reference": {
                "path": tufcustom.reference_target_path(name, version),
                "sha256": reference_sha256,
                "length": reference_length,
                "atol": repr(float(atol)),
                "rtol": repr(float(rtol)),
            },
            **extra,
        }
    )


@dataclass(frozen=True, slots=True)
class _Reference:
    pair: onnx_inspect.ReferencePair
    runtime: RuntimeSpec | None
    summary: dict[str, Any]


def _make_reference(
    model_path: Path,
    info: onnx_inspect.ModelInfo,
    runtime: RuntimeSpec | None,
    reference_input: Path | None,
    reference_frame: Path | None,
) -> _Reference:
    """The self-test pair, and the runtime spec as it is signed (size resolved)."""
    if runtime is None:
        if reference_frame is not None:
            raise InvalidInputError(
                "--reference-frame needs --runtime: a frame becomes the model's input only "
                "through a runtime spec's preprocessing",
                field="reference_frame",
            )
        pair = onnx_inspect.make_reference(model_path, info, reference_input=reference_input)
        source = "generated tensors (seed 0)" if reference_input is None else str(reference_input)
        return _Reference(pair, None, {"source": source, "inputs": _shapes(pair.inputs)})
    if reference_input is not None:
        raise InvalidInputError(
            "--reference-input does not go with --runtime: the reference of a version with a "
            "runtime spec is a frame through its preprocessing (give it with --reference-frame)",
            field="reference_input",
        )
    from control_plane.registry import reference_frame as frames
    from protos.bundle.decoders import Geometry, build_decoder
    from protos.bundle.preprocess import Preprocessor

    resolved, channels = tufcustom.check_runtime(
        runtime,
        [t.to_sig() for t in info.inputs],
        [t.to_sig() for t in info.outputs],
        where="runtime",
        metadata=info.metadata,
    )
    # Signed with its size resolved: the version says exactly what it is run at.
    signed = replace(runtime, preprocess=resolved)
    if reference_frame is None:
        frame, source = frames.generated_frame(), "generated"
    else:
        frame, source = frames.load_frame(reference_frame), str(reference_frame)
    pair = onnx_inspect.make_frame_reference(
        model_path, info, frame, Preprocessor(resolved, channels)
    )
    assert resolved.size is not None
    height, width = frame.shape[:2]
    try:
        # What every node will do with the outputs of its self-test: it must work here.
        decoded = build_decoder(signed).decode(
            pair.outputs, Geometry.stretch(height, width, *resolved.size)
        )
    except BundleError as exc:
        raise tufcustom.bundle_input_error(
            exc,
            "runtime",
            f"runtime.{exc.field}: the {signed.output.decoder} decoder cannot read the "
            f"model's outputs on the reference frame: {exc.message}",
        ) from exc
    summary = {
        "source": source,
        "frame": [height, width],
        "inputs": _shapes(pair.inputs),
        "decoded": _decoded_summary(decoded),
    }
    return _Reference(pair, signed, summary)


def _decoded_summary(decoded: Decoded, shown: int = 5) -> dict[str, Any]:
    """What the decoder read on the reference frame, in a few words per result."""
    results = [
        f"{d.label} {d.score:.3f}" + ("" if d.box is None else " (box)")
        for d in decoded.detections[:shown]
    ]
    results += [
        f"{t.name} {list(t.shape)} min {t.min:.4g} max {t.max:.4g} mean {t.mean:.4g}"
        + ("" if t.above is None else f", {t.above:.1%} above {t.threshold:g}")
        for t in decoded.tensors[:shown]
    ]
    return {
        "kind": decoded.kind,
        "count": len(decoded.detections) or len(decoded.tensors),
        "results": results,
    }


def _shapes(arrays: dict[str, Any]) -> dict[str, list[int]]:
    return {name: [int(d) for d in value.shape] for name, value in arrays.items()}


class ReleaseClient:
    def __init__(
        self, api: ApiClient, keyset: OperatorKeyset, *, clock: Clock | None = None
    ) -> None:
        self.api = api
        self.keyset = keyset
        self.clock = clock or SystemClock()

    # -------------------------------------------------------------- fleet

    def create_fleet(self, name: str) -> dict[str, Any]:
        """Ask for online keys, then sign root (k-of-n) and empty targets and install them."""
        if len(self.keyset.root_signers) < self.keyset.root_threshold:
            raise SignatureError(
                f"creating a fleet needs {self.keyset.root_threshold} root keys; "
                f"only {len(self.keyset.root_signers)} are in this keyset",
            )
        fleet = self.api.create_fleet(name)
        online = fleet["online_keys"]
        now = self.clock.now()
        root = tufrepo.build_root(
            root_keys=self.keyset.root_public_keys,
            root_threshold=self.keyset.root_threshold,
            release_keys=[self.keyset.release_public_key],
            snapshot_key=_key_from_api(online["snapshot"]),
            timestamp_key=_key_from_api(online["timestamp"]),
            expires=now + ROOT_TTL,
        )
        self.keyset.sign_root(root)
        targets = tufrepo.initial_targets(expires=now + TARGETS_TTL)
        self.keyset.sign_targets(targets)
        result: dict[str, Any] = self.api.upload_root(name, root.to_dict(), targets.to_dict())
        return result

    # ------------------------------------------------------------- reading

    def trusted_root(self, fleet: str) -> Metadata[Root]:
        """The fleet's latest root, reached TUF style from `1.root.json`.

        Each root N+1 must be signed to threshold by root N's root role and by its own,
        with version exactly N+1 (as every node's `tuf.ngclient` checks); the walk stops
        at the first missing version, after at most MAX_ROOT_VERSIONS. The anchor is
        this keyset: the latest root's root keys must be keys it holds, and they sign
        only roots an operator built, so a server cannot hand over a chain of its own.
        """
        root = _parse_root(fleet, self.api.metadata(fleet, "1.root.json"))
        _verify_root_step(fleet, None, root)
        for version in range(2, MAX_ROOT_VERSIONS + 2):
            try:
                data = self.api.metadata(fleet, f"{version}.root.json")
            except ApiError as exc:
                if exc.status == 404:
                    break
                raise
            if version > MAX_ROOT_VERSIONS:
                raise SignatureError(
                    f"the fleet's root chain is longer than {MAX_ROOT_VERSIONS} versions",
                    fleet=fleet,
                )
            new = _parse_root(fleet, data)
            _verify_root_step(fleet, root, new)
            root = new
        ours = {k.keyid for k in self.keyset.root_public_keys}
        theirs = set(root.signed.roles["root"].keyids)
        if not theirs <= ours:
            raise SignatureError(
                f"the fleet's root (version {root.signed.version}) names root keys this "
                "keyset does not hold; wrong --keys directory or a tampered server",
                fleet=fleet,
            )
        return root

    def trusted_metadata(self, fleet: str) -> tuple[Metadata[Root], Metadata[Targets], list[str]]:
        """The fleet's latest root and current targets, verified from the operator's keys.

        Also refuses, before anything is signed or posted, a keyset whose release key
        is not a targets key of the latest root (revoked by a rotation).
        """
        now = self.clock.now()
        root = self.trusted_root(fleet)
        targets = self._trusted_targets(fleet, root)
        release_keyid = self.keyset.release_public_key.keyid
        if release_keyid not in root.signed.roles["targets"].keyids:
            raise SignatureError(
                "this keyset's release key is not a targets key of the fleet's root "
                f"(version {root.signed.version}): it was revoked, or these are another "
                "fleet's keys; if a release key rotation is pending in this keyset, "
                "run `edgefleet keys rotate-release` again to finish it",
                fleet=fleet,
                keyid=release_keyid,
            )
        warnings = [
            f"{role} metadata expires {md.signed.expires.isoformat()}; re-sign it soon"
            for role, md in (("root", root), ("targets", targets))
            if md.signed.expires - now < EXPIRY_WARNING
        ]
        return root, targets, warnings

    def _trusted_targets(self, fleet: str, root: Metadata[Root]) -> Metadata[Targets]:
        try:
            targets = Metadata[Targets].from_bytes(self.api.metadata(fleet, "targets.json"))
        except DeserializationError as exc:
            raise SignatureError("the server's targets.json is malformed", fleet=fleet) from exc
        if not isinstance(targets.signed, Targets):
            raise SignatureError("the server's targets.json is not targets metadata", fleet=fleet)
        try:
            root.signed.verify_delegate("targets", targets.signed_bytes, targets.signatures)
        except UnsignedMetadataError as exc:
            raise SignatureError(f"fleet metadata failed verification: {exc}", fleet=fleet) from exc
        return targets

    # ------------------------------------------------------------ rotation

    def rotate_release_key(self, fleet: str, new_release: CryptoSigner) -> dict[str, Any]:
        """Revoke the fleet's release key(s): root N+1 names `new_release` alone.

        Needs the root keys (threshold) of this keyset, not the old release key (it may
        be lost or compromised). Builds root N+1, signs it with the root keys, re-signs
        the current targets (version + 1, same targets) with the new key and posts
        both; a lost race (409) is re-read and retried (bounded). When the latest root
        already names exactly `new_release` (a rotation resumed after a crash), nothing
        is posted. Whatever the current targets list is re-signed as it is: review it
        first when the old key may have been abused.
        """
        new_keyid = new_release.public_key.keyid
        last: ApiError | None = None
        for attempt in range(1, MAX_PUSH_ATTEMPTS + 1):
            root = self.trusted_root(fleet)
            targets_role = root.signed.roles["targets"]
            if targets_role.keyids == [new_keyid]:
                return {
                    "fleet": fleet,
                    "root_version": root.signed.version,
                    "release_keyid": new_keyid,
                    "revoked_keyids": [],
                    "already_rotated": True,
                    "attempts": attempt,
                }
            targets = self._trusted_targets(fleet, root)
            now = self.clock.now()
            new_root = tufrepo.build_next_root(
                root, release_keys=[new_release.public_key], expires=now + ROOT_TTL
            )
            self.keyset.sign_root(new_root)
            new_targets = tufrepo.resigned_targets(targets, expires=now + TARGETS_TTL)
            new_targets.sign(new_release, append=False)
            try:
                result = self.api.rotate_root(fleet, new_root.to_dict(), new_targets.to_dict())
            except ApiError as exc:
                if exc.status == 409 and exc.problem.get("reason") in {"stale", "race"}:
                    last = exc
                    continue
                raise
            return {
                "fleet": fleet,
                "root_version": int(result["root_version"]),
                "targets_version": int(result["targets_version"]),
                "release_keyid": new_keyid,
                "revoked_keyids": sorted(set(targets_role.keyids) - {new_keyid}),
                "already_rotated": False,
                "attempts": attempt,
            }
        raise ConflictError(
            f"gave up after {MAX_PUSH_ATTEMPTS} attempts: other changes kept winning ({last})",
            fleet=fleet,
        )

    def rotate_online_keys(self, fleet: str) -> dict[str, Any]:
        """Replace the fleet's snapshot/timestamp keys: the recovery from a stolen one.

        The server makes new online keys; root N+1 names them (release keys unchanged),
        signed by this keyset's root keys (threshold), with the current targets
        re-signed by the release key. Once accepted the server signs with the new keys;
        TUF clients drop the timestamp/snapshot they trusted (a forged version
        2,000,000,000 included) because it no longer verifies (TUF §5.3.11). Then the
        served timestamp is checked against the new root. A lost race (409) retries.
        """
        raw = self.api.new_online_keys(fleet)
        online = {role: _server_key(raw[role], role) for role in tufrepo.ONLINE_ROLES}
        result, root, new_root = self._next_root(fleet, online_keys=online)
        try:
            served = self.api.metadata(fleet, "timestamp.json")
            timestamp = Metadata[Timestamp].from_bytes(served)
            new_root.signed.verify_delegate(
                "timestamp", timestamp.signed_bytes, timestamp.signatures
            )
        except (DeserializationError, UnsignedMetadataError) as exc:
            raise SignatureError(
                f"the server accepted root {new_root.signed.version} but its timestamp "
                f"does not verify with the new key: {exc}",
                fleet=fleet,
            ) from exc
        old = sorted(root.signed.roles[r].keyids[0] for r in tufrepo.ONLINE_ROLES)
        return {
            **result,
            "online_keyids": {r: k.keyid for r, k in online.items()},
            "revoked_keyids": old,
        }

    def rotate_director_key(self, fleet: str) -> dict[str, Any]:
        """List a new director key in the fleet's root: the recovery from a stolen one.

        The server makes the key (`POST /v1/director/keys`); root N+1, signed by this
        keyset's root keys, lists it alone under `x-edgefleet-director-keys`. Nodes learn
        it at their next TUF refresh, accept assignments only from it from then on, and
        start its sequences afresh, so whatever floor the old key pinned is void.
        """
        key = _server_key(self.api.json("POST", "/v1/director/keys"), "director")
        result, root, _ = self._next_root(fleet, director_keys=[key])
        before = [k.keyid for k in tufrepo.listed_director_keys(root.signed)]
        if not before:  # the root listed none: nodes trusted the director's first key
            before = [str(self.api.json("GET", "/v1/director/key")["keyid"])]
        return {
            **result,
            "director_keyid": key.keyid,
            "revoked_keyids": sorted(set(before) - {key.keyid}),
        }

    def _next_root(
        self,
        fleet: str,
        *,
        online_keys: Mapping[str, Key] | None = None,
        director_keys: list[Key] | None = None,
    ) -> tuple[dict[str, Any], Metadata[Root], Metadata[Root]]:
        """Root N+1 with these keys replaced (release keys kept), signed and posted with
        the current targets re-signed; a lost race (409) is re-read and retried."""
        last: ApiError | None = None
        for attempt in range(1, MAX_PUSH_ATTEMPTS + 1):
            root, targets, _ = self.trusted_metadata(fleet)
            targets_role = root.signed.roles["targets"]
            now = self.clock.now()
            new_root = tufrepo.build_next_root(
                root,
                release_keys=[root.signed.get_key(k) for k in targets_role.keyids],
                release_threshold=targets_role.threshold,
                online_keys=online_keys,
                director_keys=director_keys,
                expires=now + ROOT_TTL,
            )
            self.keyset.sign_root(new_root)
            new_targets = tufrepo.resigned_targets(targets, expires=now + TARGETS_TTL)
            self.keyset.sign_targets(new_targets)
            try:
                result = self.api.rotate_root(fleet, new_root.to_dict(), new_targets.to_dict())
            except ApiError as exc:
                if exc.status == 409 and exc.problem.get("reason") in {"stale", "race"}:
                    last = exc
                    continue
                raise
            summary = {
                "fleet": fleet,
                "root_version": int(result["root_version"]),
                "targets_version": int(result["targets_version"]),
                "snapshot_version": int(result["snapshot_version"]),
                "timestamp_version": int(result["timestamp_version"]),
                "attempts": attempt,
            }
            return summary, root, new_root
        raise ConflictError(
            f"gave up after {MAX_PUSH_ATTEMPTS} attempts: other changes kept winning ({last})",
            fleet=fleet,
        )

    # --------------------------------------------------------------- push

    def push_model(
        self,
        fleet: str,
        model_path: Path,
        *,
        name: str,
        version: str,
        reference_input: Path | None = None,
        min_agent_version: str = "0.1.0",
        execution_providers: tuple[str, ...] = ("CPUExecutionProvider",),
        atol: float = 1e-4,
        rtol: float = 1e-3,
        progress: Progress = _no_progress,
        runtime: RuntimeSpec | None = None,
        reference_frame: Path | None = None,
        release_check: tufcustom.ReleaseCheck | None = None,
    ) -> ReleaseResult:
        """Check, sign and publish one version; nothing is uploaded before every check.

        With `runtime` (how the version is run: preprocessing, output decoder, labels) the
        spec is checked against the model's I/O signature with the functions every node
        runs at load, the reference is `reference_frame` (or a generated camera-sized
        frame) through its preprocessing, the decoder must read the outputs on it, and
        the spec is signed into `custom.runtime` with its size resolved. Without it, the
        reference is `reference_input` or generated tensors (old-style versions).
        `release_check` (its comparison with a float baseline, judged on this machine:
        `registry.release_check`) is signed into `custom.release_check`.
        """
        tufcustom.model_target_path(name, version)  # validates name and version early
        info = onnx_inspect.inspect_model(model_path)
        made = _make_reference(model_path, info, runtime, reference_input, reference_frame)
        pair, signed_runtime = made.pair, made.runtime
        # Before any upload: a revoked release key, another fleet's keys or an already
        # published version stop here, leaving nothing behind on the server.
        _, current, _ = self.trusted_metadata(fleet)
        _refuse_republishing(
            current, tufcustom.model_target_path(name, version), info.sha256, name, version
        )
        with tempfile.TemporaryDirectory(prefix="edgefleet-push-") as tmp:
            reference = Path(tmp) / "reference.npz"
            ref_sha, ref_len = onnx_inspect.save_reference(pair, reference)
            for label, path, sha, length in (
                ("model", model_path, info.sha256, info.length),
                ("reference", reference, ref_sha, ref_len),
            ):
                if self.api.artifact_exists(sha):
                    progress(label, length, length)
                    continue
                self.api.upload_file(path, sha, length, _progress_for(progress, label, length))

        def build(current: Metadata[Targets]) -> tuple[Metadata[Targets], int]:
            counter = tufrepo.next_release_counter(current, name)
            model_target = tufcustom.model_target_path(name, version)
            reference_target = tufcustom.reference_target_path(name, version)
            custom = model_custom(
                info,
                name=name,
                version=version,
                release_counter=counter,
                reference_sha256=ref_sha,
                reference_length=ref_len,
                min_agent_version=min_agent_version,
                execution_providers=execution_providers,
                atol=atol,
                rtol=rtol,
                runtime=signed_runtime,
                release_check=release_check,
            )
            _refuse_republishing(current, model_target, info.sha256, name, version)
            new = tufrepo.add_model_to_targets(
                current,
                model_file=TargetFile(info.length, {"sha256": info.sha256}, model_target),
                reference_file=TargetFile(ref_len, {"sha256": ref_sha}, reference_target),
                custom=custom,
                expires=self.clock.now() + TARGETS_TTL,
            )
            return new, counter

        targets_version, counter, attempts, warnings, pushed = self._publish(fleet, build)
        return ReleaseResult(
            fleet=fleet,
            model=name,
            version=version,
            release_counter=counter,
            target_path=tufcustom.model_target_path(name, version),
            sha256=info.sha256,
            length=info.length,
            targets_version=targets_version,
            attempts=attempts,
            warnings=warnings,
            runtime=None if signed_runtime is None else tufcustom.runtime_summary(signed_runtime),
            reference=made.summary,
            moves=moves_of(pushed, name),
            release_check=None if release_check is None else release_check.to_dict(),
        )

    def revoke(self, fleet: str, name: str, version: str) -> dict[str, Any]:
        """Raise the model's signed floor above `version`: nodes refuse it and all older."""
        path = tufcustom.model_target_path(name, version)

        def build(current: Metadata[Targets]) -> tuple[Metadata[Targets], int]:
            target = current.signed.targets.get(path)
            if target is None:
                raise InvalidInputError(f"{name} {version} is not published in {fleet}")
            custom = tufcustom.parse_model_custom(dict(target.custom))
            floor = custom.release_counter + 1
            new, floor_bytes = tufrepo.raise_floor(
                current, name, floor, expires=self.clock.now() + TARGETS_TTL
            )
            self.api.upload_bytes(floor_bytes)
            return new, floor

        targets_version, floor, attempts, warnings, pushed = self._publish(fleet, build)
        return {
            "fleet": fleet,
            "model": name,
            "revoked_version": version,
            "floor": floor,
            "targets_version": targets_version,
            # A revoke always says what it moved, none included.
            **(moves_of(pushed, name) or {"nodes_moved": 0, "moved_to": None, "nodes_left": []}),
            "attempts": attempts,
            "warnings": warnings,
        }

    def _publish(
        self, fleet: str, build: Callable[[Metadata[Targets]], tuple[Metadata[Targets], int]]
    ) -> tuple[int, int, int, list[str], dict[str, Any]]:
        """Read, build, sign, post; on 409 start again from a fresh read (bounded).
        Returns the targets version, the built value, the attempts, the warnings and the
        push's answer."""
        last: ApiError | None = None
        for attempt in range(1, MAX_PUSH_ATTEMPTS + 1):
            _, current, warnings = self.trusted_metadata(fleet)
            new, value = build(current)
            self.keyset.sign_targets(new)
            try:
                result = self.api.push_targets(fleet, tufrepo.to_bytes(new))
            except ApiError as exc:
                # Only a lost race is retried; an immutable version or a rollback is final.
                if exc.status == 409 and exc.problem.get("reason") in {"stale", "race"}:
                    last = exc
                    continue
                raise
            return int(result["targets_version"]), value, attempt, warnings, dict(result)
        raise ConflictError(
            f"gave up after {MAX_PUSH_ATTEMPTS} attempts: other pushes kept winning ({last})",
            fleet=fleet,
        )


def _parse_root(fleet: str, data: bytes) -> Metadata[Root]:
    try:
        root = Metadata[Root].from_bytes(data)
    except DeserializationError as exc:
        raise SignatureError("the server sent malformed root metadata", fleet=fleet) from exc
    if not isinstance(root.signed, Root):
        raise SignatureError("the server's root metadata is not root metadata", fleet=fleet)
    return root


def _verify_root_step(fleet: str, trusted: Metadata[Root] | None, new: Metadata[Root]) -> None:
    """TUF's root update rule; `trusted=None` for the first root, trusted on its own word."""
    expected = 1 if trusted is None else trusted.signed.version + 1
    if new.signed.version != expected:
        raise SignatureError(
            f"the server's {expected}.root.json claims version {new.signed.version}",
            fleet=fleet,
        )
    try:
        if trusted is not None:
            trusted.signed.verify_delegate("root", new.signed_bytes, new.signatures)
        new.signed.verify_delegate("root", new.signed_bytes, new.signatures)
    except UnsignedMetadataError as exc:
        raise SignatureError(
            f"root version {expected} failed verification: {exc}", fleet=fleet
        ) from exc


def _key_from_api(data: dict[str, Any]) -> Key:
    body = {k: v for k, v in data.items() if k != "keyid"}
    return Key.from_dict(str(data["keyid"]), body)


def _progress_for(progress: Progress, label: str, total: int) -> Callable[[int], None]:
    return lambda advance: progress(label, advance, total)


def moves_of(pushed: Mapping[str, Any], model: str) -> dict[str, Any] | None:
    """What a push's answer says it did to the nodes on revoked versions of `model`
    (`revocations`, ADR 0035), as `model revoke` and `model push` print it: `nodes_moved`
    (how many), `moved_to` (the version they got; None: none allowed), `nodes_left` (their
    ids). None when the answer names no such move for the model."""
    for entry in pushed.get("revocations") or []:
        if isinstance(entry, Mapping) and entry.get("model") == model:
            return {
                "nodes_moved": len(entry.get("moved") or []),
                "moved_to": entry.get("moved_to"),
                "nodes_left": list(entry.get("left") or []),
            }
    return None


def describe(result: ReleaseResult) -> dict[str, Any]:
    """The result as plain JSON; the moves, when there were any, as top-level fields."""
    out: dict[str, Any] = json.loads(json.dumps(asdict(result), default=str))
    moves = out.pop("moves")
    if moves is not None:
        out.update(moves)
    return out


def _refuse_republishing(
    current: Metadata[Targets], target: str, sha256: str, name: str, version: str
) -> None:
    """Versions are immutable: refuse one that the fleet already lists."""
    existing = current.signed.targets.get(target)
    if existing is None:
        return
    if existing.hashes.get("sha256") == sha256:
        raise ConflictError(f"{name} {version} is already published with this digest", model=name)
    raise ConflictError(
        f"{name} {version} is already published with another digest; "
        "versions are immutable, push a new version",
        model=name,
        version=version,
    )


def _server_key(raw: Mapping[str, Any], what: str) -> Key:
    """A public key the server made, with its keyid checked against the key itself."""
    entry = dict(raw)
    key = SSlibKey.from_dict(str(entry.pop("keyid")), entry)
    if tufrepo.canonical_keyid(key) != key.keyid:
        raise SignatureError(f"the server's new {what} key has a forged keyid", role=what)
    return key
