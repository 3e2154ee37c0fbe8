"""Policy engines: one `PolicyEngine` protocol, its implementations in sibling modules, and the one place
that chooses between them (`make_engine`).

- `embedded` (`RegorusEngine`): regorus in-process, the default; ~100 µs a decision. Its hot entry points (the
  grant, flow and authorization decisions) are answered by regorus's compiled VM where that is exact
  (`rvm.Accelerator`; `EngineSettings.vm`, `TRUSTFABRIC_REGO_VM=auto|off`), the interpreter otherwise.
- `opa_server` (`OpaServerEngine`): a production OPA server (or `trustfabric pdp`) over its REST API.

Which engine serves which role is decided here and nowhere else:
- the serving roles (`grants`: grant requests under the active version; `pdp`: the OPA-compatible
  server's engine; `enforcer`: the reconciler's allowed flows under the active version) follow
  `EngineSettings.kind` (`TRUSTFABRIC_POLICY_ENGINE=embedded|opa`); each role
  gets its own module prefix on an OPA server, so one role's load never deletes another's modules;
- `authz` (the API's own access policy, `rego/api_authz.rego`, shipped code asked on every request)
  follows `EngineSettings.authz_kind` (embedded by default: no network hop and no extra failure mode on
  the path of every request; an active version that also ships `api_authz.rego` would otherwise clash
  with it on a shared OPA server);
- `scratch` engines (impact reports, explain, Rego unit tests) evaluate versions under review side by
  side with the active one, which one OPA namespace cannot hold: always embedded.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol, runtime_checkable

from core.errors import InvalidInput
from policy.engines.patch import (
    PatchOp,
    apply_patch,
    diff_documents,
    pointer_parts,
    split_rule_path,
    to_pointer,
)

EngineKind = Literal["embedded", "opa"]
ENGINE_KINDS: tuple[str, ...] = ("embedded", "opa")
ServingRole = Literal["grants", "pdp", "authz", "enforcer"]


@runtime_checkable
class PolicyEngine(Protocol):
    """Evaluates Rego queries against a set of modules and one data document; thread-safe."""

    def load(self, modules: Mapping[str, str], data: Mapping[str, Any] | None = None) -> None:
        """Replace every module (and the data, when given); a module that does not compile raises
        PolicyCompileError with file:line:col and the previous modules stay in force."""

    def set_data(self, data: Mapping[str, Any]) -> None:
        """Replace the whole data document."""

    def patch_data(self, ops: Sequence[PatchOp]) -> None:
        """Apply RFC 6902 add/replace/remove operations, all or nothing; a bad operation raises InvalidInput."""

    def data(self) -> Mapping[str, Any]:
        """The data document currently in force (do not mutate it)."""

    def modules(self) -> dict[str, str]:
        """The modules currently loaded, path -> Rego text."""

    def evaluate(self, query: str, input: Any = None) -> Any:
        """The value of a rule path (`data.flows.decision`) or expression; None when undefined;
        PolicyEngineError on any failure (the caller denies)."""

    def evaluate_many(self, query: str, inputs: Sequence[Any]) -> list[Any]:
        """`evaluate` for each input, in order; PolicyEngineError if any evaluation fails."""

    def close(self) -> None:
        """Release connections and threads; the engine is unusable afterwards."""

    def warm(self) -> None:
        """Prepare what this thread's next evaluation would otherwise prepare first; PolicyEngineError if that
        fails."""

    def query(self, query: str, input: Any = None) -> list[dict[str, Any]]:
        """OPA-style ad-hoc query: one dict of variable bindings per result; [] when undefined;
        QueryParseError when the query does not parse, PolicyEngineError on any other failure."""


@dataclass(frozen=True)
class EngineSettings:
    """Which engine serves each role; the OPA server's address and credentials when one is used."""

    kind: str = "embedded"  # grants, pdp
    authz_kind: str = "embedded"  # the API's own authorization policy
    opa_url: str = "http://127.0.0.1:8181"
    opa_token: str | None = None
    opa_ca_bundle: str | None = None
    opa_timeout: float = 2.0
    vm: str = "auto"  # auto: the embedded serving engines answer their hot entry points through the compiled VM

    def check(self) -> None:
        from policy.engines.rvm import VM_MODES

        for name, value in (("policy engine", self.kind), ("authorization engine", self.authz_kind)):
            if value not in ENGINE_KINDS:
                raise InvalidInput(f"unknown {name} {value!r} (use {' or '.join(ENGINE_KINDS)})")
        if self.vm not in VM_MODES:
            raise InvalidInput(f"unknown rego VM mode {self.vm!r} (use {' or '.join(VM_MODES)})")


def make_engine(
    settings: EngineSettings, role: ServingRole, modules: Mapping[str, str] | None = None,
    data: Mapping[str, Any] | None = None,
) -> PolicyEngine:
    """The engine configured for `role`, loaded with `modules` and `data` when given."""
    settings.check()
    kind = settings.authz_kind if role == "authz" else settings.kind
    engine: PolicyEngine
    if kind == "opa":
        from policy.engines.opa_server import OpaServerEngine, OpaSettings

        engine = OpaServerEngine(OpaSettings(
            url=settings.opa_url, token=settings.opa_token, ca_bundle=settings.opa_ca_bundle,
            timeout=settings.opa_timeout, prefix=f"trustfabric/{role}",
        ))
    else:
        from policy.engines.embedded import RegorusEngine
        from policy.engines.rvm import Accelerator

        engine = RegorusEngine(accelerator=Accelerator() if settings.vm == "auto" else None)
    if modules is not None or data is not None:
        engine.load(modules or {}, data)
    return engine


def scratch_engine(modules: Mapping[str, str] | None = None, data: Mapping[str, Any] | None = None) -> PolicyEngine:
    """An embedded engine for a computation on versions under review (impact, explain): never shared."""
    from policy.engines.embedded import RegorusEngine

    return RegorusEngine(modules, data)


__all__ = [
    "ENGINE_KINDS",
    "EngineKind",
    "EngineSettings",
    "PatchOp",
    "PolicyEngine",
    "apply_patch",
    "diff_documents",
    "make_engine",
    "pointer_parts",
    "scratch_engine",
    "split_rule_path",
    "to_pointer",
]
