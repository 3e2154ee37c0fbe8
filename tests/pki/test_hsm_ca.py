"""A trust domain whose CA keys live in SoftHSM2: the token signs the CA certificates and the SVIDs,
and everything verifies with openssl and cryptography."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from cryptography import x509
from pkcs11 import Attribute
from sqlmodel import select

from core.clock import FrozenClock
from keys.pkcs11 import Pkcs11KeyStore, Pkcs11Signer
from pki import service
from pki.models import CertificateAuthority
from store.db import Database
from tests.keys.stores import PIN, softhsm_token
from tests.pki.helpers import ADMIN, TD, make_csr, register, verify_chain

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
