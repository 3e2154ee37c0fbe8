"""PKI routes: bundle and CRL (public), SVID issuance and revocation, node join tokens and attestation.
Thin: parse, authorize (api_authz.rego), call pki.service, shape the answer."""

from __future__ import annotations

import logging
from datetime import datetime, timedelta
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Query, Request, Response
from pydantic import BaseModel, ConfigDict, Field, model_validator

from api.authz import authorize
from api.deps import CtxDep, PrincipalDep, charge_entries
from api.errors import error_code, status_for
from api.handoff import HandedOffRoute
from api.metrics import SVID_TTL, SVIDS_ISSUED
from api.patterns import SERIAL_PATTERN
from api.principal import Principal
from api.routes.common import denial_logged, log_denial, request_id
from api.schemas import COMMON_ERRORS, Reason, Slug, Strict, error_responses
from core.errors import Forbidden, TrustfabricError
from pki import service
from pki.errors import SvidNotFound
from pki.revocation import CrlPublisher, PublishedCrl
from workflows.rotation import rotate_cas

log = logging.getLogger("trustfabric.api.pki")
router = APIRouter(prefix="/v1", tags=["pki"], route_class=HandedOffRoute)

MAX_TTL_SECONDS = 30 * 86400
Csr = Annotated[str, Field(min_length=1, max_length=16384, description="PKCS#10 CSR, PEM",
                           examples=["-----BEGIN CERTIFICATE REQUEST-----\n...\n-----END CERTIFICATE REQUEST-----\n"])]
TtlSeconds = Annotated[int | None, Field(default=None, ge=1, le=MAX_TTL_SECONDS,
                                         description="lifetime; the trust domain's maximum applies")]
Audience = Annotated[str, Field(min_length=1, max_length=512)]


class X509SvidRequest(Strict):
    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [
        {"csr": "-----BEGIN CERTIFICATE REQUEST-----\n...", "tenant": "acme", "group": "web",
         "workload": "web-1", "ttl_seconds": 3600}]})
    csr: Csr
    tenant: Slug
    group: Slug
    workload: Slug
    ttl_seconds: TtlSeconds = None


MAX_X509_BATCH = 100  # entries of one POST /v1/svids/x509/batch (SPIRE's agent sends its due SVIDs in such batches)
# its body limit (the API's is 64 KiB, which 100 P-256 CSRs nearly fill): 4 KiB an entry, an RSA-4096 CSR's room
MAX_X509_BATCH_BYTES = MAX_X509_BATCH * 4096 + 16 * 1024


class X509SvidBatchRequest(Strict):
    """Up to MAX_X509_BATCH X.509-SVIDs, one entry per workload (a workload named twice is refused whole)."""

    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [{"svids": [
        {"csr": "-----BEGIN CERTIFICATE REQUEST-----\n...", "tenant": "acme", "group": "web", "workload": "web-1"},
        {"csr": "-----BEGIN CERTIFICATE REQUEST-----\n...", "tenant": "acme", "group": "web", "workload": "web-2",
         "ttl_seconds": 3600}]}]})
    svids: list[X509SvidRequest] = Field(min_length=1, max_length=MAX_X509_BATCH)

    @model_validator(mode="after")
    def _each_workload_once(self) -> X509SvidBatchRequest:
        seen: set[tuple[str, str, str]] = set()
        for entry in self.svids:
            name = (entry.tenant, entry.group, entry.workload)
            if name in seen:
                raise ValueError(f"workload {'/'.join(name)} is named more than once; ask once per workload")
            seen.add(name)
        return self


class JwtSvidRequest(Strict):
    tenant: Slug
    group: Slug
    workload: Slug
    audience: list[Audience] = Field(min_length=1, max_length=16)
    ttl_seconds: TtlSeconds = None


class RevokeRequest(Strict):
    """Either `serial`, or `tenant` (optionally with `group`, and `workload` within a group)."""

    serial: str | None = Field(default=None, min_length=1, max_length=64, pattern=SERIAL_PATTERN)
    tenant: Slug | None = None
    group: Slug | None = None
    workload: Slug | None = None
    reason: Reason

    @model_validator(mode="after")
    def _one_target(self) -> RevokeRequest:
        if (self.serial is None) == (self.tenant is None):
            raise ValueError("give either serial, or tenant (with optional group and workload)")
        if self.workload is not None and self.group is None:
            raise ValueError("a workload is named within a group: give the group too")
        if self.serial is not None and (self.group is not None or self.workload is not None):
            raise ValueError("group and workload go with tenant, not with serial")
        return self


