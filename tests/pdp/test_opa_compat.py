"""`trustfabric pdp` answers as OPA's REST API reference says OPA answers (docs/rest-api.md of OPA), asked
over real HTTP with httpx as OPA's docs show the calls and with opa-python-client, the OPA client the
project depends on."""

from __future__ import annotations

import gzip
import json
import secrets
from collections.abc import Iterator
from urllib.parse import urlsplit

import httpx
import pytest
from opa_client.opa import OpaClient

from tests.policy.conftest import Served

MODULE = """package compat.{pkg}

allow if input.x == 1

servers := [{{"name": "app"}}, {{"name": "db"}}]

big := concat("", [s | some i in numbers.range(1, 300); s := "abcd"])
"""


@pytest.fixture
def compat(pdp: Served) -> Iterator[tuple[httpx.Client, str]]:
    """A client of the session PDP with a module of its own (a unique package, removed afterwards)."""
    pkg = "p" + secrets.token_hex(4)
    with httpx.Client(base_url=pdp.url, headers={"Authorization": f"Bearer {pdp.token}"}, timeout=10) as c:
        r = c.put(f"/v1/policies/{pkg}.rego", content=MODULE.format(pkg=pkg), headers={"Content-Type": "text/plain"})
        assert r.status_code == 200, r.text
        try:
            yield c, f"compat/{pkg}"
        finally:
            c.delete(f"/v1/policies/{pkg}.rego")


def test_get_takes_the_input_as_a_query_parameter(compat: tuple[httpx.Client, str]) -> None:
    c, path = compat
    assert c.get(f"/v1/data/{path}/allow", params={"input": '{"x": 1}'}).json() == {"result": True}
    assert c.get(f"/v1/data/{path}/allow", params={"input": '{"x": 2}'}).json() == {}
    bad = c.get(f"/v1/data/{path}/allow", params={"input": "{not json"})
    assert bad.status_code == 400 and bad.json()["code"] == "invalid_parameter"
    assert "malformed input document" in bad.json()["message"]


def test_post_without_input_warns_and_a_body_not_an_object_is_refused(compat: tuple[httpx.Client, str]) -> None:
    c, path = compat
    warning = {"code": "api_usage_warning", "message": "'input' key missing from the request"}
    assert c.post(f"/v1/data/{path}/servers/0/name", json={}).json() == {"result": "app", "warning": warning}
    assert c.post(f"/v1/data/{path}/allow").json() == {"warning": warning}  # empty body: undefined input
    assert "warning" not in c.post(f"/v1/data/{path}/allow", json={"input": {"x": 1}}).json()
    bad = c.post(f"/v1/data/{path}/allow", json=[1])
    assert bad.status_code == 400 and bad.json()["code"] == "invalid_parameter"


def test_integer_path_segments_index_arrays(compat: tuple[httpx.Client, str]) -> None:
    c, path = compat
    assert c.get(f"/v1/data/{path}/servers/1/name").json() == {"result": "db"}
    assert c.get(f"/v1/data/{path}/servers/7").json() == {}


def test_pretty_metrics_and_provenance(compat: tuple[httpx.Client, str]) -> None:
    c, path = compat
    pretty = c.post(f"/v1/data/{path}/allow?pretty=true", json={"input": {"x": 1}})
    assert pretty.text == '{\n  "result": true\n}\n' and pretty.headers["content-type"] == "application/json"
    for flag in ("metrics=true", "metrics", "instrument=true"):
        body = c.post(f"/v1/data/{path}/allow?{flag}", json={"input": {"x": 1}}).json()
        assert body["result"] is True and body["metrics"]["timer_rego_query_eval_ns"] >= 0, flag
    assert "metrics" not in c.post(f"/v1/data/{path}/allow?metrics=false", json={"input": {"x": 1}}).json()
    prov = c.get(f"/v1/data/{path}/allow", params={"provenance": "", "input": '{"x": 1}'}).json()
    assert prov["result"] is True and prov["provenance"]["version"].startswith("trustfabric-")
    assert {"build_commit", "build_timestamp", "build_hostname"} <= prov["provenance"].keys()


def test_default_decision_at_the_root(compat: tuple[httpx.Client, str]) -> None:
    c, _path = compat
    missing = c.post("/", json={"user": "alice"})
    assert missing.status_code == 404
    assert missing.json() == {"code": "undefined_document", "message": "document missing: data.system.main"}
    main = 'package system\n\nmain := sprintf("hello, %v", [input.user])\n'
    put = c.put("/v1/policies/system-main.rego", content=main, headers={"Content-Type": "text/plain"})
    assert put.status_code == 200
    try:
        r = c.post("/", json={"user": "alice"})
        assert r.status_code == 200 and r.json() == "hello, alice"
    finally:
        c.delete("/v1/policies/system-main.rego")


