"""`trustfabric fabric import|show|node|leaf|spine|link|placement ...`, `workload place|unplace` and
`device list|show|ruleset`, through the API.

Lists and shows are read from GET /v1/fabric (the stored fabric as a fabric document) and reshaped into one
object per node, switch, cable or placement, so `--json` lists are lists of objects like every other list
command's; `fabric show` prints the document itself (YAML for people)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

from cli.output import API, EXIT_USAGE, Col, View, add_group, command, emit, fail, machine_output
from cli.params import DEVICE, ENDPOINT, IPV4, IPV6, MODEL, PORT_NAME, SELECTOR, SLUG, WORKLOAD, existing_file
from cli.remote.common import CaOpt, ServerOpt, client

SECTIONS = {"node": "nodes", "leaf": "leaves", "spine": "spines"}

NODES = View("nodes", (
    Col("name", "name", kind="id"), Col("uplinks", lambda n: " ".join(n["uplinks"])),
    Col("cabled to", lambda n: " ".join(n["links"]), drop=2), Col("host ports", lambda n: " ".join(n["host_ports"]),
                                                                  drop=1),
    Col("placed", lambda n: len(n["placements"])),
))
SWITCHES = View("switches", (
    Col("name", "name", kind="id"), Col("model", "model"), Col("ports", lambda s: " ".join(s["ports"]), drop=1),
    Col("cabled", lambda s: len(s["links"])),
))
LINKS = View("links", (Col("leaf port", "leaf", kind="id"), Col("peer port", "peer", kind="id")))
PLACEMENTS = View("placements", (
    Col("workload", "workload", kind="id"), Col("node", "node", kind="id"), Col("port", "port"),
    Col("ipv4", "ipv4"), Col("ipv6", "ipv6", drop=1), Col("selectors", lambda p: " ".join(p["selectors"]), drop=2),
))
DEVICES = View("devices", (
    Col("device", lambda d: d["device"] + ("" if d["in_fabric"] else " (retired)"), kind="id"),
    Col("desired", "desired_version"), Col("applied", "applied_version"),
    Col("in sync", lambda d: "yes" if d["in_sync"] else "no"), Col("pinned", lambda d: "yes" if d["pinned"] else "no"),
    Col("pending", lambda d: "yes" if d["pending_hash"] else "no", drop=2),
    Col("drift", lambda d: len(d["drift"]) or "", drop=2),
    Col("applied at", "applied_at", kind="time", drop=1), Col("last error", "last_error", drop=3),
))

DEVICE_VERSIONS = View("versions", (  # enforcer versions' columns (cli/local/enforcer.py VERSIONS)
    Col("version", "version"), Col("content hash", "content_hash", kind="id", drop=2),
    Col("published", "published_at", kind="time"), Col("by", "published_by", drop=1), Col("cause", "cause"),
))

NameArg = typer.Argument(..., parser=SLUG, metavar="NAME", help="a DNS label, e.g. gpu1")
WorkloadArg = typer.Argument(..., parser=WORKLOAD, metavar=WORKLOAD.metavar, help="e.g. acme/train/w1")
DeviceArg = typer.Argument(..., parser=DEVICE, metavar=DEVICE.metavar, help="nic:<node> or leaf:<name>")
EndA = typer.Argument(..., parser=ENDPOINT, metavar="A", help="DEVICE:PORT, e.g. leaf1:swp1")
EndB = typer.Argument(..., parser=ENDPOINT, metavar="B", help="DEVICE:PORT, e.g. gpu1:p0")


def _summary(out: dict[str, Any]) -> None:
    """What a fabric change did, one line per kind of object."""
    if machine_output():
        emit(out)
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


# ---- the stored fabric document, one object per noun


def _links(doc: dict[str, Any]) -> list[dict[str, str]]:
    return [{"leaf": a, "peer": b} for a, b in doc["links"]]


def _placements(doc: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"workload": key, "node": p["node"], "port": p["port"], "ipv4": p.get("ipv4"), "ipv6": p.get("ipv6"),
             "selectors": list(p.get("selectors", ()))} for key, p in doc["placements"].items()]


def _cabled(doc: dict[str, Any], name: str) -> list[str]:
    """The cables of device `name`, each as `<its port> -> <peer>:<port>`."""
    out = []
    for a, b in doc["links"]:
        for mine, other in ((a, b), (b, a)):
            if mine.split(":", 1)[0] == name:
                out.append(f"{mine.split(':', 1)[1]}->{other}")
    return out


def items(doc: dict[str, Any], kind: str) -> list[dict[str, Any]]:
    """The nodes, leaves or spines of a fabric document, one object each with its cables (and, for a node,
    the workloads placed on it)."""
    if kind == "node":
        placed = _placements(doc)
        return [{"name": name, "uplinks": body["nic"]["uplinks"], "host_ports": body["nic"]["host_ports"],
                 "links": _cabled(doc, name),
                 "placements": [p for p in placed if p["node"] == name]} for name, body in doc["nodes"].items()]
    return [{"name": name, "model": body["model"], "ports": body["ports"], "links": _cabled(doc, name)}
            for name, body in doc[SECTIONS[kind]].items()]


def _one(found: list[dict[str, Any]], key: str, value: str, what: str) -> dict[str, Any]:
    for item in found:
        if item[key] == value:
            return item
    fail(f"no {what} {value!r} in the fabric")


def register(app: typer.Typer) -> None:
    fabric = add_group(app, "fabric", "The fabric inventory: nodes, leaves, spines, cables, placements.", API)

    @command(fabric, "import", API)
    def import_cmd(file: Path = typer.Argument(..., metavar="FILE", help="a fabric YAML file", **existing_file()),
                   server: str = ServerOpt, cacert: Path = CaOpt) -> None:
        """Merge FILE (the fabric YAML) onto the stored fabric: all or nothing; grants are never imported."""
        try:
            text = file.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            fail(f"cannot read {file}: {exc}", EXIT_USAGE)  # the FILE given: usage, before any work
        _summary(client(server, cacert).post("/v1/fabric/import", {"yaml": text, "source": file.name}))

    @command(fabric, "show", API)
    def show_cmd(server: str = ServerOpt, cacert: Path = CaOpt) -> None:
        """The whole stored fabric as a fabric document (YAML; --json / -o yaml for machines)."""
        doc = client(server, cacert).get("/v1/fabric")
        if machine_output():
            emit(doc)
            return
        import yaml

        print(yaml.safe_dump(doc, sort_keys=False, default_flow_style=None), end="")

    for kind in SECTIONS:
        _device_group(fabric, kind)
    _link_group(fabric)
    _placement_group(fabric)
    register_devices(app)


def _device_group(fabric: typer.Typer, kind: str) -> None:
    section = SECTIONS[kind]
    noun = "GPU nodes (and their SuperNICs)" if kind == "node" else f"{kind.title()} switches"
    group = add_group(fabric, kind, f"{noun}: add, list, show, remove.", API)
    view = NODES if kind == "node" else View(section, SWITCHES.columns)
    # each kind's own words: the shared docstrings read "Every one, ..." and "(and, for a node, ...)" in `fabric
    # leaf list --help`
    one = "GPU node" if kind == "node" else f"{kind} switch"
    placed = ", and the workloads placed on it" if kind == "node" else ""

    if kind == "node":
        @command(group, "add", API)
        def add_node(name: str = NameArg,
                     uplink: list[str] = typer.Option(..., "--uplink", parser=PORT_NAME, metavar="PORT",
                                                      help="SuperNIC uplink port, repeatable"),
                     host_port: list[str] = typer.Option([], "--host-port", parser=PORT_NAME, metavar="PORT",
                                                         help="VF representor, repeatable"),
                     server: str = ServerOpt, cacert: Path = CaOpt) -> None:
            """Add a GPU node with its SuperNIC's ports."""
            body = {"name": name, "uplinks": list(uplink), "host_ports": list(host_port)}
            _summary(client(server, cacert).post("/v1/fabric/nodes", body))
    else:
        @command(group, "add", API, help=f"Add a {one} with its ports.")
        def add_switch(name: str = NameArg,
                       port: list[str] = typer.Option(..., "--port", parser=PORT_NAME, metavar="PORT",
                                                      help="switch port, repeatable"),
                       model: str = typer.Option("sn5600", "--model", parser=MODEL, metavar=MODEL.metavar),
                       server: str = ServerOpt, cacert: Path = CaOpt) -> None:
            body = {"name": name, "ports": list(port), "model": model}
            _summary(client(server, cacert).post(f"/v1/fabric/{section}", body))

    @command(group, "list", API, help=f"Every {one}, with its ports and cables.")
    def list_cmd(server: str = ServerOpt, cacert: Path = CaOpt) -> None:
        emit(items(client(server, cacert).get("/v1/fabric"), kind), view)

    @command(group, "show", API, help=f"One {one}, with its ports and cables{placed}.")
    def show_cmd(name: str = NameArg, server: str = ServerOpt, cacert: Path = CaOpt) -> None:
        found = _one(items(client(server, cacert).get("/v1/fabric"), kind), "name", name, kind)
        if machine_output() or kind != "node":
            emit(found)
            return
        emit({k: v for k, v in found.items() if k != "placements"})
        if found["placements"]:
            PLACEMENTS.table(found["placements"])

    @command(group, "remove", API,
             help=f"Remove a {one} and its cables (refused while a placed workload depends on it).")
    def remove_cmd(name: str = NameArg, server: str = ServerOpt, cacert: Path = CaOpt) -> None:
        _summary(client(server, cacert).request("DELETE", f"/v1/fabric/{section}/{name}"))


