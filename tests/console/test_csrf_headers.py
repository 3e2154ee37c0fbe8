"""CSRF on every state change of the console and its security headers on every page, both walked from the
console's own route list; and no inline script, style or event handler in any template (what the CSP
forbids must not be needed)."""

from __future__ import annotations

import importlib
import pkgutil
import re
from pathlib import Path

import pytest

from api.console import console_routes, page_routers
from api.console.headers import CSP
from tests.api.conftest import Env
from tests.api.test_isolation import snapshot
from tests.console.conftest import csrf_of, sign_in

TEMPLATES = Path(__file__).resolve().parents[2] / "api" / "console" / "templates"
# concrete URLs for the templated paths (seed data: acme/web/web-1, policy version 1, audit event 1)
FILL = {"{tenant}": "acme", "{group}": "web", "{name}": "web-1", "{grant_id}": "g-none", "{ref}": "1",
        "{seq}": "1", "{src}": "acme", "{dst}": "acme"}
FORMS = {"reason": "csrf test", "opened": "0", "closed": "0", "src_group": "web", "dst_tenant": "globex",
         "dst_group": "api", "proto": "tcp", "ports": "443", "ttl_seconds": "3600", "format": "jsonl"}


def _url(path: str) -> str:
    for key, value in FILL.items():
        path = path.replace(key, value)
    return path


def test_every_pages_module_is_mounted() -> None:
    """page_routers() lists the modules by name: a new pages_* module left out of it fails here, so none of
    its pages escapes the CSRF, header and isolation walks below."""
    package = TEMPLATES.parent
    found = sorted(m.name for m in pkgutil.iter_modules([str(package)]) if m.name.startswith("pages_"))
    assert len(found) >= 5
    assert [id(r) for r in page_routers()] == [id(importlib.import_module(f"api.console.{n}").router) for n in found]


STATE_CHANGES = [p for m, p in console_routes() if m == "POST" and p != "/console/login"]  # login: test_session
PAGES = [p for m, p in console_routes() if m == "GET"]


@pytest.mark.parametrize("headers", [{}, {"Origin": "https://evil.example"}, {"Sec-Fetch-Site": "cross-site"}],
                         ids=["no-token", "foreign-origin", "cross-site-fetch"])
def test_every_state_change_needs_this_sessions_csrf_token(console_env: Env, headers: dict[str, str]) -> None:
    client = sign_in(console_env, "admin")
    good = csrf_of(client, "/console/tenants/acme")
    other = csrf_of(sign_in(console_env, "admin"), "/console/tenants/acme")  # another session's token
    before = snapshot(console_env)
    for path in STATE_CHANGES:
        token = good if headers else ""
        r = client.post(_url(path), data={**FORMS, "csrf": token}, headers=headers)
        assert r.status_code == 403 and "CSRF check failed" in r.text, f"{path}: {r.status_code}"
    for path in STATE_CHANGES:
        r = client.post(_url(path), data={**FORMS, "csrf": other})
        assert r.status_code == 403, path
    assert snapshot(console_env) == before, "a refused state change wrote something"


def test_the_token_is_accepted_as_a_form_field_or_the_htmx_header(console_env: Env) -> None:
    client = sign_in(console_env, "security")
    csrf = csrf_of(client, "/console/tenants/acme")
    r = client.post("/console/tenants/acme/groups/db/quarantine", data={"reason": "test", "csrf": csrf},
                    headers={"Origin": "http://testserver", "Sec-Fetch-Site": "same-origin"})
    assert r.status_code == 303 and r.headers["location"].endswith("notice=quarantined")
    r = client.post("/console/tenants/acme/groups/db/unquarantine", data={"reason": "test"},
                    headers={"X-CSRF-Token": csrf, "HX-Request": "true"})
    assert r.status_code == 303


def test_security_headers_on_every_page(console_env: Env) -> None:
    client = sign_in(console_env, "admin")
    for path in [*PAGES, "/console/static/console.css", "/console/static/htmx.min.js"]:
        r = client.get(_url(path))
        assert r.status_code < 500, path
        assert r.headers["content-security-policy"] == CSP, path
        assert r.headers["x-content-type-options"] == "nosniff"
        assert r.headers["x-frame-options"] == "DENY"
        assert r.headers["referrer-policy"] == "same-origin"
        static = "/static/" in path
        assert r.headers["cache-control"] == ("public, max-age=3600" if static else "no-store"), path
    for directive in ("default-src 'none'", "script-src 'self'", "style-src 'self'", "frame-ancestors 'none'",
                      "form-action 'self'", "base-uri 'none'"):
        assert directive in CSP
    assert "unsafe" not in CSP
    api = client.get("/v1/bundle")
    assert "content-security-policy" not in api.headers, "the JSON API is left as it is"


def test_hsts_under_tls(console_env: Env) -> None:
    client = sign_in(console_env, "auditor", base_url="https://testserver")
    assert client.get("/console/audit").headers["strict-transport-security"].startswith("max-age=")


@pytest.mark.parametrize("template", sorted(p.name for p in TEMPLATES.glob("*.html")))
def test_templates_need_nothing_the_csp_forbids(template: str) -> None:
    html = (TEMPLATES / template).read_text(encoding="utf-8")
    assert not re.search(r"<script(?![^>]*\bsrc=)", html), "inline script"
    assert not re.search(r"<style\b", html), "inline style element"
    assert not re.search(r"\sstyle\s*=", html), "style attribute"
    assert not re.search(r"\son[a-z]+\s*=", html), "event handler attribute"
    assert "javascript:" not in html
    assert not re.search(r"\bhx-on\b|hx-on:|js:", html), "htmx attributes that evaluate script"
