"""Enforcer fixtures: one private Open vSwitch per test session (per xdist worker), in its own run directory."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from enforcer.ovsd import OvsDaemons, ovs_available


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
