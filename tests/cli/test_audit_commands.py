"""`trustfabric audit export | verify | public-key`: real data directory, key store and database."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from audit import Actor, record
from cli.main import app
from tests.cli.conftest import run_cli
from workflows.context import AppContext
from workflows.settings import Settings


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    base = tmp_path_factory.mktemp("audit-cli")
    env = {"TRUSTFABRIC_HOME": str(base / "home"), "TRUSTFABRIC_CONFIG": str(base / "none.json"), "COLUMNS": "200"}
    result = CliRunner().invoke(app, ["init", "--trust-domain", "example.org"], env=env)
    assert result.exit_code == 0, result.output
    ctx = AppContext.open(Settings.from_env(env))
    try:
        with ctx.db.session() as s:
            for i in range(25):
                record(
                    s,
                    actor=Actor("op", "admin"),
                    action="grant.approve",
                    object_type="grant",
                    object_id=f"g-{i}",
                    tenant=("acme", "globex")[i % 2],
                )
    finally:
        ctx.close()
    return env


def _run(env: dict[str, str], *args: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, list(args), env=env)
    return result.exit_code, result.output


def test_export_then_verify_offline(home: dict[str, str], tmp_path: Path) -> None:
    code, pem = _run(home, "audit", "public-key")
    assert code == 0 and pem.startswith("-----BEGIN PUBLIC KEY-----")
    key = tmp_path / "audit.pem"
    key.write_text(pem)
    for fmt in ("jsonl", "csv", "ocsf"):
        out = tmp_path / f"export.{fmt}"
        code, text = _run(home, "audit", "export", "--out", str(out), "--format", fmt, "--tenant", "acme", "--json")
        assert code == 0, text
        summary = json.loads(text)
        assert summary["events"] >= 13 and not (tmp_path / f"export.{fmt}.part").exists()
        # offline: no TRUSTFABRIC_HOME at all, only the file and the key
        code, text = _run({}, "audit", "verify", str(out), "--public-key", str(key))
        assert code == 0 and text.startswith("OK:"), text
        assert "selection: tenant acme" in text, text  # the auditor sees what the export claims to hold


def test_verify_cautions_about_a_csv_from_before_formula_guarding(home: dict[str, str], tmp_path: Path) -> None:
    """A CSV export written before cells were guarded verifies (its bytes are the hashed ones) but its caller-chosen
    cells may run as formulas in the auditor's spreadsheet: OK, and a caution on stderr (and in --json)."""
    key = tmp_path / "audit.pem"
    key.write_text(_run(home, "audit", "public-key")[1])
    out = tmp_path / "export.csv"
    assert _run(home, "audit", "export", "--out", str(out), "--format", "csv")[0] == 0
    older = tmp_path / "older.csv"
    rows = list(csv.reader(io.StringIO(out.read_text(), newline="")))
    assert rows[0][-1] == "formula_guard"
    with older.open("w", newline="") as fh:
        csv.writer(fh, lineterminator="\n").writerows(row[:-1] for row in rows)
    for path, cautioned in ((out, False), (older, True)):
        result = CliRunner().invoke(app, ["audit", "verify", str(path), "--public-key", str(key)], env={})
        assert result.exit_code == 0 and result.stdout.startswith("OK:"), result.output
        assert ("caution: this CSV was written before formula guarding" in result.stderr) is cautioned, result.stderr
        as_json = json.loads(_run({}, "audit", "verify", str(path), "--public-key", str(key), "--json")[1])
        assert as_json["ok"] is True and len(as_json["cautions"]) == int(cautioned), as_json


def test_verify_names_the_first_bad_event_in_one_line(home: dict[str, str], tmp_path: Path) -> None:
    key = tmp_path / "audit.pem"
    key.write_text(_run(home, "audit", "public-key")[1])
    out = tmp_path / "export.jsonl"
    assert _run(home, "audit", "export", "--out", str(out))[0] == 0
    lines = out.read_bytes().splitlines(keepends=True)
    lines[8] = lines[8].replace(b'"id":"g-', b'"id":"G-')
    out.write_bytes(b"".join(lines))
    code, text = _run({}, "audit", "verify", str(out), "--public-key", str(key))
    assert code == 1
    assert text.strip().count("\n") == 0 and "event 7" in text and "modified" in text, text
    code, text = _run({}, "audit", "verify", str(out), "--public-key", str(key), "--json")
    assert code == 1 and json.loads(text)["index"] == 7 and json.loads(text)["kind"] == "modified"
    code, text = _run({}, "audit", "verify", str(tmp_path / "missing"), "--public-key", str(key))
    assert code == 2 and "Traceback" not in text and "does not exist" in text  # refused while parsing
    not_a_key = tmp_path / "README.md"
    not_a_key.write_text("C++ and a+b \u2014 caf\u00e9\n")
    code, text = _run({}, "audit", "verify", str(out), "--public-key", str(not_a_key))
    assert code == 2 and text == (f"error: cannot verify: --public-key {not_a_key}: the public key is neither a PEM "
                                  "Ed25519 key nor a signed-note verifier key\n"), text
    # the export itself given as the key (its lines hold `+`): the same sentence, naming that file
    code, text = _run({}, "audit", "verify", str(out), "--public-key", str(out))
    assert code == 2 and text.startswith(f"error: cannot verify: --public-key {out}: the public key is neither")
    # a kept checkpoint that is none (the key given in its place): the message names the option and file too
    code, text = _run({}, "audit", "verify", str(out), "--public-key", str(key), "--since-checkpoint", str(key))
    assert code == 2 and text.startswith(f"error: cannot verify: --since-checkpoint {key}: "), text


