"""The metadata our rules produce is accepted by an unmodified `tuf.ngclient.Updater`.

A tmp directory laid out as a consistent-snapshot repository is served over HTTP on
loopback; the updater refreshes, looks up a model target and downloads it.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from tuf.api.exceptions import LengthOrHashMismatchError
from tuf.api.metadata import Metadata, Snapshot, TargetFile, Timestamp
from tuf.ngclient import Updater
from tuf.ngclient.urllib3_fetcher import Urllib3Fetcher

from control_plane.trust import repository as repo
from control_plane.trust.custom import model_target_path, reference_target_path
from tests.control_plane.trust.helpers import Fleet

MODEL_BYTES = b"\x08\x07pretend this is an ONNX protobuf" * 10
REFERENCE_BYTES = b"PK\x03\x04pretend this is an npz"


class _QuietHandler(SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass


class Served:
    """A fleet's published repository: what the control plane would serve."""

    def __init__(self, root_dir: Path, fleet: Fleet) -> None:
        self.fleet = fleet
        self.metadata = root_dir / "metadata"
        self.targets = root_dir / "targets"
        self.metadata.mkdir()
        self.targets.mkdir()
        self.snapshot: Metadata[Snapshot] | None = None
        self.timestamp: Metadata[Timestamp] | None = None
        root = repo.verify_new_root(
            repo.to_bytes(fleet.root),
            snapshot_keyid=fleet.snapshot.public_key.keyid,
            timestamp_keyid=fleet.timestamp.public_key.keyid,
            now=fleet.now,
        )
        self.root_bytes = repo.to_bytes(root)
        (self.metadata / "1.root.json").write_bytes(self.root_bytes)
        targets = repo.verify_initial_targets(
            root=root, targets_bytes=repo.to_bytes(fleet.targets), now=fleet.now
        )
        self.publish(targets)

    def publish(self, targets: Metadata[Any]) -> None:
        """Write N.targets.json, a new snapshot and timestamp, and the new target files."""
        (self.metadata / f"{targets.signed.version}.targets.json").write_bytes(
            repo.to_bytes(targets)
        )
        self.resign(targets)
        for target in targets.signed.targets.values():
            digest = target.hashes["sha256"]
            data = self.fleet.artifacts[digest]
            [hashed] = target.get_prefixed_paths()
            path = self.targets / hashed
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)

    def resign(self, targets: Metadata[Any]) -> None:
        now = self.fleet.now
        snapshot = repo.make_snapshot(
            targets, previous=self.snapshot, expires=now + timedelta(days=7)
        )
        snapshot.sign(self.fleet.snapshot)
        timestamp = repo.make_timestamp(
            snapshot.signed.version, previous=self.timestamp, expires=now + timedelta(days=1)
        )
        timestamp.sign(self.fleet.timestamp)
        (self.metadata / f"{snapshot.signed.version}.snapshot.json").write_bytes(
            repo.to_bytes(snapshot)
        )
        (self.metadata / "timestamp.json").write_bytes(repo.to_bytes(timestamp))
        self.snapshot, self.timestamp = snapshot, timestamp


@pytest.fixture
def http_root(tmp_path: Path) -> Iterator[tuple[Path, str]]:
    root = tmp_path / "served"
    root.mkdir()
    handler = functools.partial(_QuietHandler, directory=str(root))
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05})
    thread.start()
    try:
        yield root, f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)
        assert not thread.is_alive()


@pytest.fixture(autouse=True)
def _no_proxy(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (
        "http_proxy",
        "https_proxy",
        "all_proxy",
        "HTTP_PROXY",
        "HTTPS_PROXY",
        "ALL_PROXY",
    ):
        monkeypatch.delenv(name, raising=False)


def updater(served: Served, base: str, client: Path) -> Updater:
    (client / "metadata").mkdir(parents=True, exist_ok=True)
    (client / "targets").mkdir(parents=True, exist_ok=True)
    return Updater(
        metadata_dir=str(client / "metadata"),
        metadata_base_url=f"{base}/metadata/",
        target_dir=str(client / "targets"),
        target_base_url=f"{base}/targets/",
        fetcher=Urllib3Fetcher(socket_timeout=10),
        bootstrap=served.root_bytes,
    )


def test_unmodified_ngclient_accepts_our_repository(
    http_root: tuple[Path, str], tmp_path: Path
) -> None:
    root_dir, base = http_root
    fleet = Fleet.create(now=datetime.now(UTC))
    served = Served(root_dir, fleet)

    change = fleet.release_model(
        "detector", "1.2.0", content=MODEL_BYTES, reference=REFERENCE_BYTES
    )
    served.publish(change.metadata)

    client = updater(served, base, tmp_path / "client")
    client.refresh()
    info = client.get_targetinfo(model_target_path("detector", "1.2.0"))
    assert info is not None
    assert info.custom["release_counter"] == 1
    assert info.custom["reference"]["path"] == reference_target_path("detector", "1.2.0")
    path = client.download_target(info, filepath=str(tmp_path / "model.onnx"))
    assert Path(path).read_bytes() == MODEL_BYTES
    ref = client.get_targetinfo(info.custom["reference"]["path"])
    assert ref is not None
    ref_path = client.download_target(ref, filepath=str(tmp_path / "reference.npz"))
    assert Path(ref_path).read_bytes() == REFERENCE_BYTES
    assert client.get_targetinfo(model_target_path("detector", "9.9.9")) is None

    # The freshness duty: snapshot and timestamp re-signed with no new targets, then a
    # floor raised; a new updater over the same cache accepts both steps.
    served.resign(change.metadata)
    floor_md, floor_bytes = repo.raise_floor(
        fleet.targets, "detector", 1, fleet.now + timedelta(days=30)
    )
    floor_md.sign(fleet.release)
    fleet.upload("floors/detector.json", floor_bytes)
    served.publish(fleet.accept(floor_md).metadata)
    again = updater(served, base, tmp_path / "client")
    again.refresh()
    floor = again.get_targetinfo("floors/detector.json")
    assert floor is not None
    assert floor.custom == {"edgefleet": 1, "kind": "floor", "model": "detector", "floor": 1}
    floor_path = again.download_target(floor, filepath=str(tmp_path / "floor.json"))
    assert Path(floor_path).read_bytes() == floor_bytes


@pytest.mark.parametrize(
    "tamper",
    [
        lambda data: bytes([data[0] ^ 1]) + data[1:],  # same length, other hash
        lambda data: data[:-1],  # truncated
    ],
    ids=["flipped-bit", "truncated"],
)
def test_tampered_target_is_rejected(
    http_root: tuple[Path, str], tmp_path: Path, tamper: Any
) -> None:
    root_dir, base = http_root
    fleet = Fleet.create(now=datetime.now(UTC))
    served = Served(root_dir, fleet)
    served.publish(fleet.release_model("detector", "1.0.0", content=MODEL_BYTES).metadata)

    info: TargetFile | None
    client = updater(served, base, tmp_path / "client")
    info = client.get_targetinfo(model_target_path("detector", "1.0.0"))
    assert info is not None
    [hashed] = info.get_prefixed_paths()
    served_file = served.targets / hashed
    served_file.write_bytes(tamper(served_file.read_bytes()))

    destination = tmp_path / "model.onnx"
    with pytest.raises(LengthOrHashMismatchError):
        client.download_target(info, filepath=str(destination))
    assert not destination.exists()
