"""SPIFFE IDs per the SPIFFE ID specification, and the ID layout this project issues.

Workloads: spiffe://<td>/tenant/<tenant>/group/<group>/<workload>; nodes: spiffe://<td>/node/<name>;
the API server: spiffe://<td>/trustfabric/server. Parsing is strict (no normalisation), so an ID that
reaches a certificate is byte-for-byte the one validated here.
"""

from __future__ import annotations

import string
from dataclasses import dataclass

from pki.errors import InvalidSpiffeId

SCHEME_PREFIX = "spiffe://"
MAX_ID_BYTES = 2048
MAX_TRUST_DOMAIN_BYTES = 255
_TD_CHARS = frozenset(string.ascii_lowercase + string.digits + ".-_")
_SEGMENT_CHARS = frozenset(string.ascii_letters + string.digits + ".-_")


@dataclass(frozen=True, order=True)
class SpiffeId:
    """A validated SPIFFE ID; `path` is "" for the trust domain ID, else starts with "/"."""

    trust_domain: str
    path: str

    def __str__(self) -> str:
        return f"{SCHEME_PREFIX}{self.trust_domain}{self.path}"

    @property
    def segments(self) -> tuple[str, ...]:
        return tuple(self.path.split("/")[1:]) if self.path else ()

    def tenant(self) -> str | None:
        """The tenant this ID belongs to, when it is a workload ID."""
        seg = self.segments
        return seg[1] if len(seg) >= 2 and seg[0] == "tenant" else None

    def is_under(self, prefix: SpiffeId) -> bool:
        """True when this ID equals `prefix` or lies below it (segment-wise, never by string prefix)."""
        if self.trust_domain != prefix.trust_domain:
            return False
        n = len(prefix.segments)
        return self.segments[:n] == prefix.segments


def validate_trust_domain(td: str) -> str:
    """The trust domain name, or InvalidSpiffeId saying which rule it breaks."""
    if not isinstance(td, str) or td == "":
        raise InvalidSpiffeId("trust domain is empty")
    if len(td.encode()) > MAX_TRUST_DOMAIN_BYTES:
        raise InvalidSpiffeId(f"trust domain is longer than {MAX_TRUST_DOMAIN_BYTES} bytes")
    bad = sorted(set(td) - _TD_CHARS)
    if bad:
        raise InvalidSpiffeId(
            f"trust domain {td[:80]!r} has characters {''.join(bad)[:20]!r}; only lowercase a-z, 0-9, "
            "'.', '-', '_' are allowed (no port, no userinfo, no uppercase)"
        )
    return td


def validate_segment(segment: str, what: str = "path segment") -> str:
    """One path segment: non-empty, not '.' or '..', only [A-Za-z0-9.-_]."""
    if segment == "":
        raise InvalidSpiffeId(f"{what} is empty (no '//' and no trailing '/')")
    if segment in (".", ".."):
        raise InvalidSpiffeId(f"{what} must not be '.' or '..'")
    bad = sorted(set(segment) - _SEGMENT_CHARS)
    if bad:
        raise InvalidSpiffeId(
            f"{what} {segment[:80]!r} has characters {''.join(bad)[:20]!r}; only A-Z, a-z, 0-9, '.', '-', "
            "'_' are allowed (no query, fragment or percent-encoding)"
        )
    return segment


def parse_spiffe_id(value: str) -> SpiffeId:
    """A SpiffeId, or InvalidSpiffeId naming the broken rule."""
    if not isinstance(value, str):
        raise InvalidSpiffeId("SPIFFE ID must be a string")
    if len(value.encode()) > MAX_ID_BYTES:
        raise InvalidSpiffeId(f"SPIFFE ID is longer than {MAX_ID_BYTES} bytes")
    if not value.startswith(SCHEME_PREFIX):
        raise InvalidSpiffeId("SPIFFE ID must start with 'spiffe://' (lowercase scheme)")
    rest = value[len(SCHEME_PREFIX):]
    td, sep, path = rest.partition("/")
    validate_trust_domain(td)
    if not sep:
        return SpiffeId(td, "")
    for seg in path.split("/"):
        validate_segment(seg)
    return SpiffeId(td, "/" + path)


def _make(td: str, *segments: str) -> SpiffeId:
    validate_trust_domain(td)
    for seg in segments:
        validate_segment(seg)
    sid = SpiffeId(td, "/" + "/".join(segments))
    if len(str(sid).encode()) > MAX_ID_BYTES:
        raise InvalidSpiffeId(f"SPIFFE ID is longer than {MAX_ID_BYTES} bytes")
    return sid


def workload_id(td: str, tenant: str, group: str, workload: str) -> SpiffeId:
    """spiffe://<td>/tenant/<tenant>/group/<group>/<workload>."""
    validate_segment(tenant, "tenant")
    validate_segment(group, "group")
    validate_segment(workload, "workload")
    return _make(td, "tenant", tenant, "group", group, workload)


def identity_prefix(td: str, tenant: str, group: str | None = None, workload: str | None = None) -> SpiffeId:
    """The ID (or ID prefix) for a tenant, a group of it, or one workload."""
    if workload is not None:
        if group is None:
            raise InvalidSpiffeId("a workload is named within a group: give the group too")
        return workload_id(td, tenant, group, workload)
    if group is not None:
        return _make(td, "tenant", tenant, "group", group)
    return _make(td, "tenant", tenant)


def tenant_namespace(td: str, tenant: str) -> SpiffeId:
    """spiffe://<td>/tenant/<tenant>: everything a tenant principal may ever obtain lies below it."""
    return _make(td, "tenant", tenant)


def node_id(td: str, name: str) -> SpiffeId:
    """spiffe://<td>/node/<name>."""
    return _make(td, "node", name)


def server_id(td: str) -> SpiffeId:
    """spiffe://<td>/trustfabric/server: the API's own TLS identity."""
    return _make(td, "trustfabric", "server")
