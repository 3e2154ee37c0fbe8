"""`trustfabric svid|bundle|ca|node ...`: the PKI from the command line, against the local data directory
(the same services the API calls). Private keys never pass through here: SVIDs are issued from CSRs."""

from __future__ import annotations

import sys
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from cli.output import (
    EXIT_USAGE,
    LOCAL,
    Col,
    View,
    add_group,
    command,
    emit,
    fail,
    guard,
    local_operator,
    machine_output,
    open_context,
    read_local,
)
from cli.params import SLUG, existing_file_or_dash, new_file, ttl_at_most

if TYPE_CHECKING:
    from pki import service
    from workflows.context import AppContext


def _read(path: str) -> bytes:
    if path == "-":
        return sys.stdin.buffer.read()
    return Path(path).read_bytes()


def _read_csr(path: str) -> bytes:
    """The --csr file's bytes, once they are a PEM PKCS#10 request: anything else (a private key, a certificate,
    not PEM) is a file that cannot be used as what the option says, refused as usage (2) before any work. What the
    CSR then carries (its key type, its signature) is the issuer's to judge (a failure, 1)."""
    from cryptography import x509

    from core.errors import InvalidInput

    data = _read(path)
    try:
        x509.load_pem_x509_csr(data)
    except ValueError:
        shown = "stdin" if path == "-" else path
        hint = ""
        if b"PRIVATE KEY-----" in data:
            key = "KEY.pem" if path == "-" else path  # the key's own file: none is named `stdin`
            hint = (f": it is a private key; make the request from it with `openssl req -new -key {key} "
                    "-subj /CN=w -out req.pem`")
        elif b"-----BEGIN CERTIFICATE-----" in data:
            hint = ": it is a certificate, not a request"
        raise InvalidInput(f"--csr {shown} is not a PEM-encoded PKCS#10 request (-----BEGIN CERTIFICATE REQUEST-----)"
                           f"{hint}") from None
    return data


def _x509_dict(issued: service.IssuedX509) -> dict[str, Any]:
    """The API's X509SvidOut; its time a datetime, which emit writes as the API does (`Z`)."""
    return {"spiffe_id": issued.spiffe_id, "serial": issued.serial, "certificate": issued.cert_pem.decode(),
            "chain": [c.decode() for c in issued.chain_pem], "expires_at": issued.expires_at}


CAS = View("CA generations", (
    Col("id", "id", kind="id"), Col("state", "state"), Col("key", "key_kind"),
    Col("valid from", "not_before", kind="time"), Col("valid until", "not_after", kind="time"),
    Col("signs until", "signed_until", kind="time", drop=1),
))
TOKEN_KEYS = View("keys in the PKCS#11 token", (
    Col("key", "key_id", kind="id"), Col("marker", "marker"), Col("named by", "named_by", drop=1),
    Col("at a start", "at_start"),
))
KEYS = View("trust bundle", (Col("use", "use"), Col("kid", "kid", kind="id"), Col("kty", "kty"), Col("crv", "crv")))
Tenant = typer.Option(..., "--tenant", parser=SLUG, metavar="TENANT")
Group = typer.Option(..., "--group", parser=SLUG, metavar="GROUP")
Workload = typer.Option(..., "--workload", parser=SLUG, metavar="WORKLOAD")
SVID_TTL = ttl_at_most(timedelta(days=365))
SvidTtl = typer.Option(None, "--ttl", parser=SVID_TTL, metavar=SVID_TTL.metavar,
                       help="e.g. 30m, 1h, or seconds")
JOIN_TTL = ttl_at_most(timedelta(days=7))


