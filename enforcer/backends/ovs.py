"""SuperNIC backend: OpenFlow 1.3 into an Open vSwitch bridge (OVS-DOCA on a BlueField-3; OVS here).

apply = `ovs-ofctl --bundle replace-flows` (one OpenFlow bundle: the switch commits all flows or none, so
the last good set stays on any error, and flows that did not change keep their counters); installed =
`dump-flows`; drift = `diff-flows` between the bridge and the rendered set (OVS compares them itself).
"""

from __future__ import annotations

import os
import re
import tempfile
from collections.abc import Mapping

from core.testpoints import pause_point
from enforcer.backends.base import RuleCounter
from enforcer.errors import ApplyError, NotApplied
from enforcer.ir import DeviceRuleSet
from enforcer.ovsd import OvsDaemons
from enforcer.render.openflow import cookie_map, render_openflow

_FLOW_STATS = re.compile(r"cookie=(0x[0-9a-f]+).*?table=(\d+), n_packets=(\d+), n_bytes=(\d+),.*?priority=(\d+)"
                         r"(?:,\S*)? actions=(\S+)")

OF = ("-O", "OpenFlow13")
SPOOFING = ("anti-spoofing",)  # the reasons of the classifier's final drop: traffic from no known address


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
        return rules.content_hash

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
