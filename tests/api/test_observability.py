"""What an SRE gets from the API: structured access logs (JSON lines, logfmt on a terminal) that never hold a
secret, /metrics in Prometheus format (parsed here with prometheus-client's own parser), a Grafana dashboard
that queries exactly the metrics exposed, and OpenTelemetry spans sent to a real OTLP/HTTP receiver."""

from __future__ import annotations

import io
import json
import logging
import threading
from collections.abc import Iterator
from dataclasses import replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from api.metrics import STATE_METRICS, metric_families, metric_names
from core import logs
from tests.api.conftest import Env, admin_opaque, make_settings, open_env, seed
from tests.pki.helpers import make_csr

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def captured() -> Iterator[io.StringIO]:
    """Every log record of the process, as the server writes them (JSON lines); the logging setup restored."""
    root = logging.getLogger()
    saved = (list(root.handlers), root.level)
    buf = io.StringIO()
    logs.configure("json", "debug", stream=buf)
    try:
        yield buf
    finally:
        for h in list(root.handlers):
            root.removeHandler(h)
        for h in saved[0]:
            root.addHandler(h)
        root.setLevel(saved[1])
        logging.getLogger("uvicorn.access").disabled = False


def lines(buf: io.StringIO) -> list[dict[str, Any]]:
    return [json.loads(line) for line in buf.getvalue().splitlines() if line.strip()]


def test_access_log_lines_carry_request_id_principal_route_status_latency(env: Env, captured: io.StringIO) -> None:
    r = env.call("GET", "/v1/tenants/acme", "admin", headers={"X-Request-ID": "req-42"})
    assert r.status_code == 200 and r.headers["x-request-id"] == "req-42"
    env.client.get("/v1/tenants/globex")  # unauthenticated: 401, no principal
    env.client.get("/nope")
    access = [e for e in lines(captured) if e["logger"] == "trustfabric.access"]
    first = next(e for e in access if e["request_id"] == "req-42")
    assert first["route"] == "/v1/tenants/{tenant}" and first["status"] == 200 and first["method"] == "GET"
    assert first["principal"] and first["role"] == "admin" and first["tenant"] is None and first["latency_ms"] > 0
    assert first["ts"].endswith("Z") and first["level"] == "info"
    anonymous = next(e for e in access if e["status"] == 401)
    assert anonymous["principal"] is None and anonymous["route"] == "/v1/tenants/{tenant}"
    assert any(e["route"] == "<unmatched>" and e["status"] == 404 for e in access)
    assert all("/v1/tenants/acme" not in json.dumps(e) for e in access)  # the template, never the raw path


def test_an_access_log_line_tells_two_tenants_principals_of_one_id_apart(env: Env, captured: io.StringIO) -> None:
    """API token subjects are free text: acme's and globex's `alice` are both principal `alice`, and a line naming
    only the id and the role could be either's. It names the principal's tenant too."""
    for tenant in ("acme", "globex"):
        token = env.token("tenant-member", tenant, subject="alice")
        r = env.client.get("/v1/whoami", headers={"Authorization": f"Bearer {token}", "X-Request-ID": f"r-{tenant}"})
        assert r.status_code == 200
    access = {e["request_id"]: e for e in lines(captured) if e["logger"] == "trustfabric.access"}
    assert [(access[f"r-{t}"]["principal"], access[f"r-{t}"]["tenant"]) for t in ("acme", "globex")] == [
        ("alice", "acme"), ("alice", "globex")]


def test_logfmt_on_a_terminal() -> None:
    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    stream = Tty()
    handler = logs.configure("auto", "info", stream=stream)
    try:
        logging.getLogger("trustfabric.access").info("GET %s 200", "/x", extra={"route": "/x", "latency_ms": 1.5})
    finally:
        logging.getLogger().removeHandler(handler)
    line = stream.getvalue().strip()
    assert line.startswith("ts=") and 'msg="GET /x 200"' in line and "route=/x" in line and "latency_ms=1.5" in line


