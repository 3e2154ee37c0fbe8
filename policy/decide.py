"""Decisions with their reasons, failing closed.

No policy loaded, an engine error, a malformed answer or an unknown identity -> deny, with the reason
in the answer and in the log (logger `policy.decide`). Callers never see an exception from here.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, Literal, NamedTuple

from core.errors import InvalidInput
from core.slugs import is_slug
from policy.engines import PolicyEngine, diff_documents

log = logging.getLogger(__name__)

FLOW_QUERY = "data.flows.decision"
ALLOWED_FLOWS_QUERY = "data.flows.allowed_flows"
GRANT_QUERY = "data.grants.decision"
AUTHZ_QUERY = "data.api_authz.decision"

GrantOutcome = Literal["approve", "pending", "deny"]


@dataclass(frozen=True)
class FlowDecision:
    allow: bool
    reasons: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class GrantDecision:
    outcome: GrantOutcome
    approvers: list[str] = field(default_factory=list)
    reasons: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        # what dataclasses.asdict gives (its fields, lists copied), without its recursive deep copy: every
        # grant request's decision record is built from it
        return {"outcome": self.outcome, "approvers": list(self.approvers), "reasons": list(self.reasons)}


@dataclass(frozen=True)
class AuthzDecision:
    allow: bool
    reasons: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class Flow(NamedTuple):
    """One allowed (src group -> dst group, proto, port); what impact reports and the compiler compare."""

    src_tenant: str
    src_group: str
    dst_tenant: str
    dst_group: str
    proto: str
    port: int

    def reversed(self) -> Flow:
        """The same flow the other way: B -> A on the same protocol and destination port (a RoCEv2 mirror)."""
        return Flow(self.dst_tenant, self.dst_group, self.src_tenant, self.src_group, self.proto, self.port)


def sync_data(engine: PolicyEngine, data: Mapping[str, Any]) -> None:
    """Make the engine's data equal to `data`, sending only the difference (incremental reload)."""
    current = engine.data()
    if current is data:
        return
    if not current:
        engine.set_data(data)
        return
    ops = diff_documents(current, data)
    if ops:
        engine.patch_data(ops)


def _ask(engine: PolicyEngine, query: str, input: Mapping[str, Any], data: Mapping[str, Any] | None) -> Any:
    """The raw answer, or raises with a reason ready for the caller's deny."""
    if not engine.modules():
        raise _Deny("no-policy: no policy version is loaded")
    if data is not None:
        sync_data(engine, data)
    value = engine.evaluate(query, dict(input))
    if value is None:
        raise _Deny(f"no-policy: {query} is undefined in the loaded policy")
    return value


class _Deny(Exception):
    pass


def _fail_closed(kind: str, exc: BaseException, input: Mapping[str, Any]) -> str:
    reason = str(exc) if isinstance(exc, _Deny) else f"engine-error: {exc}"
    log.warning("%s decision denied (fail closed): %s; input=%s", kind, reason, dict(input))
    return reason


def decide_flow(engine: PolicyEngine, flow: Mapping[str, Any], data: Mapping[str, Any] | None = None) -> FlowDecision:
    """Allow or deny one flow (see rego/flows.rego for the input), with the reasons."""
    try:
        value = _ask(engine, FLOW_QUERY, flow, data)
        allow, reasons = value["allow"], value["reasons"]
        if not isinstance(allow, bool) or not isinstance(reasons, list):
            raise _Deny(f"engine-error: malformed flow decision {value!r}")
    except Exception as exc:
        return FlowDecision(False, [_fail_closed("flow", exc, flow)])
    if not allow:
        log.info("flow denied: %s; input=%s", "; ".join(map(str, reasons)), dict(flow))
    return FlowDecision(allow, [str(r) for r in reasons])


def decide_grant_request(
    engine: PolicyEngine, data: Mapping[str, Any] | None, request: Mapping[str, Any]
) -> GrantDecision:
    """approve | pending (with approvers) | deny (with reasons) for a grant request (see rego/grants.rego).

    `data` is the document from `build_data`; the engine is brought up to it incrementally first
    (pass None to decide on the engine's current data)."""
    try:
        value = _ask(engine, GRANT_QUERY, request, data)
        outcome, approvers, reasons = value["outcome"], value["approvers"], value["reasons"]
        if outcome not in ("approve", "pending", "deny") or not isinstance(approvers, list):
            raise _Deny(f"engine-error: malformed grant decision {value!r}")
        if not isinstance(reasons, list):
            raise _Deny(f"engine-error: malformed grant decision {value!r}")
        if outcome == "pending" and not approvers:
            raise _Deny("engine-error: a pending grant decision named no approver")
    except Exception as exc:
        return GrantDecision("deny", [], [_fail_closed("grant", exc, request)])
    if outcome == "deny":
        log.info("grant request denied: %s", "; ".join(map(str, reasons)))
    return GrantDecision(outcome, [str(a) for a in approvers], [str(r) for r in reasons])


