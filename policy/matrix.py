"""The allowed flow set tenant by tenant: how many flows each (source tenant, destination tenant) pair
has, and the flows of one pair with their reasons.

Both read the compact `data.flows.allowed_flows` answer (one entry per destination group, proto and
reason, with its sources and ports) without expanding all of it: at 1,000 tenants x 10 groups the
expansion is ~240k flows and costs about a second, while the counts need one pass over ~15k entries.
A flow allowed for several reasons (a grant to a platform service, two overlapping grants) is counted
once, like `expand_allowed` keys it once: entries that share a destination group and proto are expanded
and deduplicated together; an entry alone on its (destination group, proto) needs no expansion.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from core.errors import InvalidInput
from core.rocev2 import MIRROR, ROCE_V2_PORT, ROCE_V2_PROTO, is_rocev2
from policy.decide import Flow, expand_allowed
from policy.rocev2 import mirror_note

Pair = tuple[str, str]


def target_key(entry: Any) -> tuple[str, str, str]:
    try:
        return str(entry["dst_tenant"]), str(entry["dst_group"]), str(entry["proto"])
    except (KeyError, TypeError):
        raise InvalidInput(f"data.flows.allowed_flows has a malformed entry {entry!r:.200}") from None


def _entries(raw: Any) -> list[Any]:
    if not isinstance(raw, list):
        raise InvalidInput("data.flows.allowed_flows is undefined or not a set of flow entries")
    return raw


def _checked(entry: Any) -> tuple[list[Any], set[int]]:
    """(sources, distinct ports) of an entry, with the checks expand_allowed makes; InvalidInput otherwise."""
    sources, ports = entry.get("sources"), entry.get("ports")
    if not isinstance(sources, list) or not isinstance(ports, list) or "reason" not in entry:
        raise InvalidInput(f"data.flows.allowed_flows has a malformed entry {entry!r:.200}")
    if sources and not all(isinstance(p, int | float) and not isinstance(p, bool) and p == int(p) for p in ports):
        raise InvalidInput(f"data.flows.allowed_flows has a port that is not an integer in {entry!r:.200}")
    return sources, {int(p) for p in ports}


def validated(raw: Any) -> list[Any]:
    """The entries of an answer, each checked as expand_allowed checks it; InvalidInput otherwise."""
    entries = _entries(raw)
    for entry in entries:
        target_key(entry)
        _checked(entry)
    return entries


Target = tuple[str, str, str]  # (destination tenant, destination group, proto)
# per target: its entries and its flows by tenant pair (what an update after a change reuses)
TargetCounts = dict[Target, tuple[list[Any], Counter[Pair]]]


def same_entries(a: list[Any], b: list[Any]) -> bool:
    """Whether two targets' entry lists are equal as multisets (then they allow exactly the same flows)."""
    if len(a) != len(b):
        return False
    if a == b:  # the engine's order is stable: an unchanged target usually compares equal as it is
        return True
    if len(a) == 1:
        return False
    try:
        return sorted(a, key=_order) == sorted(b, key=_order)
    except (TypeError, ValueError):  # an odd value that does not order: treated as a change
        return False


def _order(entry: Any) -> tuple[Any, ...]:
    return (str(entry["reason"]), [str(s) for s in entry["sources"]], [float(p) for p in entry["ports"]])


def by_target(raw: Any) -> dict[Target, list[Any]]:
    out: dict[Target, list[Any]] = {}
    for entry in _entries(raw):
        out.setdefault(target_key(entry), []).append(entry)
    return out


class _Tenants(dict[Any, str]):
    """source -> its tenant, split once (sources repeat across entries)."""

    def __missing__(self, source: Any) -> str:
        text = str(source)
        if "/" not in text:
            raise InvalidInput(f"data.flows.allowed_flows names a source {text!r:.100} that is not tenant/group")
        found = self[source] = text.split("/", 1)[0]
        return found


def _target_counts(dst_tenant: str, group: list[Any], tenant: _Tenants) -> Counter[Pair]:
    counts: Counter[Pair] = Counter()
    if len(group) == 1:
        sources, ports = _checked(group[0])
        for source in set(sources):
            counts[(tenant[source], dst_tenant)] += len(ports)
        return counts
    pairs: set[tuple[Any, int]] = set()  # (source, port): the flows to this group and proto
    for entry in group:
        sources, ports = _checked(entry)
        pairs.update((source, port) for source in sources for port in ports)
    for source, _port in pairs:
        counts[(tenant[source], dst_tenant)] += 1
    return counts


