"""`trustfabric tenant|group|workload ...`, through the API."""

from __future__ import annotations

import typer

from cli.output import JsonOpt
from cli.remote.common import CaOpt, ServerOpt, client, show


def _port(text: str) -> dict[str, object]:
    proto, sep, number = text.partition("/")
    if not sep or proto not in ("tcp", "udp") or not number.isdigit():
        raise typer.BadParameter(f"{text!r}: ports are PROTO/PORT, e.g. tcp/443")
    return {"proto": proto, "port": int(number)}


def register(app: typer.Typer) -> None:
    tenant = typer.Typer(help="Tenants: create, list, quarantine.", no_args_is_help=True)
    group = typer.Typer(help="Workload groups.", no_args_is_help=True)
    workload = typer.Typer(help="Workloads: register, revoke identities.", no_args_is_help=True)
    app.add_typer(tenant, name="tenant")
    app.add_typer(group, name="group")
    app.add_typer(workload, name="workload")
    from cli.remote.fabric import register_placement

    register_placement(workload)

    @tenant.command("create")
    def tenant_create(
        slug: str, display_name: str = typer.Option(..., "--display-name"),
        l3vni: int = typer.Option(None, "--l3vni"), prefix: str = typer.Option(None, "--prefix"),
        vlan: int = typer.Option(None, "--vlan", help="attachment VLAN / conntrack zone"),
        prefix6: str = typer.Option(None, "--prefix6"),
        server: str = ServerOpt, cacert: str = CaOpt, json_out: bool = JsonOpt,
    ) -> None:
        """Create a tenant (admin); a missing L3VNI, VLAN or prefix is allocated from the configured pools."""
        body = {"slug": slug, "display_name": display_name, "l3vni": l3vni, "prefix": prefix, "vlan": vlan,
                "prefix6": prefix6}
        show(client(server, cacert).post("/v1/tenants", body), json_out)

    @tenant.command("list")
    def tenant_list(server: str = ServerOpt, cacert: str = CaOpt, json_out: bool = JsonOpt) -> None:
        """Tenants you can see."""
        items = client(server, cacert).pages("/v1/tenants")
        show(items, json_out, title="tenants", columns=("slug", "name", "l3vni", "prefix", "quarantined"),
             rows=[[t["slug"], t["display_name"], t["l3vni"], t["prefix"], t["quarantined"]] for t in items])

    @tenant.command("quarantine")
    def tenant_quarantine(slug: str, reason: str = typer.Option(..., "--reason"), group_name: str = typer.Option(
            None, "--group", help="quarantine one group only"),
            server: str = ServerOpt, cacert: str = CaOpt, json_out: bool = JsonOpt) -> None:
        """Quarantine a tenant (or one of its groups): every grant is overridden."""
        path = f"/v1/tenants/{slug}" + (f"/groups/{group_name}" if group_name else "") + "/quarantine"
        show(client(server, cacert).post(path, {"reason": reason}), json_out)

    @tenant.command("unquarantine")
    def tenant_unquarantine(slug: str, reason: str = typer.Option(..., "--reason"), group_name: str = typer.Option(
            None, "--group"), server: str = ServerOpt, cacert: str = CaOpt, json_out: bool = JsonOpt) -> None:
        """Lift a quarantine."""
        path = f"/v1/tenants/{slug}" + (f"/groups/{group_name}" if group_name else "") + "/unquarantine"
        show(client(server, cacert).post(path, {"reason": reason}), json_out)

    @group.command("create")
    def group_create(
        tenant_slug: str, name: str,
        port: list[str] = typer.Option([], "--port", help="exposed PROTO/PORT, repeatable"),
        label: list[str] = typer.Option([], "--label", help="KEY=VALUE, repeatable"),
        sensitive: bool = typer.Option(False, "--sensitive", help="grants to it need security approval"),
        server: str = ServerOpt, cacert: str = CaOpt, json_out: bool = JsonOpt,
    ) -> None:
        """Create a workload group in a tenant."""
        labels = {}
        for item in label:
            key, sep, value = item.partition("=")
            if not sep:
                raise typer.BadParameter(f"{item!r}: labels are KEY=VALUE")
            labels[key] = value
        body = {"name": name, "ports": [_port(p) for p in port], "labels": labels,
                "sensitivity": "sensitive" if sensitive else "normal"}
        show(client(server, cacert).post(f"/v1/tenants/{tenant_slug}/groups", body), json_out)

    @workload.command("register")
    def workload_register(tenant_slug: str, group_name: str, name: str, server: str = ServerOpt,
                          cacert: str = CaOpt, json_out: bool = JsonOpt) -> None:
        """Register a workload; its SPIFFE ID is derived from tenant/group/name."""
        show(client(server, cacert).post(f"/v1/tenants/{tenant_slug}/groups/{group_name}/workloads",
                                         {"name": name}), json_out)

    @workload.command("revoke")
    def workload_revoke(tenant_slug: str, group_name: str, name: str, reason: str = typer.Option(..., "--reason"),
                        server: str = ServerOpt, cacert: str = CaOpt, json_out: bool = JsonOpt) -> None:
        """Revoke every identity of a workload (its flows are withdrawn)."""
        show(client(server, cacert).post(
            f"/v1/tenants/{tenant_slug}/groups/{group_name}/workloads/{name}/revoke", {"reason": reason}), json_out)
