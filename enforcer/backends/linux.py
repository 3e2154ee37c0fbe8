"""Leaf backend for the lab: the compiler's Linux rendering (enforcer.render.linux) inside the network
namespace that plays the leaf.

What a leaf is made of here, and who owns what:
  - nftables: one `inet` table (`tf_leaf`), replaced whole in ONE libnftables transaction (the batch adds,
    deletes and re-adds the table), run by a thread that entered the leaf's namespace (enforcer.netns), so
    the root namespace's ruleset is never touched. A batch the kernel refuses changes nothing.
  - VRFs: a routing table per tenant (id = the L3VNI) selected by `ip rule iif <attachment> lookup <vni>`;
    the table ends in `unreachable default` (v4 and v6), so a lookup never falls through to the main table
    (what a VRF device's l3mdev rule does), and holds the attachments' gateway address as a local route,
    so the leaf answers ARP for it inside the VRF. Multi-leaf fabrics add, per L3VNI, the vxlan device
    that carries the VRF between leaves (`iif <vxlan> lookup <vni>`); a route `via_leaf` becomes
    `via <that leaf's VTEP> dev <vxlan> onlink` (IPv6: via the VTEP's IPv4-mapped address, as FRR does).
  - ip rules with a priority in [RULE_PRIORITY_BASE, OWN_RULES_END) are ours, and so are the routes in the
    tables they (or the rule set) name; nothing else in the namespace is read as ours or changed.

apply converges in an order that is never more open than the old or the new rule set: first the ip rules
and routes to destinations a table did not have (the old ACLs do not admit flows to them), then the
nftables transaction, which is the commit point (if it or the additions fail, the additions are taken back
and the previous set stays in force), then routes that change next hop and stale rules/routes are removed
(a failure there, after the commit, is an ApplyError that says so; drift shows the rest, the next apply
converges it).
installed() reads the table, the rules and the routes back from the kernel; drift() compares that, after
one normalisation applied to both sides, with what `rules` renders to.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import subprocess
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from enforcer.backends.base import RuleCounter
from enforcer.errors import ApplyError, NotApplied
from enforcer.fabric import Fabric
from enforcer.ir import DeviceRuleSet
from enforcer.netns import NetnsError, run_in
from enforcer.render.linux import RULE_PRIORITY_BASE, render_linux

OWN_RULES_END = 32000  # our ip rule priorities: [RULE_PRIORITY_BASE, OWN_RULES_END)
FABRIC_RULE_BASE = 30000  # `iif <L3VNI vxlan device> lookup <vni>`, one per VNI
RESERVED_TABLES = frozenset({0, 253, 254, 255})  # unspec, default, main, local

# One libnftables call at a time in this process: nft_ctx_new's one-time set-up (GMP, xtables) is not
# synchronised, and the library does not promise that contexts on several threads are safe. Agents run a
# device loop per leaf on its own thread; a leaf's transaction takes milliseconds, so the lock costs nothing.
_LIBNFTABLES = threading.Lock()


@dataclass(frozen=True)
class LeafWiring:
    """How a leaf's rule set meets the interfaces that realise it (the lab writes it into its state file)."""

    port_names: Mapping[str, str] = field(default_factory=dict)  # IR attachment (swp1.101) -> interface
    l3vni: Mapping[int, str] = field(default_factory=dict)  # VNI -> the vxlan device carrying it between leaves
    vteps: Mapping[str, str] = field(default_factory=dict)  # other leaf -> its VTEP (IPv4)
    gateway_v4: str | None = None  # the attachments' gateway address, local in every VRF table

    def to_dict(self) -> dict[str, Any]:
        return {"port_names": dict(sorted(self.port_names.items())),
                "l3vni": {str(k): v for k, v in sorted(self.l3vni.items())},
                "vteps": dict(sorted(self.vteps.items())), "gateway_v4": self.gateway_v4}

    @staticmethod
    def from_dict(d: Mapping[str, Any]) -> LeafWiring:
        return LeafWiring(dict(d.get("port_names", {})), {int(k): v for k, v in d.get("l3vni", {}).items()},
                          dict(d.get("vteps", {})), d.get("gateway_v4"))


class IpRule(NamedTuple):
    family: int
    priority: int
    iif: str
    table: int


class Route(NamedTuple):
    family: int
    table: int
    type: str  # unicast | unreachable | local
    dst: str  # CIDR
    dev: str  # "" for unreachable
    via: str  # "" when on-link

    def spec(self) -> str:
        """The route as `ip route` arguments (without the verb)."""
        if self.type == "unreachable":
            return f"unreachable {self.dst} table {self.table}"
        if self.type == "local":
            return f"local {self.dst} dev {self.dev} table {self.table}"
        via = f" via {self.via}" if self.via else ""
        onlink = " onlink" if self.via else ""
        return f"{self.dst}{via} dev {self.dev}{onlink} table {self.table}"


