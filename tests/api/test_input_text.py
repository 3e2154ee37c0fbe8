"""api/input_text.py: a NUL anywhere in the URL or a JSON body, and a body that is not UTF-8, are refused with a
reason before a route runs, and nothing is written. On PostgreSQL each NUL here was a 500 (psycopg's DataError:
text cannot hold a NUL) and SQLite stored it; a UTF-16 body was parsed and acted on."""

from __future__ import annotations

import base64
import json

from tests.api.conftest import Env
from tests.api.test_auth_jwt import audit_count

GRANT = {"src_group": "web", "dst_tenant": "globex", "dst_group": "api", "proto": "tcp", "ports": [443],
         "ttl_seconds": 600}
NUL_CURSOR = base64.urlsafe_b64encode(b"g-\x00").decode().rstrip("=")


def test_a_nul_in_the_url_is_refused_with_a_reason(env_both: Env) -> None:
    env = env_both
    asked = [
        ("/v1/grants/g%00x", "tenant-member", "acme", {}),
        ("/v1/grants", "tenant-member", "acme", {"src_tenant": "a\x00b"}),
        ("/v1/grants", "tenant-member", "acme", {"cursor": NUL_CURSOR}),
        ("/v1/tokens/t%00x", "admin", None, {}),
        ("/v1/tokens", "admin", None, {"cursor": NUL_CURSOR}),
        ("/v1/audit/events", "admin", None, {"actor": "a\x00b"}),
        ("/v1/tenants/acme/workloads", "tenant-admin", "acme", {"group": "a\x00b"}),
        ("/v1/policy/decisions", "admin", None, {"tenant": "a\x00b"}),
    ]
    for path, role, tenant, params in asked:
        r = env.call("GET", path, role, tenant, params=params)
        assert r.status_code == 400, (path, params, r.status_code, r.text)
        assert "NUL" in r.json()["reason"] or "cursor" in r.json()["reason"], r.json()


def test_a_nul_in_a_json_body_is_refused_and_nothing_is_written(env_both: Env) -> None:
    env = env_both
    env.headers("tenant-admin", "acme"), env.headers("admin")  # their tokens minted (audited) beforehand
    before = audit_count(env)
    asked = [
        ("/v1/grants", "tenant-admin", "acme", {**GRANT, "justification": "a\x00b"}),
        ("/v1/tenants", "admin", None, {"slug": "initech", "display_name": "Ini\x00tech"}),
        ("/v1/tenants/acme/groups", "tenant-admin", "acme", {"name": "n", "labels": {"k\x00": "v"}}),
        ("/v1/tokens", "admin", None, {"role": "auditor", "ttl_seconds": 60, "subject": "a\x00b"}),
        ("/v1/tokens", "admin", None, {"role": "auditor", "ttl_seconds": 60, "description": "a\x00b"}),
    ]
    for path, role, tenant, body in asked:
        r = env.call("POST", path, role, tenant, json=body)
        assert r.status_code == 400, (path, r.status_code, r.text)
        assert "NUL" in r.json()["reason"], r.json()
    assert audit_count(env) == before
    # the six characters of `\u0000` written as text are no NUL: accepted
    text = json.dumps({**GRANT, "justification": "see \\u0000 in the docs"})
    assert "\\\\u0000" in text
    r = env.call("POST", "/v1/grants", "tenant-admin", "acme", content=text,
                 headers={"Content-Type": "application/json"})
    assert r.status_code == 201, r.text
    assert r.json()["justification"] == "see \\u0000 in the docs"


def test_a_body_that_is_not_utf8_is_refused(env: Env) -> None:
    env.headers("tenant-admin", "acme")  # its token minted (audited) beforehand
    before = audit_count(env)
    for encoding in ("utf-16", "utf-32"):
        r = env.call("POST", "/v1/grants", "tenant-admin", "acme", content=json.dumps(GRANT).encode(encoding),
                     headers={"Content-Type": "application/json"})
        assert r.status_code == 400 and "UTF-8" in r.json()["reason"], (encoding, r.text)
    assert audit_count(env) == before
    # a UTF-8 byte order mark is allowed (RFC 8259: a parser may ignore it)
    r = env.call("POST", "/v1/grants", "tenant-admin", "acme", content=b"\xef\xbb\xbf" + json.dumps(GRANT).encode(),
                 headers={"Content-Type": "application/json"})
    assert r.status_code == 201, r.text
