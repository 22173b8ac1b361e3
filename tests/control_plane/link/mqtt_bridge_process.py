"""A control-plane replica as its own process, running only the MQTT bridge (for SIGKILL tests).

    python -m tests.control_plane.link.mqtt_bridge_process --data-dir D --database-url URL \
        --port P --client-id ID        (password in $EDGEFLEET_TEST_MQTT_PASSWORD)

Prints ``connected`` once the bridge holds its session, then runs until SIGTERM/SIGKILL.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
from pathlib import Path

from control_plane.link.mqtt_bridge import MqttBridgeConfig
from control_plane.services import ServiceConfig, build_services, mqtt_bridge


def main(args: argparse.Namespace) -> int:
    data_dir = Path(args.data_dir)
    services = build_services(
        ServiceConfig(
            data_dir=data_dir,
            database_url=args.database_url,
            artifacts_url=(data_dir / "artifacts").as_uri(),
        )
    )
    bridge = mqtt_bridge(
        services,
        MqttBridgeConfig(
            port=args.port,
            password=os.environ["EDGEFLEET_TEST_MQTT_PASSWORD"],
            client_id=args.client_id,
            workers=2,
            reconnect_min_s=1,
            reconnect_max_s=1,
            keepalive_s=5,
        ),
    )
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    bridge.start()
    if not bridge.wait_connected(20):
        print("no connection", file=sys.stderr)
        return 1
    print("connected", flush=True)
    stop.wait()
    bridge.stop()
    services.close()
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--data-dir", required=True)
    parser.add_argument("--database-url", required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--client-id", required=True)
    sys.exit(main(parser.parse_args()))
