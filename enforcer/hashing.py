"""A device rule set's canonical bytes (RFC 8785 of `DeviceRuleSet.to_dict()`), written directly.

The persisted path hashes every device when it publishes: going through to_dict() and a generic encoder
costs ~50x the SHA-256 of the same bytes. The IR holds only str, int and tuples of them, in fixed shapes, so
the text is formatted straight from the tuples with the keys in their RFC 8785 order (UTF-16 code units;
all keys are ASCII). Where RFC 8785 and this formatting could differ, the value is checked first, once per
distinct value: every str must be exactly a str (no subclass) needing no escape (no `"`, `\\`, or control
character: JSON escapes exactly those, and passes any other character, non-ASCII included, as UTF-8), every
int exactly an int (no bool) within +-(2**53 - 1), every tuple exactly a tuple of its shape. A rule set
outside that subset gives None and the caller takes core.canonical. tests/enforcer/test_hashing.py holds the
two equal on generated rule sets, strange values included.
"""

from __future__ import annotations

from collections.abc import Iterable
from itertools import chain
from json.encoder import encode_basestring
from operator import itemgetter
from typing import TYPE_CHECKING, Any

from enforcer.ir import AddressSet, FlowRule, Leak, Port, Vrf

if TYPE_CHECKING:
    from enforcer.ir import DeviceRuleSet

MAX_SAFE = 2**53 - 1  # RFC 8785 numbers are IEEE doubles: larger integers are not exact


class _Unfit(Exception):
    """A value outside the subset the direct formatting is proven for."""


def canonical_bytes(rs: DeviceRuleSet) -> bytes | None:
    """RFC 8785 bytes of rs.to_dict(), or None when a value lies outside the subset (see the module doc)."""
    try:
        text = _text(rs)
        return text.encode()
    except (_Unfit, UnicodeEncodeError, TypeError, ValueError):
        return None


def _strs(values: Iterable[Any]) -> None:
    """Each distinct value is exactly a str that JSON writes as itself between quotes."""
    distinct = set(values)
    if not set(map(type, distinct)) <= {str}:
        raise _Unfit
    joined = "".join(distinct)
    if len(encode_basestring(joined)) != len(joined) + 2:
        raise _Unfit


def _ints(values: Iterable[Any]) -> None:
    xs = list(values)
    if xs and (not set(map(type, xs)) <= {int} or max(xs) > MAX_SAFE or min(xs) < -MAX_SAFE):
        raise _Unfit


def _rows(rows: Any, cls: Any) -> None:
    """A tuple of rows, each exactly a `cls` (a NamedTuple of the IR)."""
    if type(rows) is not tuple or not set(map(type, rows)) <= {cls}:
        raise _Unfit


def _tuples(values: Iterable[Any]) -> None:
    if not set(map(type, values)) <= {tuple}:
        raise _Unfit


def _field(rows: tuple[Any, ...], *at: int) -> Iterable[Any]:
    return chain.from_iterable(map(itemgetter(i), rows) for i in at)


def _list(items: tuple[str, ...]) -> str:
    return '["' + '","'.join(items) + '"]' if items else "[]"


def _text(rs: DeviceRuleSet) -> str:
    _strs((rs.device, rs.kind, rs.uplink))
    _ints((rs.cost,))
    _rows(rs.ports, Port)
    _rows(rs.sets, AddressSet)
    _rows(rs.rules, FlowRule)
    _rows(rs.vrfs, Vrf)
    ports = _ports(rs.ports)
    sets = _sets(rs.sets)
    rules = _rules(rs.rules)
    vrfs = _vrfs(rs.vrfs)
    return (f'{{"cost":{rs.cost},"device":"{rs.device}","kind":"{rs.kind}","ports":[{ports}],"rules":[{rules}],'
            f'"sets":[{sets}],"uplink":"{rs.uplink}","vrfs":[{vrfs}]}}')


def _ports(ports: tuple[Port, ...]) -> str:
    _strs(_field(ports, 0, 1, 3, 4, 7))
    _ints(_field(ports, 2))
    _tuples(_field(ports, 5, 6))
    _strs(chain.from_iterable(_field(ports, 5, 6)))
    return ",".join([f'{{"base":"{b}","name":"{n}","node":"{nd}","tenant":"{t}","v4":{_list(a4)},"v6":{_list(a6)},'
                     f'"vlan":{vl},"workload":"{w}"}}' for n, t, vl, nd, w, a4, a6, b in ports])


def _sets(sets: tuple[AddressSet, ...]) -> str:
    _tuples(_field(sets, 1, 2))
    _strs(chain(_field(sets, 0), chain.from_iterable(_field(sets, 1, 2))))
    return ",".join(['{"name":"' + n + ('","v4":["' + '","'.join(a4) + '"],' if a4 else '","v4":[],')
                     + ('"v6":["' + '","'.join(a6) + '"]}' if a6 else '"v6":[]}') for n, a4, a6 in sets])


def _rules(rules: tuple[FlowRule, ...]) -> str:
    _ints(_field(rules, 0))
    _strs(_field(rules, 1, 2, 3, 4, 5, 7, 8, 9))
    ports = set(_field(rules, 6))
    reasons = set(_field(rules, 10))
    _tuples(chain(ports, reasons))
    ranges = set(chain.from_iterable(ports))
    _tuples(ranges)
    if not set(map(len, ranges)) <= {2}:
        raise _Unfit
    _ints(chain.from_iterable(ranges))
    _strs(chain.from_iterable(reasons))
    # equal tuples of exact ints (or strs), checked above, write the same text
    port_text = {p: "[" + ",".join(f"[{a},{b}]" for a, b in p) + "]" for p in ports}
    reason_text = {r: _list(r) for r in reasons}
    return ",".join([f'{{"action":"{a}","direction":"{d}","dst":"{dt}","port_side":"{sd}","ports":{port_text[pt]},'
                     f'"priority":{pr},"proto":"{pro}","reasons":{reason_text[rs]},"scope":"{sc}","src":"{sr}",'
                     f'"state":"{st}"}}' for pr, d, sc, sr, dt, pro, pt, sd, st, a, rs in rules])


def _vrfs(vrfs: tuple[Vrf, ...]) -> str:
    _strs(_field(vrfs, 0, 1))
    _ints(_field(vrfs, 2))
    _tuples(_field(vrfs, 3, 4, 5))
    _strs(chain.from_iterable(_field(vrfs, 3, 4)))
    leaks = tuple(chain.from_iterable(_field(vrfs, 5)))
    _rows(leaks, Leak)
    reasons = set(_field(leaks, 2))
    _tuples(reasons)
    _strs(chain(_field(leaks, 0, 1), chain.from_iterable(reasons)))
    reason_text = {r: _list(r) for r in reasons}
    out = []
    for n, t, vn, mem, pre, lks in vrfs:
        leak_text = ",".join([f'{{"from_vrf":"{f}","prefix":"{p}","reasons":{reason_text[r]}}}' for p, f, r in lks])
        out.append(f'{{"leaks":[{leak_text}],"members":{_list(mem)},"name":"{n}","prefixes":{_list(pre)},'
                   f'"tenant":"{t}","vni":{vn}}}')
    return ",".join(out)
