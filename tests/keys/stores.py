"""Builders for the two real key stores, shared by the key store tests."""

from __future__ import annotations

import os
import shutil
import subprocess
import uuid
from pathlib import Path

import pytest

SOFTHSM_MODULE = "/usr/lib/softhsm/libsofthsm2.so"
PIN = "1234-test"


def softhsm_available() -> str | None:
    """None when SoftHSM2 can run here, else the reason it cannot."""
    if not Path(SOFTHSM_MODULE).exists():
        return f"SoftHSM2 module {SOFTHSM_MODULE} not installed (Debian package softhsm2)"
    if shutil.which("softhsm2-util") is None:
        return "softhsm2-util not installed (Debian package softhsm2)"
    return None


def softhsm_token(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[str, str]:
    """A fresh token in a per-test token dir; returns (module path, token label)."""
    reason = softhsm_available()
    if reason:
        pytest.skip(reason)
    tokens = tmp_path / "tokens"
    tokens.mkdir()
    conf = tmp_path / "softhsm2.conf"
    conf.write_text(f"directories.tokendir = {tokens}\nobjectstore.backend = file\nlog.level = ERROR\n")
    monkeypatch.setenv("SOFTHSM2_CONF", str(conf))
    label = "tf-" + uuid.uuid4().hex[:8]
    subprocess.run(
        ["softhsm2-util", "--init-token", "--free", "--label", label, "--pin", PIN, "--so-pin", "so-" + PIN],
        check=True, capture_output=True, env={**os.environ, "SOFTHSM2_CONF": str(conf)},
    )
    import pkcs11

    # SoftHSM reads its config and token list at C_Initialize: re-initialise for this test's token dir.
    pkcs11.lib(SOFTHSM_MODULE).reinitialize()
    return SOFTHSM_MODULE, label
