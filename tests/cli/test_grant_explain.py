"""`trustfabric grant explain`: the answer `grant request` with the same options would get now, against the
served API (GET /v1/policy/explain-grant): approved, pending and whom it waits for, denied and why,
undisclosed toward another tenant's group the tenant holds no grant with, the RoCEv2 note; nothing is
written (no grant, no audit event); the same options and one-line errors as `grant request`."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.cli.conftest import Cli, Run

GLOBEX_API = ("--src-group", "web", "--dst", "globex/api", "--port", "443", "--ttl", "2h")


@pytest.fixture(scope="module")
def world(cli: Cli) -> dict[str, str]:
    """acme/web, acme/train; globex/api (tcp/443), globex/open (tcp/443, auto-approve), globex/gpu (RoCEv2)."""
    admin = cli.token("--role", "admin", "--ttl", "1h")
    for slug in ("acme", "globex"):
        assert cli.run("tenant", "create", slug, "--display-name", slug.title(), token=admin).returncode == 0
    for tenant, group, extra in (("acme", "web", ("--port", "tcp/443")), ("acme", "train", ("--port", "udp/4791")),
                                 ("globex", "api", ("--port", "tcp/443")),
                                 ("globex", "open", ("--port", "tcp/443", "--label",
                                                     "grants.trustfabric.io/auto-approve=true")),
                                 ("globex", "gpu", ("--port", "udp/4791"))):
        r = cli.run("group", "create", tenant, group, *extra, token=admin)
        assert r.returncode == 0, r.stderr
    return {"admin": admin, "acme": cli.token("--role", "tenant-admin", "--tenant", "acme", "--ttl", "1h")}


def written(cli: Cli, admin: str) -> tuple[int, int]:
    """(grants, audit events) on the server."""
    grants = cli.json("grant", "list", token=admin)
    events = cli.json("audit", "events", "--limit", "1000", token=admin)
    assert isinstance(grants, list) and isinstance(events, list)
    return len(grants), len(events)


def one_line_error(r: Run) -> bool:
    return r.stderr.startswith("error: ") and r.stderr.count("\n") == 1 and "Traceback" not in r.stderr


def test_toward_a_group_the_tenant_holds_no_grant_with_the_answer_is_undisclosed(cli: Cli,
                                                                                  world: dict[str, str]) -> None:
    before = written(cli, world["admin"])
    r = cli.run("grant", "explain", *GLOBEX_API, token=world["acme"])
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0] == "undisclosed until requested: acme/web -> globex/api tcp/443 for 2h (nothing was requested)"
    assert lines[1].startswith("  reason: undisclosed: tenant acme holds no grant with globex/api") and len(lines) == 2
    out: Any = cli.json("grant", "explain", *GLOBEX_API, token=world["acme"])
    assert (out["outcome"], out["approvers"], out["notes"]) == ("undisclosed", [], [])
    # the same for a group that does not exist, so nothing is learnt from asking
    nope: Any = cli.json("grant", "explain", "--src-group", "web", "--dst", "globex/nope", "--port", "443",
                         "--ttl", "2h", token=world["acme"])
    assert nope["outcome"] == "undisclosed"
    # a platform principal names the source tenant and sees the whole answer: pending, and with whom
    r = cli.run("grant", "explain", *GLOBEX_API, "--src-tenant", "acme", token=world["admin"])
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[:2] == [
        "would be pending: acme/web -> globex/api tcp/443 for 2h (nothing was requested)",
        "  would wait for: tenant-admin:globex"]
    assert "  reason: approval-needed: tenant-admin:globex" in r.stdout.splitlines()
    assert written(cli, world["admin"]) == before  # no grant, no audit event


def test_allowed_pending_and_denied_answers(cli: Cli, world: dict[str, str]) -> None:
    before = written(cli, world["admin"])
    auto = cli.run("grant", "explain", "--src-group", "web", "--dst", "globex/open", "--port", "443",
                   "--src-tenant", "acme", token=world["admin"])
    assert auto.returncode == 0, auto.stderr
    assert auto.stdout.splitlines()[0].startswith("would be approved: acme/web -> globex/open tcp/443 for 1d")
    assert "  reason: auto-approve: globex/open is labelled for automatic approval" in auto.stdout.splitlines()
    assert written(cli, world["admin"]) == before

    # once acme holds a request with globex/api, its own answers about that group are whole
    asked: Any = cli.json("grant", "request", *GLOBEX_API, token=world["acme"])
    assert asked["state"] == "pending"
    before = written(cli, world["admin"])
    pending: Any = cli.json("grant", "explain", "--src-group", "web", "--dst", "globex/api", "--port", "443",
                            "--ttl", "1h", token=world["acme"])
    assert (pending["outcome"], pending["approvers"]) == ("pending", ["tenant-admin:globex"])
    assert pending["input"]["src"] == {"tenant": "acme", "group": "web"} and pending["policy_hash"]
    denied = cli.run("grant", "explain", "--src-group", "web", "--dst", "globex/api", "--port", "22",
                     token=world["acme"])
    assert denied.returncode == 1 and denied.stderr == ""  # exit 1 when it would be denied, as `grant request`
    lines = denied.stdout.splitlines()
    assert lines[0] == "would be denied: acme/web -> globex/api tcp/22 for 1d (nothing was requested)"
    assert "  reason: port-not-exposed: globex/api does not expose tcp/22" in lines
    as_json = cli.run("grant", "explain", "--src-group", "web", "--dst", "globex/api", "--port", "22", "--json",
                      token=world["acme"])
    assert as_json.returncode == 1 and json.loads(as_json.stdout)["outcome"] == "deny"
    assert one_line_error(as_json) and "would be denied: port-not-exposed" in as_json.stderr
    assert written(cli, world["admin"]) == before


def test_a_udp_4791_answer_carries_the_rocev2_note(cli: Cli, world: dict[str, str]) -> None:
    r = cli.run("grant", "explain", "--src-group", "train", "--dst", "globex/gpu", "--proto", "udp", "--port", "4791",
                "--src-tenant", "acme", token=world["admin"])
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].startswith("would be pending: acme/train -> globex/gpu udp/4791")
    assert lines[-1] == ("  note: rocev2-mirror: udp/4791 is RoCEv2, symmetric on the SuperNICs: globex/gpu's "
                         "RoCEv2 can also reach acme/train, with no grant of its own")
    tcp: Any = cli.json("grant", "explain", "--src-group", "web", "--dst", "globex/api", "--port", "443",
                        "--src-tenant", "acme", token=world["admin"])
    assert tcp["notes"] == []


def test_bad_input_is_one_line_and_a_non_zero_exit(cli: Cli, world: dict[str, str]) -> None:
    before = written(cli, world["admin"])
    for args, says in ((("--src-group", "web", "--dst", "globex", "--port", "443"), "--dst"),
                       (("--src-group", "Web!", "--dst", "globex/api", "--port", "443"), "--src-group"),
                       (("--src-group", "web", "--dst", "globex/api", "--port", "99999"), "--port"),
                       (("--src-group", "web", "--dst", "globex/api", "--port", "443", "--proto", "icmp"), "--proto"),
                       (("--src-group", "web", "--dst", "globex/api", "--port", "443", "--ttl", "soon"), "--ttl"),
                       (("--dst", "globex/api", "--port", "443"), "--src-group")):
        r = cli.run("grant", "explain", *args, token=world["acme"])
        assert r.returncode == 2 and one_line_error(r) and says in r.stderr and r.stdout == "", (args, r.stderr)
    # the API's refusals too: another tenant's source, a platform principal without one
    r = cli.run("grant", "explain", *GLOBEX_API, "--src-tenant", "globex", token=world["acme"])
    assert r.returncode == 1 and one_line_error(r) and "HTTP 403" in r.stderr, r.stderr
    r = cli.run("grant", "explain", *GLOBEX_API, token=world["admin"])
    assert r.returncode == 1 and one_line_error(r) and "src_tenant is required" in r.stderr, r.stderr
    # the API's field is src_tenant, the command line's option --src-tenant: the message names both (it named only
    # the field, which no command line takes), for `grant request` as for `grant explain`
    assert "`--src-tenant`" in r.stderr, r.stderr
    r = cli.run("grant", "request", *GLOBEX_API, token=world["admin"])
    assert r.returncode == 1 and one_line_error(r) and "`--src-tenant`" in r.stderr, r.stderr
    assert written(cli, world["admin"]) == before


def test_explain_takes_exactly_request_s_options_and_says_what_it_does(cli: Cli) -> None:
    from tests.cli.test_bad_arguments import leaf_commands

    commands = {" ".join(path): cmd for path, cmd in leaf_commands()}
    opts = {name: sorted((p.name, tuple(p.opts), getattr(p, "required", False), p.default) for p in
                         commands[name].params) for name in ("grant request", "grant explain")}
    assert opts["grant explain"] == opts["grant request"]
    r = cli.run("grant", "explain", "--help", COLUMNS="120")
    assert r.returncode == 0 and "What `grant request` with these options would get now" in " ".join(r.stdout.split())
    assert "nothing is requested or recorded" in " ".join(r.stdout.split())
    r = cli.run("grant", "--help", COLUMNS="120")
    assert r.returncode == 0 and "explain" in r.stdout
