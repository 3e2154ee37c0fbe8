"""A small real OIDC provider for the console's sign-in tests: Authlib's authorization server (the
authorization code grant, with PKCE required for public clients and OpenID Connect ID tokens with the
nonce), served by werkzeug on 127.0.0.1 on a port of its own, in a thread.

It is a peer, not a stand-in for our code: the code exchange, the PKCE verification (S256) and the ID
token are Authlib's. Users are fixed at start; the authorization page is a form where the person picks
one. Access tokens are RS256 JWTs for the API's audience carrying the role and tenant claims the API maps
(`trustfabric_role`, `trustfabric_tenant`).
"""

from __future__ import annotations

import os
import secrets
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import jwt
from authlib.integrations.flask_oauth2 import AuthorizationServer
from authlib.oauth2.rfc6749 import ClientMixin, grants
from authlib.oauth2.rfc7636 import CodeChallenge
from authlib.oidc.core import UserInfo
from authlib.oidc.core.grants import OpenIDCode as _OpenIDCode
from cryptography.hazmat.primitives.asymmetric import rsa
from flask import Flask, jsonify, request
from joserfc.jwk import RSAKey
from werkzeug.serving import make_server

os.environ.setdefault("AUTHLIB_INSECURE_TRANSPORT", "1")  # the test peer speaks plain HTTP on 127.0.0.1
CLIENT_ID = "trustfabric-console"
KID = "test-oidc-1"


@dataclass
class User:
    sub: str
    claims: dict[str, Any]


@dataclass
class Code:
    code: str
    client_id: str
    redirect_uri: str
    scope: str
    user: User
    nonce: str | None
    code_challenge: str | None
    code_challenge_method: str | None
    auth_time: int = field(default_factory=lambda: int(time.time()))

    def get_redirect_uri(self) -> str:
        return self.redirect_uri

    def get_scope(self) -> str:
        return self.scope

    def get_nonce(self) -> str | None:
        return self.nonce

    def get_auth_time(self) -> int:
        return self.auth_time

    def get_acr(self) -> None:
        return None

    def get_amr(self) -> None:
        return None


class Client(ClientMixin):  # type: ignore[misc]
    """One public client (no secret: PKCE is what protects its codes)."""

    def __init__(self, redirect_uris: list[str]) -> None:
        self.redirect_uris = redirect_uris

    def get_client_id(self) -> str:
        return CLIENT_ID

    def get_default_redirect_uri(self) -> str:
        return self.redirect_uris[0]

    def get_allowed_scope(self, scope: str) -> str:
        return " ".join(s for s in (scope or "").split() if s in ("openid", "profile"))

    def check_redirect_uri(self, redirect_uri: str) -> bool:
        return redirect_uri in self.redirect_uris

    def check_client_secret(self, client_secret: str) -> bool:
        return False

    def check_endpoint_auth_method(self, method: str, endpoint: str) -> bool:
        return method == "none"

    def check_response_type(self, response_type: str) -> bool:
        return response_type == "code"

    def check_grant_type(self, grant_type: str) -> bool:
        return grant_type == "authorization_code"


