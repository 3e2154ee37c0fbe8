"""CA keys left in a PKCS#11 token by a process killed in mid-rotation, between making them and committing the CA rows
that name them: every key the token store makes carries its deployment's marker (CKA_ID), and a start destroys the
unused CA keys marked as its own, never another deployment's (the token may be shared) nor an unmarked one."""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from pkcs11 import Attribute
from sqlalchemy.exc import DBAPIError
from sqlmodel import col, select

from audit.checkpoint import AUDIT_KEY_ID, audit_signer, load_public_key, public_key_pem
from audit.export import export_events
from audit.models import AuditEvent
from audit.verify import verify_export
from core.clock import FrozenClock
from keys.deployment import marker, read_deployment_id
from keys.intents import record_intents
from keys.pkcs11 import Pkcs11KeyStore, Pkcs11Signer
from keys.store import KeyKind
from pki import service
from pki.ca import CA_KEY_ID_RE
from pki.models import CertificateAuthority
from pki.tokens.service import API_ISSUER_KEY_ID
from store.db import Database
from tests.conftest import make_settings, open_context
from tests.keys.stores import _LIST_OBJECTS, PIN, token_objects
from tests.pki.helpers import ADMIN, TD, make_csr, register, verify_chain
from tests.workflows.conftest import Token
from workflows.context import AppContext
from workflows.init import discard_unused_ca_keys, initialize, token_keys
from workflows.rotation import reserve_keys, rotate_cas

pytestmark = pytest.mark.hsm

REPO = Path(__file__).resolve().parents[2]


def _close(ctx: AppContext) -> None:
    assert isinstance(ctx.keystore, Pkcs11KeyStore)
    ctx.keystore.close()
    ctx.close()


def _env(home: Path, url: str | None, token: Token) -> dict[str, str]:
    """The environment a deployment's process (`serve`, a CLI command) runs with: its data directory, its database,
    the shared token (TRUSTFABRIC_KEYSTORE=pkcs11)."""
    module, label = token
    env = {**os.environ, "TRUSTFABRIC_HOME": str(home), "TRUSTFABRIC_KEYSTORE": "pkcs11",
           "TRUSTFABRIC_PKCS11_MODULE": module, "TRUSTFABRIC_PKCS11_TOKEN": label, "TRUSTFABRIC_PKCS11_PIN": PIN,
           "TRUSTFABRIC_TRUST_DOMAIN": TD}
    if url is not None:
        env["TRUSTFABRIC_DATABASE_URL"] = url
    return env


def _open(home: Path, url: str | None, token: Token, opened: list[AppContext]) -> AppContext:
    """A deployment's data directory on database `url`, its key store the shared token (TRUSTFABRIC_KEYSTORE=pkcs11),
    as `serve` opens it."""
    module, label = token
    clock = FrozenClock(datetime.now(UTC).replace(microsecond=0))
    ctx = open_context(make_settings(home, url, keystore="pkcs11", pkcs11_module=module, pkcs11_token=label,
                                     pkcs11_pin=PIN), clock)
    opened.append(ctx)
    return ctx


def _labels(token: Token) -> set[str]:
    """The labels of the token's private keys, as another process logged in to it lists them."""
    return {key_id for key_id, cls in token_objects(*token) if cls == "PRIVATE_KEY"}


def _named(ctx: AppContext) -> set[str]:
    """The key ids the deployment's CA rows name, in any state."""
    with ctx.db.read_session() as s:
        return {k for ca in s.exec(select(CertificateAuthority)).all() for k in (ca.key_id, ca.jwt_key_id) if k}


def _destroyed(ctx: AppContext) -> list[tuple[str, str, str, str]]:
    with ctx.db.read_session() as s:
        events = s.exec(select(AuditEvent).where(AuditEvent.action == "ca.key.destroy").order_by(
            col(AuditEvent.seq))).all()
    return [(e.object_type, e.object_id, e.actor_kind, e.actor_id) for e in events]


def _signs(ctx: AppContext) -> None:
    """The deployment's active CA signs an X.509-SVID that verifies against its bundle."""
    with ctx.db.session() as s:
        issued = service.issue_x509_svid(s, ctx.keystore, csr_pem=make_csr(), tenant="acme", group="web",
                                         workload="frontend", ttl=None, actor=ADMIN, scope_tenant=None,
                                         clock=ctx.clock)
    with ctx.db.read_session() as s:
        roots = service.bundle_pem(s)
    assert len(verify_chain(issued.cert_pem, issued.chain_pem, roots, ctx.clock())) == 3


def _audit_verifies(ctx: AppContext) -> int:
    """The deployment's whole audit log, exported and checked by the offline verifier; its event count."""
    signer = audit_signer(ctx.keystore)
    out = io.BytesIO()
    export_events(ctx.db, signer, out, clock=ctx.clock)
    out.seek(0)
    return verify_export(out, load_public_key(public_key_pem(signer))).events


def _init(ctx: AppContext) -> None:
    initialize(ctx, TD, "ec-p256")
    with ctx.db.session() as s:
        register(s, "acme", "web", "frontend")


# What a process runs until it is killed: a CA rotation, or the first init (whose transaction makes the first CA
# generation). pki.ca.sign_certificate, which create_generation calls once it has made the generation's three key pairs
# and before anything commits, is replaced in this subprocess only by a stop that says the keys are made and sleeps
# until the test kills the process with SIGKILL.
_KILLED = """
import sys, time
from pathlib import Path
import pki.ca
from audit import Actor
from workflows.context import AppContext
from workflows.init import initialize
from workflows.rotation import rotate_cas
from workflows.settings import Settings

what, made = sys.argv[1], Path(sys.argv[2])

def stop_before_commit(builder, signer):
    made.write_text("made")
    time.sleep(600)

pki.ca.sign_certificate = stop_before_commit
ctx = AppContext.open(Settings.from_env(), create=True)
if what == "rotation":
    rotate_cas(ctx, force=True, actor=Actor.system("ca-rotator"))
else:
    initialize(ctx, None, "ec-p256")
sys.exit(f"the {what} was not stopped before its commit")
"""


