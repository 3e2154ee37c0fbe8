"""X.509-SVID construction: CSR checks and the leaf certificate profile.

Only the CSR's public key is used. Whatever else the CSR asks for (subject, SANs, CA=true, key usages)
never reaches the certificate: the SPIFFE ID comes from the registration.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import NamedTuple

from cryptography import x509
from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, ExtensionOID, NameOID, SignatureAlgorithmOID

from keys.store import Signer
from pki.ca import sign_certificate
from pki.errors import InvalidCSR
from pki.spiffe_id import SpiffeId

MAX_CSR_BYTES = 16 * 1024
LeafPublicKey = ec.EllipticCurvePublicKey | ed25519.Ed25519PublicKey | rsa.RSAPublicKey
S = SignatureAlgorithmOID
# The CSR's self-signature proves possession of its key only with a collision-resistant hash: SHA-2 of 256 bits or
# more (RSA-PSS: its parameters' hash, checked below), or Ed25519. MD5 and SHA-1 are refused by name.
ACCEPTED_SIGNATURES = frozenset({
    S.ECDSA_WITH_SHA256, S.ECDSA_WITH_SHA384, S.ECDSA_WITH_SHA512, S.RSA_WITH_SHA256, S.RSA_WITH_SHA384,
    S.RSA_WITH_SHA512, S.RSASSA_PSS, S.ED25519,
})
SIGNATURE_NAMES = {  # the refused ones a legacy client is likely to send; any other is named by its OID
    S.RSA_WITH_MD5: "md5WithRSAEncryption (MD5)", S.RSA_WITH_SHA1: "sha1WithRSAEncryption (SHA-1)",
    S.ECDSA_WITH_SHA1: "ecdsa-with-SHA1 (SHA-1)", S.DSA_WITH_SHA1: "dsa-with-sha1 (SHA-1)",
    S.RSA_WITH_SHA224: "sha224WithRSAEncryption (SHA-224)", S.ECDSA_WITH_SHA224: "ecdsa-with-SHA224 (SHA-224)",
    S.DSA_WITH_SHA224: "dsa-with-sha224", S.DSA_WITH_SHA256: "dsa-with-sha256", S.ED448: "Ed448",
}
STRONG_HASHES = ("sha256", "sha384", "sha512")


def check_signature_algorithm(csr: x509.CertificateSigningRequest) -> None:
    """InvalidCSR naming the CSR's signature algorithm when it is not accepted: said before the signature is
    checked, since a weak one may not even be verifiable ("does not verify" would send the person looking for
    the wrong key)."""
    oid = csr.signature_algorithm_oid
    weak = oid not in ACCEPTED_SIGNATURES
    name = SIGNATURE_NAMES.get(oid, f"OID {oid.dotted_string}")
    if not weak and oid == S.RSASSA_PSS:
        try:
            digest = csr.signature_hash_algorithm
        except UnsupportedAlgorithm:
            digest = None
        weak = digest is None or digest.name not in STRONG_HASHES
        name = f"RSASSA-PSS with {digest.name if digest is not None else 'an unknown hash'}"
    if weak:
        raise InvalidCSR(f"CSR signature algorithm {name} is not accepted: sign the request with SHA-256 or "
                         "stronger (ECDSA or RSA with SHA-256/384/512, RSA-PSS, or Ed25519)")


_ECDSA = {S.ECDSA_WITH_SHA256: ec.ECDSA(hashes.SHA256()), S.ECDSA_WITH_SHA384: ec.ECDSA(hashes.SHA384()),
          S.ECDSA_WITH_SHA512: ec.ECDSA(hashes.SHA512())}


def _signature_valid(csr: x509.CertificateSigningRequest, key: object) -> bool:
    """Whether the CSR's self-signature verifies under `key`, its own public key. An EC key signed with ECDSA (what
    nearly every requester sends) is verified with the key already loaded: is_signature_valid loads the key from
    the request again (~5-10 us of each issuance's CPU) and then makes the same verification. Anything else goes
    to is_signature_valid, which also refuses a key that does not match the algorithm."""
    ecdsa = _ECDSA.get(csr.signature_algorithm_oid)
    if ecdsa is not None and isinstance(key, ec.EllipticCurvePublicKey):
        try:
            key.verify(csr.signature, csr.tbs_certrequest_bytes, ecdsa)
        except InvalidSignature:
            return False
        return True
    return csr.is_signature_valid


def parse_csr(csr_pem: bytes | str) -> LeafPublicKey:
    """The CSR's public key after checking its self-signature; InvalidCSR saying why otherwise."""
    data = csr_pem.encode() if isinstance(csr_pem, str) else bytes(csr_pem)
    if len(data) > MAX_CSR_BYTES:
        raise InvalidCSR(f"CSR is larger than {MAX_CSR_BYTES} bytes")
    try:
        csr = x509.load_pem_x509_csr(data)
    except ValueError:
        raise InvalidCSR("CSR is not a PEM-encoded PKCS#10 request (-----BEGIN CERTIFICATE REQUEST-----)") from None
    check_signature_algorithm(csr)
    try:
        key = csr.public_key()
        valid = _signature_valid(csr, key)
    except (ValueError, TypeError, x509.UnsupportedGeneralNameType) as exc:
        raise InvalidCSR(f"CSR cannot be checked: {exc}") from None
    if not valid:
        raise InvalidCSR("CSR signature does not verify: the request was not signed by the key it carries")
    if isinstance(key, ec.EllipticCurvePublicKey):
        if not isinstance(key.curve, ec.SECP256R1 | ec.SECP384R1):
            raise InvalidCSR(f"CSR key curve {key.curve.name} is not accepted (use P-256 or P-384)")
        return key
    if isinstance(key, ed25519.Ed25519PublicKey):
        return key
    if isinstance(key, rsa.RSAPublicKey):
        if key.key_size < 2048:
            raise InvalidCSR(f"CSR RSA key of {key.key_size} bits is too small (minimum 2048)")
        return key
    raise InvalidCSR(f"CSR key type {type(key).__name__} is not accepted (use ECDSA P-256/P-384, Ed25519 or RSA)")


class _Template(NamedTuple):
    """What every leaf of one issuing CA shares: the issuer name, the constant extensions, the AKI."""

    issuer: x509.Name
    extensions: tuple[x509.Extension[x509.ExtensionType], ...]
    aki: x509.Extension[x509.ExtensionType]


_TEMPLATES: dict[x509.Certificate, _Template] = {}
_TEMPLATES_MAX = 64  # issuing CAs in use at once: a few generations per trust domain


def _encoded(value: x509.ExtensionType, *, critical: bool) -> x509.Extension[x509.ExtensionType]:
    """The extension as its DER, encoded once: cryptography copies an UnrecognizedExtension's bytes into the
    certificate as they are, where it walks a typed one's Python attributes for every certificate. The bytes are
    cryptography's own encoding of `value`, so the certificate is byte for byte the one the typed value gives (and
    reads back as the typed value: its OID is a known one)."""
    return x509.Extension(value.oid, critical, x509.UnrecognizedExtension(value.oid, value.public_bytes()))


def _template(issuer_cert: x509.Certificate) -> _Template:
    """What every leaf of this issuer shares, encoded: built once per issuing CA (per CA generation: a rotation's new
    issuing CA is another certificate, so another entry) instead of once per leaf."""
    found = _TEMPLATES.get(issuer_cert)
    if found is None:
        issuer_ski = issuer_cert.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value
        found = _Template(
            issuer_cert.subject,
            (
                _encoded(x509.BasicConstraints(ca=False, path_length=None), critical=True),
                _encoded(x509.KeyUsage(
                    digital_signature=True, content_commitment=False, key_encipherment=False, data_encipherment=False,
                    key_agreement=False, key_cert_sign=False, crl_sign=False, encipher_only=False, decipher_only=False,
                ), critical=True),
                _encoded(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]),
                         critical=False),
            ),
            _encoded(x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(issuer_ski), critical=False),
        )
        if len(_TEMPLATES) >= _TEMPLATES_MAX:
            _TEMPLATES.clear()
        _TEMPLATES[issuer_cert] = found
    return found


