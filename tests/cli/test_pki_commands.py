"""`trustfabric svid|bundle|ca|node` against a real data directory (after the real `init`)."""

from __future__ import annotations

import json
from datetime import UTC
from pathlib import Path

from typer.testing import CliRunner

from cli.main import app
from pki.errors import UnknownWorkload
from tests.pki.helpers import make_csr


def _json(args: list[str]) -> dict[str, object]:
    r = CliRunner().invoke(app, [*args, "--json"])
    assert r.exit_code == 0, (r.output, r.exception)
    data: dict[str, object] = json.loads(r.stdout)
    return data


def test_cli_round_trip(home: Path) -> None:
    csr = home / "req.pem"
    csr.write_bytes(make_csr())
    issued = _json(["svid", "issue", "--csr", str(csr), "--tenant", "acme", "--group", "web", "--workload", "web-1"])
    assert issued["spiffe_id"] == "spiffe://example.org/tenant/acme/group/web/web-1"
    tok = _json(["svid", "jwt", "--tenant", "acme", "--group", "web", "--workload", "web-1", "--audience", "a"])
    assert str(tok["token"]).count(".") == 2
    bundle = _json(["bundle", "show"])
    assert bundle["spiffe_sequence"] == 1
    assert _json(["ca", "status"])["active_generation"] == 1
    assert _json(["ca", "rotate", "--force"])["activated"] == 2
    node = _json(["node", "token", "create", "--node", "gpu-01"])
    assert str(node["token"]).startswith("tfjt_") and node["spiffe_id"] == "spiffe://example.org/node/gpu-01"
    revoked = _json(["svid", "revoke", "--serial", str(issued["serial"]), "--reason", "test"])
    assert revoked == {"revoked": [issued["serial"]]}
    pem = CliRunner().invoke(app, ["bundle", "show", "--pem"])
    assert pem.exit_code == 0 and pem.stdout.count("BEGIN CERTIFICATE") == 2  # g1 still drains, g2 active


def test_cli_refuses_unregistered_workload(home: Path) -> None:
    csr = home / "req.pem"
    csr.write_bytes(make_csr())
    r = CliRunner().invoke(app, ["svid", "issue", "--csr", str(csr), "--tenant", "acme", "--group", "web",
                                 "--workload", "ghost", "--json"])
    assert r.exit_code != 0 and isinstance(r.exception, UnknownWorkload)


def test_ttl_takes_the_durations_every_other_ttl_takes(home: Path) -> None:
    """`--ttl` reads `15m`, `24h`, `7d` on every command (token create, grant request); svid issue, svid jwt and
    node token create took only seconds and refused `1h` as "not a valid integer". Plain seconds still work."""
    from datetime import datetime, timedelta

    wl = ["--tenant", "acme", "--group", "web", "--workload", "web-1"]

    def lasts(data: dict[str, object]) -> timedelta:
        return datetime.fromisoformat(str(data["expires_at"])) - datetime.now(tz=UTC)

    x509 = _json(["svid", "issue", "--csr", str(home / "req.pem"), *wl, "--ttl", "30m"])
    assert timedelta(minutes=28) < lasts(x509) <= timedelta(minutes=30)
    assert timedelta(seconds=500) < lasts(_json(["svid", "issue", "--csr", str(home / "req.pem"), *wl,
                                                 "--ttl", "600"])) <= timedelta(seconds=600)
    jwt = _json(["svid", "jwt", *wl, "--audience", "a", "--ttl", "5m"])
    assert timedelta(minutes=4) < lasts(jwt) <= timedelta(minutes=5)
    assert _json(["node", "token", "create", "--node", "gpu-01", "--ttl", "2h"])["token"]
    for args in (["node", "token", "create", "--node", "gpu-01", "--ttl", "8d"],  # over its 7 days
                 ["svid", "jwt", *wl, "--audience", "a", "--ttl", "0"], ["svid", "jwt", *wl, "--audience", "a",
                                                                        "--ttl", "soon"]):
        r = CliRunner().invoke(app, args)
        assert r.exit_code == 2 and "--ttl" in r.output, (args, r.output)


def test_bundle_show_pem_with_json_is_usage(home: Path) -> None:
    """--json promises JSON: with --pem, PEM was printed under it (exit 0). Options that do not go together."""
    for fmt in (["--json"], ["-o", "yaml"]):
        r = CliRunner().invoke(app, ["bundle", "show", "--pem", *fmt])
        assert r.exit_code == 2 and "--pem" in r.output and "BEGIN CERTIFICATE" not in r.output, (fmt, r.output)
    assert CliRunner().invoke(app, ["bundle", "show", "--pem", "-o", "wide"]).exit_code == 0  # for people: fine


def test_node_token_create_says_for_whom_and_until_when(home: Path) -> None:
    """`token create` names its token's subject and expiry; `node token create` printed only the secret, and its
    --json lacked the expiry POST /v1/nodes/tokens returns. The secret stays alone on the last line."""
    from datetime import datetime, timedelta

    data = _json(["node", "token", "create", "--node", "gpu-01", "--ttl", "2h"])
    assert str(data["spiffe_id"]).endswith("/node/gpu-01") and str(data["token"]).startswith("tfjt_"), data
    left = datetime.fromisoformat(str(data["expires_at"]).replace("Z", "+00:00")) - datetime.now(tz=UTC)
    assert timedelta(minutes=118) < left <= timedelta(hours=2), data
    r = CliRunner().invoke(app, ["node", "token", "create", "--node", "gpu-01"])
    assert r.exit_code == 0, r.output
    first, last = r.output.strip().splitlines()
    assert "spiffe://example.org/node/gpu-01" in first and "expires" in first and "shown once" in first, first
    assert last.startswith("tfjt_") and " " not in last, r.output


def test_svid_issue_reads_the_csr_from_stdin_as_its_help_says(home: Path) -> None:
    """`--csr -` is documented as standard input; typer 0.29 refused it ("file '-' does not exist"). A missing file
    or a folder is still refused while parsing (2), naming --csr."""
    wl = ["--tenant", "acme", "--group", "web", "--workload", "web-1"]
    r = CliRunner().invoke(app, ["svid", "issue", "--csr", "-", *wl, "--json"],
                           input=(home / "req.pem").read_bytes())
    assert r.exit_code == 0, r.output
    assert json.loads(r.output)["spiffe_id"].endswith("/tenant/acme/group/web/web-1")
    from tests.cli.conftest import run_cli

    env: dict[str, str | None] = {"TRUSTFABRIC_HOME": str(home / "home"), "COLUMNS": "200",
                                  "TRUSTFABRIC_CONFIG": str(home / "none.json")}
    for bad, says in ((home / "missing.pem", "does not exist"), (home, "is a directory")):
        refused = run_cli(["svid", "issue", "--csr", str(bad), *wl], env)
        assert refused.returncode == 2 and refused.stderr.count("\n") == 1, refused.stderr
        assert "'--csr'" in refused.stderr and says in refused.stderr, refused.stderr
