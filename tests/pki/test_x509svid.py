"""X.509-SVIDs: accepted by py-spiffe, openssl and cryptography's verifier; the profile is exactly the
SPIFFE one; every rejected request leaves no SVID row and no audit event."""

from __future__ import annotations

import re
import subprocess
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID
from spiffe import TrustDomain, X509Bundle, X509Svid
from sqlmodel import select

from core.clock import FrozenClock
from core.errors import InvalidInput
from inventory.models import Workload
from keys.file import FileKeyStore
from keys.store import KeyKind
from pki import service
from pki.errors import (
    IdentityOutOfScope,
    IdentityRevoked,
    InvalidCSR,
    InvalidTTL,
    NotInitialized,
    TrustDomainMismatch,
    TTLTooLong,
    UnknownWorkload,
)
from pki.models import CertificateAuthority
from store.db import Database
from tests.pki.helpers import (
    ADMIN,
    TD,
    actions,
    counts,
    key_pem,
    make_csr,
    make_key,
    openssl_csr,
    register,
    verify_chain,
)


def _issue(db: Database, ks: FileKeyStore, clock: FrozenClock, **kw: object) -> service.IssuedX509:
    args: dict[str, object] = {"csr_pem": make_csr(), "tenant": "acme", "group": "web", "workload": "frontend",
                               "ttl": None, "actor": ADMIN, "scope_tenant": None, "clock": clock}
    args.update(kw)
    with db.session() as s:
        return service.issue_x509_svid(s, ks, **args)  # type: ignore[arg-type]


def _bundle_pem(db: Database) -> bytes:
    with db.read_session() as s:
        return service.bundle_pem(s)


def test_svid_is_accepted_by_py_spiffe_and_cryptography(
    pki_db: Database, keystore: FileKeyStore, clock: FrozenClock
) -> None:
    key = make_key()
    issued = _issue(pki_db, keystore, clock, csr_pem=make_csr(key))
    svid = X509Svid.parse(issued.full_chain_pem, key_pem(key))
    assert str(svid.spiffe_id) == "spiffe://example.org/tenant/acme/group/web/frontend" == issued.spiffe_id
    bundle = X509Bundle.parse(TrustDomain(TD), _bundle_pem(pki_db))
    roots = bundle.x509_authorities
    assert len(roots) == 1
    chain = verify_chain(issued.cert_pem, issued.chain_pem, _bundle_pem(pki_db), clock())
    assert [c.subject.rfc4514_string() for c in chain][1:] == [
        "CN=trustfabric issuing CA g1,OU=example.org,O=trustfabric",
        "CN=trustfabric root CA g1,OU=example.org,O=trustfabric",
    ]
    assert chain[-1] in roots


