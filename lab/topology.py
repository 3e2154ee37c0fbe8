"""The lab's plan of a fabric (pure: names, links, addresses and commands; lab.build carries it out).

Namespaces (the only names the lab creates in the root namespace; every interface lives inside them):
  <lab>-ovs            the private ovs-vswitchd (one daemon): a bridge per GPU node (its SuperNIC, running
                       the node's OpenFlow rule set) and `br-wire`, the cables with the leaf ports' 802.1Q
                       subinterfaces (this kernel has no VLAN devices, so the demultiplexing is OpenFlow);
  <lab>-n-<node>       a GPU node: one interface per placed workload with its addresses;
  <lab>-l-<leaf>       a leaf: one interface per (node, tenant) attachment, VRFs as routing tables, the ACLs
                       in nftables (enforcer.backends.linux);
  <lab>-s-<spine>      a spine (fabrics with more than one leaf): an IPv4 underlay router, tenant-blind.
`<lab>` is `tfl` + 6 hex digits of the data directory's path, so one TRUSTFABRIC_HOME has one lab and
`lab down` finds its leftovers by that prefix after a crash.

Interface names (a Linux name holds 15 characters; names are per namespace, so the fabric's own names are
used wherever they fit, and i = the node's index, j = the placement's index on its node, V = a VLAN):
  node namespace   the NIC host port (`pf0vf0`), else `vf<j>`
  ovs namespace    `n<i>p<j>` (host port), `n<i>t<V>` (the leaf attachment's cable end), `n<i>u`/`n<i>w`
                   (patch ports: the NIC uplink and its cable end on br-wire), bridges `br-n<i>`, `br-wire`
  leaf namespace   the attachment as the enforcer names it, `<leaf port>.<vlan>` (`swp1.101`), else
                   `a<i>v<V>`; spine links by the leaf port (`swp31`), else `up<m>`; `vx<vni>` per tenant
  spine namespace  the spine port (`swp1`), else `dn<m>`

Packets: a workload's default route is the gateway 169.254.0.1 / fe80::1, which every attachment port
holds (as an anycast gateway on a Cumulus SVI does). The NIC tags a workload's frames with its tenant's
VLAN towards the uplink; br-wire pops the tag onto the (node, tenant) veth into the leaf, and tags the
other way. Between leaves, each tenant VRF rides its L3VNI: vxlan devices (a static FDB and neighbour
entry per remote leaf, with a router MAC per leaf, as EVPN type-5 installs them) over an IPv4 underlay
(VTEPs 100.127.0.0/16 on the leaves' loopbacks, /31 leaf-spine links from 100.64.0.0/16, static routes).
The spine carries only underlay routes: tenant separation across it is the VNI, and a tenant table on a
leaf ends in `unreachable`, so no tenant packet can reach the underlay.

Several workloads of one node share its namespace: each sends from its own address through its own
table (`ip rule from <addr> iif lo`), and the `local` rule is moved behind those rules, so even traffic
between two workloads of one node leaves through the NIC and the leaf, as traffic between VFs does.
"""

from __future__ import annotations

import hashlib
import ipaddress
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from enforcer.backends.linux import LeafWiring
from enforcer.fabric import Fabric, Placement
from lab.errors import LabInputError

LAB_PREFIX = "tfl"
GATEWAY_V4 = "169.254.0.1"
GATEWAY_V6 = "fe80::1"
VTEP_NET = ipaddress.IPv4Network("100.127.0.0/16")
LINK_NET = ipaddress.IPv4Network("100.64.0.0/16")
NODE_TABLE_BASE = 100  # node namespace: workload j sends through table (and rule priority) 100 + j
NODE_LOCAL_PREF = 32000  # the `local` rule moved behind the per-workload rules
LEAF_LOCAL_PREF = 32500  # behind the VRF rules (enforcer.backends.linux keeps its rules below 32000)
FABRIC_MTU = 9000  # leaf-spine links carry vxlan (50 bytes more than a workload's 1500)
WIRE_BRIDGE = "br-wire"
IFNAMSIZ = 15
RESERVED_IFNAMES = frozenset({"lo", "all", "default"})


