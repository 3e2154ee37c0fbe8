"""The PDP tests use the policy tests' served PDP (one per session) and OPA fixtures."""

from tests.policy.conftest import opa_url, pdp  # noqa: F401  (fixtures, by name)
