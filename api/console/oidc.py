"""Sign-in through the OIDC issuer: authorization code flow with PKCE (S256), state and nonce.

Endpoints come from the issuer's discovery document (whose `issuer` must equal the configured one). The
flow's secrets (state, nonce, PKCE verifier) ride in a ten-minute cookie signed by the API issuer key with
an audience of its own (the API refuses it as a bearer, and a session JWT is refused here), so the
callback may land on any worker of any replica. That cookie alone is SameSite=Lax: the callback is a
top-level navigation from the issuer's site, on which a Strict cookie would not be sent.

The ID token is checked (signature by the issuer's JWKS, issuer, audience = our client id, nonce, times);
the access token is then what the API is shown (GET /v1/whoami: the API's own OIDC verification and
claims mapping decide the principal), and the console session is minted from it like from any token.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
import time
import urllib.parse
from dataclasses import dataclass
from typing import Any

import httpx
import jwt
from fastapi import Request
from fastapi.responses import RedirectResponse

from api.auth.oidc import JwksSource
from api.console.session import SignInError, clear_cookie, ctx_of, set_cookie
from api.workers import in_worker
from core.errors import Unauthenticated
from pki.tokens.service import sign_claims, verify_signed
from workflows.settings import Settings

FLOW_COOKIE = "tf_console_oidc"
FLOW_PATH = "/console/oidc"
FLOW_AUDIENCE = "trustfabric-console-oidc-flow"
FLOW_SECONDS = 600
DISCOVERY_SECONDS = 300.0
ID_TOKEN_ALGORITHMS = ["RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "EdDSA"]


@dataclass(frozen=True)
class Provider:
    issuer: str
    authorization_endpoint: str
    token_endpoint: str
    jwks_uri: str


_providers: dict[str, tuple[float, Provider]] = {}
_jwks: dict[str, JwksSource] = {}  # by jwks_uri: the API's own JWKS reader (it caches and refreshes keys)


def enabled(settings: Settings) -> bool:
    return bool(settings.oidc_issuer and settings.oidc_client_id)


async def provider(settings: Settings) -> Provider:
    """The issuer's endpoints from its discovery document (kept five minutes)."""
    issuer = settings.oidc_issuer or ""
    kept = _providers.get(issuer)
    if kept is not None and time.monotonic() - kept[0] < DISCOVERY_SECONDS:
        return kept[1]
    url = issuer.rstrip("/") + "/.well-known/openid-configuration"
    try:
        async with httpx.AsyncClient(timeout=5.0) as client:
            response = await client.get(url)
        response.raise_for_status()
        doc = response.json()
    except (httpx.HTTPError, ValueError) as exc:
        raise SignInError(f"the OIDC issuer's discovery document is unavailable ({type(exc).__name__})") from None
    if not isinstance(doc, dict) or doc.get("issuer") != issuer:
        raise SignInError("the OIDC discovery document names another issuer: refusing it")
    try:
        found = Provider(issuer, str(doc["authorization_endpoint"]), str(doc["token_endpoint"]), str(doc["jwks_uri"]))
    except KeyError as exc:
        raise SignInError(f"the OIDC discovery document has no {exc.args[0]}") from None
    _providers[issuer] = (time.monotonic(), found)
    return found


def redirect_uri(request: Request, settings: Settings) -> str:
    return settings.oidc_redirect_uri or f"{request.url.scheme}://{request.url.netloc}{FLOW_PATH}/callback"


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


async def start(request: Request) -> RedirectResponse:
    """Redirect to the issuer's authorization endpoint; the flow's secrets go into the signed flow cookie."""
    ctx = ctx_of(request)
    settings = ctx.settings
    found = await provider(settings)
    verifier = secrets.token_urlsafe(64)[:86]  # RFC 7636: 43-128 characters
    state, nonce = secrets.token_urlsafe(24), secrets.token_urlsafe(24)
    back = redirect_uri(request, settings)
    now = int(ctx.clock().timestamp())
    flow = sign_claims(
        ctx.keystore,
        {"iss": settings.api_issuer, "aud": FLOW_AUDIENCE, "iat": now, "exp": now + FLOW_SECONDS,
         "state": state, "nonce": nonce, "verifier": verifier, "redirect_uri": back},
        typ="tf-oidc-flow",
    )
    query = urllib.parse.urlencode({
        "response_type": "code", "client_id": settings.oidc_client_id, "redirect_uri": back,
        "scope": settings.oidc_scopes, "state": state, "nonce": nonce,
        "code_challenge": _b64(hashlib.sha256(verifier.encode()).digest()), "code_challenge_method": "S256",
    })
    sep = "&" if "?" in found.authorization_endpoint else "?"
    response = RedirectResponse(f"{found.authorization_endpoint}{sep}{query}", status_code=303)
    set_cookie(response, request, FLOW_COOKIE, flow, FLOW_SECONDS, path=FLOW_PATH, samesite="lax")
    return response


