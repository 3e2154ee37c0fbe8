"""The fabric inventory: import a fabric file, add and remove nodes, leaves, spines and cables, place
workloads; and a node's own placements for its agent. Thin: authorize, one workflow call (workflows/fabric.py,
where the rules and the import semantics are), shape the answer. Bad input names the field and writes nothing.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Request
from pydantic import BaseModel, ConfigDict, Field

from api.authz import authorize
from api.deps import CtxDep, PrincipalDep
from api.handoff import HandedOffRoute
from api.patterns import FABRIC_END_PATTERN, FABRIC_NAME_PATTERN
from api.routes.common import request_id
from api.routes.devices import log_denial, node_name
from api.schemas import COMMON_ERRORS, SlugPath, error_responses
from core.errors import Forbidden
from workflows import fabric
from workflows.fabric import FabricChange, Who

router = APIRouter(prefix="/v1", tags=["fabric"], route_class=HandedOffRoute)

READ_ERRORS = error_responses(*COMMON_ERRORS, 404)
WRITE_ERRORS = error_responses(*COMMON_ERRORS, 404, 409)
Name = Annotated[str, Field(min_length=1, max_length=63, pattern=FABRIC_NAME_PATTERN)]
End = Annotated[str, Field(min_length=3, max_length=127, pattern=FABRIC_END_PATTERN, examples=["leaf1:swp1"])]


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ImportBody(Strict):
    yaml: str = Field(max_length=fabric.MAX_IMPORT_BYTES, description="the fabric file (enforcer/fabric_file.py)")
    source: str = Field(default="fabric.yaml", min_length=1, max_length=200, description="its name, for messages")


class NodeBody(Strict):
    name: Name
    uplinks: list[Name] = Field(min_length=1, max_length=16, description="SuperNIC ports cabled to leaves")
    host_ports: list[Name] = Field(default_factory=list, max_length=1024,
                                   description="host-facing ports / VF representors, one workload each")


class SwitchBody(Strict):
    name: Name
    ports: list[Name] = Field(min_length=1, max_length=1024)
    model: Name = "sn5600"


class LinkBody(Strict):
    a: End
    b: End


class PlacementBody(Strict):
    node: Name
    port: Name
    ipv4: str | None = Field(default=None, max_length=15)
    ipv6: str | None = Field(default=None, max_length=39)
    selectors: list[Annotated[str, Field(max_length=1100)]] = Field(
        default_factory=list, max_length=16, description="workload attestation on the node, e.g. unix:uid:1001")


class ChangeOut(BaseModel):
    unchanged: bool
    changes: dict[str, Any]
    tenants_created: list[str]
    tenants_allocated: list[str]
    groups_created: list[str]
    workloads_registered: list[str]
    grants_not_imported: list[str] = Field(description="grants are requested and approved, never imported")


class NodePlacement(BaseModel):
    workload: str
    spiffe_id: str
    port: str
    ipv4: str | None
    ipv6: str | None
    selectors: list[str]


def _who(request: Request, ctx: Any, principal: Any) -> Who:
    return Who(principal.actor(), ctx.clock, request_id(request), ctx.settings.quotas)


def _run(request: Request, ctx: Any, principal: Any, fn: Any, *args: Any, **kw: Any) -> dict[str, Any]:
    authorize(request, principal, "fabric.write", None)
    with ctx.db.session() as session:
        out: FabricChange = fn(session, _who(request, ctx, principal), ctx.settings.pools(), *args, **kw)
        return out.to_dict()


@router.get("/fabric", responses=READ_ERRORS,
            summary="The stored fabric as a fabric document: nodes, leaves, spines, links, placements, tenants")
def show_fabric(request: Request, ctx: CtxDep, principal: PrincipalDep) -> dict[str, Any]:
    from enforcer.fabric_db import stored_document
    from workflows.context import trust_domain

    authorize(request, principal, "fabric.read", None)
    with ctx.db.read_session() as session:
        return stored_document(session, trust_domain(ctx, session))


@router.post("/fabric/import", response_model=ChangeOut, responses=WRITE_ERRORS,
             summary="Merge a fabric file onto the stored fabric, all or nothing (grants are never imported)")
def import_fabric(body: ImportBody, request: Request, ctx: CtxDep, principal: PrincipalDep) -> dict[str, Any]:
    return _run(request, ctx, principal, fabric.import_fabric, body.yaml, source=body.source)


@router.post("/fabric/nodes", status_code=201, response_model=ChangeOut, responses=WRITE_ERRORS,
             summary="Add a GPU node and its SuperNIC ports")
def add_node(body: NodeBody, request: Request, ctx: CtxDep, principal: PrincipalDep) -> dict[str, Any]:
    return _run(request, ctx, principal, fabric.add_node, body.name, list(body.uplinks), list(body.host_ports))


@router.post("/fabric/leaves", status_code=201, response_model=ChangeOut, responses=WRITE_ERRORS,
             summary="Add a leaf switch and its ports")
def add_leaf(body: SwitchBody, request: Request, ctx: CtxDep, principal: PrincipalDep) -> dict[str, Any]:
    return _run(request, ctx, principal, fabric.add_switch, "leaf", body.name, list(body.ports), body.model)


@router.post("/fabric/spines", status_code=201, response_model=ChangeOut, responses=WRITE_ERRORS,
             summary="Add a spine switch and its ports")
def add_spine(body: SwitchBody, request: Request, ctx: CtxDep, principal: PrincipalDep) -> dict[str, Any]:
    return _run(request, ctx, principal, fabric.add_switch, "spine", body.name, list(body.ports), body.model)


@router.delete("/fabric/nodes/{name}", response_model=ChangeOut, responses=WRITE_ERRORS,
               summary="Remove a node and its cables (refused while it hosts placed workloads)")
def remove_node(name: SlugPath, request: Request, ctx: CtxDep, principal: PrincipalDep) -> dict[str, Any]:
    return _run(request, ctx, principal, fabric.remove_device, "node", name)


@router.delete("/fabric/leaves/{name}", response_model=ChangeOut, responses=WRITE_ERRORS,
               summary="Remove a leaf and its cables (refused while a placed workload needs it)")
def remove_leaf(name: SlugPath, request: Request, ctx: CtxDep, principal: PrincipalDep) -> dict[str, Any]:
    return _run(request, ctx, principal, fabric.remove_device, "leaf", name)


@router.delete("/fabric/spines/{name}", response_model=ChangeOut, responses=WRITE_ERRORS,
               summary="Remove a spine and its cables")
def remove_spine(name: SlugPath, request: Request, ctx: CtxDep, principal: PrincipalDep) -> dict[str, Any]:
    return _run(request, ctx, principal, fabric.remove_device, "spine", name)


@router.post("/fabric/links", status_code=201, response_model=ChangeOut, responses=WRITE_ERRORS,
             summary="Cable a leaf port to a node uplink or to a spine port")
def add_link(body: LinkBody, request: Request, ctx: CtxDep, principal: PrincipalDep) -> dict[str, Any]:
    return _run(request, ctx, principal, fabric.link, body.a, body.b)


@router.post("/fabric/links/remove", response_model=ChangeOut, responses=WRITE_ERRORS,
             summary="Remove a cable")
def remove_link(body: LinkBody, request: Request, ctx: CtxDep, principal: PrincipalDep) -> dict[str, Any]:
    return _run(request, ctx, principal, fabric.link, body.a, body.b, remove=True)


@router.put("/fabric/placements/{tenant}/{group}/{name}", response_model=ChangeOut, responses=WRITE_ERRORS,
            summary="Place (or move) a registered workload: node, host port, addresses, attestation selectors")
def place(tenant: SlugPath, group: SlugPath, name: SlugPath, body: PlacementBody, request: Request, ctx: CtxDep,
          principal: PrincipalDep) -> dict[str, Any]:
    return _run(request, ctx, principal, fabric.place_workload, f"{tenant}/{group}/{name}", node=body.node,
                port=body.port, ipv4=body.ipv4, ipv6=body.ipv6, selectors=list(body.selectors))


@router.delete("/fabric/placements/{tenant}/{group}/{name}", response_model=ChangeOut, responses=WRITE_ERRORS,
               summary="Take a workload off its node")
def unplace(tenant: SlugPath, group: SlugPath, name: SlugPath, request: Request, ctx: CtxDep,
            principal: PrincipalDep) -> dict[str, Any]:
    return _run(request, ctx, principal, fabric.unplace_workload, f"{tenant}/{group}/{name}")


@router.get("/nodes/{name}/placements", response_model=list[NodePlacement], responses=READ_ERRORS,
            summary="The workloads placed on a node, with SPIFFE IDs and selectors (a node reads its own)")
def node_placements(name: SlugPath, request: Request, ctx: CtxDep, principal: PrincipalDep) -> list[dict[str, Any]]:
    from inventory.fabric import placements_on
    from pki.spiffe_id import workload_id
    from workflows.context import trust_domain

    authorize(request, principal, "placement.read", None)
    if principal.role == "node" and node_name(principal) != name:
        reason = f"out-of-scope: node {node_name(principal)} may only read its own placements, not {name}'s"
        log_denial(request, principal, "placement.read", f"node:{name}", reason)
        raise Forbidden(f"node {principal.id} may not placement.read: {reason}")
    with ctx.db.read_session() as session:
        td = trust_domain(ctx, session)
        rows = placements_on(session, name)
    return [{"workload": key, "spiffe_id": str(workload_id(td, *key.split("/"))), "port": port, "ipv4": ipv4,
             "ipv6": ipv6, "selectors": list(selectors)} for key, (_node, port, ipv4, ipv6, selectors) in rows]
