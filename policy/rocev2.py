"""What the decision pages say about RoCEv2's symmetry (core/rocev2.py): the policy decides A -> B, the SuperNICs
let B's RoCEv2 reach A as its mirror. These notes sit beside a decision's reasons, never among them: the
reasons are the policy's answer (and what the decision log records), a note is what the devices add to it.

Each note names only the two groups of the grant or flow it is attached to, which whoever may see that grant or
flow already sees (policy/disclosure.py), and is worked out from the request alone, never from another
tenant's inventory.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from core.rocev2 import ROCE_V2_PORT, includes_rocev2

NOTE_PREFIX = "rocev2-mirror:"


def grant_notes(src: str, dst: str, proto: str, ports: Iterable[int]) -> list[str]:
    """The note for a grant src -> dst (tenant/group each) that opens or would open these ports: one sentence
    when they include RoCEv2, telling the approver that their group's RoCEv2 reaches the requester's too."""
    if not includes_rocev2(proto, ports):
        return []
    return [f"{NOTE_PREFIX} udp/{ROCE_V2_PORT} is RoCEv2, symmetric on the SuperNICs: {dst}'s RoCEv2 can also "
            f"reach {src}, with no grant of its own"]


def allow_sources(reasons: Sequence[str]) -> list[str]:
    """What allows a flow, as its allow reasons name it ("grant:g-1 allows ..." -> "grant:g-1",
    "intra-tenant: ..." -> "intra-tenant"), in order, once each."""
    out: list[str] = []
    for reason in reasons:
        head = reason.split(" ", 1)[0].rstrip(":")
        if head and head not in out:
            out.append(head)
    return out


def mirror_note(src: str, dst: str, reverse_reasons: Sequence[str]) -> str:
    """The note for RoCEv2 src -> dst that the policy denies while it allows dst -> src (for `reverse_reasons`):
    the SuperNICs let it through as that flow's mirror."""
    by = ", ".join(allow_sources(reverse_reasons)) or "the policy"
    return (f"{NOTE_PREFIX} the SuperNICs let this RoCEv2 through anyway, as the mirror of {dst} -> {src} "
            f"udp/{ROCE_V2_PORT}, which {by} allows (RoCEv2 skips conntrack, so an allowance is symmetric)")
