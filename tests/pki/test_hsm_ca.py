"""A trust domain whose CA keys live in SoftHSM2: the token signs the CA certificates and the SVIDs,
and everything verifies with openssl and cryptography."""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
from cryptography import x509
from pkcs11 import Attribute
from sqlmodel import select

from audit.errors import InvalidAuditEvent
from core.clock import FrozenClock
from keys.pkcs11 import Pkcs11KeyStore, Pkcs11Signer
from pki import service
from pki.models import CertificateAuthority
from store.db import Database
from tests.keys.stores import PIN, softhsm_token, token_objects
from tests.pki.helpers import ADMIN, TD, make_csr, register, verify_chain
from workflows.context import AppContext
from workflows.settings import Settings

pytestmark = pytest.mark.hsm


def test_softhsm_backed_ca_issues_svids_that_verify(
    sqlite_db: Database, clock: FrozenClock, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    module, label = softhsm_token(tmp_path, monkeypatch)
    ks = Pkcs11KeyStore(module, label, PIN)
    try:
        with sqlite_db.session() as s:
            assert service.init_trust_domain(s, ks, trust_domain=TD, clock=clock)
            register(s, "acme", "web", "frontend")
        with sqlite_db.session() as s:
            issued = service.issue_x509_svid(s, ks, csr_pem=make_csr(), tenant="acme", group="web",
                                             workload="frontend", ttl=None, actor=ADMIN, scope_tenant=None,
                                             clock=clock)
            roots = service.bundle_pem(s)
            cas = s.exec(select(CertificateAuthority)).all()
            crl = x509.load_der_x509_crl(service.crl_der(s, ks, clock))
        # the CA keys are token objects that were never extractable
        for ca in cas:
            signer = ks.get(ca.key_id)
            assert isinstance(signer, Pkcs11Signer)
            assert signer.handle[Attribute.NEVER_EXTRACTABLE] is True
            assert signer.handle[Attribute.LOCAL] is True
        root = x509.load_pem_x509_certificate(roots)
        assert root.public_key() == ks.get(next(c.key_id for c in cas if c.role == "root")).public_key()
        chain = verify_chain(issued.cert_pem, issued.chain_pem, roots, clock())
        assert len(chain) == 3
        assert crl.is_signature_valid(chain[1].public_key())  # type: ignore[arg-type]
        (tmp_path / "root.pem").write_bytes(roots)
        (tmp_path / "issuing.pem").write_bytes(issued.chain_pem[0])
        (tmp_path / "leaf.pem").write_bytes(issued.cert_pem)
        out = subprocess.run(["openssl", "verify", "-CAfile", "root.pem", "-untrusted", "issuing.pem", "leaf.pem"],
                             cwd=tmp_path, capture_output=True, text=True)
        assert out.returncode == 0, out.stdout + out.stderr
        # nothing private landed on disk beside the token store
        assert not list(tmp_path.glob("**/*.key"))
        # and JWT-SVIDs are signed by the token too
        with sqlite_db.session() as s:
            tok = service.issue_jwt_svid(s, ks, tenant="acme", group="web", workload="frontend", audience=["x"],
                                         ttl=None, actor=ADMIN, scope_tenant=None, clock=clock)
        assert tok.token.count(".") == 2
    finally:
        ks.close()


class _Failed(Exception):
    pass


def _refused_audit_event(ctx: AppContext) -> None:
    """A rotation whose ca.prepare event is refused (a request id over the limit), after it made its keys."""
    with pytest.raises(InvalidAuditEvent, match="request id"), ctx.db.session() as s:
        service.rotate(s, ctx.keystore, force=True, actor=ADMIN, clock=ctx.clock, request_id="r" * 129)


def _failure_after_the_rotation(ctx: AppContext) -> None:
    """A step after the rotation, in its transaction, fails."""
    with pytest.raises(_Failed), ctx.db.session() as s:
        assert service.rotate(s, ctx.keystore, force=True, actor=ADMIN, clock=ctx.clock).prepared == 2
        raise _Failed


@pytest.mark.parametrize("fail", [_refused_audit_event, _failure_after_the_rotation])
def test_a_rotation_that_rolls_back_leaves_no_key_in_the_token(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, clock: FrozenClock,
        fail: Callable[[AppContext], None]) -> None:
    """Should fix: a CA rotation that failed after generating its keys (or was rolled back) left the three new key
    pairs in the HSM, orphan private keys no CA generation names. Run as a server opens its key store (AppContext:
    TRUSTFABRIC_KEYSTORE=pkcs11 beside its database); the token's objects as another process lists them."""
    module, label = softhsm_token(tmp_path, monkeypatch)
    ctx = AppContext.open(Settings(home=tmp_path / "home", keystore="pkcs11", pkcs11_module=module,
                                   pkcs11_token=label, pkcs11_pin=PIN), create=True, clock=clock)
    try:
        with ctx.db.session() as s:
            assert service.init_trust_domain(s, ctx.keystore, trust_domain=TD, clock=clock)
        before = token_objects(module, label)
        assert len(before) == 6  # generation 1: root, issuing and JWT key pairs, committed with their CA rows
        fail(ctx)
        assert token_objects(module, label) == before
        with ctx.db.session() as s:  # the rotation again, committed: its keys stay, both halves of each
            assert service.rotate(s, ctx.keystore, force=True, actor=ADMIN, clock=clock).activated == 2
            named = {k for ca in s.exec(select(CertificateAuthority)).all() for k in (ca.key_id, ca.jwt_key_id) if k}
        after = token_objects(module, label)
        assert {key_id for key_id, _ in after} == named and len(named) == 6
        assert after == {(key_id, cls) for key_id in named for cls in ("PRIVATE_KEY", "PUBLIC_KEY")}
    finally:
        assert isinstance(ctx.keystore, Pkcs11KeyStore)
        ctx.keystore.close()
        ctx.close()