class JoinTokenRequest(Strict):
    node_name: Slug
    ttl_seconds: int | None = Field(default=None, ge=1, le=7 * 86400)


class AttestRequest(Strict):
    token: str = Field(min_length=1, max_length=256)
    csr: Csr
    node_name: str | None = Field(default=None, min_length=1, max_length=253,
                                  description="the node the caller is; when given, it must be the one the token is for")


class RotateRequest(Strict):
    # a JSON true only: lax mode took "yes", "on", "1" and 1 for true, and rotated the CAs at once
    force: bool = Field(default=False, strict=True, description="prepare (if needed) and activate the next CA now")


class X509SvidOut(BaseModel):
    spiffe_id: str
    serial: str
    certificate: str = Field(description="the leaf, PEM")
    chain: list[str] = Field(description="issuing CA certificate(s), PEM; the root is in the bundle")
    expires_at: datetime


class BatchEntryError(BaseModel):
    status: int = Field(description="the HTTP status this entry alone would have been answered with")
    error: str
    reason: str


class X509SvidBatchResult(BaseModel):
    """One entry's outcome: `svid`, or `error` (never both)."""

    svid: X509SvidOut | None = None
    error: BatchEntryError | None = None


class X509SvidBatchOut(BaseModel):
    results: list[X509SvidBatchResult] = Field(description="one per entry asked, in the same order")


class JwtSvidOut(BaseModel):
    token: str
    spiffe_id: str
    audience: list[str]
    expires_at: datetime
    kid: str


class RevokeOut(BaseModel):
    revoked: list[str]


class JoinTokenOut(BaseModel):
    token: str = Field(description="shown once; only its hash is stored")
    node_name: str
    spiffe_id: str
    expires_at: datetime


class RevocationsOut(BaseModel):
    serials: list[str]
    identities: list[dict[str, Any]]


def _on_node(principal: Principal) -> str | None:
    """The node a node principal's SVID requests are confined to (issue 13 item 1); None for anyone else."""
    return principal.id.rsplit("/node/", 1)[1] if principal.role == "node" else None


def _ttl(seconds: int | None) -> timedelta | None:
    return None if seconds is None else timedelta(seconds=seconds)


def issued_svid(kind: str, expires_at: datetime, now: datetime) -> None:
    SVIDS_ISSUED.labels(kind).inc()
    SVID_TTL.labels(kind).observe(max(0.0, (expires_at - now).total_seconds()))


def _x509_out(issued: service.IssuedX509) -> X509SvidOut:
    return X509SvidOut(spiffe_id=issued.spiffe_id, serial=issued.serial, certificate=issued.cert_pem.decode(),
                       chain=[c.decode() for c in issued.chain_pem], expires_at=issued.expires_at)


_PEM = {"schema": {"type": "string"}, "example": "-----BEGIN CERTIFICATE-----\n..."}
_BUNDLE_200: dict[int | str, dict[str, Any]] = {200: {
    "description": "SPIFFE bundle (JWKS) or the roots as PEM",
    "content": {"application/json": {"schema": {"type": "object"}}, "application/x-pem-file": _PEM},
}}
_CRL_200: dict[int | str, dict[str, Any]] = {200: {
    "description": "CRL, DER (default) or PEM",
    "content": {"application/pkix-crl": {"schema": {"type": "string", "format": "binary"}},
                "application/x-pem-file": _PEM},
}}


@router.get("/bundle", responses={**_BUNDLE_200, **error_responses(400, 409, 422)},
            summary="The trust bundle (public): SPIFFE JWKS, or ?format=pem for the X.509 roots")
def get_bundle(ctx: CtxDep, format: Annotated[Literal["jwks", "pem"], Query()] = "jwks") -> Any:
    with ctx.db.read_session() as session:
        if format == "pem":
            return Response(service.bundle_pem(session, ctx.clock), media_type="application/x-pem-file")
        return service.bundle_jwks(session, ctx.clock)


