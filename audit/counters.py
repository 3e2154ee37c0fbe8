"""Per-key event counters: what makes a filtered export provably complete.

Every event (document version 2) carries, for each dimension an export can filter by, how many
earlier events share its value there -- `"counters": {"action": a, "tenant": t, "tenant_action": p}`
(no tenant ones for an event without a tenant). The numbers are assigned under the head lock, so each
key (`tenant:acme`, `action:svid.issue`, `tenant_action:acme/svid.issue`) numbers its events 0, 1, 2, ...
in log order without a hole. Each signed checkpoint commits to the head of every key (its count and
the leaf hash of its last event) as the RFC 6962 root of the heads sorted by key, so an export for
tenant T proves "these are T's events k..m and T had c events at this checkpoint": a hidden event
leaves a hole in the numbers or a count that does not match the signed head.

Events appended before this existed (version 1, positions below `counted_from`) carry no counters:
an export whose filter would need them is reported as unproven, never as proven.
"""

from __future__ import annotations

import base64
import binascii
import bisect
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from audit import merkle
from audit.errors import ProofError
from core.canonical import canonical_json

DIMENSIONS = ("action", "tenant", "tenant_action")


def keys_of(tenant: str | None, action: str) -> dict[str, str]:
    """dimension -> key of every counter an event with this tenant and action advances."""
    keys = {"action": f"action:{action}"}
    if tenant is not None:
        keys["tenant"] = f"tenant:{tenant}"
        keys["tenant_action"] = f"tenant_action:{tenant}/{action}"
    return keys


def filter_dimension(tenant: str | None, action: str | None) -> tuple[str, str] | None:
    """(dimension, key) whose counter proves an export narrowed to this tenant and/or action."""
    if tenant is not None and action is not None:
        return "tenant_action", f"tenant_action:{tenant}/{action}"
    if tenant is not None:
        return "tenant", f"tenant:{tenant}"
    if action is not None:
        return "action", f"action:{action}"
    return None


@dataclass(frozen=True)
class Head:
    key: str
    count: int
    last: str  # hex leaf hash of the key's last event


def _leaf(head: Head) -> bytes:
    return merkle.hash_leaf(canonical_json([head.key, head.count, head.last]))


def heads_root(heads: Sequence[Head]) -> bytes:
    """The RFC 6962 root over the heads sorted by key (what a checkpoint signs)."""
    tree = merkle.CompactRange()
    for head in sorted(heads, key=lambda h: h.key):
        tree.append_leaf_hash(_leaf(head))
    return tree.root()


def prove(heads: Sequence[Head], key: str) -> dict[str, Any]:
    """What an export header carries for `key`: its head with an inclusion proof, or -- for a key with
    no events -- its neighbours in key order with theirs (at most two entries)."""
    ordered = sorted(heads, key=lambda h: h.key)
    leaves = [_leaf(h) for h in ordered]
    keys = [h.key for h in ordered]
    at = bisect.bisect_left(keys, key)
    present = at < len(keys) and keys[at] == key
    chosen = [at] if present else [i for i in (at - 1, at) if 0 <= i < len(keys)]  # the key, or its neighbours
    entries = [
        {
            "index": i,
            "key": ordered[i].key,
            "count": ordered[i].count,
            "last": ordered[i].last,
            "proof": [base64.b64encode(h).decode() for h in merkle.inclusion_proof_from_leaves(leaves, i, len(leaves))],
        }
        for i in chosen
    ]
    return {"key": key, "entries": entries}


def verify_proof(proof: Any, key: str, size: int, root: bytes) -> Head:
    """The signed head of `key` (count 0 for a key with no events) from a header's proof, checked against
    the checkpoint's heads (size, root); ProofError if the proof is malformed or does not lead there."""
    if not isinstance(proof, dict) or proof.get("key") != key or not isinstance(proof.get("entries"), list):
        raise ProofError(f"the header's counter proof is not for {key!r}")
    found: list[tuple[int, Head]] = []
    for entry in proof["entries"]:
        try:
            index, head = int(entry["index"]), Head(str(entry["key"]), int(entry["count"]), str(entry["last"]))
            hashes = [base64.b64decode(h, validate=True) for h in entry["proof"]]
        except (KeyError, TypeError, ValueError, binascii.Error) as exc:
            raise ProofError(f"a counter proof entry is malformed: {exc}") from exc
        merkle.verify_inclusion(index, size, _leaf(head), hashes, root)
        found.append((index, head))
    if len(found) == 1 and found[0][1].key == key:
        return found[0][1]
    # Absence: the neighbours in key order must be adjacent (or the first / last entry) around the key.
    if len(found) > 2 or [i for i, _ in found] != sorted(i for i, _ in found):
        raise ProofError("the counter proof's entries are not neighbours")
    left = [h for i, h in found if h.key < key]
    right = [h for i, h in found if h.key > key]
    indexes = [i for i, _ in found]
    adjacent = len(found) == 2 and indexes[1] == indexes[0] + 1 and len(left) == len(right) == 1
    first = len(found) == 1 and right and indexes == [0]
    last = len(found) == 1 and left and indexes == [size - 1]
    if not (adjacent or first or last or (not found and size == 0)):
        raise ProofError(f"the counter proof does not show that {key!r} has no events")
    return Head(key, 0, "")
