"""Online keys behind signer URIs: a fleet moves its timestamp key into a KMS (here the
`file2:` scheme) with a root rotation, and a bad mapping stops the server (ADR 0045)."""

from __future__ import annotations

import dataclasses
import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from securesystemslib.signer import Key, SSlibKey
from tuf.api.metadata import Metadata, Root, Targets, Timestamp

from control_plane.access.service import SYSTEM
from control_plane.cli.release import ReleaseClient
from control_plane.errors import EdgefleetError, InvalidInputError
from control_plane.services import ServiceConfig, build_services
from control_plane.trust import repository as tufrepo
from control_plane.trust.keys import (
    generate_signer,
    init_operator_keys,
    load_operator_keyset,
    save_private_key,
    save_public_key,
)
from control_plane.trust.signer import load_online_key_uris
from tests.control_plane.conftest import LiveServer

FLEET = "harbour"


def server_key(entry: dict[str, Any]) -> Key:
    rest = dict(entry)
    return SSlibKey.from_dict(str(rest.pop("keyid")), rest)


def kms_key(directory: Path, name: str) -> tuple[str, str]:
    """A key "in the KMS": its file2 URI and the public key file beside the mapping."""
    signer = generate_signer()
    save_private_key(directory / f"{name}.pem", signer, None)
    save_public_key(directory / f"{name}.pub", signer.public_key)
    return f"file2:{directory / f'{name}.pem'}", signer.public_key.keyid


def test_a_root_rotation_moves_the_timestamp_key_behind_a_signer_uri(
    live_server: LiveServer,
    service_config: ServiceConfig,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("EDGEFLEET_KEY_PASSPHRASE", raising=False)
    init_operator_keys(tmp_path / "op", root_keys=1, root_threshold=1, passphrase=None)
    keyset = load_operator_keyset(tmp_path / "op", None)
    ReleaseClient(live_server.api(), keyset).create_fleet(FLEET)  # file keys, as before

    kms = tmp_path / "kms"
    kms.mkdir()
    uri, keyid = kms_key(kms, "timestamp")
    yard_uri, yard_keyid = kms_key(kms, "yard-snapshot")
    mapping = {
        FLEET: {"timestamp": {"uri": uri, "public_key": "timestamp.pub"}},
        "yard": {"snapshot": {"uri": yard_uri, "public_key": "yard-snapshot.pub"}},
    }
    (kms / "uris.json").write_text(json.dumps(mapping))

    replica = build_services(
        dataclasses.replace(
            service_config,
            data_dir=tmp_path / "replica",
            keys_dir=service_config.data_dir,
            online_signer_uris=kms / "uris.json",
        )
    )
    try:
        # What `keys rotate-online` asks for: the listed role gets its URI key.
        raw = replica.registry.new_online_keys(SYSTEM, FLEET)
        assert raw["timestamp"]["keyid"] == keyid
        online = {role: server_key(entry) for role, entry in raw.items()}
        old = live_server.services.registry
        root = Metadata[Root].from_bytes(old.metadata_file(FLEET, "root.json"))
        targets = Metadata[Targets].from_bytes(old.metadata_file(FLEET, "targets.json"))
        now = datetime.now(UTC)
        new_root = tufrepo.build_next_root(
            root,
            release_keys=[root.signed.get_key(k) for k in root.signed.roles["targets"].keyids],
            online_keys=online,
            expires=now + timedelta(days=30),
        )
        keyset.sign_root(new_root)
        new_targets = tufrepo.resigned_targets(targets, expires=now + timedelta(days=7))
        keyset.sign_targets(new_targets)
        root_bytes, targets_bytes = tufrepo.to_bytes(new_root), tufrepo.to_bytes(new_targets)

        # A server without the mapping holds no such key: the root is refused.
        with pytest.raises(EdgefleetError, match=keyid):
            old.rotate_root(SYSTEM, FLEET, root_bytes, targets_bytes)
        replica.registry.rotate_root(SYSTEM, FLEET, root_bytes, targets_bytes)
        served = Metadata[Timestamp].from_bytes(
            replica.registry.metadata_file(FLEET, "timestamp.json")
        )
        assert list(served.signatures) == [keyid]
        new_root.signed.verify_delegate("timestamp", served.signed_bytes, served.signatures)
        # A new fleet listed in the mapping starts on its URI key; the rest are files.
        yard = replica.registry.create_fleet(SYSTEM, "yard")
        assert yard.online_keys["snapshot"]["keyid"] == yard_keyid
        assert (service_config.data_dir / "online-keys" / "yard" / "timestamp.key").exists()
        assert not (service_config.data_dir / "online-keys" / "yard" / "snapshot.key").exists()
    finally:
        replica.close()


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ({"plant": {"root": {}}}, r"plant/root: 'root' is not an online role"),
        ({"plant": {"timestamp": {"uri": "file2:x"}}}, r"plant/timestamp: expected"),
        (
            {"plant": {"timestamp": {"uri": "nokms:x", "public_key": "k.pub"}}},
            r"plant/timestamp: unknown scheme 'nokms'",
        ),
        (
            {"plant": {"snapshot": {"uri": "file2:x", "public_key": "absent.pub"}}},
            r"plant/snapshot: .*absent\.pub",
        ),
        ({"Plant!": {}}, r"'Plant!' is not a fleet name"),
        ([], r"expected \{fleet"),
    ],
)
def test_a_bad_signer_uri_mapping_names_the_entry(
    tmp_path: Path, entry: object, message: str
) -> None:
    path = tmp_path / "uris.json"
    path.write_text(json.dumps(entry))
    with pytest.raises(InvalidInputError, match=message):
        load_online_key_uris(path)


def test_a_bad_signer_uri_mapping_stops_the_server(service_config: ServiceConfig) -> None:
    path = service_config.data_dir.parent / "uris.json"
    path.write_text("{not json")
    with pytest.raises(InvalidInputError, match=r"online signer URIs .*uris\.json: cannot read"):
        build_services(dataclasses.replace(service_config, online_signer_uris=path))
