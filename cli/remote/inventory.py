"""`trustfabric tenant|group|workload ...`, through the API."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

from cli.output import API, Col, View, add_group, command, emit
from cli.params import CIDR, CIDR6, LABEL, PROTO_PORT, SLUG, TENANT_OR_WORKLOAD
from cli.remote.common import CaOpt, ServerOpt, client

TENANTS = View("tenants", (
    Col("slug", "slug", kind="id"), Col("name", "display_name"), Col("l3vni", "l3vni"), Col("prefix", "prefix"),
    Col("vlan", "vlan", drop=2), Col("prefix6", "prefix6", drop=3), Col("quarantined", "quarantined"),
    Col("created", "created_at", kind="time", drop=1),
))
GROUPS = View("groups", (
    Col("tenant", "tenant", kind="id"), Col("group", "name", kind="id"), Col("ports", "ports"),
    Col("labels", "labels", drop=1), Col("sensitivity", "sensitivity"), Col("quarantined", "quarantined"),
))
WORKLOADS = View("workloads", (
    Col("group", "group", kind="id"), Col("name", "name", kind="id"), Col("SPIFFE ID", "spiffe_id", kind="id"),
    Col("revoked", "revoked"), Col("created", "created_at", kind="time", drop=1),
))

Tenant = typer.Argument(..., parser=SLUG, metavar="TENANT", help="tenant slug")
Group = typer.Argument(..., parser=SLUG, metavar="GROUP", help="group name")
Name = typer.Argument(..., parser=SLUG, metavar="NAME", help="workload name")
# a workload as three words (acme train w1) or as `workload place|unplace` and the grant options name it, one path
WorkloadFirst = typer.Argument(..., parser=TENANT_OR_WORKLOAD, metavar=TENANT_OR_WORKLOAD.metavar,
                               help="tenant slug, or the whole workload: acme/train/w1")
WorkloadGroup = typer.Argument(None, parser=SLUG, metavar="GROUP", help="group name (after a tenant slug)")
WorkloadName = typer.Argument(None, parser=SLUG, metavar="NAME", help="workload name (after a tenant slug)")


def workload_path(first: str, group: str | None, name: str | None) -> str:
    """`tenant/group/name` from TENANT GROUP NAME or from TENANT/GROUP/NAME; either form whole, else a usage error."""
    if "/" in first:
        if group is not None or name is not None:
            raise typer.BadParameter(f"{first!r} names the whole workload already: a workload is TENANT GROUP NAME "
                                     f"or TENANT/GROUP/NAME, not both (e.g. {first})")
        return first
    if group is None or name is None:
        raise typer.BadParameter(f"a workload is TENANT GROUP NAME or TENANT/GROUP/NAME (e.g. {first} train w1, or "
                                 f"{first}/train/w1)")
    return f"{first}/{group}/{name}"


def register(app: typer.Typer) -> None:
    tenant = add_group(app, "tenant", "Tenants: create, list, show, quarantine, unquarantine.", API)
    group = add_group(app, "group", "Workload groups: create, list, show.", API)
    workload = add_group(app, "workload",
                         "Workloads: register, list, show, revoke identities; place on a node, unplace.", API)
    from cli.remote.fabric import register_placement

    register_placement(workload)

    @command(tenant, "create", API)
    def tenant_create(
        slug: str = typer.Argument(..., parser=SLUG, metavar="SLUG", help="DNS label, e.g. acme"),
        display_name: str = typer.Option(..., "--display-name"),
        l3vni: int = typer.Option(None, "--l3vni", min=1, max=16_777_215, help="24-bit VXLAN L3VNI"),
        prefix: str = typer.Option(None, "--prefix", parser=CIDR, metavar=CIDR.metavar,
                                   help="the tenant's IPv4 CIDR, e.g. 10.1.0.0/16"),
        vlan: int = typer.Option(None, "--vlan", min=2, max=4094, help="attachment VLAN / conntrack zone"),
        prefix6: str = typer.Option(None, "--prefix6", parser=CIDR6, metavar=CIDR6.metavar,
                                    help="the tenant's IPv6 CIDR, e.g. fd00:1::/48"),
        server: str = ServerOpt, cacert: Path = CaOpt,
    ) -> None:
        """Create a tenant (admin); a missing L3VNI, VLAN or prefix is allocated from the configured pools."""
        body = {"slug": slug, "display_name": display_name, "l3vni": l3vni, "prefix": prefix, "vlan": vlan,
                "prefix6": prefix6}
        emit(client(server, cacert).post("/v1/tenants", body), TENANTS)

    @command(tenant, "list", API)
    def tenant_list(
        quarantined: bool = typer.Option(None, "--quarantined/--not-quarantined", help="only (un)quarantined ones"),
        server: str = ServerOpt, cacert: Path = CaOpt,
    ) -> None:
        """Tenants you can see (a tenant principal: its own)."""
        emit(client(server, cacert).pages("/v1/tenants", quarantined=quarantined), TENANTS)

    @command(tenant, "show", API)
    def tenant_show(slug: str = Tenant, server: str = ServerOpt, cacert: Path = CaOpt) -> None:
        """One tenant."""
        emit(client(server, cacert).get(f"/v1/tenants/{slug}"), TENANTS)

    def _quarantine(verb: str, slug: str, group_name: str | None, reason: str, server: str | None,
                    cacert: Any) -> None:
        path = f"/v1/tenants/{slug}" + (f"/groups/{group_name}" if group_name else "") + f"/{verb}"
        emit(client(server, cacert).post(path, {"reason": reason}), TENANTS)

    @command(tenant, "quarantine", API)
    def tenant_quarantine(
        slug: str = Tenant, reason: str = typer.Option(..., "--reason"),
        group_name: str = typer.Option(None, "--group", parser=SLUG, metavar="GROUP",
                                       help="quarantine one group only"),
        server: str = ServerOpt, cacert: Path = CaOpt,
    ) -> None:
        """Quarantine a tenant (or one of its groups): every grant is overridden (security, admin)."""
        _quarantine("quarantine", slug, group_name, reason, server, cacert)

    @command(tenant, "unquarantine", API)
    def tenant_unquarantine(
        slug: str = Tenant, reason: str = typer.Option(..., "--reason"),
        group_name: str = typer.Option(None, "--group", parser=SLUG, metavar="GROUP"),
        server: str = ServerOpt, cacert: Path = CaOpt,
    ) -> None:
        """Lift a quarantine."""
        _quarantine("unquarantine", slug, group_name, reason, server, cacert)

    @command(group, "create", API)
    def group_create(
        tenant_slug: str = Tenant, name: str = Group,
        port: list[Any] = typer.Option([], "--port", parser=PROTO_PORT, metavar=PROTO_PORT.metavar,
                                       help="exposed PROTO/PORT, repeatable"),
        label: list[Any] = typer.Option([], "--label", parser=LABEL, metavar=LABEL.metavar, help="repeatable"),
        sensitive: bool = typer.Option(False, "--sensitive", help="grants to it need security approval"),
        server: str = ServerOpt, cacert: Path = CaOpt,
    ) -> None:
        """Create a workload group in a tenant."""
        body = {"name": name, "ports": list(port), "labels": dict(label),
                "sensitivity": "sensitive" if sensitive else "normal"}
        emit(client(server, cacert).post(f"/v1/tenants/{tenant_slug}/groups", body), GROUPS)

    @command(group, "list", API)
    def group_list(tenant_slug: str = Tenant, server: str = ServerOpt, cacert: Path = CaOpt) -> None:
        """A tenant's workload groups."""
        emit(client(server, cacert).pages(f"/v1/tenants/{tenant_slug}/groups"), GROUPS)

    @command(group, "show", API)
    def group_show(tenant_slug: str = Tenant, name: str = Group, server: str = ServerOpt,
                   cacert: Path = CaOpt) -> None:
        """One workload group."""
        emit(client(server, cacert).get(f"/v1/tenants/{tenant_slug}/groups/{name}"), GROUPS)

    @command(workload, "register", API)
    def workload_register(first: str = WorkloadFirst, group_name: str | None = WorkloadGroup,
                          name: str | None = WorkloadName, server: str = ServerOpt, cacert: Path = CaOpt) -> None:
        """Register a workload; its SPIFFE ID is derived from tenant/group/name."""
        tenant_slug, group_name, name = workload_path(first, group_name, name).split("/")
        emit(client(server, cacert).post(f"/v1/tenants/{tenant_slug}/groups/{group_name}/workloads",
                                         {"name": name}), WORKLOADS)

    @command(workload, "list", API)
    def workload_list(
        tenant_slug: str = Tenant,
        group_name: str = typer.Option(None, "--group", parser=SLUG, metavar="GROUP", help="only this group's"),
        revoked: bool = typer.Option(None, "--revoked/--active", help="only revoked / active ones"),
        server: str = ServerOpt, cacert: Path = CaOpt,
    ) -> None:
        """A tenant's registered workloads."""
        emit(client(server, cacert).pages(f"/v1/tenants/{tenant_slug}/workloads", group=group_name,
                                          revoked=revoked), WORKLOADS)

    @command(workload, "show", API)
    def workload_show(first: str = WorkloadFirst, group_name: str | None = WorkloadGroup,
                      name: str | None = WorkloadName, server: str = ServerOpt, cacert: Path = CaOpt) -> None:
        """One registered workload and its SPIFFE ID."""
        tenant_slug, group_name, name = workload_path(first, group_name, name).split("/")
        emit(client(server, cacert).get(f"/v1/tenants/{tenant_slug}/groups/{group_name}/workloads/{name}"),
             WORKLOADS)

    @command(workload, "revoke", API)
    def workload_revoke(first: str = WorkloadFirst, group_name: str | None = WorkloadGroup,
                        name: str | None = WorkloadName, reason: str = typer.Option(..., "--reason"),
                        server: str = ServerOpt, cacert: Path = CaOpt) -> None:
        """Revoke every identity of a workload (its flows are withdrawn)."""
        tenant_slug, group_name, name = workload_path(first, group_name, name).split("/")
        emit(client(server, cacert).post(
            f"/v1/tenants/{tenant_slug}/groups/{group_name}/workloads/{name}/revoke", {"reason": reason}))
