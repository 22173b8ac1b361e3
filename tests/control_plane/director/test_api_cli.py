"""Pinning end to end on a live control plane: a real push, REST and CLI, and a node-side
check whose TUF view comes from an unmodified python-tuf client."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from securesystemslib.signer import SSlibKey
from tuf.api.metadata import Metadata, Root
from tuf.ngclient import Updater

from control_plane.access.roles import Role
from control_plane.access.service import SYSTEM
from control_plane.cli.client import ApiError
from control_plane.cli.main import main
from control_plane.cli.release import ROOT_TTL, TARGETS_TTL, ReleaseClient
from control_plane.registry import sample_models
from control_plane.trust import repository as tufrepo
from control_plane.trust.keys import OperatorKeyset, generate_signer, init_operator_keys
from edge_node.updater.director import (
    AssignmentReplayError,
    AssignmentSignatureError,
    BelowFloorError,
    TargetInfo,
    VerifiedAssignment,
    director_keys_of_root,
    verify_assignment,
)
from protos.edgefleet.fleet.v1.director_pb2 import SignedDirectorAssignment
from tests.control_plane.conftest import LiveServer
from tests.control_plane.identity.helpers import make_csr

FLEET = "parks"


class Cli:
    def __init__(self, server: LiveServer, capsys: pytest.CaptureFixture[str]) -> None:
        self.server = server
        self.capsys = capsys

    def run(self, *args: str, token: str | None = None) -> tuple[int, str, str]:
        self.capsys.readouterr()
        token = self.server.admin_token if token is None else token
        code = main(["--server", self.server.url, "--token", token, *args])
        out, err = self.capsys.readouterr()
        return code, out, err

    def json(self, *args: str) -> Any:
        code, out, err = self.run("--output", "json", *args)
        assert code == 0, err
        return json.loads(out)


@pytest.fixture
def cli(
    live_server: LiveServer, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> Cli:
    monkeypatch.setenv("COLUMNS", "200")
    return Cli(live_server, capsys)


@pytest.fixture
def keyset(tmp_path: Path) -> OperatorKeyset:
    return init_operator_keys(tmp_path / "keys", root_keys=1, root_threshold=1, passphrase=None)


@pytest.fixture
def release(
    live_server: LiveServer, keyset: OperatorKeyset, tmp_path: Path
) -> Iterator[ReleaseClient]:
    api = live_server.api()
    client = ReleaseClient(api, keyset)
    client.create_fleet(FLEET)
    for seed, version in enumerate(("1.0.0", "1.1.0")):
        model = sample_models.tiny_detector(tmp_path / f"det-{version}.onnx", seed=seed)
        client.push_model(FLEET, model, name="det", version=version)
    yield client
    api.close()


def enroll_node(server: LiveServer, labels: dict[str, str] | None = None) -> str:
    with server.api() as api:
        token = api.json("POST", f"/v1/fleets/{FLEET}/node-tokens", json={"labels": labels or {}})[
            "token"
        ]
    with server.api(token="") as anonymous:
        enrolled = anonymous.json(
            "POST", "/v1/enroll", json={"token": token, "csr_pem": make_csr().decode()}
        )
    node_id: str = enrolled["node_id"]
    return node_id


def node_view(server: LiveServer, tmp: Path) -> Updater:
    """What the node trusts: TUF metadata refreshed from the fleet's first root."""
    (tmp / "meta").mkdir(parents=True)
    (tmp / "targets").mkdir()
    with server.api() as api:
        root = api.metadata(FLEET, "1.root.json")
    base = f"{server.url}/v1/fleets/{FLEET}/tuf"
    updater = Updater(
        metadata_dir=str(tmp / "meta"),
        metadata_base_url=f"{base}/metadata/",
        target_base_url=f"{base}/targets/",
        target_dir=str(tmp / "targets"),
        bootstrap=root,
    )
    updater.refresh()
    return updater


def node_verifies(
    server: LiveServer, node_id: str, tmp: Path, *, last_sequence: int = 0
) -> VerifiedAssignment:
    with server.api() as api:
        published = api.json("GET", "/v1/director/key")
        got = api.json("GET", f"/v1/nodes/{node_id}/assignment")
    keyid = published.pop("keyid")
    director_key = SSlibKey.from_dict(keyid, published)
    signed = SignedDirectorAssignment.FromString(base64.b64decode(got["signed"]))
    updater = node_view(server, tmp)

    def target(path: str) -> TargetInfo | None:
        info = updater.get_targetinfo(path)
        if info is None:
            return None
        return TargetInfo(info.path, info.hashes["sha256"], info.length, info.custom)

    def floor(model: str) -> int:
        info = updater.get_targetinfo(f"floors/{model}.json")
        return 0 if info is None else int(info.custom["floor"])

    return verify_assignment(
        signed,
        director_key=director_key,
        node_id=node_id,
        fleet=FLEET,
        last_sequence=last_sequence,
        now=server.services.clock.now(),
        target_lookup=target,
        floor_lookup=floor,
    )


