"""The contract every device backend keeps (one implementation per target, one conformance test for all)."""

from __future__ import annotations

from typing import NamedTuple, Protocol

from enforcer.ir import DeviceRuleSet


class Backend(Protocol):
    """Installs one device's rule set; the device keeps its last good set whatever happens."""

    def render(self, rules: DeviceRuleSet) -> str:
        """The device's native configuration for `rules`; pure: equal rule sets give equal text."""

    def apply(self, rules: DeviceRuleSet) -> str:
        """Install `rules` whole, atomically, and return its content hash; on any failure raise ApplyError
        with the previously applied set still in force (never a partial set)."""

    def installed(self) -> str:
        """What the device really runs now, read back from the device; NotApplied if none of ours."""

    def drift(self, rules: DeviceRuleSet) -> list[str]:
        """How what the device runs differs from `rules`, one line per difference (empty: in sync)."""


class RuleCounter(NamedTuple):
    """One installed rule's counters, read back from the device."""

    where: str  # leaf: the nftables chain; nic: "table <n> priority <p>"
    reasons: tuple[str, ...]  # the policy rule or grant (from the rule's comment or cookie)
    action: str  # allow | deny
    packets: int
    bytes: int


class Counting(Protocol):
    """A backend that reads per-rule counters back (OVS flows, nftables rules; NVUE has no such API here)."""

    def counters(self, rules: DeviceRuleSet) -> list[RuleCounter]:
        """Every installed rule that counts, with the reasons `rules` gives it; NotApplied if none of ours."""
