"""`trustfabric audit download`: an auditor (or a tenant) off the server host takes the export `audit export` writes,
over the real API served in this process (real SQLite, the real key store), and `audit verify` proves it offline
with the audit public key. Nothing partial is ever left under the name asked for."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from audit.export.formats import read
from audit.export.records import Event
from audit.export.summary import summarize
from policy.decisionlog import verify_decision_export
from tests.cli.conftest import Cli, Run, ServedApi, run_cli


@dataclass
class World:
    cli: Cli
    key: Path  # the audit public key, as the operator hands it over (`audit public-key` on the host)
    admin: str
    acme: str  # acme's tenant admin


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    base = tmp_path_factory.mktemp("download")
    c = Cli(base / "home", "", base)
    assert c.run("init", "--trust-domain", "example.org").returncode == 0
    served = ServedApi(c.env)
    c.env["TRUSTFABRIC_SERVER"] = served.url
    try:
        admin = c.token("--role", "admin", "--ttl", "1h")
        for slug, vni in (("acme", "10001"), ("globex", "10002")):
            r = c.run("tenant", "create", slug, "--display-name", slug.title(), "--l3vni", vni, "--prefix",
                      f"10.{vni[-1]}.0.0/16", token=admin)
            assert r.returncode == 0, r.stderr
        tenants = {t: c.token("--role", "tenant-admin", "--tenant", t, "--ttl", "1h") for t in ("acme", "globex")}
        for tenant, groups in (("acme", ("web", "db", "batch")), ("globex", ("api", "ml"))):
            for group in groups:
                r = c.run("group", "create", tenant, group, "--port", "tcp/8443", token=tenants[tenant])
                assert r.returncode == 0, r.stderr
        # policy decisions in each tenant's log: a grant requested is decided, and the decision recorded
        for src, dst in (("acme", "globex/api"), ("globex", "acme/web"), ("acme", "globex/ml")):
            group = {"acme": "web", "globex": "api"}[src]
            r = c.run("grant", "request", "--src-group", group, "--dst", dst, "--port", "8443", "--ttl", "2h",
                      "-j", "download test", token=tenants[src])
            assert r.returncode in (0, 1), r.stderr  # approved, pending or denied: decided either way
        key = base / "audit.pem"
        key.write_text(c.run("audit", "public-key").stdout)
        yield World(c, key, admin, tenants["acme"])
    finally:
        served.stop()


def _verify(world: World, export: Path) -> Run:
    """`audit verify` offline: no data directory, no server, only the file and the key."""
    return run_cli(["audit", "verify", str(export), "--public-key", str(world.key)], {})


def _events(export: Path) -> list[dict[str, Any]]:
    """The selected events' signed documents (the exact hashed bytes, parsed), in order, from any format."""
    with export.open("rb") as fh:
        got = summarize(fh)
    with export.open("rb") as fh:
        records = list(read(fh))
    shown: list[dict[str, Any]] = []
    for rec in records:
        if isinstance(rec, Event):
            doc = json.loads(rec.data)
            if got.start <= doc["seq"] < got.end:
                shown.append(doc)
    return shown


def _nothing_left(out: Path) -> None:
    left = sorted(p.name for p in out.parent.iterdir() if p.name.startswith(out.name))
    assert left == [], left


