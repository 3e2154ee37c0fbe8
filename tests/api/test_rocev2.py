"""RoCEv2's symmetry told where people decide, through the real app and console: udp/4791 skips conntrack on the
SuperNICs, so allowing A -> B lets B's RoCEv2 reach A. The impact report shows that mirror beside the policy's
flows (opening and closing), a grant on udp/4791 tells both sides, and explain says why B -> A passes when only
A -> B is granted, without changing the policy's answer."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from audit import Actor
from inventory import service as inv
from tests.api.conftest import TD, Env, make_settings, open_env, seed
from tests.console.conftest import sign_in, when_ready
from tests.policy.helpers import shipped


def _group(env: Env, tenant: str, name: str, ports: list[dict[str, object]]) -> None:
    with env.ctx.db.session() as s:
        inv.create_group(s, tenant=tenant, name=name, ports=ports, actor=Actor.system("test"), clock=env.clock)


@pytest.fixture
def bare(tmp_path: Path) -> Iterator[Env]:
    """seed()'s tenants without a policy in force, and acme/gpu exposing RoCEv2 (udp/4791) to its tenant."""
    e = open_env(make_settings(tmp_path / "home"))
    seed(e, policy=False)
    _group(e, "acme", "gpu", [{"proto": "udp", "port": 4791}])
    yield e
    e.client.close()
    e.ctx.close()


def test_the_impact_report_shows_the_rocev2_mirrors_beside_the_policy_flows(bare: Env) -> None:
    r = bare.call("POST", "/v1/policy/versions", "security", json={"modules": shipped()})
    assert r.status_code == 201, r.text
    imp = bare.call("GET", f"/v1/policy/versions/{r.json()['number']}/impact", "security").json()
    web_gpu = {"src_tenant": "acme", "src_group": "web", "dst_tenant": "acme", "dst_group": "gpu", "proto": "udp",
               "port": 4791}
    gpu_web = {"src_tenant": "acme", "src_group": "gpu", "dst_tenant": "acme", "dst_group": "web", "proto": "udp",
               "port": 4791}
    # the policy opens web -> gpu (gpu exposes 4791), not gpu -> web: that opens on the wire as its mirror
    assert web_gpu in imp["opened"] and gpu_web not in imp["opened"]
    assert imp["opened_count"] == len(imp["opened"])  # the policy's flows only: what a confirmation compares
    assert {**gpu_web, "mirror": "rocev2"} in imp["mirrors_opened"]
    assert imp["mirrors_opened_count"] == 2 and imp["mirrors_closed"] == []  # gpu -> web and gpu -> db
    # the console: a line in the summary, and the mirrors in a table of their own, never among the policy flows
    client = sign_in(bare, "security")
    page = when_ready(bare, client, f"/console/policy/versions/{r.json()['number']}/impact")
    assert page.status_code == 200, page.text
    html = page.text
    assert "RoCEv2 also <strong>opens 2 and closes 0 mirror flows</strong>" in html
    assert "Opened on the wire as RoCEv2 mirrors, not policy flows" in html
    mirrors = html[html.index("Opened on the wire as RoCEv2 mirrors"):]
    mirrors = mirrors[:mirrors.index("</table>")]
    assert "<td>acme/gpu</td><td>acme/web</td><td>udp/4791</td><td>acme/web → acme/gpu</td>" in mirrors
    policy_flows = html[html.index("Opened flows"):html.index("Opened on the wire")]
    assert "<td>acme/gpu</td><td>acme/web</td><td>udp/4791</td>" not in policy_flows
    confirm = when_ready(bare, client, f"/console/policy/versions/{r.json()['number']}/activate")
    assert "RoCEv2 also opens 2 and closes 0 mirror flows" in confirm.text