def register(app: typer.Typer) -> None:
    """Add the PKI command groups to the root CLI."""
    svid = add_group(app, "svid", "SVIDs: issue (X.509), jwt, revoke.", LOCAL)
    bundle = add_group(app, "bundle", "The trust bundle.", LOCAL)
    ca = add_group(app, "ca", "CA generations: status, rotate; keys (of a PKCS#11 token).", LOCAL)
    node = add_group(app, "node", "Nodes: join tokens.", LOCAL)
    node_token = add_group(node, "token", "One-time node join tokens.", LOCAL)

    @command(svid, "issue", LOCAL)
    def svid_issue(
        csr: str = typer.Option(..., "--csr", help="PKCS#10 CSR in PEM ('-' for stdin)", **existing_file_or_dash()),
        tenant: str = Tenant, group: str = Group, workload: str = Workload,
        ttl: timedelta | None = SvidTtl,
        out: Path | None = typer.Option(None, "--out", help="write leaf + chain PEM here", **new_file()),
    ) -> None:
        """Issue an X.509-SVID to a registered workload from a CSR."""
        from pki import service

        csr_pem = guard(lambda: _read_csr(csr), EXIT_USAGE)  # before any work: unreadable or no CSR is usage
        with open_context() as ctx, ctx.db.session() as session:
            issued = service.issue_x509_svid(
                session, ctx.keystore, csr_pem=csr_pem, tenant=tenant, group=group, workload=workload,
                ttl=ttl, actor=local_operator(), scope_tenant=None, clock=ctx.clock,
                max_ttl=ctx.settings.max_svid_ttl,
            )
        if out is not None:
            out.write_bytes(issued.full_chain_pem)
        if machine_output():
            emit(_x509_dict(issued))
        elif out is None:
            sys.stdout.write(issued.full_chain_pem.decode())
        else:
            from cli.humanize import when

            print(f"{issued.spiffe_id} serial {issued.serial} until {when(issued.expires_at)} -> {out}")

    @command(svid, "jwt", LOCAL)
    def svid_jwt(
        tenant: str = Tenant, group: str = Group, workload: str = Workload,
        audience: list[str] = typer.Option(..., "--audience", help="repeat for several audiences"),
        ttl: timedelta | None = SvidTtl,
    ) -> None:
        """Issue a JWT-SVID to a registered workload."""
        from pki import service
        from pki.jwtsvid import check_audience

        guard(lambda: check_audience(audience), EXIT_USAGE)  # an --audience no service could be: usage, before any work
        with open_context() as ctx, ctx.db.session() as session:
            issued = service.issue_jwt_svid(
                session, ctx.keystore, tenant=tenant, group=group, workload=workload, audience=list(audience),
                ttl=ttl, actor=local_operator(), scope_tenant=None, clock=ctx.clock,
            )
        if machine_output():
            emit({"token": issued.token, "spiffe_id": issued.spiffe_id, "audience": issued.audience,
                  "expires_at": issued.expires_at, "kid": issued.kid})  # as the API: `Z`
        else:
            print(issued.token)

    @command(svid, "revoke", LOCAL)
    def svid_revoke(
        reason: str = typer.Option(..., "--reason"),
        serial: str | None = typer.Option(None, "--serial", help="the SVID's serial (hex)"),
        tenant: str | None = typer.Option(None, "--tenant", parser=SLUG, metavar="TENANT"),
        group: str | None = typer.Option(None, "--group", parser=SLUG, metavar="GROUP"),
        workload: str | None = typer.Option(None, "--workload", parser=SLUG, metavar="WORKLOAD"),
    ) -> None:
        """Revoke one SVID (--serial) or an identity (--tenant [--group [--workload]])."""
        from pki import service
        from pki.revocation import check_request

        # one thing named, with a reason: a wrong combination is the command line's, refused before any work
        guard(lambda: check_request(serial=serial, tenant=tenant, group=group, workload=workload, reason=reason),
              EXIT_USAGE)
        with open_context() as ctx, ctx.db.session() as session:
            serials = service.revoke(session, serial=serial, tenant=tenant, group=group, workload=workload,
                                     reason=reason, actor=local_operator(), scope_tenant=None, clock=ctx.clock)
        if machine_output():
            emit({"revoked": serials})
        else:
            print(f"revoked {len(serials)} SVID(s)" + (": " + ", ".join(serials) if serials else ""))

    @command(bundle, "show", LOCAL)
    def bundle_show(
        pem: bool = typer.Option(False, "--pem", help="the X.509 roots as PEM instead of the JWKS"),
    ) -> None:
        """Print the trust bundle (SPIFFE JWKS; --pem for the X.509 roots)."""
        from pki import service

        if pem and machine_output():  # PEM under --json would break whoever parses it
            fail("--pem prints the roots as PEM: it does not go with --json or --output json|yaml", EXIT_USAGE)
        with open_context() as ctx, ctx.db.read_session() as session:
            if pem:
                sys.stdout.write(service.bundle_pem(session, ctx.clock).decode())
                return
            doc = service.bundle_jwks(session, ctx.clock)
        if machine_output():
            emit(doc)
            return
        print(f"trust bundle, sequence {doc['spiffe_sequence']}")
        KEYS.table(doc["keys"])

    def _print_status(data: dict[str, Any]) -> None:
        if machine_output():
            emit(data)
            return
        from cli.humanize import text, when

        CAS.table(data["cas"])
        print(f"active generation: {data['active_generation']}")
        print(f"next prepare: {when(data['next_prepare_at'])}")
        print(f"next activate: {when(data['next_activate_at'])}")
        done = {k: data[k] for k in ("prepared", "activated", "retired") if data.get(k)}
        if done:
            print("this run: " + "; ".join(f"{k} {text(v)}" for k, v in done.items()))

    @command(ca, "status", LOCAL)
    def ca_status() -> None:
        """CA generations and the next scheduled rotation steps."""
        from pki import schedule

        def full(ctx: AppContext) -> dict[str, Any]:
            from pki import service

            with ctx.db.read_session() as session:
                return schedule.status_dict(service.ca_status(session, ctx.clock))
        _print_status(read_local(lambda db: schedule.status_dict(schedule.ca_status(db)), full))

    @command(ca, "rotate", LOCAL)
    def ca_rotate(
        force: bool = typer.Option(False, "--force", help="prepare (if needed) and activate the next CA now"),
    ) -> None:
        """Run the rotation schedule once (prepare at 1/2 life, activate at 1/6 before expiry, retire drained)."""
        from pki import service
        from workflows.rotation import rotate_cas

        with open_context() as ctx:
            data = service.status_dict(rotate_cas(ctx, force=force, actor=local_operator()))
        _print_status(data)

    @command(ca, "keys", LOCAL)
    def ca_keys() -> None:
        """The PKCS#11 token's keys: whose marker each carries, the CA that names it, what a start does with it."""
        from workflows.init import token_keys

        def run() -> list[dict[str, Any]]:
            with open_context() as ctx:
                return token_keys(ctx)
        emit(guard(run), TOKEN_KEYS)

    @command(node_token, "create", LOCAL)
    def node_token_create(
        node_name: str = typer.Option(..., "--node", parser=SLUG, metavar="NODE", help="node name (DNS label)"),
        ttl: timedelta | None = typer.Option(None, "--ttl", parser=JOIN_TTL, metavar=JOIN_TTL.metavar,
                                             help="e.g. 30m, 2h, or seconds (default 1h, at most 7d)"),
    ) -> None:
        """Create a one-time join token for a node; it is printed alone on the last line (shown once)."""
        from pki import service

        with open_context() as ctx, ctx.db.session() as session:
            token = service.create_join_token(session, node_name=node_name, ttl=ttl, actor=local_operator(),
                                              clock=ctx.clock)
            spiffe_id = service.node_spiffe_id(session, node_name)
            expires_at = service.join_token_expires_at(session, token)
        if machine_output():  # the API's JoinTokenOut (POST /v1/nodes/tokens)
            emit({"token": token, "node_name": node_name, "spiffe_id": spiffe_id, "expires_at": expires_at})
        else:
            from cli.humanize import when

            # as `token create` says whom its token is for and until when: a join token is spent by the first
            # agent that attests with it, as the node it names, before it expires (`agent --join-token`)
            print(f"join token for {spiffe_id}, one use, expires {when(expires_at)} (shown once):")
            print(token)
