"""Prometheus metrics (`prometheus-client`): what happens in this process (requests, decisions, policy
evaluation time, SVIDs issued, background jobs) and what the database holds at scrape time (grants by
state, valid SVIDs and their expiry horizon, audit tree size and checkpoint age).

Several uvicorn workers: `trustfabric serve --workers N` gives every worker one PROMETHEUS_MULTIPROC_DIR
(prometheus-client's multiprocess mode): each process writes its counters and histograms to its own
memory-mapped files there, and a scrape, whichever worker answers it, sums every process's files. The
database-derived gauges are read at scrape time by the answering worker, so they need no such summing.
Served at GET /metrics (bearer: TRUSTFABRIC_METRICS_TOKEN, or a principal with role admin or security), or
without authentication on a separate listener (TRUSTFABRIC_METRICS_PORT, bound to 127.0.0.1 by default).
"""

from __future__ import annotations

import hmac
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from policy.engines import rvm

if TYPE_CHECKING:
    from prometheus_client.metrics_core import Metric

    from workflows.context import AppContext

# Every metric this process records; scraped directly, or through the multiprocess directory.
LOCAL = CollectorRegistry(auto_describe=True)
FAST = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)

REQUESTS = Counter("trustfabric_http_requests", "HTTP requests, by method, route template and status",
                   ["method", "route", "status"], registry=LOCAL)
LATENCY = Histogram("trustfabric_http_request_duration_seconds", "HTTP request latency, by method and route template",
                    ["method", "route"], registry=LOCAL)
DECISIONS = Counter("trustfabric_policy_decisions", "Policy decisions, by kind (authz, grant, flow) and outcome",
                    ["kind", "outcome"], registry=LOCAL)
EVALUATION = Histogram("trustfabric_policy_evaluation_seconds",
                       "Time the policy engine took to decide, by kind (authz cache misses only)", ["kind"],
                       buckets=FAST, registry=LOCAL)
SVIDS_ISSUED = Counter("trustfabric_svids_issued", "SVIDs issued, by kind (x509, jwt, node)", ["kind"],
                       registry=LOCAL)
SVID_TTL = Histogram("trustfabric_svid_ttl_seconds", "Lifetime of the SVIDs issued, by kind", ["kind"],
                     buckets=(60, 300, 900, 3600, 4 * 3600, 12 * 3600, 86400, 7 * 86400), registry=LOCAL)
JOB_RUNS = Counter("trustfabric_background_job_runs", "Background job runs, by job", ["job"], registry=LOCAL)
JOB_FAILURES = Counter("trustfabric_background_job_failures", "Background job runs that failed, by job", ["job"],
                       registry=LOCAL)
JOB_DURATION = Histogram("trustfabric_background_job_duration_seconds", "Background job run time, by job", ["job"],
                         buckets=FAST, registry=LOCAL)

REGO_VM = Counter("trustfabric_policy_vm_events",
                  "The compiled Rego VM: decisions it answered (vm_answers), decisions the interpreter answered "
                  "instead and why (vm_errors, undefined_values, not_compiled, stale_data), its data loads and "
                  "compiles", ["event"], registry=LOCAL)
rvm.observe(lambda event, n: REGO_VM.labels(event).inc(n))

STATE_METRICS = (
    "trustfabric_grants", "trustfabric_svids_valid", "trustfabric_svid_expiry_horizon_seconds",
    "trustfabric_svid_next_expiry_seconds", "trustfabric_audit_tree_size", "trustfabric_audit_checkpoint_size",
    "trustfabric_audit_checkpoint_age_seconds",
)


COUNTERS = (REQUESTS, DECISIONS, SVIDS_ISSUED, JOB_RUNS, JOB_FAILURES, REGO_VM)
HISTOGRAMS = (LATENCY, EVALUATION, SVID_TTL, JOB_DURATION)


def metric_families() -> set[str]:
    """The name of every metric /metrics exposes (the dashboard must chart each)."""
    return {*STATE_METRICS, *(m._name for m in (*COUNTERS, *HISTOGRAMS))}


def metric_names() -> set[str]:
    """Every series name /metrics can expose (a dashboard may query only these)."""
    names: set[str] = set(STATE_METRICS)
    for counter in COUNTERS:
        names |= {f"{counter._name}_total", f"{counter._name}_created"}
    for histogram in HISTOGRAMS:
        names |= {f"{histogram._name}_{s}" for s in ("bucket", "count", "sum", "created")}
    return names


@contextmanager
def timed(histogram: Histogram, *labels: str) -> Iterator[None]:
    start = time.perf_counter()
    try:
        yield
    finally:
        histogram.labels(*labels).observe(time.perf_counter() - start)


