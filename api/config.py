"""Settings from the environment: the one place configuration is read."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path

from store.db import sqlite_url


@dataclass(frozen=True)
class Settings:
    home: Path = field(default_factory=lambda: Path(".trustfabric"))
    database_url: str | None = None
    trust_domain: str = "trustfabric.local"
    keystore: str = "file"  # file | pkcs11
    key_file: Path | None = None
    passphrase: str | None = None
    pkcs11_module: str | None = None
    pkcs11_token: str | None = None
    pkcs11_pin: str | None = None
    max_svid_ttl: timedelta = timedelta(hours=24)
    audit_checkpoint_every: int = 1000
    audit_checkpoint_seconds: int = 60
    # API bearer tokens (JWT, ES256, minted by `trustfabric token create`)
    api_issuer: str = "trustfabric"
    api_audience: str = "trustfabric-api"
    max_token_ttl: timedelta = timedelta(days=30)
    # Optional external OIDC issuer: issuer URL + JWKS (file path or URL); role/tenant from claims
    oidc_issuer: str | None = None
    oidc_jwks: str | None = None
    oidc_audience: str = "trustfabric-api"
    oidc_role_claim: str = "trustfabric_role"
    oidc_tenant_claim: str = "trustfabric_tenant"
    # Web console (api/console): sessions, and OIDC sign-in (authorization code + PKCE) when a client id is set
    console_session_ttl: timedelta = timedelta(hours=1)
    oidc_client_id: str | None = None
    oidc_client_secret: str | None = None  # a confidential client's; a public client relies on PKCE alone
    oidc_redirect_uri: str | None = None  # default: <this server>/console/oidc/callback
    oidc_scopes: str = "openid"
    # Limits
    max_body_bytes: int = 64 * 1024
    rate_limit_per_second: float = 50.0  # per principal; 0 disables
    rate_limit_burst: int = 100
    read_cache: bool = True  # exact caches of hot reads (SQLite; see api/readcache.py)
    # Grants
    grant_pending_ttl: timedelta = timedelta(days=3)
    sweep_interval_seconds: float = 5.0
    ca_rotation_check_seconds: float = 60.0
    policy_verify_keys: tuple[Path, ...] = ()  # PEM public keys; when set, activation needs a signature

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> Settings:
        e = dict(os.environ if env is None else env)
        home = Path(e.get("TRUSTFABRIC_HOME", ".trustfabric"))
        key_file = e.get("TRUSTFABRIC_KEY_FILE")
        return cls(
            home=home,
            database_url=e.get("TRUSTFABRIC_DATABASE_URL") or None,
            trust_domain=e.get("TRUSTFABRIC_TRUST_DOMAIN", "trustfabric.local"),
            keystore=e.get("TRUSTFABRIC_KEYSTORE", "file"),
            key_file=Path(key_file) if key_file else None,
            passphrase=e.get("TRUSTFABRIC_PASSPHRASE") or None,
            pkcs11_module=e.get("TRUSTFABRIC_PKCS11_MODULE") or None,
            pkcs11_token=e.get("TRUSTFABRIC_PKCS11_TOKEN") or None,
            pkcs11_pin=e.get("TRUSTFABRIC_PKCS11_PIN") or None,
            max_svid_ttl=timedelta(seconds=int(e.get("TRUSTFABRIC_MAX_SVID_TTL_SECONDS", str(24 * 3600)))),
            audit_checkpoint_every=int(e.get("TRUSTFABRIC_AUDIT_CHECKPOINT_EVERY", "1000")),
            audit_checkpoint_seconds=int(e.get("TRUSTFABRIC_AUDIT_CHECKPOINT_SECONDS", "60")),
            api_issuer=e.get("TRUSTFABRIC_API_ISSUER", "trustfabric"),
            api_audience=e.get("TRUSTFABRIC_API_AUDIENCE", "trustfabric-api"),
            max_token_ttl=timedelta(seconds=int(e.get("TRUSTFABRIC_MAX_TOKEN_TTL_SECONDS", str(30 * 86400)))),
            oidc_issuer=e.get("TRUSTFABRIC_OIDC_ISSUER") or None,
            oidc_jwks=e.get("TRUSTFABRIC_OIDC_JWKS") or None,
            oidc_audience=e.get("TRUSTFABRIC_OIDC_AUDIENCE", "trustfabric-api"),
            oidc_role_claim=e.get("TRUSTFABRIC_OIDC_ROLE_CLAIM", "trustfabric_role"),
            oidc_tenant_claim=e.get("TRUSTFABRIC_OIDC_TENANT_CLAIM", "trustfabric_tenant"),
            console_session_ttl=timedelta(seconds=int(e.get("TRUSTFABRIC_CONSOLE_SESSION_SECONDS", "3600"))),
            oidc_client_id=e.get("TRUSTFABRIC_OIDC_CLIENT_ID") or None,
            oidc_client_secret=e.get("TRUSTFABRIC_OIDC_CLIENT_SECRET") or None,
            oidc_redirect_uri=e.get("TRUSTFABRIC_OIDC_REDIRECT_URI") or None,
            oidc_scopes=e.get("TRUSTFABRIC_OIDC_SCOPES", "openid"),
            max_body_bytes=int(e.get("TRUSTFABRIC_MAX_BODY_BYTES", str(64 * 1024))),
            rate_limit_per_second=float(e.get("TRUSTFABRIC_RATE_LIMIT_PER_SECOND", "50")),
            rate_limit_burst=int(e.get("TRUSTFABRIC_RATE_LIMIT_BURST", "100")),
            grant_pending_ttl=timedelta(seconds=int(e.get("TRUSTFABRIC_GRANT_PENDING_TTL_SECONDS", str(3 * 86400)))),
            sweep_interval_seconds=float(e.get("TRUSTFABRIC_SWEEP_INTERVAL_SECONDS", "5")),
            ca_rotation_check_seconds=float(e.get("TRUSTFABRIC_CA_ROTATION_CHECK_SECONDS", "60")),
            policy_verify_keys=tuple(
                Path(p.strip()) for p in e.get("TRUSTFABRIC_POLICY_VERIFY_KEYS", "").split(",") if p.strip()
            ),
            read_cache=e.get("TRUSTFABRIC_READ_CACHE", "1").lower() not in ("0", "false", "no", "off"),
        )

    @property
    def db_url(self) -> str:
        return self.database_url or sqlite_url(self.home)

    @property
    def keys_dir(self) -> Path:
        return self.home / "keys"

    @property
    def default_key_file(self) -> Path:
        return self.key_file or self.home / "master.key"
