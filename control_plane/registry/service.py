"""The signed model registry: fleets, artifacts, TUF metadata and model versions.

This service orchestrates; the rules live in `control_plane.trust.repository` (pure)
and the bytes in an `ArtifactStore`. It never holds a release key: operators sign
targets metadata on their own machines, the control plane signs only snapshot and
timestamp with its online keys.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker
from tuf.api.metadata import Metadata, Root, Snapshot, Targets, Timestamp

from control_plane.access.roles import Role
from control_plane.access.service import AuditedMutations, RequestContext, record_audit
from control_plane.artifacts.base import ArtifactStore
from control_plane.clock import Clock
from control_plane.errors import (
    ConflictError,
    EdgefleetError,
    InvalidInputError,
    NotFoundError,
    PolicyError,
    SignatureError,
    UnavailableError,
)
from control_plane.registry.freshness import MetadataExpiry, stale_online_metadata
from control_plane.storage.models import (
    ArtifactRow,
    FleetRow,
    ModelFloorRow,
    ModelVersionRow,
    TufMetadataRow,
)
from control_plane.trust import repository as tufrepo
from control_plane.trust.custom import runtime_summary
from control_plane.trust.signer import FileOnlineKeyStore, OnlineSigner
from protos.bundle.spec import BundleError, runtime_of_custom

log = logging.getLogger(__name__)

FLEET_NAME = re.compile(r"^[a-z0-9][a-z0-9-]{0,62}$")
_VERSIONED = re.compile(r"^(?P<version>[1-9][0-9]{0,9})\.(?P<role>root|snapshot|targets)\.json$")


@dataclass(frozen=True, slots=True)
class RegistryConfig:
    """Lifetimes of the online-signed roles and how early they are re-signed."""

    snapshot_ttl: timedelta = timedelta(days=7)
    timestamp_ttl: timedelta = timedelta(days=1)
    refresh_margin_fraction: float = 0.5
    # /readyz fails when a served snapshot/timestamp has less than this fraction of its
    # TTL left: the loop re-signs at `refresh_margin_fraction`, so only a stalled loop
    # gets here, and nodes still have the rest of the margin before they refuse it.
    ready_margin_fraction: float = 0.25

    def ready_margins(self) -> dict[str, timedelta]:
        return {
            "snapshot": self.snapshot_ttl * self.ready_margin_fraction,
            "timestamp": self.timestamp_ttl * self.ready_margin_fraction,
        }


@dataclass(frozen=True, slots=True)
class FleetInfo:
    name: str
    state: str
    created_at: datetime
    online_keys: dict[str, dict[str, Any]]
    versions: dict[str, int]


@dataclass(frozen=True, slots=True)
class ModelVersionInfo:
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
    runtime: dict[str, Any] | None = None
    """`runtime_summary` of the signed runtime spec; None for a version signed without."""


@dataclass(frozen=True, slots=True)
class PushResult:
    fleet: str
    targets_version: int
    snapshot_version: int
    timestamp_version: int
    added: list[str]
    floors: dict[str, int]


@dataclass(frozen=True, slots=True)
class RotationResult:
    """What an accepted root rotation published: the new versions and the new roles."""

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


class RegistryService:
    def __init__(
        self,
        sessions: sessionmaker[Session],
        store: ArtifactStore,
        online_keys: FileOnlineKeyStore,
        clock: Clock,
        config: RegistryConfig | None = None,
        director_key_held: Callable[[str], bool] | None = None,
    ) -> None:
        """`director_key_held(keyid)`: may a fleet's root list that director key (ADR 0045);
        None: no root may change the director keys."""
        self._sessions = sessions
        self._director_key_held = director_key_held
        self._store = store
        self._keys = online_keys
        self._clock = clock
        self._config = config or RegistryConfig()
        self._mutations = AuditedMutations(sessions, clock)

    @property
    def store(self) -> ArtifactStore:
        return self._store

    # ---------------------------------------------------------------- fleets

    def create_fleet(self, ctx: RequestContext, name: str) -> FleetInfo:
        """Step one of fleet creation: online keys are made; the fleet waits for its root."""
        with self._mutations.mutation(
            ctx, "fleet.create", f"fleet:{name}", needs=Role.ADMIN
        ) as session:
            if not FLEET_NAME.match(name):
                raise InvalidInputError(
                    "fleet names are 1-63 lowercase letters, digits or '-', starting alphanumeric",
                    fleet=name,
                )
            row = session.scalar(select(FleetRow).where(FleetRow.name == name))
            if row is not None and row.state != "pending":
                raise ConflictError(f"fleet {name!r} already exists", fleet=name)
            # The one place a fleet's online keys are made (its explicit init): a pending
            # fleet created again, say on a replica or a restored data dir without them,
            # is refused rather than given new keys.
            keys = self._keys.ensure_keys(name) if row is None else self._pending_keys(row)
            if row is None:
                row = FleetRow(name=name, state="pending", created_at=self._clock.now())
                session.add(row)
            row.snapshot_keyid = keys["snapshot"].keyid
            row.timestamp_keyid = keys["timestamp"].keyid
            session.flush()
            info = self._fleet_info(session, row)
        return info

    def activate_fleet(
        self, ctx: RequestContext, name: str, root_bytes: bytes, targets_bytes: bytes
    ) -> FleetInfo:
        """Step two: accept the operator-signed root and first targets, publish the repo."""
        now = self._clock.now()
        with self._mutations.mutation(
            ctx, "fleet.activate", f"fleet:{name}", needs=Role.ADMIN
        ) as session:
            row = self._fleet_row(session, name, lock=True)
            if row.state != "pending":
                raise ConflictError(f"fleet {name!r} already has a root", fleet=name)
            if row.snapshot_keyid is None or row.timestamp_keyid is None:
                raise ConflictError(f"fleet {name!r} has no online keys yet", fleet=name)
            root = tufrepo.verify_new_root(
                root_bytes,
                snapshot_keyid=row.snapshot_keyid,
                timestamp_keyid=row.timestamp_keyid,
                now=now,
            )
            targets = tufrepo.verify_initial_targets(
                root=root, targets_bytes=targets_bytes, now=now
            )
            self._put_metadata(session, row, root)
            self._put_metadata(session, row, targets)
            self._publish_snapshot(session, row, targets, previous_snapshot=None, now=now)
            row.state = "active"
            session.flush()
            info = self._fleet_info(session, row)
        return info

    def get_fleet(self, name: str) -> FleetInfo:
        with self._sessions() as session:
            return self._fleet_info(session, self._fleet_row(session, name))

    def list_fleets(self) -> list[FleetInfo]:
        with self._sessions() as session:
            rows = session.scalars(select(FleetRow).order_by(FleetRow.name))
            return [self._fleet_info(session, r) for r in rows]

    # ------------------------------------------------------------- artifacts

    def upload_artifact(
        self, ctx: RequestContext, sha256: str, length: int, chunks: Iterable[bytes]
    ) -> bool:
        """Stream an artifact into the store; it is visible only once hash and length match."""
        action, target = "artifact.upload", f"sha256:{sha256}"
        # The store streams and verifies before any database lock is taken: a long
        # upload must not hold the (SQLite) write lock.
        try:
            ctx.principal.require(Role.RELEASE_MANAGER, action)
            created = self._store.put(sha256, length, chunks)
        except EdgefleetError as exc:
            self._mutations.record_refusal(ctx, action, target, exc)
            raise
        with self._mutations.mutation(ctx, action, target, needs=Role.RELEASE_MANAGER) as session:
            if session.get(ArtifactRow, sha256) is None:
                session.add(
                    ArtifactRow(
                        sha256=sha256,
                        length=length,
                        created_at=self._clock.now(),
                        uploaded_by=ctx.principal.name,
                    )
                )
        return created

    def artifact_size(self, sha256: str) -> int | None:
        return self._store.size(sha256)

    # ----------------------------------------------------------------- pushes

    def push_targets(self, ctx: RequestContext, fleet: str, targets_bytes: bytes) -> PushResult:
        """Accept new operator-signed targets metadata, then publish snapshot and timestamp.

        The fleet row is locked for the check-and-write, and the (fleet, role, version)
        primary key makes a concurrent push of the same version fail: the loser gets 409.
        """
        now = self._clock.now()
        try:
            with self._mutations.mutation(
                ctx, "targets.push", f"fleet:{fleet}", needs=Role.RELEASE_MANAGER
            ) as session:
                row = self._fleet_row(session, fleet, lock=True)
                self._require_active(row)
                root = self._latest(session, row, "root", Root)
                current = self._latest(session, row, "targets", Targets)
                previous_snapshot = self._latest(session, row, "snapshot", Snapshot)
                change = tufrepo.verify_targets_update(
                    root=root,
                    current=current,
                    new_bytes=targets_bytes,
                    now=now,
                    artifact_length=self._store.size,
                )
                new = change.metadata
                self._put_metadata(session, row, new)
                for model in change.new_models:
                    session.add(
                        ModelVersionRow(
                            fleet_id=row.id,
                            model=model.custom.model,
                            version=model.custom.version,
                            release_counter=model.custom.release_counter,
                            target_path=model.path,
                            sha256=model.sha256,
                            length=model.length,
                            custom=model.custom.to_dict(),
                            targets_version=new.signed.version,
                            created_at=now,
                            created_by=ctx.principal.name,
                        )
                    )
                    check = model.custom.release_check
                    if check is not None and check.forced:
                        # Pushed below its release check's threshold (`--force`): one
                        # audit row of its own, committed with the push (ADR 0048).
                        record_audit(
                            session,
                            ctx,
                            at=now,
                            action="model.release_check.forced",
                            target=f"fleet:{fleet}/{model.custom.model}@{model.custom.version}",
                            details={
                                "judged_on": check.judged_on,
                                "value": check.value,
                                "threshold": check.threshold,
                                "baseline_sha256": check.baseline_sha256,
                            },
                        )
                for model_name, floor in change.floors.items():
                    floor_row = session.get(ModelFloorRow, (row.id, model_name))
                    if floor_row is None:
                        session.add(
                            ModelFloorRow(
                                fleet_id=row.id,
                                model=model_name,
                                floor=floor,
                                targets_version=new.signed.version,
                                updated_at=now,
                            )
                        )
                    else:
                        floor_row.floor = floor
                        floor_row.targets_version = new.signed.version
                        floor_row.updated_at = now
                snapshot, timestamp = self._publish_snapshot(
                    session, row, new, previous_snapshot=previous_snapshot, now=now
                )
                session.flush()
                result = PushResult(
                    fleet=fleet,
                    targets_version=new.signed.version,
                    snapshot_version=snapshot.signed.version,
                    timestamp_version=timestamp.signed.version,
                    added=sorted(change.new_targets),
                    floors=dict(change.floors),
                )
        except IntegrityError as exc:
            raise ConflictError(
                "another push won the race for this version; re-read targets and retry",
                fleet=fleet,
                reason="race",
            ) from exc
        return result

    # --------------------------------------------------------------- rotation

    def rotate_root(
        self, ctx: RequestContext, fleet: str, root_bytes: bytes, targets_bytes: bytes
    ) -> RotationResult:
        """Accept root N+1 (e.g. a revoked release key) with the targets it re-signs.

        One transaction with the fleet row locked: the new root is checked against the
        current one (TUF root update rules), the targets against the NEW root — the
        current targets re-signed by the new release key(s), nothing added — then root
        N+1, targets and a fresh snapshot and timestamp are stored together. From then
        on a push signed by a revoked key fails the threshold check (403).
        """
        now = self._clock.now()
        try:
            with self._mutations.mutation(
                ctx, "root.rotate", f"fleet:{fleet}", needs=Role.ADMIN
            ) as session:
                row = self._fleet_row(session, fleet, lock=True)
                self._require_active(row)
                current_root = self._latest(session, row, "root", Root)
                current_targets = self._latest(session, row, "targets", Targets)
                previous_snapshot = self._latest(session, row, "snapshot", Snapshot)
                root = tufrepo.verify_root_update(
                    current=current_root,
                    new_bytes=root_bytes,
                    now=now,
                    online_key_held=lambda role, keyid: self._keys.holds(fleet, role, keyid),
                    director_key_held=self._director_key_held,
                )
                targets = tufrepo.verify_resigned_targets(
                    root=root, current=current_targets, new_bytes=targets_bytes, now=now
                )
                # An online-key rotation: from here on the new keys sign snapshot and
                # timestamp (versions continue; nodes drop the old ones, TUF §5.3.11).
                row.snapshot_keyid = root.signed.roles["snapshot"].keyids[0]
                row.timestamp_keyid = root.signed.roles["timestamp"].keyids[0]
                self._put_metadata(session, row, root)
                self._put_metadata(session, row, targets)
                snapshot, timestamp = self._publish_snapshot(
                    session, row, targets, previous_snapshot=previous_snapshot, now=now
                )
                session.flush()
                roles = root.signed.roles
                before = {
                    keyid
                    for name in ("root", "targets", *tufrepo.ONLINE_ROLES)
                    for keyid in current_root.signed.roles[name].keyids
                }
                result = RotationResult(
                    fleet=fleet,
                    root_version=root.signed.version,
                    targets_version=targets.signed.version,
                    snapshot_version=snapshot.signed.version,
                    timestamp_version=timestamp.signed.version,
                    root_keyids=list(roles["root"].keyids),
                    root_threshold=roles["root"].threshold,
                    release_keyids=list(roles["targets"].keyids),
                    revoked_keyids=sorted(before - set(root.signed.keys)),
                    online_keyids={r: roles[r].keyids[0] for r in tufrepo.ONLINE_ROLES},
                )
        except IntegrityError as exc:
            raise ConflictError(
                "another change won the race for this version; re-read root and targets and retry",
                fleet=fleet,
                reason="race",
            ) from exc
        return result

    def new_online_keys(self, ctx: RequestContext, fleet: str) -> dict[str, dict[str, Any]]:
        """Fresh snapshot/timestamp keys for an online-key rotation; their public halves.

        Nothing signs with them until the operator's root N+1 naming them is accepted
        (`rotate_root`); unused ones are harmless. Admin, audited.
        """
        with self._mutations.mutation(
            ctx, "online-keys.create", f"fleet:{fleet}", needs=Role.ADMIN
        ) as session:
            row = self._fleet_row(session, fleet)
            self._require_active(row)
            keys = self._keys.new_keys(fleet)
        return {role: {"keyid": key.keyid, **key.to_dict()} for role, key in keys.items()}

    def director_keyids(self, fleet: str) -> list[str]:
        """The director keyids the fleet's latest root lists ([] for none, or no root)."""
        with self._sessions() as session:
            row = self._fleet_row(session, fleet)
            if row.state != "active":
                return []
            try:
                root = self._latest(session, row, "root", Root)
            except NotFoundError:
                return []
        return [key.keyid for key in tufrepo.listed_director_keys(root.signed)]

    # -------------------------------------------------------------- metadata

    def metadata_file(self, fleet: str, filename: str) -> bytes:
        """Serve TUF metadata by its consistent-snapshot file name (or timestamp.json)."""
        with self._sessions() as session:
            row = self._fleet_row(session, fleet)
            self._require_active(row)
            if filename == "timestamp.json":
                body = self._latest_body(session, row, "timestamp")
            elif filename in {"root.json", "targets.json", "snapshot.json"}:
                body = self._latest_body(session, row, filename.removesuffix(".json"))
            else:
                match = _VERSIONED.match(filename)
                if match is None:
                    raise NotFoundError(f"no metadata file {filename!r}", fleet=fleet)
                found = session.scalar(
                    select(TufMetadataRow.body).where(
                        TufMetadataRow.fleet_id == row.id,
                        TufMetadataRow.role == match["role"],
                        TufMetadataRow.version == int(match["version"]),
                    )
                )
                if found is None:
                    raise NotFoundError(f"no metadata file {filename!r}", fleet=fleet)
                body = found
            return bytes(body)

    def resolve_target(self, fleet: str, hashed_path: str) -> tuple[str, int]:
        """Map a consistent-snapshot target URL path (`dir/<sha256>.<name>`) to an artifact.

        Only files listed in the fleet's current targets metadata are served, so one
        fleet's artifacts are not reachable through another fleet's repository.
        """
        directory, _, basename = hashed_path.rpartition("/")
        digest, dot, name = basename.partition(".")
        if not dot or not re.fullmatch(r"[0-9a-f]{64}", digest):
            raise NotFoundError(f"no target {hashed_path!r}", fleet=fleet)
        path = f"{directory}/{name}" if directory else name
        try:
            sha256, length = self.target_artifact(fleet, path)
        except NotFoundError:
            raise NotFoundError(f"no target {hashed_path!r}", fleet=fleet) from None
        if sha256 != digest:
            raise NotFoundError(f"no target {hashed_path!r}", fleet=fleet)
        return sha256, length

    def target_artifact(self, fleet: str, target_path: str) -> tuple[str, int]:
        """(sha256, length) of a target path the fleet's current targets metadata lists.

        For nodes fetching by target path over their link; like `resolve_target`, a path
        that only another fleet lists is not found here.
        """
        with self._sessions() as session:
            row = self._fleet_row(session, fleet)
            self._require_active(row)
            targets = self._latest(session, row, "targets", Targets)
        target = targets.signed.targets.get(target_path)
        digest = target.hashes.get("sha256") if target is not None else None
        if target is None or digest is None:
            raise NotFoundError(
                f"no target {target_path!r} in fleet {fleet!r}", fleet=fleet, target=target_path
            )
        return digest, target.length

    # ----------------------------------------------------------------- models

    def list_models(self, fleet: str) -> list[ModelVersionInfo]:
        """The latest version of every model in the fleet."""
        versions = self.list_versions(fleet)
        latest: dict[str, ModelVersionInfo] = {}
        for info in versions:
            if (
                info.model not in latest
                or info.release_counter > latest[info.model].release_counter
            ):
                latest[info.model] = info
        return [latest[k] for k in sorted(latest)]

    def list_versions(self, fleet: str, model: str | None = None) -> list[ModelVersionInfo]:
        with self._sessions() as session:
            row = self._fleet_row(session, fleet)
            query = select(ModelVersionRow).where(ModelVersionRow.fleet_id == row.id)
            if model is not None:
                query = query.where(ModelVersionRow.model == model)
            query = query.order_by(ModelVersionRow.model, ModelVersionRow.release_counter)
            floors = {
                f.model: f.floor
                for f in session.scalars(
                    select(ModelFloorRow).where(ModelFloorRow.fleet_id == row.id)
                )
            }
            result = [
                _version_info(fleet, v, floors.get(v.model, 0)) for v in session.scalars(query)
            ]
        if model is not None and not result:
            raise NotFoundError(f"no model {model!r} in fleet {fleet!r}", fleet=fleet, model=model)
        return result

    def get_version(self, fleet: str, model: str, version: str) -> ModelVersionInfo:
        """One version and its model's floor: two indexed reads, however many versions the
        model has (the director looks a version up for every pin)."""
        with self._sessions() as session:
            row = self._fleet_row(session, fleet)
            found = session.scalar(
                select(ModelVersionRow).where(
                    ModelVersionRow.fleet_id == row.id,
                    ModelVersionRow.model == model,
                    ModelVersionRow.version == version,
                )
            )
            if found is None:
                known = session.scalar(
                    select(ModelVersionRow.id)
                    .where(ModelVersionRow.fleet_id == row.id, ModelVersionRow.model == model)
                    .limit(1)
                )
                if known is None:
                    raise NotFoundError(
                        f"no model {model!r} in fleet {fleet!r}", fleet=fleet, model=model
                    )
                raise NotFoundError(
                    f"no version {version!r} of model {model!r} in fleet {fleet!r}",
                    fleet=fleet,
                    model=model,
                    version=version,
                )
            floor = session.scalar(
                select(ModelFloorRow.floor).where(
                    ModelFloorRow.fleet_id == row.id, ModelFloorRow.model == model
                )
            )
            return _version_info(fleet, found, floor or 0)

    # --------------------------------------------------------------- freshness

    @property
    def config(self) -> RegistryConfig:
        return self._config

    def metadata_expiries(self) -> list[MetadataExpiry]:
        """The newest served version of every role of every active fleet, with its expiry."""
        latest = (
            select(
                TufMetadataRow.fleet_id,
                TufMetadataRow.role,
                func.max(TufMetadataRow.version).label("version"),
            )
            .group_by(TufMetadataRow.fleet_id, TufMetadataRow.role)
            .subquery()
        )
        query = (
            select(FleetRow.name, TufMetadataRow.role, TufMetadataRow.version)
            .add_columns(TufMetadataRow.expires_at)
            .join(latest, latest.c.fleet_id == FleetRow.id)
            .join(
                TufMetadataRow,
                (TufMetadataRow.fleet_id == latest.c.fleet_id)
                & (TufMetadataRow.role == latest.c.role)
                & (TufMetadataRow.version == latest.c.version),
            )
            .where(FleetRow.state == "active")
            .order_by(FleetRow.name, TufMetadataRow.role)
        )
        with self._sessions() as session:
            return [
                MetadataExpiry(fleet=name, role=role, version=version, expires_at=expires_at)
                for name, role, version, expires_at in session.execute(query)
            ]

    def stale_online_metadata(self) -> list[str]:
        """Why the served snapshot/timestamp of some fleet is (nearly) expired; [] if fresh."""
        return stale_online_metadata(
            self.metadata_expiries(), self._clock.now(), self._config.ready_margins()
        )

    def refresh_expiring(self) -> list[str]:
        """Re-sign what nears expiry in every active fleet; returns the fleets refreshed.

        A timestamp alone is re-signed over the same snapshot; a snapshot that nears its
        own expiry gets a new version (and a timestamp pointing at it). One fleet's
        failure (say, its online keys are missing) is logged and does not stop the rest.
        """
        now = self._clock.now()
        refreshed: list[str] = []
        with self._sessions() as session:
            names = list(session.scalars(select(FleetRow.name).where(FleetRow.state == "active")))
        for name in names:
            try:
                if self._refresh_fleet(name, now):
                    refreshed.append(name)
            except EdgefleetError as exc:
                log.error("cannot re-sign the repository of fleet %s: %s", name, exc.message)
        return refreshed

    def _refresh_fleet(self, name: str, now: datetime) -> bool:
        fraction = self._config.refresh_margin_fraction
        with self._sessions() as session:
            session.connection(execution_options={"sqlite_begin": "IMMEDIATE"})
            row = self._fleet_row(session, name, lock=True)
            snapshot = self._latest(session, row, "snapshot", Snapshot)
            timestamp = self._latest(session, row, "timestamp", Timestamp)
            if tufrepo.needs_refresh(snapshot, now, self._config.snapshot_ttl * fraction):
                targets = self._latest(session, row, "targets", Targets)
                self._publish_snapshot(session, row, targets, previous_snapshot=snapshot, now=now)
            elif tufrepo.needs_refresh(timestamp, now, self._config.timestamp_ttl * fraction):
                self._publish_timestamp(
                    session, row, snapshot.signed.version, previous=timestamp, now=now
                )
            else:
                return False
            try:
                session.commit()
            except IntegrityError:
                # Another replica refreshed the same fleet first: that is fine.
                session.rollback()
                return False
            return True

    # ---------------------------------------------------------------- helpers

    def _publish_snapshot(
        self,
        session: Session,
        row: FleetRow,
        targets: Metadata[Targets],
        *,
        previous_snapshot: Metadata[Snapshot] | None,
        now: datetime,
    ) -> tuple[Metadata[Snapshot], Metadata[Timestamp]]:
        signer = self._online_signer(row)
        snapshot = tufrepo.make_snapshot(
            targets, previous=previous_snapshot, expires=now + self._config.snapshot_ttl
        )
        signer.sign("snapshot", snapshot)
        self._put_metadata(session, row, snapshot)
        previous_timestamp = (
            self._latest(session, row, "timestamp", Timestamp)
            if previous_snapshot is not None
            else None
        )
        timestamp = self._publish_timestamp(
            session, row, snapshot.signed.version, previous=previous_timestamp, now=now
        )
        return snapshot, timestamp

    def _publish_timestamp(
        self,
        session: Session,
        row: FleetRow,
        snapshot_version: int,
        *,
        previous: Metadata[Timestamp] | None,
        now: datetime,
    ) -> Metadata[Timestamp]:
        timestamp = tufrepo.make_timestamp(
            snapshot_version, previous=previous, expires=now + self._config.timestamp_ttl
        )
        self._online_signer(row).sign("timestamp", timestamp)
        self._put_metadata(session, row, timestamp)
        return timestamp

    def _put_metadata(self, session: Session, row: FleetRow, md: Metadata[Any]) -> None:
        session.add(
            TufMetadataRow(
                fleet_id=row.id,
                role=md.signed.type,
                version=md.signed.version,
                body=tufrepo.to_bytes(md),
                expires_at=md.signed.expires,
                created_at=self._clock.now(),
            )
        )
        session.flush()

    def _fleet_row(self, session: Session, name: str, *, lock: bool = False) -> FleetRow:
        query = select(FleetRow).where(FleetRow.name == name)
        if lock:
            query = query.with_for_update()
        row = session.scalar(query)
        if row is None:
            raise NotFoundError(f"no fleet named {name!r}", fleet=name)
        return row

    @staticmethod
    def _require_active(row: FleetRow) -> None:
        if row.state != "active":
            raise PolicyError(
                f"fleet {row.name!r} has no trust root yet; run `edgefleet fleet create` again",
                fleet=row.name,
            )

    def _latest_body(self, session: Session, row: FleetRow, role: str) -> bytes:
        body = session.scalar(
            select(TufMetadataRow.body)
            .where(TufMetadataRow.fleet_id == row.id, TufMetadataRow.role == role)
            .order_by(TufMetadataRow.version.desc())
            .limit(1)
        )
        if body is None:
            raise NotFoundError(f"fleet {row.name!r} has no {role} metadata", fleet=row.name)
        return bytes(body)

    def _latest(self, session: Session, row: FleetRow, role: str, kind: type[Any]) -> Metadata[Any]:
        md = Metadata[Any].from_bytes(self._latest_body(session, row, role))
        if not isinstance(md.signed, kind):
            raise SignatureError(f"stored {role} metadata has the wrong type", fleet=row.name)
        return md

    def _fleet_info(self, session: Session, row: FleetRow) -> FleetInfo:
        versions: dict[str, int] = {}
        for role in ("root", "targets", "snapshot", "timestamp"):
            version = session.scalar(
                select(TufMetadataRow.version)
                .where(TufMetadataRow.fleet_id == row.id, TufMetadataRow.role == role)
                .order_by(TufMetadataRow.version.desc())
                .limit(1)
            )
            if version is not None:
                versions[role] = version
        if row.state == "pending":
            keys = self._pending_keys(row)
        else:
            # A live fleet's online keys are the ones its root names: read them there,
            # never (re)create them as a side effect of a read.
            root = self._latest(session, row, "root", Root)
            keys = {
                role: root.signed.get_key(root.signed.roles[role].keyids[0])
                for role in tufrepo.ONLINE_ROLES
            }
        return FleetInfo(
            name=row.name,
            state=row.state,
            created_at=row.created_at,
            online_keys={role: {"keyid": key.keyid, **key.to_dict()} for role, key in keys.items()},
            versions=versions,
        )

    def _pending_keys(self, row: FleetRow) -> dict[str, Any]:
        """The online public keys of a pending fleet, never made here (UnavailableError)."""
        signer = self._online_signer(row)
        return {role: signer.public_key(role) for role in tufrepo.ONLINE_ROLES}

    def _online_signer(self, row: FleetRow) -> OnlineSigner:
        """The fleet's online signer, checked against the keyids recorded at creation."""
        expected = {"snapshot": row.snapshot_keyid, "timestamp": row.timestamp_keyid}
        signer = self._keys.signer_for(
            row.name, {role: keyid for role, keyid in expected.items() if keyid is not None}
        )
        for role, keyid in expected.items():
            if signer.public_key(role).keyid != keyid:
                raise UnavailableError(
                    f"the online {role} key of fleet {row.name!r} on this server does not "
                    "match the fleet's root; restore the data dir's online-keys from backup",
                    fleet=row.name,
                    role=role,
                )
        return signer


def _runtime_view(custom: dict[str, Any]) -> dict[str, Any] | None:
    try:
        runtime = runtime_of_custom(custom)
    except BundleError as exc:
        # Checked at push; a row this build cannot read was written by a newer one.
        return {"unreadable": exc.message}
    return None if runtime is None else runtime_summary(runtime)


def _version_info(fleet: str, row: ModelVersionRow, floor: int) -> ModelVersionInfo:
    custom = json.loads(json.dumps(row.custom))
    return ModelVersionInfo(
        fleet=fleet,
        model=row.model,
        version=row.version,
        release_counter=row.release_counter,
        target_path=row.target_path,
        sha256=row.sha256,
        length=row.length,
        custom=custom,
        targets_version=row.targets_version,
        created_at=row.created_at,
        created_by=row.created_by,
        revoked=row.release_counter < floor,
        runtime=_runtime_view(custom),
    )
