"""The server's data dir is private whatever the umask: dirs 0700, state files 0600."""

from __future__ import annotations

import hashlib
import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from control_plane.services import ServiceConfig, build_services
from control_plane.storage.db import create_engine_for
from control_plane.trust.signer import FileOnlineKeyStore


@pytest.fixture
def umask_000() -> Iterator[None]:
    previous = os.umask(0)
    try:
        yield
    finally:
        os.umask(previous)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_the_data_dir_is_private_under_umask_000(tmp_path: Path, umask_000: None) -> None:
    data = tmp_path / "srv" / "data"  # two levels made by the server
    services = build_services(
        ServiceConfig(
            data_dir=data,
            database_url=f"sqlite:///{data / 'edgefleet.db'}",
            artifacts_url=(data / "artifacts").as_uri(),
        )
    )
    try:
        FileOnlineKeyStore(data / "online-keys").ensure_keys("gates")
        blob = b"model bytes"
        services.store.put(hashlib.sha256(blob).hexdigest(), len(blob), [blob])
        with services.engine.connect():  # -wal and -shm exist while a connection is open
            wal_shm = {f: mode(data / f) for f in ("edgefleet.db-wal", "edgefleet.db-shm")}
    finally:
        services.close()
    assert wal_shm == {"edgefleet.db-wal": 0o600, "edgefleet.db-shm": 0o600}
    dirs = [tmp_path / "srv", data, data / "ca", data / "director", data / "online-keys"]
    dirs += [data / "online-keys" / "gates", data / "artifacts", data / "artifacts" / "tmp"]
    dirs += [p for p in (data / "artifacts" / "sha256").rglob("*") if p.is_dir()]
    assert {str(d.relative_to(tmp_path)): mode(d) for d in dirs} == {
        str(d.relative_to(tmp_path)): 0o700 for d in dirs
    }
    files = ["edgefleet.db", "admin-token"]
    files += ["ca/ca.key", "director/director.key"]
    files += ["online-keys/gates/snapshot.key", "online-keys/gates/timestamp.key"]
    assert {f: mode(data / f) for f in files} == dict.fromkeys(files, 0o600)


def test_a_world_readable_database_loses_its_world_bits(tmp_path: Path) -> None:
    db = tmp_path / "edgefleet.db"
    db.touch()
    db.chmod(0o644)
    create_engine_for(f"sqlite:///{db}").dispose()
    assert mode(db) == 0o640