@router.get("/crl", responses={**_CRL_200, 304: {"description": "unchanged since the ETag in If-None-Match"},
                               **error_responses(400, 409, 422)},
            summary="Certificate revocation list of the active issuing CA (public); ?format=pem for all")
def get_crl(request: Request, ctx: CtxDep, format: Annotated[Literal["der", "pem"], Query()] = "der") -> Response:
    publisher: CrlPublisher = request.app.state.crl
    with ctx.db.read_session() as session:
        published = publisher.current(session, ctx.keystore, ctx.clock)  # signed once per change, not per GET
    body = published.pem if format == "pem" else published.der
    etag = PublishedCrl.etag_of(body)
    headers = {"ETag": etag, "Cache-Control": "no-cache"}  # revalidate each time: a 304 costs nothing
    if etag_matches(request.headers.get("if-none-match"), etag):
        return Response(status_code=304, headers=headers)
    media = "application/x-pem-file" if format == "pem" else "application/pkix-crl"
    return Response(body, media_type=media, headers=headers)


def etag_matches(if_none_match: str | None, etag: str) -> bool:
    """RFC 9110 weak comparison of If-None-Match (a list, or *) with our ETag."""
    if not if_none_match:
        return False
    tags = [t.strip().removeprefix("W/") for t in if_none_match.split(",")]
    return "*" in tags or etag in tags


@router.post("/svids/x509", status_code=201, response_model=X509SvidOut,
             responses=error_responses(*COMMON_ERRORS, 404, 409),
             summary="Issue an X.509-SVID to a registered workload from a CSR")
def issue_x509(body: X509SvidRequest, request: Request, ctx: CtxDep, principal: PrincipalDep) -> X509SvidOut:
    authorize(request, principal, "svid.issue", body.tenant)
    resource = {"tenant": body.tenant, "group": body.group, "workload": body.workload, "kind": "x509"}
    with denial_logged(ctx, principal, "svid.issue", resource):  # group-committed with other issuances
        issued = service.issue_x509_svid_grouped(
            ctx.db, ctx.committer, ctx.keystore, csr_pem=body.csr.encode(), tenant=body.tenant, group=body.group,
            workload=body.workload, ttl=_ttl(body.ttl_seconds), actor=principal.actor(),
            scope_tenant=principal.scope_tenant, clock=ctx.clock, max_ttl=ctx.settings.max_svid_ttl,
            request_id=request_id(request), on_node=_on_node(principal),
        )
    issued_svid("x509", issued.expires_at, ctx.clock())
    return _x509_out(issued)


@router.post("/svids/x509/batch", response_model=X509SvidBatchOut,
             responses=error_responses(*COMMON_ERRORS),
             summary="Issue up to 100 X.509-SVIDs in one request, each entry answered on its own")
