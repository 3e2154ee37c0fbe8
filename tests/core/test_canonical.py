"""core.canonical.canonical_json's fast path (the standard library's encoder) is byte-identical to rfc8785 for
every value it takes, and hands everything else to rfc8785 (same bytes, same refusals)."""

from __future__ import annotations

from typing import Any

import pytest
import rfc8785
from hypothesis import given, settings
from hypothesis import strategies as st

from core.canonical import canonical_json, is_plain

_scalars = (st.none() | st.booleans() | st.integers(min_value=-(2**53) - 2, max_value=2**53 + 2)
            | st.text() | st.floats(allow_nan=False, allow_infinity=False))
_values = st.recursive(
    _scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
    max_leaves=20,
)


def _same_as_rfc8785(value: Any) -> None:
    """canonical_json gives rfc8785's bytes, or raises rfc8785's exception."""
    try:
        expected = bytes(rfc8785.dumps(value))
    except Exception as exc:
        with pytest.raises(type(exc)):
            canonical_json(value)
    else:
        assert canonical_json(value) == expected


@settings(max_examples=400, derandomize=True)
@given(_values)
def test_the_same_bytes_as_rfc8785(value: Any) -> None:
    _same_as_rfc8785(value)


@pytest.mark.parametrize("value", [
    {"b": "\x00\x1f\x7f\u2028\"\\\b\t\n\f\r é \U0001f600", "a": [True, False, None, 2**53 - 1, -(2**53 - 1)]},
    {"\u00e9": 1, "z": 2},  # a non-ASCII key: rfc8785's UTF-16 order decides
    {"x": 1.5}, {"x": 2**53}, ("a", 1), {"s": "\ud800"},
])
def test_edge_values(value: Any) -> None:
    _same_as_rfc8785(value)


def test_the_fast_path_takes_audit_like_documents() -> None:
    doc = {"v": 2, "seq": 7, "actor": {"id": "a", "kind": "admin"}, "summary": {"n": [1, "x", None]}, "r": None}
    assert is_plain(doc)
    assert not is_plain({"x": 1.0}) and not is_plain({"x": (1,)}) and not is_plain({"é": 1})
