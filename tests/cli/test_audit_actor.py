"""`trustfabric audit events` names an actor with its tenant (`alice@acme`), filters by it (`--actor alice@acme`,
`--actor-tenant`), against the real API; a local command's operator acts for the platform (no tenant)."""

from __future__ import annotations

from typing import Any

from tests.cli.conftest import Cli


def test_audit_events_show_and_filter_the_actors_tenant(cli: Cli) -> None:
    admin = cli.token("--role", "admin", "--ttl", "1h")
    for slug, vni in (("acme", "10001"), ("globex", "10002")):
        assert cli.run("tenant", "create", slug, "--display-name", slug.title(), "--l3vni", vni, "--prefix",
                       f"10.{vni[-1]}.0.0/16", token=admin).returncode == 0
    alices = {t: cli.token("--role", "tenant-admin", "--tenant", t, "--subject", "alice", "--ttl", "1h")
              for t in ("acme", "globex")}
    for tenant, group in (("acme", "web"), ("globex", "api")):
        r = cli.run("group", "create", tenant, group, "--port", "tcp/443", token=alices[tenant])
        assert r.returncode == 0, r.stderr

    def actors(*args: str) -> list[tuple[str, Any]]:
        items: Any = cli.json("audit", "events", "--action", "group.create", *args, token=admin)
        return [(e["actor"]["id"], e["actor"].get("tenant")) for e in items]

    assert actors("--actor", "alice") == [("alice", "acme"), ("alice", "globex")]
    assert actors("--actor", "alice@acme") == [("alice", "acme")]
    assert actors("--actor", "alice", "--actor-tenant", "globex") == [("alice", "globex")]
    table = cli.run("audit", "events", "--action", "group.create", token=admin, COLUMNS="120")
    assert table.returncode == 0, table.stderr
    assert "alice@acme" in table.stdout and "alice@globex" in table.stdout, table.stdout
    r = cli.run("audit", "events", "--actor-tenant", "Not_A_Slug", token=admin)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "Traceback" not in r.stderr, r.stderr
    # the local `token create` above was the server host's operator: a platform actor, of no tenant
    created: Any = cli.json("audit", "events", "--action", "token.create", token=admin)
    operator = [e["actor"] for e in created if e["actor"]["kind"] != "system"]  # the others are init's
    assert len(operator) == 3 and all(set(a) == {"id", "kind"} and a["id"].startswith("cli:") for a in operator)


def test_a_generated_subject_is_found_as_login_prints_it(cli: Cli) -> None:
    """`token create` without --subject names the token itself; `login` prints that subject, and the audit log's
    `--actor` finds its events by it (an `@` in it read as `id@tenant`: `tenant-admin@acme-1a2b3c` found
    nothing and grants printed `requested by tenant-admin@acme-1a2b3c@acme`)."""
    admin = cli.token("--role", "admin", "--ttl", "1h")
    r = cli.run("tenant", "create", "initech", "--display-name", "Initech", token=admin)
    assert r.returncode == 0, r.stderr
    made = cli.run("token", "create", "--role", "tenant-admin", "--tenant", "initech", "--ttl", "1h")
    assert made.returncode == 0, made.stderr
    subject = made.stdout.split(" for ", 1)[1].split(" (", 1)[0]
    assert "@" not in subject and subject.startswith("tenant-admin-"), subject
    assert made.stdout.split(" (", 1)[1].startswith("tenant-admin@initech)")
    token = made.stdout.strip().splitlines()[-1]
    r = cli.run("group", "create", "initech", "web", "--port", "tcp/443", token=token)
    assert r.returncode == 0, r.stderr
    found: Any = cli.json("audit", "events", "--actor", subject, "--action", "group.create", token=admin)
    assert [(e["actor"]["id"], e["actor"]["tenant"]) for e in found] == [(subject, "initech")]
    assert cli.json("audit", "events", "--actor", f"{subject}@initech", "--action", "group.create",
                    token=admin) == found
