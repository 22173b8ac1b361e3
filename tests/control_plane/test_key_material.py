"""Replicas and restores: a control plane without a fleet's keys refuses to sign rather
than make new ones, keys come from one configured place, and a signer URI picks the
securesystemslib signer (ADR 0045)."""

from __future__ import annotations

import dataclasses
import shutil
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from securesystemslib.signer import SIGNER_FOR_URI_SCHEME, CryptoSigner, Key, Signer
from tuf.api.metadata import Metadata, Timestamp

from control_plane.access.service import SYSTEM
from control_plane.errors import InvalidInputError, UnavailableError
from control_plane.services import ServiceConfig, build_services
from control_plane.trust.keys import generate_signer, save_private_key, save_public_key
from control_plane.trust.signer import signer_from_uri
from tests.control_plane.identity.helpers import make_csr
from tests.control_plane.nodes.conftest import OPERATOR

HOUR = timedelta(hours=1)


def test_a_replica_without_the_director_key_refuses_to_start_unless_told_to_init(
    service_config: ServiceConfig, tmp_path: Path
) -> None:
    first = build_services(service_config)
    try:
        first.registry.create_fleet(SYSTEM, "plant")
        keyid = first.director.director_public_key()["keyid"]
    finally:
        first.close()
    # A second replica with its own data dir but the shared keys directory: same key.
    shared = dataclasses.replace(
        service_config, data_dir=tmp_path / "replica", keys_dir=service_config.data_dir
    )
    replica = build_services(shared)
    try:
        assert replica.director.director_public_key()["keyid"] == keyid
    finally:
        replica.close()
    # The same replica pointed at an empty keys directory (a forgotten volume): refused.
    lonely = dataclasses.replace(shared, keys_dir=tmp_path / "empty-keys")
    with pytest.raises(UnavailableError, match=r"director\.key is missing.*--init-keys"):
        build_services(lonely)
    assert not (tmp_path / "empty-keys" / "director" / "director.key").exists()
    # Explicitly: a new key is made (and then needs `keys rotate-director`).
    forced = build_services(dataclasses.replace(lonely, init_keys=True))
    try:
        assert forced.director.director_public_key()["keyid"] != keyid
    finally:
        forced.close()


def test_a_replica_shares_the_node_ca_and_one_without_it_makes_none_once_nodes_exist(
    service_config: ServiceConfig, tmp_path: Path
) -> None:
    keys = tmp_path / "keys"
    first = build_services(dataclasses.replace(service_config, keys_dir=keys))
    try:
        first.registry.create_fleet(SYSTEM, "plant")
        token, _ = first.nodes.tokens.create_bootstrap_token(OPERATOR, "plant", {}, HOUR)
        first.nodes.enrollment.enroll(token, make_csr(), agent_version="0.1.0", transport="grpc")
        ca_pem = first.ca.ca_pem
    finally:
        first.close()
    assert (keys / "ca" / "ca.key").exists()
    assert not (service_config.data_dir / "ca").exists()
    # A replica with its own data dir and the shared keys directory: the same CA.
    shared = dataclasses.replace(service_config, data_dir=tmp_path / "replica", keys_dir=keys)
    replica = build_services(shared)
    try:
        assert replica.ca.ca_pem == ca_pem
    finally:
        replica.close()
    # A keys directory with the director key but no CA, and a node enrolled: refused.
    (tmp_path / "empty-keys").mkdir()
    shutil.copytree(keys / "director", tmp_path / "empty-keys" / "director")
    lonely = dataclasses.replace(shared, keys_dir=tmp_path / "empty-keys")
    with pytest.raises(UnavailableError, match=r"node CA .*ca\.key is missing.*nodes"):
        build_services(lonely)
    assert not (tmp_path / "empty-keys" / "ca" / "ca.key").exists()
    forced = build_services(dataclasses.replace(lonely, init_keys=True))
    try:
        assert forced.ca.ca_pem != ca_pem  # on purpose: every node must re-enroll
    finally:
        forced.close()


