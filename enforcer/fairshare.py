"""A device over its budget compiled to fit by withholding allow entries, fairly: one tenant's grants cannot
freeze a device for every tenant (pure, deterministic: replicas and re-runs withhold the same entries).

The unit withheld is one allowed_flows entry (a grant, a group's intra-tenant exposure) on one device: the
device is reassembled from the other entries, so a withheld entry's flows are denied there (fail closed: the
rules it shared with a kept entry keep only the kept entry's ports) and only there. Denies, revocations (the
context already left the revoked workloads out) and the skeleton (conntrack, default denies, per-port flows) are
never touched: only allows are removed.

Who pays: an entry belongs to its source groups' tenant (a grant to its requester, an intra-tenant entry to its
tenant); an entry whose sources span several tenants (a platform service) is shared and never withheld. A
tenant's use of the device is the sum of its entries' costs there (each counted alone: an upper bound of what
withholding it frees, so the result is checked on the reassembled device). Its fair share is the room the
tenants share (the limit less what nobody is charged for: the skeleton and the shared entries) over the number
of tenants using the device: shares and skeleton add up to the limit, so a device does not fit only when the
skeleton and shared entries alone exceed it (with the limit itself divided instead, two tenants each at their
share left no room for the skeleton, and the device froze for everyone again). While the device is over, the
tenant furthest over its share gives up its
next entry: first the entries the device's last published set did not have (new flows: the flows that work keep
working), then the published ones; within each, grants before other entries and newer grants first (grant ids
are time-ordered). A tenant at or under its share gives up nothing: when that is not enough, the device does
not fit (`Fit.rules` is None) and keeps its last good rule set, as before. An entry given up that fits back
(counted alone) once the device fits is given back. Idempotent: a published set that is still such a fit of the
compile (the compile less whole entries, each from a tenant over its share) is kept, so the next run, a replica or
a restart, fitting the same compile against it, publishes nothing new (`_still_fits`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from enforcer.aggregate import Acc, Emitter, assemble, patch, patch_leaks, sort_allows
from enforcer.compiler import Compiled, Entry, _no_gc
from enforcer.ir import DeviceRuleSet, FlowRule

Key = tuple[str, str, str]  # an Entry's key: (dst, proto, reason)
PLATFORM_SERVICE = "platform-service"  # rego/flows.rego's reason for a platform group's ports to every tenant


@dataclass(frozen=True)
class Withheld:
    """What one tenant gives up on one device: its entries (keys) and their cost there, counted alone."""

    tenant: str
    entries: tuple[Key, ...]
    cost: int


@dataclass(frozen=True)
class Fit:
    """A device over budget compiled to fit (`rules`), or None when withholding from the tenants over their
    share is not enough (the device keeps its last good rule set)."""

    device: str
    rules: DeviceRuleSet | None
    withheld: tuple[Withheld, ...]
    limit: int
    share: int  # the fair share of each tenant using the device (module docstring)

    def summary(self) -> dict[str, Any]:
        """What the audit event and the device status carry: per tenant, the entries withheld and their cost."""
        return {"device": self.device, "limit": self.limit, "share": self.share,
                "cost": self.rules.cost if self.rules is not None else None,
                "hash": self.rules.content_hash if self.rules is not None else None,  # the set it describes
                "withheld": [{"tenant": w.tenant, "entries": len(w.entries), "cost": w.cost,
                              "flows": [entry_label(k) for k in w.entries]} for w in self.withheld]}

    def note(self) -> str:
        """One line naming the withheld tenants and entry counts (a published version's cause starts with it)."""
        if not self.withheld:
            return ""
        what = "NIC flows" if self.device.startswith("nic:") else "switch ACL entries"
        parts = ", ".join(f"{w.tenant} {len(w.entries)} {'entry' if len(w.entries) == 1 else 'entries'} "
                          f"({w.cost} {what})" for w in self.withheld)
        return f"over budget, withheld (fair share {self.share} of {self.limit}): {parts}"


def entry_label(key: Key) -> str:
    dst, proto, reason = key
    return f"{reason} {proto} to {dst}"


def owner(e: Entry) -> str | None:
    """The tenant an entry's device cost is charged to: its sources' one tenant; None when they are several, or
    for a platform service's entry whatever its sources are now (when every other tenant leaves it, it must not
    become the last one's, charged to it and withheld from it for what the others did)."""
    if e.reason == PLATFORM_SERVICE:
        return None
    tenants = {s.split("/", 1)[0] for s in e.sources}
    return tenants.pop() if len(tenants) == 1 else None


def fit_device(compiled: Compiled, device: str, published: DeviceRuleSet | None) -> Fit:
    """`compiled`'s rule set of `device` (over its budget) with entries withheld until it fits (module docstring);
    `published`: the device's last published rule set (None: never published), whose entries are kept longest."""
    st = compiled.state
    if st is None:
        raise ValueError("fit_device needs a Compiled made by compile_fabric or recompile")
    rs = compiled.devices[device]
    limit = compiled.budget.limit(rs.kind)
    with _no_gc():
        return _fit(compiled, device, published, rs, limit)


def _fit(compiled: Compiled, device: str, published: DeviceRuleSet | None, rs: DeviceRuleSet, limit: int) -> Fit:
    assert compiled.state is not None
    ctx = compiled.state.ctx
    try:
        entries = _touching(compiled, device)
        alone: dict[Key, Acc] = {}
        for e in entries:
            if owner(e) is None:  # shared: never withheld, so not costed alone (a platform service's is dear)
                continue
            em = Emitter(ctx)
            em.family([e])
            a = em.accs.get(device)
            if a is not None and a.rules:
                alone[e.key] = a
        have = _published_matches(published)
        queues: dict[str, tuple[list[Entry], list[Entry]]] = {}  # tenant -> (new entries, published ones)
        use: dict[str, int] = {}
        for e in entries:
            t = owner(e)
            a = alone.get(e.key)
            if t is None or a is None:
                continue
            use[t] = use.get(t, 0) + a.cost
            queues.setdefault(t, ([], []))[1 if _was_published(e, a.rules, have) else 0].append(e)
        for pair in queues.values():
            for q in pair:
                q.sort(key=lambda e: (e.reason, e.key), reverse=True)  # newer grant ids first
                q.sort(key=lambda e: not e.reason.startswith("grant:"))  # stable: grants before the rest
        # the room the tenants share: the limit less what no tenant is charged for (the skeleton, shared entries)
        room = limit - max(0, rs.cost - sum(use.values()))
        share = max(0, room) // len(use) if use else 0
        kept = _still_fits(compiled, device, published, entries, alone, queues, use, share, limit)
        if kept is not None:
            return Fit(device, kept[0], _withheld(kept[1], entries, alone), limit, share)
        out: set[Key] = set()
        picked: list[Entry] = []  # in the order given up (the last given up is the one most worth keeping)
        fitted = rs
        while fitted.cost > limit:
            need = fitted.cost - limit
            took = False
            for phase in (0, 1):
                while need > 0:
                    over = [t for t, q in queues.items() if q[phase] and use[t] > share]
                    if not over:
                        break
                    t = min(over, key=lambda t: (share - use[t], t))  # furthest over first, then by name
                    e = queues[t][phase].pop(0)
                    cost = alone[e.key].cost
                    out.add(e.key)
                    picked.append(e)
                    use[t] -= cost
                    need -= cost
                    took = True
                if need <= 0:
                    break
            if not took:
                return Fit(device, None, _withheld(out, entries, alone), limit, share)
            fitted = _without(compiled, device, entries, out)
        # Give back what is no longer needed: the last entry given up may free more than the overflow, so an entry
        # given up before it can fit again (its cost counted alone bounds what it adds back). Without this the
        # next run, fitting against this set, kept such an entry, a second version for one change.
        again = True
        while again:
            again = False
            for e in reversed(picked):
                if e.key in out and fitted.cost + alone[e.key].cost <= limit:
                    out.discard(e.key)
                    fitted = _without(compiled, device, entries, out)
                    again = True
        return Fit(device, fitted, _withheld(out, entries, alone), limit, share)
    finally:
        ctx.sets.clear()  # as a compile leaves it: the sets live on in the devices


def _still_fits(compiled: Compiled, device: str, published: DeviceRuleSet | None, entries: list[Entry],
                alone: Mapping[Key, Acc], queues: Mapping[str, tuple[list[Entry], list[Entry]]],
                use: Mapping[str, int], share: int, limit: int) -> tuple[DeviceRuleSet, set[Key]] | None:
    """The published set and what it withholds, when it is still a fit of this compile: exactly the compiled set
    less whole entries, within the limit, none of those entries fitting back alone, and each from a tenant that
    the fit could have taken it from (over its share before giving up its largest one). Every fit the greedy
    makes is such a set, so fitting again against what was published gives it back (idempotent): without this,
    the same inputs fitted against the fitted set gave up another set of entries (a second version, a second
    `enforcer.withhold` event, on every replica and restart), or found the device could not fit and held it.
    None: fit afresh."""
    if published is None or published.cost > limit:
        return None
    gone = {e.key: t for t, q in queues.items() for e in q[0]}  # owned entries the published set lacks
    if not gone:
        return None
    for t in set(gone.values()):
        mine = [k for k, o in gone.items() if o == t]
        if use[t] - sum(alone[k].cost for k in mine) + max(alone[k].cost for k in mine) <= share:
            return None
    if any(published.cost + alone[k].cost <= limit for k in gone):
        return None
    out = set(gone)
    fitted = _without(compiled, device, entries, out)
    return (fitted, out) if fitted.canonical == published.canonical else None


def _touching(compiled: Compiled, device: str) -> list[Entry]:
    """The entries that may put something on `device` (a member of their source or destination groups sits on
    its node, or under its leaf), in key order."""
    assert compiled.state is not None
    ctx = compiled.state.ctx
    kind, name = device.split(":", 1)
    leaf_of = ctx.index.leaf_of
    here: dict[str, bool] = {}

    def on(group: str) -> bool:
        hit = here.get(group)
        if hit is None:
            ps = ctx.members.get(group, ())
            hit = here[group] = any((p.node if kind == "nic" else leaf_of.get(p.node)) == name for p in ps)
        return hit

    return [e for k, e in sorted(compiled.entries.items()) if on(e.dst) or any(on(s) for s in e.sources)]


def _without(compiled: Compiled, device: str, entries: list[Entry], out: set[Key]) -> DeviceRuleSet:
    """The compile's rule set of `device` with the entries `out` withheld: only their families (the rules that can
    share a match with theirs, enforcer.aggregate) are emitted again, with and without them, and patched in, as a
    recompile patches a device."""
    assert compiled.state is not None
    ctx = compiled.state.ctx
    families: dict[tuple[str, str], list[Entry]] = {k[:2]: [] for k in out}
    for e in entries:  # in key order, as the compile takes a family (one pass: a scan per family cost 0.2 s of a
        mine = families.get((e.dst, e.proto))  # leaf's fit at 1,000 tenants)
        if mine is not None:
            mine.append(e)
    old, new = Emitter(ctx), Emitter(ctx)
    for _f, mine in sorted(families.items()):
        old.family(mine)
        new.family([e for e in mine if e.key not in out])
    o, n = old.accs.get(device), new.accs.get(device)
    leaks = None
    if (o is not None and o.leaks) or (n is not None and n.leaks):
        leaks = patch_leaks(compiled.state.leaks.get(device, {}), o, n, device)
    return patch(compiled.devices[device], o, n, leaks, ctx.index)


def _assemble(compiled: Compiled, device: str, entries: list[Entry]) -> DeviceRuleSet:
    """The device's rule set from these entries alone, as the compile assembles it (family by family)."""
    assert compiled.state is not None
    ctx = compiled.state.ctx
    em = Emitter(ctx, {device: Acc(device)})
    families: dict[tuple[str, str], list[Entry]] = {}
    for e in entries:
        families.setdefault(e.key[:2], []).append(e)
    for f in sorted(families):
        em.family(sorted(families[f], key=lambda e: e.key))
    a = em.accs[device]
    return assemble(device, ctx.index, sort_allows(a.rules), a.sets, a.cost, a.leaks)


Match = tuple[str, str, str, str, str, str, str]


def _match(r: FlowRule) -> Match:
    return (r.direction, r.scope, r.src, r.dst, r.proto, r.port_side, r.state)


def _published_matches(published: DeviceRuleSet | None) -> dict[Match, set[str]]:
    """The published allow rules' matches, with the reasons each carries."""
    out: dict[Match, set[str]] = {}
    for r in published.rules if published is not None else ():
        if r.action == "allow":
            out.setdefault(_match(r), set()).update(r.reasons)
    return out


def _was_published(e: Entry, rules: list[FlowRule], have: Mapping[Match, set[str]]) -> bool:
    """Every rule the entry puts on the device was published with its reason (a rule it shares with another entry,
    merged or shadowed, carries both reasons)."""
    return all(e.reason in have.get(_match(r), ()) for r in rules)


def _withheld(out: set[Key], entries: list[Entry], alone: Mapping[Key, Acc]) -> tuple[Withheld, ...]:
    by: dict[str, list[Key]] = {}
    for e in entries:
        if e.key in out:
            by.setdefault(owner(e) or "", []).append(e.key)
    return tuple(Withheld(t, tuple(sorted(ks)), sum(alone[k].cost for k in ks)) for t, ks in sorted(by.items()))


def fit_all(compiled: Compiled, published: Mapping[str, DeviceRuleSet | None]) -> dict[str, Fit]:
    """fit_device for every device over budget in `compiled.over` (published: each one's last published set)."""
    return {o.device: fit_device(compiled, o.device, published.get(o.device)) for o in compiled.over}


def parse_label(label: str) -> Key | None:
    """entry_label's key back (an `enforcer.withhold` event names entries by label); None: not a label."""
    reason, _, rest = label.partition(" ")
    proto, _, dst = rest.partition(" to ")
    return (dst, proto, reason) if reason and proto and dst else None


def withheld_on(compiled: Compiled, withheld: Mapping[str, set[Key]], src: str, dst: str, proto: str, port: int
                ) -> list[str]:
    """The devices on the way of the flow src -> dst (workload keys) whose published set withholds an entry that
    allows it (`withheld`: device -> keys, service.withheld_keys), when every entry the compile has for the flow is
    withheld on one of them: the devices deny it because of the budget, not because they drifted. Empty: it is
    not explained so (no entry allows it, or one is withheld nowhere on its way)."""
    fabric = compiled.fabric
    node = {p.workload: p.node for p in fabric.placements}
    leaf_of = fabric.attachment
    sg, dg = src.rsplit("/", 1)[0], dst.rsplit("/", 1)[0]
    way: list[str] = []
    for w in (src, dst):
        n = node.get(w)
        if n is None:
            return []
        way.append(f"nic:{n}")
        if n in leaf_of:
            way.append(f"leaf:{leaf_of[n].leaf}")
    allowing = [k for k, e in compiled.entries.items() if e.dst == dg and e.proto == proto and sg in e.sources
                and any(lo <= port <= hi for lo, hi in e.ports)]
    if not allowing:
        return []
    where = {d for d in way for k in allowing if k in withheld.get(d, ())}
    if not all(any(k in withheld.get(d, ()) for d in way) for k in allowing):
        return []
    return sorted(where)
