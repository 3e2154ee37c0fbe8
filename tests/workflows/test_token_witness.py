"""The PKCS#11 token as the second witness of a CA key's commit, and no adoption of unmarked keys by a deployment made
with markers (keys/deployment.py): real SoftHSM2, real SQLite (and PostgreSQL where the intent tests use it)."""

from __future__ import annotations

import json
import logging
import subprocess
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives import serialization
from pkcs11 import Attribute, KeyType, Mechanism, ObjectClass
from pkcs11.util.ec import encode_named_curve_parameters

from audit import ensure_audit_key
from audit.checkpoint import AUDIT_KEY_ID, audit_signer, load_public_key, public_key_pem
from audit.errors import VerificationError
from audit.export import export_events
from audit.verify import verify_export
from core.clock import FrozenClock
from keys.deployment import read_deployment_id
from keys.errors import KeyNotFound
from keys.pkcs11 import Pkcs11KeyStore
from keys.store import KeyKind, Signer
from pki import service
from pki.tokens.service import API_ISSUER_KEY_ID, ensure_issuer_key
from store.db import Database, sqlite_url
from store.migrations import migrate as run_steps
from store.readonly import DB_FILE
from tests.keys.stores import PIN
from tests.pki.helpers import ADMIN, TD, register
from tests.workflows.conftest import Token
from tests.workflows.test_token_keys import (
    _audit_verifies,
    _cli,
    _close,
    _destroyed,
    _env,
    _init,
    _intents,
    _kill_at,
    _labels,
    _named,
    _open,
    _public_pem,
    _signs,
    _sqlite_copy,
)
from workflows.context import AppContext
from workflows.init import initialize, token_keys
from workflows.rotation import rotate_cas
from workflows.schema import STEPS

pytestmark = pytest.mark.hsm

COMMITTED_ELSEWHERE = "kept: committed by a later state of this deployment: not destroyed"


def _committed(ctx: AppContext) -> set[str]:
    """The ids of the deployment's keys whose marker, read from the token, says a committed CA row named them."""
    assert isinstance(ctx.keystore, Pkcs11KeyStore)
    return ctx.keystore.committed_ids()


def _origin(ctx: AppContext) -> str | None:
    with ctx.db.statement() as conn:
        value = conn.exec_driver_sql("SELECT origin FROM deployment WHERE id = 1").scalar_one()
    return None if value is None else str(value)