@dataclass(frozen=True)
class _Desired:
    nft: dict[str, Any]
    rules: frozenset[IpRule]
    routes: frozenset[Route]
    devices: frozenset[str]
    tables: frozenset[int]


def _family(cidr: str) -> int:
    return 6 if ":" in cidr else 4


def _cidr(text: str, family: int) -> str:
    if text == "default":
        return "0.0.0.0/0" if family == 4 else "::/0"
    return str(ipaddress.ip_network(text, strict=False))


class LinuxBackend:
    def __init__(self, netns: str, fabric: Fabric, wiring: LeafWiring | None = None, table: str = "tf_leaf"
                 ) -> None:
        self.netns = netns
        self.fabric = fabric
        self.wiring = wiring or LeafWiring()
        self.table = table

    # ------------------------------------------------------------------ desired state (pure)
    def _desired(self, rules: DeviceRuleSet) -> _Desired:
        w = self.wiring
        cfg = render_linux(rules, self.fabric, self.table, w.port_names, sorted(w.l3vni.values()))
        tables = {v.vni for v in rules.vrfs} | set(w.l3vni)
        bad = sorted(tables & RESERVED_TABLES)
        if bad:
            raise ApplyError(f"{rules.device}: VNI {bad[0]} would use a reserved Linux routing table")
        ip_rules = {IpRule(fam, r["priority"], r["iif"], r["table"]) for r in cfg.ip_rules for fam in (4, 6)}
        ip_rules |= {IpRule(fam, FABRIC_RULE_BASE + i, dev, vni)
                     for i, (vni, dev) in enumerate(sorted(w.l3vni.items())) for fam in (4, 6)}
        routes: set[Route] = set()
        for r in cfg.routes:
            fam = _family(r["dst"])
            dst = _cidr(r["dst"], fam)
            if "dev" in r:
                routes.add(Route(fam, r["table"], "unicast", dst, r["dev"], ""))
                continue
            vtep, dev = w.vteps.get(r["via_leaf"]), w.l3vni.get(r["vni"])
            if vtep is None or dev is None:
                raise ApplyError(f"{rules.device}: no path to leaf {r['via_leaf']} in VNI {r['vni']} "
                                 "(the wiring names no VTEP or vxlan device for it)")
            routes.add(Route(fam, r["table"], "unicast", dst, dev, vtep if fam == 4 else f"::ffff:{vtep}"))
        for t in tables:
            routes |= {Route(4, t, "unreachable", "0.0.0.0/0", "", ""), Route(6, t, "unreachable", "::/0", "", "")}
            if w.gateway_v4:
                routes.add(Route(4, t, "local", _cidr(w.gateway_v4, 4), "lo", ""))
        devices = {r.iif for r in ip_rules} | {r.dev for r in routes if r.dev}
        return _Desired(cfg.nft, frozenset(ip_rules), frozenset(routes), frozenset(devices), frozenset(tables))

    def render(self, rules: DeviceRuleSet) -> str:
        """The nftables batch (JSON, one line), then the VRFs' ip rules and routes (`ip` arguments)."""
        d = self._desired(rules)
        lines = [json.dumps(d.nft, sort_keys=True, separators=(",", ":")), *_routing_lines(d.rules, d.routes)]
        return "\n".join(lines) + "\n"

    # ------------------------------------------------------------------ reading the device
    def _ip(self, *args: str, batch: str | None = None) -> str:
        try:
            proc = subprocess.run(["ip", "-n", self.netns, *args], input=batch, capture_output=True, text=True,
                                  timeout=60)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise ApplyError(f"{self.netns}: ip {' '.join(args[:3])}: {exc}") from None
        if proc.returncode != 0:
            raise ApplyError(f"{self.netns}: ip {' '.join(args[:3])} failed: {proc.stderr.strip()[:500]}")
        return proc.stdout

    def _links(self) -> set[str]:
        return {x["ifname"] for x in json.loads(self._ip("-j", "link", "show") or "[]")}

    def _rules(self) -> set[IpRule]:
        out = set()
        for fam in (4, 6):
            for r in json.loads(self._ip(f"-{fam}", "-j", "rule", "show") or "[]"):
                prio = int(r.get("priority", 0))
                if RULE_PRIORITY_BASE <= prio < OWN_RULES_END and str(r.get("table", "")).isdigit():
                    out.add(IpRule(fam, prio, str(r.get("iif", "")), int(r["table"])))
        return out

    def _routes(self, tables: Iterable[int]) -> set[Route]:
        wanted = {str(t) for t in tables}
        out = set()
        for fam in (4, 6):
            for r in json.loads(self._ip(f"-{fam}", "-j", "route", "show", "table", "all") or "[]"):
                if str(r.get("table", "main")) not in wanted:
                    continue
                kind = r.get("type", "unicast")
                via = r.get("gateway", "")
                if isinstance(r.get("via"), dict):
                    via = r["via"].get("host", "")
                out.add(Route(fam, int(r["table"]), kind, _cidr(r["dst"], fam),
                              "" if kind == "unreachable" else r.get("dev", ""), via))
        return out

    def _nft(self, *, apply: dict[str, Any] | None = None, listing: bool = False) -> Any:
        """Run one libnftables transaction and/or list our table, in the leaf's namespace."""
        table = self.table

        def body() -> Any:
            import nftables

            with _LIBNFTABLES:
                nft = nftables.Nftables()
                try:
                    nft.set_json_output(True)
                    if apply is not None:
                        rc, _, err = nft.json_cmd(apply)
                        if rc != 0:
                            raise ApplyError(f"nftables refused the rule set: {err.strip()[:500]}")
                    if not listing:
                        return None
                    rc, out, err = nft.cmd(f"list table inet {table}")
                    if rc != 0:
                        return None  # no such table
                    return json.loads(out)["nftables"]
                finally:
                    del nft  # nft_ctx_free, still under the lock

        try:
            return run_in(self.netns, body)
        except NetnsError as exc:
            raise ApplyError(str(exc)) from None

    # ------------------------------------------------------------------ the Backend protocol
    def apply(self, rules: DeviceRuleSet) -> str:
        want = self._desired(rules)
        missing = sorted(want.devices - self._links())
        if missing:
            raise ApplyError(f"{rules.device}: interfaces missing in {self.netns}: {', '.join(missing[:5])}")
        have_rules = self._rules()
        tables = want.tables | {r.table for r in have_rules}
        have_routes = self._routes(tables)
        have_dsts = {(r.family, r.table, r.type, r.dst) for r in have_routes}
        new_rules = want.rules - have_rules
        new_routes = {r for r in want.routes - have_routes if (r.family, r.table, r.type, r.dst) not in have_dsts}
        changed_routes = want.routes - have_routes - new_routes
        try:
            self._batch("add", new_rules, new_routes)
            self._nft(apply=want.nft)
        except ApplyError:
            with contextlib.suppress(ApplyError):  # back to the previous set; the first error is the one to tell
                self._batch("del", new_rules, new_routes, force=True)
            raise
        want_dsts = {(r.family, r.table, r.type, r.dst) for r in want.routes}
        stale_routes = {r for r in have_routes - want.routes if (r.family, r.table, r.type, r.dst) not in want_dsts}
        try:
            self._batch("replace", set(), changed_routes)
            self._batch("del", have_rules - want.rules, stale_routes)
        except ApplyError as exc:
            raise ApplyError(f"{rules.device}: the new rule set is committed, but its routing did not converge "
                             f"(drift shows what is left; the next apply converges it): {exc}") from None
        return rules.content_hash

    def _batch(self, verb: str, ip_rules: Iterable[IpRule], routes: Iterable[Route], force: bool = False) -> None:
        """One `ip -batch` per family: rules and routes added (add), replaced or deleted."""
        for fam in (4, 6):
            lines = [f"rule {'add' if verb != 'del' else 'del'} priority {r.priority} iif {r.iif} lookup {r.table}"
                     for r in sorted(ip_rules) if r.family == fam]
            route_verb = {"add": "replace", "replace": "replace", "del": "del"}[verb]
            lines += [f"route {route_verb} {r.spec()}" for r in sorted(routes) if r.family == fam]
            if lines:
                self._ip(f"-{fam}", *(["-force"] if force else []), "-batch", "-", batch="\n".join(lines) + "\n")

    def installed(self) -> str:
        listing = self._nft(listing=True)
        if listing is None:
            raise NotApplied(f"{self.netns} has no nftables table {self.table}")
        rules = self._rules()
        routes = self._routes({r.table for r in rules})
        return "\n".join(_nft_lines(listing) + _routing_lines(rules, routes)) + "\n"

    def drift(self, rules: DeviceRuleSet) -> list[str]:
        want = self._desired(rules)
        listing = self._nft(listing=True)
        have_rules = self._rules()
        have_routes = self._routes(want.tables | {r.table for r in have_rules})
        expected = _nft_lines(_planned(want.nft)) + _routing_lines(want.rules, want.routes)
        actual = (_nft_lines(listing) if listing is not None else []) + _routing_lines(have_rules, have_routes)
        if listing is None:
            actual.insert(0, "(no nftables table)")
        return _diff(expected, actual)

    def counters(self, rules: DeviceRuleSet | None = None) -> list[RuleCounter]:
        """Per nftables rule of the tenant ACLs: packets and bytes, with the reasons from its comment."""
        listing = self._nft(listing=True)
        if listing is None:
            raise NotApplied(f"{self.netns} has no nftables table {self.table}")
        out = []
        for obj in listing:
            rule = obj.get("rule")
            if not rule or not rule["chain"].startswith("acl_"):
                continue
            counter = next((e["counter"] for e in rule["expr"] if "counter" in e), None)
            if counter is None:
                continue
            action = "allow" if any("accept" in e for e in rule["expr"]) else "deny"
            out.append(RuleCounter(rule["chain"], tuple(rule.get("comment", "").split()), action,
                                   int(counter["packets"]), int(counter["bytes"])))
        return out


