"""Golden outputs of the small fabric in every format (regenerate: python -m tests.enforcer.golden_gen)."""

from __future__ import annotations

import dataclasses
import shlex

import pytest

from enforcer.render.nvue import nv_set_commands, render_nvue, validate_nvue
from enforcer.render.openflow import render_flows
from tests.enforcer.golden_gen import render_all
from tests.enforcer.helpers import GOLDEN, compile_small

RENDERED = render_all()


def test_no_golden_file_is_missing_or_stale() -> None:
    on_disk = {str(p.relative_to(GOLDEN)) for p in GOLDEN.rglob("*") if p.is_file()}
    assert on_disk == set(RENDERED), "run .venv/bin/python -m tests.enforcer.golden_gen and review the diff"


@pytest.mark.parametrize("rel", sorted(RENDERED))
def test_golden(rel: str) -> None:
    assert (GOLDEN / rel).read_text() == RENDERED[rel], (
        f"{rel} differs from the golden file: if intended, regenerate with "
        ".venv/bin/python -m tests.enforcer.golden_gen and review the diff")


def test_every_leaf_document_fits_the_schema_and_the_schema_rejects_drift() -> None:
    compiled, _ = compile_small()
    for rs in compiled.devices.values():
        if rs.kind == "leaf":
            doc = render_nvue(rs)
            assert validate_nvue(doc) == []
            doc["acl"]["tf-acme-v4"]["rule"]["10"]["match"]["ip"]["dest-port"] = "443"  # the pre-5.7 form
            assert any("dest-port" in p for p in validate_nvue(doc))


def test_nic_flow_count_never_exceeds_the_budgeted_cost() -> None:
    compiled, _ = compile_small()
    for rs in compiled.devices.values():
        if rs.kind == "nic":
            assert len(render_flows(rs)) <= rs.cost


def test_nv_set_commands_are_one_shell_word_per_token_whatever_a_remark_holds() -> None:
    compiled, _ = compile_small()
    rs = compiled.devices["leaf:leaf1"]
    remark = "grant:it's \"$(reboot)\"; x"
    odd = dataclasses.replace(rs, rules=tuple(r._replace(reasons=(remark,)) for r in rs.rules))
    lines = [c for c in nv_set_commands(odd) if " remark " in c]
    assert lines
    for line in lines:
        words = shlex.split(line)
        assert words[words.index("remark") + 1:] == [remark]


def test_the_schema_refuses_route_map_and_prefix_list_names_nvue_refuses() -> None:
    compiled, _ = compile_small()
    doc = render_nvue(compiled.devices["leaf:leaf1"])
    policy = doc["router"]["policy"]
    name = next(iter(policy["prefix-list"]))
    policy["prefix-list"]["1" + name] = policy["prefix-list"].pop(name)
    rm = next(iter(policy["route-map"]))
    policy["route-map"][rm]["rule"]["10"]["match"]["ip-prefix-list"] = "leak.v4"
    problems = validate_nvue(doc)
    assert any("prefix-list" in p for p in problems) and any("ip-prefix-list" in p for p in problems)
