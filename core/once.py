"""Slow answers computed off the request path: at most one job per key at a time, on one thread of its own.

The console asks the API to answer at once (`Prefer: respond-async`) for results that take seconds at
scale after a change (a policy version's impact report, the flow set under the active version); the
route then starts the computation here and answers 202 while it runs. The result itself goes where the
job puts it (the caller's exact cache); this only runs jobs and hands a failed job's error to the next
caller once, so a refusal (a candidate over its CPU budget, a malformed answer) reaches the person who
asked instead of being retried silently forever.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable
from concurrent.futures import Future, ThreadPoolExecutor


class OncePerKey:
    """Background jobs keyed by what they compute, run one after another on one thread (the cores serve
    requests first), made on the first job and ended by close()."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._lock = threading.Lock()
        self._pool: ThreadPoolExecutor | None = None
        self._jobs: dict[Hashable, Future[object]] = {}

    def start(self, key: Hashable, job: Callable[[], object]) -> None:
        """Run `job` unless one for `key` is queued or running; re-raises (once) the error of the last job
        for `key` when it failed, starting nothing, so the caller answers with it."""
        with self._lock:
            previous = self._jobs.get(key)
            if previous is not None and not previous.done():
                return
            self._jobs.pop(key, None)
            error = previous.exception() if previous is not None else None
            if error is None:
                if self._pool is None:
                    self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix=self._name)
                self._jobs[key] = self._pool.submit(job)
                for done in [k for k, f in self._jobs.items() if f.done() and f.exception() is None]:
                    del self._jobs[done]  # finished well: nothing left to hand over
        if error is not None:
            raise error

    def running(self, key: Hashable) -> bool:
        """Whether a job for `key` is queued or running."""
        with self._lock:
            job = self._jobs.get(key)
            return job is not None and not job.done()

    def wait(self, timeout: float) -> bool:
        """Whether every job started so far finished within `timeout` seconds (tests, the benchmark)."""
        with self._lock:
            jobs = list(self._jobs.values())
        for job in jobs:
            try:
                job.exception(timeout=timeout)
            except TimeoutError:
                return False
        return True

    def close(self) -> None:
        """The thread ends: queued jobs are dropped, a running one finishes on its own (each is bounded: the
        policy sandbox's limits). A later start() makes a new thread (an app started again)."""
        with self._lock:
            pool, self._pool = self._pool, None
            self._jobs = {k: f for k, f in self._jobs.items() if not f.cancel()}
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)