def test_secrets_never_reach_the_logs(env: Env, captured: io.StringIO) -> None:
    admin_jwt = env.token("admin")
    opaque = admin_opaque(env)
    pem_key = "-----BEGIN PRIVATE KEY-----\nMIGHAgEAMBMGByqGSM49AgEGCCqGSM49AwEHBG0wawIBAQQg\n-----END PRIVATE KEY-----"
    module = f"package leak\n\n# {pem_key.replace(chr(10), ' ')}\nx := 1\n"
    for token in (admin_jwt, opaque):
        assert env.client.get("/v1/whoami", headers={"Authorization": f"Bearer {token}"}).status_code == 200
    r = env.client.post("/v1/policy/versions", json={"modules": {"leak.rego": module}},
                        headers={"Authorization": f"Bearer {admin_jwt}"})
    assert r.status_code in (201, 403)
    security = env.headers("security")
    assert env.client.post("/v1/policy/versions", json={"modules": {"leak.rego": module}},
                           headers=security).status_code == 201
    x509 = env.call("POST", "/v1/svids/x509", "admin",
                    json={"csr": make_csr().decode(), "tenant": "acme", "group": "web", "workload": "web-1"})
    assert x509.status_code == 201
    env.client.get("/v1/whoami", headers={"Authorization": f"Bearer {admin_jwt}x"})  # refused
    # and a careless line anywhere in the process is scrubbed on the way out
    logging.getLogger("trustfabric.test").warning("got %s and Authorization: Bearer %s, key %s", opaque, admin_jwt,
                                                  pem_key)
    text = captured.getvalue()
    assert "trustfabric.access" in text and "[redacted]" in text
    for secret in (admin_jwt, opaque, opaque.split("_", 2)[-1], admin_jwt.split(".")[2], "MIGHAgEAMBMGByqGSM49",
                   security["Authorization"].split()[-1]):
        assert secret not in text


@pytest.fixture
def scrape(env: Env) -> Any:
    def get(headers: dict[str, str] | None = None) -> dict[str, Any]:
        r = env.client.get("/metrics", headers=headers or env.headers("admin"))
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain"), r.text
        return {f.name: f for f in text_string_to_metric_families(r.text)}
    return get


def _value(families: dict[str, Any], name: str, **labels: str) -> float:
    family = families[name]
    total = 0.0
    for sample in family.samples:
        if sample.name == name + ("_total" if family.type == "counter" else "") and all(
                sample.labels.get(k) == v for k, v in labels.items()):
            total += sample.value
    return total


def test_metrics_are_authenticated(env: Env) -> None:
    assert env.client.get("/metrics").status_code == 401
    assert env.call("GET", "/metrics", "tenant-admin", "acme").status_code == 403
    assert env.call("GET", "/metrics", "auditor").status_code == 403
    assert env.call("GET", "/metrics", "security").status_code == 200
    assert "/metrics" not in env.app.openapi()["paths"]


def test_a_dedicated_metrics_token(tmp_path: Path) -> None:
    e = open_env(make_settings(tmp_path / "home", metrics_token="scrape-secret-1"))
    try:
        assert e.client.get("/metrics", headers={"Authorization": "Bearer scrape-secret-1"}).status_code == 200
        assert e.client.get("/metrics", headers={"Authorization": "Bearer scrape-secret-2"}).status_code == 401
    finally:
        e.client.close()
        e.ctx.close()


def test_metrics_parse_and_count_what_happened(env: Env, scrape: Any) -> None:
    before = scrape()
    routes = "/v1/tenants/{tenant}"
    base = _value(before, "trustfabric_http_requests", route=routes, status="200")
    for _ in range(3):
        assert env.call("GET", "/v1/tenants/acme", "admin").status_code == 200
    acme = env.headers("tenant-admin", "acme")
    grant = env.client.post("/v1/grants", headers=acme, json={
        "src_group": "web", "dst_tenant": "globex", "dst_group": "api", "proto": "tcp", "ports": [443],
        "ttl_seconds": 3600})
    assert grant.status_code == 201 and grant.json()["state"] == "pending"
    assert env.call("GET", "/v1/policy/explain", "security",
                    params={"src": "acme/web", "dst": "globex/api", "port": 443}).status_code == 200
    jwt = env.call("POST", "/v1/svids/jwt", "admin", json={"tenant": "acme", "group": "web", "workload": "web-1",
                                                            "audience": ["x"]})
    x509 = env.call("POST", "/v1/svids/x509", "admin",
                    json={"csr": make_csr().decode(), "tenant": "acme", "group": "web", "workload": "web-1",
                          "ttl_seconds": 600})
    assert jwt.status_code == 201 and x509.status_code == 201
    after = scrape()

    assert _value(after, "trustfabric_http_requests", route=routes, status="200") - base == 3
    latency = after["trustfabric_http_request_duration_seconds"]
    assert any(s.name.endswith("_count") and s.labels["route"] == routes and s.value >= 3 for s in latency.samples)
    for kind, outcome in (("authz", "allow"), ("grant", "pending"), ("flow", "deny")):
        assert _value(after, "trustfabric_policy_decisions", kind=kind, outcome=outcome) > _value(
            before, "trustfabric_policy_decisions", kind=kind, outcome=outcome), (kind, outcome)
    # the grant and the explained flow were decided by the compiled VM (the shipped policy is the vetted one)
    assert _value(after, "trustfabric_policy_vm_events", event="vm_answers") >= _value(
        before, "trustfabric_policy_vm_events", event="vm_answers") + 2
    evaluation = after["trustfabric_policy_evaluation_seconds"]
    assert {s.labels["kind"] for s in evaluation.samples if s.name.endswith("_count")} >= {"grant", "flow"}
    for kind in ("jwt", "x509"):
        assert _value(after, "trustfabric_svids_issued", kind=kind) - _value(
            before, "trustfabric_svids_issued", kind=kind) == 1
    assert _value(after, "trustfabric_grants", state="pending") == 1
    assert _value(after, "trustfabric_svids_valid", kind="workload") == 1
    assert 500 < _value(after, "trustfabric_svid_expiry_horizon_seconds", kind="workload") <= 600
    with env.ctx.db.read_session() as s:
        from audit.service import tree_size

        assert _value(after, "trustfabric_audit_tree_size") == tree_size(s)
    for name in STATE_METRICS:
        assert name in after, name


