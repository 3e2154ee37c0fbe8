"""Settings from the environment: the one module that reads configuration (api, pdp and cli all get it
from here, through the run-time context)."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from core.digits import is_digits
from core.errors import InvalidInput
from core.quotas import Quotas
from core.vocabulary import DEFAULT_TRUST_DOMAIN

if TYPE_CHECKING:  # loaded where built: every local command reads settings, few compile or evaluate
    from enforcer.allocate import Pools
    from enforcer.compiler import Budget
    from policy.engines import EngineSettings

MODES = ("production", "development")
ENGINE_KINDS = ("embedded", "opa")  # policy.engines.ENGINE_KINDS: a test holds the two equal
N = TypeVar("N", int, float)
DATABASE_SCHEMES = ("postgresql", "postgres", "sqlite")  # what store.db.make_engine opens


def _flag(e: Mapping[str, str], name: str) -> bool:
    """A switch: 1/true/yes/on or 0/false/no/off (unset or empty: off); anything else names the variable, never
    read as off (the switches are safeguards)."""
    text = (e.get(name) or "0").strip().lower()
    if text not in ("1", "true", "yes", "on", "0", "false", "no", "off"):
        raise InvalidInput(f"{name}={text!r}: use 1 or 0 (true/false, yes/no, on/off)")
    return text in ("1", "true", "yes", "on")


@dataclass(frozen=True)
class Settings:
    home: Path = field(default_factory=lambda: Path(".trustfabric"))
    database_url: str | None = None
    trust_domain: str = DEFAULT_TRUST_DOMAIN
    keystore: str = "file"  # file | pkcs11
    key_file: Path | None = None
    passphrase: str | None = None
    passphrase_file: Path | None = None  # the passphrase read from a file (e.g. a systemd credential)
    master_key: str = "file"  # file store's master key: file (key file or passphrase) | pkcs11 (token-wrapped)
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
    bootstrap_token_ttl: timedelta = timedelta(hours=24)  # the admin token init makes (token recover: a new one)
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
    ip_rate_limit_per_second: float = 100.0  # per client address, before authentication; 0 disables
    ip_rate_limit_burst: int = 200
    policy_concurrency: int = 2  # explains in progress at once per tenant (or platform principal); 0 disables
    worker_threads: int = 16  # per worker process: the threads requests hand their blocking work to (api/workers.py)
    # Slow and numerous clients (api/server.py: what uvicorn enforces and what we add)
    request_read_timeout_seconds: float = 10.0
    keep_alive_timeout_seconds: float = 5.0
    max_connections: int = 1000  # per worker process
    max_header_bytes: int = 16 * 1024
    # Per-tenant quotas (core/quotas.py); 0 = no limit
    quota_groups: int = Quotas.groups
    quota_workloads: int = Quotas.workloads
    quota_grants: int = Quotas.grants
    quota_pending: int = Quotas.pending
    read_cache: bool = True  # exact caches of hot reads (SQLite; see api/readcache.py)
    cache_off: frozenset[str] = frozenset()  # request-path caches switched off (names in api/caches.py)
    # Grants
    grant_pending_ttl: timedelta = timedelta(days=3)
    sweep_interval_seconds: float = 5.0
    ca_rotation_check_seconds: float = 60.0
    policy_verify_keys: tuple[Path, ...] = ()  # PEM public keys; when set, activation needs a signature
    # development: `make run`'s embedded defaults (unsigned activation when no key is configured);
    # production (the default): activation always needs a signature, so verify keys must be configured
    mode: str = "production"  # production | development
    policy_two_person: bool = False  # the uploader of a version cannot activate (or roll back to) it
    max_grant_ttl: timedelta = timedelta(days=7)  # enforced in code as well as in grants.rego
    # User-supplied Rego runs in limited processes (policy/sandbox.py); decisions have a budget at activation
    policy_job_cpu_seconds: float = 5.0
    policy_job_memory_mb: int = 1024
    policy_job_workers: int = 2
    policy_decision_budget_ms: float = 50.0
    policy_flow_set_budget_ms: float = 2000.0
    # Policy engines (policy/engines: make_engine decides which serves what)
    policy_engine: str = "embedded"  # embedded | opa: grant decisions and the PDP
    authz_engine: str = "embedded"  # embedded | opa: the API's own authorization policy
    rego_vm: str = "auto"  # auto | off: hot decisions through regorus's compiled VM (policy/engines/rvm.py)
    opa_url: str = "http://127.0.0.1:8181"
    opa_token: str | None = None
    opa_ca_file: str | None = None
    opa_timeout_seconds: float = 2.0
    pdp_token: str | None = None  # bearer token `trustfabric pdp` requires (needed beyond loopback)
    # Fabric: pools a tenant's missing L3VNI, attachment VLAN and prefixes are allocated from
    vni_pool: tuple[int, int] = (10_000, 16_777_215)
    vlan_pool: tuple[int, int] = (100, 4094)
    prefix_pool: str = "10.0.0.0/8"
    prefix_length: int = 20
    prefix6_pool: str | None = None  # e.g. fd00::/32; unset: no IPv6 prefix is allocated
    prefix6_length: int = 48
    # Enforcer: auto publishes every recompile; manual keeps it as a pending plan until `enforcer apply`
    enforcer_mode: str = "auto"
    enforcer_poll_seconds: float = 0.5  # how often the reconciler looks for changes made by other processes
    enforcer_resync_seconds: float = 300.0  # a full recompile from scratch at least this often
    nic_flow_budget: int = 65_536
    leaf_acl_budget: int = 25_000
    leaf_acl_mode: str = "atomic"  # NVUE atomic ACL updates keep a shadow copy: half the entries usable
    device_wait_max_seconds: int = 60  # the longest a device's long-poll (GET .../ruleset?wait=) is held
    # Observability
    log_format: str = "auto"  # auto (logfmt on a terminal, else JSON lines) | json | logfmt
    log_level: str = "info"
    metrics_token: str | None = None  # a bearer token for scrapers of GET /metrics (else admin/security)
    metrics_port: int | None = None  # also serve /metrics, unauthenticated, on this port of metrics_host
    metrics_host: str = "127.0.0.1"
    metrics_multiproc_dir: str | None = None  # PROMETHEUS_MULTIPROC_DIR (serve --workers N sets it)
    otel_endpoint: str | None = None  # where spans go (OTLP/HTTP); None: tracing off
    otel_service_name: str = "trustfabric"

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> Settings:
        e = dict(os.environ if env is None else env)
        home = Path(e.get("TRUSTFABRIC_HOME", ".trustfabric"))
        key_file = e.get("TRUSTFABRIC_KEY_FILE")
        prefix_pool, prefix_length = _pool(e, "TRUSTFABRIC_PREFIX_POOL", "TRUSTFABRIC_PREFIX_LENGTH", "10.0.0.0/8",
                                           "20", 4)
        prefix6_pool, prefix6_length = _pool(e, "TRUSTFABRIC_PREFIX6_POOL", "TRUSTFABRIC_PREFIX6_LENGTH", None,
                                             "48", 6)
        return cls(
            home=home,
            database_url=e.get("TRUSTFABRIC_DATABASE_URL") or None,
            trust_domain=e.get("TRUSTFABRIC_TRUST_DOMAIN", DEFAULT_TRUST_DOMAIN),
            keystore=e.get("TRUSTFABRIC_KEYSTORE", "file"),
            key_file=Path(key_file) if key_file else None,
            passphrase=e.get("TRUSTFABRIC_PASSPHRASE") or None,
            passphrase_file=Path(e["TRUSTFABRIC_PASSPHRASE_FILE"]) if e.get("TRUSTFABRIC_PASSPHRASE_FILE") else None,
            master_key=e.get("TRUSTFABRIC_MASTER_KEY", "file"),
            pkcs11_module=e.get("TRUSTFABRIC_PKCS11_MODULE") or None,
            pkcs11_token=e.get("TRUSTFABRIC_PKCS11_TOKEN") or None,
            pkcs11_pin=e.get("TRUSTFABRIC_PKCS11_PIN") or None,
            max_svid_ttl=timedelta(seconds=_int(e, "TRUSTFABRIC_MAX_SVID_TTL_SECONDS", str(24 * 3600))),
            audit_checkpoint_every=_int(e, "TRUSTFABRIC_AUDIT_CHECKPOINT_EVERY", "1000"),
            audit_checkpoint_seconds=_int(e, "TRUSTFABRIC_AUDIT_CHECKPOINT_SECONDS", "60"),
            api_issuer=e.get("TRUSTFABRIC_API_ISSUER", "trustfabric"),
            api_audience=e.get("TRUSTFABRIC_API_AUDIENCE", "trustfabric-api"),
            max_token_ttl=timedelta(seconds=_int(e, "TRUSTFABRIC_MAX_TOKEN_TTL_SECONDS", str(30 * 86400))),
            bootstrap_token_ttl=timedelta(seconds=_int(e, "TRUSTFABRIC_BOOTSTRAP_TOKEN_TTL_SECONDS", str(86400))),
            oidc_issuer=e.get("TRUSTFABRIC_OIDC_ISSUER") or None,
            oidc_jwks=e.get("TRUSTFABRIC_OIDC_JWKS") or None,
            oidc_audience=e.get("TRUSTFABRIC_OIDC_AUDIENCE", "trustfabric-api"),
            oidc_role_claim=e.get("TRUSTFABRIC_OIDC_ROLE_CLAIM", "trustfabric_role"),
            oidc_tenant_claim=e.get("TRUSTFABRIC_OIDC_TENANT_CLAIM", "trustfabric_tenant"),
            console_session_ttl=timedelta(seconds=_int(e, "TRUSTFABRIC_CONSOLE_SESSION_SECONDS", "3600")),
            oidc_client_id=e.get("TRUSTFABRIC_OIDC_CLIENT_ID") or None,
            oidc_client_secret=e.get("TRUSTFABRIC_OIDC_CLIENT_SECRET") or None,
            oidc_redirect_uri=e.get("TRUSTFABRIC_OIDC_REDIRECT_URI") or None,
            oidc_scopes=e.get("TRUSTFABRIC_OIDC_SCOPES", "openid"),
            max_body_bytes=_int(e, "TRUSTFABRIC_MAX_BODY_BYTES", str(64 * 1024)),
            rate_limit_per_second=_float(e, "TRUSTFABRIC_RATE_LIMIT_PER_SECOND", "50"),
            rate_limit_burst=_int(e, "TRUSTFABRIC_RATE_LIMIT_BURST", "100"),
            ip_rate_limit_per_second=_float(e, "TRUSTFABRIC_IP_RATE_LIMIT_PER_SECOND", "100"),
            ip_rate_limit_burst=_int(e, "TRUSTFABRIC_IP_RATE_LIMIT_BURST", "200"),
            policy_concurrency=_int(e, "TRUSTFABRIC_POLICY_CONCURRENCY", "2"),
            worker_threads=_int(e, "TRUSTFABRIC_WORKER_THREADS", "16"),
            request_read_timeout_seconds=_float(e, "TRUSTFABRIC_REQUEST_READ_TIMEOUT_SECONDS", "10"),
            keep_alive_timeout_seconds=_float(e, "TRUSTFABRIC_KEEP_ALIVE_TIMEOUT_SECONDS", "5"),
            max_connections=_int(e, "TRUSTFABRIC_MAX_CONNECTIONS", "1000"),
            max_header_bytes=_int(e, "TRUSTFABRIC_MAX_HEADER_BYTES", str(16 * 1024)),
            quota_groups=_int(e, "TRUSTFABRIC_QUOTA_GROUPS", str(Quotas.groups)),
            quota_workloads=_int(e, "TRUSTFABRIC_QUOTA_WORKLOADS", str(Quotas.workloads)),
            quota_grants=_int(e, "TRUSTFABRIC_QUOTA_GRANTS", str(Quotas.grants)),
            quota_pending=_int(e, "TRUSTFABRIC_QUOTA_PENDING", str(Quotas.pending)),
            grant_pending_ttl=timedelta(seconds=_int(e, "TRUSTFABRIC_GRANT_PENDING_TTL_SECONDS", str(3 * 86400))),
            sweep_interval_seconds=_float(e, "TRUSTFABRIC_SWEEP_INTERVAL_SECONDS", "5"),
            ca_rotation_check_seconds=_float(e, "TRUSTFABRIC_CA_ROTATION_CHECK_SECONDS", "60"),
            policy_verify_keys=tuple(
                Path(p.strip()) for p in e.get("TRUSTFABRIC_POLICY_VERIFY_KEYS", "").split(",") if p.strip()
            ),
            mode=e.get("TRUSTFABRIC_MODE", "production"),
            policy_two_person=_flag(e, "TRUSTFABRIC_POLICY_TWO_PERSON"),
            max_grant_ttl=timedelta(seconds=_int(e, "TRUSTFABRIC_MAX_GRANT_TTL_SECONDS", str(7 * 86400))),
            policy_job_cpu_seconds=_float(e, "TRUSTFABRIC_POLICY_JOB_CPU_SECONDS", "5"),
            policy_job_memory_mb=_int(e, "TRUSTFABRIC_POLICY_JOB_MEMORY_MB", "1024"),
            policy_job_workers=_int(e, "TRUSTFABRIC_POLICY_JOB_WORKERS", "2"),
            policy_decision_budget_ms=_float(e, "TRUSTFABRIC_POLICY_DECISION_BUDGET_MS", "50"),
            policy_flow_set_budget_ms=_float(e, "TRUSTFABRIC_POLICY_FLOW_SET_BUDGET_MS", "2000"),
            read_cache=e.get("TRUSTFABRIC_READ_CACHE", "1").lower() not in ("0", "false", "no", "off"),
            cache_off=frozenset(n.strip() for n in e.get("TRUSTFABRIC_CACHE_OFF", "").split(",") if n.strip()),
            policy_engine=_one_of(e, "TRUSTFABRIC_POLICY_ENGINE", "embedded", ENGINE_KINDS),
            authz_engine=_one_of(e, "TRUSTFABRIC_AUTHZ_ENGINE", "embedded", ENGINE_KINDS),
            rego_vm=_one_of(e, "TRUSTFABRIC_REGO_VM", "auto", ("auto", "off")),
            opa_url=e.get("TRUSTFABRIC_OPA_URL", "http://127.0.0.1:8181"),
            opa_token=e.get("TRUSTFABRIC_OPA_TOKEN") or None,
            opa_ca_file=e.get("TRUSTFABRIC_OPA_CA_FILE") or None,
            opa_timeout_seconds=_float(e, "TRUSTFABRIC_OPA_TIMEOUT_SECONDS", "2"),
            pdp_token=e.get("TRUSTFABRIC_PDP_TOKEN") or None,
            vni_pool=_range(e.get("TRUSTFABRIC_VNI_POOL", "10000-16777215"), "TRUSTFABRIC_VNI_POOL", (1, 16777215)),
            vlan_pool=_range(e.get("TRUSTFABRIC_VLAN_POOL", "100-4094"), "TRUSTFABRIC_VLAN_POOL", (2, 4094)),
            prefix_pool=prefix_pool or "10.0.0.0/8",
            prefix_length=prefix_length,
            prefix6_pool=prefix6_pool,
            prefix6_length=prefix6_length,
            enforcer_mode=e.get("TRUSTFABRIC_ENFORCER_MODE", "auto"),
            enforcer_poll_seconds=_float(e, "TRUSTFABRIC_ENFORCER_POLL_SECONDS", "0.5"),
            enforcer_resync_seconds=_float(e, "TRUSTFABRIC_ENFORCER_RESYNC_SECONDS", "300"),
            nic_flow_budget=_int(e, "TRUSTFABRIC_NIC_FLOW_BUDGET", "65536"),
            leaf_acl_budget=_int(e, "TRUSTFABRIC_LEAF_ACL_BUDGET", "25000"),
            leaf_acl_mode=e.get("TRUSTFABRIC_LEAF_ACL_MODE", "atomic"),
            device_wait_max_seconds=_int(e, "TRUSTFABRIC_DEVICE_WAIT_MAX_SECONDS", "60"),
            log_format=_one_of(e, "TRUSTFABRIC_LOG_FORMAT", "auto", ("auto", "json", "logfmt")),
            log_level=_one_of(e, "TRUSTFABRIC_LOG_LEVEL", "info", ("debug", "info", "warning", "error")),
            metrics_token=e.get("TRUSTFABRIC_METRICS_TOKEN") or None,
            metrics_port=_port(e, "TRUSTFABRIC_METRICS_PORT"),
            metrics_host=e.get("TRUSTFABRIC_METRICS_HOST", "127.0.0.1"),
            metrics_multiproc_dir=e.get("PROMETHEUS_MULTIPROC_DIR") or None,
            otel_endpoint=_traces_endpoint(e),
            otel_service_name=e.get("OTEL_SERVICE_NAME") or "trustfabric",
        )

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise InvalidInput(f"TRUSTFABRIC_MODE must be one of {', '.join(MODES)}, not {self.mode!r}")
        if self.worker_threads < 1:
            raise InvalidInput(f"TRUSTFABRIC_WORKER_THREADS must be at least 1, not {self.worker_threads}")
        scheme = (self.database_url or "sqlite:").partition(":")[0].lower()
        if scheme.partition("+")[0] not in DATABASE_SCHEMES:  # only the scheme: the URL may hold a password
            raise InvalidInput(f"TRUSTFABRIC_DATABASE_URL must be a postgresql:// or sqlite:/// URL, not {scheme}:...")

    @property
    def development(self) -> bool:
        return self.mode == "development"

    @property
    def require_policy_signature(self) -> bool:
        """Activation needs a verified signature: always outside development mode, and whenever keys are set."""
        return not self.development or bool(self.policy_verify_keys)

    def pools(self) -> Pools:
        """The pools tenants' missing addressing comes from (enforcer.allocate)."""
        from enforcer.allocate import Pools

        return Pools(vni=self.vni_pool, vlan=self.vlan_pool, ipv4=self.prefix_pool, ipv4_len=self.prefix_length,
                     ipv6=self.prefix6_pool, ipv6_len=self.prefix6_length)

    def budget(self) -> Budget:
        """Per-device capacity the compiler checks every rule set against."""
        from enforcer.compiler import Budget

        if self.leaf_acl_mode not in ("atomic", "non-atomic"):
            raise InvalidInput(f"TRUSTFABRIC_LEAF_ACL_MODE must be atomic or non-atomic, not {self.leaf_acl_mode!r}")
        return Budget(nic_flows=self.nic_flow_budget, leaf_acl_entries=self.leaf_acl_budget,
                      acl_mode=self.leaf_acl_mode)

    def engines(self) -> EngineSettings:
        """What policy.engines.make_engine needs to choose and reach an engine."""
        from policy.engines import EngineSettings

        return EngineSettings(
            kind=self.policy_engine, authz_kind=self.authz_engine, opa_url=self.opa_url, opa_token=self.opa_token,
            opa_ca_bundle=self.opa_ca_file, opa_timeout=self.opa_timeout_seconds, vm=self.rego_vm,
        )

    @property
    def quotas(self) -> Quotas:
        """The per-tenant quotas the services enforce."""
        return Quotas(groups=self.quota_groups, workloads=self.quota_workloads, grants=self.quota_grants,
                      pending=self.quota_pending)

    @property
    def db_url(self) -> str:
        from store.db import sqlite_url

        return self.database_url or sqlite_url(self.home)

    @property
    def keys_dir(self) -> Path:
        return self.home / "keys"

    @property
    def default_key_file(self) -> Path:
        return self.key_file or self.home / "master.key"


