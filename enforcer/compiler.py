"""allowed_flows x fabric -> one DeviceRuleSet per device. Pure and deterministic: same input, same bytes.

Input is the policy's compact `data.flows.allowed_flows` (one entry per destination group, protocol and
reason, with every source group; see rego/flows.rego), never the expanded per-pair set, plus the revoked
workload identities (rego's `revoked_identities`, and the fabric's own revoked workloads).

What each entry becomes (S = the entry's source groups' workloads, D = the destination group's):
  - on the SuperNIC of every node hosting part of S: an `egress` rule  S-on-this-node -> D;
  - on the SuperNIC of every node hosting part of D: an `ingress` rule S -> D-on-this-node;
    each NIC also gets `established` allows (conntrack return) and a final deny in both directions;
  - on the leaf of every node hosting part of S: an ACL rule S-on-this-leaf -> D in the source tenant's
    ACL; on the leaf of every node hosting part of D: a stateless return rule D-on-this-leaf (source port
    = the service ports) -> the source tenants' prefixes in the destination tenant's ACL. Every ACL ends in
    a deny;
  - across tenants (grants, platform services), route leaking of exactly the needed prefixes: the source
    tenant's VRF imports D's addresses from the destination VRF on the source leaves, and the destination
    VRF imports the source group's addresses back on the destination leaves.
RoCEv2 (udp to port 4791, in the entry's ports) skips conntrack on the NICs (hardware conntrack on a BlueField-3
does not take it): the NIC rules' share of it is a `stateless` rule beside the stateful one for the other ports,
and it admits the mirror D -> S too, since RoCEv2 responses and ACKs also go to 4791 (from a varying port): a
RoCEv2 allowance is symmetric. On the destination leaves RoCEv2 back gets a return rule on destination port
4791 (the source-port one cannot match it). Each NIC also gets a RoCEv2 deny per direction.
Aggregation: addresses are collapsed into prefixes; rules with equal match but different reasons become
one rule carrying both reasons; a rule whose ports another rule with the same match already covers is
dropped (shadowed) and its reason moves to the covering rule.

Incremental: `recompile(previous, allowed, revoked)` redoes only the entries that changed (and those whose
groups gained or lost a revoked workload), with the other entries of their families (enforcer.aggregate:
only those can share a rule's match), and patches only the devices the changed entries touch.
"""

from __future__ import annotations

import gc
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from core.errors import InvalidInput
from enforcer.aggregate import (
    CONNTRACK_RETURN,
    DEFAULT_DENY,
    Acc,
    Emitter,
    Leaks,
    assemble,
    patch,
    patch_leaks,
    sort_allows,
)
from enforcer.context import Context as _Context
from enforcer.cost import leaf_rule_cost, nic_rule_cost, set_sizes
from enforcer.errors import BudgetExceeded, Overflow
from enforcer.fabric import PROTOS, Fabric
from enforcer.ir import DeviceRuleSet, merge_ranges

__all__ = ["CONNTRACK_RETURN", "DEFAULT_DENY", "Budget", "Compiled", "Entry", "all_devices", "compile_fabric",
           "contributors", "parse_entries", "recompile"]


@dataclass(frozen=True)
class Budget:
    """Per-device capacity. NVUE's atomic ACL update mode keeps a shadow copy, halving usable entries."""

    nic_flows: int = 65_536
    leaf_acl_entries: int = 25_000  # IPv4 entries (IPv6: 2 each), enforcer/cost.py
    acl_mode: str = "atomic"  # "atomic" | "non-atomic"

    def limit(self, kind: str) -> int:
        if kind == "nic":
            return self.nic_flows
        return self.leaf_acl_entries // 2 if self.acl_mode == "atomic" else self.leaf_acl_entries


@dataclass(frozen=True)
class Entry:
    """One element of allowed_flows, normalised (ports merged into ranges, sources sorted)."""

    dst: str  # tenant/group
    proto: str
    reason: str
    ports: tuple[tuple[int, int], ...]
    sources: tuple[str, ...]

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.dst, self.proto, self.reason)

    @property
    def dst_tenant(self) -> str:
        return self.dst.split("/", 1)[0]


