"""A revoked release key, end to end: root rotation through the live API and a TUF client."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from tuf.api.metadata import Metadata, Root, Targets

from control_plane.cli.client import ApiClient, ApiError
from control_plane.cli.main import main
from control_plane.cli.release import TARGETS_TTL, ReleaseClient
from control_plane.errors import SignatureError
from control_plane.registry import sample_models
from control_plane.trust import repository as tufrepo
from control_plane.trust.keys import (
    OperatorKeyset,
    commit_release_rotation,
    init_operator_keys,
    load_operator_keyset,
    rotate_release_key,
)
from tests.control_plane.api.conftest import LiveServer
from tests.control_plane.api.test_registry_flow import tuf_updater

FLEET = "parks"
MODEL_V1 = "models/detector/1.0.0/model.onnx"
MODEL_V2 = "models/detector/2.0.0/model.onnx"


class RecordingTransport(httpx.HTTPTransport):
    """Loopback HTTP that remembers every request it sent."""

    def __init__(self) -> None:
        super().__init__()
        self.sent: list[tuple[str, str]] = []

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        self.sent.append((request.method, request.url.path))
        return super().handle_request(request)


@pytest.fixture
def keydir(tmp_path: Path) -> Path:
    directory = tmp_path / "keys"
    init_operator_keys(directory, root_keys=3, root_threshold=2, passphrase=None)
    return directory


@pytest.fixture
def api(live_server: LiveServer) -> Iterator[ApiClient]:
    with live_server.api() as client:
        yield client


@pytest.fixture
def old_keyset(keydir: Path, api: ApiClient, tmp_path: Path) -> OperatorKeyset:
    """The operator's keys before the rotation; the fleet holds detector 1.0.0."""
    keyset = load_operator_keyset(keydir, None)
    release = ReleaseClient(api, keyset)
    release.create_fleet(FLEET)
    model = sample_models.tiny_detector(tmp_path / "v1.onnx")
    assert release.push_model(FLEET, model, name="detector", version="1.0.0").targets_version == 2
    return keyset


def versions(api: ApiClient) -> dict[str, int]:
    result: dict[str, int] = api.json("GET", f"/v1/fleets/{FLEET}")["versions"]
    return result


