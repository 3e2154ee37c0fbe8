"""Leaf backend: NVUE's REST API (Cumulus Linux 5.x), revision -> changes -> apply.
Objects are replaced whole: PATCH merges, so one whose content changes is deleted first in the revision.

A Spectrum switch cannot exist here, so this speaks the API shape and is tested against a stand-in that
validates every revision against the JSON Schema of what we emit (tests/enforcer/nvue_standin.py).
Why not a file-based "staged config" backend instead: it would prove nothing about the apply protocol; the
REST shape is what a production deployment drives and it carries the atomicity we rely on (a revision
applies whole or stays pending/invalid while the switch keeps running the applied revision).

apply: refuse locally if the document breaks the schema (fail closed, nothing sent); otherwise create a
revision, DELETE every object of ours the new set no longer has, PATCH the new document, ask the switch to
apply and poll until it says applied. Objects of ours are named `tf-*` (ACLs, prefix lists, route maps),
`vrf<vni>` (VRFs) and `<port>.<vlan>` (subinterfaces); nothing else on the switch is touched.
"""

from __future__ import annotations

import time
from typing import Any
from urllib.parse import quote

import httpx

from core.canonical import canonical_json
from enforcer.errors import ApplyError, NotApplied
from enforcer.ir import DeviceRuleSet
from enforcer.render.nvue import ACL_PREFIX, nvue_yaml, render_nvue, validate_nvue

API = "/nvue_v1"


def _ours(section: str, name: str) -> bool:
    if section in ("acl", "prefix-list", "route-map"):
        return name.startswith(ACL_PREFIX)
    if section == "vrf":
        return name.startswith("vrf") and name[3:].isdigit()
    if section == "interface":
        base, dot, vlan = name.rpartition(".")
        return bool(base and dot and vlan.isdigit())
    return False


def managed(config: dict[str, Any]) -> dict[str, Any]:
    """The part of a switch configuration that trustfabric owns."""
    out: dict[str, Any] = {}
    for section in ("acl", "interface", "vrf"):
        items = {k: v for k, v in (config.get(section) or {}).items() if _ours(section, k)}
        if items:
            out[section] = items
    policy = (config.get("router") or {}).get("policy") or {}
    pol = {s: {k: v for k, v in (policy.get(s) or {}).items() if _ours(s, k)} for s in ("prefix-list", "route-map")}
    pol = {k: v for k, v in pol.items() if v}
    if pol:
        out["router"] = {"policy": pol}
    return out


def _paths(doc: dict[str, Any]) -> set[tuple[str, ...]]:
    out: set[tuple[str, ...]] = {("acl", k) for k in doc.get("acl", {})}
    out |= {("interface", k) for k in doc.get("interface", {})}
    out |= {("vrf", k) for k in doc.get("vrf", {})}
    for s, items in doc.get("router", {}).get("policy", {}).items():
        out |= {("router", "policy", s, k) for k in items}
    return out


def _get(doc: dict[str, Any], path: tuple[str, ...]) -> Any:
    node: Any = doc
    for p in path:
        if not isinstance(node, dict) or p not in node:
            return None
        node = node[p]
    return node


def _diff(a: Any, b: Any, path: str = "") -> list[str]:
    if isinstance(a, dict) and isinstance(b, dict):
        out = []
        for k in sorted(set(a) | set(b)):
            p = f"{path}/{k}"
            if k not in a:
                out.append(f"+ {p}")
            elif k not in b:
                out.append(f"- {p}")
            else:
                out.extend(_diff(a[k], b[k], p))
        return out
    return [] if a == b else [f"~ {path}: {a!r} != {b!r}"]


class NvueBackend:
    def __init__(self, base_url: str, auth: tuple[str, str] | None = None, client: httpx.Client | None = None,
                 timeout: float = 30.0, poll_interval: float = 0.05) -> None:
        self.client = client or httpx.Client(base_url=base_url, auth=auth, timeout=timeout)
        self.timeout = timeout
        self.poll_interval = poll_interval

    def render(self, rules: DeviceRuleSet) -> str:
        return nvue_yaml(rules)

    def _call(self, method: str, path: str, **kwargs: Any) -> Any:
        try:
            resp = self.client.request(method, API + path, **kwargs)
        except httpx.HTTPError as exc:
            raise ApplyError(f"NVUE {method} {path}: {exc}") from None
        if resp.status_code >= 400:
            raise ApplyError(f"NVUE {method} {path}: HTTP {resp.status_code} {resp.text[:300]}")
        return resp.json() if resp.content else None

    def _applied(self) -> dict[str, Any]:
        return dict(self._call("GET", "/", params={"rev": "applied"}) or {})

    def apply(self, rules: DeviceRuleSet) -> str:
        doc = render_nvue(rules)
        problems = validate_nvue(doc)
        if problems:
            raise ApplyError(f"{rules.device}: refusing a configuration outside the NVUE schema: {problems[:3]}")
        current = managed(self._applied())
        created = self._call("POST", "/revision")
        rev = next(iter(created))
        # 5.0-5.3 name revisions `changeset/<user>/<time>`: in a path the id is one percent-encoded segment
        rev_path = f"/revision/{quote(rev, safe='')}"
        # PATCH merges, so an object whose content changes is deleted first and written whole
        for path in sorted(_paths(current)):
            if _get(current, path) != _get(doc, path):
                self._call("DELETE", "/" + "/".join(path), params={"rev": rev})
        self._call("PATCH", "/", params={"rev": rev}, json=doc)
        self._call("PATCH", rev_path, json={"state": "apply", "auto-prompt": {"ays": "ays_yes"}})
        deadline = time.monotonic() + self.timeout
        while True:
            state = (self._call("GET", rev_path) or {}).get("state")
            if state == "applied":
                return rules.content_hash
            if state in ("invalid", "apply_fail", "ays_fail", "failed") or time.monotonic() > deadline:
                raise ApplyError(f"{rules.device}: revision {rev} ended {state!r}; the applied configuration "
                                 "is unchanged")
            time.sleep(self.poll_interval)

    def installed(self) -> str:
        ours = managed(self._applied())
        if not ours:
            raise NotApplied("the switch runs no trustfabric configuration")
        return canonical_json(ours).decode()

    def drift(self, rules: DeviceRuleSet) -> list[str]:
        return _diff(render_nvue(rules), managed(self._applied()))