def _literal(allowed: str) -> dict[str, str]:
    """The shipped modules with allowed_flows replaced by a literal answer (its flows tests left out)."""
    mods = {k: v for k, v in shipped().items() if k != "flows_test.rego"}
    old = "allowed_flows := array.concat(array.concat(intra_tenant_flows, platform_flows), granted_flows)"
    assert old in mods["flows.rego"]
    mods["flows.rego"] = mods["flows.rego"].replace(old, f"allowed_flows := {allowed}")
    return mods


def test_a_policy_flow_whose_reverse_is_allowed_says_the_wire_does_not_change(bare: Env) -> None:
    """In force: web -> gpu and db -> gpu udp/4791 (gpu exposes it). A candidate allowing only gpu -> web opens
    that policy flow, which passed already as web -> gpu's mirror, and closes web -> gpu, which still passes as
    gpu -> web's mirror; db -> gpu closes with its mirror gpu -> db."""
    from tests.api.conftest import activate_shipped_policy

    activate_shipped_policy(bare)
    mods = _literal('[{"dst_tenant": "acme", "dst_group": "web", "proto": "udp", "ports": [4791], '
                    '"reason": "r", "sources": ["acme/gpu"]}]')
    r = bare.call("POST", "/v1/policy/versions", "security", json={"modules": mods})
    assert r.status_code == 201, r.text
    imp = bare.call("GET", f"/v1/policy/versions/{r.json()['number']}/impact", "security").json()
    flow = {"proto": "udp", "port": 4791}
    assert imp["opened"] == [{"src_tenant": "acme", "src_group": "gpu", "dst_tenant": "acme", "dst_group": "web",
                              **flow, "wire_unchanged": "rocev2"}]
    closed = [f for f in imp["closed"] if f["proto"] == "udp"]
    assert closed == [
        {"src_tenant": "acme", "src_group": "db", "dst_tenant": "acme", "dst_group": "gpu", **flow},
        {"src_tenant": "acme", "src_group": "web", "dst_tenant": "acme", "dst_group": "gpu", **flow,
         "wire_unchanged": "rocev2"}]
    assert imp["mirrors_opened"] == [] and imp["mirrors_closed"] == [
        {"src_tenant": "acme", "src_group": "gpu", "dst_tenant": "acme", "dst_group": "db", **flow, "mirror": "rocev2"}]
    html = when_ready(bare, sign_in(bare, "security"), f"/console/policy/versions/{r.json()['number']}/impact").text
    assert ("<td>acme/gpu</td><td>acme/web</td><td>udp/4791 <span class=\"help\">(passed already on the wire: "
            "RoCEv2 mirror of the reverse)</span></td>") in html
    assert ("<td>acme/web</td><td>acme/gpu</td><td>udp/4791 <span class=\"help\">(still passes on the wire: "
            "RoCEv2 mirror of the reverse)</span></td>") in html
    assert "<td>acme/db</td><td>acme/gpu</td><td>udp/4791</td>" in html


@pytest.fixture
def roce(tmp_path: Path) -> Iterator[Env]:
    """seed()'s tenants and the shipped policy in force, and globex/gpu exposing RoCEv2 (udp/4791)."""
    e = open_env(make_settings(tmp_path / "home"))
    seed(e)
    _group(e, "globex", "gpu", [{"proto": "udp", "port": 4791}, {"proto": "udp", "port": 9000}])
    yield e
    e.client.close()
    e.ctx.close()


NOTE = ("rocev2-mirror: udp/4791 is RoCEv2, symmetric on the SuperNICs: globex/gpu's RoCEv2 can also reach "
        "acme/web, with no grant of its own")
GPU = {"src_group": "web", "dst_tenant": "globex", "dst_group": "gpu", "proto": "udp", "ttl_seconds": 3600}


def _explain(env: Env, **params: object) -> dict[str, object]:
    r = env.call("GET", "/v1/policy/explain-grant", "tenant-admin", "acme", params={**GPU, **params})
    assert r.status_code == 200, r.text
    return r.json()  # type: ignore[no-any-return]