def _range(text: str, name: str, bounds: tuple[int, int]) -> tuple[int, int]:
    """FIRST-LAST within `bounds` (the ids a fabric file takes, enforcer/fabric_file.py: VLANs 2-4094, 24-bit VNIs)."""
    lo, sep, hi = text.partition("-")
    try:
        out = (int(lo), int(hi if sep else lo))
    except ValueError:
        raise InvalidInput(f"{name} must be FIRST-LAST, e.g. 100-4094, not {text!r}") from None
    if out[0] > out[1]:
        raise InvalidInput(f"{name}: {text!r} is an empty range")
    if out[0] < bounds[0] or out[1] > bounds[1]:
        raise InvalidInput(f"{name}: {text!r} must lie within {bounds[0]}-{bounds[1]}")
    return out


def _pool(e: Mapping[str, str], pool_name: str, length_name: str, default: str | None, default_length: str,
          version: int) -> tuple[str | None, int]:
    """A prefix pool and the length of the prefixes carved from it: a network of that IP version (no host bits),
    the length no shorter than the pool's. Checked here, naming the variable: the allocator met them first, when
    a tenant was created without a prefix (an HTTP 500)."""
    import ipaddress

    text = (e.get(pool_name) or default or "").strip()
    length = _int(e, length_name, default_length)
    if not text:
        return None, length
    try:
        net: ipaddress.IPv4Network | ipaddress.IPv6Network | None = ipaddress.ip_network(text)
    except ValueError:
        net = None
    if net is None or net.version != version:
        example = "10.0.0.0/8" if version == 4 else "fd00::/32"
        raise InvalidInput(f"{pool_name}={text!r} is not an IPv{version} network (e.g. {example}; no host bits)")
    if not net.prefixlen <= length <= net.max_prefixlen:
        raise InvalidInput(f"{length_name}={length}: from {net.prefixlen} to {net.max_prefixlen} (the length of the "
                           f"prefixes carved from {pool_name} {text})")
    return text, length


