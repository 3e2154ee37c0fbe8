"""Typed PKI errors: each names what is wrong and what to do; api/ maps the core bases to HTTP codes."""

from __future__ import annotations

from core.errors import Conflict, Forbidden, InvalidInput, NotFound, Unauthenticated


class InvalidSpiffeId(InvalidInput):
    """A string that is not a valid SPIFFE ID (or trust domain) per the SPIFFE ID specification."""


class InvalidCSR(InvalidInput):
    """The CSR is not parseable PEM, its signature algorithm or key type is not accepted, or its signature does
    not verify."""


class TTLTooLong(InvalidInput):
    """The requested lifetime is above the configured maximum."""


class InvalidTTL(InvalidInput):
    """The requested lifetime is zero or negative."""


class IdentityOutOfScope(Forbidden):
    """A tenant principal asked for (or about) an identity outside its /tenant/<id>/ namespace."""


class NotPlacedOnNode(Forbidden):
    """A node asked for the identity of a workload that is not placed on it (as a SPIRE agent obtains only the
    entries parented to it)."""


class IdentityRevoked(Forbidden):
    """The identity was revoked by security; nothing more is issued to it."""


class UnknownWorkload(NotFound):
    """No registered workload for this tenant/group/name: SVIDs go to registered workloads only."""


class SvidNotFound(NotFound):
    """No SVID with this serial (or the caller may not see it)."""


class IdentityNotFound(NotFound):
    """An identity to revoke that names nothing: no such tenant, group or workload is registered and no SVID was
    ever issued under it (a typo, which revoked nothing and said so with success)."""


class AlreadyRevoked(Conflict):
    """The SVID was revoked before."""


class NotInitialized(Conflict):
    """The trust domain has no CA yet: run `trustfabric init --trust-domain <td>`."""


class TrustDomainMismatch(Conflict):
    """init was asked for a different trust domain than the one already created."""


class ForeignKeyStore(Conflict):
    """The key store lacks a CA key the database's trust domain uses, or holds another key under its name: it is
    not the key store the trust domain was made with (a replica given a data directory of its own)."""


class CAUnavailable(Conflict):
    """No active issuing CA that can still sign (expired, or none): run `trustfabric ca rotate`."""


class TokenInvalid(Unauthenticated):
    """The join token is unknown, expired or already used."""


class IssuerChanged(Conflict):
    """The CA a certificate was signed with stopped being the active issuing CA before it was recorded (a
    rotation in between): the certificate is dropped; signing again uses the new CA."""


class InvalidSelector(InvalidInput):
    """A workload-attestation selector that is not `unix:<uid|gid|user|group|path|sha256>:<value>`."""
