"""Every bad input gets a clear error and leaves nothing half-written (issue §5)."""

from __future__ import annotations

import copy
import hashlib
import socket
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import pytest
from tuf.api.metadata import Metadata, TargetFile, Targets

from control_plane.artifacts.local import LocalArtifactStore
from control_plane.cli.client import ApiClient, ApiError
from control_plane.cli.release import ReleaseClient
from control_plane.errors import ConflictError, InvalidModelError, SignatureError
from control_plane.registry import sample_models
from control_plane.trust import repository as tufrepo
from control_plane.trust.keys import OperatorKeyset, generate_signer, init_operator_keys
from tests.control_plane.conftest import LiveServer


@pytest.fixture
def keyset(tmp_path: Path) -> OperatorKeyset:
    return init_operator_keys(tmp_path / "keys", root_keys=1, root_threshold=1, passphrase=None)


@pytest.fixture
def api(live_server: LiveServer) -> Any:
    with live_server.api() as client:
        yield client


@pytest.fixture
def fleet(api: ApiClient, keyset: OperatorKeyset) -> str:
    ReleaseClient(api, keyset).create_fleet("gates")
    return "gates"


@pytest.fixture
def pushed(api: ApiClient, keyset: OperatorKeyset, fleet: str, tmp_path: Path) -> Path:
    model = sample_models.tiny_detector(tmp_path / "v1.onnx")
    ReleaseClient(api, keyset).push_model(fleet, model, name="det", version="1.0.0")
    return model


def store_of(server: LiveServer) -> LocalArtifactStore:
    store = server.services.store
    assert isinstance(store, LocalArtifactStore)
    return store


def stored_files(server: LiveServer) -> list[Path]:
    return sorted(p for p in (store_of(server).root / "sha256").rglob("*") if p.is_file())


def temp_files(server: LiveServer) -> list[Path]:
    return sorted(p for p in (store_of(server).root / "tmp").iterdir() if p.name.endswith(".part"))


def targets_version(api: ApiClient, fleet: str) -> int:
    return int(api.json("GET", f"/v1/fleets/{fleet}")["versions"]["targets"])


def current_targets(api: ApiClient, fleet: str) -> Metadata[Targets]:
    return tufrepo.parse_metadata(api.metadata(fleet, "targets.json"), Targets)


