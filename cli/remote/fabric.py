"""`trustfabric fabric import|show|node|leaf|spine|link ...` and `workload place|unplace`, through the API."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

from cli.output import JsonOpt, emit_json, emit_table, fail
from cli.remote.common import CaOpt, ServerOpt, client

SECTIONS = {"node": "nodes", "leaf": "leaves", "spine": "spines"}


def _summary(out: dict[str, Any], json_out: bool) -> None:
    """What a fabric change did, one line per kind of object."""
    if json_out:
        emit_json(out)
        return
    if out["unchanged"]:
        print("unchanged: the stored fabric already is like that")
    for kind, change in sorted(out["changes"].items()):
        parts = [f"{word} {change[word]['count']}" for word in ("added", "removed", "changed") if word in change]
        print(f"{kind}: {', '.join(parts)}")
    for key in ("tenants_created", "tenants_allocated", "groups_created", "workloads_registered"):
        if out[key]:
            print(f"{key.replace('_', ' ')}: {', '.join(out[key])}")
    if out["grants_not_imported"]:
        print(f"not imported: {len(out['grants_not_imported'])} grant(s) ({', '.join(out['grants_not_imported'])}); "
              "grants are requested and approved: `trustfabric grant request ...`")


def register(app: typer.Typer) -> None:
    fabric = typer.Typer(help="The fabric inventory: nodes, leaves, spines, cables (remote).", no_args_is_help=True)
    app.add_typer(fabric, name="fabric")

    @fabric.command("import")
    def import_cmd(file: Path, server: str = ServerOpt, cacert: str = CaOpt, json_out: bool = JsonOpt) -> None:
        """Merge FILE (the fabric YAML) onto the stored fabric: all or nothing; grants are never imported."""
        try:
            text = file.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            fail(f"cannot read {file}: {exc}")
        out = client(server, cacert).post("/v1/fabric/import", {"yaml": text, "source": file.name})
        _summary(out, json_out)

    @fabric.command("show")
    def show_cmd(server: str = ServerOpt, cacert: str = CaOpt, json_out: bool = JsonOpt) -> None:
        """The whole stored fabric as a fabric document (YAML, or --json)."""
        doc = client(server, cacert).get("/v1/fabric")
        if json_out:
            emit_json(doc)
            return
        import yaml

        print(yaml.safe_dump(doc, sort_keys=False, default_flow_style=None), end="")

    for kind, section in SECTIONS.items():
        _device_group(fabric, kind, section)
    _link_group(fabric)


def _device_group(fabric: typer.Typer, kind: str, section: str) -> None:
    group = typer.Typer(help=f"{kind.title()}s: add, list, remove.", no_args_is_help=True)
    fabric.add_typer(group, name=kind)

    if kind == "node":
        @group.command("add")
        def add_node(name: str, uplink: list[str] = typer.Option(..., "--uplink", help="SuperNIC uplink port, "
                                                                 "repeatable"),
                     host_port: list[str] = typer.Option([], "--host-port", help="VF representor, repeatable"),
                     server: str = ServerOpt, cacert: str = CaOpt, json_out: bool = JsonOpt) -> None:
            """Add a GPU node with its SuperNIC's ports."""
            body = {"name": name, "uplinks": uplink, "host_ports": host_port}
            _summary(client(server, cacert).post("/v1/fabric/nodes", body), json_out)
    else:
        @group.command("add")
        def add_switch(name: str, port: list[str] = typer.Option(..., "--port", help="switch port, repeatable"),
                       model: str = typer.Option("sn5600", "--model"),
                       server: str = ServerOpt, cacert: str = CaOpt, json_out: bool = JsonOpt) -> None:
            """Add a switch with its ports."""
            body = {"name": name, "ports": port, "model": model}
            _summary(client(server, cacert).post(f"/v1/fabric/{section}", body), json_out)

    @group.command("list")
    def list_cmd(server: str = ServerOpt, cacert: str = CaOpt, json_out: bool = JsonOpt) -> None:
        """Every one, with its ports."""
        items = client(server, cacert).get("/v1/fabric")[section]
        if json_out:
            emit_json(items)
        elif kind == "node":
            emit_table("nodes", ("name", "uplinks", "host ports"),
                       [(n, ", ".join(b["nic"]["uplinks"]), ", ".join(b["nic"]["host_ports"]))
                        for n, b in items.items()])
        else:
            emit_table(section, ("name", "model", "ports"),
                       [(n, b["model"], ", ".join(b["ports"])) for n, b in items.items()])

    @group.command("remove")
    def remove_cmd(name: str, server: str = ServerOpt, cacert: str = CaOpt, json_out: bool = JsonOpt) -> None:
        """Remove it and its cables (refused while a placed workload depends on it)."""
        _summary(client(server, cacert).request("DELETE", f"/v1/fabric/{section}/{name}"), json_out)


