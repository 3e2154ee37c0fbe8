"""Several processes appending at once: sequence numbers stay contiguous, the chain and tree valid."""

from __future__ import annotations

import json
import multiprocessing as mp
import threading
import time
from typing import Any

import pytest
from sqlalchemy import text
from sqlmodel import col, select

from audit import Actor, counters, merkle, record, service
from audit.models import AuditEvent, AuditNode
from store.db import Database

WORKERS = 4
PER_WORKER = 60


def _append(url: str, worker: int, barrier: mp.synchronize.Barrier) -> None:
    db = Database(url)
    barrier.wait()
    i = 0
    while i < PER_WORKER:
        with db.session() as s:
            for _ in range(1 + (i % 3)):  # transactions of 1..3 events
                if i >= PER_WORKER:
                    break
                record(
                    s,
                    actor=Actor(f"w{worker}", "system"),
                    action="ruleset.apply",
                    object_type="ruleset",
                    object_id=f"{worker}-{i}",
                    summary={"worker": worker, "i": i},
                )
                i += 1
    db.dispose()


def _check_log(db: Database) -> None:
    with db.read_session() as s:
        rows = s.exec(select(AuditEvent).order_by(col(AuditEvent.seq))).all()
        assert [r.seq for r in rows] == list(range(WORKERS * PER_WORKER))
        prev = service.GENESIS_HASH
        for r in rows:
            assert r.prev_hash == prev, f"chain broken at {r.seq}"
            assert merkle.hash_leaf(r.data.encode()).hex() == r.leaf_hash
            prev = r.leaf_hash
        leaves = [bytes.fromhex(r.leaf_hash) for r in rows]
        n = len(leaves)
        size, root = service.head_root(s)
        assert size == n and root == merkle.root_from_leaf_hashes(leaves)
        assert len(s.exec(select(AuditNode.key)).all()) == n - bin(n).count("1")
        for m in (1, 7, 100, n - 1):
            assert service.root_at(s, m) == merkle.root_from_leaf_hashes(leaves[:m])
            merkle.verify_consistency(m, n, service.root_at(s, m), root, service.consistency_proof(s, m, n))
        for i in (0, 77, n - 1):
            merkle.verify_inclusion(i, n, leaves[i], service.inclusion_proof(s, i, n), root)
    per_worker = sorted(r.object_id for r in rows)
    assert len(set(per_worker)) == n
    _check_counters([json.loads(r.data) for r in rows])


def _check_counters(documents: list[dict[str, Any]]) -> None:
    """Each counter numbers its events 0, 1, 2, ... in log order (a counter read stale under the head lock, as
    when a writer committed while another waited for the lock, would repeat a number)."""
    seen: dict[str, int] = {}
    for doc in documents:
        for dim, key in counters.keys_of(doc["tenant"], doc["action"]).items():
            assert doc["counters"][dim] == seen.get(key, 0), f"event {doc['seq']}: {key} out of sequence"
            seen[key] = seen.get(key, 0) + 1


def _run(url: str) -> None:
    ctx = mp.get_context("fork")
    barrier = ctx.Barrier(WORKERS)
    procs = [ctx.Process(target=_append, args=(url, w, barrier)) for w in range(WORKERS)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=120)
    assert [p.exitcode for p in procs] == [0] * WORKERS


@pytest.mark.postgres
def test_concurrent_processes_on_postgresql(postgres_db: Database) -> None:
    postgres_db.dispose()
    _run(postgres_db.url)
    _check_log(postgres_db)


def test_concurrent_processes_on_sqlite(sqlite_db: Database) -> None:
    sqlite_db.dispose()
    _run(sqlite_db.url)
    _check_log(sqlite_db)


