"""SuperNIC backend: OpenFlow 1.3 into an Open vSwitch bridge (OVS-DOCA on a BlueField-3; OVS here).

apply = `ovs-ofctl --bundle replace-flows` (one OpenFlow bundle: the switch commits all flows or none, so
the last good set stays on any error, and flows that did not change keep their counters); installed =
`dump-flows`; drift = `diff-flows` between the bridge and the rendered set (OVS compares them itself).
After the commit, the conntrack entries of connections the new set no longer admits are removed
(`forget_withdrawn`): the established rule would let them run on.
"""

from __future__ import annotations

import ipaddress
import logging
import os
import re
import tempfile
from collections.abc import Mapping

from core.testpoints import pause_point
from enforcer.backends.base import RuleCounter
from enforcer.errors import ApplyError, NotApplied
from enforcer.ir import ANY, PRIO_ALLOW, STATELESS, DeviceRuleSet, FlowRule
from enforcer.ovsd import OvsDaemons, Unixctl, UnixctlError
from enforcer.render.openflow import cookie_map, render_openflow

_FLOW_STATS = re.compile(r"cookie=(0x[0-9a-f]+).*?table=(\d+), n_packets=(\d+), n_bytes=(\d+),.*?priority=(\d+)"
                         r"(?:,\S*)? actions=(\S+)")

OF = ("-O", "OpenFlow13")
# one entry of `dpctl/dump-conntrack` (only TCP and UDP are committed: a NIC allow names one of them, see
# enforcer.render.openflow): tcp,orig=(src=10.1.0.11,dst=10.1.0.21,sport=56697,dport=5432),reply=(...)
_CT_ENTRY = re.compile(r"^(tcp|udp),orig=\(src=([^,]+),dst=([^,]+),sport=(\d+),dport=(\d+)\)")
SPOOFING = ("anti-spoofing",)  # the reasons of the classifier's final drop: traffic from no known address
log = logging.getLogger("trustfabric.enforcer")


Addr = ipaddress.IPv4Address | ipaddress.IPv6Address


class _NewConnections:
    """Whether a NIC rule set admits a new connection in one direction, as its OpenFlow tables 1 and 2 decide a
    `+new` packet: an allow (rendered at the allow priorities whatever its IR priority) that matches it, unless a
    catch-all deny sits at or above them (the compiler's own is at 0); the `established` and RoCEv2 `stateless`
    rules never see one. Indexed and memoised: an apply asks once per (direction, addresses, protocol, port), for
    thousands of conntrack entries, of a rule set of thousands of rules."""

    def __init__(self, rules: DeviceRuleSet) -> None:
        self.spans: dict[str, list[tuple[int, int, int]]] = {}  # set -> (IP version, first, last) of each CIDR
        for s in rules.sets:
            nets = [ipaddress.ip_network(c) for c in (*s.v4, *s.v6)]
            self.spans[s.name] = [(n.version, int(n.network_address), int(n.broadcast_address)) for n in nets]
        self.allows: dict[tuple[str, str], list[FlowRule]] = {}  # (direction, source set) -> its stateful allows
        self.closed: set[str] = set()  # directions whose catch-all deny outranks every allow
        for r in rules.rules:
            if r.action == "allow" and r.state == "new":
                self.allows.setdefault((r.direction, r.src), []).append(r)
            elif r.action == "deny" and r.state != STATELESS and r.priority >= PRIO_ALLOW:
                self.closed.add(r.direction)
        self._members: dict[Addr, frozenset[str]] = {}
        self._memo: dict[tuple[str, Addr, Addr, str, int], bool] = {}

    def members(self, addr: Addr) -> frozenset[str]:
        """The names of the sets holding `addr`, and `*`."""
        found = self._members.get(addr)
        if found is None:
            v, a = addr.version, int(addr)
            found = frozenset([ANY, *(name for name, spans in self.spans.items()
                                      if any(v == sv and lo <= a <= hi for sv, lo, hi in spans))])
            self._members[addr] = found
        return found

    def __call__(self, direction: str, src: Addr, dst: Addr, proto: str, dport: int) -> bool:
        key = (direction, src, dst, proto, dport)
        known = self._memo.get(key)
        if known is None:
            known = direction not in self.closed and self._allowed(direction, src, dst, proto, dport)
            self._memo[key] = known
        return known

    def _allowed(self, direction: str, src: Addr, dst: Addr, proto: str, dport: int) -> bool:
        dsts = self.members(dst)
        for name in self.members(src):
            for r in self.allows.get((direction, name), ()):
                if (r.proto in (ANY, proto) and r.dst in dsts
                        and (not r.ports or any(lo <= dport <= hi for lo, hi in r.ports))):
                    return True
        return False


