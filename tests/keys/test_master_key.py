"""Should fix (issue 13): the file key store's master key need not be a file beside the keys. It can come from a
passphrase (TRUSTFABRIC_PASSPHRASE or a file outside the data directory, TRUSTFABRIC_PASSPHRASE_FILE) or
from a PKCS#11 token (TRUSTFABRIC_MASTER_KEY=pkcs11: wrapped under an AES key that never leaves it)."""

from __future__ import annotations

import stat
from dataclasses import replace
from pathlib import Path

import pytest

from keys.errors import KeyStoreError
from keys.store import KeyKind
from tests.keys.stores import PIN, softhsm_token
from workflows.context import open_keystore
from workflows.settings import Settings


def test_the_master_key_from_a_passphrase_file(tmp_path: Path) -> None:
    secret = tmp_path / "credentials" / "passphrase"
    secret.parent.mkdir()
    secret.write_text("correct horse battery staple\n")
    settings = Settings(home=tmp_path / "home", passphrase_file=secret)
    public = open_keystore(settings, create=True).generate("k", KeyKind.EC_P256).public_key()
    assert not settings.default_key_file.exists()  # nothing that unlocks the keys lies beside them
    again = open_keystore(replace(settings, passphrase_file=None, passphrase="correct horse battery staple"),
                          create=False)
    assert again.get("k").public_key() == public
    secret.write_text("another passphrase\n")
    with pytest.raises(KeyStoreError, match="wrong passphrase or key file"):
        open_keystore(settings, create=False)


@pytest.mark.hsm
def test_the_master_key_wrapped_by_a_pkcs11_token(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    module, label = softhsm_token(tmp_path, monkeypatch)
    settings = Settings(home=tmp_path / "home", master_key="pkcs11", pkcs11_module=module, pkcs11_token=label,
                        pkcs11_pin=PIN)
    public = open_keystore(settings, create=True).generate("k", KeyKind.EC_P256).public_key()
    wrapped = settings.keys_dir / "master.wrapped"
    assert stat.S_IMODE(wrapped.stat().st_mode) == 0o600 and len(wrapped.read_bytes()) == 16 + 48
    assert not settings.default_key_file.exists()
    assert open_keystore(settings, create=False).get("k").public_key() == public  # the token unwraps it again
    (tmp_path / "other").mkdir()
    _module, other = softhsm_token(tmp_path / "other", monkeypatch)  # another token: it cannot unwrap it
    with pytest.raises(KeyStoreError, match="wrapped under a key this token does not hold"):
        open_keystore(replace(settings, pkcs11_token=other), create=False)
