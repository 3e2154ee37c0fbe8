"""Settings: the one module that reads the environment (the API's, the PDP's and the CLI client's)."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

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