# (dst_tenant, dst_group, proto, reason) -> (item, entry, entry.key)
Known = dict[tuple[Any, ...], tuple[Any, "Entry", tuple[str, str, str]]]


def parse_entries(raw: Any, known: Known | None = None
                  ) -> tuple[dict[tuple[str, str, str], Entry], Known, set[tuple[str, str, str]]]:
    """The compact allowed_flows set, validated (InvalidInput naming a malformed entry); with, for the next
    call, each item as given, and the keys parsed afresh. An item equal to the one `known` holds for it reuses
    that entry unparsed (items are compared, not copied: a caller must not mutate them afterwards). An item
    with no ports allows no flow and becomes no entry."""
    if not isinstance(raw, list):
        raise InvalidInput("data.flows.allowed_flows is undefined or not a set of flow entries")
    out: dict[tuple[str, str, str], Entry] = {}
    seen: Known = {}
    fresh: set[tuple[str, str, str]] = set()
    for item in raw:
        try:
            rk = (item["dst_tenant"], item["dst_group"], item["proto"], item["reason"])
            if known is not None:
                hit = known.get(rk)
                if hit is not None and (hit[0] is item or hit[0] == item) and hit[2] not in out:
                    out[hit[2]] = hit[1]
                    seen[rk] = hit
                    continue
            dst = f"{item['dst_tenant']}/{item['dst_group']}"
            proto, reason = str(item["proto"]), str(item["reason"])
            if proto not in PROTOS:
                raise ValueError(f"proto {proto!r}")
            ports = []
            for p in item["ports"]:
                if isinstance(p, bool) or not isinstance(p, int | float) or p != int(p) or not 1 <= p <= 65535:
                    raise ValueError(f"port {p!r} is not an integer 1-65535")
                ports.append(int(p))
            sources = tuple(sorted({str(s) for s in item["sources"]}))
            if any(s.count("/") != 1 for s in sources):
                raise ValueError("sources must be tenant/group")
        except (KeyError, TypeError, ValueError) as exc:
            raise InvalidInput(f"data.flows.allowed_flows has a malformed entry {item!r:.200}: {exc}") from None
        if not ports:
            # an entry lists the ports it allows: none, no flow (the Rego's own reading, where `input.port in
            # ports` never holds, and expand_allowed's). The IR's `()` is "any port", so kept it would widen to
            # every port: fail closed instead. The shipped Rego never emits one (`count(ports) > 0`).
            continue
        e = Entry(dst, proto, reason, merge_ranges([(p, p) for p in ports]), sources)
        key = e.key
        prev = out.get(key)
        if prev is not None:  # the same key twice: one entry with the union, never reused unparsed
            e = Entry(dst, proto, reason, merge_ranges(prev.ports + e.ports),
                      tuple(sorted(set(prev.sources) | set(e.sources))))
            seen = {k: v for k, v in seen.items() if v[2] != key}
        else:
            seen[rk] = (item, e, key)
        out[key] = e
        fresh.add(key)
    return out, seen, fresh



# ---------------------------------------------------------------- compile results

@dataclass
class _State:
    """What a recompile reuses: the context, the entries by family, each device's own rule set and leaks."""

    ctx: _Context
    known: Known  # what parse_entries reuses next time
    families: dict[tuple[str, str], tuple[tuple[str, str, str], ...]]  # (dst, proto) -> its entries' keys
    devices: dict[str, DeviceRuleSet]  # as this compile made them (Compiled.devices may be replaced)
    leaks: dict[str, Leaks]  # leaf -> its leak instances


