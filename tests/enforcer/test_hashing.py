"""The direct canonical bytes (enforcer.hashing) equal core.canonical's RFC 8785 of to_dict(), whatever the values:
generated rule sets with strange strings (quotes, backslashes, control characters, non-ASCII, U+2028) and
strange numbers (bools, floats, huge ints) must either match or leave the fast path."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from core.canonical import canonical_json
from enforcer.hashing import canonical_bytes
from enforcer.ir import AddressSet, DeviceRuleSet, FlowRule, Leak, Port, Vrf
from tests.enforcer.helpers import compile_small

plain = st.text(st.characters(min_codepoint=0x21, max_codepoint=0x7E, blacklist_characters='"\\'), max_size=12)
strange = st.text(max_size=8)  # quotes, backslashes, control characters, non-ASCII, U+2028 ...
strs = st.one_of(plain, plain, strange)
ints = st.one_of(st.integers(0, 70_000), st.integers(0, 70_000), st.integers(-2**60, 2**60))
odd_ints: st.SearchStrategy[Any] = st.one_of(ints, ints, ints, st.booleans(), st.floats(allow_nan=False,
                                                                                       allow_infinity=False))


def _rule_sets(s: st.SearchStrategy[str], n: st.SearchStrategy[Any]) -> st.SearchStrategy[DeviceRuleSet]:
    cidrs = st.lists(s, max_size=3).map(tuple)
    reasons = st.lists(s, min_size=1, max_size=2).map(tuple)
    port = st.builds(Port, s, s, n, s, s, cidrs, cidrs, s)
    aset = st.builds(AddressSet, s, cidrs, cidrs)
    rule = st.builds(FlowRule, n, s, s, s, s, s, st.lists(st.tuples(n, n), max_size=3).map(tuple), s, s, s, reasons)
    vrf = st.builds(Vrf, s, s, n, cidrs, cidrs, st.lists(st.builds(Leak, s, s, reasons), max_size=3).map(tuple))
    return st.builds(DeviceRuleSet, s, s, s, st.lists(port, max_size=3).map(tuple),
                     st.lists(aset, max_size=4).map(tuple), st.lists(rule, max_size=5).map(tuple),
                     st.lists(vrf, max_size=3).map(tuple), n)


def _reference(rs: DeviceRuleSet) -> bytes | None:
    try:
        return canonical_json(rs.to_dict())
    except Exception:  # rfc8785 refuses some values (integers beyond 2**53, lone surrogates): so must we
        return None


@settings(max_examples=150, deadline=None)
@given(_rule_sets(strs, odd_ints))
def test_direct_bytes_equal_rfc8785_or_step_aside(rs: DeviceRuleSet) -> None:
    fast = canonical_bytes(rs)
    ref = _reference(rs)
    if fast is not None:
        assert fast == ref
    if ref is not None:
        assert rs.canonical == ref


# any code point JSON writes as itself (no quote, backslash or control character), non-ASCII included
unescaped = st.text(st.characters(blacklist_characters='"\\', blacklist_categories=("Cc", "Cs")), max_size=10)


@settings(max_examples=100, deadline=None)
@given(_rule_sets(unescaped, st.integers(-(2**53) + 1, 2**53 - 1)))
def test_values_of_the_ir_types_take_the_fast_path_and_equal_rfc8785(rs: DeviceRuleSet) -> None:
    assert canonical_bytes(rs) == canonical_json(rs.to_dict())


def test_the_compiled_rule_sets_take_the_fast_path() -> None:
    compiled, _ = compile_small()
    for rs in compiled.devices.values():
        fast = canonical_bytes(rs)
        assert fast is not None and fast == canonical_json(rs.to_dict())


@pytest.mark.parametrize("value", ['a"b', "a\\b", "a\nb", "\x00", "\x1f"])
def test_a_string_json_escapes_leaves_the_fast_path(value: str) -> None:
    compiled, _ = compile_small()
    rs = compiled.devices["nic:gpu1"]
    for strange_rs in (DeviceRuleSet(rs.device, rs.kind, value, rs.ports, rs.sets, rs.rules, rs.vrfs, rs.cost),
                       DeviceRuleSet(rs.device, rs.kind, rs.uplink, rs.ports,
                                     (*rs.sets, AddressSet("zz", (value,), ())), rs.rules, rs.vrfs, rs.cost)):
        assert canonical_bytes(strange_rs) is None
        assert strange_rs.canonical == canonical_json(strange_rs.to_dict())


@pytest.mark.parametrize("value", [True, 1.0, 2**53])
def test_a_number_outside_exact_ints_leaves_the_fast_path(value: Any) -> None:
    compiled, _ = compile_small()
    rs = compiled.devices["nic:gpu1"]
    odd = DeviceRuleSet(rs.device, rs.kind, rs.uplink, rs.ports, rs.sets,
                        (rs.rules[0]._replace(priority=value), *rs.rules[1:]), rs.vrfs, rs.cost)
    assert canonical_bytes(odd) is None