# ---------------------------------------------------------------- bad models


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"this is not a model at all" * 10, "not an ONNX model"),
        ("truncated", "truncated or corrupt"),
        (sample_models.broken_model_bytes(), "NoSuchOperator"),
    ],
    ids=["not-onnx", "truncated", "checker-failure"],
)
def test_bad_model_is_refused_before_anything_is_uploaded(
    live_server: LiveServer,
    api: ApiClient,
    keyset: OperatorKeyset,
    fleet: str,
    tmp_path: Path,
    content: bytes | str,
    message: str,
) -> None:
    path = tmp_path / "bad.onnx"
    if content == "truncated":
        good = sample_models.tiny_detector(tmp_path / "good.onnx").read_bytes()
        path.write_bytes(good[: len(good) // 2])
    else:
        assert isinstance(content, bytes)
        path.write_bytes(content)
    with pytest.raises(InvalidModelError, match=message):
        ReleaseClient(api, keyset).push_model(fleet, path, name="det", version="1.0.0")
    assert stored_files(live_server) == []
    assert targets_version(api, fleet) == 1


# ------------------------------------------------------------------ keys


def test_targets_signed_by_an_unknown_key_are_refused(
    api: ApiClient, keyset: OperatorKeyset, fleet: str, pushed: Path
) -> None:
    current = current_targets(api, fleet)
    forged = copy.deepcopy(current)
    forged.signed.version += 1
    forged.sign(generate_signer(), append=False)
    with pytest.raises(ApiError) as refused:
        api.push_targets(fleet, tufrepo.to_bytes(forged))
    assert refused.value.status == 403
    assert targets_version(api, fleet) == current.signed.version


def test_another_fleets_keyset_is_refused_on_the_operator_side(
    api: ApiClient, fleet: str, pushed: Path, tmp_path: Path
) -> None:
    stranger = init_operator_keys(
        tmp_path / "other", root_keys=1, root_threshold=1, passphrase=None
    )
    with pytest.raises(SignatureError, match="root keys this keyset does not hold"):
        ReleaseClient(api, stranger).push_model(fleet, pushed, name="det", version="2.0.0")


# --------------------------------------------------------- hashes, lengths


def test_upload_with_a_wrong_digest_stores_nothing(
    live_server: LiveServer, api: ApiClient, fleet: str
) -> None:
    data = b"model bytes" * 1000
    wrong = hashlib.sha256(b"something else").hexdigest()
    with pytest.raises(ApiError) as refused:
        api.request("PUT", f"/v1/artifacts/{wrong}", content=data)
    assert refused.value.status == 400
    assert refused.value.problem["title"] == "artifact integrity check failed"
    assert stored_files(live_server) == []
    assert temp_files(live_server) == []


def test_targets_whose_length_differs_from_the_artifact_are_refused(
    api: ApiClient, keyset: OperatorKeyset, fleet: str, pushed: Path, tmp_path: Path
) -> None:
    other = sample_models.tiny_detector(tmp_path / "v2.onnx", seed=7)
    data = other.read_bytes()
    api.upload_bytes(data)
    current = current_targets(api, fleet)
    release = ReleaseClient(api, keyset)
    # Build a valid v2 with the real push path, then lie about the length.
    result = release.push_model(fleet, other, name="det", version="2.0.0")
    assert result.targets_version == current.signed.version + 1
    latest = current_targets(api, fleet)
    lying = copy.deepcopy(latest)
    lying.signed.version += 1
    sha = hashlib.sha256(data).hexdigest()
    lying.signed.targets["models/det/9.0.0/model.onnx"] = TargetFile(
        len(data) + 1, {"sha256": sha}, "models/det/9.0.0/model.onnx"
    )
    keyset.sign_targets(lying)
    with pytest.raises(ApiError) as refused:
        api.push_targets(fleet, tufrepo.to_bytes(lying))
    assert refused.value.status == 400
    assert targets_version(api, fleet) == latest.signed.version


def test_targets_naming_a_missing_artifact_are_refused(
    api: ApiClient, keyset: OperatorKeyset, fleet: str, pushed: Path
) -> None:
    current = current_targets(api, fleet)
    bad = copy.deepcopy(current)
    bad.signed.version += 1
    model = bad.signed.targets["models/det/1.0.0/model.onnx"]
    custom = dict(model.custom)
    custom.update(version="3.0.0", release_counter=5)
    custom["reference"] = dict(custom["reference"], path="models/det/3.0.0/reference.npz")
    missing = "ab" * 32
    bad.signed.targets["models/det/3.0.0/model.onnx"] = TargetFile(
        10, {"sha256": missing}, "models/det/3.0.0/model.onnx", {"custom": custom}
    )
    ref = bad.signed.targets["models/det/1.0.0/reference.npz"]
    bad.signed.targets["models/det/3.0.0/reference.npz"] = TargetFile(
        ref.length, dict(ref.hashes), "models/det/3.0.0/reference.npz"
    )
    keyset.sign_targets(bad)
    with pytest.raises(ApiError) as refused:
        api.push_targets(fleet, tufrepo.to_bytes(bad))
    assert refused.value.status == 400
    assert "models/det/3.0.0/model.onnx" in refused.value.detail


# ------------------------------------------------------- immutability, rollback


def test_existing_version_with_another_digest_is_refused(
    api: ApiClient, keyset: OperatorKeyset, fleet: str, pushed: Path, tmp_path: Path
) -> None:
    other = sample_models.tiny_detector(tmp_path / "other.onnx", seed=3)
    with pytest.raises(ConflictError, match="another digest"):
        ReleaseClient(api, keyset).push_model(fleet, other, name="det", version="1.0.0")
    # refused before anything was uploaded
    assert not api.artifact_exists(_digest(other)[0])
    # and the server refuses it too when a client skips that check
    current = current_targets(api, fleet)
    changed = copy.deepcopy(current)
    changed.signed.version += 1
    target = changed.signed.targets["models/det/1.0.0/model.onnx"]
    api.upload_file(other, *_digest(other))
    changed.signed.targets["models/det/1.0.0/model.onnx"] = TargetFile(
        other.stat().st_size,
        {"sha256": _digest(other)[0]},
        target.path,
        {"custom": dict(target.custom)},
    )
    keyset.sign_targets(changed)
    with pytest.raises(ApiError) as refused:
        api.push_targets(fleet, tufrepo.to_bytes(changed))
    assert refused.value.status == 409
    assert refused.value.problem.get("reason") == "immutable"
    versions = api.json("GET", f"/v1/fleets/{fleet}/models/det")
    assert [v["sha256"] for v in versions] == [_digest(pushed)[0]]


def test_stale_or_backward_targets_version_is_refused(
    api: ApiClient, keyset: OperatorKeyset, fleet: str, pushed: Path
) -> None:
    current = current_targets(api, fleet)
    stale = copy.deepcopy(current)  # same version as the server's: someone pushed first
    keyset.sign_targets(stale)
    with pytest.raises(ApiError) as refused:
        api.push_targets(fleet, tufrepo.to_bytes(stale))
    assert refused.value.status == 409
    assert refused.value.problem.get("reason") == "stale"
    backwards = copy.deepcopy(current)
    backwards.signed.version -= 1
    keyset.sign_targets(backwards)
    with pytest.raises(ApiError) as again:
        api.push_targets(fleet, tufrepo.to_bytes(backwards))
    assert again.value.status == 409
    assert targets_version(api, fleet) == current.signed.version


def test_release_counter_going_backwards_is_refused(
    api: ApiClient, keyset: OperatorKeyset, fleet: str, pushed: Path, tmp_path: Path
) -> None:
    other = sample_models.tiny_detector(tmp_path / "other.onnx", seed=4)
    api.upload_file(other, *_digest(other))
    current = current_targets(api, fleet)
    new = copy.deepcopy(current)
    new.signed.version += 1
    old = new.signed.targets["models/det/1.0.0/model.onnx"]
    custom = dict(old.custom)
    custom.update(version="0.9.0", release_counter=1)  # v1.0.0 already holds counter 1
    custom["reference"] = dict(custom["reference"], path="models/det/0.9.0/reference.npz")
    sha, length = _digest(other)
    new.signed.targets["models/det/0.9.0/model.onnx"] = TargetFile(
        length, {"sha256": sha}, "models/det/0.9.0/model.onnx", {"custom": custom}
    )
    ref = new.signed.targets["models/det/1.0.0/reference.npz"]
    new.signed.targets["models/det/0.9.0/reference.npz"] = TargetFile(
        ref.length, dict(ref.hashes), "models/det/0.9.0/reference.npz"
    )
    keyset.sign_targets(new)
    with pytest.raises(ApiError) as refused:
        api.push_targets(fleet, tufrepo.to_bytes(new))
    assert refused.value.status == 409
    assert refused.value.problem["title"] == "rollback refused"


# ------------------------------------------------------------ transport


def test_upload_cut_off_mid_stream_leaves_nothing(live_server: LiveServer, fleet: str) -> None:
    data = b"x" * (4 << 20)
    sha = hashlib.sha256(data).hexdigest()
    url = urlparse(live_server.url)
    with socket.create_connection((url.hostname, url.port), timeout=10) as sock:
        head = (
            f"PUT /v1/artifacts/{sha} HTTP/1.1\r\nHost: {url.netloc}\r\n"
            f"Authorization: Bearer {live_server.admin_token}\r\n"
            f"Content-Length: {len(data)}\r\nContent-Type: application/octet-stream\r\n\r\n"
        )
        sock.sendall(head.encode() + data[: len(data) // 3])
        time.sleep(0.2)
    deadline = time.monotonic() + 10
    while temp_files(live_server) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert temp_files(live_server) == []
    assert stored_files(live_server) == []
    assert not live_server.services.store.exists(sha)


def test_artifact_over_the_limit_is_413_before_reading(
    live_server: LiveServer, api: ApiClient, fleet: str
) -> None:
    limit = live_server.services.config.max_artifact_bytes
    url = urlparse(live_server.url)
    with socket.create_connection((url.hostname, url.port), timeout=10) as sock:
        head = (
            f"PUT /v1/artifacts/{'0' * 64} HTTP/1.1\r\nHost: {url.netloc}\r\n"
            f"Authorization: Bearer {live_server.admin_token}\r\n"
            f"Content-Length: {limit + 1}\r\n\r\n"
        )
        sock.sendall(head.encode())
        reply = sock.recv(4096).decode()
    assert reply.startswith("HTTP/1.1 413")
    assert stored_files(live_server) == []


def test_upload_without_a_length_is_refused(
    live_server: LiveServer, api: ApiClient, fleet: str
) -> None:
    with pytest.raises(ApiError) as refused:
        api.request("PUT", f"/v1/artifacts/{'0' * 64}", content=iter([b"\0" * 1024]))
    assert refused.value.status == 400
    assert "Content-Length" in refused.value.detail
    assert stored_files(live_server) == []


# ------------------------------------------------------------------ roles


def test_pushing_needs_the_release_manager_role(
    live_server: LiveServer, api: ApiClient, keyset: OperatorKeyset, fleet: str, tmp_path: Path
) -> None:
    model = sample_models.tiny_detector(tmp_path / "m.onnx")
    operator = api.json("POST", "/v1/tokens", json={"name": "ops", "role": "operator"})["token"]
    with live_server.api(operator) as as_operator, pytest.raises(ApiError) as refused:
        ReleaseClient(as_operator, keyset).push_model(fleet, model, name="det", version="1.0.0")
    assert refused.value.status == 403
    releaser = api.json("POST", "/v1/tokens", json={"name": "rm", "role": "release-manager"})
    with live_server.api(releaser["token"]) as as_releaser:
        result = ReleaseClient(as_releaser, keyset).push_model(
            fleet, model, name="det", version="1.0.0"
        )
    assert result.release_counter == 1


def test_no_token_cannot_push(live_server: LiveServer, fleet: str, tmp_path: Path) -> None:
    with live_server.api("") as anonymous, pytest.raises(ApiError) as refused:
        anonymous.upload_bytes(b"data")
    assert refused.value.status == 401


def _digest(path: Path) -> tuple[str, int]:
    data = path.read_bytes()
    return hashlib.sha256(data).hexdigest(), len(data)