def leaf_subject(spiffe_id: SpiffeId) -> x509.Name:
    """The leaf's subject: O=trustfabric, CN=the ID's last segment (the trust domain for its root ID). Names are
    immutable: a caller that keeps what it signs for an identity (pki/service.py's facts) keeps this too, since
    cryptography encodes a Name it is given by walking its Python attributes, more than building it costs."""
    cn = spiffe_id.segments[-1] if spiffe_id.segments else spiffe_id.trust_domain
    return x509.Name([
        x509.NameAttribute(NameOID.ORGANIZATION_NAME, "trustfabric"),
        x509.NameAttribute(NameOID.COMMON_NAME, cn[:64]),
    ])


def build_leaf(
    *,
    public_key: LeafPublicKey,
    spiffe_id: SpiffeId,
    issuer_cert: x509.Certificate,
    issuer_key: Signer,
    serial: int,
    not_before: datetime,
    not_after: datetime,
    dns_names: Sequence[str] = (),
    ip_addresses: Sequence[str] = (),
    subject: x509.Name | None = None,
) -> x509.Certificate:
    """The leaf: exactly one URI SAN (the SPIFFE ID), CA=false and digitalSignature (both critical),
    EKU serverAuth + clientAuth, AKI pointing at the issuing CA. `subject`: leaf_subject(spiffe_id), when the
    caller kept it."""
    template = _template(issuer_cert)
    sans: list[x509.GeneralName] = [x509.UniformResourceIdentifier(str(spiffe_id))]
    sans += [x509.DNSName(name) for name in dns_names]
    sans += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ip_addresses]
    # What the builder's setters check, checked here once: each setter validates and copies the whole builder, nine
    # of them ~25 us a leaf. The builder is then made in one call with the setters' own forms (times naive UTC).
    if not 0 < serial < 1 << 159:
        raise ValueError("a certificate serial is positive and at most 159 bits (RFC 5280)")
    start, end = _naive_utc(not_before), _naive_utc(not_after)
    if not _EARLIEST <= start <= end:
        raise ValueError(f"certificate validity {not_before.isoformat()} .. {not_after.isoformat()} is not a period")
    if not isinstance(public_key, ec.EllipticCurvePublicKey | ed25519.Ed25519PublicKey | rsa.RSAPublicKey):
        raise TypeError(f"a leaf key is ECDSA, Ed25519 or RSA, not {type(public_key).__name__}")
    builder = x509.CertificateBuilder(
        issuer_name=template.issuer, subject_name=subject if subject is not None else leaf_subject(spiffe_id),
        public_key=public_key, serial_number=serial, not_valid_before=start, not_valid_after=end,
        extensions=[*template.extensions,
                    x509.Extension(ExtensionOID.SUBJECT_ALTERNATIVE_NAME, False, x509.SubjectAlternativeName(sans)),
                    x509.Extension(ExtensionOID.SUBJECT_KEY_IDENTIFIER, False,
                                   x509.SubjectKeyIdentifier.from_public_key(public_key)),
                    template.aki],
    )
    return sign_certificate(builder, issuer_key)


_EARLIEST = datetime(1950, 1, 1)  # the builder's own bound, in its naive UTC form


def _naive_utc(at: datetime) -> datetime:
    """What CertificateBuilder.not_valid_before/after store: the time in UTC without its zone (a naive time is
    taken as UTC already)."""
    return at.astimezone(UTC).replace(tzinfo=None) if at.tzinfo is not None else at