def test_pin_through_the_cli_and_the_node_accepts_it(
    cli: Cli, release: ReleaseClient, tmp_path: Path
) -> None:
    node_id = enroll_node(cli.server)
    pinned = cli.json("nodes", "pin", node_id, "--model", "det", "--version", "1.1.0")
    assert (pinned["node_id"], pinned["fleet"], pinned["sequence"]) == (node_id, FLEET, 1)
    assert pinned["target_path"] == "models/det/1.1.0/model.onnx"
    assert pinned["expired"] is False

    verified = node_verifies(cli.server, node_id, tmp_path / "a")
    assert (verified.sequence, verified.model, verified.release_counter) == (1, "det", 2)
    assert verified.sha256 == pinned["sha256"]

    # Roll back to 1.0.0: a fresh assignment, accepted above the last sequence.
    code, table, _ = cli.run("nodes", "pin", node_id, "--model", "det", "--version", "1.0.0")
    assert code == 0
    assert "models/det/1.0.0/model.onnx" in table
    assert node_verifies(cli.server, node_id, tmp_path / "b", last_sequence=1).sequence == 2
    shown = cli.json("nodes", "assignment", node_id)
    assert (shown["sequence"], shown["version"]) == (2, "1.0.0")
    with pytest.raises(AssignmentReplayError):
        node_verifies(cli.server, node_id, tmp_path / "c", last_sequence=2)


def test_a_shadow_candidate_shows_in_the_assignment_and_verifies_against_real_tuf(
    cli: Cli, release: ReleaseClient, tmp_path: Path
) -> None:
    from control_plane.access.service import SYSTEM
    from edge_node.updater.director import verify_shadow

    node_id = enroll_node(cli.server)
    cli.json("nodes", "pin", node_id, "--model", "det", "--version", "1.0.0")
    cli.server.services.director.assign_shadow(
        SYSTEM, node_id, "det", "1.1.0", sample_per_mille=20, max_cpu_percent=5
    )
    shown = cli.json("nodes", "assignment", node_id)
    assert (shown["sequence"], shown["version"], shown["renewal"]) == (2, "1.0.0", True)
    assert shown["shadow"]["target_path"] == "models/det/1.1.0/model.onnx"
    assert (shown["shadow"]["sample_per_mille"], shown["shadow"]["max_cpu_percent"]) == (20, 5)
    verified = node_verifies(cli.server, node_id, tmp_path / "a", last_sequence=1)
    assert verified.renewal and verified.shadow is not None
    updater = node_view(cli.server, tmp_path / "b")
    info = updater.get_targetinfo(verified.shadow.target_path)
    assert info is not None
    checked = verify_shadow(
        verified.shadow,
        model="det",
        target_lookup=lambda path: TargetInfo(
            info.path, info.hashes["sha256"], info.length, info.custom
        ),
        floor_lookup=lambda model: 0,
    )
    assert checked.release_counter == 2


def test_a_revoked_version_cannot_be_pinned_and_an_old_assignment_is_refused(
    cli: Cli, release: ReleaseClient, tmp_path: Path
) -> None:
    node_id = enroll_node(cli.server)
    cli.json("nodes", "pin", node_id, "--model", "det", "--version", "1.0.0")
    # Every version revoked: the node has nowhere to go and is left (ADR 0035).
    revoked = release.revoke(FLEET, "det", "1.1.0")
    assert (revoked["nodes_moved"], revoked["moved_to"]) == (0, None)
    assert revoked["nodes_left"] == [node_id]
    shown = cli.json("model", "show", "det", "--fleet", FLEET)
    assert {v["version"]: v["left_on_it"] for v in shown} == {"1.0.0": [node_id], "1.1.0": []}

    code, _, err = cli.run("nodes", "pin", node_id, "--model", "det", "--version", "1.0.0")
    assert code == 1
    assert "below the fleet's floor" in err
    # The assignment signed before the floor rose: the node's signed floor refuses it.
    with pytest.raises(BelowFloorError):
        node_verifies(cli.server, node_id, tmp_path / "node")

    entries = cli.json("audit", "list", "--action", "node.pin")
    assert [e["outcome"] for e in reversed(entries)] == ["ok", "refused"]
    assert {e["target"] for e in entries} == {f"node:{node_id}"}