def issue_x509_batch(body: X509SvidBatchRequest, request: Request, ctx: CtxDep, principal: PrincipalDep
                     ) -> X509SvidBatchOut:
    """SPIRE's BatchNewX509SVID for node agents: the same authorization and checks per entry as POST /v1/svids/x509,
    and one group commit for the issued SVIDs (each with its own audit event, durable before the answer). 200 with a
    result per entry: its SVID, or its error (`status` is what the single route would answer: 400 a bad CSR or TTL,
    403 not allowed / out of scope / not placed on this node / revoked / quarantined, 404 unknown, 409 no CA); an
    entry refused writes nothing and changes nothing for the others. The request as a whole is refused (nothing
    issued) when it is not authenticated (401), malformed, empty, above 100 entries or names a workload twice
    (422), or over the principal's rate limit: one token per entry (as SPIRE counts its signing rate limit per CSR),
    taken all or none before any work; 429 with Retry-After (the seconds until the bucket holds them all), or 422 when
    the batch has more entries than the limit's burst (TRUSTFABRIC_RATE_LIMIT_BURST, 100 by default: a batch of
    exactly that many passes on a full bucket)."""
    charge_entries(request, principal, len(body.svids), f"{len(body.svids)} entries")
    on_node, rid, actor = _on_node(principal), request_id(request), principal.actor()
    results: list[X509SvidBatchResult | None] = [None] * len(body.svids)
    asks: list[tuple[int, service.X509Ask]] = []
    for index, entry in enumerate(body.svids):
        try:
            authorize(request, principal, "svid.issue", entry.tenant)
        except TrustfabricError as exc:
            results[index] = _entry_error(exc, rid)
            continue
        asks.append((index, service.X509Ask(csr_pem=entry.csr.encode(), tenant=entry.tenant, group=entry.group,
                                            workload=entry.workload, ttl=_ttl(entry.ttl_seconds))))
    outcomes = service.issue_x509_svids_grouped(
        ctx.db, ctx.committer, ctx.keystore, [ask for _i, ask in asks], actor=actor,
        scope_tenant=principal.scope_tenant, clock=ctx.clock, max_ttl=ctx.settings.max_svid_ttl, request_id=rid,
        on_node=on_node) if asks else []
    now = ctx.clock()
    for (index, ask), outcome in zip(asks, outcomes, strict=True):
        if isinstance(outcome, TrustfabricError):
            log_denial(ctx, principal, "svid.issue", {"tenant": ask.tenant, "group": ask.group,
                                                      "workload": ask.workload, "kind": "x509"}, outcome)
            results[index] = _entry_error(outcome, rid)
        else:
            issued_svid("x509", outcome.expires_at, now)
            results[index] = X509SvidBatchResult(svid=_x509_out(outcome))
    return X509SvidBatchOut(results=[r for r in results if r is not None])


def _entry_error(exc: TrustfabricError, rid: str) -> X509SvidBatchResult:
    status, reason = status_for(exc), str(exc)
    if status >= 500:  # a server fault says little (api/errors.py): the details go to the log, under the request id
        log.error("batch SVID entry failed (request id %s)", rid, exc_info=exc)
        reason = f"internal error; see the server log for request id {rid}"
    return X509SvidBatchResult(error=BatchEntryError(status=status, error=error_code(exc), reason=reason))


@router.post("/svids/jwt", status_code=201, response_model=JwtSvidOut,
             responses=error_responses(*COMMON_ERRORS, 404, 409), summary="Issue a JWT-SVID to a registered workload")
def issue_jwt(body: JwtSvidRequest, request: Request, ctx: CtxDep, principal: PrincipalDep) -> JwtSvidOut:
    authorize(request, principal, "svid.issue", body.tenant)
    resource = {"tenant": body.tenant, "group": body.group, "workload": body.workload, "kind": "jwt"}
    with denial_logged(ctx, principal, "svid.issue", resource), ctx.db.session() as session:
        issued = service.issue_jwt_svid(
            session, ctx.keystore, tenant=body.tenant, group=body.group, workload=body.workload,
            audience=list(body.audience), ttl=_ttl(body.ttl_seconds), actor=principal.actor(),
            scope_tenant=principal.scope_tenant, clock=ctx.clock, request_id=request_id(request),
            on_node=_on_node(principal),
        )
    issued_svid("jwt", issued.expires_at, ctx.clock())
    return JwtSvidOut(token=issued.token, spiffe_id=issued.spiffe_id, audience=issued.audience,
                      expires_at=issued.expires_at, kid=issued.kid)


@router.post("/svids/revoke", response_model=RevokeOut, responses=error_responses(*COMMON_ERRORS, 404, 409),
             summary="Revoke one SVID by serial, or every SVID of a tenant / group / workload")
def revoke(body: RevokeRequest, request: Request, ctx: CtxDep, principal: PrincipalDep) -> RevokeOut:
    with ctx.db.session() as session:
        tenant = service.svid_tenant(session, body.serial) if body.serial is not None else body.tenant
        if body.serial is not None and principal.scope_tenant is not None and tenant != principal.scope_tenant:
            raise SvidNotFound(f"no SVID with serial {body.serial}")  # do not reveal other tenants' serials
        authorize(request, principal, "svid.revoke", tenant)
        serials = service.revoke(
            session, serial=body.serial, tenant=body.tenant, group=body.group, workload=body.workload,
            reason=body.reason, actor=principal.actor(), scope_tenant=principal.scope_tenant, clock=ctx.clock,
            request_id=request_id(request),
        )
    return RevokeOut(revoked=serials)