def test_openssl_verifies_leaf_through_issuing_to_root(
    pki_db: Database, keystore: FileKeyStore, clock: FrozenClock, tmp_path: Path
) -> None:
    issued = _issue(pki_db, keystore, clock)
    (tmp_path / "root.pem").write_bytes(_bundle_pem(pki_db))
    (tmp_path / "issuing.pem").write_bytes(issued.chain_pem[0])
    (tmp_path / "leaf.pem").write_bytes(issued.cert_pem)
    out = subprocess.run(
        ["openssl", "verify", "-attime", str(int(clock().timestamp())), "-CAfile", "root.pem",
         "-untrusted", "issuing.pem", "leaf.pem"], cwd=tmp_path, capture_output=True, text=True,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "leaf.pem: OK" in out.stdout
    # and the same leaf does not verify without the intermediate: the chain really goes through it
    bad = subprocess.run(["openssl", "verify", "-attime", str(int(clock().timestamp())), "-CAfile", "root.pem",
                          "leaf.pem"], cwd=tmp_path, capture_output=True, text=True)
    assert bad.returncode != 0


def test_leaf_profile(pki_db: Database, keystore: FileKeyStore, clock: FrozenClock) -> None:
    issued = _issue(pki_db, keystore, clock)
    cert = x509.load_pem_x509_certificate(issued.cert_pem)
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert list(san) == [x509.UniformResourceIdentifier(issued.spiffe_id)]
    bc = cert.extensions.get_extension_for_class(x509.BasicConstraints)
    assert bc.critical and bc.value.ca is False
    ku = cert.extensions.get_extension_for_class(x509.KeyUsage)
    assert ku.critical and ku.value.digital_signature and not ku.value.key_cert_sign and not ku.value.crl_sign
    eku = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert set(eku) == {ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH}
    assert cert.not_valid_after_utc == clock() + timedelta(hours=1)  # default TTL
    assert issued.expires_at == cert.not_valid_after_utc
    assert format(cert.serial_number, "x") == issued.serial
    assert actions(pki_db)[-1] == "svid.issue"


def test_serials_unique(sqlite_pki: Database, keystore: FileKeyStore, clock: FrozenClock) -> None:
    serials = {_issue(sqlite_pki, keystore, clock).serial for _ in range(20)}
    assert len(serials) == 20


def test_csr_requests_for_ca_and_sans_never_reach_the_certificate(
    pki_db: Database, keystore: FileKeyStore, clock: FrozenClock
) -> None:
    csr = make_csr(ca=True, cn="root-of-all-evil", sans=[
        x509.UniformResourceIdentifier("spiffe://example.org/tenant/globex/group/train/trainer-0"),
        x509.DNSName("evil.example"),
    ])
    issued = _issue(pki_db, keystore, clock, csr_pem=csr)
    cert = x509.load_pem_x509_certificate(issued.cert_pem)
    assert list(cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value) == [
        x509.UniformResourceIdentifier("spiffe://example.org/tenant/acme/group/web/frontend")]
    assert cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca is False
    assert "root-of-all-evil" not in cert.subject.rfc4514_string()


def _bad_signature_csr() -> bytes:
    der = bytearray(x509.load_pem_x509_csr(make_csr()).public_bytes(serialization.Encoding.DER))
    der[-5] ^= 0x01  # inside the signature value
    return x509.load_der_x509_csr(bytes(der)).public_bytes(serialization.Encoding.PEM)


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"csr_pem": "BAD"}, InvalidCSR, "not a PEM-encoded"),
        ({"csr_pem": "BADSIG"}, InvalidCSR, "signature does not verify"),
        ({"tenant": "globex", "group": "train", "workload": "trainer-0", "scope_tenant": "acme"},
         IdentityOutOfScope, "/tenant/acme/"),
        ({"workload": "ghost"}, UnknownWorkload, "not registered"),
        ({"tenant": "Acme"}, InvalidInput, "DNS label"),
        ({"ttl": timedelta(hours=25)}, TTLTooLong, "above the maximum"),
        ({"ttl": timedelta(seconds=-1)}, InvalidTTL, "positive"),
    ],
    ids=["garbage-csr", "bad-signature", "other-tenant", "unregistered", "bad-slug", "ttl-too-long", "ttl-negative"],
)
def test_rejections_store_nothing(
    pki_db: Database, keystore: FileKeyStore, clock: FrozenClock, kwargs: dict[str, object],
    error: type[Exception], message: str,
) -> None:
    if kwargs.get("csr_pem") == "BAD":
        kwargs = {**kwargs, "csr_pem": b"-----BEGIN CERTIFICATE REQUEST-----\nnope\n"}
    if kwargs.get("csr_pem") == "BADSIG":
        kwargs = {**kwargs, "csr_pem": _bad_signature_csr()}
    before = counts(pki_db)
    with pytest.raises(error, match=message):
        _issue(pki_db, keystore, clock, **kwargs)
    assert counts(pki_db) == before


@pytest.mark.parametrize(("key_type", "digest", "named"), [
    ("ec", "sha1", "ecdsa-with-SHA1 (SHA-1)"), ("rsa", "sha1", "sha1WithRSAEncryption (SHA-1)"),
    ("rsa", "md5", "md5WithRSAEncryption (MD5)"),
])
def test_csr_signed_with_a_weak_hash_is_refused_naming_the_algorithm(
    pki_db: Database, keystore: FileKeyStore, clock: FrozenClock, key_type: str, digest: str, named: str,
) -> None:
    """It was refused as "signature does not verify", which sends the person looking for the wrong key."""
    before = counts(pki_db)
    with pytest.raises(InvalidCSR, match=re.escape(f"signature algorithm {named} is not accepted")):
        _issue(pki_db, keystore, clock, csr_pem=openssl_csr(key_type, digest))
    assert counts(pki_db) == before