def test_a_revoked_release_key_can_no_longer_release(
    live_server: LiveServer,
    api: ApiClient,
    keydir: Path,
    old_keyset: OperatorKeyset,
    tmp_path: Path,
) -> None:
    old_keyid = old_keyset.release_public_key.keyid
    # A node that trusted the fleet before the rotation, with targets signed by the old key.
    node = tuf_updater(live_server, FLEET, tmp_path / "node")
    node.refresh()
    assert node.get_targetinfo(MODEL_V1) is not None

    # -- rotate: the new key waits beside the old one until the server accepts root 2
    revoked, new_signer = rotate_release_key(keydir, None)
    assert revoked == old_keyid
    rotation = ReleaseClient(api, old_keyset).rotate_release_key(FLEET, new_signer)
    assert rotation["root_version"] == 2
    assert rotation["targets_version"] == 3
    assert rotation["revoked_keyids"] == [old_keyid]
    assert rotation["already_rotated"] is False
    assert commit_release_rotation(keydir) == (old_keyid, new_signer.public_key.keyid)
    assert versions(api) == {"root": 2, "targets": 3, "snapshot": 3, "timestamp": 3}

    root2 = Metadata[Root].from_bytes(api.metadata(FLEET, "2.root.json"))
    assert root2.signed.roles["targets"].keyids == [new_signer.public_key.keyid]
    assert old_keyid not in root2.signed.keys
    targets3 = Metadata[Targets].from_bytes(api.metadata(FLEET, "3.targets.json"))
    assert set(targets3.signatures) == {new_signer.public_key.keyid}
    assert MODEL_V1 in targets3.signed.targets
    audit = api.json("GET", "/v1/audit", params={"action": "root.rotate"})
    assert [(e["outcome"], e["target"]) for e in audit] == [("ok", f"fleet:{FLEET}")]

    # Rotating to the same key again is a no-op: a resumed rotation only commits.
    again = ReleaseClient(api, old_keyset).rotate_release_key(FLEET, new_signer)
    assert again["already_rotated"] is True
    assert versions(api)["root"] == 2

    # -- the old key, used directly: a valid next targets signed by it is refused (403)
    current = Metadata[Targets].from_bytes(api.metadata(FLEET, "targets.json"))
    forged, floor_bytes = tufrepo.raise_floor(
        current, "detector", 5, expires=current.signed.expires + TARGETS_TTL
    )
    api.upload_bytes(floor_bytes)
    forged.sign(old_keyset.release_signer)
    with pytest.raises(ApiError) as refused:
        api.push_targets(FLEET, tufrepo.to_bytes(forged))
    assert refused.value.status == 403
    assert refused.value.problem["unknown_keyids"] == [old_keyid]
    assert versions(api)["targets"] == 3
    # The very same metadata signed by the new key is fine: only the signature was wrong.
    forged.sign(new_signer, append=False)
    assert api.push_targets(FLEET, tufrepo.to_bytes(forged))["targets_version"] == 4

    # -- the old keyset through the CLI's client: refused before anything is sent
    transport = RecordingTransport()
    with ApiClient(live_server.url, live_server.admin_token, transport=transport) as old_api:
        model_v2 = sample_models.tiny_detector(tmp_path / "v2.onnx", seed=2)
        with pytest.raises(SignatureError, match="not a targets key") as stale:
            ReleaseClient(old_api, old_keyset).push_model(
                FLEET, model_v2, name="detector", version="2.0.0"
            )
    assert stale.value.fields["keyid"] == old_keyid
    assert transport.sent
    assert all(method == "GET" for method, _ in transport.sent), transport.sent
    assert versions(api)["targets"] == 4

    # -- the committed keyset (new release key) pushes as usual
    new_keyset = load_operator_keyset(keydir, None)
    assert new_keyset.release_public_key == new_signer.public_key
    pushed = ReleaseClient(api, new_keyset).push_model(
        FLEET, model_v2, name="detector", version="2.0.0"
    )
    assert pushed.targets_version == 5
    assert pushed.release_counter == 5  # at least the floor raised above

    # -- unmodified TUF clients follow root 1 -> 2 and download
    fresh = tuf_updater(live_server, FLEET, tmp_path / "fresh")
    fresh.refresh()
    trusted_root = json.loads((tmp_path / "fresh" / "tuf-meta" / "root.json").read_bytes())
    assert trusted_root["signed"]["version"] == 2
    for path, model in ((MODEL_V1, tmp_path / "v1.onnx"), (MODEL_V2, model_v2)):
        info = fresh.get_targetinfo(path)
        assert info is not None
        assert Path(fresh.download_target(info)).read_bytes() == model.read_bytes()

    # The node from before the rotation (cached root 1, targets signed by the old key),
    # with a new Updater per refresh as agents do.
    node = tuf_updater(live_server, FLEET, tmp_path / "node")
    node.refresh()
    info = node.get_targetinfo(MODEL_V2)
    assert info is not None
    assert Path(node.download_target(info)).read_bytes() == model_v2.read_bytes()