def _one_of(e: Mapping[str, str], name: str, default: str, allowed: tuple[str, ...]) -> str:
    value = (e.get(name) or default).lower()
    if value not in allowed:
        raise InvalidInput(f"{name}={value!r}: use one of {', '.join(allowed)}")
    return value


def _number(e: Mapping[str, str], name: str, default: str, kind: Callable[[str], N], what: str) -> N:
    """Every number read is a count, size, duration or rate (0 at most means off or unlimited): a negative or
    non-finite one is refused, naming the variable."""
    import math

    value = e.get(name) or default
    try:
        number = kind(value)
    except ValueError:
        raise InvalidInput(f"{name}={value!r} is not {what}") from None
    if not math.isfinite(number) or number < 0:
        raise InvalidInput(f"{name}={value!r}: must be a finite number, 0 or more")
    return number


def _int(e: Mapping[str, str], name: str, default: str) -> int:
    return _number(e, name, default, int, "a whole number")


def _float(e: Mapping[str, str], name: str, default: str) -> float:
    return _number(e, name, default, float, "a number")


def _port(e: Mapping[str, str], name: str) -> int | None:
    value = e.get(name)
    if not value:
        return None
    if not is_digits(value) or not 1 <= int(value) <= 65535:
        raise InvalidInput(f"{name}={value!r} is not a port number (1-65535)")
    return int(value)


