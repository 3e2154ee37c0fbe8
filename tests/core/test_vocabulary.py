"""The vocabulary is defined once (core/vocabulary.py) and everything else derives from it: the API's
schemas and query patterns, the CLI's help, the tokens a role may carry, the slug rule."""

from __future__ import annotations

import re
import typing

from api.routes.grants import STATE_PATTERN
from api.schemas import GrantOut, TokenCreate
from core.slugs import is_slug, require_slug
from core.vocabulary import GRANT_STATE_PATTERN, GRANT_STATES, MINTABLE_ROLES, ROLES, SLUG_PATTERN, TENANT_ROLES


def test_roles() -> None:
    assert ROLES == ("admin", "security", "tenant-admin", "tenant-member", "auditor", "node", "workload")
    assert ROLES[:5] == MINTABLE_ROLES and set(ROLES) >= TENANT_ROLES
    assert typing.get_args(TokenCreate.model_fields["role"].annotation) == MINTABLE_ROLES


def test_grant_states_everywhere_are_the_same_states() -> None:
    assert typing.get_args(GrantOut.model_fields["state"].annotation) == GRANT_STATES
    assert STATE_PATTERN == GRANT_STATE_PATTERN
    assert [s for s in GRANT_STATES if re.fullmatch(GRANT_STATE_PATTERN, s)] == list(GRANT_STATES)
    assert not re.fullmatch(GRANT_STATE_PATTERN, "activex")


def test_slugs_are_dns_labels() -> None:
    for good in ("a", "acme", "acme-2", "a" * 63, "0x"):
        assert is_slug(good) and re.fullmatch(SLUG_PATTERN, good)
    for bad in ("", "-a", "a-", "A", "a_b", "a" * 64, "a.b"):
        assert not is_slug(bad)
    assert require_slug("acme", "tenant") == "acme"
