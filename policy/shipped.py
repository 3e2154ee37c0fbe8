"""The policies this project ships in `rego/`: the whole directory (init activates it as version 1) and
the API's own authorization module (always loaded from here, whatever version is active)."""

from __future__ import annotations

from pathlib import Path

REGO_DIR = Path(__file__).resolve().parent.parent / "rego"
AUTHZ_MODULE = "api_authz.rego"


def authz_modules() -> dict[str, str]:
    """{api_authz.rego: its text}: what the `authz` engine is loaded with."""
    return {AUTHZ_MODULE: (REGO_DIR / AUTHZ_MODULE).read_text(encoding="utf-8")}