# ---------------------------------------------------------------------- normalisation for drift

def _planned(batch: dict[str, Any]) -> list[dict[str, Any]]:
    """The objects a rendered batch creates, in the shape `list table` returns them."""
    out: list[dict[str, Any]] = []
    seen_table = False
    for cmd in batch["nftables"]:
        if "add" not in cmd:
            continue
        (kind, body), = cmd["add"].items()
        if kind == "table":
            if seen_table:
                continue
            seen_table = True
        out.append({kind: body})
    return out


def _elem(e: Any) -> str:
    if isinstance(e, dict) and "prefix" in e:
        return str(ipaddress.ip_network(f"{e['prefix']['addr']}/{e['prefix']['len']}", strict=False))
    if isinstance(e, dict) and "range" in e:
        return "-".join(_elem(x) for x in e["range"])
    if isinstance(e, str):
        try:
            return str(ipaddress.ip_network(e, strict=False))
        except ValueError:
            return e
    return json.dumps(e, sort_keys=True, separators=(",", ":"))


def _right(value: Any) -> str:
    if isinstance(value, dict) and "set" in value:
        items = sorted(_elem(x) for x in value["set"])
        return items[0] if len(items) == 1 else "{" + ",".join(items) + "}"
    return _elem(value)


def _expr(exprs: list[dict[str, Any]]) -> str:
    payload_protos = {e["match"]["left"]["payload"]["protocol"] for e in exprs
                      if "match" in e and "payload" in e["match"]["left"]}
    parts = []
    for e in exprs:
        if "counter" in e:
            continue
        if "match" in e:
            m = e["match"]
            left = m["left"]
            if left.get("meta", {}).get("key") == "l4proto" and m["right"] in payload_protos:
                continue  # nft leaves out the protocol a transport-header match already implies
            parts.append(f"{json.dumps(left, sort_keys=True, separators=(',', ':'))}{m['op']}{_right(m['right'])}")
        else:
            parts.append(json.dumps(e, sort_keys=True, separators=(",", ":")))
    return " ".join(parts)


