"""Does a policy's `decision` agree with its `allowed_flows`? Checked on a candidate before it can go live.

rego/flows.rego gives two views of one policy: `allowed_flows` (the whole set: what the enforcer compiles, what
packets get) and `decision` (one flow with its reasons: what explain, the decision API, the console and the
grant/impact explanations show). A version that edits one and not the other would make every explanation lie
about what the devices do, so every checked flow must get `decision.allow` equal to its membership in the
candidate's own `allowed_flows` (both evaluated with the candidate's modules, on the same data and instant).

Which flows are checked, deterministically (the same inputs check the same flows):
  - the flows the change opens (allow expected) and closes (deny expected) against the active version, all of
    them up to DIFF_CAP; past it, DIFF_CAP of them shared over every (destination, proto, port, side), so every
    destination port the change touches is checked (while there are fewer than DIFF_CAP of them);
  - a sample of the candidate's allowed set (PAIR_ENTRIES of its compact entries, every reason kind among them,
    one source and port of each), so a first version (nothing active: all "opened") or an unchanged part is
    checked as well;
  - a sample of group pairs (every group of PAIR_TENANTS tenants, the platform's first, and the pairs of a few
    grants) over the destination's exposed ports and the candidate's ports for it: inside the set, allow
    expected; outside, deny expected (a `decision` that allows what the set lacks is found here).
Cost: one decision evaluation per flow, ~0.25 ms in regorus's interpreter at 1,000 tenants whatever the data
size (measured: a Rego comprehension `data.flows.decision with input as f` over all inputs in one query costs
the same per flow, so the batch is a loop over one engine), so the check is bounded at about
DIFF_CAP + PAIR_CAP + PAIR_ENTRIES decisions (bench/policy.py at 1,000 tenants: ~0.26 s for
the ~360 of a change that opens nothing, ~0.4 s at the cap).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from policy.data import DATA_KEY
from policy.decide import FLOW_QUERY, Flow
from policy.engines import PolicyEngine, scratch_engine
from policy.errors import PolicyEngineError

DIFF_CAP = 500  # opened + closed flows checked one by one; past it, a sample covering every touched port
PAIR_TENANTS = 6  # tenants whose groups form the pair sample (the platform's, then evenly spaced)
PAIR_CAP = 300  # flows of the pair sample
PAIR_GRANTS = 20  # grants whose (source, destination) pair joins the pair sample
PAIR_ENTRIES = 60  # compact allowed_flows entries sampled (one flow of each)


@dataclass(frozen=True)
class Disagreement:
    """One flow on which the two views differ."""

    flow: Flow
    in_set: bool  # what allowed_flows says (the devices)
    allow: bool  # what decision says (explain)
    reasons: list[str]  # decision's reasons

    def to_dict(self) -> dict[str, Any]:
        return {**self.flow._asdict(), "allowed_flows": "allow" if self.in_set else "deny",
                "decision": "allow" if self.allow else "deny", "reasons": list(self.reasons)}

    def line(self) -> str:
        f = self.flow
        return (f"{f.src_tenant}/{f.src_group} -> {f.dst_tenant}/{f.dst_group} {f.proto}/{f.port}: allowed_flows "
                f"{'allows' if self.in_set else 'denies'} it, decision {'allows' if self.allow else 'denies'} it "
                f"({'; '.join(self.reasons)[:200]})")


@dataclass(frozen=True)
class Consistency:
    """The result of the check: how many flows were compared, of which how many the change opens or closes
    (and how many it opens or closes in all), and the disagreements, sorted by flow."""

    checked: int = 0
    diff_checked: int = 0
    diff_total: int = 0
    disagreements: list[Disagreement] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"checked": self.checked, "diff_checked": self.diff_checked, "diff_total": self.diff_total,
                "disagreements_count": len(self.disagreements)}

    def summary(self, first: int = 3) -> str:
        """The first few disagreements, one clause each (for a refusal)."""
        shown = "; ".join(d.line() for d in self.disagreements[:first])
        more = len(self.disagreements) - first
        return shown + (f"; and {more} more" if more > 0 else "")


def _h(*parts: object) -> str:
    """A fixed, well-spread order key (not a secret): the same flows are sampled for the same inputs."""
    return hashlib.sha256("\x1f".join(map(str, parts)).encode()).hexdigest()


class _Members:
    """Whether the compact answer allows a flow (as expand_allowed expands it); each target's (source, port)
    pairs gathered once, on first use, and its ports kept for the pair sample."""

    def __init__(self, answer: Any) -> None:
        self._entries: dict[tuple[str, str, str], list[Any]] = {}
        self._ports: dict[tuple[str, str], dict[str, set[int]]] = {}
        for e in answer if isinstance(answer, list) else []:
            t, g, proto = str(e["dst_tenant"]), str(e["dst_group"]), str(e["proto"])
            self._entries.setdefault((t, g, proto), []).append(e)
            self._ports.setdefault((t, g), {}).setdefault(proto, set()).update(int(p) for p in e["ports"])
        self._pairs: dict[tuple[str, str, str], set[tuple[str, int]]] = {}

    def __contains__(self, f: Flow) -> bool:
        key = (f.dst_tenant, f.dst_group, f.proto)
        pairs = self._pairs.get(key)
        if pairs is None:
            pairs = self._pairs[key] = {(str(s), int(p)) for e in self._entries.get(key, ())
                                        for s in e["sources"] for p in e["ports"]}
        return (f"{f.src_tenant}/{f.src_group}", f.port) in pairs

    def ports(self, tenant: str, group: str) -> dict[str, set[int]]:
        """The ports, by proto, the answer opens on a destination group to anyone."""
        return self._ports.get((tenant, group), {})

    def entries(self) -> list[Any]:
        return [e for es in self._entries.values() for e in es]


def diff_sample(opened: list[Flow], closed: list[Flow], cap: int = DIFF_CAP) -> list[Flow]:
    """All of opened + closed when they fit in `cap`; else `cap` of them spread over every (destination, proto,
    port, side): the cap shared evenly (a small bucket whole, its unused share to the others), each bucket's
    share evenly spaced in its sorted order (so a platform port opened to every tenant is checked from sources
    across the tenants)."""
    flows = [*opened, *closed]
    if len(flows) <= cap:
        return flows
    buckets: dict[tuple[Any, ...], list[Flow]] = {}
    for side, group in (("o", opened), ("c", closed)):
        for f in group:
            buckets.setdefault((f.dst_tenant, f.dst_group, f.proto, f.port, side), []).append(f)
    queues = [sorted(fs) for _, fs in sorted(buckets.items())]
    quota = [0] * len(queues)
    left = cap
    order = sorted(range(len(queues)), key=lambda i: (len(queues[i]), i))
    for n, i in enumerate(order):
        quota[i] = min(len(queues[i]), max(left // (len(order) - n), 1 if left > 0 else 0))
        left -= quota[i]
    out: list[Flow] = []
    for q, k in zip(queues, quota, strict=True):
        out.extend(q[j * len(q) // k] for j in range(k))
    return out


def _groups(data: Mapping[str, Any]) -> list[tuple[str, str]]:
    """Every (tenant, group) of PAIR_TENANTS tenants: the platform's first, the rest evenly spaced by name."""
    tenants = data.get(DATA_KEY, {}).get("tenants", {}) or {}
    names = sorted(tenants)
    chosen = [n for n in names if n == "platform"]
    rest = [n for n in names if n != "platform"]
    want = max(0, PAIR_TENANTS - len(chosen))
    if rest and want:
        step = max(1, len(rest) // want)
        chosen += rest[::step][:want]
    return [(t, g) for t in chosen for g in sorted(tenants[t].get("groups") or {})]


def sample_flows(data: Mapping[str, Any], members: _Members) -> list[Flow]:
    """The pair sample and the entry sample (see the module docstring), without duplicates, in a fixed order."""
    tf = data.get(DATA_KEY, {})
    tenants = tf.get("tenants", {}) or {}
    groups = _groups(data)
    pairs = {(s, d) for s in groups for d in groups}
    grants = sorted(((st, dt, gid, g) for st, by in (tf.get("grants") or {}).items() for dt, ids in by.items()
                     for gid, g in ids.items()), key=lambda x: _h(x[0], x[1], x[2]))
    for st, dt, _, g in grants[:PAIR_GRANTS]:
        pairs.add(((st, str(g.get("src_group"))), (dt, str(g.get("dst_group")))))
    flows: list[Flow] = []
    for (st, sg), (dt, dg) in sorted(pairs, key=lambda p: _h(*p[0], *p[1])):
        if len(flows) >= PAIR_CAP:
            break
        exposed = ((tenants.get(dt) or {}).get("groups") or {}).get(dg, {}).get("exposed") or {}
        ports: dict[str, set[int]] = {proto: {int(p) for p in ps} for proto, ps in exposed.items()}
        for proto, ps in members.ports(dt, dg).items():
            ports.setdefault(proto, set()).update(ps)
        flows.extend(Flow(st, sg, dt, dg, proto, port) for proto in sorted(ports) for port in sorted(ports[proto]))
    flows = flows[:PAIR_CAP]
    # the entry sample: the first entry of every reason kind (intra-tenant, platform-service, grant), then
    # entries evenly spaced through the answer (its order is the engine's, fixed for the same modules and data)
    entries = members.entries()
    kinds: dict[str, int] = {}
    for i, e in enumerate(entries):
        kinds.setdefault(str(e["reason"]).split(":", 1)[0], i)
    step = max(1, len(entries) // PAIR_ENTRIES)
    chosen = list(kinds.values()) + [i for i in range(0, len(entries), step) if i not in kinds.values()]
    for i in chosen[:PAIR_ENTRIES]:
        e = entries[i]
        sources, ports_ = list(e["sources"]), list(e["ports"])
        if not sources or not ports_:
            continue
        k = int(_h(e["dst_tenant"], e["dst_group"], e["reason"])[:8], 16)
        st, sg = str(sources[k % len(sources)]).split("/", 1)
        flows.append(Flow(st, sg, str(e["dst_tenant"]), str(e["dst_group"]), str(e["proto"]),
                          int(ports_[k % len(ports_)])))
    return flows


def _decide(engine: PolicyEngine, f: Flow, now_ns: int | None) -> tuple[bool, list[str]]:
    """decision.allow and its reasons for `f`, failing closed as explain does (policy/decide.py)."""
    request: dict[str, Any] = {"src": {"tenant": f.src_tenant, "group": f.src_group},
                               "dst": {"tenant": f.dst_tenant, "group": f.dst_group}, "proto": f.proto, "port": f.port}
    if now_ns is not None:
        request["now_ns"] = now_ns
    try:
        value = engine.evaluate(FLOW_QUERY, request)
    except PolicyEngineError as exc:
        return False, [f"engine-error: {exc}"]
    if not isinstance(value, dict) or not isinstance(value.get("allow"), bool):
        return False, [f"engine-error: malformed flow decision {value!r:.200}" if value is not None
                       else f"no-policy: {FLOW_QUERY} is undefined in the loaded policy"]
    reasons = value.get("reasons")
    return value["allow"], [str(r) for r in reasons] if isinstance(reasons, list) else []


def check(engine: PolicyEngine, after: Any, opened: list[Flow], closed: list[Flow], data: Mapping[str, Any],
          now_ns: int | None) -> Consistency:
    """Compare `decision` (on `engine`, loaded with the candidate and `data`) with membership in `after` (the
    candidate's compact allowed_flows answer) on the diff and the samples."""
    members = _Members(after)
    diff = diff_sample(opened, closed)
    seen: set[Flow] = set()
    todo: list[Flow] = []
    for f in (*diff, *sample_flows(data, members)):
        if f not in seen:
            seen.add(f)
            todo.append(f)
    found: list[Disagreement] = []
    for f in todo:
        in_set = f in members
        allow, reasons = _decide(engine, f, now_ns)
        if allow != in_set:
            found.append(Disagreement(f, in_set, allow, reasons))
    found.sort(key=lambda d: d.flow)
    return Consistency(len(todo), len(diff), len(opened) + len(closed), found)


def check_modules(modules: Mapping[str, str], after: Any, opened: list[Flow], closed: list[Flow],
                  data: Mapping[str, Any], now_ns: int | None) -> Consistency:
    """`check` on a private engine loaded with `modules` and `data`."""
    engine = scratch_engine(modules, data)
    try:
        return check(engine, after, opened, closed, data, now_ns)
    finally:
        engine.close()
