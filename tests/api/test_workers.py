"""api/workers.py: a request's blocking work runs on at most a set number of kept threads, the most recently used
first; callers beyond that wait in order; context variables, results and errors reach the caller; a cancelled
caller leaves no thread taken; close ends the threads."""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import threading
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

import pytest

from api.app import _warming
from api.workers import WorkerThreads
from tests.api.conftest import Env

WAIT = 10.0  # every blocking wait in these tests is bounded
PREFIX = "tf-test-worker"
T = TypeVar("T")


def _run(main: Callable[[], Coroutine[Any, Any, T]]) -> T:
    """asyncio.run(main()) on a thread of its own, as a server's loop runs beside its workers (and the session's
    own thread may be inside a loop of another test's)."""
    out: list[tuple[bool, Any]] = []

    def target() -> None:
        try:
            out.append((True, asyncio.run(main())))
        except BaseException as exc:
            out.append((False, exc))

    thread = threading.Thread(target=target, name="tf-test-loop")
    thread.start()
    thread.join(3 * WAIT)
    assert out, "the loop did not finish"
    ok, value = out[0]
    if not ok:
        raise value
    return value  # type: ignore[no-any-return]


def _ours() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith(PREFIX)]


def test_at_most_size_threads_run_at_once() -> None:
    pool = WorkerThreads(2, name=PREFIX)
    release = threading.Event()
    lock = threading.Lock()
    running = [0, 0]  # now, most
    started: list[int] = []

    def call(n: int) -> int:
        with lock:
            started.append(n)
            running[0] += 1
            running[1] = max(running[1], running[0])
        assert release.wait(WAIT)
        with lock:
            running[0] -= 1
        return n * n

    async def main() -> list[int]:
        tasks = [asyncio.create_task(pool.run(call, n)) for n in range(6)]
        for _ in range(200):  # until the first two run (bounded)
            await asyncio.sleep(0.01)
            if len(started) == 2:
                break
        assert sorted(started) == [0, 1] and pool.started == 2
        release.set()
        return list(await asyncio.gather(*tasks))

    try:
        assert _run(main) == [n * n for n in range(6)]
        assert running[1] == 2 and pool.started == 2 and sorted(started) == list(range(6))
    finally:
        pool.close()


def test_waiting_callers_are_served_in_the_order_they_came() -> None:
    pool = WorkerThreads(1, name=PREFIX)
    release = threading.Event()
    order: list[int] = []

    def call(n: int) -> None:
        assert release.wait(WAIT)
        order.append(n)

    async def main() -> None:
        tasks = []
        for n in range(5):
            tasks.append(asyncio.create_task(pool.run(call, n)))
            for _ in range(1000):  # this caller in line before the next comes (the first on the thread)
                await asyncio.sleep(0.001)
                if pool.waiting == n:
                    break
            assert pool.waiting == n
        release.set()
        await asyncio.gather(*tasks)

    try:
        _run(main)
        assert order == [0, 1, 2, 3, 4]
    finally:
        pool.close()


def test_the_threads_are_kept_and_the_most_recently_used_serves_next() -> None:
    pool = WorkerThreads(4, name=PREFIX)
    barrier = threading.Barrier(4, timeout=WAIT)

    def together() -> int:
        barrier.wait()
        return threading.get_ident()

    async def main() -> tuple[set[int], list[int]]:
        burst = set(await asyncio.gather(*(pool.run(together) for _ in range(4))))
        alone = [await pool.run(threading.get_ident) for _ in range(10)]
        return burst, alone

    try:
        burst, alone = _run(main)
        assert len(burst) == 4 and pool.started == 4  # a burst of 4 took 4 threads
        assert len(set(alone)) == 1 and alone[0] in burst  # one warm thread serves the calls one at a time
        assert len(_ours()) == 4  # the others stay, for the next burst
    finally:
        pool.close()