def test_a_ca_in_the_data_dir_is_still_used_when_the_keys_dir_has_none(
    service_config: ServiceConfig, tmp_path: Path
) -> None:
    before = build_services(service_config)  # keys dir = data dir: <data-dir>/ca/
    try:
        ca_pem = before.ca.ca_pem
    finally:
        before.close()
    # The operator adds a keys directory later; the director key moves, the CA need not.
    keys = tmp_path / "keys"
    (keys / "director").mkdir(parents=True)
    (service_config.data_dir / "director" / "director.key").rename(
        keys / "director" / "director.key"
    )
    after = build_services(dataclasses.replace(service_config, keys_dir=keys))
    try:
        assert after.ca.ca_pem == ca_pem
    finally:
        after.close()
    assert not (keys / "ca").exists()


def test_a_restored_data_dir_without_a_fleets_online_keys_makes_none(
    service_config: ServiceConfig,
) -> None:
    services = build_services(service_config)
    try:
        services.registry.create_fleet(SYSTEM, "plant")
        fleet_dir = service_config.data_dir / "online-keys" / "plant"
        for key in fleet_dir.iterdir():
            key.unlink()
        fresh = build_services(service_config)  # a restart: nothing cached
        try:
            with pytest.raises(UnavailableError, match="fleet 'plant'") as missing:
                fresh.registry.get_fleet("plant")
            assert missing.value.fields["fleet"] == "plant"
            with pytest.raises(UnavailableError, match="online snapshot key"):
                fresh.registry.create_fleet(SYSTEM, "plant")
        finally:
            fresh.close()
        assert list(fleet_dir.iterdir()) == []
    finally:
        services.close()


def test_a_file_signer_uri_signs_as_the_director(
    service_config: ServiceConfig, tmp_path: Path
) -> None:
    signer = generate_signer()
    save_private_key(tmp_path / "director.pem", signer, None)
    save_public_key(tmp_path / "director.pub", signer.public_key)
    config = dataclasses.replace(
        service_config,
        director_signer_uri=f"file2:{tmp_path / 'director.pem'}",
        director_public_key=tmp_path / "director.pub",
    )
    services = build_services(config)
    try:
        assert services.director.director_public_key()["keyid"] == signer.public_key.keyid
    finally:
        services.close()
    assert not (service_config.data_dir / "director" / "director.key").exists()


def test_signer_uris_dispatch_by_scheme(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    key = generate_signer()
    save_private_key(tmp_path / "k.pem", key, None)
    signed = Metadata(Timestamp())
    signed.sign(signer_from_uri(f"file2:{tmp_path / 'k.pem'}", key.public_key))
    key.public_key.verify_signature(signed.signatures[key.public_key.keyid], signed.signed_bytes)

    seen: list[str] = []

    class FakeKms(Signer):
        """Stands for a KMS signer: what `Signer.from_priv_key_uri` dispatches to."""

        def __init__(self, public_key: Key) -> None:
            self._inner = CryptoSigner.generate_ed25519()
            self._public = public_key

        @property
        def public_key(self) -> Key:
            return self._public

        @classmethod
        def from_priv_key_uri(
            cls, priv_key_uri: str, public_key: Key, secrets_handler: Any = None
        ) -> FakeKms:
            seen.append(priv_key_uri)
            return cls(public_key)

        def sign(self, payload: bytes) -> Any:
            return self._inner.sign(payload)

    monkeypatch.setitem(SIGNER_FOR_URI_SCHEME, "fakekms", FakeKms)
    found = signer_from_uri("fakekms:projects/p/keys/director", key.public_key)
    assert isinstance(found, FakeKms)
    assert seen == ["fakekms:projects/p/keys/director"]

    with pytest.raises(InvalidInputError, match="unknown scheme 'nokms'"):
        signer_from_uri("nokms:x", key.public_key)
    other = generate_signer()
    with pytest.raises(UnavailableError, match="cannot open the signer"):
        signer_from_uri(f"file2:{tmp_path / 'k.pem'}", other.public_key)
    with pytest.raises(UnavailableError):
        signer_from_uri(f"file2:{tmp_path / 'absent.pem'}", key.public_key)
