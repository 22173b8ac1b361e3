"""`DynsecAccounts`: broker logins kept by Mosquitto 2's dynamic security plugin, over MQTT.

What it is for: the `BrokerAccounts` adapter that creates, binds, lists and removes
node logins by publishing JSON commands on ``$CONTROL/dynamic-security/v1`` with the
control plane's own account (the plugin's admin), and reading the answers on
``.../response``, matched by ``correlationData``. What it is not: the bridge (its own
connection, no session, no subscriptions but the answers).

Each node's login: username = client id = node id (the plugin refuses the login under
any other client id, so a node can neither take another node's session nor the
bridge's), marked ``textname`` `MANAGED_TEXTNAME` with its fleet and creation time in
``textdescription``, and one role ``edgefleet-node-<id>`` that may publish only on its
own ``status``/``health``/``events`` and subscribe only to its own
``desired``/``ack``/``cmd`` (literal topics). The control plane's role
``edgefleet-control-plane`` holds the shared subscriptions (``$share/<group>/...``,
which the plugin checks as written) and the downlink: nobody else may subscribe to them.

Deleting or disabling a login, and changing its client id or roles, makes the plugin
drop the client's connection at once (Mosquitto 2.0.11): that is the kick at revocation,
and the reason a reconcile changes only what differs.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any, Final

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.reasoncodes import ReasonCode

from control_plane.link.broker_accounts import (
    MANAGED_TEXTNAME,
    BrokerAccountsUnavailableError,
    BrokerLogin,
    node_role,
)
from control_plane.link.mqtt_bridge import MqttBridgeConfig, apply_tls
from control_plane.link.mqtt_topics import (
    DOWNLINK_LEAVES,
    ROOT,
    UPLINK_LEAVES,
    check_segment,
    node_topic,
)

__all__ = ["CONTROL_PLANE_ROLE", "DynsecAccounts", "control_plane_acls", "node_acls"]

log = logging.getLogger(__name__)

CONTROL_TOPIC: Final = "$CONTROL/dynamic-security/v1"
RESPONSE_TOPIC: Final = f"{CONTROL_TOPIC}/response"
CONTROL_PLANE_ROLE: Final = "edgefleet-control-plane"
# Commands per message: a reconcile of a large fleet goes out in slices of this.
_BATCH: Final = 100
_NOT_FOUND: Final = ("Client not found", "Role not found")


def node_acls(fleet: str, node_id: str) -> list[dict[str, Any]]:
    """A node's ACLs: publish its uplink, subscribe to its downlink, both literal."""
    return [
        *(_allow("publishClientSend", node_topic(fleet, node_id, leaf)) for leaf in UPLINK_LEAVES),
        *(_allow("subscribeLiteral", node_topic(fleet, node_id, leaf)) for leaf in DOWNLINK_LEAVES),
    ]


def control_plane_acls(share_group: str) -> list[dict[str, Any]]:
    """The control plane's: its shared subscriptions and the downlink of every node."""
    group = check_segment(share_group, "share group")
    return [
        _allow("subscribePattern", f"$share/{group}/{ROOT}/#"),
        _allow("publishClientReceive", f"{ROOT}/#"),
        *(_allow("publishClientSend", f"{ROOT}/+/+/{leaf.value}") for leaf in DOWNLINK_LEAVES),
    ]


def _allow(acltype: str, topic: str) -> dict[str, Any]:
    # The plugin's default is deny: an ACL without "allow" forbids.
    return {"acltype": acltype, "topic": topic, "allow": True}


def _canonical(acls: list[dict[str, Any]]) -> set[tuple[str, str, bool]]:
    return {(str(a["acltype"]), str(a["topic"]), bool(a.get("allow", False))) for a in acls}


