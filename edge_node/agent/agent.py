"""`Agent`: the node's one supervised process (design §5).

`run()` enrolls on first start (or loads the identity and finishes an interrupted
renewal), opens the outbox, starts the updater (crash recovery, then the journal's active
model is served again), and supervises its tasks in one task group: the uplink (outbox →
control plane), certificate renewal, the health producer, the inference runtime
(`edge_node.agent.runtime_host`: loads and hot-swaps models), the update task
(`edge_node.agent.update_task`: assignments from the control plane, applied one at a
time, and the watchdog; it reaches the runtime only through its `ModelHost` port), camera
capture (`edge_node.capture`: streams with a `source` are
fed into the pipeline once a model serves; its failures are counted and retried, never
fatal), and any extra components. A task that fails is fatal: it is
logged with its reason, the others are cancelled, and `run()` raises an `AgentError`
whose `exit_code` the entry point returns. `shutdown()` sets stop, lets the tasks drain
until a deadline, then cancels what remains; it is safe to call twice and before or
after `run()`.

The results feed (`edge_node.results`) is one more task: a bounded sample of what the
model saw goes into the outbox as best-effort `results` records. The aggregation
(`edge_node.agent.aggregation_task`, with `aggregation:` in node.yaml) is another: every
result through the rules file's rules, events into the outbox as durable `event` records
under their deterministic ids; a rules file it cannot use turns it off, never the node.
The device gateway (`edge_node.agent.device_task`, with `devices:` in node.yaml) is one
more: cameras' results over the local broker into the same aggregation (counted only
when there is none), stopped before the aggregation's last flush.

The update task is built in rather than a `Component`: it builds the Hello (what the
node runs), and needs the control messages and the reconnects, which components do not
see. A component named "updater" replaces it (tests do that).

Not here: reading settings (`edge_node.config`), signals (`edge_node.__main__`), the
update steps (`edge_node.updater`), full telemetry (later: this health record is
deliberately small).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Final

import anyio
import anyio.to_thread

from edge_node.agent.aggregation_task import AggregationTask
from edge_node.agent.device_task import DeviceTask
from edge_node.agent.errors import AgentError, EnrollmentError, NodeRefusedError, TaskFailedError
from edge_node.agent.runtime_host import RuntimeHost
from edge_node.agent.transport import BrokerLoginRefusedError, NodeTransport, open_transport
from edge_node.agent.update_task import FaultPoint, UpdateTask, UpdateTaskSettings
from edge_node.capture import CaptureService, CaptureStats
from edge_node.clock import TaskClock
from edge_node.config import AgentConfig
from edge_node.enroll import IDENTITY_FILE, EnrollmentFiles, enroll_over_grpc, enroll_over_https
from edge_node.errors import ClosedError, EdgeNodeError, InvalidInputError, OutboxFullError
from edge_node.fsutil import atomic_write
from edge_node.identity import recover_pending_renewal, run_renewal
from edge_node.link.base import (
    Backoff,
    LinkError,
    LinkRefusedError,
    LinkUnavailableError,
    NodeLink,
)
from edge_node.link.uplink import ControlHandler, Uplink
from edge_node.outbox import Outbox
from edge_node.results.feed import ResultsFeed
from edge_node.results.sampling import ResultSampler
from edge_node.runtime.pipeline import InferencePipeline
from edge_node.runtime.timing import SystemTicker
from edge_node.telemetry import (
    HEALTH_SCHEMA,
    ErrorLogHandler,
    SystemProbe,
    Telemetry,
)
from edge_node.updater.host import ModelBundle, ModelHost
from protos.bundle.results import InferenceResult
from protos.edgefleet.fleet.v1 import link_pb2

__all__ = [
    "HEALTH_SCHEMA",
    "Agent",
    "AgentContext",
    "Component",
]

log = logging.getLogger(__name__)

# The drift baselines of every model version seen, kept across restarts.
BASELINES_FILE: Final = "telemetry-baselines.json"
_ENROLL_BACKOFF: Final = Backoff(initial_s=1.0, cap_s=60.0)


@dataclass(frozen=True, slots=True)
class AgentContext:
    """What a component (one replacing the update task) gets: the node's identity,
    outbox, link and clock, and the runtime's `ModelHost` to serve a verified model."""

    config: AgentConfig
    files: EnrollmentFiles
    outbox: Outbox
    link: NodeLink
    clock: TaskClock
    host: ModelHost


