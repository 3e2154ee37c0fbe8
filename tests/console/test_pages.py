"""Console pages beyond the browser stories: the proof check fails on any tampering, an activation whose
impact changed since it was confirmed is asked again, uploads, the export streamed through, the actor
filter, the flow matrix paged at many tenants, and form input the API would refuse."""

from __future__ import annotations

import base64
import copy
import re
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from starlette.datastructures import UploadFile

from api.console.pages_audit import check_inclusion, utc_param
from api.console.pages_grants import parse_ports
from api.console.pages_policy import heat, modules_from_upload
from api.console.web import duration
from audit import Actor
from audit.checkpoint import load_public_key
from audit.errors import Unproven
from audit.verify import verify_export
from audit.verify.report import VerifyReport
from inventory.service import create_group, create_tenant
from tests.api.conftest import Env
from tests.console.conftest import csrf_of, hidden, sign_in, when_ready


def _proof_inputs(env: Env, seq: int) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    h = env.headers("auditor")
    checkpoint = env.client.get("/v1/audit/checkpoint", headers=h).json()
    event = env.client.get("/v1/audit/events", params={"limit": 1000}, headers=h).json()["items"][seq]
    proof = env.client.get("/v1/audit/proof/inclusion", params={"index": seq, "tree_size": checkpoint["size"]},
                           headers=h).json()
    return event, checkpoint, proof


def test_the_proof_check_catches_every_kind_of_tampering(console_env: Env) -> None:
    event, checkpoint, proof = _proof_inputs(console_env, 2)
    assert [ok for _what, ok, _detail in check_inclusion(event, checkpoint, proof)] == [True, True, True]
    changed = copy.deepcopy(event)
    changed["actor"]["id"] = "someone-else"
    assert check_inclusion(changed, checkpoint, proof)[-1][:2] == ("leaf hash", False)
    assert event["counters"], "a version 2 event: its per-key numbers are hashed with it"
    renumbered = {**event, "counters": {k: n + 1 for k, n in event["counters"].items()}}
    assert check_inclusion(renumbered, checkpoint, proof)[-1][:2] == ("leaf hash", False)
    note = checkpoint["note"].replace(f"\n{checkpoint['size']}\n", f"\n{checkpoint['size'] + 1}\n")
    assert check_inclusion(event, {**checkpoint, "note": note}, proof)[0][1] is False
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    other = Ed25519PrivateKey.generate().public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo).decode()
    assert check_inclusion(event, {**checkpoint, "public_key": other}, proof)[0][1] is False
    bad_path = {**proof, "proof": [base64.b64encode(b"\x00" * 32).decode(), *proof["proof"][1:]]}
    assert check_inclusion(event, checkpoint, bad_path)[-1][:2] == ("inclusion proof", False)
    assert check_inclusion(event, checkpoint, None)[-1][1] is False
    load_public_key(checkpoint["public_key"])  # what the page names is the real audit key


def test_an_activation_is_asked_again_when_its_impact_changed(console_env: Env) -> None:
    env = console_env
    client = sign_in(env, "security")
    csrf = csrf_of(client, "/console/policy")
    r = client.post("/console/policy/versions/1/rollback", data={"csrf": csrf, "opened": "5", "closed": "0"})
    assert r.status_code == 409 and "The impact changed since you looked" in r.text
    assert "opens 0 flows and closes 0" in r.text
    assert hidden(r.text, "opened") == "0"
    r = client.get("/console/policy/versions/1/activate")
    assert r.status_code == 200 and "Yes, activate: open 0, close 0 flows" in r.text
    r = client.post("/console/policy/versions/1/activate", data={"csrf": csrf, "opened": "0", "closed": "0"})
    assert r.status_code == 409 and "already active" in r.text, "the API's own answer, as a page"


def test_a_folder_upload_keeps_the_paths_inside_it() -> None:
    files = [UploadFile(file=None, filename=name) for name in  # type: ignore[arg-type]
             ("my-rego/flows.rego", "my-rego/sub/x_test.rego", "my-rego/README.md")]
    modules = modules_from_upload(files, [b"package flows\n", b"package x_test\n", b"# not rego"])
    assert modules == {"flows.rego": "package flows\n", "sub/x_test.rego": "package x_test\n"}
    with pytest.raises(ValueError, match=r"no \.rego"):
        modules_from_upload(files[2:], [b"#"])
    with pytest.raises(ValueError, match="not UTF-8"):
        modules_from_upload(files[:1], [b"\xff\xfe"])


