"""What a leaf's agent needs besides its rule set to realise it on a Linux leaf: the tenants' VNIs, VLANs and
prefixes, the cables (which leaf each node hangs off) and the placements' addresses, from which
`enforcer.render.linux` derives the VRF tables' host routes (a Cumulus leaf learns them from EVPN instead).

The server serves it at `GET /v1/devices/leaf:<name>/fabric` (ETag: its `view_hash`) and names that hash
with every leaf rule set it serves; the agent, which has no database, rebuilds a `Fabric` from it and
fetches it again only when the hash changed. Attestation selectors are left out: a leaf has no use for them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from core.canonical import content_hash
from enforcer.errors import ApplyError
from enforcer.fabric import Fabric, Link, Placement, Tenant


def leaf_view(fabric: Fabric) -> dict[str, Any]:
    """The routing part of `fabric`, as plain JSON."""
    return {
        "trust_domain": fabric.trust_domain,
        "tenants": [[t.slug, t.vni, t.vlan, list(t.prefixes)] for t in fabric.tenants],
        "links": [[x.leaf, x.leaf_port, x.peer, x.peer_port, x.peer_kind] for x in fabric.links],
        "placements": [[p.workload, p.node, p.port, p.ipv4, p.ipv6] for p in fabric.placements],
    }


def view_hash(doc: Mapping[str, Any]) -> str:
    """The view's content hash: the server sends it with a leaf's rule set (`X-Fabric-View`), so an agent
    holding that view applies at once instead of fetching it again (one round trip off the critical path)."""
    return content_hash(dict(doc))


def fabric_of_view(doc: Mapping[str, Any]) -> Fabric:
    """The Fabric `leaf_view` was made from (routing part only); ApplyError when the document is malformed."""
    try:
        tenants = tuple(Tenant(str(s), int(vni), int(vlan), tuple(str(p) for p in prefixes))
                        for s, vni, vlan, prefixes in doc["tenants"])
        links = tuple(Link(str(a), str(b), str(c), str(d), "node" if k == "node" else "spine")
                      for a, b, c, d, k in doc["links"])
        placements = tuple(Placement(str(w), str(n), str(p), v4, v6) for w, n, p, v4, v6 in doc["placements"])
        return Fabric(str(doc["trust_domain"]), tenants, (), (), (), (), links, placements)
    except (KeyError, TypeError, ValueError) as exc:
        raise ApplyError(f"the leaf's fabric view is malformed: {exc!r}") from None
