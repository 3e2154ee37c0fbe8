"""--json of a local command writes times as the API does (ISO 8601 UTC with `Z`), so a script reading
`token create --json` and `token show --json` (over the API) reads one object, one time format."""

from __future__ import annotations

import re
from datetime import datetime, timedelta, timezone
from pathlib import Path

from tests.cli.conftest import Cli

API_TIME = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z$")


def test_token_create_and_revoke_print_the_api_s_token_object(cli: Cli) -> None:
    admin = cli.token("--role", "admin", "--ttl", "1h")
    created = cli.json("token", "create", "--role", "auditor", "--ttl", "1h")
    shown = cli.json("token", "show", created["id"], token=admin)
    assert {k: v for k, v in created.items() if k != "token"} == shown, (created, shown)
    assert API_TIME.match(created["expires_at"]) and API_TIME.match(created["created_at"]), created
    revoked = cli.json("token", "revoke", created["id"])
    assert revoked == cli.json("token", "show", created["id"], token=admin), revoked
    assert API_TIME.match(revoked["revoked_at"]), revoked
    yaml_out = cli.run("token", "create", "--role", "auditor", "-o", "yaml")
    assert yaml_out.returncode == 0 and re.search(r"^expires_at: '\S+Z'$", yaml_out.stdout, re.M), yaml_out.stdout


def test_a_time_is_written_in_utc_with_z_and_a_naive_one_read_as_utc() -> None:
    from cli.output import json_value

    plus_one = timezone(timedelta(hours=1))
    assert json_value(datetime(2026, 12, 2, 16, 17, 5, tzinfo=plus_one)) == "2026-12-02T15:17:05Z"
    assert json_value(datetime(2026, 12, 2, 15, 17, 5, 250000)) == "2026-12-02T15:17:05.250000Z"  # SQLite's naive
    assert json_value(timedelta(seconds=90)) == "0:01:30"  # anything else: its text, as before


def test_since_and_until_take_a_time_ago(cli: Cli) -> None:
    """`--since 1h`, as kubectl logs and journalctl take it: an operator's first question of a log is what happened
    lately, and an ISO time with its zone was the only form (`--since 1h` was refused). A bare number stays refused
    (it could be a year)."""
    admin = cli.token("--role", "admin", "--ttl", "1h")
    recent = cli.json("audit", "events", "--since", "1h", token=admin)
    assert recent and recent == cli.json("audit", "events", token=admin)[-len(recent):], recent  # all: made now
    assert cli.json("audit", "events", "--until", "1h", token=admin) == []  # nothing an hour old yet
    assert cli.json("policy", "decisions", "--since", "7d") == cli.json("policy", "decisions")
    for bad in ("2026", "1 h", "-1h", "1w"):
        r = cli.run("audit", "events", "--since", bad, token=admin)
        assert r.returncode == 2 and r.stderr.count("\n") == 1 and "a time ago (e.g. 30m, 1h, 7d)" in r.stderr, r.stderr


def test_every_local_json_time_is_the_api_s_form(cli: Cli, tmp_path: Path) -> None:
    """The local commands that wrote a time themselves (isoformat: `+00:00`) write the API's `Z` too: `svid issue`
    and `svid jwt` (the API's /v1/svid/* answer `Z`), `policy flows`, `audit verify`, `status`."""
    from tests.pki.helpers import make_csr

    admin = cli.token("--role", "admin", "--ttl", "1h")
    assert cli.run("tenant", "create", "tz", "--display-name", "Tz", token=admin).returncode == 0
    assert cli.run("group", "create", "tz", "web", "--port", "tcp/443", token=admin).returncode == 0
    assert cli.run("workload", "register", "tz/web/w1", token=admin).returncode == 0
    csr = tmp_path / "req.pem"
    csr.write_bytes(make_csr())
    wl = ("--tenant", "tz", "--group", "web", "--workload", "w1")
    assert API_TIME.match(cli.json("svid", "issue", "--csr", str(csr), *wl)["expires_at"])
    assert API_TIME.match(cli.json("svid", "jwt", *wl, "--audience", "a")["expires_at"])
    assert API_TIME.match(cli.json("policy", "flows", "--src-tenant", "tz", "--dst-tenant", "tz")["computed_at"])
    assert cli.run("audit", "export", "--out", str(tmp_path / "a.jsonl")).returncode == 0
    (tmp_path / "k.pem").write_text(cli.run("audit", "public-key").stdout)
    verified = cli.json("audit", "verify", str(tmp_path / "a.jsonl"), "--public-key", str(tmp_path / "k.pem"))
    assert API_TIME.match(verified["signed_at"]), verified