def test_a_policy_that_does_not_compile_is_shown_with_its_location(console_env: Env) -> None:
    client = sign_in(console_env, "security")
    csrf = csrf_of(client, "/console/policy")
    r = client.post("/console/policy/upload", data={"csrf": csrf, "note": "broken"},
                    files=[("files", ("p/bad.rego", b"package bad\n\nallow if {\n"))])
    assert r.status_code == 400 and "bad.rego:" in r.text and 'role="alert"' in r.text


def test_the_export_is_streamed_through_and_verifies(console_env: Env, tmp_path: Path) -> None:
    client = sign_in(console_env, "auditor")
    csrf = csrf_of(client, "/console/audit/export")
    r = client.post("/console/audit/export", data={"csrf": csrf, "format": "csv", "tenant": "acme"})
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/csv")
    assert r.headers["content-disposition"] == 'attachment; filename="audit-export.csv"'
    out = tmp_path / "export.csv"
    out.write_bytes(r.content)
    key = load_public_key(client.get("/console/audit/public-key").content)
    assert verify_export(out, key).events > 0
    r = client.post("/console/audit/export", data={"csrf": csrf, "format": "jsonl", "since": "yesterday"})
    assert r.status_code == 400 and "is not a date and time" in r.text
    # the explorer's actor filter, on the export too: the actor's events only, verified but unproven (said on the form)
    assert "An export narrowed by actor verifies as UNPROVEN" in client.get("/console/audit/export").text
    actor = client.get("/console/audit").text.split('title="Only this actor\'s events">', 1)[1].split("<", 1)[0]
    r = client.post("/console/audit/export", data={"csrf": csrf, "format": "jsonl", "actor": actor})
    assert r.status_code == 200, r.text
    out.write_bytes(r.content)
    with pytest.raises(Unproven) as unproven:
        verify_export(out, key)
    assert isinstance(unproven.value.report, VerifyReport) and unproven.value.report.filter["actor"] == actor
    assert unproven.value.report.events > 0


def test_the_actor_filter_and_bad_filters(console_env: Env) -> None:
    env = console_env
    client = sign_in(env, "auditor")
    everything = env.call("GET", "/v1/audit/events", "auditor", params={"limit": 1000}).json()["items"]
    actor = everything[0]["actor"]["id"]
    want = [e["seq"] for e in everything if e["actor"]["id"] == actor]
    assert 0 < len(want) < len(everything)
    r = client.get("/console/audit", params={"actor": actor})
    assert r.status_code == 200
    shown = [int(n) for n in re.findall(r'<td><a href="/console/audit/events/(\d+)">', r.text)]
    assert shown == want[:100], "exactly that actor's events, applied by the API"
    for bad in ("NOT AN ACTION", "grant", "x" * 64):  # in words, never the API's regular expression
        r = client.get("/console/audit", params={"action": bad})
        assert r.status_code == 400 and 'role="alert"' in r.text and "such as grant.approve" in r.text, r.text
        assert "[a-z" not in r.text and "pattern" not in r.text, r.text
    r = client.get("/console/decisions", params={"since": "31/12/2026"})
    assert r.status_code == 400


def test_the_flow_matrix_pages_and_searches_at_many_tenants(console_env: Env) -> None:
    env = console_env
    with env.ctx.db.session() as s:
        for i in range(30):
            create_tenant(s, slug=f"m{i:02d}", display_name=f"M{i}", actor=Actor.system("t"))
            for g in range(1 + i % 3):
                create_group(s, tenant=f"m{i:02d}", name=f"g{g}", ports=[{"proto": "tcp", "port": 443}],
                             actor=Actor.system("t"))
    client = sign_in(env, "auditor")
    r = when_ready(env, client, "/console/flows")  # the tenants changed: computed first
    assert r.status_code == 200 and "showing 1\u201320" in r.text and "offset=20" in r.text
    assert r.text.count('<th scope="row">') == 20 and '<th scope="row" class="other">other tenants' in r.text
    r = client.get("/console/flows", params={"search": "m2", "offset": 0})
    # m20..m29 with two or more groups have flows among them; a tenant with one group has none
    assert "7 tenants with flows match" in r.text
    r = client.get("/console/flows", params={"search": "nobody"})
    assert "No allowed flows for tenants matching" in r.text


