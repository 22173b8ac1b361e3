"""`python -m edge_node run`: the node agent's entry point (`edgefleet node run` execs it).

Reads the settings (file < EDGEFLEET_NODE_* env < flags), runs the agent, turns SIGTERM
and SIGINT into a drain within the configured deadline, and maps the outcome to an exit
code: 0 drained, 1 a fatal error, 2 bad configuration, 3 the control plane refuses the
node (revoked or unknown: re-enroll it).

Test hook (inert unless set): EDGEFLEET_NODE_TEST_KILL_AT=<point> makes the process
SIGKILL itself at that update step — downloading, verifying, self-testing, activated,
active, failed or reverted (see `edge_node.agent.update_task`) — so tests can check that a
restart converges from every step. It is not a setting; never set it on a real node.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
from pathlib import Path
from typing import Final

import anyio

from edge_node.agent import EXIT_CONFIG, EXIT_OK, Agent, AgentError
from edge_node.agent.update_task import FaultPoint
from edge_node.clock import SystemClock
from edge_node.config import (
    AgentConfig,
    ConfigError,
    device_settings,
    load_agent_config,
    load_node_settings,
)
from edge_node.logs import LOG_FORMAT_ENV, LOG_FORMATS, configure_logging

log = logging.getLogger("edge_node")

TEST_KILL_ENV: Final = "EDGEFLEET_NODE_TEST_KILL_AT"


def kill_at(point: str) -> FaultPoint:
    """The test hook: SIGKILL this process when the updater reaches `point`."""

    def fault(name: str) -> None:
        if name == point:
            log.warning("%s=%s: killing the process now", TEST_KILL_ENV, point)
            for handler in logging.getLogger().handlers:
                handler.flush()
            os.kill(os.getpid(), signal.SIGKILL)

    return fault


def one_line(message: str) -> str:
    """A multi-line message (a YAML parser's, with its caret) as one line for stderr."""
    parts = [line.strip() for line in message.splitlines()]
    return "; ".join(p for p in parts if p.strip("^"))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m edge_node", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("run", help="run the node agent until SIGTERM")
    run.add_argument("--config", type=Path, help="node.yaml (optional; env and flags override)")
    run.add_argument("--data-dir", type=Path, help="identity, outbox and model store")
    run.add_argument("--fleet", help="the fleet this node must belong to")
    run.add_argument("--server-grpc", help="HOST:PORT of the control plane's node port")
    run.add_argument("--enroll-grpc", help="HOST:PORT of the enrollment port (first start)")
    run.add_argument("--server-name", help="TLS name of the control plane, if not the host")
    run.add_argument("--transport", choices=["grpc", "mqtt"])
    run.add_argument("--server-mqtt", help="HOST:PORT of the MQTT broker (transport mqtt)")
    run.add_argument(
        "--server-http", help="URL of the control plane's REST API (transport mqtt), https://..."
    )
    run.add_argument(
        "--http-ca-file", type=Path, help="CA bundle for --server-http (default: system CAs)"
    )
    run.add_argument("--mqtt-tls", action="store_true", default=None, help="TLS to the MQTT broker")
    run.add_argument(
        "--mqtt-ca-file", type=Path, help="CA bundle for the broker (default: system CAs)"
    )
    run.add_argument("--bootstrap-token", help="single-use enrollment token (first start)")
    run.add_argument("--ca-file", type=Path, help="the fleet CA, PEM (first start)")
    run.add_argument("--log-level", default="INFO", help="DEBUG, INFO, WARNING, ERROR")
    run.add_argument(
        "--log-format",
        choices=LOG_FORMATS,
        default=os.environ.get(LOG_FORMAT_ENV) or "logfmt",
        help=f"logfmt (key=value, the default) or json lines; env {LOG_FORMAT_ENV}",
    )
    devices = commands.add_parser(
        "devices", help="the cameras' logins on the node's local broker (Mosquitto)"
    )
    device_commands = devices.add_subparsers(dest="devices_command", required=True)
    files = device_commands.add_parser(
        "broker-files",
        help="write Mosquitto's passwd and acl for node.yaml's devices: (then SIGHUP the broker)",
    )
    files.add_argument("--config", type=Path, required=True, help="node.yaml")
    files.add_argument("--out", type=Path, required=True, help="directory for passwd and acl")
    files.add_argument(
        "--credentials",
        type=Path,
        help="directory of the cameras' password files (default: <data_dir>/device-logins)",
    )
    files.add_argument("--group", help="the broker's group (e.g. mosquitto): passwd 0640 with it")
    return parser


def broker_files(args: argparse.Namespace) -> int:
    """`devices broker-files`: node.yaml's devices: into Mosquitto's passwd and acl."""
    from edge_node.devices.mosquitto_logins import (
        DeviceLoginError,
        ensure_password_file,
        write_broker_files,
    )

    try:
        settings = load_node_settings(args.config)
        raw = dict(settings.devices or {})
        if not raw:
            raise ConfigError("devices: node.yaml has no devices section (no cameras)")
        password_file = raw.get("password_file")
        if isinstance(password_file, str) and Path(password_file).is_absolute():
            ensure_password_file(Path(password_file))
        elif password_file is None and "password" not in raw:
            raise ConfigError(
                "devices.password_file: the gateway's broker password is needed (give a path; "
                "it is made if missing)"
            )
        devices = device_settings(raw)
        if devices is None or devices.password is None:
            raise ConfigError("devices: the section is disabled (enabled: false)")
        files = write_broker_files(
            devices,
            out_dir=args.out,
            credentials=args.credentials or settings.data_dir / "device-logins",
            gateway_password=devices.password,
            group=args.group,
            header=f"Written by `edgefleet-node devices broker-files` from {args.config};"
            " do not edit by hand.",
        )
    except (ConfigError, DeviceLoginError) as exc:
        print(f"error: {one_line(exc.message)}", file=sys.stderr)
        return EXIT_CONFIG
    print(f"passwd: {files.passwd}")
    print(f"acl: {files.acl}")
    print(f"gateway login: {devices.username}")
    for login in files.logins:
        state = "new" if login.created else "kept"
        print(f"camera {login.device_id}: password {login.password_file} ({state})")
    for device_id in files.removed:
        print(f"camera {device_id}: removed (no longer in devices.cameras)")
    print("reload the broker to apply: kill -HUP <mosquitto pid>")
    return EXIT_OK


async def serve(config: AgentConfig, fault_point: FaultPoint | None = None) -> int:
    """Run one agent until it stops; SIGTERM/SIGINT drain it. Returns the exit code."""
    agent = Agent(config, SystemClock(), fault_point=fault_point)
    failure: AgentError | None = None
    with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async with anyio.create_task_group() as group:

            async def drain_on_signal() -> None:
                async for signum in signals:
                    log.info(
                        "%s: draining within %.1fs",
                        signal.Signals(signum).name,
                        config.shutdown_deadline_s,
                    )
                    group.start_soon(agent.shutdown, config.shutdown_deadline_s)

            group.start_soon(drain_on_signal)
            try:
                await agent.run()
            except AgentError as exc:
                failure = exc
            group.cancel_scope.cancel()
    if failure is None:
        return EXIT_OK
    log.error("agent stopped: %s (exit %d)", failure.message, failure.exit_code)
    return failure.exit_code


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "devices":
        return broker_files(args)
    try:
        configure_logging(args.log_format, str(args.log_level))
    except ValueError as exc:  # an unknown --log-level
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    flags = {
        "data_dir": args.data_dir,
        "fleet": args.fleet,
        "server_grpc": args.server_grpc,
        "enroll_grpc": args.enroll_grpc,
        "server_name": args.server_name,
        "transport": args.transport,
        "server_mqtt": args.server_mqtt,
        "server_http": args.server_http,
        "http_ca_file": args.http_ca_file,
        "mqtt_tls": args.mqtt_tls,
        "mqtt_ca_file": args.mqtt_ca_file,
        "bootstrap_token": args.bootstrap_token,
        "ca_file": args.ca_file,
    }
    try:
        config = load_agent_config(args.config, flags)
    except ConfigError as exc:
        print(f"error: {one_line(exc.message)}", file=sys.stderr)
        return EXIT_CONFIG
    point = os.environ.get(TEST_KILL_ENV)
    if point:
        log.warning("test hook armed: this process kills itself at updater step %r", point)
    return anyio.run(serve, config, kill_at(point) if point else None)


if __name__ == "__main__":
    sys.exit(main())