@dataclass
class Compiled:
    """A whole compile: every device's rule set, plus what an incremental recompile reuses."""

    fabric: Fabric
    revoked: frozenset[str]
    budget: Budget
    entries: dict[tuple[str, str, str], Entry]
    devices: dict[str, DeviceRuleSet]
    state: _State | None = field(default=None, repr=False, compare=False)
    recompiled: tuple[str, ...] = ()  # the devices this (re)compile assembled
    changed: tuple[str, ...] = ()  # of those, the ones whose rule set differs from the previous compile
    over: tuple[Overflow, ...] = ()  # devices over their budget (only when compiled with strict=False)

    def device_hashes(self) -> dict[str, str]:
        return {d: rs.content_hash for d, rs in sorted(self.devices.items())}


def all_devices(fabric: Fabric) -> list[str]:
    return [f"nic:{n.name}" for n in fabric.nodes] + [f"leaf:{s.name}" for s in fabric.leaves]


def compile_fabric(fabric: Fabric, allowed: Any, revoked: Iterable[str] = (), budget: Budget | None = None,
                   *, strict: bool = True) -> Compiled:
    """Every device's rule set; InvalidInput for a malformed allowed_flows, BudgetExceeded when a device
    would overflow (naming its largest contributors). With strict=False an overflow is not raised but named in
    `Compiled.over`, so a publisher can hold back the overflowing devices alone (enforcer.reconcile)."""
    budget = budget or Budget()
    rev = frozenset(revoked)
    with _no_gc(long_lived=True):
        return _compile(fabric, allowed, rev, budget, strict)


@contextmanager
def _no_gc(long_lived: bool = False) -> Iterator[None]:
    """A compile allocates many acyclic objects: the cyclic collector only slows it down.

    `long_lived`: what the block made (a full compile: about a million tuples, kept until the next compile)
    goes straight to the oldest generation (gc.freeze then gc.unfreeze, each O(1)) instead of being walked by
    a young collection as it leaves the block and again one generation up: full collections walk it anyway,
    and nothing in it is cyclic garbage. Objects other threads made meanwhile are promoted with it (their
    cycles wait for the next full collection). Skipped when the process already uses gc.freeze (a pre-fork
    server): unfreezing would undo that."""
    was = gc.isenabled()
    gc.disable()
    done = False
    try:
        yield
        done = True
    finally:
        if was:
            if done and long_lived and gc.get_freeze_count() == 0:
                gc.freeze()
                gc.unfreeze()
            gc.enable()


def _families(entries: Mapping[tuple[str, str, str], Entry]) -> dict[tuple[str, str], tuple[tuple[str, str, str], ...]]:
    out: dict[tuple[str, str], list[tuple[str, str, str]]] = {}
    for k in entries:
        out.setdefault(k[:2], []).append(k)
    return {f: tuple(sorted(ks)) for f, ks in out.items()}


def _compile(fabric: Fabric, allowed: Any, rev: frozenset[str], budget: Budget, strict: bool) -> Compiled:
    ctx = _Context(fabric, rev)
    entries, known, _ = parse_entries(allowed)
    families = _families(entries)
    emit = Emitter(ctx, {d: Acc(d) for d in all_devices(fabric)})
    for keys in families.values():
        emit.family([entries[k] for k in keys])
    ctx.sets.clear()  # the sets live on in the devices; a recompile rebuilds only those it redoes
    devices = {d: assemble(d, ctx.index, sort_allows(a.rules), a.sets, a.cost, a.leaks)
               for d, a in emit.accs.items()}
    over = _check_budget(devices, budget, strict)
    leaks = {d: a.leaks for d, a in emit.accs.items() if a.leaks}
    names = tuple(sorted(devices))
    return Compiled(fabric, rev, budget, entries, devices, _State(ctx, known, families, dict(devices), leaks),
                    names, names, over)


def recompile(prev: Compiled, allowed: Any, revoked: Iterable[str] | None = None, *, strict: bool = True
              ) -> Compiled:
    """The compile of (prev.fabric, allowed, revoked), redoing only what changed; `recompiled` names the
    devices reassembled and `changed` those whose rule set differs. A fabric change needs compile_fabric.
    `strict`: as compile_fabric's (not strict, `over` names every device over budget, reassembled or not)."""
    if prev.state is None:
        raise ValueError("recompile needs a Compiled made by compile_fabric or recompile")
    with _no_gc():
        return _recompile(prev, prev.state, allowed, revoked, strict)


