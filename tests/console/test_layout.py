"""The console on a phone-sized screen (390 px wide): no page is wider than the screen. Wide tables scroll
inside their own box; forms stack their labels above their fields; hashes, keys and long ids wrap."""

from __future__ import annotations

from typing import Any

from tests.console.conftest import LiveServer
from tests.console.test_browser import Shots

PHONE = {"width": 390, "height": 844}
# (role, tenant, pages): every form layout (.grid) and every long unbreakable value the console shows
PAGES: list[tuple[str, str | None, list[str]]] = [
    ("tenant-admin", "acme", ["/console/tenants/acme", "/console/grants", "/console/explain"]),
    ("security", None, ["/console/policy", "/console/policy/versions/1", "/console/tenants/acme", "/console/ca"]),
    ("auditor", None, ["/console/audit", "/console/audit/events/1", "/console/audit/export", "/console/decisions"]),
]


def test_no_page_is_wider_than_a_phone(browser: Any, live: LiveServer) -> None:
    shots = Shots()
    too_wide = []
    for role, tenant, pages in PAGES:
        context = browser.new_context(viewport=PHONE)
        page = shots.watch(context.new_page())
        page.goto(f"{live.url}/console/login")
        page.get_by_label("API token").fill(live.env.token(role, tenant))
        page.get_by_role("button", name="Sign in with the token").click()
        page.wait_for_url(lambda url: "/console/login" not in url)
        for path in pages:
            response = page.goto(live.url + path)
            assert response is not None and response.status == 200, (path, response and response.status)
            page.wait_for_load_state("networkidle")
            width = page.evaluate("document.documentElement.scrollWidth")
            if width > PHONE["width"]:
                too_wide.append(f"{role} {path}: {width} px")
        shots.take(page, f"phone-{role}")
        context.close()
    assert not too_wide, "pages wider than a 390 px screen: " + "; ".join(too_wide)
    assert not shots.problems, shots.problems
