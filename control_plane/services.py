"""The composition root: builds engines, stores and services from plain values.

Called by `server.main()` and by tests; nothing here runs at import time.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Literal

import anyio
import anyio.to_thread
from securesystemslib.signer import Signer
from sqlalchemy import Engine, select, text
from sqlalchemy.orm import Session, sessionmaker

from control_plane.access.service import AccessService
from control_plane.artifacts.base import ArtifactStore
from control_plane.artifacts.factory import artifact_store_from_url
from control_plane.clock import Clock, SystemClock
from control_plane.director.assignments import DirectorKeyring, load_or_create_director_key
from control_plane.director.delivery import FanOutDelivery
from control_plane.director.service import DirectorService
from control_plane.errors import InvalidInputError, UnavailableError
from control_plane.events.query import EventsConfig
from control_plane.events.store import EventStore
from control_plane.fsutil import make_private_dirs
from control_plane.health.clearing import AlertClearing
from control_plane.health.config import HealthConfig
from control_plane.health.processor import HealthProcessor
from control_plane.health.queries import HealthQueries
from control_plane.health.retention import HealthRetention
from control_plane.identity.ca import CA_KEY_FILE, CertificateAuthority
from control_plane.link.broker_accounts import BrokerAccounts, FileExportAccounts
from control_plane.link.desired import MqttDelivery
from control_plane.link.grpc_server import GrpcLinkConfig, GrpcLinkServer
from control_plane.link.hub import LinkHub
from control_plane.link.ingest import RecordIngest
from control_plane.link.mqtt_bridge import MqttBridge, MqttBridgeConfig, control_plane_password
from control_plane.link.node_inbox import NodeInbox
from control_plane.link.records import IngestLimits
from control_plane.nodes.model import NodeConfig
from control_plane.nodes.wiring import NodeServices, build_node_services
from control_plane.registry.service import RegistryConfig, RegistryService
from control_plane.rollouts.notify import Notifier, NullNotifier, WebhookConfig, WebhookNotifier
from control_plane.rollouts.service import RolloutConfig, RolloutService
from control_plane.storage.db import create_engine_for, migrate, session_factory
from control_plane.storage.models import FleetRow, NodeRow
from control_plane.trust.keys import load_public_key
from control_plane.trust.signer import FileOnlineKeyStore, load_online_key_uris, signer_from_uri


@dataclass(frozen=True, slots=True)
class ServiceConfig:
    data_dir: Path
    database_url: str
    artifacts_url: str
    max_json_bytes: int = 1 << 20
    max_artifact_bytes: int = 4 << 30
    snapshot_ttl: timedelta = timedelta(days=7)
    timestamp_ttl: timedelta = timedelta(days=1)
    refresh_interval_s: float = 300.0
    # /readyz fails when a served snapshot/timestamp has less than this fraction of its
    # TTL left (the freshness loop re-signs at half).
    ready_margin_fraction: float = 0.25
    # How often director assignments due within a third of their lifetime are renewed.
    renewal_interval_s: float = 600.0
    nodes: NodeConfig = field(default_factory=NodeConfig)
    health: HealthConfig = field(default_factory=HealthConfig)
    # Whether this replica runs the health processor (at least one replica must).
    health_processor: bool = True
    # The MQTT bridge runs (in the API's lifespan) only when this is set.
    mqtt: MqttBridgeConfig | None = None
    # Who keeps the broker's node logins (ADR 0043): "dynsec", the control plane through
    # Mosquitto's dynamic security plugin (needs `mqtt`); "file", `edgefleet mqtt acl`.
    broker_accounts: Literal["file", "dynsec"] = "file"
    broker_reconcile_interval_s: float = 300.0
    # Sampled inference results kept per node (node_results).
    results_per_node: int = 100
    # The event store's retention and pruning (every replica prunes: deletes are idempotent).
    events: EventsConfig = field(default_factory=EventsConfig)
    rollouts: RolloutConfig = field(default_factory=RolloutConfig)
    # Whether this replica runs the rollout controller's loop (several may: leases).
    rollout_controller: bool = True
    # Where rollout decisions and alerts are POSTed (none: nowhere).
    webhooks: WebhookConfig | None = None
    # Where the server's keys live (online-keys/, director/, ca/); shared by every replica.
    # None: the data dir. A missing director key is made only for a fresh control plane
    # or with `init_keys` (ADR 0045).
    keys_dir: Path | None = None
    init_keys: bool = False
    # The director key behind a securesystemslib signer URI (file2:, hv:, gcpkms:,
    # awskms:, azurekms:, hsm:) and its public key file; None: <keys_dir>/director/.
    director_signer_uri: str | None = None
    director_public_key: Path | None = None
    # A JSON file {fleet: {role: {"uri", "public_key"}}}: those online keys are opened
    # behind securesystemslib signer URIs, the rest are files in <keys_dir>/online-keys/.
    online_signer_uris: Path | None = None


@dataclass(frozen=True, slots=True)
class HealthServices:
    """The health store by role: each user takes the one it needs, never the others."""

    processor: HealthProcessor
    queries: HealthQueries
    retention: HealthRetention
    alerts: AlertClearing


def build_health(
    sessions: sessionmaker[Session], clock: Clock, config: HealthConfig | None = None
) -> HealthServices:
    config = config or HealthConfig()
    retention = HealthRetention(sessions, clock, config)
    return HealthServices(
        processor=HealthProcessor(sessions, clock, config, retention),
        queries=HealthQueries(sessions, clock, config),
        retention=retention,
        alerts=AlertClearing(sessions, clock),
    )


@dataclass
class Services:
    config: ServiceConfig
    engine: Engine
    store: ArtifactStore
    access: AccessService
    registry: RegistryService
    clock: Clock
    ca: CertificateAuthority
    # The node role services (tokens, enrollment, authentication, presence, inventory);
    # each adapter is handed the one it uses, or a `node_inbox`.
    nodes: NodeServices
    records: RecordIngest
    health: HealthServices
    events: EventStore
    director: DirectorService
    # New assignments go out through whatever transports run in this process: the gRPC
    # link server and the MQTT bridge attach themselves while they run.
    delivery: FanOutDelivery
    rollouts: RolloutService
    notifier: Notifier

    @property
    def admin_token_file(self) -> Path:
        return self.config.data_dir / "admin-token"

    def ready(self) -> dict[str, str]:
        """Readiness of each dependency: 'ok' or the reason it is not."""
        checks: dict[str, str] = {}
        try:
            with self.engine.connect() as conn:
                conn.execute(text("SELECT 1"))
            checks["database"] = "ok"
        except Exception as exc:  # readiness reports any failure, it never raises
            checks["database"] = f"unavailable: {type(exc).__name__}"
        try:
            self.store.exists("0" * 64)
            checks["artifacts"] = "ok"
        except Exception as exc:
            checks["artifacts"] = f"unavailable: {type(exc).__name__}"
        try:
            # A stalled freshness loop shows here before nodes refuse what we serve.
            stale = self.registry.stale_online_metadata()
            shown = "; ".join(stale[:3]) + (
                f" (and {len(stale) - 3} more)" if len(stale) > 3 else ""
            )
            checks["tuf_metadata"] = f"expiring: {shown}" if stale else "ok"
        except Exception as exc:
            checks["tuf_metadata"] = f"unavailable: {type(exc).__name__}"
        return checks

    def node_inbox(
        self, transport: str, *, auth_cache_s: float, clock: Clock | None = None
    ) -> NodeInbox:
        """A node inbox for one transport's adapter (its own refusal count and cache).

        `clock` times the authorization cache (tests expire it by hand); default: ours.
        """
        return NodeInbox(
            transport,
            authentication=self.nodes.authentication,
            enrollment=self.nodes.enrollment,
            presence=self.nodes.presence,
            records=self.records,
            director=self.director,
            registry=self.registry,
            clock=clock or self.clock,
            auth_cache_s=auth_cache_s,
        )

    def close(self) -> None:
        self.records.close()  # stores what was submitted, then stops its writer
        try:
            self.rollouts.release()  # another replica steps our rollouts from now on
        except Exception:
            logging.getLogger(__name__).exception("releasing rollout leases failed")
        if isinstance(self.notifier, WebhookNotifier):
            self.notifier.close()
        self.nodes.broker_logins.accounts.close()
        self.engine.dispose()


def broker_accounts(config: ServiceConfig) -> BrokerAccounts:
    """The broker-accounts adapter the config names; connects on first use."""
    if config.broker_accounts == "file":
        return FileExportAccounts()
    if config.mqtt is None:
        raise InvalidInputError("broker accounts over dynamic security need the MQTT bridge")
    from control_plane.link.mqtt_dynsec import DynsecAccounts

    return DynsecAccounts(config.mqtt, control_plane_password(config.data_dir, config.mqtt))


def build_services(config: ServiceConfig, *, clock: Clock | None = None) -> Services:
    make_private_dirs(config.data_dir)
    # Validate the cheap settings before touching the database.
    store = artifact_store_from_url(config.artifacts_url, max_length=config.max_artifact_bytes)
    online_uris = (
        {} if config.online_signer_uris is None else load_online_key_uris(config.online_signer_uris)
    )
    engine = create_engine_for(config.database_url)
    migrate(engine)
    sessions = session_factory(engine)
    clock = clock or SystemClock()
    keys_dir = config.keys_dir or config.data_dir
    keys = FileOnlineKeyStore(keys_dir / "online-keys", online_uris)
    director_dir = keys_dir / "director"
    director_keys = DirectorKeyring(director_dir, _director_signer(config, director_dir, sessions))
    registry = RegistryService(
        sessions,
        store,
        keys,
        clock,
        RegistryConfig(
            snapshot_ttl=config.snapshot_ttl,
            timestamp_ttl=config.timestamp_ttl,
            ready_margin_fraction=config.ready_margin_fraction,
        ),
        director_key_held=director_keys.holds,
    )
    access = AccessService(sessions, clock)
    access.bootstrap_admin(config.data_dir / "admin-token")
    ca = _certificate_authority(config, keys_dir, sessions, clock.now())
    nodes = build_node_services(sessions, ca, clock, config.nodes, accounts=broker_accounts(config))
    delivery = FanOutDelivery()
    health = build_health(sessions, clock, config.health)
    director = DirectorService(
        sessions,
        registry,
        nodes.inventory,
        director_keys.default,
        clock,
        delivery=delivery,
        keyring=director_keys,
    )
    notifier: Notifier = (
        WebhookNotifier(config.webhooks) if config.webhooks is not None else NullNotifier()
    )
    # Here, not at import: the gates bring numpy and scipy, which nothing else of the
    # server imports (ADR 0030).
    from control_plane.rollouts.gates_source import GatesVerdicts

    rollouts = RolloutService(
        sessions,
        clock,
        registry=registry,
        inventory=nodes.inventory,
        health=health.queries,
        director=director,
        verdicts=GatesVerdicts(sessions, retention=config.health.raw_retention),
        notifier=notifier,
        config=config.rollouts,
    )
    return Services(
        config=config,
        engine=engine,
        store=store,
        access=access,
        registry=registry,
        clock=clock,
        ca=ca,
        nodes=nodes,
        records=RecordIngest(
            sessions, clock, IngestLimits(results_per_node=config.results_per_node)
        ),
        health=health,
        events=EventStore(sessions, clock, config.events),
        director=director,
        delivery=delivery,
        rollouts=rollouts,
        notifier=notifier,
    )


# The transports' adapters, each handed what it uses (never the whole `Services`).


def grpc_link_server(
    services: Services, config: GrpcLinkConfig, *, hub: LinkHub | None = None
) -> GrpcLinkServer:
    """The gRPC link server over this replica's gRPC node inbox; not started."""
    return GrpcLinkServer(
        services.node_inbox("grpc", auth_cache_s=config.auth_recheck_s),
        config,
        registry=services.registry,
        store=services.store,
        ca=services.ca,
        delivery=services.delivery,
        clock=services.clock,
        hub=hub,
    )


