"""RoCEv2 on the wire, defined once for the enforcer that compiles it and the policy pages that explain it.

Every RoCEv2 packet, requests, responses and ACKs alike, goes to UDP port 4791 from a varying source port, and
the SuperNICs let it skip conntrack (enforcer/ir.py, `stateless` rules). So nothing on the wire tells the two
directions apart: an allowance A -> B udp/4791 also lets B's RoCEv2 reach A (udp/4791). The policy decides on
A -> B only; what the devices add, the reverse flow, is its "mirror", marked MIRROR wherever it is shown.
"""

from __future__ import annotations

from collections.abc import Iterable

ROCE_V2_PORT = 4791  # IANA's RoCEv2 port: the UDP destination port of every RoCEv2 packet, in both directions
ROCE_V2_PROTO = "udp"
MIRROR = "rocev2"  # the marker of a flow the devices allow only as the RoCEv2 mirror of an allowed one


def is_rocev2(proto: str, port: int) -> bool:
    """Whether (proto, destination port) is RoCEv2: allowed one way, it passes both ways."""
    return proto == ROCE_V2_PROTO and port == ROCE_V2_PORT


def includes_rocev2(proto: str, ports: Iterable[int]) -> bool:
    """Whether a list of explicit ports (a grant's) includes RoCEv2."""
    return proto == ROCE_V2_PROTO and ROCE_V2_PORT in ports