def target_counts(raw: Any, previous: TargetCounts | None = None) -> TargetCounts:
    """The answer's flows by target and tenant pair; a target whose entries equal its entries in `previous`
    (the answer before a change) keeps its counts without counting again. InvalidInput when malformed."""
    tenant = _Tenants()
    out: TargetCounts = {}
    for key, group in by_target(raw).items():
        old = previous.get(key) if previous is not None else None
        if old is not None and same_entries(old[0], group):
            out[key] = (group, old[1])
        else:
            out[key] = (group, _target_counts(key[0], group, tenant))
    return out


def totals(targets: TargetCounts, previous: TargetCounts | None = None, counts: dict[Pair, int] | None = None
           ) -> dict[Pair, int]:
    """{(src_tenant, dst_tenant): flows}; from `counts` (the totals of `previous`) by the targets that changed
    when both are given, summed afresh otherwise."""
    if previous is None or counts is None:
        total: Counter[Pair] = Counter()
        for _group, c in targets.values():
            total.update(c)
        return dict(total)
    out = Counter(counts)
    for key in previous.keys() | targets.keys():
        old, new = previous.get(key), targets.get(key)
        if old is not None and new is not None and old[1] is new[1]:
            continue
        if old is not None:
            out.subtract(old[1])
        if new is not None:
            out.update(new[1])
    return {pair: n for pair, n in out.items() if n > 0}


def pair_counts(raw: Any) -> dict[Pair, int]:
    """{(src_tenant, dst_tenant): number of distinct allowed flows}; equal to counting expand_allowed(raw)
    by tenant pair. InvalidInput for a malformed answer."""
    return totals(target_counts(raw))


def flows_between(raw: Any, src_tenant: str, dst_tenant: str) -> dict[Flow, list[str]]:
    """The allowed flows from src_tenant to dst_tenant and the reasons allowing each, sorted by flow."""
    prefix = f"{src_tenant}/"
    picked: list[Any] = []
    for entry in _entries(raw):
        if target_key(entry)[0] != dst_tenant:
            continue
        sources = entry.get("sources")
        if not isinstance(sources, list):
            raise InvalidInput(f"data.flows.allowed_flows has a malformed entry {entry!r:.200}")
        mine = [s for s in sources if str(s).startswith(prefix)]
        if mine:
            picked.append({**entry, "sources": mine})
    flows = expand_allowed(picked)
    return {f: sorted(set(flows[f])) for f in sorted(flows)}


def mirrors_between(raw: Any, src_tenant: str, dst_tenant: str, allowed: Mapping[Flow, Any] | None = None
                    ) -> dict[Flow, list[str]]:
    """The RoCEv2 flows from src_tenant to dst_tenant that pass on the wire only as mirrors (core/rocev2.py):
    the policy does not allow them, it allows their reverse (udp/4791 is symmetric on the SuperNICs). Each with
    the reasons allowing that reverse, sorted by flow. `allowed`: flows_between(raw, src_tenant, dst_tenant)
    when the caller has it. Only the two tenants' entries are read, as for flows_between."""
    if allowed is None:
        allowed = flows_between(raw, src_tenant, dst_tenant)
    out: dict[Flow, list[str]] = {}
    for f, reasons in flows_between(raw, dst_tenant, src_tenant).items():
        if not is_rocev2(f.proto, f.port):
            continue
        m = f.reversed()
        if m != f and m not in allowed:
            out[m] = reasons
    return {f: out[f] for f in sorted(out)}


def mirror_counts(raw: Any) -> dict[Pair, int]:
    """{(src_tenant, dst_tenant): RoCEv2 flows passing only as mirrors}: the sum of mirrors_between over every pair,
    in one pass over the udp entries that include 4791 (the rest cannot mirror)."""
    allowed: set[tuple[str, str]] = set()  # (source "tenant/group", destination "tenant/group") on udp/4791
    for entry in _entries(raw):
        dst_tenant, dst_group, proto = target_key(entry)
        if proto != ROCE_V2_PROTO:
            continue
        sources, ports = _checked(entry)
        if ROCE_V2_PORT in ports:
            allowed.update((str(s), f"{dst_tenant}/{dst_group}") for s in sources)
    counts: Counter[Pair] = Counter()
    for src, dst in allowed:
        if (dst, src) not in allowed:  # dst's RoCEv2 reaches src as the mirror (never src == dst: it is allowed)
            counts[(dst.split("/", 1)[0], src.split("/", 1)[0])] += 1
    return dict(counts)


