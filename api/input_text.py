"""Text no field accepts, refused before a route runs: a NUL character anywhere in the path, the query or a JSON
body, and a JSON body that is not UTF-8.

PostgreSQL cannot store a NUL in a text column (psycopg raises DataError): a NUL that reached a lookup or an insert
(a grant id, a cursor, an audit filter, a justification) was a 500 there, and SQLite stored it. No identifier,
name or free text of this API has a use for one. RFC 8259 section 8.1: JSON exchanged between systems is UTF-8
(the standard library's parser also took UTF-16 and UTF-32 bodies). Checked on the raw text, so a request pays a
substring search of its query and, with a JSON body, one regular-expression scan of it; the body is parsed once.
"""

from __future__ import annotations

import json
import re
from collections.abc import MutableMapping
from typing import Any

from fastapi import HTTPException, Request

# `\u0000` preceded by an even number of backslashes (escaped backslashes): the escape of a NUL, never the
# six characters `\u0000` written as text (`\\u0000`). A raw NUL byte is not valid inside JSON at all.
_NUL_ESCAPE = re.compile(r"(?<!\\)(?:\\\\)*\\u0000")


def refuse_nul_in_url(scope: MutableMapping[str, Any]) -> None:
    """HTTPException 400 when the decoded path or the query string carries a NUL."""
    if "\x00" in scope.get("path", "") or b"%00" in scope.get("query_string", b""):
        raise HTTPException(400, "the URL carries a NUL character (%00), which no path or query parameter accepts")


def parse_json_body(body: bytes) -> Any:
    """The body parsed as JSON, UTF-8 only (a byte order mark is ignored) and without a NUL in any string;
    HTTPException 400 otherwise, json.JSONDecodeError (FastAPI's 422) when it is not JSON."""
    try:
        text = body.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise HTTPException(400, "the request body is not UTF-8 (JSON is exchanged in UTF-8, RFC 8259)") from None
    parsed = json.loads(text)
    if _NUL_ESCAPE.search(text) is not None:
        raise HTTPException(400, "a JSON string in the request body carries a NUL character (\\u0000), "
                                 "which no field accepts")
    return parsed


class CheckedRequest(Request):
    """A Request whose JSON body is parsed by parse_json_body (FastAPI reads a route's body through json())."""

    async def json(self) -> Any:
        if not hasattr(self, "_json"):
            self._json = parse_json_body(await self.body())
        return self._json