@pytest.mark.parametrize("fmt", ["jsonl", "csv", "ocsf"])
def test_an_admin_downloads_what_the_local_export_writes_and_it_verifies(world: World, tmp_path: Path,
                                                                         fmt: str) -> None:
    selection = ["--tenant", "acme", "--action", "group.create", "--format", fmt]
    down, local = tmp_path / f"down.{fmt}", tmp_path / f"local.{fmt}"
    r = world.cli.run("audit", "download", "--out", str(down), *selection, token=world.admin)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("exported 3 event(s) of ") and f" to {down} ({fmt}); checkpoint size " in r.stdout
    assert r.stderr == "" and not down.with_name(down.name + ".part").exists()
    here = world.cli.run("audit", "export", "--out", str(local), *selection)  # on the host, the same line
    assert here.returncode == 0, here.stderr
    for export in (down, local):
        v = _verify(world, export)
        assert v.returncode == 0 and v.stdout.startswith("OK: 3 event(s) verified"), (export, v.stdout, v.stderr)
        assert "selection: action group.create, tenant acme" in v.stdout, v.stdout
    # each export signs the log as it is when made, and each one adds its own audit.export event: the two
    # checkpoints differ, so the bytes do; the events they carry are the same, byte for byte
    assert _events(down) == _events(local) and [e["object"]["id"] for e in _events(down)] == [
        "acme/web", "acme/db", "acme/batch"]
    # --json: the object `audit export --json` prints, with the same keys and counts
    dj, lj = tmp_path / f"dj.{fmt}", tmp_path / f"lj.{fmt}"
    got = json.loads(world.cli.run("audit", "download", "--out", str(dj), *selection, "--json",
                                   token=world.admin).stdout)
    want = json.loads(world.cli.run("audit", "export", "--out", str(lj), *selection, "--json").stdout)
    assert set(got) == set(want) and got["events"] == want["events"] == 3 and got["format"] == fmt
    assert got["out"] == str(dj) and got["checkpoint"].startswith("example.org/audit\n")


def test_the_selection_is_downloaded_as_exported_and_an_actor_selection_says_it_is_unproven(
        world: World, tmp_path: Path) -> None:
    out = tmp_path / "mine.jsonl"
    r = world.cli.run("audit", "download", "--out", str(out), "--actor-tenant", "acme", "--action", "group.create",
                      token=world.admin)
    assert r.returncode == 0 and r.stdout.startswith("exported 3 event(s)"), (r.stdout, r.stderr)
    assert r.stderr.startswith("note: the export is narrowed to the actors of tenant acme") and \
        "UNPROVEN (exit 3)" in r.stderr, r.stderr
    assert _verify(world, out).returncode == 3
    window = tmp_path / "window.csv"  # a time window: the context events beside it are not counted
    events = json.loads(world.cli.run("audit", "events", "--action", "group.create", "--json",
                                      token=world.admin).stdout)
    r = world.cli.run("audit", "download", "--out", str(window), "--format", "csv", "--since", events[1]["ts"],
                      "--until", events[3]["ts"], token=world.admin)
    assert r.returncode == 0 and _verify(world, window).returncode == 0, (r.stdout, r.stderr)
    assert [e["seq"] for e in _events(window)] == list(range(events[1]["seq"], events[3]["seq"]))
    assert r.stdout.startswith(f"exported {events[3]['seq'] - events[1]['seq']} event(s)"), r.stdout


def test_a_tenant_downloads_its_own_events_and_is_refused_another_tenants(world: World, tmp_path: Path) -> None:
    out = tmp_path / "acme.jsonl"
    r = world.cli.run("audit", "download", "--out", str(out), token=world.acme)
    assert r.returncode == 0, r.stderr
    v = _verify(world, out)
    assert v.returncode == 0 and "selection: tenant acme" in v.stdout, (v.stdout, v.stderr)  # the server's scope
    shown = _events(out)
    assert len(shown) >= 3 and {e["tenant"] for e in shown} == {"acme"}
    other = tmp_path / "globex.jsonl"
    r = world.cli.run("audit", "download", "--out", str(other), "--tenant", "globex", token=world.acme)
    assert r.returncode == 1 and r.stdout == "" and r.stderr.count("\n") == 1, (r.stdout, r.stderr)
    assert r.stderr.startswith("error: ") and "(HTTP 403)" in r.stderr and "Traceback" not in r.stderr, r.stderr
    _nothing_left(other)


