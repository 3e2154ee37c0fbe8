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