def _recompile(prev: Compiled, st: _State, allowed: Any, revoked: Iterable[str] | None, strict: bool) -> Compiled:
    rev = prev.revoked if revoked is None else frozenset(revoked)
    entries, known, fresh = parse_entries(allowed, st.known)
    dirty = {k for k in fresh if entries[k] != prev.entries.get(k)} | (prev.entries.keys() - entries.keys())
    ctx = st.ctx if rev == prev.revoked else _Context(prev.fabric, rev, st.ctx.index)
    if rev != prev.revoked:
        groups = {"/".join(w.split("/")[:2]) for w in ctx.revoked_workloads ^ st.ctx.revoked_workloads}
        dirty |= {k for k, e in entries.items() if e.dst in groups or groups.intersection(e.sources)}
    families = dict(st.families)
    redo = {k[:2] for k in dirty}
    for f in redo:
        keys = tuple(sorted({k for k in families.get(f, ()) if k in entries} | {k for k in dirty
                                                                                  if k[:2] == f and k in entries}))
        if keys:
            families[f] = keys
        else:
            families.pop(f, None)
    was: dict[tuple[str, str, str], set[str]] = {}
    now: dict[tuple[str, str, str], set[str]] = {}
    old, new = Emitter(st.ctx, track=was), Emitter(ctx, track=now)
    for f in sorted(redo):
        old.family([prev.entries[k] for k in st.families.get(f, ())])
        new.family([entries[k] for k in families.get(f, ())])
    st.ctx.sets.clear()
    ctx.sets.clear()
    touched: set[str] = set()
    for k in dirty:
        touched |= was.get(k, set()) | now.get(k, set())
    devices = dict(prev.devices)
    own = dict(st.devices)
    leaks = dict(st.leaks)
    for d in touched:
        o, n = old.accs.get(d), new.accs.get(d)
        base = own.get(d) or assemble(d, ctx.index, [], {}, 0, {})
        patched = None
        if (o is not None and o.leaks) or (n is not None and n.leaks):
            patched = leaks[d] = patch_leaks(leaks.get(d, {}), o, n, d)
            if not patched:
                del leaks[d]
        own[d] = devices[d] = patch(base, o, n, patched, ctx.index)
    over = _check_budget(devices if not strict else {d: devices[d] for d in touched}, prev.budget, strict)
    changed = tuple(sorted(d for d in touched if devices[d] != prev.devices.get(d)))
    return Compiled(prev.fabric, rev, prev.budget, entries, devices,
                    _State(ctx, known, families, own, leaks), tuple(sorted(touched)), changed, over)


def contributors(rs: DeviceRuleSet) -> list[tuple[str, int]]:
    """Budget use per reason on one device, largest first (a rule with several reasons counts for each)."""
    sizes = set_sizes(rs.sets)
    cost = nic_rule_cost if rs.kind == "nic" else leaf_rule_cost
    use: dict[str, int] = {}
    for r in rs.rules:
        for reason in r.reasons:
            use[reason] = use.get(reason, 0) + cost(r, sizes)
    return sorted(use.items(), key=lambda kv: (-kv[1], kv[0]))


def _check_budget(devices: Mapping[str, DeviceRuleSet], budget: Budget, strict: bool = True
                  ) -> tuple[Overflow, ...]:
    """The devices over budget; BudgetExceeded naming them instead when `strict`."""
    over = []
    for d in sorted(devices):
        rs = devices[d]
        limit = budget.limit(rs.kind)
        if rs.cost > limit:
            what = "NIC flows" if rs.kind == "nic" else "switch ACL entries"
            over.append(Overflow(d, what, rs.cost, limit, tuple(contributors(rs)[:5])))
    if over and strict:
        raise BudgetExceeded(over)
    return tuple(over)
