"""A node as its own process for the "nothing lost" tests: outbox + Uplink over MqttNodeLink.

    python -m tests.edge_node.mqtt_node_process --outbox F --port P --fleet F --node N \
        --count 100 --rate 50            (password in $EDGEFLEET_TEST_MQTT_PASSWORD)

Prints ``pending <id>`` for every record already in the outbox at start (left by a killed
predecessor), ``ready``, then ``appended <id>`` after each append has committed, and
``done`` after the last. It keeps draining the outbox until SIGTERM (or SIGKILL).
The append and its line happen with no await in between, so no record can be acked
(and leave the outbox) before its line is printed.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
from pathlib import Path

import anyio

from edge_node.clock import SystemClock
from edge_node.link.base import Backoff
from edge_node.link.mqtt_link import MqttLinkConfig, MqttNodeLink
from edge_node.link.uplink import Uplink, UplinkConfig
from edge_node.outbox import Outbox
from protos.edgefleet.fleet.v1 import link_pb2


def say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


async def main(args: argparse.Namespace) -> None:
    outbox = Outbox.open(
        Path(args.outbox), node_id=args.node, budget_bytes=64 << 20, clock=SystemClock()
    )
    for record in outbox.pending(1_000_000, 1 << 40):
        say(f"pending {record.id}")
    say("ready")
    link = MqttNodeLink(
        MqttLinkConfig(
            fleet=args.fleet,
            node_id=args.node,
            username=args.node,
            password=os.environ["EDGEFLEET_TEST_MQTT_PASSWORD"],
            port=args.port,
            connect_timeout_s=3.0,
            keepalive_s=5,
        )
    )
    uplink = Uplink(
        outbox,
        link,
        clock=SystemClock(),
        config=UplinkConfig(
            batch_records=20,
            idle_poll_s=0.02,
            heartbeat_s=1.0,
            ack_timeout_s=args.ack_timeout,
            backoff=Backoff(initial_s=0.05, cap_s=0.5),
        ),
    )
    stop = anyio.Event()

    async def append_steadily() -> None:
        for i in range(args.count):
            kind = "health" if i % 5 == 4 else "event"
            record = outbox.append(kind, json.dumps({"i": i}).encode())  # see the docstring
            say(f"appended {record.id}")
            await anyio.sleep(1 / args.rate)
        say("done")

    async def stop_on_sigterm() -> None:
        with anyio.open_signal_receiver(signal.SIGTERM) as signals:
            async for _ in signals:
                stop.set()
                return

    async with anyio.create_task_group() as tasks:
        tasks.start_soon(stop_on_sigterm)
        tasks.start_soon(append_steadily)
        await uplink.run(lambda: link_pb2.Hello(agent_version="0.1.0-test"), stop)
        tasks.cancel_scope.cancel()
    await link.close()
    outbox.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--outbox", required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--fleet", required=True)
    parser.add_argument("--node", required=True)
    parser.add_argument("--count", type=int, default=100)
    parser.add_argument("--rate", type=float, default=50.0)
    parser.add_argument("--ack-timeout", type=float, default=2.0)
    anyio.run(main, parser.parse_args())