def test_a_rocev2_grant_tells_both_sides_the_destination_s_rocev2_reaches_the_source(roce: Env) -> None:
    # the live answer before any request: undisclosed (acme holds no grant with globex/gpu), the note all the
    # same, worked out from the request alone: a group that does not exist gets the very same answer
    before = _explain(roce, ports=[4791, 9000])
    assert before["outcome"] == "undisclosed" and before["notes"] == [NOTE]
    ghost = _explain(roce, ports=[4791], dst_group="nope")
    assert ghost["notes"] == [NOTE.replace("globex/gpu", "globex/nope")] and ghost["outcome"] == "undisclosed"
    assert _explain(roce, ports=[9000])["notes"] == []  # no RoCEv2, nothing to add
    assert _explain(roce, ports=[4791], ttl_seconds=8 * 86400)["outcome"] == "deny"  # its own side: shown
    assert _explain(roce, ports=[4791], ttl_seconds=8 * 86400)["notes"] == []  # a denial opens nothing

    r = roce.call("POST", "/v1/grants", "tenant-admin", "acme", json={**GPU, "ports": [4791, 9000]})
    assert r.status_code == 201 and r.json()["state"] == "pending", r.text
    gid = r.json()["id"]
    assert r.json()["notes"] == [NOTE] and NOTE not in r.json()["reasons"]  # beside the policy's reasons
    seen = roce.call("GET", f"/v1/grants/{gid}", "tenant-admin", "globex").json()  # the approver
    assert seen["notes"] == [NOTE]
    listed = roce.call("GET", "/v1/grants", "tenant-admin", "globex", params={"state": "pending"}).json()
    assert [g["notes"] for g in listed["items"]] == [[NOTE]]
    assert _explain(roce, ports=[4791])["outcome"] == "pending" and _explain(roce, ports=[4791])["notes"] == [NOTE]

    # the console: the grant page and the waiting list of the approver, the request form's live answer
    globex = sign_in(roce, "tenant-admin", "globex")
    page = globex.get(f"/console/grants/{gid}").text
    assert f'<dt>Note</dt><dd><ul class="reasons notes"><li class="warn">{NOTE}</li></ul></dd>' in page.replace(
        "&#39;", "'")
    waiting = globex.get("/console/grants").text.replace("&#39;", "'")
    assert f'udp/4791,9000<br><small class="warn">{NOTE}</small>' in waiting
    preview = sign_in(roce, "tenant-admin", "acme").get(
        "/console/grants/preview", params={**GPU, "ports": "4791", "src_group": "web"}).text.replace("&#39;", "'")
    assert f'<li class="warn">{NOTE}</li>' in preview

    approved = roce.call("POST", f"/v1/grants/{gid}/approve", "tenant-admin", "globex", json={})
    assert approved.json()["state"] == "active" and approved.json()["notes"] == [NOTE]
    revoked = roce.call("POST", f"/v1/grants/{gid}/revoke", "tenant-admin", "globex", json={"reason": "done"})
    assert revoked.json()["state"] == "revoked" and revoked.json()["notes"] == []  # it opens nothing any more
    tcp = roce.call("POST", "/v1/grants", "tenant-admin", "acme", json={**GPU, "dst_group": "api", "proto": "tcp",
                                                                         "ports": [443]})
    assert tcp.json()["notes"] == []
    denied = roce.call("POST", "/v1/grants", "tenant-admin", "acme", json={**GPU, "dst_group": "api",
                                                                            "ports": [4791]})
    assert denied.json()["state"] == "denied" and denied.json()["notes"] == []