def _traces_endpoint(e: Mapping[str, str]) -> str | None:
    """OTLP/HTTP traces URL from the standard variables: the traces one as given, the generic one + /v1/traces."""
    traces = e.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
    if traces:
        return traces
    base = e.get("OTEL_EXPORTER_OTLP_ENDPOINT")
    return base.rstrip("/") + "/v1/traces" if base else None


@dataclass(frozen=True)
class ClientSettings:
    """What the CLI's HTTP client takes from the environment; the config file fills what is missing."""

    server: str | None = None
    token: str | None = None
    ca_file: str | None = None
    config: str | None = None  # path of the config file (default $XDG_CONFIG_HOME/trustfabric/config.yaml)
    profile: str | None = None  # the profile to use (else the config file's `current`)
    xdg_config_home: str | None = None  # where config files live (default ~/.config)
    home: str | None = None  # TRUSTFABRIC_HOME when set: local commands use it before the profile's `home`

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> ClientSettings:
        e = os.environ if env is None else env
        return cls(
            server=e.get("TRUSTFABRIC_SERVER") or None,
            token=e.get("TRUSTFABRIC_TOKEN") or None,
            ca_file=e.get("TRUSTFABRIC_CA_FILE") or None,
            config=e.get("TRUSTFABRIC_CONFIG") or None,
            profile=e.get("TRUSTFABRIC_PROFILE") or None,
            xdg_config_home=e.get("XDG_CONFIG_HOME") or None,
            home=e.get("TRUSTFABRIC_HOME") or None,
        )