def test_rotation_needs_an_admin_and_the_root_keys(
    live_server: LiveServer, api: ApiClient, keydir: Path, old_keyset: OperatorKeyset
) -> None:
    _, new_signer = rotate_release_key(keydir, None)
    root1 = Metadata[Root].from_bytes(api.metadata(FLEET, "1.root.json"))
    targets = Metadata[Targets].from_bytes(api.metadata(FLEET, "targets.json"))
    root2 = tufrepo.build_next_root(
        root1, release_keys=[new_signer.public_key], expires=root1.signed.expires
    )
    resigned = tufrepo.resigned_targets(targets, targets.signed.expires)
    resigned.sign(new_signer)

    # Signed by one root key of the 2-of-3: refused, nothing changes.
    root2.sign(old_keyset.root_signers[0])
    with pytest.raises(ApiError) as under:
        api.rotate_root(FLEET, root2.to_dict(), resigned.to_dict())
    assert under.value.status == 403
    assert under.value.problem["threshold"] == 2

    # Properly signed, but by a release manager: refused, it takes an admin.
    root2.sign(old_keyset.root_signers[1], append=True)
    created = api.json("POST", "/v1/tokens", json={"name": "rm", "role": "release-manager"})
    with live_server.api(created["token"]) as manager, pytest.raises(ApiError) as denied:
        manager.rotate_root(FLEET, root2.to_dict(), resigned.to_dict())
    assert denied.value.status == 403
    assert denied.value.problem["needed"] == "admin"
    assert versions(api) == {"root": 1, "targets": 2, "snapshot": 2, "timestamp": 2}

    # Smuggling a new target into the rotation: refused by policy.
    smuggled = tufrepo.resigned_targets(targets, targets.signed.expires)
    smuggled.signed.targets.pop(MODEL_V1)
    smuggled.sign(new_signer)
    with pytest.raises(ApiError) as policy:
        api.rotate_root(FLEET, root2.to_dict(), smuggled.to_dict())
    assert policy.value.status == 422
    assert policy.value.problem["removed"] == [MODEL_V1]

    # The admin with both: accepted; replaying it is a stale conflict.
    accepted = api.rotate_root(FLEET, root2.to_dict(), resigned.to_dict())
    assert accepted["root_version"] == 2
    assert accepted["release_keyids"] == [new_signer.public_key.keyid]
    with pytest.raises(ApiError) as replay:
        api.rotate_root(FLEET, root2.to_dict(), resigned.to_dict())
    assert replay.value.status == 409
    assert replay.value.problem["reason"] == "stale"
    outcomes = [
        e["outcome"] for e in api.json("GET", "/v1/audit", params={"action": "root.rotate"})
    ]
    assert sorted(outcomes) == ["ok", "refused", "refused", "refused", "refused"]


def run_cli(live_server: LiveServer, capsys: pytest.CaptureFixture[str], *args: str) -> Any:
    capsys.readouterr()
    argv = ["--server", live_server.url, "--token", live_server.admin_token, "-o", "json"]
    assert main([*argv, *args]) == 0, capsys.readouterr().err
    return json.loads(capsys.readouterr().out)


def test_cli_rotates_and_resumes_an_interrupted_rotation(
    live_server: LiveServer,
    api: ApiClient,
    keydir: Path,
    old_keyset: OperatorKeyset,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("EDGEFLEET_KEY_PASSPHRASE", raising=False)
    first_keyid = old_keyset.release_public_key.keyid
    out = run_cli(
        live_server, capsys, "keys", "rotate-release", "--fleet", FLEET, "--keys", str(keydir)
    )
    second_keyid = out["release_keyid"]
    assert out["old_keyid"] == first_keyid
    assert (out["root_version"], out["resumed"], out["already_rotated"]) == (2, False, False)
    assert load_operator_keyset(keydir, None).release_public_key.keyid == second_keyid
    assert (keydir / f"release-{first_keyid[:12]}.revoked.key").exists()

    # A crash after the server accepted root 3 but before the keys on disk were committed.
    _, third = rotate_release_key(keydir, None)
    ReleaseClient(api, load_operator_keyset(keydir, None)).rotate_release_key(FLEET, third)
    assert versions(api)["root"] == 3
    with pytest.raises(SignatureError, match="rotate-release"):
        ReleaseClient(api, load_operator_keyset(keydir, None)).trusted_metadata(FLEET)

    out = run_cli(
        live_server, capsys, "keys", "rotate-release", "--fleet", FLEET, "--keys", str(keydir)
    )
    assert (out["resumed"], out["already_rotated"]) == (True, True)
    assert (out["old_keyid"], out["release_keyid"]) == (second_keyid, third.public_key.keyid)
    assert versions(api)["root"] == 3  # nothing posted twice
    keyset = load_operator_keyset(keydir, None)
    assert keyset.release_public_key == third.public_key
    _, _, warnings = ReleaseClient(api, keyset).trusted_metadata(FLEET)
    assert warnings == []