def authorize(
    engine: PolicyEngine, principal: Mapping[str, Any], action: str, resource: Mapping[str, Any] | None = None
) -> AuthzDecision:
    """May `principal` ({"id", "role", "tenant"}) perform `action` on `resource` ({"tenant"})?"""
    request = {"principal": dict(principal), "action": action, "resource": dict(resource or {})}
    try:
        value = _ask(engine, AUTHZ_QUERY, request, None)
        allow, reasons = value["allow"], value["reasons"]
        if not isinstance(allow, bool) or not isinstance(reasons, list):
            raise _Deny(f"engine-error: malformed authorization decision {value!r}")
    except Exception as exc:
        return AuthzDecision(False, [_fail_closed("authz", exc, request)])
    if not allow:
        log.info("authorization denied: %s", "; ".join(map(str, reasons)))
    return AuthzDecision(allow, [str(r) for r in reasons])


# ---------------------------------------------------------------- identities and flow sets


def parse_identity(text: str, trust_domain: str | None = None) -> dict[str, str]:
    """'spiffe://td/tenant/<t>/group/<g>/<w>' or '<t>/<g>' -> {"tenant", "group"[, "spiffe_id"]}. SPIFFE IDs
    go through pki's one parser; this only reads the project's layout out of the parsed segments: a workload's
    ID exactly (five segments), and in `trust_domain` when one is given. Anything else names no identity the
    policy knows: read as its tenant and group, an ID with a segment more or in another trust domain was never
    revoked, and a revoked workload was explained as allowed."""
    from pki.errors import InvalidSpiffeId
    from pki.spiffe_id import parse_spiffe_id

    if text.startswith("spiffe://"):
        layout = f"{text!r} is not a trustfabric SPIFFE ID (spiffe://<td>/tenant/<t>/group/<g>/<w>)"
        try:
            sid = parse_spiffe_id(text)
        except InvalidSpiffeId:
            raise InvalidInput(layout) from None
        seg = sid.segments
        if len(seg) == 5 and seg[0] == "tenant" and seg[2] == "group" and is_slug(seg[1]) and is_slug(seg[3]):
            if trust_domain is not None and sid.trust_domain != trust_domain:
                raise InvalidInput(f"{text!r} is not in this deployment's trust domain {trust_domain!r}")
            return {"tenant": seg[1], "group": seg[3], "spiffe_id": text}
        raise InvalidInput(layout)
    parts = text.split("/")
    if len(parts) == 2 and all(is_slug(p) for p in parts):
        return {"tenant": parts[0], "group": parts[1]}
    raise InvalidInput(f"{text!r} is neither a SPIFFE ID nor <tenant>/<group>")


def flow_input(src: str, dst: str, port: int, proto: str = "tcp", now_ns: int | None = None,
               trust_domain: str | None = None) -> dict[str, Any]:
    """The flows.rego input for an explain request; InvalidInput for malformed identities (a SPIFFE ID outside
    `trust_domain`, when given, included) or ports."""
    if proto not in ("tcp", "udp"):
        raise InvalidInput(f"proto {proto!r} must be tcp or udp")
    if not 1 <= port <= 65535:
        raise InvalidInput(f"port {port} must be 1-65535")
    out: dict[str, Any] = {"src": parse_identity(src, trust_domain), "dst": parse_identity(dst, trust_domain),
                           "proto": proto, "port": port}
    if now_ns is not None:
        out["now_ns"] = now_ns
    return out


def expand_allowed(raw: Any) -> dict[Flow, list[str]]:
    """The compact allowed_flows set -> every (src, dst, proto, port) flow and the reasons allowing it."""
    if not isinstance(raw, list):
        raise InvalidInput("data.flows.allowed_flows is undefined or not a set of flow entries")
    out: dict[Flow, list[str]] = {}
    for entry in raw:
        try:
            dt, dg, proto, reason = entry["dst_tenant"], entry["dst_group"], entry["proto"], entry["reason"]
            sources, ports = entry["sources"], entry["ports"]
            if not isinstance(sources, list) or not isinstance(ports, list):
                raise TypeError("sources and ports must be arrays")
            for source in sources:
                st, sg = str(source).split("/", 1)
                for port in ports:
                    if isinstance(port, bool) or not isinstance(port, int | float) or port != int(port):
                        raise ValueError(f"port {port!r} is not an integer")
                    out.setdefault(Flow(str(st), str(sg), str(dt), str(dg), str(proto), int(port)), []).append(
                        str(reason))
        except (KeyError, TypeError, ValueError) as exc:
            # a candidate policy is user input: a malformed answer is a 400 with the reason, never a 500
            raise InvalidInput(f"data.flows.allowed_flows has a malformed entry {entry!r:.200}: {exc}") from None
    return out


def allowed_flow_set(engine: PolicyEngine, now_ns: int | None = None) -> dict[Flow, list[str]]:
    """Every allowed flow under the engine's policy and data (grant expiry judged at `now_ns`, else the
    document's pinned now, else the engine's clock); PolicyEngineError if it cannot say."""
    return expand_allowed(engine.evaluate(ALLOWED_FLOWS_QUERY, {} if now_ns is None else {"now_ns": now_ns}))