def test_note_form_of_the_public_key(home: dict[str, str]) -> None:
    code, text = _run(home, "audit", "public-key", "--note")
    name, keyhash, _blob = text.strip().split("+", 2)
    assert code == 0 and name == "example.org/audit" and len(keyhash) == 8


def test_usage_errors(home: dict[str, str], tmp_path: Path) -> None:
    code, _text = _run(home, "audit", "export", "--out", str(tmp_path / "x"), "--format", "xml")
    assert code == 2 and not (tmp_path / "x").exists()


def test_bad_input_fails_in_one_line_without_traceback(home: dict[str, str], tmp_path: Path) -> None:
    out = tmp_path / "never"
    for args in (["--since", "yesterday"], ["--tenant", "Not_A_Slug"], ["--since", "2026-01-01T00:00:00"]):
        proc = run_cli(["audit", "export", "--out", str(out), *args], home)  # main(): the binary's error path
        assert proc.returncode == 2, proc.stderr  # a usage error: refused while the arguments are parsed
        assert "Traceback" not in proc.stderr and proc.stderr.strip().count("\n") == 0, proc.stderr
        assert not out.exists()


def _append(env: dict[str, str], action: str, count: int) -> None:
    ctx = AppContext.open(Settings.from_env(env))
    try:
        with ctx.db.session() as s:
            for i in range(count):
                record(s, actor=Actor("op", "admin"), action=action, object_type="grant", object_id=f"k-{i}",
                       tenant="acme")
    finally:
        ctx.close()


def _checkpoint_of(export: Path) -> str:
    first = export.read_bytes().split(b"\n", 1)[0]
    if first.startswith(b"record,"):  # CSV: the header row's data cell
        import csv

        with export.open(newline="") as fh:
            first = next(r for r in csv.DictReader(fh) if r["record"] == "header")["data"].encode()
        return str(json.loads(first)["checkpoint"])
    return str(json.loads(first)["header"]["checkpoint"])


def test_verify_since_a_kept_checkpoint_and_the_unproven_exit_code(tmp_path: Path) -> None:
    """Exit 0 proven, 1 failed (an old export passed as current), 3 unproven (a filtered export without a
    consistency proof): one line each, offline."""
    env = {"TRUSTFABRIC_HOME": str(tmp_path / "home"), "TRUSTFABRIC_CONFIG": str(tmp_path / "none.json")}
    assert _run(env, "init", "--trust-domain", "example.org")[0] == 0
    key = tmp_path / "audit.pem"
    key.write_text(_run(env, "audit", "public-key")[1])
    first = tmp_path / "first.jsonl"
    assert _run(env, "audit", "export", "--out", str(first))[0] == 0
    size = int(_checkpoint_of(first).split("\n")[1])
    if size % 2 == 0:  # an odd size lies inside the first gap subtree of the export below: no rebuilt root
        assert _run(env, "audit", "export", "--out", str(first))[0] == 0  # one more: its audit.export event
    kept = tmp_path / "kept.note"  # what an auditor keeps: the signed checkpoint note
    kept.write_text(_checkpoint_of(first))
    assert int(kept.read_text().split("\n")[1]) % 2 == 1
    _append(env, "grant.expire", 5)  # only events after the kept checkpoint match the filter
    later = tmp_path / "later.csv"
    export = ["audit", "export", "--out", str(later), "--format", "csv", "--action", "grant.expire"]
    assert _run(env, *export)[0] == 0
    verify = ["audit", "verify", str(later), "--public-key", str(key), "--since-checkpoint", str(kept)]
    code, text = _run({}, *verify)
    assert code == 3 and text.startswith("UNPROVEN:") and "--since-checkpoint" in text, text
    assert text.strip().count("\n") == 0
    assert _run(env, *export, "--since-checkpoint", str(kept))[0] == 0
    code, text = _run({}, *verify)
    assert code == 0 and text.startswith("OK: 5 event(s)") and ", signed 20" in text, text
    newer = tmp_path / "newer.note"
    newer.write_text(_checkpoint_of(later))
    code, text = _run({}, "audit", "verify", str(first), "--public-key", str(key), "--since-checkpoint", str(newer))
    assert code == 1 and "stale" in text and "older than the one you kept" in text, text
    code, text = _run({}, "audit", "verify", str(first), "--public-key", str(key), "--since-checkpoint", str(key))
    assert code == 2 and "Traceback" not in text and text.strip().count("\n") == 0, text


