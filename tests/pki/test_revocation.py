"""Revocation by serial and by identity: the deny lists are queryable, CRLs are signed by the issuing CA
and openssl refuses a revoked leaf; a tenant cannot touch another tenant's SVIDs."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from cryptography import x509

from core.clock import FrozenClock
from core.errors import InvalidInput
from keys.file import FileKeyStore
from pki import service
from pki.errors import AlreadyRevoked, IdentityNotFound, IdentityOutOfScope, IdentityRevoked, SvidNotFound
from store.db import Database
from tests.pki.helpers import ADMIN, actions, counts, make_csr


def _issue(db: Database, ks: FileKeyStore, clock: FrozenClock, tenant: str = "acme", group: str = "web",
           workload: str = "frontend") -> service.IssuedX509:
    with db.session() as s:
        return service.issue_x509_svid(s, ks, csr_pem=make_csr(), tenant=tenant, group=group, workload=workload,
                                       ttl=None, actor=ADMIN, scope_tenant=None, clock=clock)


def _revoke(db: Database, clock: FrozenClock, **kw: object) -> list[str]:
    args: dict[str, object] = {"reason": "key compromise", "actor": ADMIN, "scope_tenant": None, "clock": clock}
    args.update(kw)
    with db.session() as s:
        return service.revoke(s, **args)  # type: ignore[arg-type]


def test_revoke_serial_crl_and_openssl(
    pki_db: Database, keystore: FileKeyStore, clock: FrozenClock, tmp_path: Path
) -> None:
    bad = _issue(pki_db, keystore, clock)
    good = _issue(pki_db, keystore, clock)
    assert _revoke(pki_db, clock, serial=bad.serial.upper()) == [bad.serial]
    assert actions(pki_db)[-1] == "svid.revoke"
    with pki_db.read_session() as s:
        assert service.revoked_serials(s) == [bad.serial]
        der = service.crl_der(s, keystore, clock)
        pem = service.crl_pem(s, keystore, clock)
        roots = service.bundle_pem(s)
    crl = x509.load_der_x509_crl(der)
    issuing = x509.load_pem_x509_certificate(bad.chain_pem[0])
    assert crl.is_signature_valid(issuing.public_key())  # type: ignore[arg-type]
    assert crl.issuer == issuing.subject
    assert crl.get_revoked_certificate_by_serial_number(int(bad.serial, 16)) is not None
    assert crl.get_revoked_certificate_by_serial_number(int(good.serial, 16)) is None
    (tmp_path / "root.pem").write_bytes(roots)
    (tmp_path / "issuing.pem").write_bytes(bad.chain_pem[0])
    (tmp_path / "crl.pem").write_bytes(pem)
    at = str(int(clock().timestamp()))
    results = {}
    for name, issued in (("bad", bad), ("good", good)):
        (tmp_path / f"{name}.pem").write_bytes(issued.cert_pem)
        results[name] = subprocess.run(
            ["openssl", "verify", "-attime", at, "-crl_check", "-CRLfile", "crl.pem", "-CAfile", "root.pem",
             "-untrusted", "issuing.pem", f"{name}.pem"], cwd=tmp_path, capture_output=True, text=True)
    assert results["good"].returncode == 0, results["good"].stdout + results["good"].stderr
    assert results["bad"].returncode != 0 and "revoked" in results["bad"].stdout + results["bad"].stderr
    # revoking twice is a clear conflict, and changes nothing
    before = counts(pki_db)
    with pytest.raises(AlreadyRevoked):
        _revoke(pki_db, clock, serial=bad.serial)
    assert counts(pki_db) == before


def test_revoke_identity_blocks_new_svids(pki_db: Database, keystore: FileKeyStore, clock: FrozenClock) -> None:
    a = _issue(pki_db, keystore, clock)
    b = _issue(pki_db, keystore, clock, workload="backend")
    other = _issue(pki_db, keystore, clock, tenant="globex", group="train", workload="trainer-0")
    revoked = _revoke(pki_db, clock, tenant="acme", group="web", workload="frontend")
    assert revoked == [a.serial]
    with pki_db.read_session() as s:
        ids = service.revoked_identities(s)
        assert [i.spiffe_id_prefix for i in ids] == ["spiffe://example.org/tenant/acme/group/web/frontend"]
        assert set(service.revoked_serials(s)) == {a.serial}
    before = counts(pki_db)
    with pytest.raises(IdentityRevoked, match="revoked"):
        _issue(pki_db, keystore, clock)
    assert counts(pki_db) == before
    # a whole group: the backend goes too, the other tenant is untouched
    assert _revoke(pki_db, clock, tenant="acme", group="web") == [b.serial]
    with pytest.raises(IdentityRevoked):
        _issue(pki_db, keystore, clock, workload="backend")
    with pki_db.read_session() as s:
        assert other.serial not in service.revoked_serials(s)
    assert actions(pki_db)[-2:] == ["identity.revoke", "identity.revoke"]
    # the same identity again changes nothing, so it records nothing: a clear conflict instead
    before = counts(pki_db)
    with pytest.raises(AlreadyRevoked, match="was revoked"):
        _revoke(pki_db, clock, tenant="acme", group="web")
    assert counts(pki_db) == before and actions(pki_db)[-1] == "identity.revoke"


def test_tenant_scope_on_revocation(pki_db: Database, keystore: FileKeyStore, clock: FrozenClock) -> None:
    theirs = _issue(pki_db, keystore, clock, tenant="globex", group="train", workload="trainer-0")
    before = counts(pki_db)
    with pytest.raises(SvidNotFound):
        _revoke(pki_db, clock, serial=theirs.serial, scope_tenant="acme")
    with pytest.raises(IdentityOutOfScope):
        _revoke(pki_db, clock, tenant="globex", scope_tenant="acme")
    assert counts(pki_db) == before
    mine = _issue(pki_db, keystore, clock)
    assert _revoke(pki_db, clock, serial=mine.serial, scope_tenant="acme") == [mine.serial]


@pytest.mark.parametrize("kwargs", [
    {"serial": "zz"}, {"serial": "ab", "tenant": "acme"}, {}, {"tenant": "acme", "workload": "x"},
    {"tenant": "acme", "reason": " "}, {"serial": "0" * 41},
])
def test_bad_revocation_requests(sqlite_pki: Database, clock: FrozenClock, kwargs: dict[str, object]) -> None:
    before = counts(sqlite_pki)
    with pytest.raises(InvalidInput):
        _revoke(sqlite_pki, clock, **kwargs)
    assert counts(sqlite_pki) == before


def test_unknown_serial(sqlite_pki: Database, clock: FrozenClock) -> None:
    with pytest.raises(SvidNotFound):
        _revoke(sqlite_pki, clock, serial="abcdef")


def test_an_identity_that_names_nothing_is_not_found(sqlite_pki: Database, clock: FrozenClock) -> None:
    """Revoking a tenant, group or workload that is not registered and never held an SVID (a typo: `acmee`) revoked
    nothing, recorded an identity.revoke event and a revoked prefix (which a tenant of that name created later would
    be born under) and answered success; the serial form of the same mistake was already SvidNotFound. Registered
    ones still revoke with no SVID issued yet."""
    before = counts(sqlite_pki)
    for kw in ({"tenant": "acmee"}, {"tenant": "acme", "group": "wbe"}, {"tenant": "acme", "group": "web",
                                                                         "workload": "frontedn"}):
        with pytest.raises(IdentityNotFound, match="nothing to revoke under spiffe://"):
            _revoke(sqlite_pki, clock, **kw)
    assert counts(sqlite_pki) == before
    assert _revoke(sqlite_pki, clock, tenant="acme", group="web", workload="frontend") == []
    assert _revoke(sqlite_pki, clock, tenant="globex") == []
    assert actions(sqlite_pki)[-2:] == ["identity.revoke", "identity.revoke"]