def test_with_decisions_two_whole_files_and_a_tenant_gets_its_own_decisions(world: World, tmp_path: Path) -> None:
    out = tmp_path / "all.csv"
    r = world.cli.run("audit", "download", "--out", str(out), "--format", "csv", "--with-decisions",
                      token=world.admin)
    assert r.returncode == 0, r.stderr
    decisions = tmp_path / "all.csv.decisions.jsonl"  # the name `audit export --with-decisions` gives it
    lines = r.stdout.splitlines()
    assert len(lines) == 2 and lines[1].startswith("exported ") and f"decision record(s) to {decisions}" in lines[1]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["all.csv", "all.csv.decisions.jsonl"]
    assert _verify(world, out).returncode == 0
    every: list[dict[str, Any]] = []
    with decisions.open("rb") as fh:
        report = verify_decision_export(fh, every.append)
    assert report.count == len(every) and f"sha256 {report.sha256}" in lines[1]
    assert {"acme", "globex"} <= {d["tenant"] for d in every}
    mine = tmp_path / "acme.jsonl"
    j = world.cli.run("audit", "download", "--out", str(mine), "--with-decisions", "--json", token=world.acme)
    assert j.returncode == 0, j.stderr
    summary = json.loads(j.stdout)
    assert summary["decisions"]["out"] == str(tmp_path / "acme.jsonl.decisions.jsonl")
    own: list[dict[str, Any]] = []
    with open(summary["decisions"]["out"], "rb") as fh:
        header = verify_decision_export(fh, own.append).header
    assert header["filter"]["tenant"] == "acme" and own and {d["tenant"] for d in own} == {"acme"}
    assert [d["id"] for d in own] == [d["id"] for d in every if d["tenant"] == "acme"]
    assert summary["decisions"]["count"] == len(own) and _verify(world, mine).returncode == 0