def test_a_start_on_a_backup_taken_mid_rotation_keeps_the_keys_that_rotation_committed(
        token: Token, deployments: list[AppContext], tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Should fix: a backup taken after a rotation committed its key intents and before it committed its CA rows
    holds the intents and no CA row. The rotation then committed (in the live database). A start on that backup (a
    restore, or a staging copy started against the production token) took the generation's keys for a killed
    rotation's and destroyed them, irreversibly: the live trust domain's next generation had no keys. Now the token,
    never restored with a database, says they were committed: the start keeps them, says so in one line and in `ca
    keys`, and the live database starts and signs with them."""
    home = tmp_path / "a"
    a = _open(home, None, token, deployments)
    _init(a)
    before = _named(a)
    ks = a.keystore
    assert isinstance(ks, Pkcs11KeyStore)
    real_generate = ks.generate
    backups: list[set[str]] = []

    def generate_after_the_backup(key_id: str, kind: KeyKind) -> Signer:
        if not backups:  # the intents committed, the rotation's transaction open: the nightly backup runs now
            _sqlite_copy(home / DB_FILE, tmp_path / "mid.db")
            backups.append(_intents(a))
        return real_generate(key_id, kind)

    ks.generate = generate_after_the_backup  # type: ignore[method-assign]
    assert rotate_cas(a, force=True, actor=ADMIN).prepared == 2
    later = _named(a) - before
    assert len(later) == 3 and backups == [later]  # the backup holds the intents of exactly these keys
    _close(a)
    deployments.remove(a)
    _sqlite_copy(home / DB_FILE, tmp_path / "live.db")
    _sqlite_copy(tmp_path / "mid.db", home / DB_FILE)  # the restore

    restored = _open(home, None, token, deployments)
    assert _named(restored) == before and _intents(restored) == later  # intents, and no CA row naming the keys
    caplog.set_level(logging.WARNING, logger="workflows.init")
    caplog.clear()
    assert initialize(restored, None, "ec-p256")["created"] is False
    assert later <= _labels(token), f"destroyed: {sorted(later - _labels(token))}"
    assert _destroyed(restored) == []
    lines = [r.getMessage() for r in caplog.records if r.name == "workflows.init"]
    assert len(lines) == 1 and lines[0].endswith(
        "committed by a later state of this deployment: not destroyed (a restored backup, or a copy started against "
        "the production token?): " + ", ".join(sorted(later))), lines
    assert {r["key_id"]: r["at_start"] for r in token_keys(restored) if r["key_id"] in later} == dict.fromkeys(
        later, COMMITTED_ELSEWHERE)
    _signs(restored)
    _close(restored)
    deployments.remove(restored)
    listed = _cli(_env(home, None, token), "ca", "keys", "--json")  # what an operator sees, in a process of its own
    assert listed.returncode == 0, listed.stderr
    assert {r["key_id"]: r["at_start"] for r in json.loads(listed.stdout) if r["key_id"] in later} == dict.fromkeys(
        later, COMMITTED_ELSEWHERE)

    _sqlite_copy(tmp_path / "live.db", home / DB_FILE)  # the live database: it starts, and signs with generation 2
    live = _open(home, None, token, deployments)
    assert initialize(live, None, "ec-p256")["created"] is False
    assert later <= _named(live) and later <= _labels(token) and _destroyed(live) == []
    _signs(live)  # (and the start's key check found generation 2's keys: ForeignKeyStore else)


def _pg_copy(source_url: str, target_url: str) -> None:
    """A logical copy of a PostgreSQL database's committed rows (one snapshot) into a migrated one: what a backup job
    restores into staging. Triggers are off while it writes (session_replication_role), as pg_restore's data load."""
    from sqlmodel import SQLModel

    source, target = Database(source_url), Database(target_url)
    try:
        with source.engine.connect() as src, target.engine.begin() as dst:
            src.exec_driver_sql("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
            dst.exec_driver_sql("SET session_replication_role = replica")
            tables = SQLModel.metadata.sorted_tables
            for table in reversed(tables):
                dst.execute(table.delete())
            for table in tables:
                rows = [dict(r._mapping) for r in src.execute(table.select())]
                if rows:
                    dst.execute(table.insert(), rows)
                for column in table.primary_key.columns:  # a serial key's sequence goes on after the copied rows
                    if len(table.primary_key.columns) == 1 and column.type.python_type is int:  # (NULL: no sequence)
                        dst.exec_driver_sql(
                            f"SELECT setval(pg_get_serial_sequence('{table.name}', '{column.name}'), "
                            f"(SELECT coalesce(max({column.name}), 0) + 1 FROM {table.name}), false)")
    finally:
        source.dispose()
        target.dispose()


@pytest.mark.postgres
def test_a_staging_copy_taken_mid_rotation_keeps_the_keys_production_committed(
        token: Token, postgres_server: Any, deployments: list[AppContext], tmp_path: Path) -> None:
    """The same window on PostgreSQL, production running on: a copy of production's database taken after a rotation
    committed its intents and before its commit is started as staging against the production token. Staging keeps
    the keys production committed (the token says so), and production signs on with its new generation."""
    live_url = postgres_server.create_database()
    staging_url = postgres_server.create_database()
    a = _open(tmp_path / "prod", live_url, token, deployments)
    _init(a)
    before = _named(a)
    ks = a.keystore
    assert isinstance(ks, Pkcs11KeyStore)
    real_generate = ks.generate
    copied: list[bool] = []

    def generate_after_the_copy(key_id: str, kind: KeyKind) -> Signer:
        if not copied:  # the intents committed, the rotation's transaction open (its rows invisible to the copy)
            _pg_copy(live_url, staging_url)
            copied.append(True)
        return real_generate(key_id, kind)

    ks.generate = generate_after_the_copy  # type: ignore[method-assign]
    assert rotate_cas(a, force=True, actor=ADMIN).prepared == 2
    ks.generate = real_generate  # type: ignore[method-assign]
    later = _named(a) - before
    assert len(later) == 3
    _close(a)  # (a process logs in to a token once: staging's start gets this one's place, as on another host)
    deployments.remove(a)

    staging = _open(tmp_path / "staging", staging_url, token, deployments)
    assert _named(staging) == before and _intents(staging) == later
    assert initialize(staging, None, "ec-p256")["created"] is False
    assert later <= _labels(token), f"destroyed: {sorted(later - _labels(token))}"
    assert _destroyed(staging) == []
    assert {r["key_id"]: r["at_start"] for r in token_keys(staging) if r["key_id"] in later} == dict.fromkeys(
        later, COMMITTED_ELSEWHERE)
    _close(staging)
    deployments.remove(staging)
    a = _open(tmp_path / "prod", live_url, token, deployments)  # production: its keys, and nothing destroyed
    assert initialize(a, None, "ec-p256")["created"] is False
    assert _destroyed(a) == [] and later <= _labels(token) and later <= _named(a) and later <= _committed(a)
    _signs(a)


# A rotation (or the first init) whose process is killed after its transaction committed and before the token was
# told (workflows/rotation.py mark_committed_keys): keys.pkcs11.Pkcs11KeyStore.mark_committed is replaced, in this
# subprocess only, by a stop that says so and sleeps until the test kills the process with SIGKILL.
_KILLED_AFTER_COMMIT = """
import sys, time
from pathlib import Path
import keys.pkcs11
from audit import Actor
from workflows.context import AppContext
from workflows.init import initialize
from workflows.rotation import rotate_cas
from workflows.settings import Settings

what, committed = sys.argv[1], Path(sys.argv[2])

def stop_before_the_mark(self, key_id):
    committed.write_text("committed")
    time.sleep(600)

keys.pkcs11.Pkcs11KeyStore.mark_committed = stop_before_the_mark
ctx = AppContext.open(Settings.from_env(), create=True)
if what == "rotation":
    rotate_cas(ctx, force=True, actor=Actor.system("ca-rotator"))
else:
    initialize(ctx, None, "ec-p256")
sys.exit(f"the {what} never marked its keys committed in the token")
"""


def _killed_after_its_commit(what: str, env: dict[str, str], tmp_path: Path) -> None:
    _kill_at(_KILLED_AFTER_COMMIT, what, "marked its keys", env, tmp_path)


@pytest.mark.parametrize("what", ["rotation", "init"])
def test_a_process_killed_between_its_commit_and_the_tokens_mark_leaves_the_mark_to_the_next_start(
        what: str, token: Token, new_database: Callable[[], str | None], deployments: list[AppContext],
        tmp_path: Path) -> None:
    """The CA rows committed and the process died (kill -9) before it marked their keys committed in the token: the
    database names the keys, so nothing is destroyed, and the next start marks them."""
    url = new_database()
    home = tmp_path / "a"
    before: set[str] = set()
    if what == "rotation":
        a = _open(home, url, token, deployments)
        _init(a)
        before = _named(a)
        assert _committed(a) == before  # init's own keys: marked once its transaction committed
        _close(a)
        deployments.remove(a)
    _killed_after_its_commit(what, _env(home, url, token), tmp_path)

    again = _open(home, url, token, deployments)
    made = _named(again) - before
    assert len(made) == 3 and made <= _labels(token)  # committed: the database names them
    assert not made & _committed(again)  # and the token was never told
    assert initialize(again, None, "ec-p256")["created"] is False  # the next start
    assert _committed(again) == _named(again) and made <= _labels(token)
    assert _destroyed(again) == []
    if what == "init":
        with again.db.session() as s:
            register(s, "acme", "web", "frontend")
    _signs(again)


def _planted(ks: Pkcs11KeyStore, label: str, kind: KeyKind) -> str:
    """An unmarked key pair made in the token by other means (other software, or someone planting it); its public
    key (PEM)."""
    ed25519 = kind is KeyKind.ED25519
    curve = "1.3.101.112" if ed25519 else "secp256r1"
    params = ks._session.create_domain_parameters(  # the raw token session
        KeyType.EC_EDWARDS if ed25519 else KeyType.EC,
        {Attribute.EC_PARAMS: bytes(encode_named_curve_parameters(curve))}, local=True)
    pub, _priv = params.generate_keypair(
        label=label, store=True, mechanism=Mechanism.EC_EDWARDS_KEY_PAIR_GEN if ed25519 else Mechanism.EC_KEY_PAIR_GEN,
        private_template={Attribute.SIGN: True, Attribute.TOKEN: True},
        public_template={Attribute.VERIFY: True, Attribute.TOKEN: True})
    return _pem(Pkcs11KeyStore._public_from(pub, kind))


def _pem(public: Any) -> str:
    pem = public.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    return str(pem.decode())


def test_a_new_deployment_never_adopts_an_unmarked_key_planted_before_its_first_init(
        token: Token, new_database: Callable[[], str | None], deployments: list[AppContext], tmp_path: Path,
        caplog: pytest.LogCaptureFixture) -> None:
    """Should fix: with no marked key of its own, a deployment took an unmarked key of the label it looks up (meant
    for keys made before markers existed). So an `audit-checkpoint` and an `api-issuer` key planted in the token
    before a new deployment's first init became its audit checkpoint key and its API token issuer: whoever planted
    them (and holds a session on the token) could sign checkpoints over a log of their own, and API tokens. A
    deployment init makes has markers from birth: it makes keys of its own and says what it left."""
    a = _open(tmp_path / "a", new_database(), token, deployments)
    ks = a.keystore
    assert isinstance(ks, Pkcs11KeyStore)
    planted_audit = _planted(ks, AUDIT_KEY_ID, KeyKind.ED25519)
    planted_issuer = _planted(ks, API_ISSUER_KEY_ID, KeyKind.EC_P256)
    _planted(ks, "policy-signing", KeyKind.EC_P256)
    caplog.set_level(logging.WARNING, logger="workflows.init")
    caplog.clear()
    _init(a)
    ours = {"audit": public_key_pem(audit_signer(ks)), "issuer": _public_pem(a, API_ISSUER_KEY_ID)}
    assert ours["audit"] != planted_audit and ours["issuer"] != planted_issuer
    assert _origin(a) == "init"
    with pytest.raises(KeyNotFound, match=r"'policy-signing' of this deployment in PKCS#11 token .*: the token holds "
                                          r"one without a deployment marker .* never uses"):
        ks.get("policy-signing")
    assert not ks.exists("policy-signing")
    lines = [r.getMessage() for r in caplog.records if r.name == "workflows.init"]
    assert len(lines) == 1 and "holds key(s) without a deployment marker labelled audit-checkpoint, api-issuer: not " \
                               "used" in lines[0], lines
    out = _export(a)
    assert verify_export(out, load_public_key(ours["audit"])).events > 3
    out.seek(0)
    with pytest.raises(VerificationError):  # its checkpoints were never signed with the planted key
        verify_export(out, load_public_key(planted_audit))
    caplog.clear()
    assert initialize(a, None, "ec-p256")["created"] is False  # the next start: its own keys again, and no line
    assert {"audit": public_key_pem(audit_signer(ks)), "issuer": _public_pem(a, API_ISSUER_KEY_ID)} == ours
    assert not [r for r in caplog.records if r.name == "workflows.init"]
    _signs(a)


def _export(ctx: AppContext) -> Any:
    import io

    out = io.BytesIO()
    export_events(ctx.db, audit_signer(ctx.keystore), out, clock=ctx.clock)
    out.seek(0)
    return out


def _pre_marker_database(request: pytest.FixtureRequest, backend: str, home: Path) -> str | None:
    """A database at schema step 15 (before the deployment id and its markers), its URL (None: the data directory's
    SQLite file)."""
    if backend == "postgres":
        url: str | None = request.getfixturevalue("postgres_server").create_database(migrated=False)
        db = Database(url)  # type: ignore[arg-type]
    else:
        url = None
        home.mkdir(mode=0o700)
        db = Database(sqlite_url(home))
    try:
        assert run_steps(db.engine, [s for s in STEPS if s.version < 16])[-1] == 15
    finally:
        db.dispose()
    return url


def made_before_markers(request: pytest.FixtureRequest, backend: str, home: Path,
                        token: Token) -> tuple[str | None, str, str]:
    """A deployment as the code before markers made it: a database at schema step 15 whose trust domain, audit key and
    API issuer key were made in the token without markers (the audit and API issuer keys already there, another
    pre-marker deployment's, are used as that code did). Its URL (None: home's SQLite file), and the public keys
    (PEM) of its audit and API issuer keys."""
    module, label = token
    url = _pre_marker_database(request, backend, home)
    old = Database(url or sqlite_url(home))
    before_markers = Pkcs11KeyStore(module, label, PIN)  # no database: what it makes carries no marker
    clock = FrozenClock(datetime.now(UTC).replace(microsecond=0))
    try:
        with old.session() as s:
            service.init_trust_domain(s, before_markers, trust_domain=TD, key_kind=KeyKind.EC_P256, clock=clock)
            register(s, "acme", "web", "frontend")
        ensure_audit_key(before_markers)
        ensure_issuer_key(before_markers)
        issuer = before_markers.get(API_ISSUER_KEY_ID).public_key()
        return url, public_key_pem(audit_signer(before_markers)), _pem(issuer)
    finally:
        before_markers.close()
        old.dispose()


@pytest.mark.parametrize("backend", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def test_a_deployment_from_before_markers_still_starts_and_uses_its_unmarked_keys(
        backend: str, token: Token, deployments: list[AppContext], tmp_path: Path,
        request: pytest.FixtureRequest) -> None:
    """A database from before schema step 16 whose trust domain, audit key and API issuer key were made in the token
    without markers (as the code of that time made them): upgraded, it records that its keys predate markers, starts,
    and signs with the keys it has; its next generation's keys are marked (and committed)."""
    home = tmp_path / "a"
    url, old_audit, old_issuer = made_before_markers(request, backend, home, token)
    a = _open(home, url, token, deployments)  # this version: steps 16 on, then the start
    held = _labels(token)
    assert initialize(a, None, "ec-p256")["created"] is False
    assert _origin(a) == "upgrade"
    ks = a.keystore
    assert isinstance(ks, Pkcs11KeyStore)
    assert set(ks.key_owners().values()) == {None} and _labels(token) == held and _destroyed(a) == []
    assert public_key_pem(audit_signer(ks)) == old_audit and _public_pem(a, API_ISSUER_KEY_ID) == old_issuer
    _signs(a)
    assert _audit_verifies(a) > 3
    assert rotate_cas(a, force=True, actor=ADMIN).prepared == 2
    made = {k for k in _named(a) if "-g2-" in k}
    with a.db.statement() as conn:
        mine = read_deployment_id(conn)
    assert {ks.key_owners()[k] for k in made} == {mine} and _committed(a) == made
    _close(a)
    deployments.remove(a)
    again = _open(home, url, token, deployments)
    assert initialize(again, None, "ec-p256")["created"] is False and _destroyed(again) == []
    assert public_key_pem(audit_signer(again.keystore)) == old_audit
    _signs(again)


def test_a_copy_started_while_the_live_rotation_is_under_way_leaves_that_rotations_keys(
        token: Token, deployments: list[AppContext], tmp_path: Path) -> None:
    """Should fix: a copy of the database (a staging copy, a restore) taken after a rotation committed its intents,
    and started against the production token while that rotation is between making its keys and its commit, found
    the intents, no CA row and no committed mark, took the keys for a killed rotation's and destroyed them: the live
    rotation then committed a generation without keys. Now a start destroys such a key only once its intent is
    ABANDONED_AFTER old (the live rotation commits within COMMIT_WITHIN of it, or rolls back): the copy leaves them,
    and the live deployment commits, marks and signs with them."""
    home, copy = tmp_path / "a", tmp_path / "copy"
    copy.mkdir(mode=0o700)
    a = _open(home, None, token, deployments)
    _init(a)
    before = _named(a)
    ks = a.keystore
    assert isinstance(ks, Pkcs11KeyStore)
    real_generate = ks.generate
    made: list[str] = []
    starts: list[subprocess.CompletedProcess[str]] = []

    def generate_then_a_copy_starts(key_id: str, kind: KeyKind) -> Signer:
        signer = real_generate(key_id, kind)
        made.append(key_id)
        if len(made) == 3:  # the generation's keys made, its transaction open: a copy starts, in a process of its own
            _sqlite_copy(home / DB_FILE, copy / DB_FILE)
            starts.append(_cli(_env(copy, None, token), "init", "--trust-domain", TD))
        return signer

    ks.generate = generate_then_a_copy_starts  # type: ignore[method-assign]
    assert rotate_cas(a, force=True, actor=ADMIN).prepared == 2
    ks.generate = real_generate  # type: ignore[method-assign]
    assert len(starts) == 1 and starts[0].returncode == 0, starts[0].stderr[-3000:]
    assert "left for a later start" in starts[0].stderr, starts[0].stderr[-3000:]
    later = _named(a) - before
    assert later == set(made) and later <= _labels(token), f"destroyed: {sorted(later - _labels(token))}"
    assert later <= _committed(a) and _destroyed(a) == []
    _signs(a)


def test_a_start_destroys_a_killed_rotations_key_only_once_its_intent_is_old(
        token: Token, new_database: Callable[[], str | None], deployments: list[AppContext], tmp_path: Path,
        caplog: pytest.LogCaptureFixture) -> None:
    """An unused, never committed key of this deployment named by an intent younger than ABANDONED_AFTER may be a
    rotation under way in a copy of this database: a start leaves it, says when it will go (log line, `ca keys`),
    and a start once the intent is that old destroys it."""
    from keys.intents import ABANDONED_AFTER, record_intents

    a = _open(tmp_path / "a", new_database(), token, deployments)
    _init(a)
    with a.db.statement() as conn:
        mine = read_deployment_id(conn)
    assert mine is not None
    record_intents(a.db, ["ca-g9-root-0a0a0a0a"], mine, a.clock())  # a rotation's, under way somewhere, or killed
    a.keystore.generate("ca-g9-root-0a0a0a0a", KeyKind.EC_P256)
    due = (a.clock() + ABANDONED_AFTER).isoformat()
    caplog.set_level(logging.WARNING, logger="workflows.init")
    caplog.clear()
    assert initialize(a, None, "ec-p256")["created"] is False
    assert "ca-g9-root-0a0a0a0a" in _labels(token) and _destroyed(a) == []
    lines = [r.getMessage() for r in caplog.records if r.name == "workflows.init"]
    assert len(lines) == 1 and "made under an intent younger than 10 minutes: left for a later start" in lines[0] \
        and lines[0].endswith(f"a start from {due} destroys them if still unused and never committed: "
                              "ca-g9-root-0a0a0a0a"), lines
    rows = {r["key_id"]: r["at_start"] for r in token_keys(a)}
    assert rows["ca-g9-root-0a0a0a0a"].startswith("kept for now: unused, and this database recorded it was about to "
                                                  "make it less than 10 minutes ago") and due in rows[
        "ca-g9-root-0a0a0a0a"]

    assert isinstance(a.clock, FrozenClock)
    a.clock.advance(ABANDONED_AFTER)
    assert {r["key_id"]: r["at_start"] for r in token_keys(a)}["ca-g9-root-0a0a0a0a"].startswith("destroyed: ")
    assert initialize(a, None, "ec-p256")["created"] is False
    assert "ca-g9-root-0a0a0a0a" not in _labels(token)
    assert [k for _t, k, _a, _i in _destroyed(a)] == ["ca-g9-root-0a0a0a0a"] and _intents(a) == set()
    _signs(a)


def test_a_rotation_that_cannot_commit_within_its_bound_rolls_back(
        token: Token, new_database: Callable[[], str | None], deployments: list[AppContext], tmp_path: Path) -> None:
    """Should fix: the bound a start waits out before destroying an intent's key holds only if the rotation commits
    well within it. A rotation that took COMMIT_WITHIN from its intents to its commit (stalled on a lock, a slow
    token) rolls back instead: its keys destroyed, its intents gone, nothing committed; the next one commits."""
    from core.errors import Unavailable
    from keys.intents import COMMIT_WITHIN

    a = _open(tmp_path / "a", new_database(), token, deployments)
    _init(a)
    before, held = _named(a), _labels(token)
    ks = a.keystore
    assert isinstance(ks, Pkcs11KeyStore) and isinstance(a.clock, FrozenClock)
    real_generate = ks.generate
    clock = a.clock

    def slow_generate(key_id: str, kind: KeyKind) -> Signer:
        clock.advance(COMMIT_WITHIN / 3)
        return real_generate(key_id, kind)

    ks.generate = slow_generate  # type: ignore[method-assign]
    with pytest.raises(Unavailable, match="CA generation 2 was not committed: 300 s passed since its key intents"):
        rotate_cas(a, force=True, actor=ADMIN)
    ks.generate = real_generate  # type: ignore[method-assign]
    assert _named(a) == before and _labels(token) == held and _intents(a) == set() and _committed(a) == before
    assert rotate_cas(a, force=True, actor=ADMIN).prepared == 2
    assert len(_named(a) - before) == 3 and _committed(a) == _named(a)


def _token_keys_job(ctx: AppContext) -> object:
    """One run of the server's background job that tends a token's keys (every replica, each CA rotation check)."""
    from api.background import server_jobs

    jobs = server_jobs(ctx, None)  # type: ignore[arg-type]  # (the trust anchors only the TLS job reads)
    return next(job for job in jobs.jobs if job.name == "token-keys").run()


def test_a_replica_serving_on_marks_the_keys_a_killed_replicas_rotation_committed(
        token: Token, new_database: Callable[[], str | None], deployments: list[AppContext], tmp_path: Path) -> None:
    """Should fix: a replica killed between its rotation's commit and the token's mark left the keys unmarked until
    some replica started again; the others served on, and all that while a copy of the database taken mid-rotation
    (a staging copy against the token) could take them for a killed rotation's. Now a background job every
    replica runs (each CA rotation check interval) marks them."""
    url = new_database()
    home = tmp_path / "a"
    a = _open(home, url, token, deployments)  # a replica that serves on
    _init(a)
    before = _named(a)
    _killed_after_its_commit("rotation", _env(home, url, token), tmp_path)  # another replica's rotation
    made = _named(a) - before
    assert len(made) == 3 and not made & _committed(a)
    _token_keys_job(a)
    assert _committed(a) == _named(a) and _destroyed(a) == []


def test_the_token_keys_job_destroys_a_killed_rotations_keys_once_their_intents_are_old(
        token: Token, new_database: Callable[[], str | None], deployments: list[AppContext], tmp_path: Path) -> None:
    """A start right after a kill leaves the killed rotation's keys (their intents are young); the background job of
    a serving replica destroys them once the intents are ABANDONED_AFTER old, without waiting for another start."""
    from keys.intents import ABANDONED_AFTER, record_intents

    a = _open(tmp_path / "a", new_database(), token, deployments)
    _init(a)
    with a.db.statement() as conn:
        mine = read_deployment_id(conn)
    assert mine is not None
    record_intents(a.db, ["ca-g9-root-0a0a0a0a"], mine, a.clock())  # killed just now
    a.keystore.generate("ca-g9-root-0a0a0a0a", KeyKind.EC_P256)
    assert initialize(a, None, "ec-p256")["created"] is False  # the start right after: left
    _token_keys_job(a)
    assert "ca-g9-root-0a0a0a0a" in _labels(token) and _destroyed(a) == []
    assert isinstance(a.clock, FrozenClock)
    a.clock.advance(ABANDONED_AFTER)
    _token_keys_job(a)
    assert "ca-g9-root-0a0a0a0a" not in _labels(token) and _intents(a) == set()
    assert [k for _t, k, _a, _i in _destroyed(a)] == ["ca-g9-root-0a0a0a0a"]
    _signs(a)


def test_a_start_completes_a_committed_mark_a_stopped_process_left_half_set(
        token: Token, deployments: list[AppContext], tmp_path: Path) -> None:
    """Should fix: a process stopped between marking a key's private object committed and its public one left the
    public object's old marker for ever: mark_committed_keys skipped every key whose private object said committed.
    The next start completes it."""
    from keys.deployment import committed_marker, marker

    home = tmp_path / "a"
    a = _open(home, None, token, deployments)
    _init(a)
    ks = a.keystore
    assert isinstance(ks, Pkcs11KeyStore)
    key_id = sorted(_named(a))[0]
    with a.db.statement() as conn:
        mine = read_deployment_id(conn)
    assert mine is not None
    for obj in ks._session.get_objects({Attribute.LABEL: key_id, Attribute.CLASS: ObjectClass.PUBLIC_KEY}):
        obj[Attribute.ID] = marker(mine, key_id)  # back to the half-set state: the private object marked, not this
    _close(a)
    deployments.remove(a)
    again = _open(home, None, token, deployments)
    assert initialize(again, None, "ec-p256")["created"] is False
    ks = again.keystore
    assert isinstance(ks, Pkcs11KeyStore)
    ids = {bytes(o[Attribute.ID]) for o in ks._session.get_objects({Attribute.LABEL: key_id})}
    assert ids == {committed_marker(mine, key_id)}
    _signs(again)