def test_explain_keeps_the_policy_s_deny_and_notes_the_rocev2_mirror_of_the_grant(roce: Env) -> None:
    gid = roce.call("POST", "/v1/grants", "tenant-admin", "acme", json={**GPU, "ports": [4791, 9000]}).json()["id"]
    back = {"src": "globex/gpu", "dst": "acme/web", "port": 4791, "proto": "udp"}
    pending = roce.call("GET", "/v1/policy/explain", "security", params=back).json()
    assert pending["allow"] is False and pending["notes"] == []  # nothing allows web -> gpu yet
    assert roce.call("POST", f"/v1/grants/{gid}/approve", "tenant-admin", "globex", json={}).status_code == 200
    note = (f"rocev2-mirror: the SuperNICs let this RoCEv2 through anyway, as the mirror of acme/web -> globex/gpu "
            f"udp/4791, which grant:{gid} allows (RoCEv2 skips conntrack, so an allowance is symmetric)")
    for role, tenant in (("security", None), ("tenant-member", "globex"), ("tenant-member", "acme")):
        r = roce.call("GET", "/v1/policy/explain", role, tenant, params=back)
        assert r.status_code == 200, r.text
        out = r.json()
        # the policy's answer as it was: deny, no grant from gpu to web; the note beside it
        assert out["allow"] is False and out["reasons"] == [
            "no-grant: no active grant from globex/gpu to acme/web on udp/4791",
            "port-not-exposed: acme/web does not expose udp/4791"], out
        assert out["notes"] == [note], (role, out)
    logged = roce.call("GET", "/v1/policy/decisions", "auditor", params={"kind": "flow", "limit": 1}).json()[0]
    assert logged["allowed"] is False and "rocev2-mirror" not in str(logged)  # the log keeps the policy's answer
    assert roce.call("GET", "/v1/policy/explain", "security", params={**back, "port": 9000}).json()["notes"] == []
    forward = roce.call("GET", "/v1/policy/explain", "security",
                        params={"src": "acme/web", "dst": "globex/gpu", "port": 4791, "proto": "udp"}).json()
    assert forward["allow"] is True and forward["notes"] == []
    spiffe = roce.call("GET", "/v1/policy/explain", "security", params={
        **back, "dst": f"spiffe://{TD}/tenant/acme/group/web/web-1"})
    assert spiffe.status_code == 200 and spiffe.json()["notes"] == [note], spiffe.text
    page = sign_in(roce, "tenant-member", "globex").get("/console/explain", params=back).text.replace("&#39;", "'")
    assert "<strong>DENY</strong>" in page and f'<li class="warn">{note.replace(">", "&gt;")}</li>' in page


def test_the_explain_note_discloses_no_group_the_tenant_may_not_see(roce: Env) -> None:
    """A policy (not the shipped one) that lets any group send RoCEv2 to globex/gpu without a grant: the SuperNICs
    let globex/gpu's RoCEv2 reach acme/web as the mirror, but acme holds no grant with globex/gpu, so its
    explain gets the policy's redacted denial and no note naming what allows the reverse; security gets it."""
    from policy import service as policy_service
    from policy.authoring import prepare

    mods = shipped()
    mods["flows.rego"] += ('\nallow_reasons contains "open-rdma: globex/gpu takes RoCEv2 from every group" if {\n'
                           '\tinput.proto == "udp"\n\tinput.port == 4791\n\tdst.tenant == "globex"\n'
                           '\tdst.group == "gpu"\n}\n')
    with roce.ctx.db.session() as s:
        version, _ = policy_service.upload(s, prepare(mods), Actor.system("test"), now=roce.clock())
        policy_service.activate(s, version.number or 0, Actor.system("test"), now=roce.clock())
    back = {"src": "globex/gpu", "dst": "acme/web", "port": 4791, "proto": "udp"}
    seen = roce.call("GET", "/v1/policy/explain", "security", params=back).json()
    assert seen["allow"] is False and seen["notes"] and "open-rdma" in seen["notes"][0]
    acme = roce.call("GET", "/v1/policy/explain", "tenant-member", "acme", params=back).json()
    assert acme["allow"] is False and acme["notes"] == [] and "open-rdma" not in str(acme)


