"""The log's fixed textual forms, shared by the writer (audit/service.py), the checkpoint note and the offline
verifier; kept apart from the service so that `audit verify` loads no database code."""

from __future__ import annotations

from datetime import UTC, datetime

GENESIS_HASH = "0" * 64  # the prev_hash of the first event


def format_ts(ts: datetime) -> str:
    """The one textual form of an event time: UTC, microseconds, 'Z'. isoformat, not strftime: strftime
    does not pad years below 1000, which fromisoformat then refuses."""
    return ts.astimezone(UTC).replace(tzinfo=None).isoformat(timespec="microseconds") + "Z"