def _link_group(fabric: typer.Typer) -> None:
    link = typer.Typer(help="Cables: add, list, remove.", no_args_is_help=True)
    fabric.add_typer(link, name="link")

    @link.command("add")
    def add(a: str, b: str, server: str = ServerOpt, cacert: str = CaOpt, json_out: bool = JsonOpt) -> None:
        """Cable A to B (`leaf1:swp1 gpu1:p0`: a leaf port to a node uplink or a spine port)."""
        _summary(client(server, cacert).post("/v1/fabric/links", {"a": a, "b": b}), json_out)

    @link.command("list")
    def list_cmd(server: str = ServerOpt, cacert: str = CaOpt, json_out: bool = JsonOpt) -> None:
        """Every cable."""
        links = client(server, cacert).get("/v1/fabric")["links"]
        if json_out:
            emit_json(links)
        else:
            emit_table("links", ("leaf port", "peer port"), [tuple(x) for x in links])

    @link.command("remove")
    def remove(a: str, b: str, server: str = ServerOpt, cacert: str = CaOpt, json_out: bool = JsonOpt) -> None:
        """Remove the cable between A and B."""
        _summary(client(server, cacert).post("/v1/fabric/links/remove", {"a": a, "b": b}), json_out)


def register_placement(workload: typer.Typer) -> None:
    """`workload place|unplace` (the `workload` group belongs to cli/remote/inventory.py)."""

    def _path(key: str) -> str:
        parts = key.split("/")
        if len(parts) != 3 or not all(parts):
            raise typer.BadParameter(f"{key!r}: name the workload TENANT/GROUP/NAME")
        return "/v1/fabric/placements/" + "/".join(parts)

    @workload.command("place")
    def place(key: str = typer.Argument(..., metavar="TENANT/GROUP/NAME"),
              node: str = typer.Option(..., "--node"), port: str = typer.Option(..., "--port", help="host port"),
              ipv4: str = typer.Option(None, "--ipv4"), ipv6: str = typer.Option(None, "--ipv6"),
              selector: list[str] = typer.Option([], "--selector", help="e.g. unix:uid:1001, repeatable"),
              server: str = ServerOpt, cacert: str = CaOpt, json_out: bool = JsonOpt) -> None:
        """Place (or move) a registered workload on a node's host port, with its addresses."""
        body = {"node": node, "port": port, "ipv4": ipv4, "ipv6": ipv6, "selectors": selector}
        _summary(client(server, cacert).request("PUT", _path(key), json_body=body), json_out)

    @workload.command("unplace")
    def unplace(key: str = typer.Argument(..., metavar="TENANT/GROUP/NAME"), server: str = ServerOpt,
                cacert: str = CaOpt, json_out: bool = JsonOpt) -> None:
        """Take a workload off its node (its flows are withdrawn from every device)."""
        _summary(client(server, cacert).request("DELETE", _path(key)), json_out)
