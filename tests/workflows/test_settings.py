"""Settings: the one module that reads the environment (the API's, the PDP's and the CLI client's)."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest

from core.errors import InvalidInput
from core.vocabulary import DEFAULT_TRUST_DOMAIN
from policy.engines import EngineSettings
from workflows.settings import ClientSettings, Settings


def test_defaults_and_overrides() -> None:
    assert Settings.from_env({}) == Settings()
    assert Settings().trust_domain == DEFAULT_TRUST_DOMAIN and Settings().db_url.endswith(".trustfabric/trustfabric.db")
    s = Settings.from_env({
        "TRUSTFABRIC_HOME": "/srv/tf", "TRUSTFABRIC_MAX_TOKEN_TTL_SECONDS": "60", "TRUSTFABRIC_READ_CACHE": "off",
        "TRUSTFABRIC_CACHE_OFF": "authz, grant_pages", "TRUSTFABRIC_POLICY_ENGINE": "opa",
        "TRUSTFABRIC_OPA_URL": "https://opa:8181", "TRUSTFABRIC_OPA_TOKEN": "t", "TRUSTFABRIC_PDP_TOKEN": "p",
        "TRUSTFABRIC_POLICY_VERIFY_KEYS": "a.pem, b.pem",
    })
    assert s.home == Path("/srv/tf") and s.max_token_ttl == timedelta(seconds=60) and s.read_cache is False
    assert s.cache_off == frozenset({"authz", "grant_pages"}) and s.pdp_token == "p"
    assert s.policy_verify_keys == (Path("a.pem"), Path("b.pem"))
    assert s.engines() == EngineSettings(kind="opa", authz_kind="embedded", opa_url="https://opa:8181",
                                         opa_token="t", opa_ca_bundle=None, opa_timeout=2.0)


def test_the_cli_client_settings() -> None:
    assert ClientSettings.from_env({}) == ClientSettings()
    c = ClientSettings.from_env({"TRUSTFABRIC_SERVER": "https://tf", "TRUSTFABRIC_TOKEN": "x",
                                 "TRUSTFABRIC_CA_FILE": "ca.pem", "TRUSTFABRIC_CONFIG": "/etc/tf.json"})
    assert (c.server, c.token, c.ca_file, c.config) == ("https://tf", "x", "ca.pem", "/etc/tf.json")


def test_fabric_pools_enforcer_mode_and_budget_from_the_environment() -> None:
    import pytest

    from core.errors import InvalidInput
    from enforcer.allocate import Pools
    from enforcer.compiler import Budget

    assert Settings().pools() == Pools() and Settings().budget() == Budget()
    s = Settings.from_env({
        "TRUSTFABRIC_VNI_POOL": "20000-20099", "TRUSTFABRIC_VLAN_POOL": "200-299",
        "TRUSTFABRIC_PREFIX_POOL": "100.64.0.0/10", "TRUSTFABRIC_PREFIX_LENGTH": "24",
        "TRUSTFABRIC_PREFIX6_POOL": "fd00::/32", "TRUSTFABRIC_ENFORCER_MODE": "manual",
        "TRUSTFABRIC_NIC_FLOW_BUDGET": "1000", "TRUSTFABRIC_LEAF_ACL_MODE": "non-atomic",
    })
    assert s.pools() == Pools(vni=(20000, 20099), vlan=(200, 299), ipv4="100.64.0.0/10", ipv4_len=24,
                              ipv6="fd00::/32", ipv6_len=48)
    assert s.enforcer_mode == "manual" and s.budget() == Budget(nic_flows=1000, acl_mode="non-atomic")
    with pytest.raises(InvalidInput, match="TRUSTFABRIC_VLAN_POOL must be FIRST-LAST"):
        Settings.from_env({"TRUSTFABRIC_VLAN_POOL": "lots"})
    with pytest.raises(InvalidInput, match="empty range"):
        Settings.from_env({"TRUSTFABRIC_VNI_POOL": "9-1"})
    with pytest.raises(InvalidInput, match="atomic or non-atomic"):
        Settings.from_env({"TRUSTFABRIC_LEAF_ACL_MODE": "halved"}).budget()
    from enforcer.reconcile import EnforcerConfig

    with pytest.raises(InvalidInput, match="auto or manual"):
        EnforcerConfig(mode="sometimes")


def test_the_hardening_settings() -> None:
    """Issue 13: production mode by default (activation needs a signature), the limits and budgets."""
    assert Settings().mode == "production" and Settings().require_policy_signature
    s = Settings.from_env({
        "TRUSTFABRIC_MODE": "development", "TRUSTFABRIC_POLICY_TWO_PERSON": "yes",
        "TRUSTFABRIC_QUOTA_GROUPS": "7", "TRUSTFABRIC_QUOTA_PENDING": "0", "TRUSTFABRIC_IP_RATE_LIMIT_PER_SECOND": "5",
        "TRUSTFABRIC_POLICY_JOB_CPU_SECONDS": "2", "TRUSTFABRIC_POLICY_DECISION_BUDGET_MS": "25",
        "TRUSTFABRIC_MAX_GRANT_TTL_SECONDS": "3600", "TRUSTFABRIC_BOOTSTRAP_TOKEN_TTL_SECONDS": "600",
        "TRUSTFABRIC_REQUEST_READ_TIMEOUT_SECONDS": "3", "TRUSTFABRIC_MAX_CONNECTIONS": "50",
        "TRUSTFABRIC_MASTER_KEY": "pkcs11", "TRUSTFABRIC_PASSPHRASE_FILE": "/run/credentials/tf",
    })
    assert s.development and not s.require_policy_signature and s.policy_two_person
    assert (s.quotas.groups, s.quotas.pending, s.quotas.workloads) == (7, 0, 10_000)
    assert (s.ip_rate_limit_per_second, s.policy_job_cpu_seconds, s.policy_decision_budget_ms) == (5, 2, 25)
    assert s.max_grant_ttl == timedelta(hours=1) and s.bootstrap_token_ttl == timedelta(minutes=10)
    assert (s.request_read_timeout_seconds, s.max_connections) == (3, 50)
    assert s.master_key == "pkcs11" and s.passphrase_file == Path("/run/credentials/tf")
    with_keys = Settings.from_env({"TRUSTFABRIC_MODE": "development", "TRUSTFABRIC_POLICY_VERIFY_KEYS": "k.pem"})
    assert with_keys.require_policy_signature  # keys configured: a signature is required in every mode
    with pytest.raises(InvalidInput, match="TRUSTFABRIC_MODE must be one of production, development"):
        Settings.from_env({"TRUSTFABRIC_MODE": "prod"})


def test_the_worker_threads_setting() -> None:
    """TRUSTFABRIC_WORKER_THREADS: 16 by default, at least 1 (api/workers.py)."""
    assert Settings().worker_threads == 16
    assert Settings.from_env({"TRUSTFABRIC_WORKER_THREADS": "4"}).worker_threads == 4
    with pytest.raises(InvalidInput, match="TRUSTFABRIC_WORKER_THREADS must be at least 1, not 0"):
        Settings.from_env({"TRUSTFABRIC_WORKER_THREADS": "0"})


def test_a_bad_number_or_database_url_names_its_variable() -> None:
    """A user's typo in the environment is one line naming the variable, not int()'s or SQLAlchemy's words."""
    with pytest.raises(InvalidInput, match=r"TRUSTFABRIC_MAX_SVID_TTL_SECONDS='1h' is not a whole number"):
        Settings.from_env({"TRUSTFABRIC_MAX_SVID_TTL_SECONDS": "1h"})
    with pytest.raises(InvalidInput, match=r"TRUSTFABRIC_RATE_LIMIT_PER_SECOND='fast' is not a number"):
        Settings.from_env({"TRUSTFABRIC_RATE_LIMIT_PER_SECOND": "fast"})
    assert Settings.from_env({"TRUSTFABRIC_QUOTA_GROUPS": ""}).quota_groups == Settings().quota_groups  # unset
    # an engine typo was taken for the embedded engine by every command that makes none (policy explain, ...)
    for engine in ("TRUSTFABRIC_POLICY_ENGINE", "TRUSTFABRIC_AUTHZ_ENGINE"):
        with pytest.raises(InvalidInput, match=rf"{engine}='opx': use one of embedded, opa"):
            Settings.from_env({engine: "opx"})
    assert Settings.from_env({"TRUSTFABRIC_POLICY_ENGINE": "opa"}).policy_engine == "opa"
    from policy.engines import ENGINE_KINDS
    from workflows import settings

    # the two-person rule is a safeguard: a typo must not switch it off in silence
    with pytest.raises(InvalidInput, match=r"TRUSTFABRIC_POLICY_TWO_PERSON='ture'"):
        Settings.from_env({"TRUSTFABRIC_POLICY_TWO_PERSON": "ture"})
    for on, off in (("1", "0"), ("true", "false"), ("YES", "no"), ("on", "off")):
        assert Settings.from_env({"TRUSTFABRIC_POLICY_TWO_PERSON": on}).policy_two_person is True
        assert Settings.from_env({"TRUSTFABRIC_POLICY_TWO_PERSON": off}).policy_two_person is False
    assert Settings.from_env({"TRUSTFABRIC_POLICY_TWO_PERSON": ""}).policy_two_person is False  # unset

    assert settings.ENGINE_KINDS == ENGINE_KINDS  # the light copy the environment is checked against
    with pytest.raises(InvalidInput, match=r"must be a postgresql:// or sqlite:/// URL, not mysql:\.\.\.$") as refused:
        Settings.from_env({"TRUSTFABRIC_DATABASE_URL": "mysql://tf:s3cret@db/tf"})
    assert "s3cret" not in str(refused.value)
    for url in ("postgresql://tf@db/tf", "postgres://db/tf", "postgresql+psycopg://db/tf", "sqlite:///x.db"):
        assert Settings.from_env({"TRUSTFABRIC_DATABASE_URL": url}).db_url == url