def _nft_lines(objs: list[dict[str, Any]]) -> list[str]:
    """Comparable lines for a table's objects: handles, counters and representation choices left out."""
    lines: list[str] = []
    index: dict[str, int] = {}
    for obj in objs:
        if "set" in obj:
            s = obj["set"]
            elems = ",".join(sorted(_elem(e) for e in s.get("elem", [])))
            lines.append(f"nft set {s['name']} {s['type']} {','.join(sorted(s.get('flags', [])))} [{elems}]")
        elif "map" in obj:
            m = obj["map"]
            for key, verdict in sorted((k, json.dumps(v, sort_keys=True)) for k, v in m.get("elem", [])):
                lines.append(f"nft map {m['name']} {key} -> {verdict}")
        elif "chain" in obj:
            c = obj["chain"]
            hook = f" {c['type']} {c['hook']} {c['prio']} {c['policy']}" if "hook" in c else ""
            lines.append(f"nft chain {c['name']}{hook}")
        elif "rule" in obj:
            r = obj["rule"]
            i = index[r["chain"]] = index.get(r["chain"], 0) + 1
            comment = f" # {r['comment']}" if r.get("comment") else ""
            lines.append(f"nft rule {r['chain']}[{i}] {_expr(r['expr'])}{comment}")
    return sorted(lines, key=lambda x: (x.split(" ", 3)[1], x))


def _routing_lines(ip_rules: Iterable[IpRule], routes: Iterable[Route]) -> list[str]:
    return ([f"ip -{r.family} rule priority {r.priority} iif {r.iif} lookup {r.table}" for r in sorted(ip_rules)]
            + [f"ip -{r.family} route {r.spec()}" for r in sorted(routes)])


def _diff(expected: list[str], actual: list[str]) -> list[str]:
    have = set(actual)
    want = set(expected)
    return ([f"missing: {x}" for x in expected if x not in have]
            + [f"unexpected: {x}" for x in actual if x not in want])