def test_context_results_and_errors_reach_the_caller() -> None:
    pool = WorkerThreads(1, name=PREFIX)
    var: contextvars.ContextVar[str] = contextvars.ContextVar("var", default="unset")

    def fails() -> None:
        raise LookupError("not here")

    async def main() -> str:
        var.set("the request's")
        with pytest.raises(LookupError, match="not here"):
            await pool.run(fails)
        return await pool.run(var.get)

    try:
        assert _run(main) == "the request's"
    finally:
        pool.close()


def test_a_cancelled_caller_leaves_no_thread_taken() -> None:
    """One thread: a caller cancelled while it waits, and one cancelled while its call runs; the call finishes,
    and the thread serves the next caller."""
    pool = WorkerThreads(1, name=PREFIX)
    release = threading.Event()
    ran: list[str] = []

    def blocked(name: str) -> str:
        assert release.wait(WAIT)
        ran.append(name)
        return name

    async def main() -> str:
        running = asyncio.create_task(pool.run(blocked, "running"))
        waiting = asyncio.create_task(pool.run(blocked, "waiting"))
        await asyncio.sleep(0.05)
        waiting.cancel()
        running.cancel()
        for task in (waiting, running):
            with pytest.raises(asyncio.CancelledError):
                await task
        release.set()
        return await asyncio.wait_for(pool.run(blocked, "next"), WAIT)

    try:
        assert _run(main) == "next"
        assert ran == ["running", "next"] and pool.started == 1  # the cancelled waiter's call never ran
    finally:
        pool.close()


def test_a_caller_cancelled_as_a_thread_is_handed_to_it_passes_the_thread_on() -> None:
    """One thread, handed over to a waiting caller that is cancelled at about that moment (before or after the
    hand-over, as it falls): many times over, and the thread still serves the next caller each time."""
    pool = WorkerThreads(1, name=PREFIX)

    async def main() -> int:
        served = 0
        for spins in range(60):
            release = threading.Event()
            busy = asyncio.create_task(pool.run(release.wait, WAIT))
            waiter = asyncio.create_task(pool.run(threading.get_ident))
            for _ in range(1000):
                await asyncio.sleep(0.001)
                if pool.waiting == 1:
                    break
            release.set()
            while pool.waiting:  # the thread took the waiter off the line: the hand-over is under way
                await asyncio.sleep(0)
            for _ in range(spins % 4):
                await asyncio.sleep(0)
            waiter.cancel()
            await busy
            with contextlib.suppress(asyncio.CancelledError):
                await waiter
            await asyncio.wait_for(pool.run(threading.get_ident), WAIT)
            served += 1
        return served

    try:
        assert _run(main) == 60 and pool.started == 1
    finally:
        pool.close()


def test_close_ends_the_threads_and_a_later_run_starts_new_ones() -> None:
    pool = WorkerThreads(3, name=PREFIX)
    def name() -> str:
        return threading.current_thread().name

    async def one() -> str:
        return await pool.run(name)

    first = _run(one)
    assert len(_ours()) == 1
    pool.close()
    assert _ours() == [] and pool.started == 0
    try:
        second = _run(one)
        assert second != first and pool.started == 1  # a new thread (names count up)
    finally:
        pool.close()
    with pytest.raises(ValueError, match="at least 1"):
        WorkerThreads(0)


def test_the_app_hands_requests_to_its_kept_threads(env: Env) -> None:
    """A renewal's, a grant request's and a read's token checks all run on the app's kept threads, never more of
    them than the setting allows."""
    names: list[str] = []
    authenticators = env.app.state.authenticators

    def recording(inner: Callable[[Any, Any], Any]) -> Callable[[Any, Any], Any]:
        def check(ctx: Any, req: Any) -> Any:
            names.append(threading.current_thread().name)
            return inner(ctx, req)
        return check

    env.app.state.authenticators = [recording(a) for a in authenticators]
    try:
        for _ in range(3):
            assert env.call("GET", "/v1/tenants", "admin").status_code == 200
            assert env.call("GET", "/v1/whoami", "tenant-admin", "acme").status_code == 200
            _grant(env)
    finally:
        env.app.state.authenticators = authenticators
    workers = env.app.state.workers
    assert names and all(n.startswith("trustfabric-worker-") for n in names), names
    assert 1 <= workers.started <= env.ctx.settings.worker_threads == workers.size