def test_model_push_says_which_nodes_it_moved_off_a_revoked_version(
    cli: Cli, release: ReleaseClient, tmp_path: Path
) -> None:
    node_id = enroll_node(cli.server)
    cli.json("nodes", "pin", node_id, "--model", "det", "--version", "1.1.0")
    keys = str(tmp_path / "keys")

    def push(version: str, *output: str) -> tuple[int, str, str]:
        seed = int(version.split(".")[1])
        model = sample_models.tiny_detector(tmp_path / f"det-{version}.onnx", seed=seed)
        args = ["model", "push", str(model), "--fleet", FLEET, "--name", "det"]
        return cli.run(*output, *args, "--version", version, "--keys", keys)

    code, out, err = push("1.2.0", "--output", "json")
    assert code == 0, err
    assert "nodes_moved" not in json.loads(out)  # nobody was left on a revoked version

    release.revoke(FLEET, "det", "1.2.0")  # every version revoked: the node is left
    assert cli.json("nodes", "assignment", node_id)["version"] == "1.1.0"
    code, out, err = push("1.3.0", "--output", "json")
    assert code == 0, err
    pushed = json.loads(out)
    assert (pushed["nodes_moved"], pushed["moved_to"], pushed["nodes_left"]) == (1, "1.3.0", [])
    assert cli.json("nodes", "assignment", node_id)["version"] == "1.3.0"

    # The table prints the moves as `model revoke` does.
    release.revoke(FLEET, "det", "1.3.0")
    code, table, err = push("1.4.0")
    assert code == 0, err
    cells = [line.split("│") for line in table.splitlines() if line.count("│") == 3]
    rows = {cell[1].strip(): cell[2].strip() for cell in cells}
    assert (rows["nodes_moved"], rows["moved_to"], rows["nodes_left"]) == ("1", "1.4.0", "[]")


def test_revoke_moves_the_nodes_to_the_newest_allowed_version(
    cli: Cli, release: ReleaseClient, tmp_path: Path
) -> None:
    moved, other = enroll_node(cli.server), enroll_node(cli.server)
    cli.json("nodes", "pin", moved, "--model", "det", "--version", "1.0.0")
    cli.json("nodes", "pin", other, "--model", "det", "--version", "1.1.0")

    revoked = release.revoke(FLEET, "det", "1.0.0")

    assert (revoked["nodes_moved"], revoked["moved_to"], revoked["nodes_left"]) == (1, "1.1.0", [])
    verified = node_verifies(cli.server, moved, tmp_path / "node", last_sequence=1)
    assert (verified.sequence, verified.target_path) == (2, "models/det/1.1.0/model.onnx")
    assert cli.json("nodes", "assignment", other)["sequence"] == 1  # allowed: untouched
    system = [
        e for e in cli.json("audit", "list", "--action", "node.pin") if e["actor"] == "system"
    ]
    assert [(e["target"], e["details"]["reason"]) for e in system] == [
        (f"fleet:{FLEET}", "revoked")
    ]


def test_rest_refusals(cli: Cli, release: ReleaseClient) -> None:
    node_id = enroll_node(cli.server)
    with cli.server.api() as api:
        with pytest.raises(ApiError) as none_yet:
            api.json("GET", f"/v1/nodes/{node_id}/assignment")
        assert none_yet.value.status == 404
        with pytest.raises(ApiError) as unknown:
            api.json(
                "POST", "/v1/nodes/n-000000000000/pin", json={"model": "det", "version": "1.1.0"}
            )
        assert unknown.value.status == 404
        with pytest.raises(ApiError) as missing:
            api.json("POST", f"/v1/nodes/{node_id}/pin", json={"model": "det", "version": "3"})
        assert missing.value.status == 404
        with pytest.raises(ApiError) as bad:
            api.json("POST", f"/v1/nodes/{node_id}/pin", json={"model": "det"})
        assert bad.value.status == 422
    viewer, _ = cli.server.services.access.create_token(SYSTEM, name="dash", role=Role.VIEWER)
    with cli.server.api(token=viewer) as as_viewer:
        with pytest.raises(ApiError) as denied:
            as_viewer.json(
                "POST", f"/v1/nodes/{node_id}/pin", json={"model": "det", "version": "1.1.0"}
            )
        assert denied.value.status == 403
        # the public key is public; reading an assignment needs any valid token
        assert as_viewer.json("GET", "/v1/director/key")["keytype"] == "ed25519"
    with cli.server.api(token="") as anonymous:
        assert anonymous.json("GET", "/v1/director/key")["scheme"] == "ed25519"
        with pytest.raises(ApiError) as anonymous_read:
            anonymous.json("GET", f"/v1/nodes/{node_id}/assignment")
        assert anonymous_read.value.status == 401


