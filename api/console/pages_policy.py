"""Security team: policy versions (upload a folder, the Rego test results per test, the impact report by
tenant, activate / rollback after a confirmation naming the flow counts), explain, the flow matrix, and
the CA status with its rotation timeline."""

from __future__ import annotations

import math
from datetime import UTC, datetime
from pathlib import PurePosixPath
from typing import Annotated, Any

from fastapi import APIRouter, Form, Query, Request
from fastapi.responses import Response
from starlette.datastructures import UploadFile

from api.console.client import ApiError
from api.console.session import ctx_of
from api.console.web import Session, render, see_other, seg, signed_in
from core.digits import is_digits

router = APIRouter()
Csrf = Annotated[str, Form(max_length=200)]
IMPACT_ROWS = 200
MATRIX_PAGE = 20
MAX_UPLOAD_FILES = 200
RETRY_SECONDS = 1  # how soon a page being computed asks again


def modules_from_upload(files: list[UploadFile], texts: list[bytes]) -> dict[str, str]:
    """{path inside the folder: Rego text} of the uploaded folder's .rego files (the folder's own name,
    which the browser puts in front of every path, is dropped); ValueError when there are none."""
    paths = [PurePosixPath((f.filename or "").replace("\\", "/")) for f in files]
    tops = {p.parts[0] for p in paths if len(p.parts) > 1}
    strip = len(tops) == 1 and all(len(p.parts) > 1 for p in paths)
    modules: dict[str, str] = {}
    for path, text in zip(paths, texts, strict=True):
        if path.suffix != ".rego":
            continue
        name = PurePosixPath(*path.parts[1:]) if strip else path
        try:
            modules[name.as_posix()] = text.decode("utf-8")
        except UnicodeDecodeError:
            raise ValueError(f"{name} is not UTF-8 text") from None
    if not modules:
        raise ValueError("the folder holds no .rego files")
    return modules


async def _versions(session: Session) -> tuple[list[Any], Any]:
    versions = await session.api.get("/v1/policy/versions")
    active = next((v for v in versions if v["state"] == "active"), None)
    return sorted(versions, key=lambda v: -v["number"]), active


@router.get("/policy")
async def policy(request: Request) -> Response:
    session = await signed_in(request)
    versions, active = await _versions(session)
    return render(request, session, "policy.html", versions=versions, active=active, upload_error=None)


@router.post("/policy/upload")
async def upload(request: Request) -> Response:
    form = await request.form(max_files=MAX_UPLOAD_FILES)
    csrf = form.get("csrf")
    session = await signed_in(request, csrf=csrf if isinstance(csrf, str) else None, change=True)
    files = [f for f in form.getlist("files") if isinstance(f, UploadFile)]
    note = form.get("note")
    try:
        modules = modules_from_upload(files, [await f.read() for f in files])
        version = await session.api.post("/v1/policy/versions",
                                         {"modules": modules, "note": note if isinstance(note, str) else ""})
    except (ValueError, ApiError) as exc:
        versions, active = await _versions(session)
        reason = exc.reason if isinstance(exc, ApiError) else str(exc)
        return render(request, session, "policy.html", status=400, versions=versions, active=active,
                      upload_error=reason)
    return see_other(f"/console/policy/versions/{version['number']}?notice=uploaded")


def _verb(version: Any, active: Any) -> str | None:
    """What putting this version in force is called: activate (newer), rollback (older), None (in force)."""
    if active is None:
        return "activate"
    if version["number"] == active["number"]:
        return None
    return "activate" if version["number"] > active["number"] else "rollback"


@router.get("/policy/versions/{ref}")
async def version(request: Request, ref: str) -> Response:
    session = await signed_in(request)
    v = await session.api.get(f"/v1/policy/versions/{seg(ref)}")
    _versions_list, active = await _versions(session)
    return render(request, session, "version.html", version=v, active=active, verb=_verb(v, active))


