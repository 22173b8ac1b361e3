"""Nodes: bootstrap tokens, enrollment (REST fallback for MQTT-only links), inventory, and
the sampled results of each node's model (any valid token reads them).

`POST /v1/enroll` and `GET /v1/ca.pem` are the routes here without an API token: the
bootstrap token in the body is the credential, and the CA certificate is public. The
enrollment answer is the node inbox's (`link.node_inbox`), as over gRPC; routes only
render it.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request, status
from fastapi.responses import PlainTextResponse
from pydantic import BaseModel, Field, ValidationError

from control_plane.api.deps import (
    CertificateAuthorityDep,
    ClockDep,
    ContextDep,
    HealthQueriesDep,
    NodeInventoryDep,
    NodeResultsDep,
    NodeTokensDep,
    PrincipalDep,
    RestInboxDep,
)
from control_plane.identity.bootstrap import parse_selector
from control_plane.nodes.model import (
    LAST_FAILURE,
    UPDATE,
    BootstrapTokenInfo,
    Node,
    update_summary,
)
from control_plane.nodes.results import DEFAULT_LIMIT, MAX_LIMIT, NodeResult
from control_plane.trust.custom import target_label

router = APIRouter(prefix="/v1", tags=["nodes"])


class NodeTokenCreate(BaseModel):
    labels: dict[str, str] = Field(default_factory=dict)
    # Wide schema bounds against overflow; the service enforces the real limits.
    ttl_s: int = Field(default=3600, ge=1, le=10**8, description="lifetime in seconds")


class NodeTokenOut(BaseModel):
    id: str
    fleet: str
    labels: dict[str, str]
    created_at: datetime
    created_by: str
    expires_at: datetime
    used_at: datetime | None
    node_id: str | None
    revoked_at: datetime | None
    state: str


class NodeTokenCreated(NodeTokenOut):
    token: str = Field(description="shown once; hand it to the node")


class EnrollRequest(BaseModel):
    token: str = Field(max_length=256)
    csr_pem: str = Field(max_length=16 * 1024, description="PKCS#10 CSR, PEM")
    agent_version: str | None = Field(default=None, max_length=64)
    transport: str | None = Field(default=None, max_length=16)


class EnrollmentOut(BaseModel):
    node_id: str
    fleet: str
    labels: dict[str, str]
    certificate_pem: str
    ca_pem: str
    cert_serial: str
    not_after: datetime
    mqtt_username: str | None = Field(default=None, description="transport mqtt only")
    mqtt_password: str | None = Field(default=None, description="shown once; mqtt only")
    director_public_key: dict[str, Any] = Field(
        description="the director's public key (TUF key dict plus keyid): the only key "
        "the node trusts for its assignments"
    )
    tuf_root: str | None = Field(
        default=None,
        description="the fleet's 1.root.json as stored (the node's TUF trust anchor); "
        "null while the fleet has no root",
    )


class UpdateStatusOut(BaseModel):
    """An update status as the node sent it, and the line an operator reads."""

    phase: str
    target_path: str = ""
    director_sequence: int = 0
    reason: str = Field(default="", description='the node\'s short code; "" from older nodes')
    detail: str = Field(default="", description="`reason: message`, as the node wrote it")
    facts: dict[str, str] = Field(
        default_factory=dict, description="the numbers behind the reason, as text"
    )
    at: datetime | None = None
    summary: str = Field(description="`phase — detail`, e.g. `failed — self-test: ...`")


class ShadowOut(BaseModel):
    """What the node said of its shadow candidate in its newest processed health report
    (its `shadow` section, ADR 0031): figures over the candidate's whole run so far."""

    reported_at: datetime = Field(description="window end of the report it comes from")
    candidate: str = Field(description="name@version run beside the served model")
    state: str = Field(description="downloading | self-testing | running | failed")
    against: str | None = Field(default=None, description="the served model compared with")
    reason: str | None = Field(default=None, description="failed: the short reason")
    detail: str = Field(default="", description="failed: what went wrong, in words")
    sample_per_mille: int | None = None
    max_cpu_percent: int | None = None
    frames_sampled: int = 0
    frames_compared: int = 0
    samples_dropped: int = Field(default=0, description="dropped: the candidate was busy")
    samples_skipped_cpu: int = Field(default=0, description="skipped to keep under the CPU cap")
    samples_failed: int = 0
    cpu_percent: float | None = None
    rss_delta_bytes: int | None = Field(
        default=None, description="RSS growth while the candidate loaded and self-tested"
    )
    latency_ms: dict[str, float] = Field(
        default_factory=dict,
        description="the candidate's CPU time per sampled frame: p50_ms ... max_ms",
    )
    reference_latency_ms: dict[str, float] = Field(
        default_factory=dict,
        description="the served model's, timed as the candidate's on the same frames",
    )
    latency_ratio_p50: float | None = Field(
        default=None, description="median per-frame ratio of the candidate's to the reference's"
    )
    agreement: dict[str, Any] = Field(
        default_factory=dict,
        description="kind, frames and the figures of that kind (top1_ratio, recall, ...)",
    )