@router.get("/revocations", response_model=RevocationsOut, responses=error_responses(*COMMON_ERRORS),
            summary="Revoked serials and identities (deny list for enforcers)")
def revocations(request: Request, ctx: CtxDep, principal: PrincipalDep) -> RevocationsOut:
    authorize(request, principal, "revocation.read", None)
    with ctx.db.read_session() as session:
        serials = service.revoked_serials(session)
        identities = [
            {"spiffe_id_prefix": i.spiffe_id_prefix, "tenant": i.tenant, "group": i.group, "workload": i.workload,
             "reason": i.reason, "revoked_at": i.revoked_at.isoformat()}
            for i in service.revoked_identities(session)
        ]
    return RevocationsOut(serials=serials, identities=identities)


@router.post("/nodes/tokens", status_code=201, response_model=JoinTokenOut,
             responses=error_responses(*COMMON_ERRORS, 409), summary="Create a one-time node join token (admin)")
def create_node_token(body: JoinTokenRequest, request: Request, ctx: CtxDep, principal: PrincipalDep
                      ) -> JoinTokenOut:
    authorize(request, principal, "node.token.create", None)
    with ctx.db.session() as session:
        token = service.create_join_token(session, node_name=body.node_name, ttl=_ttl(body.ttl_seconds),
                                          actor=principal.actor(), clock=ctx.clock, request_id=request_id(request))
        spiffe_id = service.node_spiffe_id(session, body.node_name)
        expires_at = service.join_token_expires_at(session, token)
    return JoinTokenOut(token=token, node_name=body.node_name, spiffe_id=spiffe_id,
                        expires_at=expires_at)


@router.post("/nodes/attest", status_code=201, response_model=X509SvidOut,
             responses=error_responses(400, 401, 409, 413, 422),
             summary="Exchange a join token and a CSR for the node's SVID (the token is the credential)")
def attest(body: AttestRequest, request: Request, ctx: CtxDep) -> X509SvidOut:
    with ctx.db.session() as session:
        issued = service.attest_node(session, ctx.keystore, token=body.token, csr_pem=body.csr.encode(),
                                     clock=ctx.clock, max_ttl=ctx.settings.max_svid_ttl,
                                     request_id=request_id(request), node_name=body.node_name)
    issued_svid("node", issued.expires_at, ctx.clock())
    return _x509_out(issued)


class RenewRequest(Strict):
    csr: Csr


@router.post("/nodes/renew", status_code=201, response_model=X509SvidOut,
             responses=error_responses(*COMMON_ERRORS, 409),
             summary="A node renews its SVID before expiry: its current SVID (mTLS) and a CSR for a new key")
def renew(body: RenewRequest, request: Request, ctx: CtxDep, principal: PrincipalDep) -> X509SvidOut:
    authorize(request, principal, "node.attest", None)
    node = _on_node(principal)
    if node is None or principal.auth != "mtls":
        raise Forbidden("only a node, authenticated with its current SVID over mTLS, renews its SVID")
    with ctx.db.session() as session:
        issued = service.renew_node(session, ctx.keystore, node_name=node, csr_pem=body.csr.encode(),
                                    clock=ctx.clock, max_ttl=ctx.settings.max_svid_ttl,
                                    request_id=request_id(request))
    return _x509_out(issued)


@router.get("/ca/status", responses=error_responses(*COMMON_ERRORS, 409), summary="CA generations and schedule")
def ca_status(request: Request, ctx: CtxDep, principal: PrincipalDep) -> dict[str, Any]:
    authorize(request, principal, "ca.read", None)
    with ctx.db.read_session() as session:
        return service.status_dict(service.ca_status(session, ctx.clock))


@router.post("/ca/rotate", responses=error_responses(*COMMON_ERRORS, 409),
             summary="Run the CA rotation schedule now; force=true rotates immediately (admin)")
def ca_rotate(body: RotateRequest, request: Request, ctx: CtxDep, principal: PrincipalDep) -> dict[str, Any]:
    authorize(request, principal, "ca.rotate", None)
    return service.status_dict(rotate_cas(ctx, force=body.force, actor=principal.actor(),
                                          request_id=request_id(request)))
