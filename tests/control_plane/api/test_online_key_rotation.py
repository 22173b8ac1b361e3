"""A stolen online key, end to end: fast-forward recovery by an online-key rotation.

The attacker holds the fleet's timestamp key and got clients to trust a timestamp with
version 2,000,000,000; from then on every honest timestamp is a "rollback". The
operator runs `edgefleet keys rotate-online`: root N+1, signed by the root keys, names
new snapshot/timestamp keys the server made; the server signs with them; a stock
python-tuf client and the node's own TUF client drop what no longer verifies
(TUF §5.3.11) and fetch the honest targets again.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from securesystemslib.signer import CryptoSigner
from tuf.api.exceptions import BadVersionNumberError, RepositoryError
from tuf.api.metadata import Metadata, Root, Timestamp
from tuf.ngclient import Updater
from tuf.ngclient.fetcher import FetcherInterface
from tuf.ngclient.urllib3_fetcher import Urllib3Fetcher

from control_plane.cli.client import ApiClient, ApiError
from control_plane.cli.main import main
from control_plane.cli.release import ROOT_TTL, TARGETS_TTL, ReleaseClient
from control_plane.registry import sample_models
from control_plane.services import ServiceConfig
from control_plane.trust import repository as tufrepo
from control_plane.trust.keys import (
    generate_signer,
    init_operator_keys,
    load_operator_keyset,
    load_signer,
)
from edge_node.updater.https_fetch import HttpsRepository, HttpsRepositoryConfig
from edge_node.updater.tuf_fetch import TufClient
from tests.control_plane.conftest import LiveServer

FLEET = "harbour"
MODEL = "models/detector/1.0.0/model.onnx"
FORGED_VERSION = 2_000_000_000


class ForgingFetcher(FetcherInterface):
    """The network as the attacker shapes it: `timestamp.json` replaced while `forged`."""

    def __init__(self) -> None:
        self.inner = Urllib3Fetcher()
        self.forged: bytes | None = None

    def _fetch(self, url: str) -> Iterator[bytes]:
        if self.forged is not None and url.endswith("/timestamp.json"):
            return iter([self.forged])
        return self.inner._fetch(url)


class ForgingSource:
    """The node's `RepositorySource` (HTTPS) with the same attacker in the path."""

    def __init__(self, inner: HttpsRepository) -> None:
        self.inner = inner
        self.forged: bytes | None = None

    async def fetch_metadata(self, filename: str) -> bytes:
        if self.forged is not None and filename == "timestamp.json":
            return self.forged
        return await self.inner.fetch_metadata(filename)

    def fetch_artifact(
        self, target_path: str, sha256: str, offset: int = 0
    ) -> AsyncIterator[bytes]:
        return self.inner.fetch_artifact(target_path, sha256, offset)


def forge_timestamp(api: ApiClient, stolen: CryptoSigner, version: int) -> bytes:
    timestamp = Metadata[Timestamp].from_bytes(api.metadata(FLEET, "timestamp.json"))
    timestamp.signed.version = version
    timestamp.sign(stolen, append=False)
    return tufrepo.to_bytes(timestamp)


def stock_client(server: LiveServer, tmp: Path, fetcher: FetcherInterface, root: bytes) -> Updater:
    meta = tmp / "meta"
    (tmp / "targets").mkdir(parents=True, exist_ok=True)
    meta.mkdir(parents=True, exist_ok=True)
    base = f"{server.url}/v1/fleets/{FLEET}/tuf"
    return Updater(
        metadata_dir=str(meta),
        metadata_base_url=f"{base}/metadata/",
        target_base_url=f"{base}/targets/",
        target_dir=str(tmp / "targets"),
        fetcher=fetcher,
        bootstrap=None if (meta / "root.json").exists() else root,
    )


def trusted_timestamp_version(metadata_dir: Path) -> int:
    return int(json.loads((metadata_dir / "timestamp.json").read_bytes())["signed"]["version"])