def test_gzip_and_yaml_bodies_and_gzip_answers(compat: tuple[httpx.Client, str]) -> None:
    c, path = compat
    zipped = gzip.compress(json.dumps({"input": {"x": 1}}).encode())
    r = c.post(f"/v1/data/{path}/allow", content=zipped,
               headers={"Content-Encoding": "gzip", "Content-Type": "application/json"})
    assert r.json() == {"result": True}
    broken = c.post(f"/v1/data/{path}/allow", content=b"\x1f\x8bnot gzip", headers={"Content-Encoding": "gzip"})
    assert broken.status_code == 400 and broken.json()["code"] == "invalid_parameter"
    r = c.post(f"/v1/data/{path}/allow", content=b"input:\n  x: 1\n", headers={"Content-Type": "application/yaml"})
    assert r.json() == {"result": True}
    big = c.get(f"/v1/data/{path}/big", headers={"Accept-Encoding": "gzip"})
    assert big.headers.get("content-encoding") == "gzip" and big.json() == {"result": "abcd" * 300}
    small = c.get(f"/v1/data/{path}/allow", params={"input": '{"x": 1}'}, headers={"Accept-Encoding": "gzip"})
    assert "content-encoding" not in small.headers  # under OPA's 1024-byte minimum


def test_query_api_get_and_empty_result(compat: tuple[httpx.Client, str]) -> None:
    c, path = compat
    pkg = path.replace("/", ".")
    assert c.get("/v1/query", params={"q": f"data.{pkg}.servers[i].name = n"}).json() == {
        "result": [{"i": 0, "n": "app"}, {"i": 1, "n": "db"}]}
    assert c.get("/v1/query", params={"q": "1 == 2"}).json() == {}  # OPA omits an empty result set
    assert c.post("/v1/query", json={"query": "1 == 2"}).json() == {}
    missing = c.get("/v1/query")
    assert missing.status_code == 400 and missing.json()["message"] == "missing parameter 'q'"


def test_query_api_answers_a_syntax_error_400_and_an_evaluation_error_500(compat: tuple[httpx.Client, str]) -> None:
    """OPA's Query API answers a query that does not parse with 400 invalid_parameter, "error(s) occurred while
    parsing query" and the rego_parse_error located in the query; the PDP answered 500 internal_error, as for a
    query that parses and then fails to evaluate, which stays 500."""
    c, _path = compat
    for bad in (c.get("/v1/query", params={"q": "x := 1 +"}), c.post("/v1/query", json={"query": "data.compat["})):
        assert bad.status_code == 400, bad.text
        body = bad.json()
        assert body["code"] == "invalid_parameter" and body["message"] == "error(s) occurred while parsing query"
        [err] = body["errors"]
        assert err["code"] == "rego_parse_error" and err["message"] and err["location"]["row"] == 1
    failing = c.post("/v1/query", json={"query": "x := 1 / 0"})
    assert failing.status_code == 500 and failing.json()["code"] == "internal_error", failing.text


def test_opa_python_client(pdp: Served, compat: tuple[httpx.Client, str]) -> None:
    """The calls an OPA user's code makes through opa-python-client, unchanged."""
    _c, path = compat
    parts = urlsplit(pdp.url)
    client = OpaClient(host=parts.hostname, port=parts.port, token=pdp.token, timeout=10)
    try:
        assert client.check_health() and client.check_health(query={"bundles": True})
        assert client.check_health(query={"plugins": True})
        package = path.replace("/", ".")
        assert client.query_rule({"x": 1}, package, "allow") == {"result": True}
        assert client.query_rule({"x": 2}, package, "allow") == {}
        pretty = client.query_rule({"x": 1}, package, "allow", query_params={"provenance": True, "metrics": True})
        assert pretty["result"] is True and "provenance" in pretty and "metrics" in pretty
        assert client.ad_hoc_query("1 == 2") == {}
        assert client.get_data(f"{path}/servers/0/name") == {"result": "app"}
    finally:
        client.close_connection()


def test_an_input_nested_too_deep_is_a_400_not_a_500(compat: tuple[httpx.Client, str]) -> None:
    """A deeply nested input answered 500 (a plain-text 'Internal Server Error' and a RecursionError traceback in
    the log past ~1,000 levels; the engine's 'recursion limit exceeded' as internal_error past 127): bad input is
    the caller's, refused with OPA's 400 invalid_parameter and its message; up to 127 levels evaluates."""
    c, path = compat
    ok = "[" * 127 + "]" * 127
    assert c.post(f"/v1/data/{path}/allow", content='{"input": ' + ok + "}").json() == {}
    assert c.get(f"/v1/data/{path}/allow", params={"input": ok}).json() == {}
    for depth in (128, 5_000, 100_000):
        deep = "[" * depth + "]" * depth
        for r in (c.post(f"/v1/data/{path}/allow", content='{"input": ' + deep + "}"),
                  c.post("/v1/query", content='{"query": "x = 1", "input": ' + deep + "}"),
                  c.post("/", content=deep),
                  c.post(f"/v1/data/{path}/allow", content="input: " + deep,
                         headers={"Content-Type": "application/yaml"})):
            assert r.status_code == 400, (depth, r.status_code, r.text[:200])
            assert r.json()["code"] == "invalid_parameter" and "nested deeper than 127 levels" in r.json()["message"]
    r = c.get(f"/v1/data/{path}/allow", params={"input": "[" * 5_000 + "]" * 5_000})
    assert r.status_code == 400 and "nested deeper" in r.json()["message"], r.text[:200]


