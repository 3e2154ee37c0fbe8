"""Lab fixtures: the golden lab is built once for the package (all lab tests run on one xdist worker: mark
them with `pytestmark = LAB`; a test that changes it restores it), in a data directory unique to this
test session, so its namespaces carry a lab id no other session shares; it is taken down in a finally
whatever the tests did."""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from enforcer.compiler import Compiled
from enforcer.fabric import Fabric
from lab import build, operations, standalone, state
from lab.errors import LabError
from tests.enforcer.helpers import SMALL

LAB = [pytest.mark.netns, pytest.mark.xdist_group("lab")]
OPEN = 3.0  # the timeout of a connection a test expects to open: generous for a loaded machine, it costs
# nothing when the connection opens (a BLOCKED expectation uses a short one)


def wire_answers(items: list[tuple[Any, Any, int, int]], allowed: Callable[[Any, Any, int], bool]) -> list[bool]:
    """Connect every (src, dst, port, family) at once (listeners open for the block); on a loaded machine an
    allowed handshake may miss the first second: those get a second, longer try (a denied connection never
    opens by waiting, so the denials are not retried)."""
    from lab.probe import connect_many, listening

    with listening([(d, fam, port) for _, d, port, fam in items]):
        wire = connect_many(items, timeout=1.0, workers=len(items))
        again = [i for i, (s, d, port, _) in enumerate(items) if not wire[i] and allowed(s, d, port)]
        for i, ok in zip(again, connect_many([items[i] for i in again], timeout=OPEN, workers=64), strict=True):
            wire[i] = ok
    return wire


def require_lab() -> None:
    try:
        build.require_root()
    except LabError as exc:
        pytest.skip(f"the lab cannot run here: {exc}")
    if shutil.which("bridge") is None:
        pytest.skip("bridge (iproute2) not installed")


@dataclass
class GoldenLab:
    home: Path
    file: Path
    st: dict[str, Any]
    fabric: Fabric
    compiled: Compiled
    allowed: Any
    report: dict[str, Any]

    def reload(self) -> None:
        loaded = state.load(self.home)
        assert loaded is not None
        self.st = loaded

    def restore(self) -> None:
        """Every device back to the golden fabric's rule sets (after a test changed some)."""
        self.reload()
        standalone.apply(self.st, self.fabric, self.compiled, only_changed=False)
        state.save(self.home, self.st)


@pytest.fixture(scope="package")
def golden_lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GoldenLab]:
    require_lab()
    home = tmp_path_factory.mktemp("lab-home")
    file = home.parent / f"{home.name}-small.yaml"
    shutil.copy(SMALL, file)
    try:
        report = operations.up(home, file)
        fabric, compiled, allowed = standalone.compile_file(file)
        st = state.load(home)
        assert st is not None
        yield GoldenLab(home, file, st, fabric, compiled, allowed, report)
    finally:
        build.teardown(home)