def test_online_key_rotation_recovers_clients_from_a_forged_timestamp(
    live_server: LiveServer,
    service_config: ServiceConfig,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("EDGEFLEET_KEY_PASSPHRASE", raising=False)
    keydir = tmp_path / "keys"
    init_operator_keys(keydir, root_keys=3, root_threshold=2, passphrase=None)
    keyset = load_operator_keyset(keydir, None)
    api = live_server.api()
    release = ReleaseClient(api, keyset)
    release.create_fleet(FLEET)
    model = sample_models.tiny_detector(tmp_path / "det.onnx")
    release.push_model(FLEET, model, name="detector", version="1.0.0")
    root1 = api.metadata(FLEET, "1.root.json")
    stolen = load_signer(service_config.data_dir / "online-keys" / FLEET / "timestamp.key", None)

    # -- the attack: both clients trust a timestamp of version 2,000,000,000
    fetcher = ForgingFetcher()
    fetcher.forged = forge_timestamp(api, stolen, FORGED_VERSION)
    stock_client(live_server, tmp_path / "stock", fetcher, root1).refresh()
    assert trusted_timestamp_version(tmp_path / "stock" / "meta") == FORGED_VERSION
    fetcher.forged = None
    with pytest.raises(BadVersionNumberError):  # the honest server is now a "rollback"
        stock_client(live_server, tmp_path / "stock", fetcher, root1).refresh()

    node_dir = tmp_path / "node"
    node_dir.mkdir()
    (node_dir / "tuf-root.json").write_bytes(root1)

    async def node_refresh(forged: bytes | None) -> bool:
        """The node's TUF client over its HTTPS source; True when `MODEL` verified."""
        config = HttpsRepositoryConfig(base_url=live_server.url, fleet=FLEET)
        source = ForgingSource(HttpsRepository(config))
        source.forged = forged
        tuf = TufClient(
            source,
            asyncio.get_running_loop(),
            metadata_dir=node_dir / "tuf",
            trusted_root=node_dir / "tuf-root.json",
        )
        try:
            view = await asyncio.to_thread(tuf.refresh)
            return await asyncio.to_thread(view.target, MODEL) is not None
        finally:
            await source.inner.close()

    assert asyncio.run(node_refresh(forge_timestamp(api, stolen, FORGED_VERSION)))
    assert trusted_timestamp_version(node_dir / "tuf") == FORGED_VERSION
    with pytest.raises(BadVersionNumberError):
        asyncio.run(node_refresh(None))

    # -- the defence: root 2 may only name online keys the server holds
    root = Metadata[Root].from_bytes(api.metadata(FLEET, "root.json"))
    targets_md = release.trusted_metadata(FLEET)[1]
    now = release.clock.now()
    elsewhere = {role: generate_signer().public_key for role in tufrepo.ONLINE_ROLES}
    bogus = tufrepo.build_next_root(
        root,
        release_keys=[keyset.release_public_key],
        online_keys=elsewhere,
        expires=now + ROOT_TTL,
    )
    keyset.sign_root(bogus)
    resigned = tufrepo.resigned_targets(targets_md, now + TARGETS_TTL)
    keyset.sign_targets(resigned)
    with pytest.raises(ApiError) as refused:
        api.rotate_root(FLEET, bogus.to_dict(), resigned.to_dict())
    assert refused.value.status == 422
    assert "key store holds" in refused.value.problem["detail"]

    # -- the recovery, through the CLI
    capsys.readouterr()
    argv = ["--server", live_server.url, "--token", live_server.admin_token, "-o", "json"]
    assert main([*argv, "keys", "rotate-online", "--fleet", FLEET, "--keys", str(keydir)]) == 0
    out: dict[str, Any] = json.loads(capsys.readouterr().out)
    assert out["root_version"] == 2
    assert stolen.public_key.keyid in out["revoked_keyids"]
    new_timestamp_keyid = out["online_keyids"]["timestamp"]
    root2 = Metadata[Root].from_bytes(api.metadata(FLEET, "2.root.json"))
    assert root2.signed.roles["timestamp"].keyids == [new_timestamp_keyid]
    assert stolen.public_key.keyid not in root2.signed.keys
    served = Metadata[Timestamp].from_bytes(api.metadata(FLEET, "timestamp.json"))
    assert set(served.signatures) == {new_timestamp_keyid}
    assert served.signed.version < FORGED_VERSION

    # The stock client: the forged timestamp no longer verifies, so it is dropped.
    client = stock_client(live_server, tmp_path / "stock", fetcher, root1)
    client.refresh()
    assert trusted_timestamp_version(tmp_path / "stock" / "meta") == served.signed.version
    info = client.get_targetinfo(MODEL)
    assert info is not None
    downloaded = Path(client.download_target(info))
    assert hashlib.sha256(downloaded.read_bytes()).hexdigest() == info.hashes["sha256"]
    # The stolen key is worthless now: its next forgery is refused.
    fetcher.forged = forge_timestamp(api, stolen, FORGED_VERSION + 1)
    with pytest.raises(RepositoryError):
        stock_client(live_server, tmp_path / "stock", fetcher, root1).refresh()

    # The node recovers the same way.
    assert asyncio.run(node_refresh(None))
    assert trusted_timestamp_version(node_dir / "tuf") == served.signed.version
    with pytest.raises(RepositoryError):
        asyncio.run(node_refresh(forge_timestamp(api, stolen, FORGED_VERSION + 1)))
    api.close()
