"""MQTT broker credentials: what `edgefleet mqtt acl` writes into Mosquitto's files."""

from __future__ import annotations

from fastapi import APIRouter
from pydantic import BaseModel

from control_plane.api.deps import ContextDep, NodeInventoryDep, ServiceConfigDep
from control_plane.link.mqtt_bridge import control_plane_account
from control_plane.link.mqtt_topics import SHARE_GROUP

router = APIRouter(prefix="/v1", tags=["mqtt"])


class MqttAccountOut(BaseModel):
    username: str
    password_hash: str


class NodeMqttAccountOut(MqttAccountOut):
    node_id: str
    fleet: str


class MqttCredentialsOut(BaseModel):
    control_plane: MqttAccountOut
    share_group: str
    nodes: list[NodeMqttAccountOut]


@router.get("/mqtt/credentials")
def mqtt_credentials(
    ctx: ContextDep, inventory: NodeInventoryDep, config: ServiceConfigDep
) -> MqttCredentialsOut:
    """Mosquitto `$7$` hashes of the control plane and of every unrevoked MQTT node (admin)."""
    nodes = inventory.mqtt_accounts(ctx)  # checks the role and audits the export
    mqtt = config.mqtt
    own = control_plane_account(config.data_dir, mqtt)
    return MqttCredentialsOut(
        control_plane=MqttAccountOut(username=own.username, password_hash=own.password_hash),
        share_group=mqtt.share_group if mqtt is not None else SHARE_GROUP,
        nodes=[
            NodeMqttAccountOut(
                username=n.username,
                password_hash=n.password_hash,
                node_id=n.node_id,
                fleet=n.fleet,
            )
            for n in nodes
        ],
    )
