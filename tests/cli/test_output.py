"""The table layout of cli/output.py, as a property: columns fitted to the terminal never cut an id or a time, cut
no word when the words fit, stay within the room whenever cutting can make them, and cut nothing when it cannot."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from cli.output import _GAP, _fit, _Span

spans = st.lists(
    st.builds(lambda least, more, whole: _Span(least + more if whole else least, least + more, whole),
              st.integers(1, 40), st.integers(0, 60), st.booleans()),
    min_size=1, max_size=8)


@given(spans, st.integers(1, 240))
def test_fitted_columns(columns: list[_Span], room: int) -> None:
    widths = _fit(columns, room)
    gaps = _GAP * (len(columns) - 1)
    assert len(widths) == len(columns)
    for span, width in zip(columns, widths, strict=True):
        assert 1 <= width <= span.most
        if span.whole:
            assert width == span.most  # an id or a time: never wrapped nor cut
    if sum(s.most for s in columns) + gaps <= room:
        assert widths == [s.most for s in columns]  # everything fits: nothing wraps
    elif sum(s.least for s in columns) + gaps <= room:
        assert all(w >= s.least for s, w in zip(columns, widths, strict=True))  # wrapped at word boundaries only
        assert sum(widths) + gaps == room  # and the room used whole
        assert len([1 for s, w in zip(columns, widths, strict=True) if s.least < w < s.most]) <= 1  # columns made
        # whole, those that want least first: only the one given what was left is in between
    elif sum(s.most if s.whole else 1 for s in columns) + gaps <= room:
        assert sum(widths) + gaps <= room  # cut, the widest text columns first, but within the room
    else:
        assert widths == [s.least for s in columns]  # the ids alone overflow: cutting words would not help
