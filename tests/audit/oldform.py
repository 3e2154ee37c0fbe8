"""Audit events as trustfabric wrote them before actors named their tenant (a database before schema step 15,
whose audit_events has no actor_tenant column, so record() cannot write to it): each appended whole -- its row,
the subtrees it completes, its per-key counters and the head -- through the frozen tables of the steps that made
them, never through today's models.

`append_document` appends given bytes (an event of an export the old code wrote: tests/audit/fixtures/);
`append_old` builds them first, the document the old record() built: `actor` is {id, kind}, never a tenant."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, MetaData, select, update

from audit import counters, merkle
from audit.migrations import _COUNTERS_V6, _TABLES_V1, _added_v6
from audit.models import HEAD_ID, node_key
from audit.wire import GENESIS_HASH, format_ts
from core.canonical import canonical_json

_EVENTS, _NODES = _TABLES_V1[0], _TABLES_V1[1]
_HEAD = _TABLES_V1[2].to_metadata(MetaData())  # as step 6 left it
for _column in _added_v6["audit_head"]:
    _HEAD.append_column(_column._copy())


def append_document(conn: Connection, data: bytes) -> str:
    """Append the event whose exact hashed bytes are `data` as the log's next one; its leaf hash (hex)."""
    doc = json.loads(data)
    head = conn.execute(select(_HEAD).where(_HEAD.c.id == HEAD_ID)).one()
    assert doc["seq"] == head.size, f"event {doc['seq']} is not the next one ({head.size})"
    assert doc["prev_hash"] == (head.last_leaf if head.size else GENESIS_HASH), "the event does not chain"
    leaf = merkle.hash_leaf(data)
    ts = datetime.fromisoformat(doc["ts"].replace("Z", "+00:00"))
    conn.execute(_EVENTS.insert().values(
        seq=doc["seq"], ts=ts, actor_id=doc["actor"]["id"], actor_kind=doc["actor"]["kind"], tenant=doc["tenant"],
        action=doc["action"], object_type=doc["object"]["type"], object_id=doc["object"]["id"],
        summary=doc["summary"], reason=doc["reason"], request_id=doc["request_id"], prev_hash=doc["prev_hash"],
        leaf_hash=leaf.hex(), data=data.decode()))
    tree = merkle.CompactRange(0, head.size, [bytes.fromhex(h) for h in head.frontier])
    nodes: list[tuple[int, bytes]] = []
    tree.append_leaf_hash(leaf, lambda level, index, node: nodes.append((node_key(level, index), node)))
    if nodes:
        conn.execute(_NODES.insert(), [{"key": k, "hash": h} for k, h in nodes])
    for dim, key in counters.keys_of(doc["tenant"], doc["action"]).items():
        if "counters" not in doc:
            break
        count = doc["counters"][dim] + 1
        if not conn.execute(update(_COUNTERS_V6).where(_COUNTERS_V6.c.key == key)
                            .values(count=count, last_leaf=leaf.hex())).rowcount:
            conn.execute(_COUNTERS_V6.insert().values(key=key, count=count, last_leaf=leaf.hex()))
    conn.execute(update(_HEAD).where(_HEAD.c.id == HEAD_ID).values(
        size=head.size + 1, last_leaf=leaf.hex(), frontier=[h.hex() for h in tree.hashes], last_ts=ts))
    return leaf.hex()


def append_old(conn: Connection, *, actor_id: str, actor_kind: str, action: str, object_type: str, object_id: str,
               at: datetime, tenant: str | None = None, summary: dict[str, Any] | None = None,
               reason: str | None = None, request_id: str | None = None) -> str:
    """Append an event in the form the old record() wrote (document version 2, counted); its leaf hash (hex)."""
    head = conn.execute(select(_HEAD).where(_HEAD.c.id == HEAD_ID)).one()
    keys = counters.keys_of(tenant, action)
    found = dict(conn.execute(select(_COUNTERS_V6.c.key, _COUNTERS_V6.c.count)
                              .where(_COUNTERS_V6.c.key.in_(list(keys.values())))).all())
    document = {
        "v": 2,
        "seq": head.size,
        "ts": format_ts(at),
        "actor": {"id": actor_id, "kind": actor_kind},
        "tenant": tenant,
        "action": action,
        "object": {"type": object_type, "id": object_id},
        "summary": summary or {},
        "reason": reason,
        "request_id": request_id,
        "prev_hash": head.last_leaf if head.size else GENESIS_HASH,
        "counters": {dim: int(found.get(key, 0)) for dim, key in keys.items()},
    }
    return append_document(conn, canonical_json(document))
