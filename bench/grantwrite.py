"""The grant write below the route, in-process: policy.grants.commit_request through the GroupCommitter on a
durable PostgreSQL of its own (fsync on), with the change feed running as on a replica; no HTTP, no decision (the
grants are decided once, up front, as the route's prepare_request would; every write is a distinct grant with its
decision record and audit event).

Figures (CPU time, which the other load of the machine changes far less than wall time):
- CPU per grant write of this process and of PostgreSQL's processes, one writer after another (each write alone
  in its transaction: the lone write's path), 8 writer threads (what a replica's thread pool sends: batches), and
  8 writer threads over 3 committers on 3 Database objects (3 replicas' write paths, in one process: smaller
  batches, each waiting for the others' commits on the audit head's lock; what a replica costs more than one);
- per step of a lone write, the thread's CPU time in us (inclusive; nested steps indented): where the write's
  Python time goes, step by step.
The baseline of each CPU figure is five statements of the same shapes sent by psycopg alone on one connection
(BEGIN, an INSERT, a locked one-row read, an UPDATE, COMMIT): the floor the Python around them sits on.
Medians of RUNS runs; the load average beside them.
"""

from __future__ import annotations

import functools
import os
import statistics
import sys
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from audit import Actor
from bench.replicas import cpu_seconds, with_postgres
from policy import grants as svc
from policy.decide import GrantDecision as LoggedDecision
from policy.decisionlog import DecisionLog
from store.db import Database
from store.groupcommit import GroupCommitter
from workflows.schema import migrate

RUNS = int(os.environ.get("BENCH_RUNS", "3"))
N = int(os.environ.get("BENCH_GRANT_WRITES", "400"))  # per run and mode
THREADS = 8
REPLICAS = 3  # the committers of the cross-replica figure, one per Database as each replica has its own
CALLER = svc.Caller(id="token:bench", role="tenant-admin", tenant="acme",
                    actor=Actor(id="token:bench", kind="tenant", tenant="acme"))
REQUEST = svc.GrantRequest(src_tenant="acme", src_group="web", dst_tenant="globex", dst_group="api", proto="tcp",
                           ports=[443], ttl_seconds=3600, justification="bench")


def prepared(db: Database, marker: int, n: int) -> list[tuple[svc.PreparedGrant, Any]]:
    """n distinct decided grants (pending on a named approver, as the bench's requests are) and their decision
    records, as prepare_request and the route build them."""
    log = DecisionLog(db)
    decision = svc.GrantDecision("pending", ["tenant-admin:globex"], ["globex/api needs its tenant's approval"],
                                 "sha256:bench")
    out = []
    for _ in range(n):
        now = datetime.now(UTC)
        grant = svc.Grant(id=svc.new_grant_id(now), src_tenant="acme", src_group="web", dst_tenant="globex",
                          dst_group="api", proto="tcp", ports=[443], justification="bench", ttl_seconds=3600,
                          state="pending", requested_by=CALLER.id, requester_tenant=CALLER.requester_tenant,
                          idempotency_key=None, required_approvers=["tenant-admin:globex"], approvals=[],
                          reasons=list(decision.reasons), created_at=now, pending_until=now + timedelta(days=3))
        row = log.row("grant", REQUEST.policy_input("acme"),
                      LoggedDecision("pending", ["tenant-admin:globex"], list(decision.reasons)), "sha256:bench",
                      owner="acme")
        out.append((svc.PreparedGrant(REQUEST, grant, decision, marker), row))
    return out


def _marker(db: Database) -> int:
    from audit.service import tree_size

    with db.read_session() as s:
        return tree_size(s)


def write_all(db: Database, committer: GroupCommitter, items: list[tuple[svc.PreparedGrant, Any]],
              threads: int) -> None:
    def one(item: tuple[svc.PreparedGrant, Any]) -> None:
        p, row = item
        committer.submit(lambda s: svc.commit_request(s, p, caller=CALLER, request_id="req-bench", decision_record=row))

    if threads == 1:
        for item in items:
            one(item)
        return
    chunks = [items[i::threads] for i in range(threads)]
    workers = [threading.Thread(target=lambda c=c: [one(i) for i in c]) for c in chunks]
    for w in workers:
        w.start()
    for w in workers:
        w.join(timeout=300)