def test_background_job_runs_and_failures_are_counted(tmp_path: Path, scrape: Any) -> None:
    from api.background import BackgroundJobs, Job
    from api.metrics import JOB_FAILURES, JOB_RUNS

    def boom() -> None:
        raise RuntimeError("broken job")

    runs, fails = JOB_RUNS.labels("test-boom")._value.get(), JOB_FAILURES.labels("test-boom")._value.get()
    jobs = BackgroundJobs([Job("test-boom", 1.0, boom), Job("test-ok", 1.0, lambda: None)])
    jobs.run_due(now=100.0)
    jobs.run_due(now=200.0)
    families = scrape()
    assert _value(families, "trustfabric_background_job_runs", job="test-boom") - runs == 2
    assert _value(families, "trustfabric_background_job_failures", job="test-boom") - fails == 2
    assert _value(families, "trustfabric_background_job_failures", job="test-ok") == 0


def _dashboard_exprs(node: Any) -> Iterator[str]:
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "expr" and isinstance(value, str):
                yield value
            else:
                yield from _dashboard_exprs(value)
    elif isinstance(node, list):
        for item in node:
            yield from _dashboard_exprs(item)


def test_the_grafana_dashboard_queries_exactly_the_metrics_exposed() -> None:
    import re

    dashboard = json.loads((ROOT / "docs" / "grafana" / "trustfabric.json").read_text())
    exprs = list(_dashboard_exprs(dashboard))
    used = {m for e in exprs for m in re.findall(r"\btrustfabric_[a-z_]+\b", e)}
    exposed = metric_names()
    assert exprs and used <= exposed, sorted(used - exposed)
    unused = {f for f in metric_families() if not any(u == f or u.startswith(f + "_") for u in used)}
    assert not unused, f"exposed but on no panel: {sorted(unused)}"


class _Receiver(BaseHTTPRequestHandler):
    received: list[bytes] = []

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        type(self).received.append(body)
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.end_headers()

    def log_message(self, *_args: Any) -> None:
        pass


def test_traces_reach_an_otlp_receiver(tmp_path: Path) -> None:
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    _Receiver.received = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Receiver)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    endpoint = f"http://127.0.0.1:{server.server_address[1]}/v1/traces"
    e = open_env(replace(make_settings(tmp_path / "home"), otel_endpoint=endpoint))
    try:
        seed(e, policy=False)
        trace_id = "4bf92f3577b34da6a3ce929d0e0e4736"
        r = e.call("GET", "/v1/tenants/acme", "admin", headers={"traceparent": f"00-{trace_id}-00f067aa0ba902b7-01"})
        assert r.status_code == 200
        assert e.call("GET", "/v1/whoami", "tenant-member", "acme").status_code == 200
        e.app.state.tracing.flush()
    finally:
        e.client.close()
        e.ctx.close()
        server.shutdown()
    spans = []
    for body in _Receiver.received:
        req = ExportTraceServiceRequest()
        req.ParseFromString(body)
        spans += [(s, rs.resource) for rs in req.resource_spans for ss in rs.scope_spans for s in ss.spans]
    server_span = next(s for s, _ in spans if s.name == "GET /v1/tenants/{tenant}")
    attrs = {a.key: a.value for a in server_span.attributes}
    assert server_span.trace_id.hex() == trace_id  # the caller's trace continues
    assert attrs["http.route"].string_value == "/v1/tenants/{tenant}"
    assert attrs["http.response.status_code"].int_value == 200
    assert any(s.name == "policy.authorize" and s.trace_id.hex() == trace_id for s, _ in spans)
    assert "trustfabric.tenant" not in attrs  # a platform principal
    tenants = [a.value.string_value for s, _ in spans if s.name == "GET /v1/whoami" for a in s.attributes
               if a.key == "trustfabric.tenant"]
    assert tenants == ["acme"]  # the id alone could be another tenant's principal's
    resource = {a.key: a.value.string_value for a in spans[0][1].attributes}
    assert resource["service.name"] == "trustfabric"


def test_tracing_is_off_by_default(env: Env) -> None:
    assert env.app.state.tracing is None
