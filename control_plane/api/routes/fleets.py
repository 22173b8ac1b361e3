"""Fleets: creation in two steps (online keys, then the operator-signed root), root rotation."""

from __future__ import annotations

import json

import anyio.to_thread
from fastapi import APIRouter, Request, status

from control_plane.api.deps import ContextDep, DirectorDep, PrincipalDep, RegistryDep
from control_plane.api.schemas import (
    FleetCreate,
    FleetOut,
    FleetRootUpload,
    OnlineKeysOut,
    PushOut,
    RevocationOut,
    RotationOut,
)
from control_plane.registry.service import FleetInfo

router = APIRouter(prefix="/v1/fleets", tags=["fleets"])


def _out(info: FleetInfo) -> FleetOut:
    return FleetOut(
        name=info.name,
        state=info.state,
        created_at=info.created_at,
        online_keys=info.online_keys,
        versions=info.versions,
    )


@router.post("", status_code=status.HTTP_201_CREATED)
def create_fleet(body: FleetCreate, ctx: ContextDep, registry: RegistryDep) -> FleetOut:
    """Create a fleet (pending) and its online snapshot/timestamp keys."""
    return _out(registry.create_fleet(ctx, body.name))


@router.put("/{fleet}/root")
def upload_root(
    fleet: str, body: FleetRootUpload, ctx: ContextDep, registry: RegistryDep
) -> FleetOut:
    """Install the operator-signed root and first targets; the repository goes live."""
    root = json.dumps(body.root).encode()
    targets = json.dumps(body.targets).encode()
    return _out(registry.activate_fleet(ctx, fleet, root, targets))


@router.post("/{fleet}/root")
def rotate_root(
    fleet: str, body: FleetRootUpload, ctx: ContextDep, registry: RegistryDep
) -> RotationOut:
    """Install root N+1 (signed by the current and the new root keys) with the current
    targets re-signed by the new release key(s): revokes every release key it drops.

    409 when the root or targets moved on meanwhile: re-read, re-sign and retry.
    """
    root = json.dumps(body.root).encode()
    targets = json.dumps(body.targets).encode()
    result = registry.rotate_root(ctx, fleet, root, targets)
    return RotationOut(
        fleet=result.fleet,
        root_version=result.root_version,
        targets_version=result.targets_version,
        snapshot_version=result.snapshot_version,
        timestamp_version=result.timestamp_version,
        root_keyids=result.root_keyids,
        root_threshold=result.root_threshold,
        release_keyids=result.release_keyids,
        revoked_keyids=result.revoked_keyids,
        online_keyids=result.online_keyids,
    )


@router.post("/{fleet}/online-keys", status_code=status.HTTP_201_CREATED)
def new_online_keys(fleet: str, ctx: ContextDep, registry: RegistryDep) -> OnlineKeysOut:
    """Make new snapshot/timestamp keys for an online-key rotation (a stolen online key):
    the operator names them in root N+1 (`POST /v1/fleets/{fleet}/root`); until that
    root is accepted the current keys keep signing."""
    keys = registry.new_online_keys(ctx, fleet)
    return OnlineKeysOut(snapshot=keys["snapshot"], timestamp=keys["timestamp"])


@router.get("")
def list_fleets(_: PrincipalDep, registry: RegistryDep) -> list[FleetOut]:
    return [_out(f) for f in registry.list_fleets()]


@router.get("/{fleet}")
def get_fleet(fleet: str, _: PrincipalDep, registry: RegistryDep) -> FleetOut:
    return _out(registry.get_fleet(fleet))


@router.post("/{fleet}/targets", status_code=status.HTTP_201_CREATED)
async def push_targets(
    fleet: str, request: Request, ctx: ContextDep, registry: RegistryDep, director: DirectorDep
) -> PushOut:
    """Accept operator-signed targets metadata (version = current + 1) and publish it;
    then move the nodes off the versions it revoked (`revocations`, ADR 0035).

    409 when another push got there first: re-read targets, re-sign and retry.
    """
    body = await request.body()  # bounded by the app's body limit for this path
    # The push waits on the database's write lock (SQLite's is the whole file's): in a
    # worker thread, so the event loop serves probes and node streams meanwhile.
    result = await anyio.to_thread.run_sync(registry.push_targets, ctx, fleet, body)
    moves = await anyio.to_thread.run_sync(director.after_push, result)
    return PushOut(
        fleet=result.fleet,
        targets_version=result.targets_version,
        snapshot_version=result.snapshot_version,
        timestamp_version=result.timestamp_version,
        added=result.added,
        floors=result.floors,
        revocations=[
            RevocationOut(
                model=m.model,
                floor=m.floor,
                moved_to=m.to_version,
                moved=[a.node_id for a in m.moved],
                left=list(m.left),
                skipped=[f"{s.node_id} ({s.reason})" for s in m.skipped],
            )
            for m in moves
        ],
    )