def raw_floor(url: str, n: int, postmaster: int) -> tuple[float, float]:
    """CPU seconds per write of this process and of PostgreSQL when psycopg alone sends statements of the shapes of
    a lone grant write's (measured before the connection closes: a backend's CPU goes with its process)."""
    import psycopg

    with psycopg.connect(url) as conn:
        t0, d0 = time.process_time(), cpu_seconds([postmaster])
        for i in range(n):
            with conn.cursor() as cur:
                cur.execute("INSERT INTO bench_raw (id, body) VALUES (%s, %s::json)", (f"r{i}-{time.time_ns()}", "{}"))
                cur.execute("SELECT size, last_leaf, frontier, last_ts FROM audit_head WHERE id = 1 FOR UPDATE")
                cur.fetchall()
                cur.execute("UPDATE bench_raw_head SET n = n + 1 WHERE id = 1")
            conn.commit()
        return (time.process_time() - t0) / n, (cpu_seconds([postmaster]) - d0) / n


class Steps:
    """Inclusive thread CPU time per wrapped function (one thread at a time: the lone write's path)."""

    def __init__(self) -> None:
        self.ns: dict[str, int] = {}
        self.calls: dict[str, int] = {}
        self._undo: list[Callable[[], None]] = []

    def wrap(self, owner: Any, name: str, label: str) -> None:
        original = getattr(owner, name)

        @functools.wraps(original)
        def timed(*args: Any, **kwargs: Any) -> Any:
            t0 = time.thread_time_ns()
            try:
                return original(*args, **kwargs)
            finally:
                self.ns[label] = self.ns.get(label, 0) + time.thread_time_ns() - t0
                self.calls[label] = self.calls.get(label, 0) + 1

        setattr(owner, name, timed)
        self._undo.append(lambda: setattr(owner, name, original))

    def undo(self) -> None:
        for fn in reversed(self._undo):
            fn()
        self._undo.clear()


def step_profile(db: Database, committer: GroupCommitter, n: int) -> list[tuple[str, float]]:
    from sqlalchemy.orm import Session as OrmSession

    import audit.service as audit_service
    import policy.grants as grants_module
    import store.deferred as deferred_module

    plan = [
        (GroupCommitter, "submit", "submit (the whole write)"),
        (GroupCommitter, "_commit", "  GroupCommitter._commit"),
        (OrmSession, "connection", "    Session.connection (first: pool checkout + BEGIN)"),
        (grants_module, "commit_request", "    commit_request"),
        (grants_module, "_insert", "      _insert (grant + decision INSERT)"),
        (grants_module, "record", "      audit record (validate, canonical summary, queue)"),
        (OrmSession, "flush", "    Session.flush"),
        (deferred_module, "finish", "    deferred.finish"),
        (grants_module, "_still_holds", "      _still_holds (head lock + check)"),
        (audit_service, "_append", "      audit _append"),
        (audit_service, "plain_canonical_json", "        canonical JSON of the event"),
        (audit_service.merkle, "hash_leaf", "        leaf hash"),
        (audit_service, "_write_rows", "        _write_rows (append statement)"),
        (OrmSession, "commit", "    Session.commit (COMMIT)"),
        (OrmSession, "close", "    Session.close"),
    ]
    runs: list[dict[str, int]] = []
    for _run in range(RUNS):  # medians per step: one run's figures move with the machine's other load
        steps = Steps()
        for owner, name, label in plan:
            steps.wrap(owner, name, label)
        try:
            items = prepared(db, _marker(db), n)
            write_all(db, committer, items, 1)
        finally:
            steps.undo()
        runs.append(steps.ns)
    return [(label, statistics.median(r.get(label, 0) for r in runs) / 1000 / n) for _o, _n, label in plan]