def _link_group(fabric: typer.Typer) -> None:
    link = add_group(fabric, "link", "Cables: add, list, remove.", API)

    @command(link, "add", API)
    def add(a: str = EndA, b: str = EndB, server: str = ServerOpt, cacert: Path = CaOpt) -> None:
        """Cable A to B (`leaf1:swp1 gpu1:p0`: a leaf port to a node uplink or a spine port)."""
        _summary(client(server, cacert).post("/v1/fabric/links", {"a": a, "b": b}))

    @command(link, "list", API)
    def list_cmd(server: str = ServerOpt, cacert: Path = CaOpt) -> None:
        """Every cable: a leaf port and what it faces."""
        emit(_links(client(server, cacert).get("/v1/fabric")), LINKS)

    @command(link, "remove", API)
    def remove(a: str = EndA, b: str = EndB, server: str = ServerOpt, cacert: Path = CaOpt) -> None:
        """Remove the cable between A and B."""
        _summary(client(server, cacert).post("/v1/fabric/links/remove", {"a": a, "b": b}))


def _placement_group(fabric: typer.Typer) -> None:
    placement = add_group(fabric, "placement", "Where workloads run: list, show (`workload place` sets them).", API)

    @command(placement, "list", API)
    def list_cmd(node: str = typer.Option(None, "--node", parser=SLUG, metavar="NODE",
                                          help="only this node's (what its agent reads)"),
                 server: str = ServerOpt, cacert: Path = CaOpt) -> None:
        """Every placed workload: node, host port, addresses, attestation selectors."""
        api = client(server, cacert)
        if node is None:
            emit(_placements(api.get("/v1/fabric")), PLACEMENTS)
            return
        rows = api.get(f"/v1/nodes/{node}/placements")
        emit([{"workload": r["workload"], "node": node, "port": r["port"], "ipv4": r["ipv4"], "ipv6": r["ipv6"],
               "selectors": r["selectors"], "spiffe_id": r["spiffe_id"]} for r in rows], PLACEMENTS)

    @command(placement, "show", API)
    def show_cmd(workload: str = WorkloadArg, server: str = ServerOpt, cacert: Path = CaOpt) -> None:
        """Where one workload runs."""
        emit(_one(_placements(client(server, cacert).get("/v1/fabric")), "workload", workload, "placement of"))


