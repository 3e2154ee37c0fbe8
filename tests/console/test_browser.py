"""The console in a real browser (Debian chromium, driven by Playwright) against the app served on
127.0.0.1: the three users' stories end to end, a screenshot of each page saved as an artifact
(test-artifacts/console/), and no Content-Security-Policy violation on any page.

1. a tenant requests a grant, sees the policy's answer before submitting, then the grant pending with the
   approver named; 2. the destination tenant approves it; 3. the security team uploads a policy change (a
   folder), sees its test results and impact, activates it after a confirmation naming the flow counts,
   and reads the flow matrix; 4. an auditor filters events, checks an event's inclusion proof, and
   downloads an export that `trustfabric audit verify` accepts.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from audit import Actor
from inventory.service import create_group, create_tenant
from policy.shipped import REGO_DIR
from tests.console.conftest import ARTIFACTS, LiveServer

# A policy change a security team might make: a group labelled shared=true is reachable from every tenant,
# like a platform service. The shipped tests still pass (their inventory has no such group).
SHARED_RULES = '''
shared_flows := [flow |
	some t, tenant in tenants
	not tenant.quarantined
	not tenant.revoked
	some dg, dgroup in tenant.groups
	object.get(dgroup.labels, "shared", "") == "true"
	not dgroup.quarantined
	not dgroup.revoked
	sources := [s | some s in every_tenant_source; not startswith(s, concat("", [t, "/"]))]
	count(sources) > 0
	some proto, ports in dgroup.exposed
	count(ports) > 0
	flow := {
		"dst_tenant": t, "dst_group": dg, "proto": proto, "ports": ports,
		"reason": "shared-service", "sources": sources,
	}
]

allow_reasons contains sprintf("shared-service: %s is shared with every tenant", [label(dst)]) if {
	src.tenant != dst.tenant
	object.get(tenants[dst.tenant].groups[dst.group].labels, "shared", "") == "true"
	exposed
}
'''
ALLOWED = "allowed_flows := array.concat(array.concat(intra_tenant_flows, platform_flows), granted_flows)"


def edited_policy(where: Path) -> Path:
    folder = where / "my-rego"
    shutil.copytree(REGO_DIR, folder)
    flows = folder / "flows.rego"
    text = flows.read_text(encoding="utf-8")
    assert ALLOWED in text, "flows.rego changed: update this test's policy edit"
    text = text.replace(ALLOWED, "allowed_flows := array.concat(array.concat(array.concat(intra_tenant_flows, "
                                 "platform_flows), granted_flows), shared_flows)")
    flows.write_text(text + SHARED_RULES, encoding="utf-8")
    return folder


class Shots:
    """Screenshots (artifacts) and every CSP violation or page error the browser reports."""

    def __init__(self) -> None:
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        self.problems: list[str] = []
        self.taken: list[str] = []

    def watch(self, page: Any) -> Any:
        page.on("console", lambda m: self.problems.append(m.text) if (
            m.type == "error" and ("Content Security Policy" in m.text or "Refused" in m.text)) else None)
        page.on("pageerror", lambda e: self.problems.append(f"page error: {e}"))
        return page

    def take(self, page: Any, name: str) -> None:
        """A full-page screenshot, after checking that every visible form control has a label."""
        unlabelled = page.evaluate("""() => [...document.querySelectorAll('input, select, textarea')]
            .filter(e => e.type !== 'hidden' && !(e.labels && e.labels.length) && !e.getAttribute('aria-label'))
            .map(e => e.name || e.id)""")
        if unlabelled:
            self.problems.append(f"{name}: controls without a label: {unlabelled}")
        page.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=True)
        self.taken.append(name)


@pytest.fixture(scope="module")
def shots() -> Iterator[Shots]:
    s = Shots()
    yield s
    assert not s.problems, "the browser reported: " + "\n".join(s.problems)


MORE_TENANTS = ("initech", "hooli", "umbrella")


@pytest.fixture(scope="module")
def story(live: LiveServer) -> dict[str, str]:
    """What the stories hand on to each other (the grant id). Three more tenants, with grants among them
    (their api groups approve automatically), so the matrix and the log look like more than a demo."""
    env = live.env
    with env.ctx.db.session() as s:
        create_group(s, tenant="globex", name="docs", ports=[{"proto": "tcp", "port": 443}],
                     labels={"shared": "true"}, actor=Actor.system("seed"), clock=env.clock)
        for n, slug in enumerate(MORE_TENANTS):
            create_tenant(s, slug=slug, display_name=slug.title(), l3vni=3000 + n, actor=Actor.system("seed"),
                          clock=env.clock)
            create_group(s, tenant=slug, name="api", ports=[{"proto": "tcp", "port": 443}],
                         labels={"grants.trustfabric.io/auto-approve": "true"}, actor=Actor.system("seed"),
                         clock=env.clock)
            create_group(s, tenant=slug, name="batch", ports=[{"proto": "tcp", "port": 9000}],
                         actor=Actor.system("seed"), clock=env.clock)
    for src in MORE_TENANTS:
        for dst in MORE_TENANTS:
            if src != dst:
                r = env.call("POST", "/v1/grants", "tenant-admin", src, json={
                    "src_group": "batch", "dst_tenant": dst, "dst_group": "api", "proto": "tcp", "ports": [443],
                    "ttl_seconds": 86400, "justification": "nightly sync"})
                assert r.status_code == 201 and r.json()["state"] == "active", r.text
    return {}


def signed_in_page(browser: Any, live: LiveServer, shots: Shots, role: str, tenant: str | None = None,
                   shot: str | None = None) -> Any:
    context = browser.new_context(viewport={"width": 1366, "height": 860}, accept_downloads=True)
    page = shots.watch(context.new_page())
    page.goto(f"{live.url}/console/")
    assert "/console/login" in page.url
    if shot:
        shots.take(page, shot)
    page.get_by_label("API token").fill(live.env.token(role, tenant))
    page.get_by_role("button", name="Sign in with the token").click()
    page.wait_for_url(lambda url: "/console/login" not in url)
    return page


def a_tenant_requests_a_grant_and_sees_it_pending_with_the_approver(
        browser: Any, live: LiveServer, shots: Shots, story: dict[str, str]) -> None:
    page = signed_in_page(browser, live, shots, "tenant-admin", "acme", shot="sign-in")
    assert page.url.endswith("/console/tenants/acme")
    assert page.get_by_text("spiffe://example.org/tenant/acme/group/web/web-1").is_visible()
    shots.take(page, "tenant")
    page.get_by_role("link", name="Grants").click()
    previews: list[str] = []  # the live answer's GETs: their URLs carry the request, never the form's secrets
    page.on("request", lambda r: previews.append(r.url) if "/console/grants/preview" in r.url else None)
    page.get_by_label("From my group").select_option("web")
    page.get_by_label("To tenant").fill("globex")
    page.get_by_label("Group", exact=True).fill("api")
    preview = page.locator("#preview")
    for port in ("9999", "8443"):  # globex/api does not expose 9999 and does expose 8443: acme is told neither
        with page.expect_response(lambda r, p=port: "/console/grants/preview" in r.url and f"ports={p}" in r.url):
            page.get_by_label("Ports").fill(port)
        preview.get_by_text("Answered when you submit the request.").wait_for()
        assert "undisclosed: tenant acme holds no grant with globex/api" in preview.inner_text()
    assert not [u for u in previews if "csrf=" in u or "idempotency_key=" in u], previews
    page.get_by_label("Why").fill("feature store reads")
    shots.take(page, "grant-request")
    page.get_by_role("button", name="Request the grant").click()
    page.wait_for_url(re.compile(r".*/console/grants/g-[0-9a-f-]+\?notice=requested"))
    assert page.locator("h1 .badge").inner_text() == "pending"
    assert page.locator("dd.waiting").inner_text().startswith("tenant-admin:globex")
    story["grant"] = page.url.split("/console/grants/")[1].split("?")[0]
    shots.take(page, "grant")


def the_destination_tenant_approves_it(browser: Any, live: LiveServer, shots: Shots, story: dict[str, str]) -> None:
    grant = story["grant"]
    page = signed_in_page(browser, live, shots, "tenant-admin", "globex")
    page.get_by_role("link", name="Grants").click()
    waiting = page.locator("section", has=page.get_by_role("heading", name="Waiting for your approval"))
    assert grant in waiting.inner_text()
    shots.take(page, "approvals")
    page.get_by_role("button", name=f"Approve grant {grant}").click()
    page.wait_for_url(re.compile(rf".*/console/grants/{grant}\?notice=approved"))
    assert page.locator("h1 .badge").inner_text() == "active"
    assert "tenant-admin:globex by tenant-admin-" in page.locator("dl.facts").inner_text()


def the_security_team_uploads_a_change_sees_its_impact_and_activates_it(
        browser: Any, live: LiveServer, shots: Shots, story: dict[str, str], tmp_path: Path) -> None:
    page = signed_in_page(browser, live, shots, "security")
    assert page.url.endswith("/console/policy")
    page.get_by_label("Folder", exact=True).set_input_files(edited_policy(tmp_path))
    page.get_by_label("Note").fill("shared services: groups labelled shared=true serve every tenant")
    shots.take(page, "policy")
    page.get_by_role("button", name="Upload and test").click()
    page.wait_for_url(re.compile(r".*/console/policy/versions/2\?notice=uploaded"))
    assert "all" in page.locator("#tests-h").inner_text() and "passed" in page.locator("#tests-h").inner_text()
    # globex/docs becomes reachable from every other tenant's groups: acme's 2 and 2 in each of 3 more
    page.locator("#impact").get_by_text("Opens 8 flows, closes 0").wait_for()
    assert "globex" in page.locator("#impact").inner_text()
    shots.take(page, "version")
    page.get_by_role("link", name="Activate version 2…").click()
    assert "opens 8 flows and closes 0" in page.locator(".impact-summary").inner_text()
    page.get_by_label("Reason").fill("CHG-42 shared docs service")
    shots.take(page, "activate-confirm")
    page.get_by_role("button", name="Yes, activate: open 8, close 0 flows").click()
    page.wait_for_url(re.compile(r".*/console/policy/versions/2\?notice=activated"))
    assert page.locator("h1 .badge").inner_text() == "active"

    page.get_by_role("link", name="Flow matrix").click()
    page.get_by_role("link", name="3 flows from acme to globex").focus()  # the grant + the two shared flows
    page.keyboard.press("Enter")  # keyboard use: a cell is a link
    cell = page.locator("#cell")
    cell.get_by_text("3 flows from acme to globex").wait_for()
    text = cell.inner_text()
    assert f"grant:{story['grant']}" in text and "shared-service" in text
    shots.take(page, "flow-matrix")

    page.get_by_role("link", name="Explain").click()
    page.get_by_label("Source").fill("acme/web")
    page.get_by_label("Destination").fill("globex/docs")
    page.get_by_label("Port").fill("443")
    page.get_by_role("button", name="Explain").click()
    assert "ALLOW" in page.locator(".verdict").inner_text()
    assert "shared-service: globex/docs is shared with every tenant" in page.locator(".reasons").inner_text()
    shots.take(page, "explain")

    page.goto(f"{live.url}/console/tenants/globex")
    assert page.get_by_role("button", name="Quarantine tenant globex").is_visible()
    shots.take(page, "tenant-security")
    page.get_by_role("link", name="CA").click()
    page.locator("svg[role=img]").wait_for()
    assert "active" in page.locator("table").inner_text()
    shots.take(page, "ca")


def an_auditor_filters_checks_a_proof_and_exports_a_verifiable_file(
        browser: Any, live: LiveServer, shots: Shots, story: dict[str, str], tmp_path: Path) -> None:
    page = signed_in_page(browser, live, shots, "auditor")
    page.get_by_label("Action").fill("grant.approve")
    page.get_by_role("button", name="Filter").click()
    page.wait_for_url(re.compile(r".*/console/audit\?.*action=grant\.approve.*"))
    rows = page.locator("table tbody tr")
    assert rows.count() == 1 and story["grant"] in rows.first.inner_text()
    approver = rows.first.locator("td").nth(2).get_by_role("link")
    who = approver.inner_text()
    assert who.startswith("tenant-admin-") and who.endswith("@globex"), who  # its subject, then its tenant
    approver.click()  # every event of that actor: its sign-in (a session token minted) and the approval
    page.wait_for_url(re.compile(r".*/console/audit\?actor=.*"))
    assert page.get_by_label("Actor").input_value() == who
    actors = [t.strip() for t in page.locator("table tbody tr td:nth-child(3) a").all_inner_texts()]
    assert len(actors) >= 2 and set(actors) == {who}
    shots.take(page, "audit")
    page.locator("table tbody tr", has_text="grant.approve").get_by_role("link").first.click()
    assert page.locator("h1 .badge").inner_text() == "verified"
    assert page.locator("ol.checks li.ok").count() == 3
    shots.take(page, "audit-event")

    page.get_by_role("link", name="Export").click()
    page.get_by_label("Format").select_option("jsonl")
    shots.take(page, "export")
    with page.expect_download() as got:
        page.get_by_role("button", name="Download the export").click()
    export = tmp_path / "audit-export.jsonl"
    got.value.save_as(export)
    with page.expect_download() as got_key:
        page.get_by_role("link", name="the audit public key").click()
    key = tmp_path / "audit.pub"
    got_key.value.save_as(key)
    cli = Path(sys.executable).parent / "trustfabric"
    done = subprocess.run([str(cli), "audit", "verify", str(export), "--public-key", str(key)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    assert story["grant"] in export.read_text(encoding="utf-8")

    page.get_by_role("link", name="Decisions").click()
    assert "grant" in page.locator("table").inner_text()
    shots.take(page, "decisions")


def test_the_three_users_stories_in_a_browser(browser: Any, live: LiveServer, shots: Shots, story: dict[str, str],
                                              tmp_path: Path) -> None:
    """One test, the stories in order (each builds on the one before: the grant requested is the one approved,
    shown in the matrix, and found by the auditor); a failure names its step."""
    a_tenant_requests_a_grant_and_sees_it_pending_with_the_approver(browser, live, shots, story)
    the_destination_tenant_approves_it(browser, live, shots, story)
    the_security_team_uploads_a_change_sees_its_impact_and_activates_it(browser, live, shots, story, tmp_path)
    an_auditor_filters_checks_a_proof_and_exports_a_verifiable_file(browser, live, shots, story, tmp_path)
    assert {"sign-in", "tenant", "grant-request", "grant", "approvals", "policy", "version", "activate-confirm",
            "flow-matrix", "explain", "tenant-security", "ca", "audit", "audit-event", "export",
            "decisions"} <= set(shots.taken)
