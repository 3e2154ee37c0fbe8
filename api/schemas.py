"""Request and response bodies of the control-plane API. Requests forbid unknown fields and bound every
string; responses are what the OpenAPI document promises (schemathesis checks that they are)."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Generic, Literal, TypeVar

from fastapi import Path, Query
from pydantic import BaseModel, ConfigDict, Field

from api.limits import DEFAULT_PAGE_SIZE, MAX_PAGE_SIZE
from core.vocabulary import SLUG_PATTERN, GrantState, MintableRole

Slug = Annotated[str, Field(min_length=1, max_length=63, pattern=SLUG_PATTERN, examples=["acme"])]
SlugPath = Annotated[str, Path(min_length=1, max_length=63, pattern=SLUG_PATTERN)]
Reason = Annotated[str, Field(min_length=1, max_length=500, examples=["incident INC-1234: suspected compromise"])]
CursorQuery = Annotated[str | None, Query(max_length=200, description="next_cursor of the previous page")]
LimitQuery = Annotated[int, Query(ge=1, le=MAX_PAGE_SIZE, description="page size")]

T = TypeVar("T")


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Page(BaseModel, Generic[T]):
    items: list[T]
    next_cursor: str | None = Field(default=None, description="pass as ?cursor= to get the next page")


def page_size(limit: int | None) -> int:
    return DEFAULT_PAGE_SIZE if limit is None else limit


# --- tenants, groups, workloads ------------------------------------------------------------------


class TenantCreate(Strict):
    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={"examples": [{"slug": "acme", "display_name": "ACME Corp", "l3vni": 10001,
                                         "prefix": "10.1.0.0/16"}]},
    )
    slug: Slug
    display_name: str = Field(min_length=1, max_length=200)
    l3vni: int | None = Field(default=None, ge=1, le=16_777_215,
                              description="24-bit VXLAN L3VNI (allocated from the pool when absent)")
    prefix: str | None = Field(default=None, min_length=3, max_length=64,
                               description="CIDR for the tenant (allocated from the pool when absent)")
    vlan: int | None = Field(default=None, ge=2, le=4094,
                             description="attachment VLAN, also the conntrack zone (allocated when absent)")
    prefix6: str | None = Field(default=None, min_length=3, max_length=64,
                                description="IPv6 CIDR (allocated when absent and an IPv6 pool is configured)")


class TenantOut(BaseModel):
    slug: str
    display_name: str
    l3vni: int | None
    prefix: str | None
    quarantined: bool
    created_at: datetime
    vlan: int | None = None
    prefix6: str | None = None


class PortSpec(Strict):
    proto: Literal["tcp", "udp"]
    port: int = Field(ge=1, le=65535, strict=True)  # a JSON integer: lax mode took `true` for port 1


class GroupCreate(Strict):
    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={"examples": [{"name": "inference", "labels": {"tier": "gpu"},
                                         "ports": [{"proto": "tcp", "port": 443}], "sensitivity": "normal"}]},
    )
    name: Slug
    labels: dict[Annotated[str, Field(min_length=1, max_length=63)], Annotated[str, Field(max_length=253)]] = Field(
        default_factory=dict, max_length=32
    )
    ports: list[PortSpec] = Field(default_factory=list, max_length=64)
    sensitivity: Literal["normal", "sensitive"] = "normal"


class GroupOut(BaseModel):
    tenant: str
    name: str
    labels: dict[str, str]
    ports: list[dict[str, Any]]
    sensitivity: str
    quarantined: bool
    created_at: datetime


class WorkloadCreate(Strict):
    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [{"name": "web-1"}]})
    name: Slug


class WorkloadOut(BaseModel):
    tenant: str
    group: str
    name: str
    spiffe_id: str
    revoked: bool
    created_at: datetime


class QuarantineBody(Strict):
    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [{"reason": "incident INC-1234"}]})
    reason: Reason


class RevokeWorkloadOut(BaseModel):
    workload: WorkloadOut
    revoked_serials: list[str]


# --- grants --------------------------------------------------------------------------------------


class GrantCreate(Strict):
    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={"examples": [{
            "src_group": "inference", "dst_tenant": "storage-co", "dst_group": "objects",
            "proto": "tcp", "ports": [443], "ttl_seconds": 86400, "justification": "model weights download",
        }]},
    )
    src_tenant: Slug | None = Field(
        default=None, description="platform roles only; a tenant principal always requests for its own tenant"
    )
    src_group: Slug
    dst_tenant: Slug
    dst_group: Slug
    proto: Literal["tcp", "udp"]
    # JSON integers only (strict): lax mode took `true` for port 1 and `"8443"` for 8443, and wrote the grant
    ports: list[Annotated[int, Field(ge=0, le=65535, strict=True)]] = Field(min_length=0, max_length=64)
    ttl_seconds: int = Field(ge=1, le=365 * 86400, strict=True, description="the policy caps it (7 days)")
    justification: str = Field(default="", max_length=2000)


class ApprovalOut(BaseModel):
    as_: str = Field(alias="as")
    by: str
    at: str
    comment: str = ""

    model_config = ConfigDict(populate_by_name=True)


class GrantOut(BaseModel):
    id: str
    src_tenant: str
    src_group: str
    dst_tenant: str
    dst_group: str
    proto: str
    ports: list[int]
    ttl_seconds: int
    justification: str
    state: GrantState
    requested_by: str
    # the requester's tenant, null for a platform principal: an id alone may be another tenant's principal's (API
    # token subjects are free text)
    requester_tenant: str | None
    required_approvers: list[str]
    pending_approvers: list[str]
    approvals: list[dict[str, Any]]
    reasons: list[str]
    notes: list[str] = Field(default_factory=list, description=(
        "what the devices add to the grant's flows, beside the policy's reasons (e.g. udp/4791: RoCEv2 is "
        "symmetric on the SuperNICs, so the destination group's RoCEv2 can also reach the source group)"))
    created_at: datetime
    decided_at: datetime | None
    expires_at: datetime | None
    pending_until: datetime | None
    version: int


class ApproveBody(Strict):
    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [{"comment": "ok for Q3"}]})
    comment: str = Field(default="", max_length=500)


class ReasonBody(Strict):
    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [{"reason": "no longer needed"}]})
    reason: Reason


# --- principals and tokens -----------------------------------------------------------------------


class WhoAmI(BaseModel):
    id: str
    role: str
    tenant: str | None
    auth: str


class TokenCreate(Strict):
    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={"examples": [{"role": "tenant-admin", "tenant": "acme", "ttl_seconds": 3600}]},
    )
    role: MintableRole
    tenant: Slug | None = None
    ttl_seconds: int = Field(ge=1, le=365 * 86400)
    subject: str | None = Field(default=None, min_length=1, max_length=256)
    description: str = Field(default="", max_length=200)


class TokenOut(BaseModel):
    id: str
    role: str
    tenant: str | None
    subject: str
    created_at: datetime
    expires_at: datetime | None
    revoked_at: datetime | None


class TokenCreated(BaseModel):
    token: str
    info: TokenOut


class ErrorBody(BaseModel):
    error: str = Field(examples=["not_found"])
    reason: str = Field(examples=["grant 'g-1' not found"])
    problems: list[dict[str, Any]] | None = None


def error_responses(*codes: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI entries for the error statuses a route can return (all share ErrorBody)."""
    text = {400: "bad input", 401: "not authenticated", 403: "not allowed (reason says why)",
            404: "not found (or not visible to the caller)", 409: "conflicts with the current state",
            413: "body too large", 422: "request does not match the schema", 429: "rate limited"}
    return {c: {"model": ErrorBody, "description": text.get(c, "error")} for c in codes}


COMMON_ERRORS = (400, 401, 403, 413, 422, 429)