def register_placement(workload: typer.Typer) -> None:
    """`workload place|unplace` (the `workload` group belongs to cli/remote/inventory.py)."""

    @command(workload, "place", API)
    def place(key: str = WorkloadArg,
              node: str = typer.Option(..., "--node", parser=SLUG, metavar="NODE"),
              port: str = typer.Option(..., "--port", parser=PORT_NAME, metavar="PORT", help="host port"),
              ipv4: str = typer.Option(None, "--ipv4", parser=IPV4, metavar=IPV4.metavar),
              ipv6: str = typer.Option(None, "--ipv6", parser=IPV6, metavar=IPV6.metavar),
              selector: list[str] = typer.Option([], "--selector", parser=SELECTOR, metavar=SELECTOR.metavar,
                                                 help="e.g. unix:uid:1001, repeatable"),
              server: str = ServerOpt, cacert: Path = CaOpt) -> None:
        """Place (or move) a registered workload on a node's host port, with its addresses."""
        body = {"node": node, "port": port, "ipv4": ipv4, "ipv6": ipv6, "selectors": list(selector)}
        _summary(client(server, cacert).request("PUT", f"/v1/fabric/placements/{key}", json_body=body))

    @command(workload, "unplace", API)
    def unplace(key: str = WorkloadArg, server: str = ServerOpt, cacert: Path = CaOpt) -> None:
        """Take a workload off its node (its flows are withdrawn from every device)."""
        _summary(client(server, cacert).request("DELETE", f"/v1/fabric/placements/{key}"))