def test_export_takes_audit_events_filters_and_an_actor_export_says_it_is_unproven(tmp_path: Path) -> None:
    """`audit export` takes the selection options of `audit events` (one definition: the same names, the same
    parsing); --actor selects what `--actor` lists (`alice@acme`: acme's alice, `alice`: every tenant's). The
    log keeps no count of an actor's events, so the export says at once, and `audit verify` answers UNPROVEN
    (exit 3) with why: never OK, never FAILED."""
    from cli.main import _command

    def filters(*path: str) -> dict[str, tuple[str, ...]]:
        cmd = _command()
        for name in path:
            cmd = cmd.commands[name]  # type: ignore[attr-defined]
        return {p.name: tuple(p.opts) for p in cmd.params if p.name in (
            "tenant", "action", "actor", "actor_tenant", "since", "until")}

    events, export = filters("audit", "events"), filters("audit", "export")
    assert events == export and len(export) == 6, (events, export)
    env = {"TRUSTFABRIC_HOME": str(tmp_path / "home"), "TRUSTFABRIC_CONFIG": str(tmp_path / "none.json"),
           "COLUMNS": "200"}
    assert run_cli(["init", "--trust-domain", "example.org"], env).returncode == 0
    ctx = AppContext.open(Settings.from_env(env))
    try:
        with ctx.db.session() as s:
            for i, (who, tenant) in enumerate([("alice", "acme"), ("alice", "globex"), ("bob", "acme")] * 3):
                record(s, actor=Actor(who, "tenant", tenant), action="group.create", object_type="group",
                       object_id=f"{tenant}/g{i}", tenant=tenant)
    finally:
        ctx.close()
    key = tmp_path / "audit.pem"
    key.write_text(run_cli(["audit", "public-key"], env).stdout)
    for args, shown in ((["--actor", "alice@acme"], 3), (["--actor", "alice"], 6), (["--actor-tenant", "acme"], 6),
                        (["--actor", "bob", "--actor-tenant", "acme", "--tenant", "acme"], 3)):
        out = tmp_path / "actor.jsonl"
        r = run_cli(["audit", "export", "--out", str(out), *args], env)
        assert r.returncode == 0 and r.stdout.startswith(f"exported {shown} event(s)"), (args, r.stdout, r.stderr)
        assert r.stderr.startswith("note: the export is narrowed to ") and "UNPROVEN (exit 3)" in r.stderr, r.stderr
        v = run_cli(["audit", "verify", str(out), "--public-key", str(key)], {})
        assert v.returncode == 3 and v.stdout == "", (args, v.stdout, v.stderr)
        assert v.stderr.startswith(f"UNPROVEN: nothing was found altered in {shown} event(s), but the export is "
                                   "narrowed to "), v.stderr
        assert "the log keeps no count of an actor's events" in v.stderr and v.stderr.count("\n") == 1, v.stderr
        j = run_cli(["audit", "verify", str(out), "--public-key", str(key), "--json"], {})
        answer = json.loads(j.stdout)  # what was verified, beside why it is not proven complete
        assert j.returncode == 3 and answer["kind"] == "unproven" and answer["events"] == shown, answer
        assert answer["tree_size"] >= 9 and answer["origin"], answer
    # a tenant selection of the same log is proven complete (the counters): OK, exit 0
    out = tmp_path / "acme.jsonl"
    assert run_cli(["audit", "export", "--out", str(out), "--tenant", "acme"], env).returncode == 0
    assert run_cli(["audit", "verify", str(out), "--public-key", str(key)], {}).returncode == 0
    bad = run_cli(["audit", "export", "--out", str(tmp_path / "x.jsonl"), "--actor-tenant", "Not_A_Slug"], env)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and not (tmp_path / "x.jsonl").exists()
