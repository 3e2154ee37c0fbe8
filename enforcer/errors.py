"""The enforcer's errors; api/ maps them to HTTP status codes in one place (InvalidInput -> 400/422)."""

from __future__ import annotations

from dataclasses import dataclass

from core.errors import InvalidInput, TrustfabricError


class FabricError(InvalidInput):
    """A fabric file or model is inconsistent; the message names the file, line and field."""


@dataclass(frozen=True)
class Overflow:
    """One device over its budget, with the reasons that use the most of it (largest first)."""

    device: str
    what: str  # "nic flows" | "switch ACL entries"
    used: int
    limit: int
    contributors: tuple[tuple[str, int], ...]

    def __str__(self) -> str:
        top = ", ".join(f"{reason} ({n})" for reason, n in self.contributors)
        return f"{self.device}: {self.used} {self.what} > budget {self.limit}; largest: {top}"


class BudgetExceeded(InvalidInput):
    """The plan needs more entries than a device holds; nothing may be applied."""

    def __init__(self, overflows: list[Overflow]) -> None:
        self.overflows = overflows
        shown = "; ".join(str(o) for o in overflows[:5])
        more = f" (+{len(overflows) - 5} more devices)" if len(overflows) > 5 else ""
        super().__init__(f"rule budget exceeded on {len(overflows)} device(s): {shown}{more}")


class ApplyError(TrustfabricError):
    """A backend could not install a rule set; the device still runs the last good set."""


class NotApplied(TrustfabricError):
    """The backend has no applied rule set to read back."""
