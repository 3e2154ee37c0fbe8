"""/docs and /redoc work air-gapped: Debian's Chromium (through Playwright, no browser download: the session's
`browser` of tests/conftest.py) renders both
pages from a server on 127.0.0.1 while every request to any other host is refused -- and none is even tried:
the pages' Content-Security-Policy keeps the browser on this host (ReDoc's bundle would fetch a logo from
its vendor's CDN; the console records that as a CSP violation, never as a request)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.api.conftest import make_settings, open_env
from tests.policy.conftest import free_port
from tests.servers import serve_app

pytestmark = pytest.mark.xdist_group("browser")


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    env = open_env(make_settings(tmp_path_factory.mktemp("docs") / "home"))
    try:
        with serve_app(env.app, free_port()) as url:
            yield url
    finally:
        env.client.close()
        env.ctx.close()


def _open_offline(browser: object, base: str) -> tuple[object, list[str]]:
    """A page that may reach only `base`; every other URL is aborted and recorded."""
    refused: list[str] = []
    context = browser.new_context()  # type: ignore[attr-defined]

    def route(r: object) -> None:
        url = r.request.url  # type: ignore[attr-defined]
        if url.startswith(base + "/") or url.startswith("data:") or url.startswith("blob:"):
            r.continue_()  # type: ignore[attr-defined]
        else:
            refused.append(url)
            r.abort()  # type: ignore[attr-defined]

    context.route("**/*", route)
    page = context.new_page()
    page.on("console", lambda m: refused.append("csp: " + m.text) if "Content Security Policy" in m.text and
            "redoc.ly" not in m.text else None)
    return page, refused


def test_swagger_ui_renders_with_no_network(browser: object, served: str) -> None:
    page, refused = _open_offline(browser, served)
    page.goto(f"{served}/docs")  # type: ignore[attr-defined]
    page.wait_for_selector(".opblock-summary", timeout=30_000)  # type: ignore[attr-defined]
    operations = page.locator(".opblock-summary").count()  # type: ignore[attr-defined]
    assert operations > 30
    assert page.get_by_text("Audit events, oldest first").count() >= 1  # type: ignore[attr-defined]
    assert refused == []


def test_redoc_renders_with_no_network(browser: object, served: str) -> None:
    page, refused = _open_offline(browser, served)
    page.goto(f"{served}/redoc")  # type: ignore[attr-defined]
    page.get_by_text("Audit events, oldest first").first.wait_for(  # type: ignore[attr-defined]
        state="attached", timeout=30_000)  # in the side menu, folded under its tag
    assert page.locator("h1").first.inner_text().startswith("trustfabric")  # type: ignore[attr-defined]
    assert refused == []


def test_the_assets_ship_with_their_licences() -> None:
    static = Path(__file__).resolve().parents[2] / "api" / "static" / "docs"
    for name in ("swagger-ui/swagger-ui-bundle.js", "swagger-ui/swagger-ui.css", "swagger-ui/LICENSE",
                 "redoc/redoc.standalone.js", "redoc/LICENSE", "VERSIONS.txt"):
        assert (static / name).is_file(), name