# A supervised extra task: runs until `stop` is set; raising is fatal for the agent.
Component = Callable[[AgentContext, anyio.Event], Awaitable[None]]


class Agent:
    def __init__(
        self,
        config: AgentConfig,
        clock: TaskClock,
        *,
        components: Mapping[str, Component] | None = None,
        on_control: ControlHandler | None = None,
        fault_point: FaultPoint | None = None,
    ) -> None:
        """`on_control` sees every control message (after the updater took its own);
        `fault_point` is the update task's test seam (see `edge_node.agent.update_task`)."""
        self._config = config
        self._clock = clock
        self._components = dict(components or {})
        self._on_control = on_control
        self._stop = anyio.Event()
        self._done = anyio.Event()
        self._scope: anyio.CancelScope | None = None
        self._started = False
        self._failure: AgentError | None = None
        self._started_at: datetime | None = None
        self._fault_point = fault_point
        self._host = RuntimeHost(config, clock, on_result=self._count_result, stopping=self._stop)
        self.ready = anyio.Event()  # set once enrolled, the outbox open and tasks started
        self.files: EnrollmentFiles | None = None
        self.uplink: Uplink | None = None
        self.results_feed: ResultsFeed | None = None
        # The rules over the node's own results, once the outbox is open (aggregation:).
        self.aggregation: AggregationTask | None = None
        # The cameras over the local broker, once the outbox is open (devices:).
        self.devices: DeviceTask | None = None
        self.link: NodeLink | None = None  # the transport's link, once enrolled
        self.updater: UpdateTask | None = None
        self.health_dropped = 0
        self.health_failed = 0  # reports that could not be built (logged)
        self._baselines_unsaved = False  # the last save of drift baselines failed (logged once)
        # Camera sources feed the pipeline serving now (none before a model is loaded).
        self.capture = CaptureService(config.camera_sources, lambda: self._host.pipeline, clock)
        ticker = SystemTicker()
        # Latency per model version, drift, RSS trend and the box (edge_node.telemetry):
        # the pipeline records every frame, `_report_health` asks for a report per window.
        self.telemetry = Telemetry(
            config.telemetry,
            clock=clock,
            probe=SystemProbe(config.data_dir, ticker=ticker),
            ticker=ticker,
        )
        # Every result is offered; a bounded sample reaches the control plane (the
        # `results` task below). Offering is O(1) on the pipeline's threads.
        self.results = ResultSampler(config.results)

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    @property
    def host(self) -> RuntimeHost:
        """What serves models (`serve(bundle)` starts the runtime or hot-swaps it); the
        update task and components hold it too."""
        return self._host

    @property
    def pipeline(self) -> InferencePipeline | None:
        """The runtime, once a model is loaded (frames are submitted to it)."""
        return self._host.pipeline

    def capture_stats(self) -> Mapping[str, CaptureStats]:
        """Per stream with a camera source: frames captured and failures by reason."""
        return self.capture.stats()

    # ------------------------------------------------------------------ lifecycle

    async def run(self) -> None:
        """Run until `shutdown()` (returns) or a fatal error (raises `AgentError`)."""
        if self._started:
            raise ClosedError("Agent.run() was already called; build a new agent")
        self._started = True
        try:
            with anyio.CancelScope() as scope:
                self._scope = scope
                if not self._stop.is_set():
                    await self._run()
        except AgentError as exc:
            self._fail(exc)
        except Exception as exc:
            self._fail(_classify("startup", exc))
        finally:
            self._done.set()
        if self._failure is not None:
            raise self._failure

    async def shutdown(self, deadline_s: float | None = None) -> None:
        """Stop: drain until `deadline_s` (default from the config), then cancel the rest."""
        deadline = self._config.shutdown_deadline_s if deadline_s is None else deadline_s
        self._stop.set()
        if not self._started:
            return
        with anyio.move_on_after(deadline):
            await self._done.wait()
        if not self._done.is_set():
            log.warning("the agent did not drain within %.1fs; cancelling its tasks", deadline)
            if self._scope is not None:
                self._scope.cancel()
            await self._done.wait()

    # ------------------------------------------------------------------ internals

    async def _run(self) -> None:
        config = self._config
        files = await self._identity()
        if files is None:  # stopped while waiting to enroll
            return
        self.files = files
        outbox = await anyio.to_thread.run_sync(
            lambda: Outbox.open(
                config.outbox_path,
                node_id=files.node_id,
                budget_bytes=config.outbox_budget_bytes,
                clock=self._clock,
                results_share=config.results.outbox_share,
                max_pending_results=config.results.max_pending,
            )
        )
        try:
            transport = open_transport(config, files, self._clock)
        except Exception:
            await anyio.to_thread.run_sync(outbox.close)
            raise
        link = self.link = transport.link
        updater = None
        if config.updater.enabled and "updater" not in self._components:
            settings = UpdateTaskSettings(
                config.updater,
                data_dir=config.data_dir,
                memory_budget_bytes=config.memory_budget_bytes,
                agent_version=config.agent_version,
                initial_model=config.model_path,
                retry=Backoff(
                    initial_s=config.updater.retry_initial_s, cap_s=config.updater.retry_max_s
                ),
            )
            updater = UpdateTask(
                settings,
                files=files,
                link=link,
                clock=self._clock,
                host=self._host,
                source=transport.source,
                fault_point=self._fault_point,
                shadow_host=self._host,
            )
        self.updater = updater
        uplink = Uplink(
            outbox,
            link,
            clock=self._clock,
            config=config.uplink,
            on_control=self._control,
            on_connect=None if updater is None else updater.on_connect,
        )
        self.uplink = uplink
        self._started_at = self._clock.now()
        context = AgentContext(config, files, outbox, link, self._clock, self._host)
        stop = self._stop
        tasks: dict[str, Callable[[], Awaitable[None]]] = {
            "uplink": lambda: uplink.run(lambda: self._hello(), stop),
            "health": lambda: self._report_health(outbox, uplink, files),
            "runtime": self._run_runtime,
        }
        if config.camera_sources:
            tasks["capture"] = lambda: self.capture.run(stop)
        if config.results.enabled:
            feed = self.results_feed = ResultsFeed(self.results, outbox, self._clock.monotonic)
            tasks["results"] = lambda: feed.run(stop)
        aggregation = None
        if config.aggregation.enabled:
            aggregation = self.aggregation = AggregationTask(
                config.aggregation, outbox, self._clock
            )
        devices = None
        if config.devices is not None:
            # Half the drain deadline for the gateway, the rest for the last events.
            devices = self.devices = DeviceTask(
                config.devices,
                aggregation,
                self._clock,
                stop_deadline_s=config.shutdown_deadline_s / 2,
            )
            tasks["devices"] = lambda: devices.run(stop)
        if aggregation is not None:
            inputs_closed = None if devices is None else devices.stopped
            tasks["aggregation"] = lambda: aggregation.run(stop, inputs_closed=inputs_closed)
        grpc_link = transport.grpc
        if grpc_link is not None:  # an MQTT node presents its certificate nowhere
            tasks["renewal"] = lambda: run_renewal(
                grpc_link, files, stop, clock=self._clock, config=config.renewal
            )
        if updater is not None:
            tasks["updater"] = lambda: updater.run(stop)
        for name, component in self._components.items():
            tasks[name] = _bind(component, context, stop)
        try:
            if updater is not None:
                # Before the uplink's first Hello, which reports what the journal says.
                try:
                    await updater.start()
                except Exception as exc:
                    raise _classify("updater", exc) from exc
            async with anyio.create_task_group() as group:
                for name, task in tasks.items():
                    group.start_soon(self._supervise, name, task, group.cancel_scope)
                log.info(
                    "agent running as node %s (fleet %s) with tasks %s",
                    files.node_id,
                    files.fleet,
                    ", ".join(tasks),
                )
                self.ready.set()
        finally:
            with anyio.CancelScope(shield=True):
                await self._close(transport, outbox)

    async def _supervise(
        self, name: str, task: Callable[[], Awaitable[None]], scope: anyio.CancelScope
    ) -> None:
        try:
            await task()
        except Exception as exc:
            failure = _classify(name, exc)
            log.error("task %s failed: %s; stopping the agent", name, failure.message)
            self._fail(failure)
            self._stop.set()
            scope.cancel()
        else:
            if not self._stop.is_set():
                log.warning("task %s ended on its own while the agent runs", name)

    def _fail(self, failure: AgentError) -> None:
        if self._failure is None:  # the first failure is the cause; the rest follow from it
            self._failure = failure

    async def _identity(self) -> EnrollmentFiles | None:
        config = self._config
        if (config.data_dir / IDENTITY_FILE).exists():
            files = await anyio.to_thread.run_sync(EnrollmentFiles.load, config.data_dir)
            recovery = await anyio.to_thread.run_sync(recover_pending_renewal, files)
            log.info("loaded node %s (renewal recovery: %s)", files.node_id, recovery.value)
        else:
            enrolled = await self._enroll()
            if enrolled is None:
                return None
            files = enrolled
        if files.transport != config.transport:
            raise EnrollmentError(
                f"{config.data_dir} is enrolled for transport {files.transport}, the config "
                f"says {config.transport}; enroll the node again into an empty data dir",
                reason="transport-mismatch",
            )
        if config.fleet is not None and files.fleet != config.fleet:
            raise TaskFailedError(
                f"{config.data_dir} is enrolled in fleet {files.fleet!r}, the config says "
                f"{config.fleet!r}; use another data dir or fix the config",
                task="startup",
            )
        return files

    async def _enroll(self) -> EnrollmentFiles | None:
        """Enroll, retrying while the control plane is unreachable; None when stopped
        meanwhile. gRPC nodes at the enrollment port, MQTT nodes over HTTPS."""
        config = self._config
        enroll = self._enroll_over_https if config.mqtt is not None else self._enroll_over_grpc
        attempt = 0
        while True:
            try:
                files = await enroll()
            except LinkUnavailableError as exc:
                delay = _ENROLL_BACKOFF.delay(attempt)
                attempt += 1
                log.warning("cannot enroll yet (%s); retrying in %.1fs", exc.message, delay)
                with anyio.move_on_after(delay):
                    await self._stop.wait()
                if self._stop.is_set():
                    return None
                continue
            except LinkError as exc:
                raise EnrollmentError(
                    f"the control plane refused the enrollment: {exc.message}",
                    reason=exc.fields.get("reason"),
                ) from exc
            except InvalidInputError as exc:
                raise EnrollmentError(f"enrollment failed: {exc.message}") from exc
            log.info(
                "enrolled as node %s in fleet %s (transport %s)",
                files.node_id,
                files.fleet,
                files.transport,
            )
            return files

    async def _enroll_over_grpc(self) -> EnrollmentFiles:
        config = self._config
        if not (config.bootstrap_token and config.ca_file and config.enroll_address):
            raise EnrollmentError(
                f"{config.data_dir} holds no node identity; the first start needs "
                "bootstrap_token, ca_file and enroll_grpc"
            )
        ca_pem = await self._read_ca(config.ca_file)
        return await enroll_over_grpc(
            config.enroll_address,
            ca_pem,
            config.bootstrap_token,
            config.agent_version,
            config.data_dir,
            server_name=None if config.link is None else config.link.server_name,
            clock=self._clock,
        )

    async def _enroll_over_https(self) -> EnrollmentFiles:
        config = self._config
        mqtt = config.mqtt
        assert mqtt is not None
        if not config.bootstrap_token:
            raise EnrollmentError(
                f"{config.data_dir} holds no node identity; the first start needs "
                "bootstrap_token (and server_http)"
            )
        fleet_ca = None if config.ca_file is None else await self._read_ca(config.ca_file)
        return await enroll_over_https(
            mqtt.http_url,
            config.bootstrap_token,
            config.agent_version,
            config.data_dir,
            transport="mqtt",
            http_ca_file=mqtt.http_ca_file,
            fleet_ca_pem=fleet_ca,
            clock=self._clock,
        )

    @staticmethod
    async def _read_ca(path: Path) -> bytes:
        try:
            return await anyio.to_thread.run_sync(path.read_bytes)
        except OSError as exc:
            raise EnrollmentError(f"cannot read the CA file {path}: {exc}") from exc

    def _hello(self) -> link_pb2.Hello:
        if self.updater is not None:
            return self.updater.hello()  # it knows what the node runs
        return link_pb2.Hello(agent_version=self._config.agent_version)

    async def _control(self, message: link_pb2.ControlMessage) -> None:
        if self.updater is not None:
            await self.updater.on_control(message)
        if self._on_control is not None:
            await self._on_control(message)
        elif self.updater is None:
            log.debug("control message %s (no handler yet)", message.WhichOneof("body"))

    async def _report_health(self, outbox: Outbox, uplink: Uplink, files: EnrollmentFiles) -> None:
        """One `edgefleet.agent.health/2` report per `health_interval_s` into the outbox.

        The report is built in a worker thread (it samples the box); drift baselines are
        saved with it, so a restarted agent keeps judging drift against them.
        """
        telemetry = self.telemetry
        errors = ErrorLogHandler(telemetry)
        logging.getLogger("edge_node").addHandler(errors)
        await anyio.to_thread.run_sync(self._load_baselines)
        try:
            while not self._stop.is_set():
                try:
                    payload = await anyio.to_thread.run_sync(
                        self._health_payload, outbox, uplink, files
                    )
                except ClosedError:
                    return  # stopping: the outbox closed under the report
                except Exception:  # a report that cannot be built is skipped, never fatal
                    self.health_failed += 1
                    log.exception("could not build a health report; the next one will try")
                    payload = None
                if payload is not None:
                    try:
                        await anyio.to_thread.run_sync(outbox.append, "health", payload)
                    except OutboxFullError as exc:  # counted by the outbox; best effort
                        self.health_dropped += 1
                        log.warning("health record not stored: %s", exc.message)
                with anyio.move_on_after(self._config.health_interval_s):
                    await self._stop.wait()
        finally:
            logging.getLogger("edge_node").removeHandler(errors)

    def _health_payload(self, outbox: Outbox, uplink: Uplink, files: EnrollmentFiles) -> bytes:
        pipeline = self._host.pipeline
        use = self._host.runtime_use()
        payload = self.telemetry.report_payload(
            self._clock.now(),
            node_id=files.node_id,
            agent_version=self._config.agent_version,
            active_model=pipeline.session.label if pipeline is not None else self._host.model,
            model_runtime=None if use is None else use.to_report(),
            streams=pipeline.stats() if pipeline is not None else None,
            capture=self.capture.stats(),
            queue_depth_frames=pipeline.backlog() if pipeline is not None else None,
            outbox=outbox.stats(),
            uplink=uplink.stats,
            shadow=None if self.updater is None else self.updater.shadow_report(),
            aggregation=None if self.aggregation is None else self.aggregation.health(),
            devices=None if self.devices is None else self.devices.health(),
        )
        self._save_baselines()
        return payload

    def _baselines_path(self) -> Path:
        return self._config.data_dir / BASELINES_FILE

    def _load_baselines(self) -> None:
        path = self._baselines_path()
        try:
            data = json.loads(path.read_bytes())
            if not isinstance(data, dict):
                raise ValueError(f"a JSON object was expected, got {type(data).__name__}")
            self.telemetry.import_baselines(data)
        except FileNotFoundError:
            return
        except Exception as exc:  # unreadable, unparsable, not ours: never a crash
            # Drift then starts from fresh baselines: worse judgement, never a crash.
            log.warning("ignoring unreadable drift baselines in %s: %s", path, exc)

    def _save_baselines(self) -> None:
        data = json.dumps(self.telemetry.export_baselines(), sort_keys=True).encode()
        try:
            atomic_write(self._baselines_path(), data, mode=0o600)
        except OSError as exc:  # a full disk must not stop health reports
            # Said once while it lasts (a full disk would repeat it every health interval).
            level = logging.DEBUG if self._baselines_unsaved else logging.WARNING
            log.log(level, "could not save drift baselines: %s", exc)
            self._baselines_unsaved = True
            return
        if self._baselines_unsaved:
            log.info("drift baselines saved again")
            self._baselines_unsaved = False

    async def _run_runtime(self) -> None:
        # With the updater, it serves the journal's model (or model_path) at its start.
        if self._config.model_path is not None and self.updater is None:
            await self._host.serve(ModelBundle.local(self._config.model_path))
        await self._stop.wait()

    def _count_result(self, result: InferenceResult) -> None:
        """Every result, on the pipeline's threads (each call O(1)): latency per model
        version for health reports, the results sampler (what the operator sees), and the
        aggregation's hand-off (events)."""
        self.telemetry.record_result(result)
        self.results.offer(result)
        aggregation = self.aggregation
        if aggregation is not None:
            aggregation.offer(result)

    async def _close(self, transport: NodeTransport, outbox: Outbox) -> None:
        await self._host.close()
        try:
            await transport.close()
        except Exception:
            log.exception("closing the link failed")
        await anyio.to_thread.run_sync(outbox.close)
        log.info("agent stopped; outbox closed")


