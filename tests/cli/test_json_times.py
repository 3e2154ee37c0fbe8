"""--json of a local command writes times as the API does (ISO 8601 UTC with `Z`), so a script reading
`token create --json` and `token show --json` (over the API) reads one object, one time format."""

from __future__ import annotations

import re
from datetime import datetime, timedelta, timezone

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
