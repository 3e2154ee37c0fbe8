"""Authentication: one module per way of establishing who the caller is.

- mtls.py: a TLS client certificate (an X.509-SVID of a node or a workload);
- opaque.py: an opaque `tfo_` bearer secret (the admin bootstrap token);
- api_jwt.py: our own signed API tokens; oidc.py: an external OIDC issuer's tokens; jwt_svid.py: JWT-SVIDs
  (bearer.py reads a bearer JWT once and hands it to exactly one of these three by issuer).

Each authenticator returns None when its kind of credential is absent and raises Unauthenticated when it
is present but bad; the list is tried in order (api/deps.py). Authorization is api/authz.py.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from fastapi import Request

from api.principal import Principal

if TYPE_CHECKING:
    from workflows.context import AppContext

Authenticator = Callable[["AppContext", Request], Principal | None]


def default_authenticators(ctx: AppContext) -> list[Authenticator]:
    """Client certificate (mTLS), then opaque admin tokens, then JWTs (ours, OIDC, JWT-SVIDs)."""
    from api.auth.bearer import JwtAuthenticator
    from api.auth.mtls import MtlsAuthenticator
    from api.auth.opaque import opaque_token_authenticator

    return [MtlsAuthenticator(ctx), opaque_token_authenticator, JwtAuthenticator(ctx)]
