"""Every cache on the request path, in one place: what it holds, what invalidates it, why it is exact
across worker processes, and what bench/api.py measured it to pay (a cache that does not pay is removed,
not kept "just in case"). Each can be switched off for measurement with TRUSTFABRIC_CACHE_OFF=<name>[,...]
(`all` for every one); bench/api.py runs the API with each one off in turn.

- `authz` (api/authz.py, Authorizer): the allow/deny answer of api_authz.rego per (role, action,
  principal tenant, resource tenant). Exact: the shipped authorization policy is loaded once per process
  and never changes while it runs (a policy upload changes the active *flow* policy, not this one), and
  api_authz.rego reads nothing of the input but those four fields (tests/api/test_caches.py checks the
  rego text). Engine errors are never cached. Per process; every worker loads the same file.
- `token_signature` (api/auth/api_jwt.py): the claims of our own API JWTs whose ES256 signature this
  process verified, by exact token text (LRU, 10,000). Exact: a signature verifies the same way every
  time, and the issuer key never changes; expiry, revocation and the issued row are still checked on
  every request.
- `token_row` (api/auth/api_jwt.py, a ReadCache): the `api_tokens` row of a JWT's jti. Exact on SQLite
  only: `PRAGMA data_version` on a private connection changes when any connection of any process commits,
  so an entry is used only while nothing at all was written since it was read (api/readcache.py).
  PostgreSQL: off (one indexed read per request): a revoked token is refused from the next request on,
  on every replica, which a bounded change feed could not promise. A route that reads the database first anyway
  (POST /v1/grants, `carries_checks` in api/handoff.py) carries that read in its first statement instead
  (store/carried.py): the same read, as fresh, without a round trip of its own.
- `grant_pages` (api/routes/grants.py, a ReadCache): the JSON body of a GET /v1/grants page per (viewer
  scope, filters, cursor, limit). Exact like `token_row` on SQLite, and refused from the next instant any
  grant's effective state changes without a write (the earliest expiry, read with the page). PostgreSQL:
  the same rule on the process's change feed (store/changes.py: moved by every NOTIFY a write transaction
  sends, as it arrives, and by the cluster's transaction snapshot, re-read every 50 ms; moved at once by this
  process's own commits),
  so a change committed by another process or replica shows here within the feed's delay: about a
  millisecond, 50 ms when a notification is lost (tests/api/test_replicas.py measures it across three
  replicas, tests/store/test_changes.py the fallback).
- `grant_data` (policy/grant_decider.py): the data document grant decisions and explain are made on.
  Exact: kept only while the policy data version (one row that database triggers bump in every
  transaction changing a row build_data reads), read in the request's own transaction, is unchanged and
  no grant in it has expired since; stored only when the document and the version come from one snapshot.
- `flow_set` (policy/flowset.py, FlowSets, built in api/app.py): the allowed flow set under the active
  version (`data.flows.allowed_flows`, ~1 s to compute at 1,000 tenants) that GET /v1/policy/flows/matrix
  and GET /v1/policy/flows read, one per process. Reused only while a fresh evaluation would give the same
  answer: (a) SQLite's `PRAGMA data_version` (api/readcache.py's ChangeWatch) is what it was when the set
  was last known current, read *before* the data, so any commit by any connection of any worker since then
  makes the next request check again; or (b) in one read transaction (one snapshot: REPEATABLE READ on
  PostgreSQL), the policy data version (policy.data.data_fingerprint, the one `grant_data` uses) and the
  active version's content hash are the kept ones; and in both cases only while `now` lies between the instant it was
  computed and the earliest expiry of a grant in it. Exact for the shipped flows.rego, which reads the
  time only to compare it with a grant's expiry (tests/api/test_caches.py checks the text); an uploaded
  version whose allowed flows depend on the time in another way would be answered as of the instant the
  set was computed until a row under the document changes or the version does. PostgreSQL: (a) is the
  change feed (see `grant_pages`), else (b) is asked (one row read); the set is evaluated again only when both
  fail.
  Measured by bench/console.py (1,000 tenants x 10 groups, 5,000 grants, SQLite, medians of 3): GET
  /v1/policy/flows/matrix 8.9 ms with the set kept, 1,337 ms when it is evaluated (after a grant change):
  it stays. When it must be computed again after grant events alone (beside policy.flowset.UNRELATED ones),
  the same version active and no grant in it expired, the kept document is patched with exactly the grants
  those events name (every change commits its audit event in the same transaction, so the events between
  the audit log size the set was read at and now list every change) and evaluated on the kept engine; the
  patched set is held equal to a fresh evaluation by tests/api/test_flows.py.
- `impact` (workflows/impacts.py, ImpactReports, built in api/app.py): a version's impact report (flows
  opened and closed by tenant, and the per-device section) per (candidate content hash, active version's
  content hash, data fingerprint, fabric as compiled from the database, budget), a few per process (LRU, 8).
  The key is read in the request's own read transaction and the report is refused from the earliest expiry
  of a grant in its data; computed, it uses the kept `flow_set` (the active version's answer and document)
  when that is current in the same transaction, so only the candidate is evaluated (in the policy sandbox:
  it is user-supplied Rego; a refusal is never kept). Exact like `flow_set` (same argument for the time,
  one snapshot on PostgreSQL too); the fabric is part of the key because the device section depends on it
  and placements are not under the data document. PostgreSQL: no change counter, so the key is read on
  every request. Off with `flow_set` too. Measured by bench/console.py (same scale): the impact report
  4.5-6.8 s before (every request evaluated both versions twice and expanded ~240k flows each), now
  computed in about a second once (one evaluation, the diff of the compact answers, two compiles) and
  answered from the cache after.
  Answered at once (`Prefer: respond-async`, api/computing.py, what the console sends): `flow_set`
  and `impact` are only looked up, with the same checks (FlowSets.current_or_start,
  ImpactReports.report_or_start); a miss starts the computation in the background (core/once.py: one job
  per key at a time) and is answered 202. The job stores its result here under the key it read, so a
  change committed meanwhile makes the next look-up miss again: an answer from before a change is never
  served as current.

Measured by bench/api.py (this branch, two runs on the shared 2-core machine at load 3-9, each cache off vs
all on, alternating runs; ratio = throughput off / on): authz GET 0.79 / 0.73; token_signature GET
0.59 / 0.43; token_row GET 0.90 / 0.86; grant_pages GET 0.08 / 0.06; grant_data POST 0.78 / 0.69. Each
pays on the path it serves, so all five stay.

Not a switchable cache but a bound: the CRL publisher (pki/revocation.py, CrlPublisher, app.state.crl)
keeps the signed CRLs until a revocation or a CA state changes (two aggregate reads tell) or half their
validity passes. Signing per GET let any unauthenticated client buy a CA signature per request (issue 13,
item 7); it is exact by construction (the signed list is what the rows say at the time it was signed).

Not switchable, on the SVID issuance path (pki/service.py, issue_x509_svid_grouped): what signing needs per
identity (its SPIFFE ID, the TTL rules, the active issuing CA), kept from the last issuance to it (LRU,
65,536). Not trusted for anything but signing: the group-committed transaction checks the registration and
the CA again under the audit head lock, and a certificate signed from facts that changed meanwhile is
dropped and signed again from fresh ones (tests/pki/test_grouped_issuance.py).

Off our database, on the console's OIDC sign-in path (not switchable): the issuer's discovery document,
kept five minutes per issuer (api/console/oidc.py), and the ID token's keys, read through
api/auth/oidc.py's JwksSource like the API's own OIDC tokens (PyJWKClient: five minutes, fetched again on
an unknown kid). Not exact by construction but bounded by what the issuer publishes: a rotated-in key is
published before it signs and the unknown kid fetches it; a moved endpoint is followed within five
minutes; the document's `issuer` is checked on every fetch; a key the issuer withdraws stays accepted
for at most five minutes, as for the API's OIDC bearer tokens.

Removed (bench/api.py, this branch): the JWT-SVID bundle keys kept 30 s
(api/auth/jwt_svid.py). bench/api.py's requests never present a JWT-SVID, so it cannot show paying; and
a key retired from the bundle stayed accepted for up to 30 s. Each JWT-SVID now reads the bundle's keys
in the request's own read transaction.
"""

from __future__ import annotations

CACHES: tuple[str, ...] = ("authz", "token_signature", "token_row", "grant_pages", "grant_data", "flow_set", "impact")


def cache_on(off: frozenset[str], name: str) -> bool:
    """Whether the cache `name` is enabled, given the names switched off (settings.cache_off)."""
    if name not in CACHES:
        raise ValueError(f"unknown cache {name!r} (known: {', '.join(CACHES)})")
    return name not in off and "all" not in off


def check_names(off: frozenset[str]) -> None:
    """A cache name that does not exist (a typo in TRUSTFABRIC_CACHE_OFF) fails at start, never silently."""
    unknown = sorted(off - set(CACHES) - {"all"})
    if unknown:
        raise ValueError(f"TRUSTFABRIC_CACHE_OFF names unknown cache(s) {', '.join(unknown)} "
                         f"(known: {', '.join(CACHES)}, or all)")