def _kill_at(script: str, what: str, stage: str, env: dict[str, str], tmp_path: Path) -> None:
    """Run `script` (argv: `what`, a file it writes when it reaches `stage`, then sleeps) in a process of its own,
    and kill -9 it there: how a rotation or init dies mid-way."""
    reached = tmp_path / "reached"
    proc = subprocess.Popen([sys.executable, "-c", script, what, str(reached)], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 60
        while not reached.exists():
            if proc.poll() is not None:
                raise AssertionError(f"the {what}'s process ended ({proc.returncode}) before it {stage}: "
                                     f"{proc.communicate()[1].decode(errors='replace')[-2000:]}")
            assert time.monotonic() < deadline, f"the {what}'s process never {stage}"
            time.sleep(0.05)
    finally:
        with contextlib.suppress(ProcessLookupError):  # (ended by itself: said above)
            os.kill(proc.pid, signal.SIGKILL)
        proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGKILL


def _killed_before_its_commit(what: str, env: dict[str, str], tmp_path: Path) -> None:
    _kill_at(_KILLED, what, "made its keys", env, tmp_path)


def _later_than_a_copys_rotation(ctx: AppContext) -> None:
    """The start runs ABANDONED_AFTER after the killed process wrote its intents (a younger intent may be a rotation
    under way in a copy of the database: its keys are left for a later start)."""
    from keys.intents import ABANDONED_AFTER

    assert isinstance(ctx.clock, FrozenClock)
    ctx.clock.advance(ABANDONED_AFTER + timedelta(seconds=1))  # (the intents carry microseconds; this clock not)


@pytest.mark.parametrize("what", ["rotation", "init"])
def test_a_start_destroys_the_keys_a_process_killed_before_its_commit_left(
        what: str, token: Token, new_database: Callable[[], str | None], deployments: list[AppContext],
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Should fix: a process killed (kill -9, power loss) between making a CA generation's keys in the token and
    committing the CA rows that name them left three key pairs there for ever, private keys no CA generation would
    ever use (keys/undo.py destroys them on a rollback, which a killed process never runs). The next start destroys
    them, each with an audit event, and the CA signs on. The first init's too: the deployment id that marks them
    commits before init makes any key."""
    url = new_database()
    home = tmp_path / "a"
    named: set[str] = set()
    if what == "rotation":
        a = _open(home, url, token, deployments)  # as `init` opens it
        _init(a)
        named = _named(a)
        _close(a)
        deployments.remove(a)
    before = _labels(token)
    assert before == named | ({AUDIT_KEY_ID, API_ISSUER_KEY_ID} if named else set())

    _killed_before_its_commit(what, _env(home, url, token), tmp_path)
    left = _labels(token) - before - {AUDIT_KEY_ID, API_ISSUER_KEY_ID}  # an init makes these before its CA
    generation = "-g2-" if what == "rotation" else "-g1-"
    assert len(left) == 3 and all(CA_KEY_ID_RE.fullmatch(k) and generation in k for k in left)

    caplog.set_level(logging.WARNING, logger="workflows.init")
    again = _open(home, url, token, deployments)  # the start after the kill: serve runs init
    _later_than_a_copys_rotation(again)
    assert _named(again) == named  # the killed process committed no CA row
    if what == "rotation":
        assert initialize(again, None, "ec-p256")["created"] is False
    else:
        _init(again)
        named = _named(again)
        assert len(named) == 3 and not named & left
    assert _labels(token) == named | {AUDIT_KEY_ID, API_ISSUER_KEY_ID}
    assert {(key_id, cls) for key_id, cls in token_objects(*token) if key_id in left} == set()  # public halves too
    removed = sorted(left)
    assert _destroyed(again) == [("key", k, "system", "init") for k in removed]
    lines = [r.getMessage() for r in caplog.records if r.name == "workflows.init" and r.levelno >= logging.WARNING]
    assert len(lines) == 1 and lines[0].startswith("destroyed 3 CA key(s) of this deployment in Pkcs11KeyStore(")
    assert lines[0].endswith(": " + ", ".join(removed))
    _signs(again)
    assert _audit_verifies(again) > 3
    caplog.clear()
    assert initialize(again, None, "ec-p256")["created"] is False  # nothing left: nothing written, no line
    assert len(_destroyed(again)) == 3 and not [r for r in caplog.records
                                                if r.name == "workflows.init" and r.levelno >= logging.WARNING]
    with again.db.session() as s:  # and a rotation, run again, commits with keys of its own
        assert service.rotate(s, again.keystore, force=True, actor=ADMIN, clock=again.clock).prepared == 2
    assert _labels(token) == _named(again) | {AUDIT_KEY_ID, API_ISSUER_KEY_ID}


def test_every_key_the_token_store_makes_carries_its_deployments_marker(
        token: Token, new_database: Callable[[], str | None], deployments: list[AppContext], tmp_path: Path) -> None:
    a = _open(tmp_path / "a", new_database(), token, deployments)
    _init(a)
    with a.db.statement() as conn:
        mine = str(conn.exec_driver_sql("SELECT deployment_id FROM deployment WHERE id = 1").scalar_one())
    with a.db.read_session() as s:
        made = s.exec(select(AuditEvent).where(AuditEvent.action == "deployment.create")).all()
    assert [(e.object_id, e.actor_id) for e in made] == [(mine, "init")]
    assert isinstance(a.keystore, Pkcs11KeyStore)
    owners = a.keystore.key_owners()
    assert owners == dict.fromkeys(_named(a) | {AUDIT_KEY_ID, API_ISSUER_KEY_ID}, mine)
    for key_id in owners:
        signer = a.keystore.get(key_id)
        assert isinstance(signer, Pkcs11Signer)
        if key_id in (AUDIT_KEY_ID, API_ISSUER_KEY_ID):
            assert signer.handle[Attribute.ID] == marker(mine, key_id) == f"trustfabric/{mine}/{key_id}".encode()
        else:  # a CA key a committed CA row names: the token witnesses the commit (keys/deployment.py)
            assert signer.handle[Attribute.ID] == f"trustfabric/{mine}/{key_id}/committed".encode()
    initialize(a, None, "ec-p256")  # written once
    with a.db.statement() as conn:
        assert conn.exec_driver_sql("SELECT deployment_id FROM deployment").scalars().all() == [mine]


# What deployment B does, each step in a process of its own (a token is logged in to once per process, as two
# deployments on one host or two hosts would use it): run by _as_b with B's environment, its result printed as JSON.
# A step is a function of this module, or `<module>:<function>` of another.
_AS_ANOTHER_PROCESS = """
import importlib, json, sys
from datetime import UTC, datetime
from core.clock import FrozenClock
from workflows.context import AppContext
from workflows.settings import Settings
module, _, step = sys.argv[1].rpartition(":")
steps = importlib.import_module(module or "tests.workflows.test_token_keys")
ctx = AppContext.open(Settings.from_env(), create=True, clock=FrozenClock(datetime.now(UTC).replace(microsecond=0)))
try:
    print(json.dumps(getattr(steps, step)(ctx)))
finally:
    ctx.keystore.close()
    ctx.close()
"""


def _as_b(env: dict[str, str], step: str) -> object:
    out = subprocess.run([sys.executable, "-c", _AS_ANOTHER_PROCESS, step], cwd=REPO, env=env, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.splitlines()[-1])


def _killed_rotations_key(ctx: AppContext, key_id: str) -> None:
    """What a rotation killed before its commit leaves of one key: its intent, committed before it was made
    (keys/intents.py), and the key, marked as this deployment's. Killed a while ago: its intent is ABANDONED_AFTER
    old (a younger one is left for a later start: a rotation in a copy of the database may be under way)."""
    from keys.intents import ABANDONED_AFTER

    with ctx.db.statement() as conn:
        mine = read_deployment_id(conn)
    assert mine is not None
    record_intents(ctx.db, [key_id], mine, ctx.clock() - ABANDONED_AFTER)
    ctx.keystore.generate(key_id, KeyKind.EC_P256)


def b_is_made(ctx: AppContext) -> list[str]:
    """B's init, and an unused CA key of B's (a killed rotation's); the ids B's CA rows name."""
    _init(ctx)
    _killed_rotations_key(ctx, "ca-g9-root-0b0b0b0b")
    return sorted(_named(ctx))


def b_starts(ctx: AppContext) -> list[str]:
    """B's next start: the ids of the keys it destroyed; its CA signs after."""
    assert initialize(ctx, None, "ec-p256")["created"] is False
    _signs(ctx)
    return [key_id for _type, key_id, _kind, _id in _destroyed(ctx)]


def test_another_deployments_keys_on_the_same_token_are_never_touched(
        token: Token, new_database: Callable[[], str | None], deployments: list[AppContext], tmp_path: Path) -> None:
    """Two deployments (each a data directory with a database of its own) share one token. Deployment A has no row
    for any of B's keys, its live CA keys included: without the marker A's start would take them for its own unused
    keys and destroy them."""
    a = _open(tmp_path / "a", new_database(), token, deployments)
    _init(a)
    b = _env(tmp_path / "b", new_database(), token)
    b_live = set(_as_b(b, "b_is_made"))  # type: ignore[call-overload]
    assert not b_live & _named(a) and len(b_live) == 3
    assert {"ca-g9-root-0b0b0b0b", *b_live} <= _labels(token)
    _killed_rotations_key(a, "ca-g9-root-0a0a0a0a")  # an unused key of A's (a killed rotation's)
    assert initialize(a, None, "ec-p256")["created"] is False
    assert [k for _t, k, _a, _i in _destroyed(a)] == ["ca-g9-root-0a0a0a0a"]
    held = _labels(token)
    assert "ca-g9-root-0a0a0a0a" not in held and {"ca-g9-root-0b0b0b0b", *b_live} <= held
    assert _as_b(b, "b_starts") == ["ca-g9-root-0b0b0b0b"]  # B signs on, and its start takes B's own
    assert _named(a) | b_live <= _labels(token) and "ca-g9-root-0b0b0b0b" not in _labels(token)
    _signs(a)


def test_an_unmarked_ca_key_is_never_touched_and_is_named_once(
        token: Token, new_database: Callable[[], str | None], deployments: list[AppContext], tmp_path: Path,
        caplog: pytest.LogCaptureFixture) -> None:
    """Keys made before keys were marked carry no marker: whose they are is not provable (another deployment's live CA
    key, or ours), so they stay, and a start names those no CA row here names in one line, for an operator."""
    module, label = token
    a = _open(tmp_path / "a", new_database(), token, deployments)
    assert isinstance(a.keystore, Pkcs11KeyStore)
    a.keystore.close()  # a process logs in to a token once: the store as it was, in its stead
    before_markers = Pkcs11KeyStore(module, label, PIN)  # what it makes carries no marker
    try:
        _init(replace(a, keystore=before_markers))  # the deployment's CA keys: unmarked, named by its CA rows
        before_markers.generate("ca-g2-root-0badc0de", KeyKind.EC_P256)  # a rolled-back rotation's, before the fix
        before_markers.generate("not-a-ca-key", KeyKind.EC_P256)  # unmarked, not of the CA key form: not named
    finally:
        before_markers.close()
    with a.db.engine.begin() as conn:  # what upgrading a database from before markers records (its trust domain
        conn.exec_driver_sql("UPDATE deployment SET origin = 'upgrade'")  # predates its deployment id)
    now = Pkcs11KeyStore(module, label, PIN, db=a.db)  # this version's
    a = deployments[-1] = replace(a, keystore=now)
    assert set(now.key_owners().values()) == {None}
    held = _labels(token)
    caplog.set_level(logging.WARNING, logger="workflows.init")
    caplog.clear()  # what init logged before (its INFO line, when a test before this one lowered the root level)
    assert initialize(a, None, "ec-p256")["created"] is False
    assert _labels(token) == held and _destroyed(a) == []
    lines = [r.getMessage() for r in caplog.records if r.name == "workflows.init" and r.levelno >= logging.WARNING]
    assert len(lines) == 1 and lines[0].endswith("holds 1 CA key(s) without a deployment marker that no CA generation "
                                                 "of this database uses, left as they are (made before keys were "
                                                 "marked, or by another deployment or software; an operator judges "
                                                 "whose): ca-g2-root-0badc0de")
    _signs(a)


def test_a_start_never_destroys_the_keys_of_a_rotation_under_way(
        token: Token, new_database: Callable[[], str | None], deployments: list[AppContext], tmp_path: Path) -> None:
    """A rotation (on this replica or another) has made its keys, marked as this deployment's, and not yet committed
    the CA rows that name them: they look unused. The removal waits for the trust domain settings lock the rotation
    holds (on SQLite, for the writer lock), then finds them used."""
    a = _open(tmp_path / "a", new_database(), token, deployments)
    _init(a)
    made, go = threading.Event(), threading.Event()
    rotated: list[int | None] = []

    def rotate_and_hold() -> None:  # as workflows/rotation.py runs it: its keys' intents committed first
        reserved = reserve_keys(a, force=True)
        assert reserved is not None
        with a.db.session() as s:
            rotated.append(service.rotate(s, a.keystore, force=True, actor=ADMIN, clock=a.clock,
                                          reserved=reserved).prepared)
            made.set()
            go.wait(30)

    ks = a.keystore
    assert isinstance(ks, Pkcs11KeyStore)
    removed: list[list[str]] = []
    rotation = threading.Thread(target=rotate_and_hold)
    removal = threading.Thread(target=lambda: removed.append(discard_unused_ca_keys(a, ks)))
    try:
        rotation.start()
        assert made.wait(30) and rotated == [2]
        under_way = {k for k in ks.key_owners() if "-g2-" in k}
        assert len(under_way) == 3 and not under_way & _named(a)  # made, marked ours, no committed row names them
        removal.start()
        if a.db.dialect == "postgresql":
            deadline = time.monotonic() + 30
            while not _someone_waits_for_a_lock(a) and removal.is_alive():
                assert time.monotonic() < deadline, "the removal never waited for the rotation's lock"
                time.sleep(0.01)
        else:
            removal.join(1)
        assert removal.is_alive(), f"the removal did not wait for the rotation: {removed}"
    finally:
        go.set()
        rotation.join(30)
        if removal.ident is not None:
            removal.join(30)
    assert removed == [[]]
    assert under_way <= _named(a) and under_way <= _labels(token)
    assert _destroyed(a) == []


def _someone_waits_for_a_lock(ctx: AppContext) -> bool:
    with ctx.db.read_session() as s:
        return bool(s.connection().exec_driver_sql("SELECT count(*) > 0 FROM pg_locks WHERE NOT granted").scalar())


def _cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    """`trustfabric <args>` in a process of its own (it logs in to the token)."""
    return subprocess.run([sys.executable, "-c", "from cli.main import main; main()", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=120)


def test_ca_keys_shows_whose_each_key_is_and_what_a_start_does_with_it(
        token: Token, new_database: Callable[[], str | None], deployments: list[AppContext], tmp_path: Path) -> None:
    module, label = token
    before_markers = Pkcs11KeyStore(module, label, PIN)  # a key made before markers existed
    try:
        before_markers.generate("ca-g3-issuing-0c0c0c0c", KeyKind.EC_P256)
    finally:
        before_markers.close()
    url = new_database()
    a = _open(tmp_path / "a", url, token, deployments)
    _init(a)
    _killed_rotations_key(a, "ca-g9-root-0a0a0a0a")  # an unused key of A's, a killed rotation's
    a.keystore.generate("ca-g8-root-0d0d0d0d", KeyKind.EC_P256)  # one of A's without an intent (a restored backup)
    b_live = set(_as_b(_env(tmp_path / "b", new_database(), token), "b_is_made"))  # type: ignore[call-overload]
    with a.db.statement() as conn:
        mine = str(conn.exec_driver_sql("SELECT deployment_id FROM deployment").scalar_one())
    with a.db.read_session() as s:
        names = {ca.key_id: ca.id for ca in s.exec(select(CertificateAuthority)).all()}
        names.update({ca.jwt_key_id: f"{ca.id} (JWT-SVIDs)" for ca in s.exec(select(CertificateAuthority)).all()
                      if ca.jwt_key_id})

    out = _cli(_env(tmp_path / "a", url, token), "ca", "keys", "--json")
    assert out.returncode == 0, out.stderr
    rows = {r["key_id"]: r for r in json.loads(out.stdout)}
    assert sorted(rows) == sorted({*names, AUDIT_KEY_ID, API_ISSUER_KEY_ID, "ca-g9-root-0a0a0a0a",
                                   "ca-g8-root-0d0d0d0d",
                                   "ca-g9-root-0b0b0b0b", "ca-g3-issuing-0c0c0c0c", *b_live})
    for key_id, ca in names.items():
        assert rows[key_id] == {"key_id": key_id, "marker": "this deployment", "deployment_id": mine, "named_by": ca,
                                "at_start": "kept: a CA generation names it"}
    for key_id in (AUDIT_KEY_ID, API_ISSUER_KEY_ID):
        assert (rows[key_id]["marker"], rows[key_id]["at_start"]) == ("this deployment", "kept: not a CA key")
    assert rows["ca-g9-root-0a0a0a0a"]["at_start"] == (
        "destroyed: unused, and this database recorded it was about to make it (a rotation killed before its commit; "
        "a rotation under way is waited for)")
    assert rows["ca-g8-root-0d0d0d0d"] == {
        "key_id": "ca-g8-root-0d0d0d0d", "marker": "this deployment", "deployment_id": mine, "named_by": None,
        "at_start": "kept: no CA row and no intent: made after this database's state — a restored backup? — left as "
                    "it is"}
    for key_id in (*b_live, "ca-g9-root-0b0b0b0b"):
        assert (rows[key_id]["marker"], rows[key_id]["at_start"]) == ("another deployment",
                                                                      "kept: another deployment's")
        assert rows[key_id]["deployment_id"] not in (None, mine)
    assert rows["ca-g3-issuing-0c0c0c0c"] == {
        "key_id": "ca-g3-issuing-0c0c0c0c", "marker": "unmarked, not adopted", "deployment_id": None, "named_by": None,
        "at_start": "kept: unmarked and unused here; an operator judges whose it is"}
    table = _cli(_env(tmp_path / "a", url, token), "ca", "keys")
    assert table.returncode == 0 and "ca-g3-issuing-0c0c0c0c" in table.stdout, table.stderr

    assert initialize(a, None, "ec-p256")["created"] is False  # a start does what it said
    assert [k for _t, k, _a, _i in _destroyed(a)] == [k for k, r in rows.items() if r["at_start"].startswith("destr")]

    files = open_context(make_settings(tmp_path / "f", None))  # a file key store: nothing of a token's to list
    files.close()
    refused = _cli({**os.environ, "TRUSTFABRIC_HOME": str(tmp_path / "f")}, "ca", "keys")
    assert refused.returncode == 1 and "lists the keys of a PKCS#11 token" in refused.stderr, refused.stderr


def test_two_starts_at_once_record_one_destroy_event_per_key(
        token: Token, new_database: Callable[[], str | None], deployments: list[AppContext], tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Should fix: two replicas starting together (a rolling restart) both find an unused key of this deployment. The
    first commits its ca.key.destroy event and releases the settings lock before it destroys the key; the second,
    taking the lock in that window, still finds the key in the token and recorded a second event for the same key,
    and said it destroyed a key its destroy never found. Here the second start runs in that window of the first
    (the first's destroy, on the real token, waits for it)."""
    a = _open(tmp_path / "a", new_database(), token, deployments)
    _init(a)
    ks = a.keystore
    assert isinstance(ks, Pkcs11KeyStore)
    _killed_rotations_key(a, "ca-g9-root-0a0a0a0a")  # an unused key of A's (a killed rotation's)
    real = ks.destroy_marked
    second: list[list[str]] = []
    calls: list[str] = []

    def destroy_after_the_other_start(key_id: str, deployment_id: str) -> bool:
        calls.append(key_id)
        if len(calls) == 1:  # the first start's destroy: the other replica's start runs now, in its window
            second.append(discard_unused_ca_keys(a, ks))
        return real(key_id, deployment_id)

    monkeypatch.setattr(ks, "destroy_marked", destroy_after_the_other_start)
    first = discard_unused_ca_keys(a, ks)
    assert "ca-g9-root-0a0a0a0a" not in _labels(token)
    assert [k for _t, k, _a, _i in _destroyed(a)] == ["ca-g9-root-0a0a0a0a"]  # one event for the one key
    assert sorted([*first, *second[0]]) == ["ca-g9-root-0a0a0a0a"]  # and one start says it destroyed it


def b_signs_with(ctx: AppContext) -> dict[str, str]:
    """B's init; the public halves of the keys B signs its audit checkpoints and its API tokens with."""
    _init(ctx)
    return {"audit": public_key_pem(audit_signer(ctx.keystore)), "issuer": _public_pem(ctx, API_ISSUER_KEY_ID)}


def b_starts_and_signs_with(ctx: AppContext) -> dict[str, str]:
    """B's next start; the public halves of the keys B signs with then."""
    assert initialize(ctx, None, "ec-p256")["created"] is False
    return {"audit": public_key_pem(audit_signer(ctx.keystore)), "issuer": _public_pem(ctx, API_ISSUER_KEY_ID)}


def _public_pem(ctx: AppContext, key_id: str) -> str:
    from cryptography.hazmat.primitives import serialization

    return ctx.keystore.get(key_id).public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo).decode()


def test_a_second_deployment_on_a_shared_token_signs_with_keys_of_its_own(
        token: Token, new_database: Callable[[], str | None], deployments: list[AppContext], tmp_path: Path) -> None:
    """Should fix: a token may be shared by several deployments (keys/deployment.py, the README's key hygiene
    paragraph). The CA keys have labels of their own per deployment (a random suffix); the audit checkpoint key
    ("audit-checkpoint") and the API issuer key ("api-issuer") have fixed labels, and init makes them only when the
    token holds none: B's init found A's (marked as A's) and signed with them. B's audit exports then verified under
    A's public key and A's under B's: whoever controls A's database (another team's deployment, a staging one) could
    have A sign a checkpoint over a log it wrote and pass it off as B's. Now lookups never take another deployment's
    key (keys/pkcs11.py), so B makes and signs with its own beside A's, and A keeps its own."""
    a = _open(tmp_path / "a", new_database(), token, deployments)
    _init(a)
    a_signs_with = {"audit": public_key_pem(audit_signer(a.keystore)), "issuer": _public_pem(a, API_ISSUER_KEY_ID)}
    b_env = _env(tmp_path / "b", new_database(), token)
    b = _as_b(b_env, "b_signs_with")
    assert isinstance(b, dict)
    assert b["audit"] != a_signs_with["audit"]
    assert b["issuer"] != a_signs_with["issuer"]
    assert _as_b(b_env, "b_starts_and_signs_with") == b  # B's next start finds its own again
    module, label = token
    listed = subprocess.run([sys.executable, "-c", _LIST_OBJECTS, module, label, PIN], capture_output=True,
                            text=True, check=True, timeout=60).stdout.splitlines()  # each object, duplicates too
    assert sorted(k for k in listed if k.startswith((AUDIT_KEY_ID, API_ISSUER_KEY_ID))) == sorted(
        f"{key_id} {cls}" for key_id in (API_ISSUER_KEY_ID, AUDIT_KEY_ID) for cls in ("PRIVATE_KEY", "PUBLIC_KEY")
        for _deployment in "ab")  # one pair each, of each deployment
    assert {"audit": public_key_pem(audit_signer(a.keystore)), "issuer": _public_pem(a, API_ISSUER_KEY_ID)} == (
        a_signs_with)  # and A signs with its own still
    assert _audit_verifies(a) > 3


def _sqlite_copy(source: Path, target: Path) -> None:
    """A consistent copy of a SQLite database (its online backup API: what a backup job takes)."""
    import sqlite3

    target.unlink(missing_ok=True)
    for suffix in ("-wal", "-shm"):
        Path(f"{target}{suffix}").unlink(missing_ok=True)
    with sqlite3.connect(source) as src, sqlite3.connect(target) as dst:
        src.backup(dst)
    dst.close()
    src.close()


def test_a_start_on_a_restored_backup_keeps_the_keys_of_later_generations(
        token: Token, deployments: list[AppContext], tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Should fix: a database restored from last night's backup (the usual recovery) names the CA generations of that
    night. A rotation committed since made keys that carry this deployment's marker and that no CA row of the restored
    database names: to the start they looked like a killed rotation's, and it destroyed them, irreversibly. Restoring
    a later copy afterwards (a later backup, a point-in-time recovery found after all) then failed for want of the
    keys of its CA generations. Now a start destroys only keys this database recorded it was about to make (an
    intent): the restored one has none for them, so they are left, named in the start's warning and by `ca keys`,
    and the later copy starts and signs."""
    from store.readonly import DB_FILE

    home = tmp_path / "a"
    a = _open(home, None, token, deployments)
    _init(a)
    before = _named(a)
    _close(a)
    deployments.remove(a)
    _sqlite_copy(home / DB_FILE, tmp_path / "nightly.db")  # the backup
    a = _open(home, None, token, deployments)
    assert rotate_cas(a, force=True, actor=ADMIN).prepared == 2  # a rotation after the backup, committed
    later = _named(a) - before
    assert len(later) == 3
    _close(a)
    _sqlite_copy(home / DB_FILE, tmp_path / "later.db")  # a later backup
    deployments.remove(a)
    _sqlite_copy(tmp_path / "nightly.db", home / DB_FILE)  # the restore
    restored = _open(home, None, token, deployments)
    caplog.set_level(logging.WARNING, logger="workflows.init")
    caplog.clear()  # what init logged before (its INFO line, when a test before this one lowered the root level)
    assert initialize(restored, None, "ec-p256")["created"] is False
    assert later <= _labels(token), f"destroyed: {sorted(later - _labels(token))}"
    assert _destroyed(restored) == []
    lines = [r.getMessage() for r in caplog.records if r.name == "workflows.init"]
    assert len(lines) == 1 and lines[0].endswith(  # (the token witnessed the later rotation's commit)
        "that the token says were committed: committed by a later state of this deployment: not destroyed (a "
        "restored backup, or a copy started against the production token?): " + ", ".join(sorted(later))), lines
    rows = {r["key_id"]: r["at_start"] for r in token_keys(restored)}
    assert {rows[k] for k in later} == {"kept: committed by a later state of this deployment: not destroyed"}
    _signs(restored)
    _close(restored)
    deployments.remove(restored)
    _sqlite_copy(tmp_path / "later.db", home / DB_FILE)  # the later backup found after all: it starts, and signs
    found = _open(home, None, token, deployments)
    assert initialize(found, None, "ec-p256")["created"] is False
    assert later <= _named(found) and _destroyed(found) == []
    _signs(found)


def wait_for_the_other_replicas() -> None:
    """In a replica's process (run by _replicas_at_once): say it is ready, then wait for the test's go, given once
    every replica is ready, so that what follows runs in all of them at once however long each took to start (a fixed
    start time either idled for seconds or, on a slow host, came before the last replica was up)."""
    barrier = Path(os.environ["TF_REVIEW_BARRIER"])
    (barrier / f"ready-{os.getpid()}").touch()
    while not (barrier / "go").exists():
        time.sleep(0.001)


def _replicas_at_once(env: dict[str, str], step: str, tmp_path: Path, n: int = 3) -> list[tuple[int, str, str]]:
    """`step` run by n replicas, each a process of its own (_AS_ANOTHER_PROCESS) that opens the deployment, then calls
    wait_for_the_other_replicas; the go once all n are ready (or one has ended: it is reported below). Each replica's
    exit code, stdout and stderr."""
    barrier = tmp_path / "barrier"
    barrier.mkdir()
    env = {**env, "TF_REVIEW_BARRIER": str(barrier)}
    replicas = [subprocess.Popen([sys.executable, "-c", _AS_ANOTHER_PROCESS, step], cwd=REPO, env=env,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(n)]
    try:
        deadline = time.monotonic() + 120
        while len(list(barrier.glob("ready-*"))) < n and all(r.poll() is None for r in replicas):
            assert time.monotonic() < deadline, "the replicas never all got ready"
            time.sleep(0.01)
        (barrier / "go").touch()
        outs = [r.communicate(timeout=120) for r in replicas]
    finally:
        for r in replicas:
            if r.poll() is None:
                r.kill()
                r.communicate()
    return [(r.returncode, out, err) for r, (out, err) in zip(replicas, outs, strict=True)]


def starts_at_once(ctx: AppContext) -> str:
    """A replica's start, from its signing keys on, at the moment every replica is ready."""
    from workflows.init import ensure_signing_keys

    wait_for_the_other_replicas()
    ensure_signing_keys(ctx)
    return "ok"


def test_replicas_starting_at_once_make_one_audit_and_one_issuer_key(
        token: Token, new_database: Callable[[], str | None], deployments: list[AppContext], tmp_path: Path) -> None:
    """Should fix: three replicas of a new deployment starting together (a first rollout) each found no audit key in
    the token and each made one (a token has no create-if-absent): the token then held three private keys labelled
    audit-checkpoint, all three starts failed, and so did every later one ("token holds 3 objects labelled
    'audit-checkpoint'") until an operator removed keys by hand. Each replica is a process of its own, as on three
    hosts; they share the database (its deployment row written) and the token."""
    from workflows.init import ensure_deployment

    url = new_database()
    home = tmp_path / "a"
    a = _open(home, url, token, deployments)
    ensure_deployment(a)
    _close(a)
    deployments.remove(a)
    ran = _replicas_at_once(_env(home, url, token), "starts_at_once", tmp_path)
    assert [code for code, _out, _err in ran] == [0, 0, 0], [err[-1500:] for _code, _out, err in ran]
    module, label = token
    listed = subprocess.run([sys.executable, "-c", _LIST_OBJECTS, module, label, PIN], capture_output=True,
                            text=True, check=True, timeout=60).stdout.splitlines()  # each object, duplicates too
    assert sorted(listed) == sorted(f"{key_id} {cls}" for key_id in (API_ISSUER_KEY_ID, AUDIT_KEY_ID)
                                    for cls in ("PRIVATE_KEY", "PUBLIC_KEY"))


def _intents(ctx: AppContext) -> set[str]:
    with ctx.db.statement() as conn:  # what is committed, as another connection reads it
        return {str(k) for k in conn.exec_driver_sql("SELECT key_id FROM key_intents").scalars()}


def test_a_rotations_intents_commit_before_its_keys_are_made_and_never_stay_behind(
        token: Token, new_database: Callable[[], str | None], deployments: list[AppContext], tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The intent of each key a rotation makes is committed (read by another connection) before the key is made; the
    rotation's commit deletes them; a rotation that rolls back takes its keys and their intents with it; an intent
    whose key was never made goes at a start once older than ABANDONED_AFTER (younger: a rotation may be waiting for
    the lock with it). So the table holds only what a killed rotation left."""
    import pki.rotation
    from keys.intents import ABANDONED_AFTER

    a = _open(tmp_path / "a", new_database(), token, deployments)
    _init(a)
    assert _intents(a) == set()
    ks = a.keystore
    assert isinstance(ks, Pkcs11KeyStore)
    real_generate = ks.generate
    committed_at_generate: list[tuple[str, set[str]]] = []

    def generate(key_id: str, kind: KeyKind) -> object:
        committed_at_generate.append((key_id, _intents(a)))
        return real_generate(key_id, kind)

    monkeypatch.setattr(ks, "generate", generate)
    assert rotate_cas(a, force=True, actor=ADMIN).prepared == 2
    assert len(committed_at_generate) == 3 and all(k in ahead for k, ahead in committed_at_generate)
    assert _intents(a) == set() and {k for k, _ in committed_at_generate} <= _named(a)

    def refused(*_args: object, **_kwargs: object) -> None:
        raise RuntimeError("the audit event is refused")

    held = _labels(token)
    recorded = pki.rotation.record  # type: ignore[attr-defined]  # (audit.record, as pki.rotation calls it)
    monkeypatch.setattr(pki.rotation, "record", refused)  # after the keys are made: the rotation rolls back
    with pytest.raises(RuntimeError, match="refused"):
        rotate_cas(a, force=True, actor=ADMIN)
    monkeypatch.setattr(pki.rotation, "record", recorded)
    assert len(committed_at_generate) == 6 and _labels(token) == held and _intents(a) == set()

    with a.db.statement() as conn:
        mine = read_deployment_id(conn)
    assert mine is not None
    record_intents(a.db, ["ca-g7-root-07070707"], mine, a.clock() - ABANDONED_AFTER)  # never made, long ago
    record_intents(a.db, ["ca-g7-root-17171717"], mine, a.clock())  # never made (yet): a rotation waiting
    assert initialize(a, None, "ec-p256")["created"] is False
    assert _intents(a) == {"ca-g7-root-17171717"} and _destroyed(a) == [] and _labels(token) == held


# A rotation's COMMIT that PostgreSQL carried out but whose answer never reached the server process (the connection
# dropped at that moment: a failover, a proxy or pooler restart, a network cut). The client cannot tell it from a
# commit that failed; the CA rows are in the database all the same, so their keys must stay in the token. Between the
# server and PostgreSQL, a TCP relay that, once armed, passes the next COMMIT of a rotation on, waits for PostgreSQL's
# answer and drops the connection instead of passing that answer back (or drops the COMMIT itself).

class CommitLosingRelay:
    """127.0.0.1:<port> -> PostgreSQL; `arm()`: the next COMMIT of a transaction that inserted CA rows goes through
    and its answer is dropped with the connection (`carried_out`), or the COMMIT is dropped with it (PostgreSQL rolls
    the transaction back)."""

    def __init__(self, target_port: int, *, carried_out: bool) -> None:
        self.target = ("127.0.0.1", target_port)
        self.carried_out = carried_out  # the COMMIT reaches PostgreSQL (its answer is lost); else it is lost itself
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.armed = threading.Event()
        self.fired = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def arm(self) -> None:
        self.armed.set()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            server = socket.create_connection(self.target)
            lost, answered = threading.Event(), threading.Event()  # this connection's COMMIT answer: to be dropped
            threading.Thread(target=self._up, args=(client, server, lost, answered), daemon=True).start()
            threading.Thread(target=self._down, args=(server, client, lost, answered), daemon=True).start()

    def _up(self, client: socket.socket, server: socket.socket, lost: threading.Event,
            answered: threading.Event) -> None:
        wrote_cas = False
        try:
            while data := client.recv(65536):
                wrote_cas = wrote_cas or b"INSERT INTO pki_cas" in data
                if self.armed.is_set() and wrote_cas and b"COMMIT\x00" in data:
                    self.armed.clear()
                    if self.carried_out:  # PostgreSQL commits and answers; the answer goes nowhere
                        lost.set()
                        server.sendall(data)
                        assert answered.wait(30), "PostgreSQL never answered the COMMIT"
                    self.fired.set()
                    return
                server.sendall(data)
                if b"COMMIT\x00" in data or b"ROLLBACK\x00" in data:
                    wrote_cas = False  # (a connection's next transaction starts afresh)
        except OSError:
            pass
        finally:
            _drop(client, server)

    @staticmethod
    def _down(server: socket.socket, client: socket.socket, lost: threading.Event, answered: threading.Event) -> None:
        try:
            while data := server.recv(65536):
                if lost.is_set():
                    answered.set()
                    continue
                client.sendall(data)
        except OSError:
            pass

    def close(self) -> None:
        self.listener.close()


def _drop(*sockets: socket.socket) -> None:
    for s in sockets:
        with contextlib.suppress(OSError):
            s.shutdown(socket.SHUT_RDWR)  # (a close alone leaves it open under the other thread's recv)
        s.close()


def _rotation_whose_commit_fails(carried_out: bool, token: Token, postgres_server: object,
                                  deployments: list[AppContext], tmp_path: Path) -> tuple[AppContext, set[str], str]:
    """A deployment on PostgreSQL (through the relay), its trust domain made, then a forced rotation whose COMMIT
    fails on the wire; the ids of the CA keys made by the rotation (the token's new CA labels), and the database's
    direct URL."""
    create: Callable[[], str] = postgres_server.create_database  # type: ignore[attr-defined]
    url = create()
    port = int(url.split("@127.0.0.1:")[1].split("/")[0])
    relay = CommitLosingRelay(port, carried_out=carried_out)
    a = _open(tmp_path / "a", url.replace(f":{port}/", f":{relay.port}/"), token, deployments)
    _init(a)
    before = _labels(token)
    relay.arm()
    with pytest.raises(DBAPIError):
        rotate_cas(a, force=True, actor=ADMIN)
    assert relay.fired.is_set()
    relay.close()
    return a, {k for k in _labels(token) - before}, url


def _named_in(url: str) -> set[str]:
    """The key ids the CA rows name, as PostgreSQL says (not through the relay)."""
    direct = Database(url)
    try:
        with direct.read_session() as s:
            return {k for ca in s.exec(select(CertificateAuthority)).all() for k in (ca.key_id, ca.jwt_key_id) if k}
    finally:
        direct.dispose()


@pytest.mark.postgres
def test_a_rotation_whose_commit_answer_was_lost_keeps_its_keys(
        token: Token, postgres_server: object, deployments: list[AppContext], tmp_path: Path) -> None:
    """Should fix: keys/undo.py destroyed the keys a transaction made when that transaction ended without a commit. A
    COMMIT whose answer is lost raises in the client, so the keys were destroyed although PostgreSQL had committed the
    CA rows that name them (here generation 2, made active by the forced rotation): the trust domain then had a
    generation whose keys no longer exist (irreversible in a token), its CA could not sign, and every later start
    failed (ForeignKeyStore) until an operator rebuilt the CA. Now they are kept, and the next start keeps them."""
    a, _made, url = _rotation_whose_commit_fails(True, token, postgres_server, deployments, tmp_path)
    later = {k for k in _named_in(url) if "-g2-" in k}
    assert len(later) == 3, "the COMMIT was carried out: generation 2's rows are in the database"
    assert later <= _labels(token), f"destroyed: {sorted(later - _labels(token))}"
    _close(a)
    deployments.remove(a)
    again = _open(tmp_path / "a", url, token, deployments)  # the next start, straight to PostgreSQL
    assert initialize(again, None, "ec-p256")["created"] is False
    assert later <= _labels(token) and _destroyed(again) == []
    _signs(again)


@pytest.mark.postgres
def test_a_rotation_whose_commit_was_lost_leaves_its_keys_to_the_next_start(
        token: Token, postgres_server: object, deployments: list[AppContext], tmp_path: Path) -> None:
    """The other side of the same failure: the COMMIT never reached PostgreSQL, which rolled the rotation back. The
    client cannot tell; its keys stay until the next start, which finds no CA row and their intents, and destroys
    them."""
    a, made, url = _rotation_whose_commit_fails(False, token, postgres_server, deployments, tmp_path)
    assert len(made) == 3 and not made & _named_in(url)
    _close(a)
    deployments.remove(a)
    again = _open(tmp_path / "a", url, token, deployments)
    _later_than_a_copys_rotation(again)
    assert initialize(again, None, "ec-p256")["created"] is False
    assert not made & _labels(token)
    assert sorted(k for _t, k, _a, _i in _destroyed(again)) == sorted(made)
    _signs(again)


def test_the_first_starts_log_says_the_deployment_id_marks_token_keys_only_with_a_token_key_store(
        token: Token, deployments: list[AppContext], tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The line naming a new deployment id says it marks the keys made in a PKCS#11 token only when the key store is
    one: with the file key store (the default) no key carries it, and saying so would mislead an operator."""
    caplog.set_level(logging.INFO, logger="workflows.init")
    plain = open_context(make_settings(tmp_path / "file"))
    try:
        _init(plain)
        with plain.db.statement() as conn:
            plain_id = read_deployment_id(conn)
    finally:
        plain.close()
    lines = [r.getMessage() for r in caplog.records if r.name == "workflows.init" and "deployment id" in r.getMessage()]
    assert len(lines) == 1 and str(plain_id) in lines[0] and "PKCS#11" not in lines[0], lines
    caplog.clear()
    a = _open(tmp_path / "a", None, token, deployments)
    _init(a)
    with a.db.statement() as conn:
        token_id = read_deployment_id(conn)
    lines = [r.getMessage() for r in caplog.records if r.name == "workflows.init" and "deployment id" in r.getMessage()]
    assert len(lines) == 1 and str(token_id) in lines[0] and "PKCS#11 token" in lines[0], lines
