"""The CLI's HTTP client over HTTPS: the server's SVID verified against --ca (refused without it), a bearer
token, and mTLS with an X.509-SVID named in the profile (cert/key)."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from api.tls import ServerTls
from tests.api.conftest import Env
from tests.api.test_mtls import TlsServer, issue_svid
from tests.api.test_mtls import served as served  # the fixture
from tests.cli.conftest import run_cli


def test_https_with_the_trust_domain_ca_and_mtls(served: tuple[Env, TlsServer, ServerTls], tmp_path: Path) -> None:
    env, server, tls = served
    url = f"https://localhost:{server.port}"
    base = {"TRUSTFABRIC_CONFIG": str(tmp_path / "none.yaml"), "TRUSTFABRIC_TOKEN": env.token("admin")}
    r = run_cli(["whoami", "--json", "--server", url, "--ca", str(tls.ca_file)], base)
    assert r.returncode == 0 and json.loads(r.stdout)["role"] == "admin", r.stderr
    r = run_cli(["whoami", "--server", url], base)  # the system's roots do not know this trust domain
    assert r.returncode == 1 and "CERTIFICATE_VERIFY_FAILED" in r.stderr and r.stderr.count("\n") == 1

    cert, key, _serial = issue_svid(env, tmp_path, "w1", tenant="acme", group="web", workload="web-1")
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({"current": "svid", "profiles": {"svid": {
        "server": url, "ca_file": str(tls.ca_file), "cert": str(cert), "key": str(key)}}}))
    config.chmod(0o600)
    r = run_cli(["whoami", "--json"], {"TRUSTFABRIC_CONFIG": str(config)})
    assert r.returncode == 0, r.stderr
    who = json.loads(r.stdout)
    assert (who["role"], who["tenant"], who["auth"]) == ("workload", "acme", "mtls")
