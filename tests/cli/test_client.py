"""The CLI's HTTP client pointed at the wrong URL: one line naming the URL, never the answer's page."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

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


def test_walking_pages_stops_when_the_cursor_repeats_or_never_ends() -> None:
    """A listing is fetched until its last page, and no further: a cursor handed back twice (A, B, A) or an
    endless run of new ones is ApiError naming the listing, after as many requests as it takes to tell."""
    from cli.remote.client import ApiError, walk_pages

    asked: list[Any] = []

    def pages(answers: dict[Any, tuple[list[Any], Any]]) -> Callable[[Any], tuple[list[Any], Any]]:
        def fetch(cursor: Any) -> tuple[list[Any], Any]:
            asked.append(cursor)
            return answers[cursor]
        return fetch

    done = pages({None: ([1, 2], "a"), "a": ([3], 9), 9: ([4], "")})
    assert walk_pages(done, "/v1/x") == [1, 2, 3, 4] and asked == [None, "a", 9]
    asked.clear()
    assert walk_pages(pages({None: ([1], None)}), "/v1/x") == [1]
    asked.clear()
    looping = pages({None: ([], 7), 7: ([1], 5), 5: ([2], 7)})  # A, B, A
    with pytest.raises(ApiError, match=r"of /v1/devices/leaf1/versions does not advance: .* 7 again after 3 pages"):
        walk_pages(looping, "/v1/devices/leaf1/versions")
    assert asked == [None, 7, 5]
    with pytest.raises(ApiError, match="did not end within 4 pages"):
        walk_pages(lambda c: ([c], (c or 0) + 1), "/v1/x", max_pages=4)


class _EndlessVersions(BaseHTTPRequestHandler):
    """A server whose device versions always have a next page, the same one."""

    def do_GET(self) -> None:
        body = b'{"items": [], "next_before": 5}'
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


def test_device_versions_ends_with_one_line_when_the_paging_never_does(tmp_path: Path) -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _EndlessVersions)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        r = run_cli(["device", "versions", "nic:gpu1", "--server", f"http://127.0.0.1:{server.server_address[1]}"],
                    {"TRUSTFABRIC_CONFIG": str(tmp_path / "none.yaml"), "TRUSTFABRIC_TOKEN": "t"})
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
    assert r.returncode == 1 and r.stderr.count("\n") == 1 and "does not advance" in r.stderr, r.stderr