def test_tenant_principal_gets_its_own_ids(pki_db: Database, keystore: FileKeyStore, clock: FrozenClock) -> None:
    issued = _issue(pki_db, keystore, clock, scope_tenant="acme")
    assert issued.spiffe_id.startswith("spiffe://example.org/tenant/acme/")


def test_registration_outside_its_tenant_namespace_is_refused(
    sqlite_pki: Database, keystore: FileKeyStore, clock: FrozenClock
) -> None:
    """Defence in depth: a registration row pointing into another namespace is never honoured."""
    with sqlite_pki.session() as s:
        register(s, "acme", "web", "sneaky", spiffe_id="spiffe://example.org/tenant/globex/group/train/x")
    before = counts(sqlite_pki)
    with pytest.raises(IdentityOutOfScope):
        _issue(sqlite_pki, keystore, clock, workload="sneaky", scope_tenant="acme")
    with pytest.raises(IdentityOutOfScope):
        _issue(sqlite_pki, keystore, clock, workload="sneaky")
    assert counts(sqlite_pki) == before


def test_revoked_workload_flag_blocks_issuance(
    sqlite_pki: Database, keystore: FileKeyStore, clock: FrozenClock
) -> None:
    with sqlite_pki.session() as s:
        row = s.exec(select(Workload).where(Workload.name == "frontend")).one()
        row.revoked = True
        s.add(row)
    before = counts(sqlite_pki)
    with pytest.raises(IdentityRevoked):
        _issue(sqlite_pki, keystore, clock)
    assert counts(sqlite_pki) == before


def test_svid_never_outlives_its_issuer(sqlite_pki: Database, keystore: FileKeyStore, clock: FrozenClock) -> None:
    with sqlite_pki.read_session() as s:
        ca = s.exec(select(CertificateAuthority).where(CertificateAuthority.id == "g1-issuing")).one()
    ca_end = x509.load_pem_x509_certificate(ca.cert_pem.encode()).not_valid_after_utc
    clock.now = ca_end - timedelta(minutes=20)  # no rotation ran: the CA has 20 minutes left
    issued = _issue(sqlite_pki, keystore, clock, ttl=timedelta(hours=2))
    assert issued.expires_at == ca_end
    assert x509.load_pem_x509_certificate(issued.cert_pem).not_valid_after_utc == ca_end


def test_init_is_idempotent_and_refuses_another_trust_domain(
    pki_db: Database, keystore: FileKeyStore, clock: FrozenClock
) -> None:
    before = counts(pki_db)
    with pki_db.session() as s:
        assert service.init_trust_domain(s, keystore, trust_domain=TD, clock=clock) is False
        assert service.trust_domain(s) == TD
    assert counts(pki_db) == before
    with pytest.raises(TrustDomainMismatch), pki_db.session() as s:
        service.init_trust_domain(s, keystore, trust_domain="other.org", clock=clock)
    assert counts(pki_db) == before


def test_p384_trust_domain(sqlite_db: Database, keystore: FileKeyStore, clock: FrozenClock) -> None:
    with sqlite_db.session() as s:
        assert service.trust_domain(s) is None
        with pytest.raises(NotInitialized):
            service.bundle_jwks(s)
        service.init_trust_domain(s, keystore, trust_domain=TD, key_kind=KeyKind.EC_P384, clock=clock)
        register(s, "acme", "web", "frontend")
    issued = _issue(sqlite_db, keystore, clock)
    chain = verify_chain(issued.cert_pem, issued.chain_pem, _bundle_pem(sqlite_db), clock())
    assert chain[-1].signature_hash_algorithm is not None
    assert chain[-1].signature_hash_algorithm.name == "sha384"
    with sqlite_db.read_session() as s:
        crv = {k["crv"] for k in service.bundle_jwks(s)["keys"] if k["use"] == "x509-svid"}
    assert crv == {"P-384"}
    assert actions(sqlite_db) == ["ca.init", "svid.issue"]


