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


def test_newest_first_and_after_page_through_the_whole_log(cli: Cli) -> None:
    admin = cli.token("--role", "admin", "--ttl", "1h")
    whole = [e["seq"] for e in cli.json("audit", "events", "--limit", "1000", token=admin)]
    assert whole == sorted(whole) and len(whole) > 4
    newest = [e["seq"] for e in cli.json("audit", "events", "--newest", "--limit", "3", token=admin)]
    assert newest == sorted(whole, reverse=True)[:3]
    cut = cli.run("audit", "events", "--newest", "--limit", "3", token=admin)
    assert f"--newest --after {newest[-1]}" in cut.stderr, cut.stderr
    # page by page with --after, as the hint says: every event once, in order, both ways
    for order in ([], ["--newest"]):
        seen: list[int] = []
        args = ["audit", "events", *order, "--limit", "2"]
        while True:
            page = [e["seq"] for e in cli.json(*args, *(["--after", str(seen[-1])] if seen else []), token=admin)]
            if not page:
                break
            seen.extend(page)
        assert seen == (sorted(whole, reverse=True) if order else whole)
    assert cli.json("audit", "events", "--after", str(whole[-1]), token=admin) == []


def test_after_must_be_a_sequence_number(cli: Cli) -> None:
    admin = cli.token("--role", "admin", "--ttl", "1h")
    refused = cli.run("audit", "events", "--after", "-1", token=admin)
    assert refused.returncode == 2 and "Traceback" not in refused.stderr, refused.stderr


def test_an_after_beyond_any_sequence_number_is_usage(cli: Cli) -> None:
    """--after past the API's bound (2^53) is a bad argument, refused while parsing (2), as -1 is; it went to the
    server and came back as its 422, exit 1, a failure a script could not tell from a server that refused."""
    admin = cli.token("--role", "admin", "--ttl", "1h")
    refused = cli.run("audit", "events", "--after", str(2**53 + 1), token=admin)
    assert refused.returncode == 2 and refused.stderr.startswith("error: ") and "--after" in refused.stderr, refused
    assert cli.run("audit", "events", "--after", str(2**53), token=admin).returncode == 0
