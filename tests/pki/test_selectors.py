"""Workload-attestation selectors: what a placement may carry, checked once for the file, the API and the agent."""

from __future__ import annotations

import pytest

from pki.errors import InvalidSelector
from pki.selectors import MAX_SELECTORS, normalize_selectors, parse_selector


@pytest.mark.parametrize(("text", "parsed"), [
    ("unix:uid:1001", ("unix", "uid", "1001")),
    ("unix:gid:0", ("unix", "gid", "0")),
    ("unix:user:svc_train", ("unix", "user", "svc_train")),
    ("unix:group:gpu-users", ("unix", "group", "gpu-users")),
    ("unix:path:/opt/train/bin/serve", ("unix", "path", "/opt/train/bin/serve")),
    ("unix:sha256:" + "a" * 64, ("unix", "sha256", "a" * 64)),
])
def test_accepted(text: str, parsed: tuple[str, str, str]) -> None:
    assert parse_selector(text) == parsed


@pytest.mark.parametrize(("text", "message"), [
    ("uid:1001", "must be unix:"),
    ("k8s:ns:default", "must be unix:"),
    ("unix:pid:1", "unknown unix selector 'pid'"),
    ("unix:uid:-1", "numeric user id"),
    ("unix:uid:01", "numeric user id"),
    ("unix:uid:4294967296", "numeric user id"),
    ("unix:user:Root User", "a user name"),
    ("unix:path:relative/bin", "absolute executable path"),
    ("unix:sha256:ABC", "SHA-256"),
    ("unix:uid:", "numeric user id"),
])
def test_refused_with_what_is_accepted(text: str, message: str) -> None:
    with pytest.raises(InvalidSelector, match=message):
        parse_selector(text)


def test_normalized_sorted_unique_and_bounded() -> None:
    assert normalize_selectors(["unix:uid:7", "unix:gid:5", "unix:uid:7"]) == ("unix:gid:5", "unix:uid:7")
    with pytest.raises(InvalidSelector, match=f"at most {MAX_SELECTORS}"):
        normalize_selectors([f"unix:uid:{i}" for i in range(MAX_SELECTORS + 1)])