def mqtt_bridge(
    services: Services, config: MqttBridgeConfig, *, clock: Clock | None = None
) -> MqttBridge:
    """The MQTT bridge over this replica's MQTT node inbox; not started.

    `clock` times the inbox's authorization cache (default: the services' clock).
    """
    inbox = services.node_inbox("mqtt", auth_cache_s=config.auth_cache_s, clock=clock)
    return MqttBridge(inbox, config, data_dir=services.config.data_dir)


@contextlib.asynccontextmanager
async def bridge_running(services: Services) -> AsyncIterator[MqttBridge | None]:
    """Run the bridge while the block runs when `services.config.mqtt` is set (else None)."""
    if services.config.mqtt is None:
        yield None
        return
    accounts = services.nodes.broker_logins.accounts
    if accounts.manages_logins:
        # Before the bridge subscribes: its shared subscriptions need its role.
        try:
            await anyio.to_thread.run_sync(accounts.ensure_control_plane)
        except UnavailableError as exc:
            logging.getLogger(__name__).warning(
                "could not set the control plane's broker role (the reconcile retries): %s", exc
            )
    bridge = mqtt_bridge(services, services.config.mqtt)
    bridge.start()
    delivery = MqttDelivery(bridge)
    services.delivery.attach(delivery)  # pins ring the doorbell from now on
    try:
        yield bridge
    finally:
        services.delivery.detach(delivery)
        # Shielded: the lifespan's task group is usually cancelled by the time we get here.
        with anyio.CancelScope(shield=True):
            await anyio.to_thread.run_sync(bridge.stop)