def pair_listing(raw: Any, src_tenant: str, dst_tenant: str, *, offset: int = 0, limit: int = 200
                 ) -> dict[str, Any]:
    """One page of the flows from src_tenant to dst_tenant, as the API and the CLI list them: `items` (the policy's
    flows with their reasons) and `total`; beside them, never among them, `mirrors` (RoCEv2 passing only as the
    mirror of an allowed reverse, mirrors_between) and `mirrors_total`, each `"mirror": "rocev2"` with a note naming
    what allows the reverse. Both are paged by the same offset and limit; `next_offset` is set while either has
    more."""
    between = flows_between(raw, src_tenant, dst_tenant)
    mirrored = mirrors_between(raw, src_tenant, dst_tenant, between)
    end = offset + limit
    return {
        "total": len(between),
        "items": [{**f._asdict(), "reasons": reasons} for f, reasons in list(between.items())[offset:end]],
        "next_offset": end if end < max(len(between), len(mirrored)) else None,
        "mirrors_total": len(mirrored),
        "mirrors": [{**f._asdict(), "mirror": MIRROR,
                     "notes": [mirror_note(f"{f.src_tenant}/{f.src_group}", f"{f.dst_tenant}/{f.dst_group}", why)]}
                    for f, why in list(mirrored.items())[offset:end]],
    }


def tenant_totals(counts: Mapping[Pair, int]) -> dict[str, int]:
    """Flows in and out of each tenant (a flow inside a tenant counts once)."""
    totals: Counter[str] = Counter()
    for (src, dst), n in counts.items():
        totals[src] += n
        if dst != src:
            totals[dst] += n
    return dict(totals)


def top_tenants(counts: Mapping[Pair, int], *, search: str = "", offset: int = 0, limit: int = 20
                ) -> tuple[list[str], int]:
    """(one page of tenants with the most flows, whose name contains `search`; how many match): the rows
    and columns of a matrix that stays readable at 1,000 tenants."""
    totals = tenant_totals(counts)
    needle = search.strip().lower()
    names: Iterable[str] = (t for t in totals if needle in t.lower()) if needle else totals
    ranked = sorted(names, key=lambda t: (-totals[t], t))
    return ranked[offset:offset + limit], len(ranked)


@dataclass(frozen=True)
class TenantRow:
    tenant: str
    flows: int  # from and to this tenant (inside it counted once)
    out_other: int  # from this tenant to tenants not on the page
    in_other: int  # to this tenant from tenants not on the page
    mirrors_out_other: int = 0  # RoCEv2 mirrors (mirror_counts) from this tenant to tenants not on the page
    mirrors_in_other: int = 0  # ... and to this tenant from tenants not on the page


@dataclass(frozen=True)
class MatrixPage:
    """One page of the tenant-by-tenant matrix: its tenants (rows and columns), the non-empty cells between
    them, and what the page leaves out counted per tenant, so nothing is hidden."""

    tenants: list[TenantRow]
    cells: list[tuple[str, str, int]]  # (source tenant, destination tenant, flows), sorted
    tenants_matching: int
    flows: int  # every allowed flow
    next_offset: int | None
    mirror_cells: list[tuple[str, str, int]] = field(default_factory=list)  # the same for RoCEv2 mirrors, sorted


Cell = tuple[str, str, int]  # (source tenant, destination tenant, count)


def _other(counts: Mapping[Pair, int], page: list[str]) -> tuple[dict[str, int], dict[str, int], list[Cell]]:
    """(out to tenants off the page, in from them, the cells between the page's tenants) of `counts`."""
    on_page = set(page)
    out_other = dict.fromkeys(page, 0)
    in_other = dict.fromkeys(page, 0)
    cells: list[Cell] = []
    for (src, dst), n in counts.items():
        if src in on_page and dst in on_page:
            cells.append((src, dst, n))
        elif src in on_page:
            out_other[src] += n
        elif dst in on_page:
            in_other[dst] += n
    return out_other, in_other, sorted(cells)


def matrix_page(counts: Mapping[Pair, int], *, search: str = "", offset: int = 0, limit: int = 20,
                mirrors: Mapping[Pair, int] | None = None) -> MatrixPage:
    """One page of tenants; `mirrors` (mirror_counts) are counted apart, beside the flows, in the same way: the
    cells between the page's tenants (`mirror_cells`), and each tenant's mirrors to and
    from tenants off the page are its `mirrors_out_other` / `mirrors_in_other` (the "other tenants" row and
    column), so no mirror is left out of the page either."""
    page, matching = top_tenants(counts, search=search, offset=offset, limit=limit)
    totals = tenant_totals(counts)
    out_other, in_other, cells = _other(counts, page)
    m_out, m_in, m_cells = _other(mirrors or {}, page)
    return MatrixPage(
        tenants=[TenantRow(t, totals[t], out_other[t], in_other[t], m_out[t], m_in[t]) for t in page], cells=cells,
        tenants_matching=matching, flows=sum(counts.values()),
        next_offset=offset + limit if offset + limit < matching else None, mirror_cells=m_cells,
    )