def test_grant_form_helpers() -> None:
    assert parse_ports("443, 8443 9000") == [443, 8443, 9000]
    for bad in ("", "https", "1-2", ",".join(["1"] * 65)):
        with pytest.raises(ValueError):
            parse_ports(bad)
    assert heat(0, 10) == 0 and heat(10, 10) == 5 and 1 <= heat(1, 1000) <= 2
    assert utc_param("2026-01-02T03:04", "since") == "2026-01-02T03:04:00+00:00"
    assert utc_param("", "since") is None


def test_a_tenant_request_form_with_bad_ports_says_why(console_env: Env) -> None:
    client = sign_in(console_env, "tenant-admin", "acme")
    csrf = csrf_of(client)
    r = client.post("/console/grants", data={"csrf": csrf, "src_group": "web", "dst_tenant": "globex",
                                             "dst_group": "api", "proto": "tcp", "ports": "https",
                                             "ttl_seconds": "3600"})
    assert r.status_code == 400 and "ports are numbers" in r.text
    r = client.post("/console/grants", data={"csrf": csrf, "src_group": "web", "dst_tenant": "globex",
                                             "dst_group": "api", "proto": "tcp", "ports": "443, 99999",
                                             "ttl_seconds": "3600"})  # the API said `body.ports.1: ... <= 65535`
    assert r.status_code == 400 and "99999 is not a port number: ports go up to 65535" in r.text, r.text
    assert "body.ports" not in r.text
    r = client.get("/console/grants/preview", params={"src_group": "web", "dst_tenant": "globex",
                                                      "dst_group": "vault", "ports": "8200"},
                   headers={"HX-Request": "true"})
    # acme holds no grant with globex/vault: that it is sensitive (security approves too) is not disclosed
    assert r.status_code == 200 and "Answered when you submit the request." in r.text and "security" not in r.text
    assert "<html" not in r.text, "an htmx request gets the fragment alone"


@pytest.mark.parametrize("ttl", ["0", "soon", str(400 * 86400)])
def test_a_tampered_request_form_gets_the_console_s_error_page(console_env: Env, ttl: str) -> None:
    """A form value the page's own controls cannot send was answered with the API's raw JSON 422."""
    env = console_env
    client = sign_in(env, "tenant-admin", "acme")
    csrf = csrf_of(client)
    before = env.call("GET", "/v1/grants", "admin", params={"limit": 200}).json()["items"]
    form = {"csrf": csrf, "src_group": "web", "dst_tenant": "globex", "dst_group": "api", "proto": "tcp",
            "ports": "8443", "ttl_seconds": ttl, "justification": "tampered"}
    r = client.post("/console/grants", data=form)
    assert r.status_code == 422 and r.headers["content-type"].startswith("text/html"), r.text
    assert 'role="alert"' in r.text and "ttl_seconds" in r.text and "Sign out" in r.text, r.text
    assert env.call("GET", "/v1/grants", "admin", params={"limit": 200}).json()["items"] == before
    r = client.get("/console/grants/preview", params={"src_group": "web", "dst_tenant": "globex",
                                                      "dst_group": "api", "ports": "8443", "ttl_seconds": ttl},
                   headers={"HX-Request": "true"})
    assert r.status_code == 422 and "ttl_seconds" in r.text and "<html" not in r.text, r.text
    signed_out = TestClient(env.app, raise_server_exceptions=False, follow_redirects=False)
    r = signed_out.post("/console/grants", data=form)  # no session: signed in first, as any page asks
    assert r.status_code == 303 and r.headers["location"].startswith("/console/login")
    api = env.call("POST", "/v1/grants", "tenant-admin", "acme", json={**form, "ports": [8443], "ttl_seconds": 0})
    assert api.status_code == 422 and api.json()["error"] == "invalid_request"  # the API's answer is unchanged