def _bind(
    component: Component, context: AgentContext, stop: anyio.Event
) -> Callable[[], Awaitable[None]]:
    return lambda: component(context, stop)


def _classify(task: str, exc: BaseException) -> AgentError:
    """The agent error for a task's failure: a refusal of the node wins over the rest."""
    if isinstance(exc, BaseExceptionGroup):
        refused = exc.subgroup(LinkRefusedError)
        leaf: BaseException = refused if refused is not None else exc
        while isinstance(leaf, BaseExceptionGroup):
            leaf = leaf.exceptions[0]
        exc = leaf
    if isinstance(exc, AgentError):
        return exc
    if isinstance(exc, BrokerLoginRefusedError):
        reason = exc.fields.get("reason")
        failure: AgentError = NodeRefusedError(
            f"{exc.message}; if the node is not revoked, run `edgefleet mqtt acl` and "
            "reload the broker, otherwise enroll it again with a new bootstrap token",
            task=task,
            reason=reason,
        )
    elif isinstance(exc, LinkRefusedError):
        reason = exc.fields.get("reason") or exc.fields.get("code")
        failure = NodeRefusedError(
            f"the control plane refuses this node ({reason}): {exc.message}; "
            "enroll it again with a new bootstrap token",
            task=task,
            reason=reason,
        )
    elif isinstance(exc, EdgeNodeError):
        failure = TaskFailedError(
            f"{task}: {exc.title}: {exc.message}", task=task, reason=exc.title, details=exc.fields
        )
    else:
        failure = TaskFailedError(
            f"{task}: {type(exc).__name__}: {exc}", task=task, reason=type(exc).__name__
        )
    failure.__cause__ = exc
    return failure