class OidcProvider:
    def __init__(self, users: list[User], redirect_uris: list[str]) -> None:
        self.users = {u.sub: u for u in users}
        self.codes: dict[str, Code] = {}
        self.client = Client(redirect_uris)
        self.private_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        self.jwk = RSAKey.import_key(self.private_key, {"kid": KID, "use": "sig", "alg": "RS256"})
        self.issuer = ""  # set once the port is known
        self.audience = "trustfabric-api"
        self.token_requests: list[dict[str, str]] = []
        self.app = self._build()

    def _build(self) -> Flask:
        provider = self
        app = Flask("tf-test-oidc")
        app.config["OAUTH2_TOKEN_EXPIRES_IN"] = {"authorization_code": 600}

        class AuthorizationCodeGrant(grants.AuthorizationCodeGrant):  # type: ignore[misc]
            TOKEN_ENDPOINT_AUTH_METHODS = ["none"]

            def save_authorization_code(self, code: str, req: Any) -> None:
                data = req.payload.data
                provider.codes[code] = Code(code, CLIENT_ID, req.payload.redirect_uri, req.scope, req.user,
                                            data.get("nonce"), data.get("code_challenge"),
                                            data.get("code_challenge_method"))

            def query_authorization_code(self, code: str, client: Any) -> Code | None:
                return provider.codes.get(code)

            def delete_authorization_code(self, authorization_code: Code) -> None:
                provider.codes.pop(authorization_code.code, None)

            def authenticate_user(self, authorization_code: Code) -> User:
                return authorization_code.user

        class OpenIDCode(_OpenIDCode):  # type: ignore[misc]
            def exists_nonce(self, nonce: str, req: Any) -> bool:
                return any(c.nonce == nonce for c in provider.codes.values())

            def resolve_client_private_key(self, client: Any) -> Any:
                return provider.jwk

            def get_client_algorithm(self, client: Any) -> str:
                return "RS256"

            def get_encode_header(self, client: Any) -> dict[str, str]:
                return {"alg": "RS256", "kid": KID}

            def get_client_claims(self, client: Any) -> dict[str, Any]:
                now = int(time.time())
                return {"iss": provider.issuer, "aud": [CLIENT_ID], "iat": now, "exp": now + 600}

            def generate_user_info(self, user: User, scope: str) -> UserInfo:
                return UserInfo(sub=user.sub, name=user.sub)

        def token(grant_type: str, client: Any, user: User | None = None, scope: str | None = None,
                  expires_in: int | None = None, include_refresh_token: bool = True) -> dict[str, Any]:
            assert user is not None
            now = int(time.time())
            access = jwt.encode(
                {"iss": provider.issuer, "aud": provider.audience, "sub": user.sub, "iat": now, "exp": now + 900,
                 "jti": uuid.uuid4().hex, **user.claims},
                self.private_key, algorithm="RS256", headers={"kid": KID})
            return {"token_type": "Bearer", "access_token": access, "expires_in": 900, "scope": scope or ""}

        server = AuthorizationServer(app, query_client=lambda cid: provider.client if cid == CLIENT_ID else None,
                                     save_token=lambda tok, req: None)
        server.register_token_generator("default", token)
        server.register_grant(AuthorizationCodeGrant, [CodeChallenge(required=True), OpenIDCode(require_nonce=True)])

        @app.get("/.well-known/openid-configuration")
        def discovery() -> Any:
            return jsonify({
                "issuer": provider.issuer, "authorization_endpoint": f"{provider.issuer}/authorize",
                "token_endpoint": f"{provider.issuer}/token", "jwks_uri": f"{provider.issuer}/jwks",
                "response_types_supported": ["code"], "subject_types_supported": ["public"],
                "id_token_signing_alg_values_supported": ["RS256"], "code_challenge_methods_supported": ["S256"],
            })

        @app.get("/jwks")
        def jwks() -> Any:
            return jsonify({"keys": [self.jwk.as_dict(private=False)]})

        @app.route("/authorize", methods=["GET", "POST"])
        def authorize() -> Any:
            if request.method == "GET":
                server.get_consent_grant(end_user=None)  # validates client, redirect_uri, PKCE, nonce
                options = "".join(f'<option value="{s}">{s}</option>' for s in provider.users)
                return (f'<!doctype html><title>Test OIDC provider</title><h1>Sign in to the test provider</h1>'
                        f'<form method="post"><label for="sub">User</label> <select id="sub" name="sub">{options}'
                        f'</select> <button type="submit">Sign in</button></form>')
            user = provider.users.get(request.form.get("sub", ""))
            return server.create_authorization_response(grant_user=user)

        @app.post("/token")
        def issue_token() -> Any:
            provider.token_requests.append(dict(request.form))
            return server.create_token_response()

        return app


@contextmanager
def running(users: list[User], redirect_uris: list[str]) -> Iterator[OidcProvider]:
    """The provider on 127.0.0.1 and a free port, for the duration of the block."""
    provider = OidcProvider(users, redirect_uris)
    server = make_server("127.0.0.1", 0, provider.app, threaded=True)
    provider.issuer = f"http://127.0.0.1:{server.server_port}"
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield provider
    finally:
        server.shutdown()
        thread.join(5)
        server.server_close()


def random_user(role: str, tenant: str | None = None) -> User:
    claims = {"trustfabric_role": role, **({"trustfabric_tenant": tenant} if tenant else {})}
    return User(f"{role}-{secrets.token_hex(3)}@example.org", claims)
