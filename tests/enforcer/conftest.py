"""Enforcer fixtures: one private Open vSwitch per test session (per xdist worker), in its own run directory."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from enforcer.ovsd import OvsDaemons, ovs_available
from tests.enforcer.stored import Stack, open_stack


@pytest.fixture(scope="session")
def ovs_daemons() -> Iterator[OvsDaemons]:
    reason = ovs_available()
    if reason:
        pytest.skip(reason)
    rundir = Path(tempfile.mkdtemp(prefix=f"tf-ovs-{os.getpid()}-"))
    daemons = OvsDaemons(rundir)
    try:
        daemons.start()
        yield daemons
    finally:
        daemons.stop()
        shutil.rmtree(rundir, ignore_errors=True)


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def stack(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Stack]:
    """The golden fabric imported, the shipped policy active and the reconciler, on each real database."""
    url = request.getfixturevalue("postgres_server").create_database() if request.param == "postgres" else None
    s = open_stack(tmp_path / "home", url)
    yield s
    s.close()
