"""`trustfabric pdp --tls-cert/--tls-key` with files that cannot serve TLS: one line naming the files and what is
wrong, exit 1, before anything is printed as served (review: it printed `pdp serving https://...`, then
`error: SSLError: [SSL] PEM lib (_ssl.c:3926)`)."""

from __future__ import annotations

import datetime
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from tests.cli.conftest import run_cli


def _pair(folder: Path, name: str, passphrase: bytes | None = None) -> tuple[Path, Path]:
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(subject).issuer_name(subject).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now)
            .not_valid_after(now + datetime.timedelta(days=1)).sign(key, hashes.SHA256()))
    enc: serialization.KeySerializationEncryption = (
        serialization.BestAvailableEncryption(passphrase) if passphrase else serialization.NoEncryption())
    (folder / f"{name}.crt").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (folder / f"{name}.key").write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                                           serialization.PrivateFormat.PKCS8, enc))
    return folder / f"{name}.crt", folder / f"{name}.key"


@pytest.mark.parametrize("case", ["not pem", "mismatch", "encrypted"])
def test_unusable_tls_files_are_one_line_before_serving(tmp_path: Path, case: str) -> None:
    rego = tmp_path / "rego"
    rego.mkdir()
    (rego / "x.rego").write_text("package x\n\nallow := true\n")
    cert, _ = _pair(tmp_path, "a")
    other_cert, other_key = _pair(tmp_path, "b", b"secret" if case == "encrypted" else None)
    notes = tmp_path / "notes.txt"
    notes.write_text("not a key\n")
    pair = {"not pem": (cert, notes), "mismatch": (cert, other_key), "encrypted": (other_cert, other_key)}[case]
    says = {"not pem": "not a PEM certificate and its private key",
            "mismatch": "the key does not match the certificate", "encrypted": "the key is encrypted"}[case]
    r = run_cli(["pdp", "--rego", str(rego), "--port", "1", "--tls-cert", str(pair[0]), "--tls-key", str(pair[1])],
                {"TRUSTFABRIC_HOME": str(tmp_path / "home")})
    assert r.returncode == 1, (r.stdout, r.stderr)
    assert says in r.stderr and r.stderr.count("\n") == 1 and "Traceback" not in r.stderr, r.stderr
    assert "serving" not in r.stdout
