"""Decision records exported with the audit exports: `POST /v1/audit/exports` with include_decisions
(multipart: the audit export, then the decision file), `trustfabric audit export --with-decisions`, and
`trustfabric policy decisions`. Tenants see only their own decisions; the export is itself audited."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from datetime import timedelta
from email.parser import BytesParser
from email.policy import HTTP
from pathlib import Path
from typing import Any

import pytest
from sqlmodel import select
from typer.testing import CliRunner

from audit import checkpoint as cpm
from audit.models import AuditEvent
from audit.verify import verify_export
from cli.main import app as cli_app
from cli.output import fit_to_terminal
from policy.decide import AuthzDecision, FlowDecision, GrantDecision
from policy.decisionlog import DecisionExportError, DecisionLog, verify_decision_export
from tests.api.conftest import Env, make_settings, open_env, seed


def _log_decisions(env: Env) -> None:
    log = DecisionLog(env.ctx.db, clock=env.clock)
    for i in range(12):
        tenant = ("acme", "globex")[i % 2]
        if i % 4 == 3:
            grant = GrantDecision("deny", [f"no {i}"])
            log.record("grant", {"requester": {"tenant": tenant}, "i": i}, grant, "ab" * 32, owner=tenant)
        else:
            log.record("flow", {"src": {"tenant": tenant, "group": "web"}, "i": i},
                       FlowDecision(i % 3 == 0, [f"r{i}"]), "cd" * 32, owner=tenant)
        env.clock.advance(timedelta(seconds=5))
    log.record("authz", {"action": "x.y"}, AuthzDecision(False, ["no tenant"]), None, owner=None)


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def env(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Env]:
    url = request.getfixturevalue("postgres_server").create_database() if request.param == "postgres" else None
    e = open_env(make_settings(tmp_path / "home", url))
    cpm.ensure_audit_key(e.ctx.keystore)
    seed(e)
    _log_decisions(e)
    yield e
    e.client.close()
    e.ctx.close()


def _parts(r: Any) -> dict[str, tuple[str, bytes]]:
    """filename -> (content type, bytes) of a multipart/mixed response."""
    assert r.headers["content-type"].startswith("multipart/mixed; boundary="), r.headers
    msg = BytesParser(policy=HTTP).parsebytes(
        f"Content-Type: {r.headers['content-type']}\r\n\r\n".encode() + r.content
    )
    out: dict[str, tuple[str, bytes]] = {}
    for part in msg.iter_parts():
        name, payload = part.get_filename(), part.get_payload(decode=True)
        assert name is not None and isinstance(payload, bytes), part.get_content_type()
        out[name] = (part.get_content_type(), payload)
    return out


def _decisions(data: bytes) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    got: list[dict[str, Any]] = []
    report = verify_decision_export(io.BytesIO(data), got.append)
    return report.header, got


def _logged(env: Env, tenant: str | None = None) -> list[dict[str, Any]]:
    params: dict[str, Any] = {"limit": 1000, **({"tenant": tenant} if tenant else {})}
    r = env.call("GET", "/v1/policy/decisions", "auditor", params=params)
    assert r.status_code == 200, r.text
    return list(reversed(r.json()))


def _same(exported: list[dict[str, Any]], logged: list[dict[str, Any]]) -> None:
    assert [d["id"] for d in exported] == [d["id"] for d in logged]
    for e, lg in zip(exported, logged, strict=True):
        assert e["ts"].endswith("Z")
        assert {k: v for k, v in e.items() if k != "ts"} == {k: v for k, v in lg.items() if k != "ts"}


def _export_events(env: Env) -> list[AuditEvent]:
    with env.ctx.db.read_session() as s:
        return list(s.exec(select(AuditEvent).where(AuditEvent.action == "audit.export")).all())


def test_the_api_export_carries_the_decisions_and_is_audited(env: Env) -> None:
    env.headers("auditor")
    plain = env.call("POST", "/v1/audit/exports", "auditor", json={"format": "jsonl"})
    assert plain.status_code == 200 and plain.headers["content-type"] == "application/x-ndjson"  # unchanged
    r = env.call("POST", "/v1/audit/exports", "auditor", json={"format": "csv", "include_decisions": True})
    assert r.status_code == 200, r.text
    parts = _parts(r)
    assert list(parts) == ["audit-export.csv", "audit-export.decisions.jsonl"]
    assert parts["audit-export.csv"][0] == "text/csv"
    key = cpm.load_public_key(env.call("GET", "/v1/audit/checkpoint", "auditor").json()["public_key"])
    assert verify_export(io.BytesIO(parts["audit-export.csv"][1]), key).tree_size > 0
    ctype, data = parts["audit-export.decisions.jsonl"]
    header, got = _decisions(data)
    assert ctype == "application/x-ndjson" and header["count"] == len(got) == 13
    _same(got, _logged(env))
    event = _export_events(env)[-1]
    assert event.summary["decisions"]["count"] == 13 and event.summary["decisions"]["sha256"]


def test_api_filters_apply_to_the_decisions(env: Env) -> None:
    logged = _logged(env, "globex")
    since, until = logged[1]["ts"], logged[-1]["ts"]
    r = env.call("POST", "/v1/audit/exports", "admin",
                 json={"tenant": "globex", "since": since, "until": until, "include_decisions": True})
    assert r.status_code == 200, r.text
    header, got = _decisions(_parts(r)["audit-export.decisions.jsonl"][1])
    assert header["filter"]["tenant"] == "globex" and header["filter"]["since"].endswith("Z")
    _same(got, logged[1:-1])


def test_a_tenant_gets_only_its_own_decisions(env: Env) -> None:
    env.headers("tenant-admin", "acme")
    r = env.call("POST", "/v1/audit/exports", "tenant-admin", "acme", json={"include_decisions": True})
    assert r.status_code == 200, r.text
    header, got = _decisions(_parts(r)["audit-export.decisions.jsonl"][1])
    assert header["filter"]["tenant"] == "acme" and got and {d["tenant"] for d in got} == {"acme"}
    _same(got, _logged(env, "acme"))
    body = {"tenant": "globex", "include_decisions": True}
    r = env.call("POST", "/v1/audit/exports", "tenant-admin", "acme", json=body)
    assert r.status_code == 403  # the body never widens the scope
    # the query route is confined the same way
    q = env.call("GET", "/v1/policy/decisions", "tenant-admin", "acme", params={"limit": 1000})
    assert q.status_code == 200 and {d["tenant"] for d in q.json()} == {"acme"}
    other = env.call("GET", "/v1/policy/decisions", "tenant-admin", "acme", params={"tenant": "globex"})
    assert other.status_code == 403
    # tenant members may not read decisions: refused, and the refused export writes nothing
    before = len(_export_events(env))
    member = env.call("POST", "/v1/audit/exports", "tenant-member", "acme", json={"include_decisions": True})
    assert member.status_code == 403 and "may not" in member.json()["reason"]
    assert len(_export_events(env)) == before


def test_a_bad_request_writes_nothing(env: Env) -> None:
    env.headers("auditor")
    before = len(_export_events(env))
    r = env.call("POST", "/v1/audit/exports", "auditor", json={"include_decisions": "maybe"})
    assert r.status_code in (400, 422)
    r = env.call("POST", "/v1/audit/exports", "auditor",
                 json={"include_decisions": True, "since": "2026-01-02T00:00:00Z", "until": "2026-01-01T00:00:00Z"})
    assert r.status_code in (400, 422)
    assert len(_export_events(env)) == before


def _cli(env: Env, *args: str) -> tuple[int, str]:
    env_vars = {"TRUSTFABRIC_HOME": str(env.ctx.settings.home),
                "TRUSTFABRIC_DATABASE_URL": env.ctx.settings.database_url or "", "COLUMNS": "200"}
    runner = CliRunner()
    with runner.isolation(env=env_vars):  # the table's width from COLUMNS, not from whatever test ran before
        fit_to_terminal()
    result = runner.invoke(cli_app, list(args), env=env_vars)
    return result.exit_code, result.output


def test_cli_export_with_decisions(env: Env, tmp_path: Path) -> None:
    out = tmp_path / "export.jsonl"
    code, text = _cli(env, "audit", "export", "--out", str(out), "--tenant", "acme", "--with-decisions", "--json")
    assert code == 0, text
    summary = json.loads(text)
    dec = tmp_path / "export.jsonl.decisions.jsonl"
    assert summary["decisions"]["out"] == str(dec) and summary["out"] == str(out)
    header, got = _decisions(dec.read_bytes())
    assert header["filter"]["tenant"] == "acme" and summary["decisions"]["count"] == len(got) > 0
    _same(got, _logged(env, "acme"))
    assert not list(tmp_path.glob("*.part"))
    assert _export_events(env)[-1].summary["decisions"]["out"] == dec.name
    code, text = _cli(env, "audit", "export", "--out", str(tmp_path / "b.jsonl"), "--with-decisions")
    assert code == 0 and str(tmp_path / "b.jsonl") in text and str(tmp_path / "b.jsonl.decisions.jsonl") in text
    code, text = _cli(env, "audit", "export", "--out", str(tmp_path / "c.jsonl"))
    assert code == 0 and not (tmp_path / "c.jsonl.decisions.jsonl").exists()
    truncated = dec.read_bytes()[:-30]
    with pytest.raises(DecisionExportError):
        verify_decision_export(io.BytesIO(truncated))


def test_cli_policy_decisions(env: Env) -> None:
    code, text = _cli(env, "policy", "decisions", "--json", "--tenant", "globex")
    assert code == 0, text
    rows = json.loads(text)
    assert rows and {r["tenant"] for r in rows} == {"globex"}
    assert [r["id"] for r in rows] == [d["id"] for d in reversed(_logged(env, "globex"))]
    since = rows[-2]["ts"]
    code, text = _cli(env, "policy", "decisions", "--json", "--tenant", "globex", "--since", since)
    assert code == 0 and [r["id"] for r in json.loads(text)] == [r["id"] for r in rows[:-1]]
    code, text = _cli(env, "policy", "decisions", "--json", "--until", since, "--tenant", "globex")
    assert code == 0 and [r["id"] for r in json.loads(text)] == [rows[-1]["id"]]
    code, text = _cli(env, "policy", "decisions")
    assert code == 0 and "globex" in text and "acme" in text
    code, text = _cli(env, "policy", "decisions", "--since", "yesterday")
    assert code != 0
