"""Several processes appending at once: sequence numbers stay contiguous, the chain and tree valid."""

from __future__ import annotations

import multiprocessing as mp

import pytest
from sqlmodel import select

from audit import Actor, merkle, record, service
from audit.models import AuditEvent, AuditNode
from store.db import Database

WORKERS = 4
PER_WORKER = 60


def _append(url: str, worker: int, barrier: mp.synchronize.Barrier) -> None:  # type: ignore[name-defined]
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
        rows = s.exec(select(AuditEvent).order_by(AuditEvent.seq)).all()
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
