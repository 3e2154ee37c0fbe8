"""Builders for the two real key stores, shared by the key store tests."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
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


_LIST_OBJECTS = """
import sys
import pkcs11
from pkcs11 import Attribute
module, label, pin = sys.argv[1:]
with pkcs11.lib(module).get_token(token_label=label).open(user_pin=pin) as session:
    for obj in session.get_objects():
        print(obj[Attribute.LABEL], obj.object_class.name)
"""


def token_objects(module: str, label: str) -> set[tuple[str, str]]:
    """(label, object class) of every object in the token, as another process logged in to it sees them: what the
    token holds on disk, not what the store under test believes (SOFTHSM2_CONF from `softhsm_token`)."""
    out = subprocess.run([sys.executable, "-c", _LIST_OBJECTS, module, label, PIN], capture_output=True, text=True,
                         check=True, timeout=60)
    return {(line.rsplit(" ", 1)[0], line.rsplit(" ", 1)[1]) for line in out.stdout.splitlines() if line}
