"""The agent's transport, chosen by `transport` in node.yaml: the link for messages, the
source of TUF metadata and models, and whether the certificate is renewed.

    grpc  `GrpcNodeLink` (mTLS); models over the same link; certificate renewal on.
    mqtt  `MqttNodeLink` (the broker login from enrollment); models over HTTPS from the
          control plane's TUF routes (`HttpsRepository`); no renewal: an MQTT node
          presents its certificate nowhere (docs/adr/0016).

A newly enrolled MQTT node is usually refused by the broker until the operator runs
`edgefleet mqtt acl` and reloads it. `LoginGrace` turns such refusals into outages for
`login_grace_s` after enrollment (the uplink retries with backoff); later, a refusal is
final, as on gRPC. Not here: what travels on the link (`edge_node.link.uplink`).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import datetime, timedelta

from edge_node.clock import Clock
from edge_node.config import AgentConfig
from edge_node.enroll import EnrollmentFiles, is_loopback_url
from edge_node.link.base import LinkRefusedError, LinkUnavailableError, NodeLink
from edge_node.link.grpc_link import GrpcNodeLink
from edge_node.link.mqtt_link import MqttLinkConfig, MqttNodeLink
from edge_node.updater.https_fetch import HttpsRepository
from edge_node.updater.source import RepositorySource
from protos.edgefleet.fleet.v1 import link_pb2

__all__ = ["BrokerLoginRefusedError", "LoginGrace", "NodeTransport", "open_transport"]

log = logging.getLogger(__name__)


class BrokerLoginRefusedError(LinkRefusedError):
    """The broker refuses the node's login after its grace: not in the broker's password
    file (run `edgefleet mqtt acl` and reload it) or revoked (enroll again)."""

    title = "broker login refused"


@dataclass(frozen=True, slots=True)
class NodeTransport:
    link: NodeLink
    source: RepositorySource
    grpc: GrpcNodeLink | None  # for certificate renewal; None when it does not apply
    repository: HttpsRepository | None = None

    async def close(self) -> None:
        try:
            await self.link.close()
        finally:
            if self.repository is not None:
                await self.repository.close()


def open_transport(config: AgentConfig, files: EnrollmentFiles, clock: Clock) -> NodeTransport:
    """The link and model source for `config.transport` (nothing connects yet).

    Raises `StorageError` when an MQTT node has no broker login on disk.
    """
    mqtt = config.mqtt
    if mqtt is None:
        if config.link is None:
            raise ValueError("AgentConfig needs `link` (grpc) or `mqtt`")
        link = GrpcNodeLink(config.link, files.credentials)
        return NodeTransport(link=link, source=link, grpc=link)
    login = files.mqtt_login()
    if not mqtt.tls and not is_loopback_url(f"mqtt://{mqtt.host}:{mqtt.port}"):
        log.warning(
            "the broker login of node %s travels in clear text to %s:%d: set mqtt_tls: "
            "true unless this network is private (docs/operator-guide.md, An MQTT node)",
            files.node_id,
            mqtt.host,
            mqtt.port,
        )
    mqtt_link = MqttNodeLink(
        MqttLinkConfig(
            fleet=files.fleet,
            node_id=files.node_id,
            username=login.username,
            password=login.password,
            host=mqtt.host,
            port=mqtt.port,
            keepalive_s=mqtt.keepalive_s,
            connect_timeout_s=mqtt.connect_timeout_s,
            tls=mqtt.tls,
            ca_file=None if mqtt.ca_file is None else str(mqtt.ca_file),
        )
    )
    enrolled_at = files.enrolled_at or clock.now()
    grace_until = enrolled_at + timedelta(seconds=mqtt.login_grace_s)
    repository = HttpsRepository(mqtt.repository(files.fleet))
    return NodeTransport(
        link=LoginGrace(mqtt_link, clock, grace_until, node_id=files.node_id),
        source=repository,
        grpc=None,
        repository=repository,
    )


class LoginGrace(NodeLink):
    """A link whose refusals at connect are outages until `until` (see the module)."""

    def __init__(self, inner: NodeLink, clock: Clock, until: datetime, *, node_id: str) -> None:
        self._inner = inner
        self._clock = clock
        self._until = until
        self._node_id = node_id
        self.refusals_forgiven = 0

    @property
    def inner(self) -> NodeLink:
        return self._inner

    async def connect(self, hello: link_pb2.Hello) -> None:
        try:
            await self._inner.connect(hello)
        except LinkRefusedError as exc:
            now = self._clock.now()
            if now < self._until:
                self.refusals_forgiven += 1
                log.warning(
                    "the broker refuses node %s (%s); it enrolled recently: run `edgefleet "
                    "mqtt acl` and reload the broker. Retrying until %s",
                    self._node_id,
                    exc.message,
                    self._until.isoformat(),
                )
                raise LinkUnavailableError(
                    f"refused within the login grace: {exc.message}", **exc.fields
                ) from exc
            raise BrokerLoginRefusedError(
                f"the MQTT broker refuses node {self._node_id}: {exc.message}", **exc.fields
            ) from exc

    async def send(self, message: link_pb2.NodeMessage) -> None:
        await self._inner.send(message)

    def incoming(self) -> AsyncIterator[link_pb2.ControlMessage]:
        return self._inner.incoming()

    async def fetch_metadata(self, filename: str) -> bytes:
        return await self._inner.fetch_metadata(filename)

    def fetch_artifact(
        self, target_path: str, sha256: str, offset: int = 0
    ) -> AsyncIterator[bytes]:
        return self._inner.fetch_artifact(target_path, sha256, offset)

    async def close(self) -> None:
        await self._inner.close()
