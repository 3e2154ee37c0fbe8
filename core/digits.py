"""Whether text is a plain decimal number: the check before int() on anything a person or a peer typed."""

from __future__ import annotations


def is_digits(text: str) -> bool:
    """ASCII 0-9 only, at least one. str.isdigit alone also takes '²' and other digits int() refuses, so a check
    meant to turn bad input into a clear 4xx let it through to a ValueError (a 500, or a traceback)."""
    return text.isascii() and text.isdigit()