def _director_signer(
    config: ServiceConfig, directory: Path, sessions: sessionmaker[Session]
) -> Signer:
    """The director's first key: behind `director_signer_uri`, or `director/director.key`,
    made only for a control plane with no fleet and no node yet, or with `init_keys`."""
    if config.director_signer_uri is not None:
        if config.director_public_key is None:
            raise InvalidInputError(
                "director_signer_uri needs director_public_key (the key's .pub file)"
            )
        public = load_public_key(config.director_public_key)
        return signer_from_uri(config.director_signer_uri, public)
    with sessions() as session:
        fresh = (
            session.scalar(select(FleetRow.id).limit(1)) is None
            and session.scalar(select(NodeRow.id).limit(1)) is None
        )
    return load_or_create_director_key(directory, create=fresh or config.init_keys)


def _certificate_authority(
    config: ServiceConfig, keys_dir: Path, sessions: sessionmaker[Session], now: datetime
) -> CertificateAuthority:
    """The node CA: `<keys_dir>/ca/`, or an existing `<data_dir>/ca/` (where it lived
    before the keys directory held it; read, never moved). A new one is made only for a
    control plane with no node yet, or with `init_keys`: every enrolled node trusts the
    old one and would refuse the server certificate a new CA signs."""
    shared = keys_dir / "ca"
    legacy = config.data_dir / "ca"
    if not (shared / CA_KEY_FILE).exists() and (legacy / CA_KEY_FILE).exists():
        return CertificateAuthority.load_or_create(legacy, now=now)
    if not (shared / CA_KEY_FILE).exists() and not config.init_keys:
        with sessions() as session:
            if session.scalar(select(NodeRow.id).limit(1)) is not None:
                raise UnavailableError(
                    f"the node CA {shared / CA_KEY_FILE} is missing, and this control plane "
                    "already has nodes: a new CA would sign a server certificate every node "
                    "refuses. Restore it (every replica must share the keys directory, "
                    "--keys-dir), or start once with --init-keys to make a new one and then "
                    "re-enroll every node",
                    path=str(shared / CA_KEY_FILE),
                )
    return CertificateAuthority.load_or_create(shared, now=now)