def forget_flow(response: Any, request: Request) -> None:
    clear_cookie(response, request, FLOW_COOKIE, path=FLOW_PATH, samesite="lax")


def _flow(request: Request) -> dict[str, Any]:
    ctx = ctx_of(request)
    cookie = request.cookies.get(FLOW_COOKIE)
    if not cookie:
        raise SignInError("the sign-in took too long or started elsewhere: start again")
    try:
        claims = verify_signed(ctx.keystore, cookie, audience=FLOW_AUDIENCE, issuer=ctx.settings.api_issuer,
                               require=("exp", "state", "nonce", "verifier"))
    except jwt.PyJWTError:
        raise SignInError("the sign-in state is invalid or expired: start again") from None
    return claims


def _id_token_claims(found: Provider, settings: Settings, id_token: str, nonce: str) -> dict[str, Any]:
    source = _jwks.get(found.jwks_uri)
    if source is None:
        source = _jwks[found.jwks_uri] = JwksSource(found.jwks_uri)
    try:
        kid = jwt.get_unverified_header(id_token).get("kid")
        key = source.key(kid if isinstance(kid, str) else "")
        claims: dict[str, Any] = jwt.decode(
            id_token, key.key, algorithms=ID_TOKEN_ALGORITHMS, audience=settings.oidc_client_id,
            issuer=settings.oidc_issuer, options={"require": ["exp", "iat", "sub", "nonce"]},
        )
    except Unauthenticated as exc:
        raise SignInError(f"the issuer's ID token is not valid: {exc}") from None
    except jwt.PyJWTError as exc:
        raise SignInError(f"the issuer's ID token is not valid: {exc}") from None
    if not hmac.compare_digest(str(claims["nonce"]).encode(), nonce.encode()):
        raise SignInError("the ID token's nonce is not this sign-in's: refusing it")
    return claims


async def finish(request: Request, code: str | None, state: str | None, error: str | None) -> str:
    """The access token for the signed-in person, after every check of the callback; SignInError otherwise."""
    flow = _flow(request)
    if not state or not hmac.compare_digest(state.encode(), str(flow["state"]).encode()):
        raise SignInError("the sign-in answer does not belong to this sign-in (state mismatch)")
    if error:
        raise SignInError(f"the OIDC issuer refused the sign-in: {error[:200]}")
    if not code:
        raise SignInError("the OIDC issuer sent no authorization code")
    settings = ctx_of(request).settings
    found = await provider(settings)
    form = {"grant_type": "authorization_code", "code": code, "redirect_uri": str(flow["redirect_uri"]),
            "client_id": settings.oidc_client_id or "", "code_verifier": str(flow["verifier"])}
    secret = settings.oidc_client_secret
    try:
        async with httpx.AsyncClient(timeout=10.0) as client:
            if secret:  # a confidential client authenticates (client_secret_basic); a public one has PKCE
                response = await client.post(found.token_endpoint, data=form,
                                             auth=(settings.oidc_client_id or "", secret))
            else:
                response = await client.post(found.token_endpoint, data=form)
        tokens = response.json()
    except (httpx.HTTPError, ValueError) as exc:
        raise SignInError(f"the OIDC token endpoint is unavailable ({type(exc).__name__})") from None
    if response.status_code != 200 or not isinstance(tokens, dict):
        what = tokens.get("error", response.status_code) if isinstance(tokens, dict) else response.status_code
        raise SignInError(f"the OIDC issuer refused the authorization code ({what})")
    id_token, access_token = tokens.get("id_token"), tokens.get("access_token")
    if not isinstance(id_token, str) or not isinstance(access_token, str):
        raise SignInError("the OIDC issuer's answer has no ID token or no access token")
    claims = await in_worker(request, _id_token_claims, found, settings, id_token, str(flow["nonce"]))
    try:
        access_sub = jwt.decode(access_token, options={"verify_signature": False}).get("sub")
    except jwt.PyJWTError:
        raise SignInError("the issuer's access token is not a JWT the API can verify") from None
    if access_sub != claims["sub"]:
        raise SignInError("the access token and the ID token name different subjects")
    return access_token