def test_times_ttls_and_the_icon_read_as_on_the_other_pages(console_env: Env) -> None:
    """The audit event page printed its time as raw ISO with microseconds, the grant page a TTL as '3600 s'
    where the form said '1 hour', and /favicon.ico was a 404 on every page (found walking the console)."""
    env = console_env
    auditor = sign_in(env, "auditor")
    r = auditor.get("/console/audit/events/0")
    assert r.status_code == 200
    assert re.search(r"<dt>Time</dt><dd>\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2} UTC</dd>", r.text), r.text
    acme = sign_in(env, "tenant-admin", "acme")
    form = acme.get("/console/grants").text
    assert '<option value="3600">1 hour</option>' in form and '<option value="259200">3 days</option>' in form
    made = env.call("POST", "/v1/grants", "tenant-admin", "acme", json={
        "src_group": "web", "dst_tenant": "globex", "dst_group": "api", "proto": "tcp", "ports": [8443],
        "ttl_seconds": 3 * 86400, "justification": "ttl label"}).json()
    r = acme.get(f"/console/grants/{made['id']}")
    assert "<dd>3 days once active</dd>" in r.text and " s once active" not in r.text, r.text
    assert duration(3600) == "1 hour" and duration(93784) == "1 day 2 hours 3 minutes 4 seconds"
    icon = re.search(r'<link rel="icon" href="([^"]+)"', r.text)
    assert icon, "no icon link: the browser asks /favicon.ico, a 404"
    got = acme.get(icon.group(1))
    assert got.status_code == 200 and got.headers["content-type"].startswith("image/svg+xml")
    assert got.content.startswith(b"<svg") and "http" not in icon.group(1)  # served here, nothing fetched


def test_a_grant_names_its_requesters_tenant_beside_its_id(console_env: Env) -> None:
    """acme's `alice` and the platform's `alice` are one principal id (API token subjects are free text): the list
    of grants awaiting globex's approval and a grant's page say whose request each is."""
    env = console_env
    body = {"src_group": "web", "dst_tenant": "globex", "dst_group": "api", "proto": "tcp", "ports": [8443],
            "ttl_seconds": 3600}

    def request_as_alice(role: str, tenant: str | None, extra: dict[str, str]) -> str:
        token = env.token(role, tenant, subject="alice")
        r = env.client.post("/v1/grants", json={**body, **extra}, headers={"Authorization": f"Bearer {token}"})
        assert r.status_code == 201 and r.json()["state"] == "pending", r.text
        return str(r.json()["id"])

    request_as_alice("tenant-admin", "acme", {})
    platform = request_as_alice("admin", None, {"src_tenant": "acme"})
    globex = sign_in(env, "tenant-admin", "globex")
    waiting = globex.get("/console/grants").text
    assert "<td>alice@acme</td>" in waiting and "<td>alice (platform role)</td>" in waiting, waiting
    assert "<dt>Requested by</dt><dd>alice (platform role) at " in globex.get(f"/console/grants/{platform}").text


def test_an_error_in_a_fragment_is_a_fragment(console_env: Env) -> None:
    """A part of a page that htmx loads and the API refuses (an auditor may read a policy version but not its
    impact) shows the reason in that part: not a second whole page (header, navigation) inside the first."""
    client = sign_in(console_env, "auditor")
    page = client.get("/console/policy/versions/1")
    assert page.status_code == 200 and 'hx-get="/console/policy/versions/1/impact"' in page.text
    r = client.get("/console/policy/versions/1/impact", headers={"hx-request": "true"})
    assert r.status_code == 403 and "may not policy.impact" in r.text and 'role="alert"' in r.text
    assert "<header" not in r.text and "<html" not in r.text and "Sign out" not in r.text, r.text
    r = client.get("/console/policy/versions/1/impact")  # the same without htmx: a whole page
    assert r.status_code == 403 and "<header" in r.text and "may not policy.impact" in r.text


