"""The agent's Prometheus metrics, in a registry of its own (several agents may share one process in tests)."""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram


class AgentMetrics:
    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self.applied_version = Gauge("trustfabric_agent_applied_version", "rule set version the device runs",
                                     ["device"], registry=r)
        self.apply_seconds = Histogram("trustfabric_agent_apply_seconds", "render + atomic apply of a rule set",
                                       ["device"], registry=r,
                                       buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10))
        self.applies = Counter("trustfabric_agent_applies", "rule sets applied", ["device"], registry=r)
        self.refused = Counter("trustfabric_agent_refused_rulesets", "rule sets refused (bad, or failed to apply)",
                               ["device"], registry=r)
        self.drift_repairs = Counter("trustfabric_agent_drift_repairs", "drift found and repaired", ["device"],
                                     registry=r)
        self.rule_packets = Gauge("trustfabric_agent_rule_packets", "packets matched per installed rule",
                                  ["device", "rule"], registry=r)
        self.rule_bytes = Gauge("trustfabric_agent_rule_bytes", "bytes matched per installed rule",
                                ["device", "rule"], registry=r)
        self.server_errors = Counter("trustfabric_agent_server_unreachable", "failed exchanges with the server",
                                     ["device"], registry=r)
        self.svid_expiry = Gauge("trustfabric_agent_svid_expiry_seconds", "unix time an SVID expires",
                                 ["spiffe_id"], registry=r)
        self.workload_requests = Counter("trustfabric_agent_workload_api_requests",
                                         "Workload API calls by method and outcome", ["method", "outcome"],
                                         registry=r)

    def serve(self, addr: str) -> None:
        """Expose /metrics on `host:port` (a daemon thread) until `close`."""
        from prometheus_client import start_http_server

        host, _, port = addr.rpartition(":")
        self._http: Any = start_http_server(int(port), addr=host or "127.0.0.1", registry=self.registry)[0]

    def close(self) -> None:
        http = getattr(self, "_http", None)
        if http is not None:
            http.shutdown()
            http.server_close()
            self._http = None