def register_devices(app: typer.Typer) -> None:
    """`device list|show|ruleset`: what the agents run, through the API (admins, security, auditors)."""
    device = add_group(app, "device", "Devices (SuperNICs, leaves): list, show, versions, ruleset.", API)

    @command(device, "list", API)
    def list_cmd(server: str = ServerOpt, cacert: Path = CaOpt) -> None:
        """Every device: desired vs applied version, pin, pending plan, drift, last apply."""
        emit(client(server, cacert).get("/v1/devices"), DEVICES)

    @command(device, "show", API)
    def show_cmd(name: str = DeviceArg, server: str = ServerOpt, cacert: Path = CaOpt) -> None:
        """One device: its versions, pin, drift, last error and per-rule counters."""
        emit(client(server, cacert).get(f"/v1/devices/{name}"))

    @command(device, "versions", API)
    def versions_cmd(name: str = DeviceArg, server: str = ServerOpt, cacert: Path = CaOpt) -> None:
        """Every version published for the device, newest first: hash, time, who, why (as `enforcer versions` on
        the server host)."""
        from cli.remote.client import walk_pages

        api = client(server, cacert)
        path = f"/v1/devices/{name}/versions"

        def page(before: int | None) -> tuple[list[Any], int | None]:
            answer = api.get(path, limit=200, before=before)
            return answer["items"], answer.get("next_before")

        emit(walk_pages(page, path), DEVICE_VERSIONS)

    @command(device, "ruleset", API)
    def ruleset_cmd(name: str = DeviceArg, server: str = ServerOpt, cacert: Path = CaOpt) -> None:
        """The rule set the device should run (what its agent fetches): version, hash, cause; --json has the
        IR (`enforcer show --format` renders it on the server host)."""
        out = client(server, cacert).get(f"/v1/devices/{name}/ruleset")
        if machine_output():
            emit(out)
            return
        ir = out["ir"]
        emit({"device": out["device"], "version": out["version"], "content_hash": out["content_hash"],
              "cause": out["cause"], "published_at": out["published_at"], "vrfs": len(ir.get("vrfs", ())),
              "rules": len(ir.get("rules", ()))})