def test_pin_many_through_the_cli_by_labels_and_by_ids(
    cli: Cli, release: ReleaseClient, tmp_path: Path
) -> None:
    north = [enroll_node(cli.server, {"site": "north", "role": "gate"}) for _ in range(2)]
    south = enroll_node(cli.server, {"site": "south", "role": "gate"})
    revoked = enroll_node(cli.server, {"site": "north", "role": "gate"})
    cli.json("node", "revoke", revoked)
    cli.json("nodes", "pin", north[0], "--model", "det", "--version", "1.0.0")

    result = cli.json(
        "nodes", "pin", "--fleet", FLEET, "--label", "site=north", "--label", "role=gate",
        "--model", "det", "--version", "1.1.0",
    )  # fmt: skip
    assert (result["fleet"], result["model"], result["version"]) == (FLEET, "det", "1.1.0")
    assert result["target_path"] == "models/det/1.1.0/model.onnx"
    assert (result["selected"], result["pinned"], result["chunks"]) == (3, 2, 1)
    assert result["delivered"] == 0  # no node link runs in this server
    assert {a["node_id"]: a["sequence"] for a in result["assignments"]} == {
        north[0]: 2,
        north[1]: 1,
    }
    assert result["skipped"] == [{"node_id": revoked, "reason": "revoked"}]
    # Each node verifies its own against the fleet's TUF metadata.
    verified = node_verifies(cli.server, north[0], tmp_path / "a", last_sequence=1)
    assert (verified.sequence, verified.model, verified.release_counter) == (2, "det", 2)

    # By ids, as a table: a summary, then the skipped nodes.
    code, table, err = cli.run(
        "nodes", "pin", south, north[1], "--fleet", FLEET, "--model", "det", "--version", "1.0.0"
    )
    assert code == 0, err
    assert "models/det/1.0.0/model.onnx" in table
    assert "1-2" in table  # the sequences this request handed out
    assert cli.json("nodes", "assignment", north[1])["sequence"] == 2
    # The whole fleet.
    everyone = cli.json(
        "nodes", "pin", "--fleet", FLEET, "--all", "--model", "det", "--version", "1.1.0"
    )
    assert (everyone["pinned"], len(everyone["skipped"])) == (3, 1)

    entries = cli.json("audit", "list", "--action", "node.pin_many")
    assert [e["outcome"] for e in entries] == ["ok", "ok", "ok"]
    assert {e["target"] for e in entries} == {f"fleet:{FLEET}"}
    assert {e["details"]["nodes"] for e in entries} == {2, 3}


def test_pin_many_refusals(cli: Cli, release: ReleaseClient) -> None:
    node_id = enroll_node(cli.server)
    code, _, err = cli.run(
        "nodes", "pin", node_id, "n-000000000000", "--fleet", FLEET,
        "--model", "det", "--version", "1.1.0",
    )  # fmt: skip
    assert code == 1
    assert "n-000000000000" in err and "nothing was pinned" in err
    with cli.server.api() as api:
        with pytest.raises(ApiError) as none_pinned:
            api.json("GET", f"/v1/nodes/{node_id}/assignment")
        assert none_pinned.value.status == 404
        with pytest.raises(ApiError) as unknown:
            api.json(
                "POST",
                f"/v1/fleets/{FLEET}/pin",
                json={"model": "det", "version": "1.1.0", "node_ids": ["n-000000000000"]},
            )
        assert unknown.value.status == 404
        assert unknown.value.problem["node_ids"] == ["n-000000000000"]
        with pytest.raises(ApiError) as neither:
            api.json("POST", f"/v1/fleets/{FLEET}/pin", json={"model": "det", "version": "1.1.0"})
        assert neither.value.status in (400, 422)
        with pytest.raises(ApiError) as empty:
            api.json(
                "POST",
                f"/v1/fleets/{FLEET}/pin",
                json={"model": "det", "version": "1.1.0", "node_ids": []},
            )
        assert empty.value.status == 422
        with pytest.raises(ApiError) as no_fleet:
            api.json(
                "POST",
                "/v1/fleets/nowhere/pin",
                json={"model": "det", "version": "1", "labels": {}},
            )
        assert no_fleet.value.status == 404
    release.revoke(FLEET, "det", "1.0.0")
    code, _, err = cli.run(
        "nodes", "pin", "--fleet", FLEET, "--all", "--model", "det", "--version", "1.0.0"
    )
    assert code == 1
    assert "below the fleet's floor" in err

    viewer, _ = cli.server.services.access.create_token(SYSTEM, name="dash", role=Role.VIEWER)
    with cli.server.api(token=viewer) as as_viewer:
        with pytest.raises(ApiError) as denied:
            as_viewer.json(
                "POST",
                f"/v1/fleets/{FLEET}/pin",
                json={"model": "det", "version": "1.1.0", "labels": {}},
            )
        assert denied.value.status == 403

    # Usage errors are caught before any request.
    for args in (
        ("nodes", "pin", "--label", "site=a", "--model", "det", "--version", "1.1.0"),
        ("nodes", "pin", "a", "b", "--model", "det", "--version", "1.1.0"),
        ("nodes", "pin", "--fleet", FLEET, "--model", "det", "--version", "1.1.0"),
        ("nodes", "pin", "a", "--fleet", FLEET, "--all", "--model", "det", "--version", "1"),
    ):
        code, _, err = cli.run(*args)
        assert code == 2, (args, err)
    entries = cli.json("audit", "list", "--action", "node.pin_many")
    assert {e["outcome"] for e in entries} == {"refused"}
    assert len(entries) == 6