class ModelRuntimeOut(BaseModel):
    """Where the served model's runtime settings come from, as the node said in its newest
    processed health report (its `model_runtime` section, issue 12 §1)."""

    reported_at: datetime = Field(description="window end of the report it comes from")
    config: str = Field(
        description="signed: the version's signed runtime spec; node: node.yaml's preprocess "
        "(a version pushed without one, or a local model)"
    )
    session_overrides: list[str] = Field(
        default_factory=list,
        description="the runtime.session settings node.yaml sets on this box (threads, "
        "execution providers, ...): the only per-box overrides of a signed version",
    )
    node_preprocess_ignored: bool = Field(
        default=False,
        description="node.yaml sets runtime.preprocess, which the signed spec replaces",
    )


class NodeOut(BaseModel):
    id: str
    fleet: str
    labels: dict[str, str]
    agent_version: str | None
    transport: str | None
    reported_state: dict[str, Any]
    active_model: str | None = Field(
        description="what the node serves, as name@version (from its Hello's active target; "
        "a local file: its name); null when it serves no release"
    )
    created_at: datetime
    last_seen: datetime | None
    online: bool
    cert_serial: str | None
    cert_expires_at: datetime | None
    revoked: bool
    revoked_at: datetime | None
    last_update: UpdateStatusOut | None = Field(
        default=None, description="the node's latest update status (`reported_state.update`)"
    )
    last_failure: UpdateStatusOut | None = Field(
        default=None,
        description="its latest failed or reverted one, kept across reconnects",
    )
    shadow: ShadowOut | None = Field(
        default=None,
        description="its shadow candidate, when its newest processed health report has one "
        "(GET /v1/nodes/{id} only)",
    )
    model_runtime: ModelRuntimeOut | None = Field(
        default=None,
        description="where the served model's runtime settings come from, when its newest "
        "processed health report says (GET /v1/nodes/{id} only)",
    )


class NodeResultOut(BaseModel):
    """One sampled result as the node sent it (``edgefleet.agent.results/1``)."""

    record_id: str
    seq: int
    received_at: datetime
    captured_at: datetime
    stream: str
    model: str
    version: str | None
    model_label: str = Field(description="name@version (a local file: its name)")
    kind: str = Field(description="classification | detection | raw")
    frame_id: int
    detections: list[dict[str, Any]] = Field(
        description="class_id, label, score and (detection) box [x1, y1, x2, y2] in [0, 1]"
    )
    detections_total: int
    tensors: list[dict[str, Any]]
    latency_ms: dict[str, Any] = Field(description="queue, preprocess, inference, decode")


class NodeLabelsPatch(BaseModel):
    """JSON merge-patch of the labels (null removes a label), or all of them with `replace`."""

    labels: dict[str, str | None]
    replace: bool = False


def _status_out(status: object) -> UpdateStatusOut | None:
    summary = update_summary(status)
    if summary is None or not isinstance(status, dict):
        return None
    facts = status.get("facts")
    try:
        return UpdateStatusOut(
            phase=status["phase"],
            target_path=status.get("target_path") or "",
            director_sequence=status.get("director_sequence") or 0,
            reason=status.get("reason") or "",
            detail=status.get("detail") or "",
            facts=facts if isinstance(facts, dict) else {},
            at=status.get("at"),
            summary=summary,
        )
    except ValidationError:  # stored by an older server in another shape: left out
        return None


