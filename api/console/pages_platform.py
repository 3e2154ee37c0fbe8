"""Platform: every device with its desired and applied rule-set version, drift, last apply and counters, and
one device's detail (its current rule set summarised, its published versions with their cause), exactly as
the device API answers (GET /v1/devices, .../{device}/ruleset, .../{device}/versions): read by whoever the
API lets read devices (admins, the security team, auditors)."""

from __future__ import annotations

from collections import Counter
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request
from fastapi.responses import Response

from api.console.client import ApiError
from api.console.web import error_page, render, seg, signed_in

router = APIRouter()
PAGE = 100
HISTORY = 20
TOP_COUNTERS = 20
STATES = {"": "all devices", "attention": "needing attention", "in-sync": "in sync", "behind": "behind",
          "drift": "drifted", "error": "with an error", "silent": "never reported", "gone": "left the fabric"}


def state_of(d: dict[str, Any]) -> str:
    """One word for a device row: gone, error, drift, silent (no report yet), behind, pending, in-sync."""
    if not d["in_fabric"]:
        return "gone"
    if d["last_error"]:
        return "error"
    if d["drift"] and not d["drift_repaired"]:
        return "drift"
    if d["applied_version"] is None:
        return "silent"
    if not d["in_sync"]:
        return "behind"
    return "in-sync"


def counter_totals(counters: dict[str, Any]) -> tuple[int, int]:
    return (sum(int(c.get("packets", 0)) for c in counters.values()),
            sum(int(c.get("bytes", 0)) for c in counters.values()))


def _matches(d: dict[str, Any], state: str, search: str) -> bool:
    if search and search not in d["device"]:
        return False
    if state == "attention":
        return d["state"] not in ("in-sync", "gone")
    return not state or d["state"] == state


@router.get("/devices")
async def devices(request: Request, search: Annotated[str, Query(max_length=80)] = "",
                  state: Annotated[str, Query(max_length=20)] = "",
                  offset: Annotated[int, Query(ge=0, le=1_000_000)] = 0) -> Response:
    session = await signed_in(request)
    rows = await session.api.get("/v1/devices")
    if state not in STATES:
        return error_page(request, session, 400, f"state must be one of {', '.join(repr(s) for s in STATES if s)}")
    for d in rows:
        d["state"] = state_of(d)
        d["packets"], d["bytes"] = counter_totals(d["counters"])
    tally = Counter(d["state"] for d in rows)
    counts = [(key, tally[key], label) for key, label in STATES.items() if tally[key]]
    shown = [d for d in rows if _matches(d, state, search)]
    return render(request, session, "devices.html", devices=shown[offset:offset + PAGE], total=len(rows),
                  matching=len(shown), counts=counts, states=STATES, state=state, search=search, offset=offset,
                  page=PAGE)


def ruleset_summary(ir: dict[str, Any]) -> dict[str, Any]:
    """What a person reads off a rule set: rules by direction and action, top reasons, sets, ports, VRFs."""
    rules = ir.get("rules", [])
    by_kind = Counter((r["direction"], r["action"]) for r in rules)
    reasons = Counter(reason for r in rules for reason in r.get("reasons", []))
    return {
        "rules": len(rules), "cost": ir.get("cost", 0), "uplink": ir.get("uplink", ""),
        "by_kind": sorted(by_kind.items()), "reasons": reasons.most_common(10), "reason_count": len(reasons),
        "sets": len(ir.get("sets", [])), "ports": ir.get("ports", []),
        "vrfs": [{"name": v["name"], "tenant": v["tenant"], "vni": v["vni"], "members": len(v["members"]),
                  "leaks": len(v["leaks"])} for v in ir.get("vrfs", [])],
    }


@router.get("/devices/{device}")
async def device(request: Request, device: str,
                 before: Annotated[int | None, Query(ge=1, le=10**9)] = None) -> Response:
    session = await signed_in(request)
    d = seg(device)
    history = await session.api.get(f"/v1/devices/{d}/versions", limit=HISTORY, before=before)  # 404: no device
    row = next((r for r in await session.api.get("/v1/devices") if r["device"] == device), None)
    if row is None:
        return error_page(request, session, 404, f"no device {device}")
    row["state"] = state_of(row)
    row["packets"], row["bytes"] = counter_totals(row["counters"])
    top = sorted(row["counters"].items(), key=lambda kv: (-int(kv[1].get("packets", 0)), kv[0]))[:TOP_COUNTERS]
    ruleset, gone = None, None
    try:
        ruleset = await session.api.get(f"/v1/devices/{d}/ruleset")
    except ApiError as exc:
        if exc.status != 404:
            raise
        gone = exc.reason
    return render(request, session, "device.html", d=row, history=history, before=before, top=top,
                  ruleset=ruleset, summary=ruleset_summary(ruleset["ir"]) if ruleset else None, gone=gone)