def test_an_unknown_path_or_method_is_answered_as_opa_answers(pdp: Served, compat: tuple[httpx.Client, str]) -> None:
    """OPA routes with Go's http.ServeMux (open-policy-agent/opa v1/server/server.go, initRouters): a path it has
    no route for gets the mux's `404 page not found` (text/plain, nosniff); a method its API paths (/v1/data,
    /v1/policies, /v1/query and below) do not take, their catch-all routes' bare 405 (writer.HTTPStatus: no
    body); another path's wrong method, the mux's 405 `Method Not Allowed` with Allow. The PDP answered
    FastAPI's JSON {"detail": "Not Found"} (and "Method Not Allowed"), which no OPA client expects. With a token
    configured, a caller without it learns nothing of what is served (OPA's authorization runs before its
    router)."""
    c, _path = compat
    for path in ("/nope", "/v1/nope", "/v2/data/x", "/v1/datax", "/openapi.json", "/docs"):
        r = c.get(path)
        assert r.status_code == 404 and r.text == "404 page not found\n", (path, r.status_code, r.text)
        assert r.headers["content-type"] == "text/plain; charset=utf-8", path
        assert r.headers["x-content-type-options"] == "nosniff", path
    for method, path in (("POST", "/v1/policies"), ("PATCH", "/v1/policies/x.rego"), ("DELETE", "/v1/data"),
                         ("PUT", "/v1/query"), ("GET", "/v1/query/x"), ("OPTIONS", "/v1/data/a/b")):
        r = c.request(method, path)
        assert r.status_code == 405 and r.content == b"", (method, path, r.status_code, r.text)
        assert "content-type" not in r.headers, (method, path, r.headers)
    for method, path, allow in (("PUT", "/", "POST"), ("POST", "/health", "GET")):
        r = c.request(method, path)
        assert r.status_code == 405 and r.text == "Method Not Allowed\n", (method, path, r.text)
        assert r.headers["allow"] == allow and r.headers["content-type"] == "text/plain; charset=utf-8"
    for method, path in (("GET", "/nope"), ("PUT", "/"), ("GET", "/v1/query/x")):
        r = httpx.request(method, pdp.url + path, timeout=10)  # no token
        assert r.status_code == 401 and r.json()["code"] == "unauthorized", (method, path, r.text)
    assert httpx.get(pdp.url + "/health", timeout=10).status_code == 200  # /health still needs none


def test_an_empty_query_is_refused_as_opa_refuses_it(compat: tuple[httpx.Client, str]) -> None:
    """OPA parses an empty query (blanks, comments: no expression) and refuses it when compiling
    (v1/ast/compile.go, queryCompiler.Compile): 400 invalid_parameter "error(s) occurred while compiling query",
    rego_compile_error "empty query cannot be compiled", no location; a POST body without "query" asks that
    query. The PDP answered the engine parser's bare "expecting ..." as a parse error (and refused the body)."""
    c, _path = compat
    expected = {"code": "invalid_parameter", "message": "error(s) occurred while compiling query",
                "errors": [{"code": "rego_compile_error", "message": "empty query cannot be compiled"}]}
    for r in (c.get("/v1/query?q="), c.get("/v1/query", params={"q": "  \n# only a comment\n"}),
              c.post("/v1/query", json={"query": ""}), c.post("/v1/query", json={"input": {"x": 1}})):
        assert r.status_code == 400 and r.json() == expected, (r.request.url, r.text)
    assert c.get("/v1/query", params={"q": "x := 1 # and a comment"}).json() == {"result": [{"x": 1}]}


def test_opa_python_client_lists_policies(pdp: Served, compat: tuple[httpx.Client, str]) -> None:
    """opa-python-client's check_connection, get_policies_list and get_policies_info ask `GET /v1/policies/` (a
    trailing slash), which OPA answers with its policies; the PDP stopped redirecting a trailing slash (OPA does not
    redirect either) and its catch-all for OPA's API paths answered that path with a bare 405."""
    _c, path = compat
    parts = urlsplit(pdp.url)
    client = OpaClient(host=parts.hostname, port=parts.port, token=pdp.token, timeout=10)
    try:
        assert client.check_connection()
        module = path.split("/")[-1] + ".rego"
        assert module in client.get_policies_list()
        assert client.get_policies_info()
    finally:
        client.close_connection()
