"""Request and response bodies of the REST API (pydantic), apart from domain objects."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, Field


class FleetCreate(BaseModel):
    name: str = Field(min_length=1, max_length=63)


class FleetRootUpload(BaseModel):
    """Operator-signed root and targets metadata, as TUF JSON objects.

    The first root (version 1) with empty targets, or a rotation: root N+1 with the
    current targets re-signed by the new release key(s).
    """

    root: dict[str, Any]
    targets: dict[str, Any]


class FleetOut(BaseModel):
    name: str
    state: str
    created_at: datetime
    online_keys: dict[str, dict[str, Any]]
    versions: dict[str, int]


class ArtifactOut(BaseModel):
    sha256: str
    length: int
    created: bool


class RevocationOut(BaseModel):
    """What a push did to the nodes on versions it revoked (ADR 0035)."""

    model: str
    floor: int
    moved_to: str | None = Field(description="the version they got; null: none is allowed")
    moved: list[str] = Field(description="node ids given a fresh assignment of `moved_to`")
    left: list[str] = Field(description="node ids left on a revoked version (none allowed)")
    skipped: list[str] = Field(default_factory=list, description="`node (revoked|gone)`")


class PushOut(BaseModel):
    fleet: str
    targets_version: int
    snapshot_version: int
    timestamp_version: int
    added: list[str]
    floors: dict[str, int]
    revocations: list[RevocationOut] = Field(default_factory=list)


class RotationOut(BaseModel):
    fleet: str
    root_version: int
    targets_version: int
    snapshot_version: int
    timestamp_version: int
    root_keyids: list[str]
    root_threshold: int
    release_keyids: list[str]
    revoked_keyids: list[str]
    online_keyids: dict[str, str]


class OnlineKeysOut(BaseModel):
    """New online public keys (role → TUF key dict with its keyid) for root N+1."""

    snapshot: dict[str, Any]
    timestamp: dict[str, Any]


class ModelVersionOut(BaseModel):
    fleet: str
    model: str
    version: str
    release_counter: int
    target_path: str
    sha256: str
    length: int
    custom: dict[str, Any]
    targets_version: int
    created_at: datetime
    created_by: str
    revoked: bool
    download_url: str | None = None
    left_on_it: list[str] = Field(
        default_factory=list,
        description="revoked versions: the nodes still assigned it, for want of a version "
        "at or above the floor (ADR 0035)",
    )
    runtime: dict[str, Any] | None = None
    """How the version is run, summarised (the signed form is `custom.runtime`): preprocess,
    decoder and its params, the number of labels and the first few; null for a version
    signed without a runtime spec."""


class TokenCreate(BaseModel):
    name: str = Field(min_length=1, max_length=128)
    role: str


class TokenOut(BaseModel):
    id: str
    name: str
    role: str
    created_at: datetime
    created_by: str
    revoked_at: datetime | None
    last_used_at: datetime | None


class TokenCreated(TokenOut):
    token: str = Field(description="shown once; store it now")


class AuditOut(BaseModel):
    id: int
    at: datetime
    actor: str
    role: str
    action: str
    target: str
    request_id: str
    outcome: str
    details: dict[str, Any]