# ---------------------------------------------- a stolen director key (ADR 0045)


def signed_assignment(cli: Cli, node_id: str) -> SignedDirectorAssignment:
    with cli.server.api() as api:
        got = api.json("GET", f"/v1/nodes/{node_id}/assignment")
    return SignedDirectorAssignment.FromString(base64.b64decode(got["signed"]))


def test_a_director_key_rotated_by_root_signs_and_is_the_only_one_nodes_accept(
    cli: Cli, release: ReleaseClient, keyset: OperatorKeyset, tmp_path: Path
) -> None:
    node_id = enroll_node(cli.server)
    cli.json("nodes", "pin", node_id, "--model", "det", "--version", "1.0.0")
    old = signed_assignment(cli, node_id)
    enrollment_keyid = cli.server.services.director.director_public_key()["keyid"]
    assert old.keyid == enrollment_keyid

    # A root listing a director key the control plane does not hold: refused (422).
    with cli.server.api() as api:
        root, targets, _ = release.trusted_metadata(FLEET)
        now = release.clock.now()
        bogus = tufrepo.build_next_root(
            root,
            release_keys=[keyset.release_public_key],
            director_keys=[generate_signer().public_key],
            expires=now + ROOT_TTL,
        )
        keyset.sign_root(bogus)
        resigned = tufrepo.resigned_targets(targets, now + TARGETS_TTL)
        keyset.sign_targets(resigned)
        with pytest.raises(ApiError) as refused:
            api.rotate_root(FLEET, bogus.to_dict(), resigned.to_dict())
    assert refused.value.status == 422
    assert "does not hold" in refused.value.problem["detail"]

    out = cli.json("keys", "rotate-director", "--fleet", FLEET, "--keys", str(tmp_path / "keys"))
    new_keyid = out["director_keyid"]
    assert out["root_version"] == 2
    assert new_keyid != enrollment_keyid

    # The next pin is signed with the key the root lists.
    cli.json("nodes", "pin", node_id, "--model", "det", "--version", "1.1.0")
    new = signed_assignment(cli, node_id)
    assert new.keyid == new_keyid

    # The node learns the key through TUF (root 2, verified by a stock client).
    updater = node_view(cli.server, tmp_path / "node")
    trusted_root = Path(tmp_path / "node" / "meta" / "root.json").read_bytes()
    listed = director_keys_of_root(Metadata[Root].from_bytes(trusted_root).signed.to_dict())
    assert [k.keyid for k in listed] == [new_keyid]

    def target(path: str) -> TargetInfo | None:
        info = updater.get_targetinfo(path)
        return (
            None
            if info is None
            else TargetInfo(info.path, info.hashes["sha256"], info.length, info.custom)
        )

    def check(signed: SignedDirectorAssignment) -> int:
        return verify_assignment(
            signed,
            director_key=listed,
            node_id=node_id,
            fleet=FLEET,
            last_sequence=0,
            now=cli.server.services.clock.now(),
            target_lookup=target,
            floor_lookup=lambda model: 0,
        ).sequence

    assert check(new) == 2
    with pytest.raises(AssignmentSignatureError):  # the old (stolen) key: refused
        check(old)
