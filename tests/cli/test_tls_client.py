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


def test_a_connection_that_fails_says_what_to_do(served: tuple[Env, TlsServer, ServerTls], tmp_path: Path) -> None:
    """The first-run mistakes each get the next step, not only the socket's words: no --ca for the trust domain's
    certificate, http:// to a --tls server, https:// to a plain one (`[SSL: WRONG_VERSION_NUMBER]`), nothing
    listening, and no token at all (the API's 401 speaks of headers, a CLI user signs in)."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from tests.api.test_mtls import free_port

    env, server, tls = served
    base = {"TRUSTFABRIC_CONFIG": str(tmp_path / "none.yaml"), "TRUSTFABRIC_TOKEN": env.token("admin")}

    def fails(*args: str, **extra: str | None) -> str:
        r = run_cli(["whoami", *args], {**base, **extra})
        assert r.returncode == 1 and r.stderr.count("\n") == 1, r.stderr
        return r.stderr

    assert "--ca FILE or TRUSTFABRIC_CA_FILE" in fails("--server", f"https://localhost:{server.port}")
    assert "use https://" in fails("--server", f"http://localhost:{server.port}")
    assert "nothing listens there" in fails("--server", f"http://127.0.0.1:{free_port()}")
    no_token = fails("--server", f"https://localhost:{server.port}", "--ca", str(tls.ca_file), TRUSTFABRIC_TOKEN=None)
    assert "HTTP 401" in no_token and "trustfabric login --server URL" in no_token, no_token
    class Quiet(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: object) -> None:  # not into the command's stderr
            pass

    plain = ThreadingHTTPServer(("127.0.0.1", 0), Quiet)
    threading.Thread(target=plain.serve_forever, daemon=True).start()
    try:
        assert "plain HTTP, not TLS: use http://" in fails("--server", f"https://127.0.0.1:{plain.server_port}")
    finally:
        plain.shutdown()
        plain.server_close()


def test_a_refused_token_says_how_to_sign_in_again(served: tuple[Env, TlsServer, ServerTls], tmp_path: Path) -> None:
    """`token revoked (HTTP 401)` / `token expired` alone left the user to find which token, of which profile: the
    error names where the refused token came from and the command that replaces it."""
    _env, server, tls = served
    url = f"https://localhost:{server.port}"
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({"current": "ops", "profiles": {
        "ops": {"server": url, "ca_file": str(tls.ca_file), "token": "not-a-token"}}}))
    config.chmod(0o600)
    r = run_cli(["tenant", "list"], {"TRUSTFABRIC_CONFIG": str(config)})
    assert r.returncode == 1 and r.stderr.count("\n") == 1 and "HTTP 401" in r.stderr, r.stderr
    again = f"profile 'ops' was refused: sign in again with a new one, `trustfabric --profile ops login --server {url}`"
    assert again in r.stderr, r.stderr
    r = run_cli(["tenant", "list"], {"TRUSTFABRIC_CONFIG": str(config), "TRUSTFABRIC_TOKEN": "not-a-token"})
    assert r.returncode == 1 and "the token in TRUSTFABRIC_TOKEN was refused" in r.stderr, r.stderr
    r = run_cli(["login", "--server", url, "--ca", str(tls.ca_file), "--token", "not-a-token"],
                {"TRUSTFABRIC_CONFIG": str(tmp_path / "other.yaml")})
    assert r.returncode == 1 and "HTTP 401" in r.stderr and "refused:" not in r.stderr, r.stderr  # its own token
    assert "it is not an API token" in r.stderr, r.stderr  # and not PyJWT's "Not enough segments" alone
