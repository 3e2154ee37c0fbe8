"""core.digits: the number check every typed or received value passes before int()."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from core.digits import is_digits
from core.errors import InvalidInput
from policy.engines.patch import apply_patch
from workflows.settings import Settings


@pytest.mark.parametrize(("text", "expected"), [
    ("0", True), ("443", True), ("", False), ("\u00b2", False), ("8\u00b2", False), ("\u0663", False),
    ("1e3", False), (" 1", False), ("-1", False), ("\uff11", False),
])
def test_only_ascii_decimal_digits(text: str, expected: bool) -> None:
    assert is_digits(text) is expected


# each was `str.isdigit()` then int(): '²' passed the check and raised ValueError (a 500 or a traceback)
CASES: list[tuple[str, Callable[[], Any]]] = [
    ("patch index", lambda: apply_patch({"a": [1]}, [{"op": "replace", "path": "/a/\u00b2", "value": 2}])),
    ("settings port", lambda: Settings.from_env({"TRUSTFABRIC_METRICS_PORT": "8\u00b2"})),
]


@pytest.mark.parametrize(("name", "call"), CASES, ids=[c[0] for c in CASES])
def test_a_superscript_digit_is_bad_input_not_a_value_error(name: str, call: Callable[[], Any]) -> None:
    with pytest.raises(InvalidInput):
        call()