def test_the_flow_list_of_a_pair_shows_the_rocev2_mirrors_beside_the_policy_flows(roce: Env) -> None:
    """acme/web -> globex/gpu udp/4791 granted: the list of globex -> acme has no policy flow, and its RoCEv2
    passes all the same as that grant's mirror; the list shows it apart, marked, with what allows the reverse."""
    gid = roce.call("POST", "/v1/grants", "tenant-admin", "acme", json={**GPU, "ports": [4791, 9000]}).json()["id"]
    assert roce.call("POST", f"/v1/grants/{gid}/approve", "tenant-admin", "globex", json={}).status_code == 200
    back = roce.call("GET", "/v1/policy/flows", "security", params={"src_tenant": "globex", "dst_tenant": "acme"})
    assert back.status_code == 200, back.text
    out = back.json()
    assert out["total"] == 0 and out["items"] == [] and out["next_offset"] is None  # the policy's flows: none
    note = (f"rocev2-mirror: the SuperNICs let this RoCEv2 through anyway, as the mirror of acme/web -> globex/gpu "
            f"udp/4791, which grant:{gid} allows (RoCEv2 skips conntrack, so an allowance is symmetric)")
    assert out["mirrors_total"] == 1 and out["mirrors"] == [{
        "src_tenant": "globex", "src_group": "gpu", "dst_tenant": "acme", "dst_group": "web", "proto": "udp",
        "port": 4791, "mirror": "rocev2", "notes": [note]}]  # 9000 is conntracked: one way only
    forward = roce.call("GET", "/v1/policy/flows", "auditor", params={"src_tenant": "acme", "dst_tenant": "globex"})
    assert [(f["dst_group"], f["port"]) for f in forward.json()["items"]] == [("gpu", 4791), ("gpu", 9000)]
    assert forward.json()["mirrors"] == [] and forward.json()["mirrors_total"] == 0
    # inside globex (its groups reach gpu on 4791 and 9000): a mirror is never one of the policy's flows, is
    # udp/4791 only, and is the reverse of one of them
    inside = roce.call("GET", "/v1/policy/flows", "security",
                       params={"src_tenant": "globex", "dst_tenant": "globex"}).json()
    key = ("src_group", "dst_group", "proto", "port")
    policy = {tuple(f[k] for k in key) for f in inside["items"]}
    assert inside["mirrors_total"] == len(inside["mirrors"]) > 0
    for m in inside["mirrors"]:
        assert tuple(m[k] for k in key) not in policy and (m["proto"], m["port"]) == ("udp", 4791)
        assert (m["dst_group"], m["src_group"], "udp", 4791) in policy
    # still platform reads only: a tenant asks explain
    assert roce.call("GET", "/v1/policy/flows", "tenant-admin", "acme",
                     params={"src_tenant": "globex", "dst_tenant": "acme"}).status_code == 403
    # the matrix: the policy's cells as they were (globex -> acme has none), the mirror counted apart
    matrix = roce.call("GET", "/v1/policy/flows/matrix", "security").json()
    assert ("globex", "acme") not in {(c["src_tenant"], c["dst_tenant"]) for c in matrix["cells"]}
    assert {"src_tenant": "globex", "dst_tenant": "acme", "mirrors": 1} in matrix["mirror_cells"]
    assert all(c["src_tenant"] != "acme" or c["dst_tenant"] != "globex" for c in matrix["mirror_cells"])
    # the console's matrix links that cell, which had no link (no policy flow), and says what it holds
    security = sign_in(roce, "security")
    grid = when_ready(roce, security, "/console/flows").text
    assert ('aria-label="0 flows from globex to acme, and 1 RoCEv2 mirror on the wire">0 '
            '<small class="mirror">+1 RoCEv2</small></a>') in grid
    # the console's cell: none of the policy's, the mirror in a table of its own
    html = when_ready(roce, security, "/console/flows/globex/acme").text
    assert "<h2>0 flows from globex to acme</h2>" in html
    assert "RoCEv2 also passes from globex to acme as the mirror of 1 allowed flow the other way" in html
    mirrors = html[html.index("Passing on the wire as RoCEv2 mirrors, not policy flows"):]
    assert ('<tr class="mirror"><td>gpu</td><td>web</td><td>udp/4791</td><td>acme/web → globex/gpu</td></tr>'
            in mirrors[:mirrors.index("</table>")])
    assert "RoCEv2 mirrors" not in when_ready(roce, sign_in(roce, "security"), "/console/flows/acme/globex").text