def lab_id(home: Path) -> str:
    """The lab of a data directory: `tfl` + 6 hex digits of its absolute path."""
    return LAB_PREFIX + hashlib.sha256(str(Path(home).resolve()).encode()).hexdigest()[:6]


@dataclass(frozen=True)
class Names:
    lab: str

    @property
    def ovs_ns(self) -> str:
        return f"{self.lab}-ovs"

    def node_ns(self, node: str) -> str:
        return f"{self.lab}-n-{node}"

    def leaf_ns(self, leaf: str) -> str:
        return f"{self.lab}-l-{leaf}"

    def spine_ns(self, spine: str) -> str:
        return f"{self.lab}-s-{spine}"

    @property
    def prefix(self) -> str:
        """Every namespace of this lab starts with it (another lab's id never does: fixed length)."""
        return f"{self.lab}-"

    @property
    def rundir(self) -> Path:
        """The OVS run directory (short: OVS's unix sockets live in it)."""
        return Path(tempfile.gettempdir()) / f"{self.lab}-ovs"


def usable_ifname(name: str) -> bool:
    return (0 < len(name) <= IFNAMSIZ and name not in RESERVED_IFNAMES and name not in (".", "..")
            and not any(c in name for c in "/: \t\n%"))


@dataclass(frozen=True)
class Veth:
    ns_a: str
    if_a: str
    ns_b: str
    if_b: str
    ovs: bool  # one end in the OVS namespace: tx checksum offload off on both ends


@dataclass
class NicPlan:
    device: str  # nic:<node>
    node: str
    bridge: str
    port_names: dict[str, str]  # IR port (uplink, host ports) -> OVS port
    ports: list[tuple[str, str]]  # (OVS port, "" | "patch:<peer>") in the order they are added


@dataclass
class WorkloadPlan:
    workload: str
    node: str
    netns: str
    ifname: str
    table: int
    ipv4: str | None
    ipv6: str | None


@dataclass
class Plan:
    names: Names
    namespaces: list[str] = field(default_factory=list)
    veths: list[Veth] = field(default_factory=list)
    # (ns, 4 | 6) -> `ip -batch` lines; 4: the family follows from each line, 6: run with -6 (rules without
    # an address, which ip would read as IPv4)
    ip_lines: dict[tuple[str, int], list[str]] = field(default_factory=dict)
    fdb_lines: dict[str, list[str]] = field(default_factory=dict)  # ns -> `bridge -batch` lines
    sysctls: dict[str, list[tuple[str, str]]] = field(default_factory=dict)  # ns -> (/proc/sys path, value)
    tx_off: dict[str, list[str]] = field(default_factory=dict)  # ns -> interfaces
    nics: dict[str, NicPlan] = field(default_factory=dict)
    wire_ports: list[tuple[str, str]] = field(default_factory=list)  # on br-wire: (port, "" | "patch:<peer>")
    wire_flows: list[str] = field(default_factory=list)
    leaves: dict[str, tuple[str, LeafWiring]] = field(default_factory=dict)  # leaf:<name> -> (ns, wiring)
    workloads: dict[str, WorkloadPlan] = field(default_factory=dict)

    def ip(self, ns: str, line: str, family: int = 4) -> None:
        self.ip_lines.setdefault((ns, family), []).append(line)

    def sysctl(self, ns: str, path: str, value: str | int) -> None:
        self.sysctls.setdefault(ns, []).append((path, str(value)))


def _rmac(k: int) -> str:
    """The router MAC of leaf k (locally administered, unique per leaf)."""
    n = k + 1
    return f"02:74:66:{(n >> 16) & 255:02x}:{(n >> 8) & 255:02x}:{n & 255:02x}"