def test_the_prefix_pools_are_checked_when_read() -> None:
    """A pool that is no network (or a length that cannot be carved from it) answered every tenant created
    without a prefix with HTTP 500 (ValueError deep in the allocator); it is the environment's, named on load."""
    refused = [
        ({"TRUSTFABRIC_PREFIX_POOL": "garbage"}, r"TRUSTFABRIC_PREFIX_POOL='garbage' is not an IPv4 network"),
        ({"TRUSTFABRIC_PREFIX_POOL": "fd00::/8"}, r"TRUSTFABRIC_PREFIX_POOL='fd00::/8' is not an IPv4 network"),
        ({"TRUSTFABRIC_PREFIX_POOL": "10.0.0.1/8"}, r"TRUSTFABRIC_PREFIX_POOL='10.0.0.1/8' is not an IPv4 network"),
        ({"TRUSTFABRIC_PREFIX6_POOL": "10.0.0.0/8"}, r"TRUSTFABRIC_PREFIX6_POOL='10.0.0.0/8' is not an IPv6 network"),
        ({"TRUSTFABRIC_PREFIX_LENGTH": "4"}, r"TRUSTFABRIC_PREFIX_LENGTH=4: from 8 to 32"),
        ({"TRUSTFABRIC_PREFIX_LENGTH": "33"}, r"TRUSTFABRIC_PREFIX_LENGTH=33: from 8 to 32"),
        ({"TRUSTFABRIC_PREFIX6_POOL": "fd00::/32", "TRUSTFABRIC_PREFIX6_LENGTH": "16"},
         r"TRUSTFABRIC_PREFIX6_LENGTH=16: from 32 to 128"),
    ]
    for env, says in refused:
        with pytest.raises(InvalidInput, match=says):
            Settings.from_env(env)
    ok = Settings.from_env({"TRUSTFABRIC_PREFIX_POOL": "172.16.0.0/12", "TRUSTFABRIC_PREFIX_LENGTH": "24",
                            "TRUSTFABRIC_PREFIX6_POOL": "fd00::/32"})
    assert (ok.prefix_pool, ok.prefix_length, ok.prefix6_pool, ok.prefix6_length) == (
        "172.16.0.0/12", 24, "fd00::/32", 48)