class DynsecAccounts:
    """The dynamic security plugin's logins. Thread-safe: one command batch at a time.

    Connects on first use and stays connected (``clean_start``, no session); a lost
    connection is made again at the next call. Each call is tried `attempts` times,
    `backoff_s` doubling between them, each attempt bounded by `timeout_s`.
    """

    manages_logins = True

    def __init__(
        self,
        config: MqttBridgeConfig,
        password: str,
        *,
        timeout_s: float = 5.0,
        attempts: int = 3,
        backoff_s: float = 0.2,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        if not config.username:
            raise BrokerAccountsUnavailableError("dynamic security needs the bridge's username")
        self._config = config
        self._username = config.username
        self._password = password
        self._timeout_s = timeout_s
        self._attempts = max(1, attempts)
        self._backoff_s = backoff_s
        self._sleep = sleep
        self.client_id = f"{config.resolved_client_id()[:55]}-accounts"
        self._lock = threading.Lock()
        self._client: mqtt.Client | None = None
        self._ready = threading.Event()
        self._answers: dict[str, list[dict[str, Any]]] = {}
        self._pending: set[str] = set()
        self._answered = threading.Condition()

    # ------------------------------------------------------------ the port

    def ensure_control_plane(self) -> bool:
        commands = self._control_plane_changes()
        if not commands:
            return False
        # Changing the role or the client's roles drops every connection of our account,
        # this one too, often before the answer is out: send, then read back.
        self._send_and_drop(commands)
        if self._control_plane_changes():
            raise BrokerAccountsUnavailableError(
                f"the broker did not take the control plane's role {CONTROL_PLANE_ROLE}"
            )
        log.info("MQTT broker: role %s set on %s", CONTROL_PLANE_ROLE, self._username)
        return True

    def _control_plane_changes(self) -> list[dict[str, Any]]:
        wanted = control_plane_acls(self._config.share_group)
        role, client = self._call(
            [
                {"command": "getRole", "rolename": CONTROL_PLANE_ROLE},
                {"command": "getClient", "username": self._username},
            ],
            tolerate=_NOT_FOUND,
        )
        if "error" in client:
            raise BrokerAccountsUnavailableError(
                f"the broker has no dynamic-security client {self._username!r} "
                "(the control plane's own account must be the plugin's admin)"
            )
        commands: list[dict[str, Any]] = []
        if "error" in role:
            commands.append(
                {"command": "createRole", "rolename": CONTROL_PLANE_ROLE, "acls": wanted}
            )
        elif _canonical(role.get("data", {}).get("role", {}).get("acls", [])) != _canonical(wanted):
            commands.append(
                {"command": "modifyRole", "rolename": CONTROL_PLANE_ROLE, "acls": wanted}
            )
        roles = {
            r.get("rolename") for r in client.get("data", {}).get("client", {}).get("roles", [])
        }
        if CONTROL_PLANE_ROLE not in roles:
            commands.append(
                {
                    "command": "addClientRole",
                    "username": self._username,
                    "rolename": CONTROL_PLANE_ROLE,
                }
            )
        return commands

    def add_node(self, node_id: str, fleet: str, password: str, *, now: datetime) -> None:
        role = node_role(node_id)
        self._call(
            [
                {"command": "createRole", "rolename": role, "acls": node_acls(fleet, node_id)},
                {
                    "command": "createClient",
                    "username": check_segment(node_id, "node"),
                    "password": password,
                    "clientid": node_id,
                    "textname": MANAGED_TEXTNAME,
                    "textdescription": _description(fleet, now),
                    "roles": [{"rolename": role}],
                },
            ],
            tolerate=("Role already exists",),
        )

    def remove_node(self, node_id: str) -> None:
        self._call(
            [
                {"command": "deleteClient", "username": node_id},
                {"command": "deleteRole", "rolename": node_role(node_id)},
            ],
            tolerate=_NOT_FOUND,
        )

    def bind_node(self, node_id: str, fleet: str) -> None:
        role = node_role(node_id)
        self._call(
            [
                {"command": "createRole", "rolename": role, "acls": node_acls(fleet, node_id)},
                {"command": "setClientId", "username": node_id, "clientid": node_id},
                {"command": "modifyClient", "username": node_id, "roles": [{"rolename": role}]},
                {"command": "enableClient", "username": node_id},
            ],
            tolerate=("Role already exists",),
        )

    def logins(self) -> Mapping[str, BrokerLogin]:
        (answer,) = self._call([{"command": "listClients", "verbose": True}])
        found: dict[str, BrokerLogin] = {}
        for client in answer.get("data", {}).get("clients", []):
            if not isinstance(client, dict) or client.get("textname") != MANAGED_TEXTNAME:
                continue
            fleet, created = _parse_description(str(client.get("textdescription", "")))
            username = str(client.get("username", ""))
            found[username] = BrokerLogin(
                node_id=username,
                fleet=fleet,
                clientid=client.get("clientid"),
                roles=tuple(str(r.get("rolename")) for r in client.get("roles", [])),
                disabled=bool(client.get("disabled", False)),
                created_at=created,
            )
        return found

    def close(self) -> None:
        with self._lock:
            client, self._client = self._client, None
            self._ready.clear()
        if client is not None:
            client.disconnect()
            client.loop_stop()

    # ------------------------------------------------------------ the wire

    def _call(
        self, commands: list[dict[str, Any]], *, tolerate: tuple[str, ...] = ()
    ) -> list[dict[str, Any]]:
        """The plugin's answers to `commands`, in order; an error not in `tolerate`
        raises. Sent in slices of `_BATCH`, each retried while the broker is away."""
        answers: list[dict[str, Any]] = []
        for start in range(0, len(commands), _BATCH):
            answers += self._call_batch(commands[start : start + _BATCH])
        for command, answer in zip(commands, answers, strict=True):
            error = answer.get("error")
            if error and error not in tolerate:
                raise BrokerAccountsUnavailableError(
                    f"the broker refused {command['command']}: {error}",
                    command=command["command"],
                    broker_error=str(error),
                )
        return answers

    def _send_and_drop(self, commands: list[dict[str, Any]]) -> None:
        """Publish `commands` once and wait for their answer or for the broker to drop
        this connection, whichever comes first; then close it."""
        with self._lock:
            client = self._connected()
            info = client.publish(CONTROL_TOPIC, json.dumps({"commands": commands}), qos=1)
            deadline = time.monotonic() + self._timeout_s
            while self._ready.is_set() and time.monotonic() < deadline:
                if info.is_published():
                    break
                time.sleep(0.01)
            self._drop()

    def _call_batch(self, commands: list[dict[str, Any]]) -> list[dict[str, Any]]:
        delay = self._backoff_s
        for attempt in range(1, self._attempts + 1):
            try:
                with self._lock:
                    return self._exchange(commands)
            except BrokerAccountsUnavailableError as exc:
                if attempt == self._attempts:
                    raise
                log.warning("MQTT broker accounts: %s; retrying in %.1fs", exc, delay)
                self._sleep(delay)
                delay *= 2
        raise AssertionError("unreachable")  # pragma: no cover

    def _exchange(self, commands: list[dict[str, Any]]) -> list[dict[str, Any]]:
        client = self._connected()
        correlation = uuid.uuid4().hex
        tagged = [{**c, "correlationData": correlation} for c in commands]
        with self._answered:
            self._pending.add(correlation)
        try:
            client.publish(CONTROL_TOPIC, json.dumps({"commands": tagged}), qos=1)
            # Real time: it bounds a wait on the broker, not a decision.
            deadline = time.monotonic() + self._timeout_s
            answers: list[dict[str, Any]] | None = None
            with self._answered:
                while True:
                    answers = self._answers.pop(correlation, None)
                    left = deadline - time.monotonic()
                    if answers is not None or left <= 0 or not self._ready.is_set():
                        break
                    self._answered.wait(min(left, 0.1))
            if answers is None:
                self._drop()  # never under the condition: paho's thread may wait on it
                raise BrokerAccountsUnavailableError(
                    "no answer from the broker's dynamic security plugin within "
                    f"{self._timeout_s:.0f}s (is the plugin loaded?)"
                )
        finally:
            with self._answered:
                self._pending.discard(correlation)
                self._answers.pop(correlation, None)
        if len(answers) != len(commands):
            raise BrokerAccountsUnavailableError("the plugin's answer does not match the commands")
        return answers

    def _connected(self) -> mqtt.Client:
        if self._client is not None and self._ready.is_set():
            return self._client
        self._drop()
        config = self._config
        client = mqtt.Client(
            CallbackAPIVersion.VERSION2,
            client_id=self.client_id,
            protocol=mqtt.MQTTv5,
            reconnect_on_failure=False,
        )
        apply_tls(client, config)
        client.username_pw_set(self._username, self._password)
        refused: list[str] = []
        client.on_connect = lambda c, _u, _f, reason, _p: self._on_connect(c, reason, refused)
        client.on_subscribe = lambda _c, _u, _m, reasons, _p: self._on_subscribe(reasons, refused)
        client.on_disconnect = lambda *_args: self._ready.clear()
        client.on_message = self._on_message
        client.connect_timeout = self._timeout_s
        try:
            client.connect(config.host, config.port, keepalive=config.keepalive_s)
        except (OSError, ValueError) as exc:
            raise BrokerAccountsUnavailableError(
                f"cannot reach the MQTT broker at {config.host}:{config.port}: {exc}"
            ) from exc
        client.loop_start()
        self._client = client
        if not self._ready.wait(self._timeout_s) or refused:
            self._drop()
            raise BrokerAccountsUnavailableError(
                "the MQTT broker did not let the control plane manage accounts: "
                + (", ".join(refused) or f"no answer within {self._timeout_s:.0f}s")
            )
        return client

    def _drop(self) -> None:
        client, self._client = self._client, None
        self._ready.clear()
        if client is not None:
            client.disconnect()
            client.loop_stop()

    def _on_connect(self, client: mqtt.Client, reason: ReasonCode, refused: list[str]) -> None:
        if reason.is_failure:
            refused.append(f"CONNECT refused: {reason}")
            self._ready.set()  # wakes the waiter, which sees `refused`
            return
        client.subscribe(RESPONSE_TOPIC, qos=1)

    def _on_subscribe(self, reasons: list[ReasonCode], refused: list[str]) -> None:
        failed = [str(r) for r in reasons if r.is_failure]
        if failed:
            refused.append(f"subscribing to {RESPONSE_TOPIC} refused: {', '.join(failed)}")
        self._ready.set()

    def _on_message(self, _client: mqtt.Client, _userdata: Any, message: mqtt.MQTTMessage) -> None:
        try:
            answer = json.loads(message.payload)
            responses = [r for r in answer["responses"] if isinstance(r, dict)]
        except (ValueError, KeyError, TypeError):
            log.warning("unreadable answer on %s", message.topic)
            return
        correlation = responses[0].get("correlationData") if responses else None
        with self._answered:
            if correlation not in self._pending:
                return  # another admin's answer (every admin reads the same topic)
            self._answers[str(correlation)] = responses
            self._answered.notify_all()


def _description(fleet: str, now: datetime) -> str:
    return f"fleet={check_segment(fleet, 'fleet')} created={now.astimezone(UTC).isoformat()}"


def _parse_description(text: str) -> tuple[str | None, datetime | None]:
    fields = dict(part.split("=", 1) for part in text.split() if "=" in part)
    created: datetime | None = None
    try:
        created = datetime.fromisoformat(fields["created"]) if "created" in fields else None
    except ValueError:
        created = None
    return fields.get("fleet"), created