def test_the_matrix_s_other_tenants_row_and_column_count_the_rocev2_mirrors(roce: Env) -> None:
    """acme/web -> globex/gpu udp/4791 granted: globex's RoCEv2 reaches acme as its mirror. With acme alone on the
    page (search), globex is one of the "other tenants": the mirror must be counted there, beside the policy's
    flows, in the API's tenant row and in the console's row and column, as mirror_cells counts it on the page."""
    gid = roce.call("POST", "/v1/grants", "tenant-admin", "acme", json={**GPU, "ports": [4791]}).json()["id"]
    assert roce.call("POST", f"/v1/grants/{gid}/approve", "tenant-admin", "globex", json={}).status_code == 200
    only_acme = roce.call("GET", "/v1/policy/flows/matrix", "security", params={"search": "acme"}).json()
    (acme,) = only_acme["tenants"]
    assert acme["tenant"] == "acme" and only_acme["mirror_cells"] == []
    assert acme["mirrors_in_other"] == 1 and acme["mirrors_out_other"] == 0  # globex -> acme udp/4791
    assert acme["out_other"] >= 1  # the grant itself: a policy flow to globex, off the page
    only_globex = roce.call("GET", "/v1/policy/flows/matrix", "security", params={"search": "globex"}).json()
    (globex,) = only_globex["tenants"]
    assert globex["mirrors_out_other"] == 1 and globex["mirrors_in_other"] == 0
    # both on the page: counted in mirror_cells, not again as "other tenants"
    both = roce.call("GET", "/v1/policy/flows/matrix", "security").json()
    rows = {t["tenant"]: t for t in both["tenants"]}
    assert rows["acme"]["mirrors_in_other"] == 0 and rows["globex"]["mirrors_out_other"] == 0
    security = sign_in(roce, "security")
    grid = when_ready(roce, security, "/console/flows?search=acme").text
    other_row = grid[grid.index('<th scope="row" class="other">other tenants'):]
    other_row = other_row[:other_row.index("</tr>")]
    assert '<small class="mirror">+1 RoCEv2</small>' in other_row, other_row
    grid = when_ready(roce, security, "/console/flows?search=globex").text
    globex_row = grid[grid.index('<tr><th scope="row">globex</th>'):]
    globex_row = globex_row[:globex_row.index("</tr>")]
    assert globex_row.count('<small class="mirror">+1 RoCEv2</small>') == 1, globex_row  # its other-tenants cell


def test_the_flow_list_pages_the_mirrors_with_the_policy_flows(bare: Env) -> None:
    """Intra-tenant: web and db reach acme/gpu on udp/4791 (it exposes it), gpu reaches neither: gpu -> web and
    gpu -> db pass as mirrors, paged by the same offset and limit as the policy's flows."""
    from tests.api.conftest import activate_shipped_policy

    activate_shipped_policy(bare)
    pair = {"src_tenant": "acme", "dst_tenant": "acme"}
    full = bare.call("GET", "/v1/policy/flows", "security", params=pair).json()
    assert [(m["src_group"], m["dst_group"]) for m in full["mirrors"]] == [("gpu", "db"), ("gpu", "web")]
    assert full["mirrors_total"] == 2
    assert all(not (f["src_group"] == "gpu" and f["port"] == 4791) for f in full["items"])
    first = bare.call("GET", "/v1/policy/flows", "security", params={**pair, "limit": 1}).json()
    assert [m["dst_group"] for m in first["mirrors"]] == ["db"] and first["next_offset"] == 1
    last = bare.call("GET", "/v1/policy/flows", "security",
                     params={**pair, "limit": 1, "offset": full["total"] - 1}).json()
    assert full["total"] >= 2 and len(last["items"]) == 1 and last["mirrors"] == [] and last["next_offset"] is None