def computing(request: Request, session: Session, what: str) -> Response:
    """The page (or htmx fragment) saying `what` is being computed, which asks again by itself."""
    url = request.url.path + (f"?{request.url.query}" if request.url.query else "")
    return render(request, session, "computing.html", status=202, what=what, url=url, retry=RETRY_SECONDS)


@router.get("/policy/versions/{ref}/impact")
async def impact(request: Request, ref: str) -> Response:
    session = await signed_in(request)
    report = await session.api.get_when_ready(f"/v1/policy/versions/{seg(ref)}/impact", limit=IMPACT_ROWS)
    if report is None:
        return computing(request, session, f"The impact report of version {ref}")
    return render(request, session, "impact.html", ref=ref, report=report, rows=IMPACT_ROWS)


async def _confirmation(request: Request, session: Session, ref: str, verb: str, changed: bool = False,
                        status: int = 200) -> Response:
    report = await session.api.get_when_ready(f"/v1/policy/versions/{seg(ref)}/impact", limit=0)
    if report is None:
        return computing(request, session, f"The impact of version {ref}, to confirm")
    v = await session.api.get(f"/v1/policy/versions/{seg(ref)}")
    _versions_list, active = await _versions(session)
    return render(request, session, "confirm.html", status=status, version=v, active=active, verb=verb,
                  report=report, changed=changed)


@router.get("/policy/versions/{ref}/activate")
async def confirm_activate(request: Request, ref: str) -> Response:
    return await _confirmation(request, await signed_in(request), ref, "activate")


@router.get("/policy/versions/{ref}/rollback")
async def confirm_rollback(request: Request, ref: str) -> Response:
    return await _confirmation(request, await signed_in(request), ref, "rollback")


async def _switch(request: Request, ref: str, verb: str, csrf: str, opened: int, closed: int, reason: str
                  ) -> Response:
    session = await signed_in(request, csrf=csrf, change=True)
    report = await session.api.get(f"/v1/policy/versions/{seg(ref)}/impact", limit=0)
    if (report["opened_count"], report["closed_count"]) != (opened, closed):
        # what was confirmed is not what would happen now (the inventory, the grants or the active version
        # changed since): ask again with the current numbers
        return await _confirmation(request, session, ref, verb, changed=True, status=409)
    body: dict[str, Any] = {"reason": reason} if reason else {}
    await session.api.post(f"/v1/policy/versions/{seg(ref)}/{verb}", body)
    notice = "activated" if verb == "activate" else "rolled-back"
    return see_other(f"/console/policy/versions/{seg(ref)}?notice={notice}")


Count = Annotated[int, Form(ge=0, le=10**9)]
Reason = Annotated[str, Form(max_length=500)]


@router.post("/policy/versions/{ref}/activate")
async def activate(request: Request, ref: str, csrf: Csrf = "", opened: Count = 0, closed: Count = 0,
                   reason: Reason = "") -> Response:
    return await _switch(request, ref, "activate", csrf, opened, closed, reason)


@router.post("/policy/versions/{ref}/rollback")
async def rollback(request: Request, ref: str, csrf: Csrf = "", opened: Count = 0, closed: Count = 0,
                   reason: Reason = "") -> Response:
    return await _switch(request, ref, "rollback", csrf, opened, closed, reason)


@router.get("/explain")
async def explain(
    request: Request, src: Annotated[str, Query(max_length=2048)] = "",
    dst: Annotated[str, Query(max_length=2048)] = "", port: Annotated[str, Query(max_length=5)] = "",
    proto: Annotated[str, Query(max_length=3)] = "tcp",
) -> Response:
    session = await signed_in(request)
    answer, problem, status = None, None, 200
    if src and dst and port:
        if not is_digits(port):
            problem, status = "the port is a number from 1 to 65535", 400
        else:
            try:
                answer = await session.api.get("/v1/policy/explain", src=src, dst=dst, port=int(port), proto=proto)
            except ApiError as exc:
                problem, status = exc.reason, exc.status
    return render(request, session, "explain.html", status=status, answer=answer, problem=problem, src=src, dst=dst,
                  port=port, proto=proto)