def _shadow_out(section: dict[str, Any], at: datetime) -> ShadowOut | None:
    """The stored section as the API shows it; one a newer agent shaped otherwise
    (no candidate, a figure of another type) is left out rather than failing the read."""
    latency = section.get("latency")
    reference = section.get("reference_latency")
    fields = {k: v for k, v in section.items() if k in ShadowOut.model_fields}
    fields.pop("latency", None)
    try:
        return ShadowOut(
            **fields,
            reported_at=at,
            latency_ms=latency if isinstance(latency, dict) else {},
            reference_latency_ms=reference if isinstance(reference, dict) else {},
        )
    except ValidationError:
        return None


def _model_runtime_out(section: dict[str, Any], at: datetime) -> ModelRuntimeOut | None:
    """The stored section as the API shows it; one shaped otherwise is left out."""
    fields = {k: v for k, v in section.items() if k in ModelRuntimeOut.model_fields}
    try:
        return ModelRuntimeOut(**{**fields, "reported_at": at})
    except ValidationError:
        return None


def _result_out(result: NodeResult) -> NodeResultOut:
    doc = result.document
    return NodeResultOut(
        record_id=result.record_id,
        seq=result.seq,
        received_at=result.received_at,
        captured_at=result.captured_at,
        stream=result.stream,
        model=result.model,
        version=result.version,
        model_label=result.model_label,
        kind=result.kind,
        frame_id=doc.get("frame_id", 0),
        detections=doc.get("detections", []),
        detections_total=doc.get("detections_total", 0),
        tensors=doc.get("tensors", []),
        latency_ms=doc.get("latency_ms", {}),
    )


def _active_model(state: dict[str, Any]) -> str | None:
    target = state.get("active_target")
    return target_label(target) if isinstance(target, str) else None


def _node_out(node: Node) -> NodeOut:
    state = node.reported_state or {}
    return NodeOut(
        id=node.id,
        fleet=node.fleet,
        labels=node.labels,
        agent_version=node.agent_version,
        transport=node.transport,
        reported_state=node.reported_state,
        active_model=_active_model(node.reported_state),
        created_at=node.created_at,
        last_seen=node.last_seen,
        online=node.online,
        cert_serial=node.cert_serial,
        cert_expires_at=node.cert_expires_at,
        revoked=node.revoked,
        revoked_at=node.revoked_at,
        last_update=_status_out(state.get(UPDATE)),
        last_failure=_status_out(state.get(LAST_FAILURE)),
    )


def _token_out(info: BootstrapTokenInfo, now: datetime) -> NodeTokenOut:
    return NodeTokenOut(
        id=info.id,
        fleet=info.fleet,
        labels=info.labels,
        created_at=info.created_at,
        created_by=info.created_by,
        expires_at=info.expires_at,
        used_at=info.used_at,
        node_id=info.node_id,
        revoked_at=info.revoked_at,
        state=info.state(now),
    )


@router.post("/fleets/{fleet}/node-tokens", status_code=status.HTTP_201_CREATED)
def create_node_token(
    fleet: str, body: NodeTokenCreate, ctx: ContextDep, tokens: NodeTokensDep, clock: ClockDep
) -> NodeTokenCreated:
    """A single-use bootstrap token that enrolls one node into the fleet; shown once."""
    token, info = tokens.create_bootstrap_token(
        ctx, fleet, body.labels, timedelta(seconds=body.ttl_s)
    )
    out = _token_out(info, clock.now())
    return NodeTokenCreated(token=token, **out.model_dump())


@router.get("/node-tokens")
def list_node_tokens(
    ctx: ContextDep, tokens: NodeTokensDep, clock: ClockDep, fleet: str | None = None
) -> list[NodeTokenOut]:
    now = clock.now()
    return [_token_out(t, now) for t in tokens.list_bootstrap_tokens(ctx, fleet)]


@router.post("/node-tokens/{token_id}/revoke")
def revoke_node_token(
    token_id: str, ctx: ContextDep, tokens: NodeTokensDep, clock: ClockDep
) -> NodeTokenOut:
    info = tokens.revoke_bootstrap_token(ctx, token_id)
    return _token_out(info, clock.now())


