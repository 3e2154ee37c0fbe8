"""Test helpers: shipped modules, data documents built by hand, and an independent Python reference
of the flow rules (written from the issue's rules, not from the Rego)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from functools import cache
from pathlib import Path
from typing import Any

from policy.authoring import PreparedVersion, prepare
from policy.decide import Flow
from policy.versions import load_dir

ROOT = Path(__file__).resolve().parents[2]
REGO_DIR = ROOT / "rego"
FAR_NS = 9_999_999_999 * 10**9
NOW_NS = 1_800_000_000 * 10**9


def shipped() -> dict[str, str]:
    return load_dir(REGO_DIR)


def prepared_shipped() -> PreparedVersion:
    """The shipped rego/ checked, compiled and its Rego tests run, as `init` uploads it: once per test process
    for a given content (about a second each time, and a pure function of the modules), a fresh copy of the
    modules each call so no test can change what the next one gets."""
    prepared = _prepared(tuple(sorted(shipped().items())))
    return replace(prepared, modules=dict(prepared.modules))


@cache
def _prepared(modules: tuple[tuple[str, str], ...]) -> PreparedVersion:
    return prepare(dict(modules))


def group(ports: list[tuple[str, int]], *, sensitivity: str = "normal", quarantined: bool = False,
          labels: dict[str, str] | None = None) -> dict[str, Any]:
    exposed: dict[str, list[int]] = {}
    for proto, port in ports:
        exposed.setdefault(proto, [])
        if port not in exposed[proto]:
            exposed[proto].append(port)
    return {
        "labels": labels or {},
        "ports": [{"proto": p, "port": n} for p, n in ports],
        "exposed": {k: sorted(v) for k, v in sorted(exposed.items())},
        "sensitivity": sensitivity,
        "quarantined": quarantined,
    }


def doc(tenants: dict[str, dict[str, Any]], grants: list[dict[str, Any]] | None = None,
        revoked: list[str] | None = None, now_ns: int = NOW_NS) -> dict[str, Any]:
    """tenants: {slug: {"quarantined": bool, "groups": {name: group(...)}}}; grants: flat list with ids."""
    nested: dict[str, Any] = {}
    for g in grants or []:
        nested.setdefault(g["src_tenant"], {}).setdefault(g["dst_tenant"], {})[g["id"]] = {
            "src_group": g["src_group"], "dst_group": g["dst_group"], "proto": g["proto"],
            "ports": sorted(g["ports"]), "expires_at_ns": g.get("expires_at_ns", FAR_NS),
        }
    return {"tf": {"tenants": tenants, "grants": nested, "revoked": {r: True for r in revoked or []},
                   "now_ns": now_ns}}


def small_doc() -> dict[str, Any]:
    return doc(
        {
            "acme": {"quarantined": False, "groups": {
                "web": group([("tcp", 443)]), "db": group([("tcp", 5432)], sensitivity="sensitive"),
                "batch": group([("udp", 9000), ("tcp", 8080)]),
            }},
            "globex": {"quarantined": False, "groups": {"api": group([("tcp", 8443), ("tcp", 9443)])}},
            "evil": {"quarantined": True, "groups": {"bot": group([("tcp", 80)])}},
            "platform": {"quarantined": False, "groups": {
                "dns": group([("udp", 53), ("tcp", 53)]), "s3": group([("tcp", 443)]),
            }},
        },
        grants=[
            {"id": "g1", "src_tenant": "acme", "src_group": "web", "dst_tenant": "globex", "dst_group": "api",
             "proto": "tcp", "ports": [8443]},
            {"id": "g2", "src_tenant": "evil", "src_group": "bot", "dst_tenant": "acme", "dst_group": "web",
             "proto": "tcp", "ports": [443]},
            {"id": "g3", "src_tenant": "globex", "src_group": "api", "dst_tenant": "acme", "dst_group": "db",
             "proto": "tcp", "ports": [5432], "expires_at_ns": NOW_NS - 1},
        ],
        revoked=["spiffe://td/tenant/acme/group/web/bad"],
    )


# ---------------------------------------------------------------- the independent reference


def reference_allowed(data: Mapping[str, Any], *, platform_rule: bool = True, now_ns: int | None = None) -> set[Flow]:
    tf = data["tf"]
    tenants = tf["tenants"]
    now = tf["now_ns"] if now_ns is None else now_ns

    def usable(t: str, g: str) -> bool:
        return t in tenants and not tenants[t]["quarantined"] and g in tenants[t]["groups"] \
            and not tenants[t]["groups"][g]["quarantined"]

    out: set[Flow] = set()
    for t, tenant in tenants.items():
        for sg in tenant["groups"]:
            for dt, dtenant in tenants.items():
                for dg, dgroup in dtenant["groups"].items():
                    if not (usable(t, sg) and usable(dt, dg)):
                        continue
                    same = t == dt
                    if same and sg == dg:
                        continue
                    platform = dt == "platform" and t != "platform" and platform_rule
                    if same or platform:
                        for p in dgroup["ports"]:
                            out.add(Flow(t, sg, dt, dg, p["proto"], p["port"]))
    for st, by_dst in tf["grants"].items():
        for dt, by_id in by_dst.items():
            if st == dt:
                continue
            for g in by_id.values():
                if g["expires_at_ns"] > now and usable(st, g["src_group"]) and usable(dt, g["dst_group"]):
                    for port in g["ports"]:
                        out.add(Flow(st, g["src_group"], dt, g["dst_group"], g["proto"], port))
    return out


def reference_allows(data: Mapping[str, Any], flow: Mapping[str, Any]) -> bool:
    """The reference decision for one flow input (identity checks included)."""
    tf = data["tf"]
    for side in (flow["src"], flow["dst"]):
        sid = side.get("spiffe_id")
        if sid is None:
            continue
        if tf["revoked"].get(sid) or f"/tenant/{side['tenant']}/group/{side['group']}/" not in sid:
            return False
    f = Flow(flow["src"]["tenant"], flow["src"]["group"], flow["dst"]["tenant"], flow["dst"]["group"],
             flow["proto"], flow["port"])
    return f in reference_allowed(data, now_ns=flow.get("now_ns"))


def flow(st: str, sg: str, dt: str, dg: str, proto: str, port: int, **extra: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"src": {"tenant": st, "group": sg}, "dst": {"tenant": dt, "group": dg},
                           "proto": proto, "port": port}
    out.update(extra)
    return out


def corpus(data: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Every (src, dst) pair of the document on every port any group exposes, plus odd cases."""
    tenants = data["tf"]["tenants"]
    groups = [(t, g) for t, tenant in tenants.items() for g in tenant["groups"]]
    ports = sorted({(p["proto"], p["port"]) for t, g in groups for p in tenants[t]["groups"][g]["ports"]})
    out = [flow(st, sg, dt, dg, proto, port) for st, sg in groups for dt, dg in groups for proto, port in ports]
    out.append(flow("nobody", "x", "acme", "web", "tcp", 443))
    out.append({"src": "acme"})
    return out
