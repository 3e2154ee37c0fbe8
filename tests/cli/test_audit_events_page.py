"""`audit events` shows one page, oldest first: when more events follow it, it says so on stderr (stdout stays the
table or the JSON list), instead of ending as if the log ended there."""

from __future__ import annotations

import json

from tests.cli.conftest import Cli


def test_a_full_page_says_more_events_follow(cli: Cli) -> None:
    admin = cli.token("--role", "admin", "--ttl", "1h")
    total = len(cli.json("audit", "events", "--limit", "1000", token=admin))
    assert total > 2  # init's events and the token's
    cut = cli.run("audit", "events", "--limit", "2", token=admin)
    assert cut.returncode == 0 and "more events follow" in cut.stderr and "--since" in cut.stderr, cut.stderr
    as_json = cli.run("audit", "events", "--limit", "2", "--json", token=admin)
    assert len(json.loads(as_json.stdout)) == 2 and "more events follow" in as_json.stderr
    whole = cli.run("audit", "events", "--limit", "1000", token=admin)
    assert whole.returncode == 0 and "more events follow" not in whole.stderr, whole.stderr
    exact = cli.run("audit", "events", "--limit", str(total), token=admin)  # a full page that is the whole log
    assert exact.returncode == 0 and "more events follow" not in exact.stderr, exact.stderr