def test_server_svid_has_dns_and_ip(sqlite_pki: Database, keystore: FileKeyStore, clock: FrozenClock) -> None:
    with sqlite_pki.session() as s:
        issued = service.issue_server_svid(s, keystore, csr_pem=make_csr(), clock=clock)
    cert = x509.load_pem_x509_certificate(issued.cert_pem)
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.UniformResourceIdentifier) == ["spiffe://example.org/trustfabric/server"]
    assert san.get_values_for_type(x509.DNSName) == ["localhost"]
    assert [str(ip) for ip in san.get_values_for_type(x509.IPAddress)] == ["127.0.0.1"]


@pytest.mark.parametrize("kind", ["p256", "p384", "ed25519", "rsa"])
def test_leaf_is_byte_for_byte_what_typed_extensions_give(keystore: FileKeyStore, kind: str) -> None:
    """build_leaf's shortcuts (constant extensions and the AKI encoded once per issuing CA, the SKI of an EC key
    hashed from its point, a subject kept by the caller) change no byte of what is signed: the TBSCertificate equals
    the one cryptography builds from typed extensions in the same order."""
    import ipaddress
    from datetime import UTC, datetime

    from cryptography.hazmat.primitives.asymmetric import ed25519, rsa
    from cryptography.x509.oid import NameOID

    from pki.ca import sign_certificate
    from pki.spiffe_id import SpiffeId
    from pki.x509svid import build_leaf, leaf_subject

    ca_signer = keystore.generate("test-ca", KeyKind.EC_P256)
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "test issuing CA")])
    now = datetime.now(UTC).replace(microsecond=0)
    ca_public = ca_signer.private_key().public_key()
    ca_cert = sign_certificate(
        x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name).public_key(ca_public)
        .serial_number(7).not_valid_before(now).not_valid_after(now + timedelta(days=1))
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_public), critical=False), ca_signer)
    makers: dict[str, Callable[[], ec.EllipticCurvePrivateKey | ed25519.Ed25519PrivateKey | rsa.RSAPrivateKey]] = {
        "p256": lambda: ec.generate_private_key(ec.SECP256R1()), "p384": lambda: ec.generate_private_key(
            ec.SECP384R1()), "ed25519": ed25519.Ed25519PrivateKey.generate,
        "rsa": lambda: rsa.generate_private_key(public_exponent=65537, key_size=2048)}
    private = makers[kind]()
    public = private.public_key()
    sid = SpiffeId(TD, "/tenant/acme/group/web/" + "w" * 70)  # a CN cut to 64 characters
    dns, ips = ["svc.example.org"], ["10.1.2.3", "fd00::1"]
    for subject in (None, leaf_subject(sid)):
        leaf = build_leaf(public_key=public, spiffe_id=sid, issuer_cert=ca_cert, issuer_key=ca_signer,
                          serial=2**150 + 5, not_before=now, not_after=now + timedelta(hours=1), dns_names=dns,
                          ip_addresses=ips, subject=subject)
        typed = (
            x509.CertificateBuilder().issuer_name(ca_name)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, content_commitment=False, key_encipherment=False,
                                         data_encipherment=False, key_agreement=False, key_cert_sign=False,
                                         crl_sign=False, encipher_only=False, decipher_only=False), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]),
                           critical=False)
            .subject_name(x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "trustfabric"),
                                     x509.NameAttribute(NameOID.COMMON_NAME, "w" * 64)]))
            .public_key(public).serial_number(2**150 + 5).not_valid_before(now)
            .not_valid_after(now + timedelta(hours=1))
            .add_extension(x509.SubjectAlternativeName(
                [x509.UniformResourceIdentifier(str(sid)), x509.DNSName(dns[0]),
                 *(x509.IPAddress(ipaddress.ip_address(ip)) for ip in ips)]), critical=False)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(public), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(
                ca_cert.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value), critical=False)
        )
        reference = sign_certificate(typed, ca_signer)
        assert leaf.tbs_certificate_bytes == reference.tbs_certificate_bytes
        leaf.verify_directly_issued_by(ca_cert)
        assert isinstance(leaf.extensions.get_extension_for_class(x509.KeyUsage).value, x509.KeyUsage)


