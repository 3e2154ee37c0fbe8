"""The CLI's HTTP client pointed at the wrong URL: one line naming the URL, never the answer's page."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from tests.cli.conftest import Cli, run_cli
from tests.cli.conftest import cli as cli  # the fixture


class _NotTheApi(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_error(404)  # an HTML page over several lines, as a web server or a proxy answers

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def other_server() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _NotTheApi)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def test_a_server_that_is_not_the_api_is_named_in_one_line(other_server: str, tmp_path: Path) -> None:
    env: dict[str, str | None] = {"TRUSTFABRIC_CONFIG": str(tmp_path / "c.yaml"), "TRUSTFABRIC_TOKEN": "t"}
    r = run_cli(["grant", "list", "--server", other_server], env)
    assert r.returncode == 1 and r.stderr.count("\n") == 1 and "<" not in r.stderr, r.stderr
    assert r.stderr.startswith(f"error: {other_server} answered GET /v1/grants"), r.stderr
    assert "is it the trustfabric API's URL?" in r.stderr, r.stderr


def test_a_wrong_base_path_is_told_apart_from_a_missing_object(cli: Cli) -> None:
    admin = cli.token("--role", "admin")
    r = cli.run("tenant", "list", "--server", cli.env["TRUSTFABRIC_SERVER"] + "/api", token=admin)
    assert r.returncode == 1 and r.stderr.count("\n") == 1, r.stderr
    assert "has no route GET /api/v1/tenants" in r.stderr and "base URL" in r.stderr, r.stderr
    r = cli.run("tenant", "show", "nosuch", token=admin)  # the API's own 404 keeps its reason
    assert (r.returncode, r.stderr) == (1, "error: tenant 'nosuch' not found (HTTP 404)\n")
