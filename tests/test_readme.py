"""The README's configuration tables name exactly the variables workflows/settings.py reads (the one module
reading the environment), so neither can drift: a new setting without its row fails, and so does a row for
a setting that is gone."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _section(text: str, title: str) -> str:
    start = text.index(f"## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start:end if end != -1 else None]


def test_the_configuration_tables_match_the_settings() -> None:
    source = (ROOT / "workflows" / "settings.py").read_text()
    read = set(re.findall(r'"([A-Z][A-Z0-9_]{2,})"', source)) - {"TRUSTFABRIC_"}
    assert {"TRUSTFABRIC_HOME", "TRUSTFABRIC_TOKEN", "OTEL_EXPORTER_OTLP_ENDPOINT"} <= read  # the scan works
    documented = set(re.findall(r"`([A-Z][A-Z0-9_]{2,})`", _section((ROOT / "README.md").read_text(),
                                                                  "Configuration")))
    documented = {d for d in documented if d.startswith(("TRUSTFABRIC_", "OTEL_", "PROMETHEUS_", "XDG_"))}
    assert read - documented == set(), f"read in workflows/settings.py, missing from the README: {read - documented}"
    assert documented - read == set(), f"in the README, read nowhere: {documented - read}"