def _placed(fabric: Fabric, node: str) -> list[Placement]:
    return [p for p in fabric.placements_on.get(node, ()) if p.workload in fabric.workload]


def topology_digest(fabric: Fabric) -> str:
    """What the lab's topology depends on (nodes, switches, links, placements, tenant VLANs and VNIs): a
    change in it needs `lab down` + `lab up`; anything else is a rule-set change `lab apply` handles."""
    parts = [repr(sorted(fabric.nodes, key=lambda n: n.name)), repr(sorted(fabric.switches, key=lambda s: s.name)),
             repr(sorted(fabric.links)), repr(sorted(fabric.placements, key=lambda p: p.workload)),
             repr(sorted((t.slug, t.vni, t.vlan) for t in fabric.tenants)), repr(sorted(fabric.workload))]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()


def plan(fabric: Fabric, names: Names) -> Plan:
    """Everything `lab up` creates for `fabric`; LabInputError when the fabric cannot be realised here."""
    p = Plan(names)
    ovs = names.ovs_ns
    p.namespaces.append(ovs)
    p.ip(ovs, "link set lo up")
    node_index = {n.name: i for i, n in enumerate(fabric.nodes)}
    for node in fabric.nodes:
        _node(p, fabric, node.name, node_index[node.name])
    leaves = list(fabric.leaves)
    underlay = _underlay(p, fabric) if len(leaves) > 1 else {}
    for k, leaf in enumerate(leaves):
        _leaf(p, fabric, leaf.name, k, node_index, underlay)
    return p


def _routed_namespace(p: Plan, ns: str, local_pref: int) -> None:
    """A node or leaf namespace: loopback up, the `local` rule moved to `local_pref` (behind the rules that
    must see the packets first), no reverse-path filter, no router advertisements taken."""
    p.namespaces.append(ns)
    p.ip(ns, "link set lo up")
    for fam in (4, 6):
        p.ip(ns, f"rule add pref {local_pref} lookup local", fam)
        p.ip(ns, "rule del pref 0", fam)
    for scope in ("all", "default"):
        p.sysctl(ns, f"net/ipv4/conf/{scope}/rp_filter", 0)
        p.sysctl(ns, f"net/ipv6/conf/{scope}/accept_ra", 0)


def _node(p: Plan, fabric: Fabric, node: str, i: int) -> None:
    names = p.names
    ns = names.node_ns(node)
    _routed_namespace(p, ns, NODE_LOCAL_PREF)
    p.sysctl(ns, "net/ipv4/conf/all/accept_local", 1)  # one node's workloads talk to each other over the NIC
    p.sysctl(ns, "net/ipv4/conf/all/arp_announce", 2)  # ARP from the interface's own address
    bridge = f"br-n{i}"
    nic = NicPlan(f"nic:{node}", node, bridge, {}, [])
    att = fabric.attachment.get(node)
    if att is not None:
        up, wire = f"n{i}u", f"n{i}w"
        nic.port_names[att.uplink] = up
        nic.ports.append((up, f"patch:{wire}"))
        p.wire_ports.append((wire, f"patch:{up}"))
    used: set[str] = set()
    for j, pl in enumerate(_placed(fabric, node)):
        host_if = pl.port if usable_ifname(pl.port) and pl.port not in used else f"vf{j}"
        if host_if in used:
            raise LabInputError(f"node {node}: two workloads would share the interface name {host_if}")
        used.add(host_if)
        ovs_if = f"n{i}p{j}"
        p.veths.append(Veth(ns, host_if, names.ovs_ns, ovs_if, ovs=True))
        p.tx_off.setdefault(ns, []).append(host_if)
        p.tx_off.setdefault(names.ovs_ns, []).append(ovs_if)
        p.ip(names.ovs_ns, f"link set {ovs_if} up")
        nic.port_names[pl.port] = ovs_if
        nic.ports.append((ovs_if, ""))
        table = NODE_TABLE_BASE + j
        p.ip(ns, f"link set {host_if} addrgenmode none")
        p.ip(ns, f"link set {host_if} up")
        if pl.ipv4:
            p.ip(ns, f"addr add {pl.ipv4}/32 dev {host_if}")
            p.ip(ns, f"route add default via {GATEWAY_V4} dev {host_if} onlink table {table}")
            p.ip(ns, f"rule add pref {table} from {pl.ipv4} iif lo lookup {table}")
        if pl.ipv6:
            p.ip(ns, f"addr add {pl.ipv6}/128 dev {host_if} nodad")
            p.ip(ns, f"route add ::/0 via {GATEWAY_V6} dev {host_if} table {table}")
            p.ip(ns, f"rule add pref {table} from {pl.ipv6} iif lo lookup {table}", 6)
        p.workloads[pl.workload] = WorkloadPlan(pl.workload, node, ns, host_if, table, pl.ipv4, pl.ipv6)
    p.nics[nic.device] = nic


