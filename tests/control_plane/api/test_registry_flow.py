"""The signed registry end to end: keys, fleet, push, list, TUF client verification."""

from __future__ import annotations

import hashlib
import threading
from pathlib import Path

import pytest
from tuf.api.exceptions import LengthOrHashMismatchError
from tuf.ngclient import Updater

from control_plane.artifacts.local import LocalArtifactStore
from control_plane.cli.client import ApiError
from control_plane.cli.release import ReleaseClient
from control_plane.registry import sample_models
from control_plane.trust.keys import OperatorKeyset, init_operator_keys
from tests.control_plane.conftest import LiveServer


@pytest.fixture
def keyset(tmp_path: Path) -> OperatorKeyset:
    return init_operator_keys(tmp_path / "keys", root_keys=3, root_threshold=2, passphrase=None)


@pytest.fixture
def fleet(live_server: LiveServer, keyset: OperatorKeyset) -> str:
    with live_server.api() as api:
        created = ReleaseClient(api, keyset).create_fleet("parks")
    assert created["state"] == "active"
    assert created["versions"] == {"root": 1, "targets": 1, "snapshot": 1, "timestamp": 1}
    return "parks"


def tuf_updater(server: LiveServer, fleet: str, tmp: Path) -> Updater:
    """An unmodified python-tuf client that knows nothing but the fleet's first root."""
    meta = tmp / "tuf-meta"
    meta.mkdir(parents=True, exist_ok=True)
    targets = tmp / "tuf-targets"
    targets.mkdir(parents=True, exist_ok=True)
    with server.api() as api:
        root = api.metadata(fleet, "1.root.json")
    base = f"{server.url}/v1/fleets/{fleet}/tuf"
    return Updater(
        metadata_dir=str(meta),
        metadata_base_url=f"{base}/metadata/",
        target_base_url=f"{base}/targets/",
        target_dir=str(targets),
        bootstrap=root,
    )


def test_push_then_a_tuf_client_downloads_and_rejects_tampering(
    live_server: LiveServer, keyset: OperatorKeyset, fleet: str, tmp_path: Path
) -> None:
    model = sample_models.tiny_detector(tmp_path / "det.onnx")
    with live_server.api() as api:
        result = ReleaseClient(api, keyset).push_model(
            fleet, model, name="detector", version="1.0.0"
        )
        listed = api.json("GET", f"/v1/fleets/{fleet}/models")
    digest = hashlib.sha256(model.read_bytes()).hexdigest()
    assert result.sha256 == digest
    assert result.release_counter == 1
    assert result.targets_version == 2
    assert [(m["model"], m["version"], m["sha256"]) for m in listed] == [
        ("detector", "1.0.0", digest)
    ]
    custom = listed[0]["custom"]
    assert custom["io"]["inputs"][0]["name"] == "images"
    assert custom["opset"] == {"": 17}
    assert custom["reference"]["path"] == "models/detector/1.0.0/reference.npz"

    updater = tuf_updater(live_server, fleet, tmp_path)
    updater.refresh()
    info = updater.get_targetinfo("models/detector/1.0.0/model.onnx")
    assert info is not None
    assert info.custom["release_counter"] == 1
    path = updater.download_target(info)
    assert Path(path).read_bytes() == model.read_bytes()
    reference = updater.get_targetinfo("models/detector/1.0.0/reference.npz")
    assert reference is not None
    assert reference.hashes["sha256"] == custom["reference"]["sha256"]

    # Tamper with the stored bytes: the unmodified client must refuse them.
    store = live_server.services.store
    assert isinstance(store, LocalArtifactStore)
    stored = store.path_of(digest)
    stored.chmod(0o644)
    data = bytearray(stored.read_bytes())
    data[-1] ^= 0xFF
    stored.write_bytes(bytes(data))
    fresh = tuf_updater(live_server, fleet, tmp_path / "second")
    fresh.refresh()
    target = fresh.get_targetinfo("models/detector/1.0.0/model.onnx")
    assert target is not None
    with pytest.raises(LengthOrHashMismatchError):
        fresh.download_target(target, filepath=str(tmp_path / "tampered.onnx"))


def test_range_download_resumes(
    live_server: LiveServer, keyset: OperatorKeyset, fleet: str, tmp_path: Path
) -> None:
    model = sample_models.tiny_detector(tmp_path / "det.onnx")
    data = model.read_bytes()
    with live_server.api() as api:
        ReleaseClient(api, keyset).push_model(fleet, model, name="detector", version="1.0.0")
        url = f"/v1/fleets/{fleet}/models/detector/versions/1.0.0/artifact"
        head = api.request("GET", url, headers={"Range": "bytes=0-99"})
        tail = api.request("GET", url, headers={"Range": "bytes=100-"})
        whole = api.request("GET", url)
        with pytest.raises(ApiError) as bad:
            api.request("GET", url, headers={"Range": f"bytes={len(data) + 5}-"})
    assert head.status_code == 206
    assert head.headers["content-range"] == f"bytes 0-99/{len(data)}"
    assert tail.status_code == 206
    assert head.content + tail.content == data
    assert whole.content == data
    assert bad.value.status == 416


def test_second_version_counts_up_and_revoke_raises_the_floor(
    live_server: LiveServer, keyset: OperatorKeyset, fleet: str, tmp_path: Path
) -> None:
    with live_server.api() as api:
        release = ReleaseClient(api, keyset)
        release.push_model(
            fleet, sample_models.tiny_detector(tmp_path / "a.onnx"), name="det", version="1.0.0"
        )
        second = release.push_model(
            fleet,
            sample_models.tiny_detector(tmp_path / "b.onnx", seed=1),
            name="det",
            version="1.1.0",
        )
        assert second.release_counter == 2
        revoked = release.revoke(fleet, "det", "1.0.0")
        assert revoked["floor"] == 2
        versions = api.json("GET", f"/v1/fleets/{fleet}/models/det")
        shown = api.json("GET", f"/v1/fleets/{fleet}/models/det/versions/1.1.0")
    assert [(v["version"], v["revoked"]) for v in versions] == [("1.0.0", True), ("1.1.0", False)]
    assert shown["release_counter"] == 2

    updater = tuf_updater(live_server, fleet, tmp_path)
    updater.refresh()
    floor = updater.get_targetinfo("floors/det.json")
    assert floor is not None
    assert floor.custom["floor"] == 2


def test_concurrent_pushes_both_land_after_a_retry(
    live_server: LiveServer, keyset: OperatorKeyset, fleet: str, tmp_path: Path
) -> None:
    models = [sample_models.tiny_detector(tmp_path / f"m{i}.onnx", seed=i) for i in range(2)]
    barrier = threading.Barrier(2)
    results: dict[str, int] = {}
    errors: list[BaseException] = []

    def push(i: int) -> None:
        try:
            with live_server.api() as api:
                release = ReleaseClient(api, keyset)
                barrier.wait(timeout=10)
                out = release.push_model(fleet, models[i], name=f"model-{i}", version="1.0.0")
                results[out.model] = out.attempts
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=push, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors, errors
    assert set(results) == {"model-0", "model-1"}
    with live_server.api() as api:
        listed = api.json("GET", f"/v1/fleets/{fleet}/models")
        fleet_info = api.json("GET", f"/v1/fleets/{fleet}")
    assert {m["model"] for m in listed} == {"model-0", "model-1"}
    assert fleet_info["versions"]["targets"] == 3