def _cut_answers(monkeypatch: pytest.MonkeyPatch, *, fail: bool) -> None:
    """The export route's answers end halfway (on a line boundary): with `fail`, the server fails there (the
    connection drops mid-stream); without, the answer ends cleanly but short (a proxy's or a server's bug)."""
    from fastapi.responses import StreamingResponse

    import api.routes.audit as route

    class Cut(StreamingResponse):
        def __init__(self, content: Any, *args: Any, **kwargs: Any) -> None:
            def halfway() -> Iterator[bytes]:
                whole = b"".join(content)
                yield whole[: whole.rfind(b"\n", 0, len(whole) // 2) + 1]
                if fail:
                    raise RuntimeError("the export stream failed (test)")

            super().__init__(halfway(), *args, **kwargs)

    monkeypatch.setattr(route, "StreamingResponse", Cut)


@pytest.mark.parametrize("fail", [True, False], ids=["dropped", "short"])
@pytest.mark.parametrize("decisions", [False, True], ids=["export", "with-decisions"])
def test_an_answer_cut_short_leaves_no_file(world: World, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                            fail: bool, decisions: bool) -> None:
    _cut_answers(monkeypatch, fail=fail)
    out = tmp_path / "cut.jsonl"
    extra = ["--with-decisions"] if decisions else []
    r = world.cli.run("audit", "download", "--out", str(out), *extra, token=world.admin)
    assert r.returncode == 1 and r.stdout == "" and r.stderr.count("\n") == 1, (r.stdout, r.stderr)
    assert "Traceback" not in r.stderr, r.stderr
    if fail:  # the transfer itself ends early
        assert r.stderr.startswith(f"error: the answer from {world.cli.env['TRUSTFABRIC_SERVER']} was cut short"), \
            r.stderr
    elif decisions:  # a whole transfer of half a multipart answer: no closing boundary
        assert r.stderr == "error: the server's multipart answer ends before its closing boundary: it was cut short\n"
    else:  # a whole transfer of half an export: read back, it covers part of the log only
        assert r.stderr.startswith("error: the server's answer is not a whole export: the export covers the log up "
                                   "to position "), r.stderr
    _nothing_left(out)
    kept = tmp_path / "kept.jsonl"  # a file already there under that name stays as it was
    kept.write_bytes(b"yesterday's export\n")
    assert world.cli.run("audit", "download", "--out", str(kept), *extra, token=world.admin).returncode == 1
    assert kept.read_bytes() == b"yesterday's export\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["kept.jsonl"]


def test_bad_options_are_refused_before_any_request(world: World, tmp_path: Path) -> None:
    """Exit 2, one line, with a server that cannot be reached (a request would fail with exit 1) and nothing
    written; the same words as `audit export`."""
    out = tmp_path / "x.jsonl"
    cases = [
        (["--out", str(tmp_path / "no" / "x.jsonl")], "does not exist"),
        (["--out", str(out), "--since", "2026-02-01T00:00:00Z", "--until", "2026-01-01T00:00:00Z"],
         "--since must be before --until"),
        (["--out", str(out), "--format", "xml"], "xml"),
        (["--out", str(out), "--actor", ""], "is not an actor id"),
    ]
    for args, says in cases:
        r = world.cli.run("audit", "download", *args, token=world.admin, TRUSTFABRIC_SERVER="http://127.0.0.1:9")
        assert r.returncode == 2 and r.stderr.count("\n") == 1 and says in r.stderr, (args, r.stderr)
        local = world.cli.run("audit", "export", *args)
        assert local.returncode == 2 and local.stderr == r.stderr.replace("audit download", "audit export"), (
            args, local.stderr, r.stderr)
    assert list(tmp_path.iterdir()) == []


def test_download_and_export_share_their_options(world: World) -> None:
    from cli.main import _command

    def options(verb: str) -> dict[str, tuple[str, ...]]:
        cmd = _command().commands["audit"].commands[verb]  # type: ignore[attr-defined]
        return {p.name: tuple(p.opts) for p in cmd.params if p.name not in ("server", "cacert")}

    assert options("download") == options("export")
    assert len(options("download")) == 12  # the export's 10, --output/-o and --json


def test_the_bytes_come_from_the_api_not_the_data_directory(world: World, tmp_path: Path) -> None:
    """Off the host: no data directory at all, only the server's URL and a token."""
    out = tmp_path / "remote.ocsf"
    r = run_cli(["audit", "download", "--out", str(out), "--format", "ocsf", "--action", "tenant.create"],
                {"TRUSTFABRIC_SERVER": world.cli.env["TRUSTFABRIC_SERVER"], "TRUSTFABRIC_TOKEN": world.admin,
                 "TRUSTFABRIC_HOME": str(tmp_path / "no-home"), "TRUSTFABRIC_CONFIG": str(tmp_path / "none.json")})
    assert r.returncode == 0 and r.stdout.startswith("exported 2 event(s)"), (r.stdout, r.stderr)
    assert not (tmp_path / "no-home").exists() and _verify(world, out).returncode == 0
    assert io.BytesIO(out.read_bytes()).readline().startswith(b'{"header":')


def test_since_a_kept_checkpoint_the_download_carries_the_consistency_proof(world: World, tmp_path: Path) -> None:
    """The auditor keeps a checkpoint (`audit checkpoint`, over the API too); a later download with
    --since-checkpoint carries the proof that the log extends it, and `audit verify --since-checkpoint` checks it."""
    kept = tmp_path / "kept.note"
    r = world.cli.run("audit", "checkpoint", token=world.admin)
    assert r.returncode == 0, r.stderr
    kept.write_text(r.stdout)
    r = world.cli.run("group", "create", "globex", "db", "--port", "tcp/5432", token=world.admin)
    assert r.returncode == 0, r.stderr  # the log grows past the kept checkpoint
    out = tmp_path / "later.jsonl"
    r = world.cli.run("audit", "download", "--out", str(out), "--tenant", "globex", "--action", "group.create",
                      "--since-checkpoint", str(kept), token=world.admin)
    assert r.returncode == 0, r.stderr
    with out.open("rb") as fh:
        header = summarize(fh).header
    assert header["consistency"]["size"] == int(kept.read_text().split("\n")[1])
    v = run_cli(["audit", "verify", str(out), "--public-key", str(world.key), "--since-checkpoint", str(kept)], {})
    assert v.returncode == 0 and v.stdout.startswith("OK: 3 event(s)"), (v.stdout, v.stderr)
    unreadable = tmp_path / "not-utf8.note"
    unreadable.write_bytes(b"\xff\xfe")
    r = world.cli.run("audit", "download", "--out", str(tmp_path / "x.jsonl"), "--since-checkpoint", str(unreadable),
                      token=world.admin, TRUSTFABRIC_SERVER="http://127.0.0.1:9")
    assert r.returncode == 2 and r.stderr.startswith(f"error: --since-checkpoint {unreadable}: cannot read it"), \
        r.stderr
