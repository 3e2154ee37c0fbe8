"""Audit events as OCSF (1.5.0) events: a pure, deterministic mapping from the signed event document.

| actions                                                      | OCSF class (uid)          |
|--------------------------------------------------------------|---------------------------|
| `flow.*`, `connection.*`, `decision.*`, `policy.decision`    | Network Activity (4001), disposition Allowed/Blocked |
| `svid.issue`, `jwtsvid.issue`, `node.attest`, `token.issue`, `session.*` ... | Authorize Session (3003) |
| `api.*`, `audit.*`, `export.*`                               | API Activity (6003)       |
| anything else: `tenant.create`, `policy.activate`, `grant.approve`, `ruleset.apply`... | Entity Mgmt (3004) |

The actor is `actor.user`: `name` its id, `uid` (and the account's) its id as the log shows it -- `alice@acme`
for a principal of a tenant, unique where the id alone is not -- and, for such a principal, `org` (OCSF's
Organization: "cloud and SaaS logical hierarchies", a tenant) with the tenant as `uid` and `name`. The event's
own tenant (whose object it is) stays `metadata.tenant_uid`: globex's alice approving acme's grant is
`actor.user.org.uid` globex, `metadata.tenant_uid` acme. An event whose actor has no tenant (every event written
before actors named theirs) maps exactly as it always did, so old OCSF exports still verify.

The signed document and its leaf hash ride along in `unmapped.trustfabric`, so an OCSF export verifies
offline like the others (the verifier re-derives the OCSF fields and rejects any difference).
Header and gap records are the JSONL ones.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import datetime
from typing import IO, Any

import rfc8785

from audit.actor import qualified_id
from audit.export.jsonl import JsonlWriter
from audit.export.records import Event, Format, Record, compact, header_output, is_hex64, json_lines, malformed

OCSF_VERSION = "1.5.0"
PRODUCT = {"name": "trustfabric", "vendor_name": "trustfabric", "feature": {"name": "audit"}}

ENTITY_MANAGEMENT = (3004, "Entity Management", 3, "Identity & Access Management")
AUTHORIZE_SESSION = (3003, "Authorize Session", 3, "Identity & Access Management")
NETWORK_ACTIVITY = (4001, "Network Activity", 4, "Network Activity")
API_ACTIVITY = (6003, "API Activity", 6, "Application Activity")

_CRUD = {
    1: ("Create", {"create", "issue", "upload", "register", "add", "generate", "import", "prepare", "request", "init"}),
    2: ("Read", {"read", "export", "view", "list", "get", "download"}),
    3: (
        "Update",
        {
            "update",
            "activate",
            "rotate",
            "approve",
            "apply",
            "rollback",
            "retire",
            "enable",
            "disable",
            "set",
            "reject",
            "deny",
            "reconcile",
            "plan",
            "stage",
            "renew",
            "quarantine",
            "unquarantine",
        },
    ),
    4: ("Delete", {"delete", "revoke", "remove", "expire", "destroy", "purge"}),
}
_ALLOW = {"allow", "allowed", "accept", "permit", "open"}
_DENY = {"deny", "denied", "drop", "block", "blocked", "reject", "refuse"}
_NETWORK_NOUNS = {"flow", "connection", "decision"}
_AUTHZ_ACTIONS = {
    "svid.issue",
    "svid.renew",
    "svid.jwt.issue",
    "x509svid.issue",
    "jwtsvid.issue",
    "jwt.issue",
    "node.attest",
    "node.renew",
    "token.issue",
    "session.authorize",
    "session.assign",
}
_API_NOUNS = {"api", "audit", "export"}
_USER_TYPE = {
    "admin": (2, "Admin"),
    "system": (3, "System"),
    "tenant": (1, "User"),
    "auditor": (1, "User"),
    "security": (1, "User"),
}


def _crud(verb: str) -> tuple[int, str]:
    for activity_id, (name, verbs) in _CRUD.items():
        if verb in verbs:
            return activity_id, name
    return 99, "Other"


def _disposition(verb: str, summary: dict[str, Any]) -> tuple[int, str] | None:
    decision = summary.get("decision", summary.get("disposition", verb))
    decision = str(decision).lower()
    if decision in _ALLOW:
        return 1, "Allowed"
    if decision in _DENY:
        return 2, "Blocked"
    return None


def classify(action: str, summary: dict[str, Any]) -> dict[str, Any]:
    """The OCSF class, category and activity (and disposition for network events) of an action."""
    _noun, _, verb = action.rpartition(".")
    first = action.split(".", 1)[0]
    out: dict[str, Any] = {}
    if first in _NETWORK_NOUNS or action == "policy.decision":
        cls = NETWORK_ACTIVITY
        disp = _disposition(verb, summary)
        if disp is None:
            activity = (99, "Other")
        else:
            activity = (1, "Open") if disp[0] == 1 else (5, "Refuse")
            out.update(
                disposition_id=disp[0],
                disposition=disp[1],
                action_id=disp[0],
                action="Allowed" if disp[0] == 1 else "Denied",
            )
    elif action in _AUTHZ_ACTIONS or first == "session":
        cls, activity = AUTHORIZE_SESSION, (1, "Assign Privileges")
    elif first in _API_NOUNS:
        cls, activity = API_ACTIVITY, _crud(verb)
    else:
        cls, activity = ENTITY_MANAGEMENT, _crud(verb)
    class_uid, class_name, category_uid, category_name = cls
    out.update(
        class_uid=class_uid,
        class_name=class_name,
        category_uid=category_uid,
        category_name=category_name,
        activity_id=activity[0],
        activity_name=activity[1],
        type_uid=class_uid * 100 + activity[0],
        type_name=f"{class_name}: {activity[1]}",
    )
    return out


def _endpoint(value: Any) -> dict[str, Any]:
    if isinstance(value, dict):
        return {k: v for k, v in value.items() if k in {"name", "uid", "ip", "port", "hostname"}}
    return {"name": str(value)} if value is not None else {"name": "unknown"}


def to_ocsf(document: dict[str, Any], leaf_hash: str, *, origin: str) -> dict[str, Any]:
    """One OCSF event for one signed audit event document."""
    action: str = document["action"]
    summary: dict[str, Any] = document.get("summary") or {}
    actor = document["actor"]
    obj = document["object"]
    ts = datetime.fromisoformat(document["ts"].replace("Z", "+00:00"))
    type_id, type_name = _USER_TYPE.get(actor["kind"], (99, "Other"))
    event: dict[str, Any] = classify(action, summary)
    event.update(
        time=int(ts.timestamp() * 1000),
        severity_id=1,
        severity="Informational",
        status_id=1,
        status="Success",
        message=f"{action} {obj['type']}/{obj['id']}" + (f": {document['reason']}" if document.get("reason") else ""),
        metadata={
            "version": OCSF_VERSION,
            "product": PRODUCT,
            "uid": f"{origin}/{document['seq']}",
            "sequence": document["seq"],
            "log_name": "audit",
            "log_provider": origin,
            "original_time": document["ts"],
            **({"tenant_uid": document["tenant"]} if document.get("tenant") else {}),
            **({"correlation_uid": document["request_id"]} if document.get("request_id") else {}),
        },
        actor={"user": _user(actor, type_id, type_name)},
        unmapped={"trustfabric": {"event": document, "leaf_hash": leaf_hash}},
    )
    cls = event["class_uid"]
    if cls == ENTITY_MANAGEMENT[0]:
        event["entity"] = {"type": obj["type"], "uid": obj["id"], "name": obj["id"]}
    elif cls == AUTHORIZE_SESSION[0]:
        event["user"] = {"uid": obj["id"], "name": obj["id"], "type": obj["type"]}
        event["privileges"] = [action]
    elif cls == API_ACTIVITY[0]:
        event["api"] = {
            "operation": action,
            "service": {"name": "trustfabric", "uid": "trustfabric-api", "version": "v1"},
        }
        event["src_endpoint"] = {"name": actor["id"]}
        if document.get("request_id"):
            event["api"]["request"] = {"uid": document["request_id"]}
    else:
        event["src_endpoint"] = _endpoint(summary.get("src", summary.get("source")))
        event["dst_endpoint"] = _endpoint(summary.get("dst", summary.get("destination", obj["id"])))
    return event


def _user(actor: dict[str, Any], type_id: int, type_name: str) -> dict[str, Any]:
    """OCSF `actor.user` of an event's actor (the module's docstring says how its tenant maps)."""
    tenant = actor.get("tenant")
    uid = qualified_id(actor["id"], tenant)
    user: dict[str, Any] = {
        "uid": uid,
        "name": actor["id"],
        "type": actor["kind"],
        "type_id": type_id,
        "account": {"uid": uid, "name": actor["id"], "type_id": 0, "type": type_name},
    }
    if tenant is not None:
        user["org"] = {"uid": tenant, "name": tenant}
    return user


class OcsfWriter(JsonlWriter):
    def event(self, data: str, leaf_hash: str) -> None:
        self.out.write(compact(to_ocsf(json.loads(data), leaf_hash, origin=self.origin)) + b"\n")


def _event(lineno: int, line: bytes, origin: str) -> Event | None:
    """An OCSF event line: the signed document it carries, and whether its OCSF fields are the ones
    to_ocsf derives from that document (any difference is tampering)."""
    if not line.startswith(b"{") or b'"class_uid"' not in line:
        return None
    try:
        obj = json.loads(line)
    except ValueError as exc:
        raise malformed(lineno, f"not JSON ({exc})") from exc
    if not isinstance(obj, dict) or "class_uid" not in obj:
        return None
    tf = (obj.get("unmapped") or {}).get("trustfabric") if isinstance(obj.get("unmapped"), dict) else None
    if not isinstance(tf, dict) or not isinstance(tf.get("event"), dict) or not is_hex64(tf.get("leaf_hash")):
        raise malformed(lineno, "OCSF event lacks unmapped.trustfabric.event / leaf_hash")
    doc = tf["event"]
    try:
        data = bytes(rfc8785.dumps(doc))
    except Exception as exc:
        raise malformed(lineno, f"OCSF event document is not canonicalizable: {exc}") from exc
    try:
        expected = to_ocsf(doc, tf["leaf_hash"], origin=origin)
    except (KeyError, TypeError, ValueError, AttributeError):
        expected = None
    return Event(lineno, data, tf["leaf_hash"], doc, mapped_differs=expected != obj)


def read_ocsf(stream: IO[bytes]) -> Iterator[Record]:
    return json_lines(stream, _event)


FORMAT = Format(
    name="ocsf",
    media_type="application/x-ndjson",
    extension="ocsf.jsonl",
    writer=OcsfWriter,
    reader=read_ocsf,
    detects=lambda first: header_output(first) == "ocsf",
)
