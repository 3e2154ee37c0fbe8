"""The policy package's errors; api/ maps them to HTTP status codes in one place."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from core.errors import Conflict, Forbidden, InvalidInput, TrustfabricError, Unavailable


@dataclass(frozen=True)
class SourceLocation:
    """One problem in one Rego module, located to the character."""

    file: str
    line: int
    col: int
    message: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line}:{self.col}: {self.message}"


class PolicyCompileError(InvalidInput):
    """A module does not parse or compile; every problem carries file:line:col."""

    def __init__(self, issues: list[SourceLocation]) -> None:
        self.issues = issues
        shown = "; ".join(str(i) for i in issues[:5])
        more = f" (+{len(issues) - 5} more)" if len(issues) > 5 else ""
        super().__init__(f"policy does not compile: {shown}{more}")

    def __reduce__(self) -> tuple[type[PolicyCompileError], tuple[list[SourceLocation]]]:
        return (PolicyCompileError, (self.issues,))  # crosses the policy sandbox's pipe intact


QUERY_PARSE_MESSAGE = "error(s) occurred while parsing query"  # OPA's message for a QueryParseError (400)


class QueryParseError(InvalidInput):
    """An ad-hoc query that does not parse: the caller's request is malformed (OPA answers 400 invalid_parameter,
    "error(s) occurred while parsing query"), unlike a query that parses and then fails to evaluate."""

    def __init__(self, issue: SourceLocation, message: str | None = None) -> None:
        self.issue = issue
        super().__init__(message or f"query does not parse: {issue.line}:{issue.col}: {issue.message}")

    def __reduce__(self) -> tuple[type[QueryParseError], tuple[SourceLocation]]:
        return (QueryParseError, (self.issue,))


QUERY_COMPILE_MESSAGE = "error(s) occurred while compiling query"  # OPA's message for an EmptyQuery (400)
EMPTY_QUERY = "empty query cannot be compiled"  # OPA's rego_compile_error for it (ast/compile.go)
QUERY_EXAMPLE = "data.flows.decision (a rule's value) or x := data.flows.decision.allow (bindings)"


class EmptyQuery(QueryParseError):
    """A query of nothing but blanks and comments. Each engine reported it as its parser's bare "expecting ..."
    at the first column; OPA parses it (to no expression) and refuses it when compiling: 400 invalid_parameter,
    "error(s) occurred while compiling query", rego_compile_error "empty query cannot be compiled". A
    QueryParseError still, for callers that tell a malformed query from one that failed to evaluate."""

    def __init__(self) -> None:
        super().__init__(SourceLocation("", 1, 1, EMPTY_QUERY),
                         f"the query is empty: give a Rego query, e.g. {QUERY_EXAMPLE}")

    def __reduce__(self) -> tuple[type[EmptyQuery], tuple[()]]:  # type: ignore[override]
        return (EmptyQuery, ())


def is_empty_query(query: str) -> bool:
    """True when `query` holds no expression: only blanks and `#` comments (what OPA's parser reads as none)."""
    return all(not line.strip() or line.lstrip().startswith("#") for line in query.splitlines())


def require_query(query: str) -> str:
    """`query` unchanged, or EmptyQuery: asked by every engine before it evaluates, so the answer is the same
    whichever engine serves (and costs a scan of the query's lines, nothing from the engine)."""
    if is_empty_query(query):
        raise EmptyQuery()
    return query


class PolicyEngineError(TrustfabricError):
    """The engine could not answer (evaluation error, server unreachable, timeout): callers deny."""

    http_status = 400  # a policy that does not evaluate (its rules, its data) is the uploader's to fix


class PolicyEngineUnavailable(PolicyEngineError, Unavailable):
    """The policy engine's server (OPA) cannot be reached or answered with a server error (HTTP 503)."""

    http_status = 503


class PolicyBudgetExceeded(InvalidInput):
    """Evaluating a policy went over a stated budget: the CPU time or memory of a policy job (policy/sandbox.py),
    or the time of a decision at activation (policy/budget.py). HTTP 422; the message names the budget and,
    where one was measured, the figure."""

    http_status = 422


class PolicyTestsFailed(Conflict):
    """A version whose Rego unit tests fail (or that carries none) cannot be activated; names the failing tests."""

    def __init__(self, failing: list[str], message: str | None = None) -> None:
        self.failing = failing
        super().__init__(message or "Rego unit tests failed: " + ", ".join(failing))


class PolicyInconsistent(Conflict):
    """A version whose `decision` (what explain shows) disagrees with its `allowed_flows` (what the devices enforce)
    on some flow cannot be activated (policy/consistency.py); names the first few flows (HTTP 409)."""


class TwoPersonRule(Forbidden):
    """With the two-person rule on, the uploader of a version cannot put it in force alone (HTTP 403)."""


class SignatureRequired(Forbidden):
    """Activation needs a valid security-team signature over the version's content hash."""


_LOC_RE = re.compile(r"-->\s*(?P<file>[^\n]+?):(?P<line>\d+):(?P<col>\d+)")
_MSG_RE = re.compile(r"^error:\s*(?P<msg>.+)$", re.MULTILINE)


def char_column(source: str, line: int, col: int) -> int:
    """The 1-based character column (an editor's, OPA's) of regorus's `col` on `line` of `source`: regorus
    counts a tab as four columns."""
    lines = source.splitlines()
    if not 1 <= line <= len(lines):
        return col
    width = 0
    for index, char in enumerate(lines[line - 1]):
        if width + 1 >= col:
            return index + 1
        width += 4 if char == "\t" else 1
    return len(lines[line - 1]) + 1 if width + 1 <= col else col


def located(issue: SourceLocation, modules: Mapping[str, str]) -> SourceLocation:
    """`issue` with its column counted in characters when its module is known."""
    source = modules.get(issue.file)
    if source is None:
        return issue
    return SourceLocation(issue.file, issue.line, char_column(source, issue.line, issue.col), issue.message)


def strip_backtrace(text: str) -> str:
    """Regorus appends a Rust stack backtrace to its messages; people need only the first part."""
    return text.split("Stack backtrace:")[0].strip()


def parse_regorus_error(text: str, default_file: str = "<query>") -> SourceLocation:
    """file:line:col and the message from a regorus error text (falls back to 1:1 when it names none)."""
    text = strip_backtrace(text)
    loc = _LOC_RE.search(text)
    msg = _MSG_RE.search(text)
    message = msg.group("msg").strip() if msg else (text.splitlines()[-1] if text else "unknown error")
    if loc:
        return SourceLocation(loc.group("file").strip(), int(loc.group("line")), int(loc.group("col")), message)
    return SourceLocation(default_file, 1, 1, message)