@router.post("/enroll", status_code=status.HTTP_201_CREATED)
def enroll(body: EnrollRequest, request: Request, inbox: RestInboxDep) -> EnrollmentOut:
    """Trade a bootstrap token and a CSR for a node id and a client certificate."""
    answer = inbox.enroll(
        body.token,
        body.csr_pem.encode("utf-8"),
        agent_version=body.agent_version,
        transport=body.transport,
        request_id=request.state.request_id,
    )
    enrollment = answer.enrollment
    return EnrollmentOut(
        node_id=enrollment.node_id,
        fleet=enrollment.fleet,
        labels=enrollment.labels,
        certificate_pem=enrollment.certificate_pem.decode("ascii"),
        ca_pem=enrollment.ca_pem.decode("ascii"),
        cert_serial=enrollment.cert_serial,
        not_after=enrollment.not_after,
        mqtt_username=enrollment.mqtt_username,
        mqtt_password=enrollment.mqtt_password,
        director_public_key=answer.director_public_key,
        tuf_root=answer.tuf_root.decode("utf-8") if answer.tuf_root is not None else None,
    )


class PemResponse(PlainTextResponse):
    """A PEM document, documented as such in the OpenAPI document (not text/plain)."""

    media_type = "application/x-pem-file"


@router.get("/ca.pem", response_class=PemResponse)
def ca_certificate(ca: CertificateAuthorityDep) -> PemResponse:
    """The fleet CA (PEM) that signs node and gRPC server certificates; no token needed.

    Public, but only as trustworthy as the channel it is fetched over: a node should get
    it from the operator (with its bootstrap token) or over HTTPS it already trusts.
    """
    return PemResponse(ca.ca_pem)


@router.get("/nodes")
def list_nodes(
    _: PrincipalDep,
    inventory: NodeInventoryDep,
    selector: str | None = None,
    fleet: str | None = None,
) -> list[NodeOut]:
    """Nodes, optionally of one fleet and matching a label selector (`site=a,role!=gate`)."""
    parsed = parse_selector(selector) if selector else None
    return [_node_out(n) for n in inventory.list_nodes(parsed, fleet)]


@router.get("/nodes/{node_id}")
def get_node(
    node_id: str, _: PrincipalDep, inventory: NodeInventoryDep, health: HealthQueriesDep
) -> NodeOut:
    """One node, with its shadow candidate when its newest health report has one, and
    where its served model's runtime settings come from."""
    out = _node_out(inventory.get_node(node_id))
    latest = health.latest([node_id]).get(node_id)
    if latest is not None and latest.shadow is not None:
        out.shadow = _shadow_out(latest.shadow, latest.at)
    if latest is not None and latest.model_runtime is not None:
        out.model_runtime = _model_runtime_out(latest.model_runtime, latest.at)
    return out


@router.get("/nodes/{node_id}/results")
def node_results(
    node_id: str,
    _: PrincipalDep,
    results: NodeResultsDep,
    limit: Annotated[int, Query(ge=1, le=MAX_LIMIT)] = DEFAULT_LIMIT,
    stream: Annotated[str | None, Query(max_length=256)] = None,
) -> list[NodeResultOut]:
    """The node's newest sampled results (what its model saw), newest first; the node
    sends a bounded sample and the control plane keeps the last few per node."""
    return [_result_out(r) for r in results.recent(node_id, limit=limit, stream=stream)]


@router.patch("/nodes/{node_id}")
def patch_node(
    node_id: str, body: NodeLabelsPatch, ctx: ContextDep, inventory: NodeInventoryDep
) -> NodeOut:
    """Change a node's labels (audited)."""
    if body.replace:
        # Replacing: a label given as null is simply not among the new ones.
        labels = {k: v for k, v in body.labels.items() if v is not None}
        return _node_out(inventory.set_labels(ctx, node_id, labels))
    return _node_out(inventory.update_labels(ctx, node_id, body.labels))


@router.post("/nodes/{node_id}/revoke")
def revoke_node(node_id: str, ctx: ContextDep, inventory: NodeInventoryDep) -> NodeOut:
    """The node is refused from its next message on."""
    return _node_out(inventory.revoke(ctx, node_id))