def _der_length(n: int) -> bytes:
    return bytes([n]) if n < 0x80 else bytes([0x80 | ((n.bit_length() + 7) // 8)]) + n.to_bytes(
        (n.bit_length() + 7) // 8, "big")


def _resigned(csr_der: bytes, tbs: bytes, signature: bytes) -> bytes:
    """The request `csr_der` with its signature value replaced by `signature` (its TBS and algorithm kept)."""
    rest = csr_der[csr_der.index(tbs) + len(tbs):]
    algorithm = rest[: 2 + rest[1]]  # a short SEQUENCE: the signature algorithm identifier
    bits = b"\x03" + _der_length(len(signature) + 1) + b"\x00" + signature
    content = tbs + algorithm + bits
    return b"\x30" + _der_length(len(content)) + content


@pytest.mark.parametrize("kind", ["p256-sha256", "p256-sha512", "p384-sha384", "p384-sha256", "ed25519",
                                  "rsa-sha256", "rsa-pss"])
def test_every_accepted_csr_kind_is_verified_and_any_change_refused(kind: str) -> None:
    """parse_csr verifies an EC key's ECDSA signature with the key it loaded (pki/x509svid.py _signature_valid) and
    any other kind through is_signature_valid: a valid request of each accepted kind passes; a flipped signature
    bit, a changed subject, and a signature by another key of the same kind are each refused."""
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ed25519, padding, rsa
    from cryptography.x509.oid import NameOID

    from pki.x509svid import parse_csr

    def key() -> Any:
        if kind.startswith("p256"):
            return ec.generate_private_key(ec.SECP256R1())
        if kind.startswith("p384"):
            return ec.generate_private_key(ec.SECP384R1())
        if kind == "ed25519":
            return ed25519.Ed25519PrivateKey.generate()
        return rsa.generate_private_key(public_exponent=65537, key_size=2048)

    digests: dict[str, hashes.SHA256 | hashes.SHA384 | hashes.SHA512] = {
        "sha256": hashes.SHA256(), "sha384": hashes.SHA384(), "sha512": hashes.SHA512()}
    digest = None if kind == "ed25519" else digests[kind.split("-")[-1] if kind != "rsa-pss" else "sha256"]
    pss = padding.PSS(mgf=padding.MGF1(hashes.SHA256()), salt_length=32) if kind == "rsa-pss" else None

    def request(private: Any) -> x509.CertificateSigningRequest:
        builder = x509.CertificateSigningRequestBuilder().subject_name(
            x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "whatever")]))
        return builder.sign(private, digest, rsa_padding=pss)

    def sign(private: Any, data: bytes) -> bytes:
        if kind == "ed25519":
            return bytes(private.sign(data))
        assert digest is not None  # every kind but ed25519 has one
        if isinstance(private, rsa.RSAPrivateKey):
            return bytes(private.sign(data, pss or padding.PKCS1v15(), digest))
        return bytes(private.sign(data, ec.ECDSA(digest)))

    def pem(der: bytes) -> bytes:
        return x509.load_der_x509_csr(der).public_bytes(serialization.Encoding.PEM)

    mine = key()
    csr = request(mine)
    der = csr.public_bytes(serialization.Encoding.DER)
    got = parse_csr(csr.public_bytes(serialization.Encoding.PEM))
    assert got.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo) == \
        mine.public_key().public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    flipped = bytearray(der)
    flipped[-3] ^= 0x01  # inside the signature value
    changed = der.replace(b"whatever", b"whatevex")  # the subject: the signed bytes differ
    other = _resigned(der, csr.tbs_certrequest_bytes, sign(key(), csr.tbs_certrequest_bytes))
    assert _resigned(der, csr.tbs_certrequest_bytes, sign(mine, csr.tbs_certrequest_bytes)) != other
    parse_csr(pem(_resigned(der, csr.tbs_certrequest_bytes, sign(mine, csr.tbs_certrequest_bytes))))  # helper sound
    for bad in (bytes(flipped), changed, other):
        with pytest.raises(InvalidCSR, match=r"does not verify|cannot be checked"):
            parse_csr(pem(bad))