@dataclass(frozen=True)
class _Underlay:
    vtep: dict[str, str]  # every leaf -> its VTEP
    routes: list[str]  # `ip route` lines of this leaf's main table


def _underlay(p: Plan, fabric: Fabric) -> dict[str, _Underlay]:
    """The spines and their /31 links; each pair of leaves reaches each other through the first spine both
    are cabled to."""
    names = p.names
    leaves = [x.name for x in fabric.leaves]
    spine_links = sorted(lk for lk in fabric.links if lk.peer_kind == "spine")
    if not spine_links:
        raise LabInputError(f"{len(leaves)} leaves but no spine links: the lab connects leaves through a spine")
    vtep = {leaf: str(VTEP_NET.network_address + k + 1) for k, leaf in enumerate(leaves)}
    addr: dict[tuple[str, str], tuple[str, str]] = {}  # (leaf, spine) -> (leaf side, spine side), first link
    used_leaf: dict[str, set[str]] = {}
    used_spine: dict[str, set[str]] = {}
    spine_lines: dict[str, list[str]] = {}
    for m, lk in enumerate(spine_links):
        lns, sns = names.leaf_ns(lk.leaf), names.spine_ns(lk.peer)
        if sns not in p.namespaces:
            p.namespaces.append(sns)
            p.ip(sns, "link set lo up")
            p.sysctl(sns, "net/ipv4/ip_forward", 1)
        lif = lk.leaf_port if usable_ifname(lk.leaf_port) else f"up{m}"
        sif = lk.peer_port if usable_ifname(lk.peer_port) else f"dn{m}"
        if lif in used_leaf.setdefault(lk.leaf, set()) or sif in used_spine.setdefault(lk.peer, set()):
            raise LabInputError(f"link {lk.leaf}:{lk.leaf_port} - {lk.peer}:{lk.peer_port}: interface name taken")
        used_leaf[lk.leaf].add(lif)
        used_spine[lk.peer].add(sif)
        a = LINK_NET.network_address + 2 * m
        p.veths.append(Veth(lns, lif, sns, sif, ovs=False))
        p.ip(lns, f"link set {lif} mtu {FABRIC_MTU} up")
        p.ip(lns, f"addr add {a}/31 dev {lif}")
        p.ip(sns, f"link set {sif} mtu {FABRIC_MTU} up")
        p.ip(sns, f"addr add {a + 1}/31 dev {sif}")
        if (lk.leaf, lk.peer) not in addr:
            addr[(lk.leaf, lk.peer)] = (str(a), str(a + 1))
            spine_lines.setdefault(sns, []).append(f"route add {vtep[lk.leaf]}/32 via {a}")
    for sns, lines in spine_lines.items():
        for line in lines:
            p.ip(sns, line)
    out: dict[str, _Underlay] = {}
    spines_of = {leaf: sorted(s for (lf, s) in addr if lf == leaf) for leaf in leaves}
    for leaf in leaves:
        routes = []
        for other in leaves:
            if other == leaf:
                continue
            shared = [s for s in spines_of[leaf] if s in spines_of[other]]
            if not shared:
                raise LabInputError(f"leaves {leaf} and {other} share no spine: the lab cannot connect them")
            routes.append(f"route add {vtep[other]}/32 via {addr[(leaf, shared[0])][1]}")
        out[leaf] = _Underlay(vtep, routes)
    return out


