"""The update world (`edge_node.testing.update_world`) signs what the control plane signs:
its director assignments are `sign_assignment`'s bytes, its model targets are the ones
`edgefleet model push` adds (custom field included), its floors the ones `revoke` raises.

The edge node never imports the control plane; this test does, so that the world the
updater's tests stand on cannot drift from the real one.
"""

from __future__ import annotations

import inspect
from datetime import timedelta
from pathlib import Path
from typing import Any

from tuf.api.metadata import Metadata, TargetFile, Targets

from control_plane.cli.release import ReleaseClient, model_custom
from control_plane.director.assignments import sign_assignment
from control_plane.registry import onnx_inspect
from control_plane.trust import custom as tufcustom
from control_plane.trust import repository as tufrepo
from edge_node.testing.update_world import FLEET, MODEL, NODE, UpdateWorld


def copy(targets: Metadata[Targets]) -> Metadata[Targets]:
    return Metadata[Targets].from_bytes(targets.to_bytes())


def listed(targets: Metadata[Targets]) -> dict[str, Any]:
    return {path: target.to_dict() for path, target in targets.signed.targets.items()}


def test_an_assignment_is_the_one_the_director_signs(tmp_path: Path) -> None:
    world = UpdateWorld.create(tmp_path, versions=("1.0.0",))
    rel = world.releases["1.0.0"]
    signed = world.assign(rel)
    # `assign`'s documented terms: issued a minute ago, valid for an hour, sequence 1.
    director = sign_assignment(
        world.director,
        fleet=FLEET,
        node_id=NODE,
        sequence=1,
        target_path=rel.path,
        sha256=rel.sha256,
        length=len(rel.data),
        issued_at=world.now - timedelta(minutes=1),
        expires_at=world.now + timedelta(hours=1),
    )
    assert signed.assignment == director.assignment
    assert signed.keyid == director.keyid == tufrepo.canonical_keyid(world.director.public_key)
    assert signed.signature == director.signature


def test_a_release_adds_the_targets_model_push_adds(tmp_path: Path) -> None:
    world = UpdateWorld.create(tmp_path)
    before = copy(world.targets)
    rel = world.release("1.0.0", add=1.0, counter=1)
    model = tmp_path / "model.onnx"
    model.write_bytes(rel.data)
    info = onnx_inspect.inspect_model(model)
    assert (info.sha256, info.length) == (rel.sha256, len(rel.data))
    reference_path = tufcustom.reference_target_path(MODEL, "1.0.0")
    reference = world.targets.signed.targets[reference_path]

    # `model push` with its defaults (tolerances, execution providers, agent version).
    push = inspect.signature(ReleaseClient.push_model).parameters
    defaults = {
        name: push[name].default
        for name in ("min_agent_version", "execution_providers", "atol", "rtol")
    }
    custom = model_custom(
        info,
        name=MODEL,
        version="1.0.0",
        release_counter=1,
        reference_sha256=reference.hashes["sha256"],
        reference_length=reference.length,
        **defaults,
    )
    pushed = tufrepo.add_model_to_targets(
        before,
        model_file=TargetFile(info.length, {"sha256": info.sha256}, rel.path),
        reference_file=TargetFile(reference.length, dict(reference.hashes), reference_path),
        custom=custom,
        expires=world.now + timedelta(days=30),
    )
    assert world.targets.signed.targets[rel.path].unrecognized_fields["custom"] == (
        custom.to_dict()
    )
    assert listed(world.targets) == listed(pushed)


def test_a_raised_floor_is_the_target_revoke_adds(tmp_path: Path) -> None:
    world = UpdateWorld.create(tmp_path, versions=("1.0.0",))
    before = copy(world.targets)
    world.raise_floor(2)
    revoked, content = tufrepo.raise_floor(before, MODEL, 2, expires=world.now)
    assert listed(world.targets) == listed(revoked)
    floor = world.targets.signed.targets[tufcustom.floor_target_path(MODEL)]
    assert world.artifacts[floor.hashes["sha256"]] == content