@pytest.mark.postgres
@pytest.mark.parametrize("checks", [False, True], ids=["append", "grant check then append"])
def test_an_append_that_waited_for_the_head_lock_reads_the_counters_again(postgres_db: Database,
                                                                          checks: bool) -> None:
    """The first append of a transaction locks the head and reads its counters: when another writer commits while
    it waits for the lock, a statement's snapshot (taken before the wait) shows stale counters, so they are read
    with the lock held (audit/service.py _locked_head: tf_lock_audit_head, whose second statement takes a
    snapshot of its own); so is a grant write's scan of the events since its decision (lock_head_and_check),
    which must find A's. Forced here: A holds the lock, B is seen waiting for it in pg_stat_activity, A commits,
    B goes on; B's lock and reads were one round trip (a statement read them again after the wait before)."""
    from audit.service import lock_head_and_check
    from tests.roundtrips import watch

    db = postgres_db
    found: list[str | None] = []
    actor = Actor("t", "system")

    def append(s: Any, oid: str) -> None:
        record(s, actor=actor, action="tenant.update", object_type="tenant", object_id=oid, tenant="acme")

    with db.session() as s:
        append(s, "first")
    errors: list[BaseException] = []
    a_holds = db.session()
    sa = a_holds.__enter__()
    append(sa, "a")  # A holds the head lock
    pid = sa.connection().exec_driver_sql("SELECT pg_backend_pid()").scalar_one()

    def b() -> None:
        try:
            with db.session() as sb:
                if checks:  # decided when the log held "first" alone
                    found.append(lock_head_and_check(sb, 1, ("grant.",), [("acme", "grant.request")])[1])
                append(sb, "b")
        except BaseException as exc:
            errors.append(exc)

    poller = Database(db.url)  # its statements are not B's
    sent_by_b = watch(db.engine)  # B's connection is traced from its checkout (A's was checked out before)
    sent = sent_by_b.__enter__()
    t = threading.Thread(target=b)
    t.start()
    try:
        deadline = time.monotonic() + 30
        with poller.engine.connect() as watch_conn:
            while True:
                waiting = watch_conn.execute(text(
                    "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND "
                    ":pid = ANY(pg_blocking_pids(pid))"), {"pid": pid}).scalar_one()
                if waiting or time.monotonic() > deadline:
                    break
                watch_conn.rollback()
                time.sleep(0.01)  # polling a condition, bounded by the deadline
        assert waiting, "B never waited for A's head lock"
    finally:
        a_holds.__exit__(None, None, None)  # A commits
        t.join(timeout=30)
        sent_by_b.__exit__(None, None, None)
        poller.dispose()
    assert not t.is_alive() and not errors, errors
    heads = [q for q in sent.rounds[-1] if "audit_head" in q]
    assert len(heads) == 1, heads  # the lock, the counters and the scan: one call, though B waited
    assert found == (["tenant.update"] if checks else [])  # A's event, committed while B waited
    with db.read_session() as s:
        rows = s.exec(select(AuditEvent).order_by(col(AuditEvent.seq))).all()
    docs = [json.loads(r.data) for r in rows]
    assert [d["object"]["id"] for d in docs] == ["first", "a", "b"]
    assert [d["counters"]["tenant"] for d in docs] == [0, 1, 2]
    _check_counters(docs)


@pytest.mark.parametrize(("keeping", "found"), [
    (("tenant_x.",), "tenantax.update"),  # `_` is a character of the prefix, not LIKE's any one
    (("tenant%.",), "tenantax.update"),  # nor is `%`
    (("tenantax%",), "tenantax.update"),  # an entry not ending in '.' is one action
    (("tenantax.",), None),
    (("svid.issue", "tenantax.update"), None),
    (("tenant.", "svid.issue"), "tenantax.update"),
])
def test_a_writers_scan_under_the_head_lock_takes_its_actions_literally(db: Database, keeping: tuple[str, ...],
                                                                        found: str | None) -> None:
    """lock_head_and_check's scan (on PostgreSQL inside tf_lock_audit_head, with prefixes as LIKE patterns):
    an entry ending in '.' covers the actions it prefixes, character for character; any other entry one action."""
    from audit.service import lock_head_and_check

    with db.session() as s:
        record(s, actor=Actor("t", "system"), action="tenantax.update", object_type="tenant", object_id="a",
               tenant="acme")
    with db.session() as s:
        assert lock_head_and_check(s, 0, keeping)[1] == found
