"""SuperNIC backend: OpenFlow 1.3 into an Open vSwitch bridge (OVS-DOCA on a BlueField-3; OVS here).

apply = `ovs-ofctl --bundle replace-flows` (one OpenFlow bundle: the switch commits all flows or none, so
the last good set stays on any error, and flows that did not change keep their counters); installed =
`dump-flows`; drift = `diff-flows` between the bridge and the rendered set (OVS compares them itself).
After the commit, the conntrack entries of connections the new set no longer admits are removed
(`forget_withdrawn`): the established rule would let them run on.
"""

from __future__ import annotations

import ipaddress
import os
import re
import subprocess
import tempfile
from collections.abc import Mapping

from core.testpoints import pause_point
from enforcer.backends.base import RuleCounter
from enforcer.errors import ApplyError, NotApplied
from enforcer.ir import ANY, DeviceRuleSet
from enforcer.ovsd import OvsDaemons
from enforcer.render.openflow import cookie_map, render_openflow

_FLOW_STATS = re.compile(r"cookie=(0x[0-9a-f]+).*?table=(\d+), n_packets=(\d+), n_bytes=(\d+),.*?priority=(\d+)"
                         r"(?:,\S*)? actions=(\S+)")

OF = ("-O", "OpenFlow13")
# one entry of `dpctl/dump-conntrack`: tcp,orig=(src=10.1.0.11,dst=10.1.0.21,sport=56697,dport=5432),reply=(...)
_CT_ENTRY = re.compile(r"^(tcp|udp),orig=\(src=([^,]+),dst=([^,]+),sport=(\d+),dport=(\d+)\)")
SPOOFING = ("anti-spoofing",)  # the reasons of the classifier's final drop: traffic from no known address


class _NewConnections:
    """Whether a NIC rule set admits a new connection in one direction: its first rule of that direction, in
    evaluation order, that matches a new connection's packet (the stateful allows and the final deny; the
    `established` and RoCEv2 `stateless` rules never see one) is an allow."""

    def __init__(self, rules: DeviceRuleSet) -> None:
        self.rules = rules.rules
        self.nets = {s.name: [ipaddress.ip_network(c) for c in (*s.v4, *s.v6)] for s in rules.sets}

    def _in(self, name: str, addr: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
        return name == ANY or any(addr in n for n in self.nets.get(name, ()))

    def __call__(self, direction: str, src: ipaddress.IPv4Address | ipaddress.IPv6Address,
                 dst: ipaddress.IPv4Address | ipaddress.IPv6Address, proto: str, dport: int) -> bool:
        for r in self.rules:
            if r.direction != direction or r.state != "new" or r.proto not in ("*", proto):
                continue
            if r.ports and not any(lo <= dport <= hi for lo, hi in r.ports):
                continue
            if self._in(r.src, src) and self._in(r.dst, dst):
                return r.action == "allow"
        return False


class OvsBackend:
    def __init__(self, daemons: OvsDaemons, bridge: str, port_names: Mapping[str, str] | None = None) -> None:
        self.daemons = daemons
        self.bridge = bridge
        self.port_names = dict(port_names or {})

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
        self._with_file(self.render(rules), "--bundle", "replace-flows")
        self.forget_withdrawn(rules)
        return rules.content_hash

    def forget_withdrawn(self, rules: DeviceRuleSet) -> list[str]:
        """Remove the conntrack entries of this NIC's workloads that `rules` would not admit as new connections
        (their grant revoked or expired, their workload revoked or quarantined): the `+est` rule admits every
        packet of a committed connection, in both directions, so without this a connection opened while allowed
        outlived its allowance on the NIC for as long as it carried traffic. The entries `rules` still admits stay
        (a publication that changes nothing else cuts nothing). Returns the entries removed (`zone proto src:sport >
        dst:dport`); ApplyError when one cannot be (the rules are in force; the next apply tries again)."""
        admits = _NewConnections(rules)
        local = {ipaddress.ip_address(a.split("/", 1)[0]) for p in rules.ports for a in (*p.v4, *p.v6)}
        removed: list[str] = []
        for zone in sorted({p.vlan for p in rules.ports}):
            for line in self._appctl("dpctl/dump-conntrack", f"zone={zone}").stdout.splitlines():
                m = _CT_ENTRY.match(line.strip())
                if m is None:  # a protocol no allow rule names (nothing else is committed)
                    continue
                proto, src, dst, sport, dport = m.group(1), m.group(2), m.group(3), int(m.group(4)), int(m.group(5))
                s, d = ipaddress.ip_address(src), ipaddress.ip_address(dst)
                chains = [c for c, a in (("egress", s), ("ingress", d)) if a in local]
                if not chains or all(admits(c, s, d, proto, dport) for c in chains):
                    continue
                fam = "ipv6" if ":" in src else "nw"
                match = (f"ct_{fam}_src={src},ct_{fam}_dst={dst},ct_nw_proto={6 if proto == 'tcp' else 17},"
                         f"ct_tp_src={sport},ct_tp_dst={dport}")
                done = self._appctl("dpctl/flush-conntrack", f"zone={zone}", match, check=False)
                if done.returncode != 0 and "No such file or directory" not in done.stderr:  # ENOENT: gone already
                    raise ApplyError(f"{self.bridge}: the rule set is in force, but the connection {proto} "
                                     f"{src}:{sport} > {dst}:{dport} it withdraws could not be cut: "
                                     f"{done.stderr.strip()[:300]}")
                removed.append(f"{zone} {proto} {src}:{sport} > {dst}:{dport}")
        return removed

    def _appctl(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return self.daemons.run("ovs-appctl", "-t", f"{self.daemons.rundir}/vswitchd.ctl", *args, check=check)

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
        return [line.strip() for line in out.splitlines() if line.strip()]

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
