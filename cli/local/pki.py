"""`trustfabric svid|bundle|ca|node ...`: the PKI from the command line, against the local data directory
(the same services the API calls). Private keys never pass through here: SVIDs are issued from CSRs."""

from __future__ import annotations

import json
import sys
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from cli.output import JsonOpt, emit_json, emit_table, local_operator, open_context

if TYPE_CHECKING:
    from pki import service


def _ttl(seconds: int | None) -> timedelta | None:
    return None if seconds is None else timedelta(seconds=seconds)


def _read(path: Path) -> bytes:
    if str(path) == "-":
        return sys.stdin.buffer.read()
    return path.read_bytes()


def _x509_dict(issued: service.IssuedX509) -> dict[str, Any]:
    return {"spiffe_id": issued.spiffe_id, "serial": issued.serial, "certificate": issued.cert_pem.decode(),
            "chain": [c.decode() for c in issued.chain_pem], "expires_at": issued.expires_at.isoformat()}


def register(app: typer.Typer) -> None:
    """Add the PKI command groups to the root CLI."""
    svid = typer.Typer(help="Issue and revoke SVIDs.", no_args_is_help=True)
    bundle = typer.Typer(help="The trust bundle.", no_args_is_help=True)
    ca = typer.Typer(help="CA generations: status and rotation.", no_args_is_help=True)
    node = typer.Typer(help="Nodes: join tokens.", no_args_is_help=True)
    node_token = typer.Typer(help="One-time node join tokens.", no_args_is_help=True)
    node.add_typer(node_token, name="token")
    app.add_typer(svid, name="svid")
    app.add_typer(bundle, name="bundle")
    app.add_typer(ca, name="ca")
    app.add_typer(node, name="node")

    @svid.command("issue")
    def svid_issue(
        csr: Path = typer.Option(..., "--csr", help="PKCS#10 CSR in PEM ('-' for stdin)"),
        tenant: str = typer.Option(..., "--tenant"),
        group: str = typer.Option(..., "--group"),
        workload: str = typer.Option(..., "--workload"),
        ttl: int | None = typer.Option(None, "--ttl", help="seconds (default 1 h)"),
        out: Path | None = typer.Option(None, "--out", help="write leaf + chain PEM here"),
        json_out: bool = JsonOpt,
    ) -> None:
        """Issue an X.509-SVID to a registered workload from a CSR."""
        from pki import service

        with open_context() as ctx, ctx.db.session() as session:
            issued = service.issue_x509_svid(
                session, ctx.keystore, csr_pem=_read(csr), tenant=tenant, group=group, workload=workload,
                ttl=_ttl(ttl), actor=local_operator(), scope_tenant=None, clock=ctx.clock,
                max_ttl=ctx.settings.max_svid_ttl,
            )
        if out is not None:
            out.write_bytes(issued.full_chain_pem)
        if json_out:
            emit_json(_x509_dict(issued))
        elif out is None:
            sys.stdout.write(issued.full_chain_pem.decode())
        else:
            print(f"{issued.spiffe_id} serial {issued.serial} until {issued.expires_at.isoformat()} -> {out}")

    @svid.command("jwt")
    def svid_jwt(
        tenant: str = typer.Option(..., "--tenant"),
        group: str = typer.Option(..., "--group"),
        workload: str = typer.Option(..., "--workload"),
        audience: list[str] = typer.Option(..., "--audience", help="repeat for several audiences"),
        ttl: int | None = typer.Option(None, "--ttl", help="seconds (default 5 min)"),
        json_out: bool = JsonOpt,
    ) -> None:
        """Issue a JWT-SVID to a registered workload."""
        from pki import service

        with open_context() as ctx, ctx.db.session() as session:
            issued = service.issue_jwt_svid(
                session, ctx.keystore, tenant=tenant, group=group, workload=workload, audience=list(audience),
                ttl=_ttl(ttl), actor=local_operator(), scope_tenant=None, clock=ctx.clock,
            )
        if json_out:
            emit_json({"token": issued.token, "spiffe_id": issued.spiffe_id, "audience": issued.audience,
                       "expires_at": issued.expires_at.isoformat(), "kid": issued.kid})
        else:
            print(issued.token)

    @svid.command("revoke")
    def svid_revoke(
        reason: str = typer.Option(..., "--reason"),
        serial: str | None = typer.Option(None, "--serial"),
        tenant: str | None = typer.Option(None, "--tenant"),
        group: str | None = typer.Option(None, "--group"),
        workload: str | None = typer.Option(None, "--workload"),
        json_out: bool = JsonOpt,
    ) -> None:
        """Revoke one SVID (--serial) or an identity (--tenant [--group [--workload]])."""
        from pki import service

        with open_context() as ctx, ctx.db.session() as session:
            serials = service.revoke(session, serial=serial, tenant=tenant, group=group, workload=workload,
                                     reason=reason, actor=local_operator(), scope_tenant=None, clock=ctx.clock)
        if json_out:
            emit_json({"revoked": serials})
        else:
            print(f"revoked {len(serials)} SVID(s)" + (": " + ", ".join(serials) if serials else ""))

    @bundle.command("show")
    def bundle_show(
        pem: bool = typer.Option(False, "--pem", help="the X.509 roots as PEM instead of the JWKS"),
        json_out: bool = JsonOpt,
    ) -> None:
        """Print the trust bundle (SPIFFE JWKS; --pem for the X.509 roots)."""
        from pki import service

        with open_context() as ctx, ctx.db.read_session() as session:
            if pem:
                sys.stdout.write(service.bundle_pem(session, ctx.clock).decode())
                return
            doc = service.bundle_jwks(session, ctx.clock)
        if json_out:
            emit_json(doc)
            return
        rows = [(k["use"], k.get("kid", ""), k["kty"], k.get("crv", "")) for k in doc["keys"]]
        emit_table(f"bundle (sequence {doc['spiffe_sequence']})", ["use", "kid", "kty", "crv"], rows)

    def _print_status(data: dict[str, Any], json_out: bool) -> None:
        if json_out:
            emit_json(data)
            return
        emit_table("CA generations", ["id", "state", "key", "not_before", "not_after", "signed_until"],
                   [(c["id"], c["state"], c["key_kind"], c["not_before"], c["not_after"], c["signed_until"])
                    for c in data["cas"]])
        print(f"active generation: {data['active_generation']}; next prepare: {data['next_prepare_at']}; "
              f"next activate: {data['next_activate_at']}")
        done = {k: data[k] for k in ("prepared", "activated", "retired") if data.get(k)}
        if done:
            print("this run: " + json.dumps(done))

    @ca.command("status")
    def ca_status(json_out: bool = JsonOpt) -> None:
        """CA generations and the next scheduled rotation steps."""
        from pki import service

        with open_context() as ctx, ctx.db.read_session() as session:
            data = service.status_dict(service.ca_status(session, ctx.clock))
        _print_status(data, json_out)

    @ca.command("rotate")
    def ca_rotate(
        force: bool = typer.Option(False, "--force", help="prepare (if needed) and activate the next CA now"),
        json_out: bool = JsonOpt,
    ) -> None:
        """Run the rotation schedule once (prepare at 1/2 life, activate at 1/6 before expiry, retire drained)."""
        from pki import service

        with open_context() as ctx, ctx.db.session() as session:
            status = service.rotate(session, ctx.keystore, force=force, actor=local_operator(), clock=ctx.clock)
            data = service.status_dict(status)
        _print_status(data, json_out)

    @node_token.command("create")
    def node_token_create(
        node_name: str = typer.Option(..., "--node", help="node name (DNS label)"),
        ttl: int | None = typer.Option(None, "--ttl", help="seconds (default 1 h, max 7 days)"),
        json_out: bool = JsonOpt,
    ) -> None:
        """Create a one-time join token for a node (shown once)."""
        from pki import service

        with open_context() as ctx, ctx.db.session() as session:
            token = service.create_join_token(session, node_name=node_name, ttl=_ttl(ttl), actor=local_operator(),
                                              clock=ctx.clock)
            spiffe_id = service.node_spiffe_id(session, node_name)
        if json_out:
            emit_json({"token": token, "node_name": node_name, "spiffe_id": spiffe_id})
        else:
            print("join token (shown once):")
            print(token)