def test_a_revoked_grant_page_does_not_show_its_expiry_as_to_come(console_env: Env) -> None:
    """A revoked grant's page said 'Expires <time> (in 1h 59m)' (found in the review as a tenant): it now says it
    was to expire then, and was revoked before."""
    env = console_env
    made = env.call("POST", "/v1/grants", "tenant-admin", "acme", json={
        "src_group": "web", "dst_tenant": "globex", "dst_group": "api", "proto": "tcp", "ports": [8443],
        "ttl_seconds": 7200, "justification": "revoked early"}).json()
    assert env.call("POST", f"/v1/grants/{made['id']}/approve", "tenant-admin", "globex", json={}).status_code == 200
    revoked = env.call("POST", f"/v1/grants/{made['id']}/revoke", "tenant-admin", "globex", json={"reason": "done"})
    assert revoked.status_code == 200 and revoked.json()["state"] == "revoked", revoked.text
    page = sign_in(env, "tenant-admin", "acme").get(f"/console/grants/{made['id']}").text
    assert "<dt>Expires</dt>" not in page and "<dt>Was to expire</dt>" in page and "(revoked before)" in page, page


def test_an_export_with_from_after_until_names_the_fields_not_cli_options(console_env: Env) -> None:
    """The export page answered 'export --since must be before --until': options of a command line the console's
    user never typed (review). The message names the filters by their fields."""
    client = sign_in(console_env, "auditor")
    csrf = csrf_of(client, "/console/audit/export")
    r = client.post("/console/audit/export", data={"csrf": csrf, "format": "jsonl", "since": "2026-12-02T09:00",
                                                   "until": "2026-12-02T08:00"})
    assert r.status_code == 400 and 'role="alert"' in r.text, r.text
    alert = re.search(r'role="alert">([^<]*)<', r.text)
    assert alert and "since must be before until" in alert.group(1) and "--" not in alert.group(1), r.text


def test_a_decisions_tenant_that_is_no_slug_is_refused_not_an_empty_log(console_env: Env) -> None:
    """`/v1/policy/decisions?tenant=Acme` answered 200 [] (the console's decision log: an empty table, as if acme had
    no decisions) where `/v1/audit/events` refuses a tenant that is no slug (review)."""
    env = console_env
    r = env.call("GET", "/v1/policy/decisions", "auditor", params={"tenant": "Acme"})
    assert r.status_code == 422 and r.json()["error"] == "invalid_request", r.text
    assert env.call("GET", "/v1/policy/decisions", "auditor", params={"tenant": "acme"}).status_code == 200
    page = sign_in(env, "auditor").get("/console/decisions", params={"tenant": "<b>Acme</b>"})
    assert page.status_code in (400, 422) and 'role="alert"' in page.text and "<b>Acme" not in page.text, page.text


def test_a_console_page_refused_by_the_address_rate_limit_is_a_page(tmp_path: Path) -> None:
    """The per-address rate limit answers before routing (api/limits.py): a console page got the API's raw JSON
    there, which a browser shows as text. Now it gets the console's error page, still 429 with Retry-After and
    the console's security headers (the answer never reaches api/edge.py's header pass), the reason in words; a
    part of a page htmx asked for gets the reason alone; an API path keeps its JSON."""
    from tests.api.conftest import make_settings, open_env

    env = open_env(make_settings(tmp_path / "home", ip_rate_limit_per_second=0.01, ip_rate_limit_burst=2))
    try:
        browser = TestClient(env.app, raise_server_exceptions=False, follow_redirects=False)
        assert [browser.get("/console/login").status_code for _ in range(2)] == [200, 200]
        page = browser.get("/console/login")
        assert page.status_code == 429 and int(page.headers["retry-after"]) >= 1, page.text
        assert page.headers["content-type"] == "text/html; charset=utf-8", page.headers
        assert page.headers["content-security-policy"].startswith("default-src 'none'")
        assert page.headers["cache-control"] == "no-store" and page.headers["x-frame-options"] == "DENY"
        layout = '<link rel="stylesheet" href="/console/static/console.css">'  # the console's own frame
        assert page.text.startswith("<!doctype html>") and layout in page.text, page.text
        said = "Too many requests from your address (testclient): wait "
        assert "<h1>Too many requests</h1>" in page.text and said in page.text, page.text
        part = browser.get("/console/grants", headers={"HX-Request": "true"})
        assert part.status_code == 429 and "<html" not in part.text and 'role="alert"' in part.text, part.text
        api = browser.get("/v1/whoami")
        assert api.status_code == 429 and api.json()["error"] == "rate_limited", api.text
        assert "content-security-policy" not in api.headers
    finally:
        env.client.close()
        env.ctx.close()