def _leaf(p: Plan, fabric: Fabric, leaf: str, k: int, node_index: dict[str, int], underlay: dict[str, _Underlay]
          ) -> None:
    names = p.names
    ns = names.leaf_ns(leaf)
    _routed_namespace(p, ns, LEAF_LOCAL_PREF)
    p.sysctl(ns, "net/ipv4/ip_forward", 1)
    p.sysctl(ns, "net/ipv6/conf/all/forwarding", 1)
    port_names: dict[str, str] = {}
    used: set[str] = set()
    for node in fabric.nodes_under.get(leaf, ()):
        i = node_index[node]
        att = fabric.attachment[node]
        tenants = sorted({pl.workload.split("/", 1)[0] for pl in _placed(fabric, node)})
        for slug in tenants:
            vlan = fabric.tenant[slug].vlan
            ir = f"{att.leaf_port}.{vlan}"
            lif = ir if usable_ifname(ir) and ir not in used else f"a{i}v{vlan}"
            if lif in used:
                raise LabInputError(f"leaf {leaf}: two attachments would share the interface name {lif}")
            used.add(lif)
            port_names[ir] = lif
            cable = f"n{i}t{vlan}"
            p.veths.append(Veth(ns, lif, names.ovs_ns, cable, ovs=True))
            p.tx_off.setdefault(ns, []).append(lif)
            p.tx_off.setdefault(names.ovs_ns, []).append(cable)
            p.ip(names.ovs_ns, f"link set {cable} up")
            p.wire_ports.append((cable, ""))
            p.wire_flows.append(f"table=0,priority=100,in_port=n{i}w,dl_vlan={vlan} "
                                f"actions=pop_vlan,output:{cable}")
            p.wire_flows.append(f"table=0,priority=100,in_port={cable} "
                                f"actions=push_vlan:0x8100,set_field:{4096 + vlan}->vlan_vid,output:n{i}w")
            p.ip(ns, f"link set {lif} addrgenmode none")
            p.ip(ns, f"link set {lif} up")
            p.ip(ns, f"addr add {GATEWAY_V4}/32 dev {lif}")
            p.ip(ns, f"addr add {GATEWAY_V6}/64 dev {lif} nodad")
    l3vni: dict[int, str] = {}
    vteps: dict[str, str] = {}
    if leaf in underlay:
        u = underlay[leaf]
        me = u.vtep[leaf]
        p.ip(ns, f"addr add {me}/32 dev lo")
        for line in u.routes:
            p.ip(ns, line)
        others = [(m, other, addr) for m, (other, addr) in enumerate(u.vtep.items()) if other != leaf]
        vteps = {other: addr for _, other, addr in others}
        for t in sorted(fabric.tenants, key=lambda t: t.vni):
            vx = f"vx{t.vni}"
            l3vni[t.vni] = vx
            p.ip(ns, f"link add {vx} type vxlan id {t.vni} local {me} dstport 4789 nolearning")
            p.ip(ns, f"link set {vx} address {_rmac(k)} addrgenmode none mtu 1500 up")
            for m, _other, addr in others:
                p.ip(ns, f"neigh replace {addr} lladdr {_rmac(m)} dev {vx} nud permanent")
                p.ip(ns, f"neigh replace ::ffff:{addr} lladdr {_rmac(m)} dev {vx} nud permanent")
                p.fdb_lines.setdefault(ns, []).append(f"fdb append {_rmac(m)} dev {vx} dst {addr}")
    p.leaves[f"leaf:{leaf}"] = (ns, LeafWiring(port_names, l3vni, vteps, GATEWAY_V4))