class OvsBackend:
    def __init__(self, daemons: OvsDaemons, bridge: str, port_names: Mapping[str, str] | None = None) -> None:
        self.daemons = daemons
        self.bridge = bridge
        self.port_names = dict(port_names or {})
        self.uncut: list[str] = []  # withdrawn connections the last apply could not cut (see apply)

    def render(self, rules: DeviceRuleSet) -> str:
        return render_openflow(rules, self.port_names)

    def _with_file(self, text: str, *args: str, check: bool = True) -> str:
        """Run ovs-ofctl on a flow file; a non-zero exit with output and no error is diff-flows' "differ".
        A file, not a pipe: an agent killed while writing a pipe would hand ovs-ofctl a truncated flow list,
        which it would commit as a whole (possibly without the denies that came after the cut)."""
        fd, path = tempfile.mkstemp(prefix="flows-", suffix=".txt", dir=self.daemons.rundir)
        try:
            with os.fdopen(fd, "w") as f:
                f.write(text)
            if "replace-flows" in args:
                pause_point("ovs.apply.before-commit")
            proc = self.daemons.run("ovs-ofctl", *OF, *args, self.daemons.mgmt(self.bridge), path, check=False)
        finally:
            os.unlink(path)
        if check and proc.returncode != 0 and (proc.stderr.strip() or not proc.stdout.strip()):
            raise ApplyError(f"{self.bridge}: ovs-ofctl {args[-1]} failed: {proc.stderr.strip()[:500]}")
        return proc.stdout

    def apply(self, rules: DeviceRuleSet) -> str:
        """Commit the flows (atomic), then cut the connections they withdraw. A cut that fails does not make the
        apply an error: the new flows are in force, and an ApplyError would leave the agent holding the previous
        set as its last good one, which its drift repair would then put back, revoked allows and all. The entries
        left stand in `uncut`, and drift() reports them (trying again first), so the agent's drift check shows them
        and its repair, an apply of this same set, retries."""
        self._with_file(self.render(rules), "--bundle", "replace-flows")
        self.forget_withdrawn(rules)
        if self.uncut:
            log.warning("%s: %d withdrawn connection(s) not cut: %s", self.bridge, len(self.uncut), self.uncut[0])
        return rules.content_hash

    def forget_withdrawn(self, rules: DeviceRuleSet) -> list[str]:
        """Remove the conntrack entries of this NIC's workloads that `rules` would not admit as new connections
        (their grant revoked or expired, their workload revoked or quarantined): the `+est` rule admits every
        packet of a committed connection, in both directions, so without this a connection opened while allowed
        outlived its allowance on the NIC for as long as it carried traffic. The entries `rules` still admits stay
        (a publication that changes nothing else cuts nothing). Returns the entries removed (`zone proto src:sport >
        dst:dport`); those that could not be are left in `uncut`. One control connection for the dumps and every
        flush, each distinct flow decided once: 10,000 entries take about a second, not a process each."""
        admits = _NewConnections(rules)
        local = {ipaddress.ip_address(a.split("/", 1)[0]) for p in rules.ports for a in (*p.v4, *p.v6)}
        removed: list[str] = []
        self.uncut = []
        try:
            with self.daemons.unixctl() as ctl:
                for zone in sorted({p.vlan for p in rules.ports}):
                    self._forget_zone(ctl, zone, admits, local, removed)
        except ApplyError as exc:  # the daemon's control socket: nothing more can be read or cut now
            self.uncut.append(f"conntrack not reached: {exc}")
        return removed

    def _forget_zone(self, ctl: Unixctl, zone: int, admits: _NewConnections, local: set[Addr],
                     removed: list[str]) -> None:
        try:
            dump = ctl("dpctl/dump-conntrack", f"zone={zone}")
        except UnixctlError as exc:
            self.uncut.append(f"zone {zone}: conntrack not read: {str(exc)[:300]}")
            return
        for line in dump.splitlines():
            m = _CT_ENTRY.match(line.strip())
            if m is None:  # not TCP/UDP: never committed by an allow (RoCEv2 skips conntrack)
                continue
            proto, src, dst, sport, dport = m.group(1), m.group(2), m.group(3), int(m.group(4)), int(m.group(5))
            s, d = ipaddress.ip_address(src), ipaddress.ip_address(dst)
            chains = [c for c, a in (("egress", s), ("ingress", d)) if a in local]
            if not chains or all(admits(c, s, d, proto, dport) for c in chains):
                continue
            fam = "ipv6" if s.version == 6 else "nw"
            match = (f"ct_{fam}_src={src},ct_{fam}_dst={dst},ct_nw_proto={6 if proto == 'tcp' else 17},"
                     f"ct_tp_src={sport},ct_tp_dst={dport}")
            what = f"{zone} {proto} {src}:{sport} > {dst}:{dport}"
            try:
                ctl("dpctl/flush-conntrack", f"zone={zone}", match)
            except UnixctlError as exc:
                if "No such file or directory" not in str(exc):  # ENOENT: gone already
                    self.uncut.append(f"{what}: {str(exc)[:300]}")
                    continue
            removed.append(what)

    def installed(self) -> str:
        out = self.daemons.run("ovs-ofctl", *OF, "--no-stats", "--names", "dump-flows",
                               self.daemons.mgmt(self.bridge)).stdout
        lines = sorted(line.strip() for line in out.splitlines() if line.strip())
        if not lines:
            raise NotApplied(f"bridge {self.bridge} has no flows")
        return "\n".join(lines) + "\n"

    def _numbers(self) -> dict[str, str]:
        """Bridge port name -> OpenFlow port number (diff-flows cannot resolve names in a file)."""
        out = self.daemons.run("ovs-ofctl", *OF, "show", self.daemons.mgmt(self.bridge)).stdout
        found = re.findall(r"^\s*(\d+)\(([^)]+)\):", out, flags=re.MULTILINE)
        return {name: num for num, name in found}

    def drift(self, rules: DeviceRuleSet) -> list[str]:
        numbers = self._numbers()
        names = {p: numbers.get(self.port_names.get(p, p), self.port_names.get(p, p))
                 for p in [rules.uplink, *(x.name for x in rules.ports)]}
        out = self._with_file(render_openflow(rules, names), "diff-flows")
        lines = [line.strip() for line in out.splitlines() if line.strip()]
        if self.uncut:  # the last apply's cuts that failed: tried again, and what is still left is drift
            self.forget_withdrawn(rules)
            lines += [f"conntrack: withdrawn, still tracked: {u}" for u in self.uncut]
        return lines

    def counters(self, rules: DeviceRuleSet) -> list[RuleCounter]:
        """Per flow with a cookie (the allow and deny rules; the pipeline's plumbing carries cookie 0, except
        the classifier's final drop of traffic from no known address, reported as `anti-spoofing`)."""
        out = self.daemons.run("ovs-ofctl", *OF, "dump-flows", self.daemons.mgmt(self.bridge)).stdout
        reasons = cookie_map(rules)
        counters = []
        for m in _FLOW_STATS.finditer(out):
            cookie, table, packets, nbytes, prio, actions = m.groups()
            c = int(cookie, 16)
            if c == 0 and not (table == "0" and prio == "0"):
                continue
            why = reasons.get(c, SPOOFING if c == 0 else (f"cookie:{cookie}",))
            action = "deny" if actions == "drop" else "allow"
            counters.append(RuleCounter(f"table {table} priority {prio}", why, action, int(packets), int(nbytes)))
        if not counters:
            raise NotApplied(f"bridge {self.bridge} has no flows")
        return counters
