"""data.flows.allowed_flows element by element, in order, against an independent Python computation of the
documented semantics (rego/flows.rego's header; written from it, not from the Rego's formulation): the
compact elements are a contract for policy authors and the compiler, so a faster formulation must give the
same elements. On a hand-made document with every edge (quarantined / revoked tenants and groups, expired
grants, the platform tenant, grants naming unknown tenants or groups, self-grants, empty `exposed`) and on
generated ones; and each check the rules make is shown to matter: dropping it from the shipped Rego makes the
comparison fail."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from policy.decide import ALLOWED_FLOWS_QUERY
from policy.engines.embedded import RegorusEngine
from tests.policy.helpers import FAR_NS, NOW_NS, shipped

PLATFORM = "platform"


def _live(entry: Mapping[str, Any]) -> bool:
    """Neither quarantined nor revoked (Rego's `not x.quarantined; not x.revoked`: absent or false)."""
    return not entry.get("quarantined", False) and not entry.get("revoked", False)


def reference_elements(data: Mapping[str, Any], input_now_ns: int | None = None) -> list[dict[str, Any]]:
    """The documented allowed_flows: intra-tenant, then platform-service, then granted elements; within each,
    tenants, groups, protocols and grant ids in sorted order."""
    tf = data.get("tf", {})
    tenants: dict[str, Any] = tf.get("tenants", {})
    grants: dict[str, Any] = tf.get("grants", {})
    now = input_now_ns if input_now_ns is not None else tf["now_ns"]
    live: dict[str, list[str]] = {
        t: sorted(g for g, grp in tenant["groups"].items() if _live(grp))
        for t, tenant in sorted(tenants.items()) if _live(tenant)
    }

    def element(dt: str, dg: str, proto: str, ports: list[int], reason: str, sources: list[str]) -> dict[str, Any]:
        return {"dst_tenant": dt, "dst_group": dg, "proto": proto, "ports": ports, "reason": reason,
                "sources": sources}

    intra = [
        element(t, dg, proto, ports, "intra-tenant", [f"{t}/{g}" for g in groups if g != dg])
        for t, groups in live.items() if len(groups) > 1
        for dg in groups
        for proto, ports in sorted(tenants[t]["groups"][dg]["exposed"].items()) if ports
    ]
    everyone = [f"{t}/{g}" for t, groups in live.items() if t != PLATFORM for g in groups]
    platform = [
        element(PLATFORM, dg, proto, ports, "platform-service", everyone)
        for dg in live.get(PLATFORM, []) if everyone
        for proto, ports in sorted(tenants[PLATFORM]["groups"][dg]["exposed"].items()) if ports
    ]
    granted = [
        element(dt, g["dst_group"], g["proto"], sorted(g["ports"]), f"grant:{gid}", [f"{st}/{g['src_group']}"])
        for st, by_dst in sorted(grants.items()) if st in live
        for dt, by_id in sorted(by_dst.items()) if dt != st and dt in live
        for gid, g in sorted(by_id.items())
        if g["expires_at_ns"] > now and g["src_group"] in live[st] and g["dst_group"] in live[dt]
    ]
    return intra + platform + granted


def group(exposed: dict[str, list[int]], **flags: bool) -> dict[str, Any]:
    return {"labels": {}, "exposed": exposed, "sensitivity": "normal", "quarantined": False, **flags}


def grant(src_group: str, dst_group: str, ports: list[int], expires_at_ns: int = FAR_NS,
          proto: str = "tcp") -> dict[str, Any]:
    return {"src_group": src_group, "dst_group": dst_group, "proto": proto, "ports": ports,
            "expires_at_ns": expires_at_ns}


def edge_document() -> dict[str, Any]:
    tenants = {
        "acme": {"quarantined": False, "groups": {
            "web": group({"tcp": [443]}),
            "db": group({"tcp": [5432], "udp": [5433]}),
            "jail": group({"tcp": [22]}, quarantined=True),
            "gone": group({"tcp": [23]}, revoked=True),
            "quiet": group({}),  # exposes nothing: a source, never a destination
            "shut": group({"tcp": [], "udp": [9000]}),  # an empty protocol is no element
        }},
        "globex": {"quarantined": False, "groups": {"api": group({"tcp": [8443, 9443]}), "batch": group({})}},
        "solo": {"quarantined": False, "groups": {"only": group({"tcp": [80]}), "x": group({"tcp": [81]},
                                                                                        quarantined=True)}},
        "evil": {"quarantined": True, "groups": {"bot": group({"tcp": [80]}), "c2": group({"tcp": [81]})}},
        "burnt": {"quarantined": False, "revoked": True, "groups": {"a": group({"tcp": [80]}),
                                                                   "b": group({"tcp": [81]})}},
        "empty": {"quarantined": False, "groups": {}},
        PLATFORM: {"quarantined": False, "groups": {
            "dns": group({"udp": [53], "tcp": [53]}),
            "s3": group({"tcp": [443]}, quarantined=True),
            "ntp": group({"udp": [123]}, revoked=True),
            "idle": group({}),
        }},
    }
    grants = {
        "acme": {
            "globex": {
                "g-live": grant("web", "api", [9443, 8443]),  # unsorted ports: sorted in the element
                "g-expired": grant("db", "api", [8443], expires_at_ns=NOW_NS - 1),
                "g-now": grant("db", "api", [8443], expires_at_ns=NOW_NS),  # expires at now: gone
                "g-from-jail": grant("jail", "api", [8443]),
                "g-from-gone": grant("gone", "api", [8443]),
                "g-to-unknown": grant("web", "nosuch", [8443]),
                "g-to-empty": grant("quiet", "batch", [1], proto="udp"),
            },
            "acme": {"g-self": grant("web", "db", [5432])},
            "evil": {"g-to-quarantined": grant("web", "bot", [80])},
            "burnt": {"g-to-revoked": grant("web", "a", [80])},
            "ghost": {"g-to-unknown-tenant": grant("web", "x", [80])},
            PLATFORM: {"g-to-platform": grant("db", "dns", [853]), "g-to-s3": grant("db", "s3", [443])},
        },
        "unknown-src": {"acme": {"g-from-unknown": grant("x", "web", [443])}},
        "evil": {"acme": {"g-from-quarantined": grant("bot", "web", [443])}},
        "burnt": {"acme": {"g-from-revoked": grant("a", "web", [443])}},
        "solo": {"acme": {"g-from-unknown-group": grant("nosuch", "web", [443]),
                          "g-from-solo": grant("only", "quiet", [7])}},
        PLATFORM: {"acme": {"g-from-platform": grant("dns", "db", [5432])}},
    }
    return {"tf": {"tenants": tenants, "grants": grants, "revoked": {}, "now_ns": NOW_NS}}


@pytest.fixture(scope="module")
def modules() -> dict[str, str]:
    return {k: v for k, v in shipped().items() if not k.endswith("_test.rego")}


def evaluate(modules: Mapping[str, str], data: Mapping[str, Any], input: Mapping[str, Any] | None = None) -> Any:
    engine = RegorusEngine(modules, data)
    try:
        return engine.evaluate(ALLOWED_FLOWS_QUERY, dict(input or {}))
    finally:
        engine.close()


def test_the_edge_document_gives_exactly_the_documented_elements(modules: dict[str, str]) -> None:
    data = edge_document()
    expected = reference_elements(data)
    assert evaluate(modules, data) == expected
    # the reference is not vacuous: every kind of element, and the edges left out
    reasons = {e["reason"] for e in expected}
    assert reasons == {"intra-tenant", "platform-service", "grant:g-live", "grant:g-to-empty", "grant:g-to-platform",
                       "grant:g-from-solo", "grant:g-from-platform"}
    web = next(e for e in expected if e["reason"] == "intra-tenant" and e["dst_group"] == "web")
    assert web["sources"] == ["acme/db", "acme/quiet", "acme/shut"]
    [dns_tcp, dns_udp] = [e for e in expected if e["reason"] == "platform-service"]
    assert dns_tcp["sources"] == dns_udp["sources"] == [
        "acme/db", "acme/quiet", "acme/shut", "acme/web", "globex/api", "globex/batch", "solo/only"]
    assert not any(e["dst_tenant"] == "solo" for e in expected), "a tenant's only live group has no intra source"


def test_input_now_overrides_the_documents(modules: dict[str, str]) -> None:
    data = edge_document()
    later = FAR_NS  # every grant has expired by then
    data["tf"]["grants"]["acme"]["globex"]["g-soon"] = grant("web", "api", [1], expires_at_ns=NOW_NS + 10)
    assert evaluate(modules, data) == reference_elements(data)
    assert "grant:g-soon" in {e["reason"] for e in reference_elements(data)}
    assert evaluate(modules, data, {"now_ns": NOW_NS + 10}) == reference_elements(data, NOW_NS + 10)
    assert evaluate(modules, data, {"now_ns": later}) == reference_elements(data, later)
    assert not [e for e in reference_elements(data, later) if e["reason"].startswith("grant:")]


# Each check of the rules, dropped from the shipped Rego: the comparison above must then fail.
MUTATIONS = {
    "tenant quarantine": ("\tnot tenant.quarantined\n", ""),
    "tenant revoked": ("\tnot tenant.revoked\n", ""),
    "group quarantine": ("; not grp.quarantined", ""),
    "group revoked": ("; not grp.revoked", ""),
    "grant expiry": ("\tg.expires_at_ns > now\n", ""),
    "self-grant": ("\tst != dt\n", ""),
    "grant destination group": ("\tdsts[g.dst_group]\n", ""),
    "empty exposed protocol": ("\tports != []\n]\n\n# Every live group", "]\n\n# Every live group"),
}


@pytest.mark.parametrize("name", sorted(MUTATIONS))
def test_dropping_any_check_is_caught(modules: dict[str, str], name: str) -> None:
    old, new = MUTATIONS[name]
    assert modules["flows.rego"].count(old) == 1, f"{name}: the check is no longer written {old!r}"
    mutated = {**modules, "flows.rego": modules["flows.rego"].replace(old, new)}
    data = edge_document()
    assert evaluate(mutated, data) != reference_elements(data)


# ---------------------------------------------------------------- generated documents

TENANTS = ["a", "b", "c", PLATFORM]
GROUPS = ["x", "y", "z"]


@st.composite
def documents(draw: st.DrawFn) -> dict[str, Any]:
    tenants: dict[str, Any] = {}
    for t in draw(st.lists(st.sampled_from(TENANTS), max_size=4, unique=True)):
        groups = {}
        for g in draw(st.lists(st.sampled_from(GROUPS), max_size=3, unique=True)):
            exposed = {proto: sorted(draw(st.sets(st.sampled_from([53, 443, 8080]), max_size=2)))
                       for proto in draw(st.lists(st.sampled_from(["tcp", "udp"]), max_size=2, unique=True))}
            flags = {"quarantined": draw(st.integers(0, 4)) == 0}
            if draw(st.integers(0, 5)) == 0:
                flags["revoked"] = True
            groups[g] = group(exposed, **flags)
        tenant: dict[str, Any] = {"quarantined": draw(st.integers(0, 5)) == 0, "groups": groups}
        if draw(st.integers(0, 6)) == 0:
            tenant["revoked"] = True
        tenants[t] = tenant
    names = [*TENANTS, "ghost"]  # grants may name tenants and groups that do not exist
    grants: dict[str, Any] = {}
    for n in range(draw(st.integers(0, 8))):
        stn, dtn = draw(st.sampled_from(names)), draw(st.sampled_from(names))
        grants.setdefault(stn, {}).setdefault(dtn, {})[f"g{n}"] = grant(
            draw(st.sampled_from([*GROUPS, "w"])), draw(st.sampled_from([*GROUPS, "w"])),
            draw(st.lists(st.sampled_from([22, 443, 9000]), min_size=1, max_size=3, unique=True)),
            expires_at_ns=NOW_NS + draw(st.integers(-2, 2)), proto=draw(st.sampled_from(["tcp", "udp"])))
    return {"tf": {"tenants": tenants, "grants": grants, "revoked": {}, "now_ns": NOW_NS}}


@pytest.fixture(scope="module")
def engine(modules: dict[str, str]) -> Iterator[RegorusEngine]:
    e = RegorusEngine(modules, {})
    yield e
    e.close()


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                 HealthCheck.function_scoped_fixture])
@given(documents(), st.sampled_from([None, NOW_NS - 1, NOW_NS + 1]))
def test_generated_documents_give_exactly_the_documented_elements(engine: RegorusEngine, data: dict[str, Any],
                                                                  now: int | None) -> None:
    engine.set_data(data)
    got = engine.evaluate(ALLOWED_FLOWS_QUERY, {} if now is None else {"now_ns": now})
    assert got == reference_elements(data, now)