def test_the_vni_and_vlan_pools_hold_only_valid_ids() -> None:
    """A pool reaching past the VLANs and VNIs a fabric file takes (2-4094, 24-bit) handed a tenant an id the
    fabric then refused (VLAN 1 is the default VLAN)."""
    for env, says in (({"TRUSTFABRIC_VLAN_POOL": "5000-6000"}, r"TRUSTFABRIC_VLAN_POOL: .* within 2-4094"),
                      ({"TRUSTFABRIC_VLAN_POOL": "1-100"}, r"TRUSTFABRIC_VLAN_POOL: .* within 2-4094"),
                      ({"TRUSTFABRIC_VNI_POOL": "1-16777216"}, r"TRUSTFABRIC_VNI_POOL: .* within 1-16777215")):
        with pytest.raises(InvalidInput, match=says):
            Settings.from_env(env)
    assert Settings.from_env({"TRUSTFABRIC_VLAN_POOL": "2-4094"}).vlan_pool == (2, 4094)


def test_no_number_in_the_environment_is_negative_or_infinite() -> None:
    """Every number read is a count, a size, a duration or a rate, where 0 means off or unlimited at most: a negative
    or infinite one (a sweep every -1 s, a quota of -1, a NaN budget) is a typo, refused with its variable."""
    for name, value in (("TRUSTFABRIC_QUOTA_GRANTS", "-1"), ("TRUSTFABRIC_SWEEP_INTERVAL_SECONDS", "-5"),
                        ("TRUSTFABRIC_POLICY_DECISION_BUDGET_MS", "nan"), ("TRUSTFABRIC_OPA_TIMEOUT_SECONDS", "inf"),
                        ("TRUSTFABRIC_NIC_FLOW_BUDGET", "-65536")):
        with pytest.raises(InvalidInput, match=rf"{name}={value!r}: must be a finite number, 0 or more"):
            Settings.from_env({name: value})
    assert Settings.from_env({"TRUSTFABRIC_RATE_LIMIT_PER_SECOND": "0"}).rate_limit_per_second == 0  # off
