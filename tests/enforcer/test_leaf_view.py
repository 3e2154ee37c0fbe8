"""The leaf's fabric view (enforcer/leaf_view.py): what the server serves a leaf's agent rebuilds a Fabric
that renders every leaf's Linux configuration exactly as the full fabric does; a malformed one is refused."""

from __future__ import annotations

from typing import Any

import pytest

from enforcer.errors import ApplyError


def test_the_leaf_view_rebuilds_the_fabric_the_linux_leaf_routes_by() -> None:
    from enforcer.fabric_file import load_fabric_file
    from enforcer.leaf_view import fabric_of_view, leaf_view
    from enforcer.render.linux import render_linux
    from lab.standalone import compile_file  # the golden file compiled with the shipped Rego
    from tests.enforcer.helpers import SMALL

    fabric = load_fabric_file(SMALL)
    _, compiled, _ = compile_file(SMALL)
    rebuilt = fabric_of_view(leaf_view(fabric))
    for device, rs in compiled.devices.items():
        if rs.kind == "leaf":
            assert render_linux(rs, rebuilt) == render_linux(rs, fabric), device


def test_a_malformed_view_is_refused() -> None:
    from enforcer.leaf_view import fabric_of_view

    bads: list[dict[str, Any]] = [{}, {"trust_domain": "x", "tenants": [["a"]], "links": [], "placements": []},
                                  {"trust_domain": "x", "tenants": [], "links": None, "placements": []}]
    for bad in bads:
        with pytest.raises(ApplyError, match="malformed"):
            fabric_of_view(bad)