class StateCollector(Collector):
    """Gauges read from the database when scraped: they are the same whichever worker answers."""

    def __init__(self, ctx: AppContext) -> None:
        self.ctx = ctx

    def collect(self) -> Iterator[Metric]:
        from audit.checkpoint import latest_checkpoint
        from audit.service import tree_size
        from core.clock import as_utc
        from pki.service import svid_validity
        from policy.grants import count_by_state

        now = self.ctx.clock()
        with self.ctx.db.read_session() as session:
            grants = count_by_state(session)
            svids = svid_validity(session, now)
            size = tree_size(session)
            checkpoint = latest_checkpoint(session)
        g = GaugeMetricFamily("trustfabric_grants", "Grants, by state", labels=["state"])
        for state, n in sorted(grants.items()):
            g.add_metric([state], n)
        yield g
        valid = GaugeMetricFamily("trustfabric_svids_valid", "Unrevoked X.509-SVIDs not yet expired, by kind",
                                  labels=["kind"])
        horizon = GaugeMetricFamily("trustfabric_svid_expiry_horizon_seconds",
                                    "Seconds until the last valid X.509-SVID expires, by kind", labels=["kind"])
        nearest = GaugeMetricFamily("trustfabric_svid_next_expiry_seconds",
                                    "Seconds until the first valid X.509-SVID expires, by kind", labels=["kind"])
        for v in svids:
            valid.add_metric([v.kind], v.valid)
            if v.last_expiry is not None and v.first_expiry is not None:
                horizon.add_metric([v.kind], (v.last_expiry - now).total_seconds())
                nearest.add_metric([v.kind], (v.first_expiry - now).total_seconds())
        yield valid
        yield horizon
        yield nearest
        yield GaugeMetricFamily("trustfabric_audit_tree_size", "Events in the audit log (Merkle tree size)",
                                value=size)
        yield GaugeMetricFamily("trustfabric_audit_checkpoint_size", "Tree size of the latest signed checkpoint",
                                value=checkpoint.size if checkpoint else 0)
        age = (now - as_utc(checkpoint.created_at)).total_seconds() if checkpoint else float("nan")
        yield GaugeMetricFamily("trustfabric_audit_checkpoint_age_seconds",
                                "Seconds since the latest signed checkpoint", value=age)


def scrape_registry(ctx: AppContext) -> CollectorRegistry:
    """Every metric: this process's (or every worker's, in multiprocess mode) and the database's."""
    registry = CollectorRegistry(auto_describe=False)
    directory = ctx.settings.metrics_multiproc_dir
    if directory:
        registry.register(WorkerFiles(directory))
    else:
        registry.register(_Local())
    registry.register(StateCollector(ctx))
    return registry


def exposition(ctx: AppContext) -> bytes:
    """The Prometheus text exposition of `scrape_registry`."""
    return generate_latest(scrape_registry(ctx))


class WorkerFiles(Collector):
    """Every worker's metrics files (prometheus-client's multiprocess mode), summed, leaving out a file a worker is
    creating at this moment: MmapedDict creates its file before sizing it, and MultiProcessCollector, meeting it
    empty, fails the whole scrape (prometheus/client_python#1199: a worker's first request during a scrape made
    /metrics answer 500). Such a file holds nothing yet; once sized it reads as empty until written."""

    def __init__(self, directory: str) -> None:
        self._directory = directory

    def collect(self) -> Iterator[Metric]:
        from prometheus_client.multiprocess import MultiProcessCollector

        files = []
        for path in sorted(Path(self._directory).glob("*.db")):
            try:
                if path.stat().st_size >= _HEADER:
                    files.append(str(path))
            except FileNotFoundError:  # removed since the glob (a dead process's live gauge)
                continue
        return iter(MultiProcessCollector.merge(files, accumulate=True))  # type: ignore[no-untyped-call]


_HEADER = 8  # a metrics file's header: the bytes in use, and padding


class _Local(Collector):
    def collect(self) -> Iterator[Metric]:
        return iter(LOCAL.collect())


def metrics_token_ok(ctx: AppContext, authorization: str | None) -> bool:
    """True when the request carries the dedicated metrics bearer token (constant-time comparison)."""
    expected = ctx.settings.metrics_token
    if not expected or not authorization or not authorization.lower().startswith("bearer "):
        return False
    return hmac.compare_digest(authorization[7:].strip().encode(), expected.encode())


CONTENT_TYPE = CONTENT_TYPE_LATEST


def serve_separately(ctx: AppContext, host: str, port: int) -> Any:
    """An unauthenticated /metrics listener on host:port (prometheus-client's HTTP server), in a thread."""
    from prometheus_client import start_http_server

    return start_http_server(port, addr=host, registry=scrape_registry(ctx))
