"""Text another principal chose (a justification, a revocation or rejection reason, an approval comment, an audit
event's reason) reaches a person's terminal through `grant list|show`, `audit events` and every `show`: it is printed
as text. Before, a table cell was rich markup (`[/]` crashed the approver's `grant list`; `[link=...]`, `[bold]`
restyled or hid text) and control characters went out raw (ESC sequences retitle or clear the terminal, hide text,
write hyperlinks; a newline forged a line of `grant show`, e.g. an approval that was never given)."""

from __future__ import annotations

from typing import Any

import pytest

from cli.output import emit, emit_human
from cli.remote.audit import EVENTS
from cli.remote.grants import GRANTS, show_grant

HOSTILE = "ok\x1b]0;pwned\x07\x1b[2J\x9b31m\u202egnp.exe\r\n  approved as globex-admin by bob"
MARKUP = "[/] [link=https://evil.example]ticket[/link] [bold red]APPROVED BY SECURITY[/]"


def _grant(**over: Any) -> dict[str, Any]:
    g = {"id": "0192f5a0-0000-7000-8000-000000000001", "state": "revoked", "src_tenant": "acme", "src_group": "train",
         "dst_tenant": "globex", "dst_group": "api", "proto": "tcp", "ports": [8443], "ttl_seconds": 7200,
         "justification": HOSTILE, "requested_by": "alice", "requester_tenant": "acme",
         "created_at": "2026-12-02T08:00:00Z", "pending_approvers": [], "pending_until": None,
         "required_approvers": ["globex-admin"], "approvals": [], "expires_at": None,
         "reasons": [f"revoked: {MARKUP}", f"revoked: {HOSTILE}"], "notes": []}
    return {**g, **over}


def _assert_inert(out: str) -> None:
    assert not [c for c in out if c not in "\n" and (ord(c) < 32 or 0x7f <= ord(c) <= 0x9f)], repr(out)
    assert "\u202e" not in out, repr(out)
    assert "\n  approved as globex-admin" not in out, "a forged line"


def test_grant_show_prints_caller_text_as_text(capsys: pytest.CaptureFixture[str]) -> None:
    show_grant(_grant())
    out = capsys.readouterr().out
    _assert_inert(out)
    assert "\\x1b]0;pwned\\x07" in out and "\\r\\n  approved as" in out and MARKUP in out, out


def test_grant_list_table_shows_markup_literally_and_controls_escaped(capsys: pytest.CaptureFixture[str]) -> None:
    emit([_grant(reasons=[f"revoked: {MARKUP}"]), _grant(reasons=[f"revoked: {HOSTILE}"])], GRANTS)
    out = capsys.readouterr().out
    _assert_inert(out)
    assert "[/]" in out and "[link=https://evil.example]" in out and "[bold red]" in out, out


def test_audit_events_and_show_views(capsys: pytest.CaptureFixture[str]) -> None:
    event = {"seq": 7, "ts": "2026-12-02T08:00:00Z", "actor": {"id": f"x{HOSTILE}", "kind": "tenant", "tenant": "acme"},
             "tenant": "acme", "action": "grant.revoke", "object": {"type": "grant", "id": "g-1"},
             "reason": f"{MARKUP} {HOSTILE}"}
    emit([event], EVENTS)
    emit_human({"reason": HOSTILE, "comment": MARKUP})
    out = capsys.readouterr().out
    _assert_inert(out)
    assert "[/]" in out, out