def heat(n: int, top: int) -> int:
    """0 (none) to 5 (the most flows on the page), on a log scale: a few cells dominate otherwise."""
    if n <= 0 or top <= 0:
        return 0
    return max(1, min(5, math.ceil(5 * math.log1p(n) / math.log1p(top))))


@router.get("/flows")
async def flows(request: Request, search: Annotated[str, Query(max_length=63)] = "",
                offset: Annotated[int, Query(ge=0, le=1_000_000)] = 0) -> Response:
    session = await signed_in(request)
    matrix = await session.api.get_when_ready("/v1/policy/flows/matrix", search=search, offset=offset,
                                              limit=MATRIX_PAGE)
    if matrix is None:
        return computing(request, session, "The flow matrix")
    cells = {(c["src_tenant"], c["dst_tenant"]): c["flows"] for c in matrix["cells"]}
    mirrors = {(c["src_tenant"], c["dst_tenant"]): c["mirrors"] for c in matrix.get("mirror_cells", [])}
    top = max([*cells.values(), *(t["out_other"] for t in matrix["tenants"]),
               *(t["in_other"] for t in matrix["tenants"]), 0])
    return render(request, session, "flows.html", matrix=matrix, cells=cells, mirrors=mirrors, top=top, heat=heat,
                  search=search, offset=offset, page=MATRIX_PAGE)


@router.get("/flows/{src}/{dst}")
async def flow_cell(request: Request, src: str, dst: str,
                    offset: Annotated[int, Query(ge=0, le=1_000_000)] = 0) -> Response:
    session = await signed_in(request)
    listing = await session.api.get_when_ready("/v1/policy/flows", src_tenant=src, dst_tenant=dst, offset=offset,
                                               limit=200)
    if listing is None:
        return computing(request, session, f"The flows from {src} to {dst}")
    return render(request, session, "flow_cell.html", listing=listing, src=src, dst=dst, offset=offset)


def _timeline(status: dict[str, Any], now: datetime) -> dict[str, Any]:
    """SVG geometry (no inline styles: the CSP forbids them) of each CA's validity, and now's mark."""
    def t(value: str | None) -> float | None:
        return datetime.fromisoformat(value).timestamp() if value else None

    spans = [(ca, t(ca["not_before"]), t(ca["not_after"])) for ca in status["cas"]]
    known = [x for _ca, a, b in spans for x in (a, b) if x is not None]
    marks = [x for x in (t(status.get("next_prepare_at")), t(status.get("next_activate_at"))) if x is not None]
    lo, hi = min([*known, now.timestamp()]), max([*known, *marks, now.timestamp()])
    width = 760.0
    scale = width / (hi - lo) if hi > lo else 1.0
    rows = []
    for i, (ca, a, b) in enumerate(spans):
        x = ((a or lo) - lo) * scale
        rows.append({"ca": ca, "x": round(x, 1), "y": 10 + 28 * i,
                     "w": round(max(2.0, ((b or hi) - (a or lo)) * scale), 1)})
    return {"rows": rows, "now_x": round((now.timestamp() - lo) * scale, 1), "width": width,
            "height": 20 + 28 * len(rows), "lo": datetime.fromtimestamp(lo, UTC), "hi": datetime.fromtimestamp(hi, UTC),
            "marks": [{"x": round((m - lo) * scale, 1)} for m in marks]}


@router.get("/ca")
async def ca(request: Request) -> Response:
    session = await signed_in(request)
    status = await session.api.get("/v1/ca/status")
    return render(request, session, "ca.html", ca_status=status, timeline=_timeline(status, ctx_of(request).clock()))
