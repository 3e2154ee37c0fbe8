"""How many values a YAML document of some size may expand to through its aliases (shared nodes, expanded at every
reference by whatever reads the value): "billion laughs" is a few hundred bytes for billions of values.

No alias-free YAML or JSON holds more than two values per byte of its text, so that is the bound for a large
document; a small one may expand as far as a modest alias-free document holds (`FLOOR`): anchors are how a person
writes 64 identical nodes or one address list named 40 times, a few KB for thousands of values, which two per byte
refused. A bomb is still refused, having cost no more than reading a 128 KiB alias-free document (less than the
largest fabric file or PDP body anyone may send)."""

FLOOR = 256 * 1024


def value_budget(size: int) -> int:
    """The most values a document of `size` bytes (or characters) may expand to."""
    return max(2 * size + 64, FLOOR)