def test_start_all_prepares_every_thread_before_its_first_call() -> None:
    """Each thread runs `prepare` once, before any call it serves; one whose prepare fails serves all the same."""
    pool = WorkerThreads(3, name=PREFIX)
    prepared: list[str] = []
    lock = threading.Lock()

    def prepare() -> None:
        with lock:
            prepared.append(threading.current_thread().name)
            if len(prepared) == 2:
                raise RuntimeError("no database yet")

    barrier = threading.Barrier(3, timeout=WAIT)

    def call() -> tuple[str, list[str]]:
        barrier.wait()  # three calls at once: one on each thread
        with lock:
            return threading.current_thread().name, list(prepared)

    async def main() -> list[tuple[str, list[str]]]:
        return list(await asyncio.gather(*(pool.run(call) for _ in range(3))))

    try:
        pool.start_all(prepare)
        assert pool.started == 3
        results = _run(main)
        assert {name for name, _ in results} == set(prepared) and len(prepared) == 3
        assert all(name in seen for name, seen in results)  # its own prepare ran before its call
    finally:
        pool.close()


def _grant(env: Env) -> None:
    r = env.call("POST", "/v1/grants", "tenant-admin", "acme",
                 json={"src_group": "web", "dst_tenant": "globex", "dst_group": "api", "proto": "tcp",
                       "ports": [443], "ttl_seconds": 3600, "justification": "t"})
    assert r.status_code == 201 and r.json()["state"] == "pending", r.text


def test_a_started_server_s_threads_decide_without_building_an_engine(env: Env) -> None:
    """A server warms its worker threads as it starts (api/app.py `_warming`): three decisions at once, one on each
    thread, then build no policy engine on a request's time. Without the warming each thread's first decision
    builds one (the control: the count this test watches does move)."""
    decider = env.app.state.grant_decider
    seen: list[dict[str, Any]] = []

    def recording(session: Any, now: Any, policy_input: dict[str, Any]) -> Any:
        seen.append(policy_input)
        return decider(session, now, policy_input)

    env.app.state.grant_decider = recording
    try:
        _grant(env)  # a real request's decision input, and the decider's engine made
    finally:
        env.app.state.grant_decider = decider
    engine = decider.engine
    assert engine is not None and len(seen) == 1

    def builds() -> int:
        """Interpreter engines built for a thread, plus data loads of a thread's compiled VM (policy/engines/rvm.py:
        with it, a thread's first grant decision loads the VM, and needs no interpreter engine)."""
        vm = getattr(engine, "accelerator", None)
        return int(engine.thread_builds) + (vm.stats()["data_loads"] if vm is not None else 0)

    def burst(threads: WorkerThreads) -> int:
        barrier = threading.Barrier(3, timeout=WAIT)

        def decide() -> str:
            barrier.wait()  # the three decisions at once: one on each thread
            with env.ctx.db.read_session() as session:
                return str(decider(session, env.ctx.clock(), seen[0]).outcome)

        async def main() -> tuple[int, list[str]]:
            await asyncio.gather(*(threads.run(barrier.wait) for _ in range(3)))  # each thread up (and prepared)
            before = builds()
            return before, list(await asyncio.gather(*(threads.run(decide) for _ in range(3))))

        try:
            before, outcomes = _run(main)
        finally:
            threads.close()
        assert outcomes == ["pending"] * 3
        return builds() - before

    warmed = WorkerThreads(3, name=PREFIX)
    warmed.start_all(_warming(env.ctx, env.app))
    assert burst(warmed) == 0
    assert burst(WorkerThreads(3, name=PREFIX)) == 3
