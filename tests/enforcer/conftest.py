"""Enforcer fixtures: one private Open vSwitch per test session (per xdist worker), in its own run directory
and its own network namespace: the userspace datapath opens a tap named `ovs-netdev` in the daemon's
namespace, so two sessions' daemons in one namespace (the root one) collide and the second cannot open its
datapath (its bridges never come up)."""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
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
    netns = f"tfo{os.getpid() % 100000}{secrets.token_hex(2)}"
    subprocess.run(["ip", "netns", "add", netns], check=True, capture_output=True)
    daemons = OvsDaemons(rundir, netns=netns)
    try:
        daemons.start()
        yield daemons
    finally:
        daemons.stop()
        subprocess.run(["ip", "netns", "del", netns], capture_output=True)
        shutil.rmtree(rundir, ignore_errors=True)


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def stack(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Stack]:
    """The golden fabric imported, the shipped policy active and the reconciler, on each real database."""
    url = request.getfixturevalue("postgres_server").create_database() if request.param == "postgres" else None
    s = open_stack(tmp_path / "home", url)
    yield s
    s.close()