def committers_round(dbs: list[Database], committers: list[GroupCommitter], postmaster: int
                     ) -> tuple[float, float, float]:
    """N grants by THREADS writer threads spread over `committers` (one per database: several replicas' write paths
    in one process): (CPU us per grant of this process, of PostgreSQL, mean batch)."""
    items = prepared(dbs[0], _marker(dbs[0]), N)
    b0, i0 = sum(c.batches for c in committers), sum(c.items for c in committers)
    c0, d0 = time.process_time(), cpu_seconds([postmaster])
    chunks = [items[i::THREADS] for i in range(THREADS)]

    def writer(n: int) -> None:
        committer = committers[n % len(committers)]
        for p, row in chunks[n]:
            committer.submit(lambda s, p=p, row=row: svc.commit_request(s, p, caller=CALLER, request_id="req-bench",
                                                                        decision_record=row))

    workers = [threading.Thread(target=writer, args=(n,)) for n in range(THREADS)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(timeout=300)
    c1, d1 = time.process_time(), cpu_seconds([postmaster])
    batches = max(1, sum(c.batches for c in committers) - b0)
    return (c1 - c0) * 1e6 / N, (d1 - d0) * 1e6 / N, (sum(c.items for c in committers) - i0) / batches


def run(_work: Path, url: str, postmaster: int) -> list[str]:
    import psycopg

    dbs = [Database(url) for _ in range(REPLICAS)]
    try:
        migrate(dbs[0].engine)
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("CREATE TABLE bench_raw (id text PRIMARY KEY, body json)")
            conn.execute("CREATE TABLE bench_raw_head (id int PRIMARY KEY, n bigint)")
            conn.execute("INSERT INTO bench_raw_head VALUES (1, 0)")
        for db in dbs:
            db.change_version()  # the change feed's thread, as every replica runs it (its CPU counts, as there)
        committers = [GroupCommitter(db) for db in dbs]
        db, committer = dbs[0], committers[0]
        for some in (committers[:1], committers):  # warm: pools, prepared statements, mappers
            committers_round(dbs, some, postmaster)
        figures: dict[str, list[float]] = {}
        for _run in range(RUNS):
            for threads in (1, THREADS):
                items = prepared(db, _marker(db), N)
                b0, i0 = committer.batches, committer.items
                c0, d0 = time.process_time(), cpu_seconds([postmaster])
                write_all(db, committer, items, threads)
                c1, d1 = time.process_time(), cpu_seconds([postmaster])
                figures.setdefault(f"cpu{threads}", []).append((c1 - c0) * 1e6 / N)
                figures.setdefault(f"db{threads}", []).append((d1 - d0) * 1e6 / N)
                batches = max(1, committer.batches - b0)
                figures.setdefault(f"batch{threads}", []).append((committer.items - i0) / batches)
            cpu, dbcpu, batch = committers_round(dbs, committers, postmaster)
            for key, value in (("cpuR", cpu), ("dbR", dbcpu), ("batchR", batch)):
                figures.setdefault(key, []).append(value)
            raw, rawdb = raw_floor(url, N, postmaster)
            figures.setdefault("raw", []).append(raw * 1e6)
            figures.setdefault("rawdb", []).append(rawdb * 1e6)
        profile = step_profile(db, committer, N)
        for c in committers:
            c.close()
    finally:
        for db in dbs:
            db.dispose()
    m = {k: statistics.median(v) for k, v in figures.items()}
    load = os.getloadavg()
    lines = [f"# scale: {N} grant writes per run and mode, median of {RUNS} runs, PostgreSQL own cluster fsync on, "
             f"{os.cpu_count()} cores shared; load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}"]
    for tag, key, what in (("lone", "1", "one writer"), (f"{THREADS}_threads", str(THREADS), "one committer"),
                           (f"{THREADS}_threads_{REPLICAS}_committers", "R", f"{REPLICAS} replicas' committers")):
        lines.append(f"grant_write_cpu_{tag}: {m[f'cpu{key}']:.0f} us per grant (baseline psycopg alone "
                     f"{m['raw']:.0f} us, ratio {m[f'cpu{key}'] / m['raw']:.2f}); {what}, mean batch "
                     f"{m[f'batch{key}']:.1f}")
        lines.append(f"grant_write_db_cpu_{tag}: {m[f'db{key}']:.0f} us per grant (baseline psycopg alone "
                     f"{m['rawdb']:.0f} us, ratio {m[f'db{key}'] / m['rawdb']:.2f})")
    lines.append("# per step of a lone write, thread CPU us per grant (inclusive; nested steps indented):")
    lines += [f"#   {us:7.1f}  {label}" for label, us in profile]
    return lines


def main() -> int:
    return with_postgres("grantwrite", run)


if __name__ == "__main__":
    sys.exit(main())
