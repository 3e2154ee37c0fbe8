"""SPIFFE ID parsing per the spec: table tests for each rule, properties for arbitrary input."""

from __future__ import annotations

import string

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from core.errors import InvalidInput
from pki.errors import InvalidSpiffeId
from pki.spiffe_id import (
    SpiffeId,
    identity_prefix,
    node_id,
    parse_spiffe_id,
    server_id,
    workload_id,
)

VALID = [
    "spiffe://example.org",
    "spiffe://example.org/tenant/acme/group/web/frontend",
    "spiffe://a_b-c.d/Path/With.Dots/and_underscores-1",
    "spiffe://" + "a" * 255,
]
INVALID = [
    ("", "must start"),
    ("SPIFFE://example.org/x", "must start"),
    ("https://example.org/x", "must start"),
    ("spiffe://", "empty"),
    ("spiffe:///path", "empty"),
    ("spiffe://Example.org/x", "characters"),
    ("spiffe://example.org:8443/x", "characters"),
    ("spiffe://user@example.org/x", "characters"),
    ("spiffe://example.org/x?query=1", "characters"),
    ("spiffe://example.org/x#frag", "characters"),
    ("spiffe://example.org/x%20y", "characters"),
    ("spiffe://example.org/", "empty"),
    ("spiffe://example.org/a//b", "empty"),
    ("spiffe://example.org/a/./b", "'.'"),
    ("spiffe://example.org/a/../b", "'.'"),
    ("spiffe://example.org/a/b/", "empty"),
    ("spiffe://" + "a" * 256, "longer than 255"),
    ("spiffe://example.org/" + "a" * 2040, "longer than 2048"),
    ("spiffe://example.org/caf\u00e9", "characters"),
]


@pytest.mark.parametrize("value", VALID)
def test_valid_ids_round_trip(value: str) -> None:
    assert str(parse_spiffe_id(value)) == value


@pytest.mark.parametrize(("value", "fragment"), INVALID)
def test_invalid_ids_name_the_rule(value: str, fragment: str) -> None:
    with pytest.raises(InvalidSpiffeId) as err:
        parse_spiffe_id(value)
    assert fragment in str(err.value)
    assert isinstance(err.value, InvalidInput)  # maps to a 4xx


def test_project_layout() -> None:
    assert str(workload_id("td", "acme", "web", "fe")) == "spiffe://td/tenant/acme/group/web/fe"
    assert str(node_id("td", "gpu-01")) == "spiffe://td/node/gpu-01"
    assert str(server_id("td")) == "spiffe://td/trustfabric/server"
    assert parse_spiffe_id("spiffe://td/tenant/acme/group/web/fe").tenant() == "acme"
    with pytest.raises(InvalidSpiffeId):
        workload_id("td", "acme", "..", "fe")
    with pytest.raises(InvalidSpiffeId):
        identity_prefix("td", "acme", None, "fe")


def test_is_under_is_segment_wise_not_string_prefix() -> None:
    acme = identity_prefix("td", "acme")
    assert parse_spiffe_id("spiffe://td/tenant/acme/group/g/w").is_under(acme)
    assert not parse_spiffe_id("spiffe://td/tenant/acme2/group/g/w").is_under(acme)
    assert not parse_spiffe_id("spiffe://other/tenant/acme/group/g/w").is_under(acme)


_td_alphabet = string.ascii_lowercase + string.digits + ".-_"
_seg_alphabet = string.ascii_letters + string.digits + ".-_"
segments = st.text(_seg_alphabet, min_size=1, max_size=12).filter(lambda s: s not in (".", ".."))
trust_domains = st.text(_td_alphabet, min_size=1, max_size=30)


@settings(max_examples=150, deadline=None)
@given(trust_domains, st.lists(segments, max_size=6))
def test_generated_valid_ids_parse_and_round_trip(td: str, segs: list[str]) -> None:
    value = f"spiffe://{td}" + "".join("/" + s for s in segs)
    parsed = parse_spiffe_id(value)
    assert str(parsed) == value
    assert parsed == SpiffeId(td, "".join("/" + s for s in segs))


_bad_chars = st.sampled_from(list(":@?#%/ \t\nA\u00e9\x00[]"))


@settings(max_examples=150, deadline=None)
@given(trust_domains, st.lists(segments, min_size=1, max_size=4), st.integers(0, 3), _bad_chars, st.data())
def test_one_bad_character_is_always_rejected(
    td: str, segs: list[str], where: int, bad: str, data: st.DataObject
) -> None:
    """Insert one forbidden character into the trust domain or a segment: the parser must refuse it."""
    if where == 0:
        if bad == "/":  # a '/' in the trust domain just starts the path
            bad = ":"
        pos = data.draw(st.integers(0, len(td)))
        td = td[:pos] + bad + td[pos:]
    else:
        i = data.draw(st.integers(0, len(segs) - 1))
        if bad == "A":  # uppercase is fine in paths
            bad = "%"
        if bad == "/":
            segs[i] = segs[i] + "/"  # makes an empty segment, or a trailing slash
        else:
            pos = data.draw(st.integers(0, len(segs[i])))
            segs[i] = segs[i][:pos] + bad + segs[i][pos:]
    value = f"spiffe://{td}" + "".join("/" + s for s in segs)
    with pytest.raises(InvalidSpiffeId):
        parse_spiffe_id(value)


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=80))
def test_arbitrary_text_either_parses_to_itself_or_raises_the_typed_error(value: str) -> None:
    try:
        parsed = parse_spiffe_id(value)
    except InvalidSpiffeId:
        return
    assert str(parsed) == value
    assert value.startswith("spiffe://")
