"""The reconciler: every device's desired rule set computed from the database, published only where it changed.

Inputs, read in one snapshot together with the audit log's size at that moment (the marker): the fabric
(`enforcer.fabric_db.compile_fabric_of`), the active policy version, the policy data document
(`policy.data.build_data` at now) and the revoked identities in it. The active version's
`data.flows.allowed_flows` is evaluated on the configured engine (kept loaded; its data patched
incrementally) and compiled: from scratch when the fabric or the budget changed or no compile is kept (a
start), else incrementally (`enforcer.compiler.recompile`) against the compile kept in memory.

When it runs:
- `wake()`: right after a change commits in this process (the API wakes it after every successful write);
- `due()`, every `poll_seconds`: one read of the audit log's size. When events were appended since the last
  run and one of them is not known to leave the inputs alone (`IRRELEVANT`), it runs: a change committed
  by another process or replica is picked up within a poll. Every state change commits with its audit
  event (the project's invariant; tests/audit/test_every_mutation_audited.py holds every route to it), so
  the log's size fingerprints every row the reconciler reads, exactly, across processes and on both
  databases, for one indexed read (the one-statement data fingerprint of policy/data.py is SQLite-only and
  reads every row);
- at the next grant expiry (the earliest `expires_at` in the data document): expiry writes no row;
- from scratch every `resync_seconds`, as a safety net.

Failing safe: no active policy version compiles to default deny everywhere (nothing is allowed); an engine
error or a malformed answer publishes nothing (every device keeps its last good rule set); a rule set over
budget is compiled to fit by withholding the entries of the tenants furthest over their fair share of the device
(enforcer.fairshare: fail closed, named in the version's cause, the outcome and one `enforcer.withhold` event per
change), so one tenant's grants filling a leaf cost that tenant its newest flows there and hold back nobody
else's change; only a device that cannot fit that way is not published and keeps its last good set, held (its
compile is its pending plan, audited once), while every other device is published (an explicit `enforcer apply`
of such a device still publishes nothing; one that fits is applied fitted, as a run publishes it). Each is
logged and kept in `last` (and printed by `trustfabric enforcer compile`).

Publishing (auto mode) is one transaction that first locks the audit log's head and checks that no
relevant event was appended since the inputs were read; if one was, the inputs are read again and the
compile redone, so a publisher never overwrites a newer publication with an older compile (two replicas
may run this at once). In manual mode, and for a device pinned by a rollback, a changed rule set is held as
the device's pending plan until `trustfabric enforcer apply` publishes it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

from sqlmodel import Session, col, select

from audit import Actor, record
from audit.service import changes_since, lock_head, size_and_events_since, tree_size
from core.clock import Clock, system_clock
from core.errors import Conflict, InvalidInput, NotFound
from enforcer import service
from enforcer.compiler import Budget, Compiled, all_devices, compile_fabric, recompile
from enforcer.errors import BudgetExceeded
from enforcer.fabric import Fabric
from enforcer.fabric_db import compile_fabric_of
from enforcer.fairshare import Fit, fit_device
from enforcer.ir import DeviceRuleSet
from policy.data import build_data, live_until, to_ns
from policy.decide import ALLOWED_FLOWS_QUERY, sync_data
from policy.engines import PolicyEngine
from policy.errors import PolicyEngineError
from policy.flowset import UNRELATED
from policy.impact import answer_under
from policy.models import PolicyVersion
from store.db import Database, log_failure

log = logging.getLogger("trustfabric.enforcer")

MODES = ("auto", "manual")
# Audit actions whose changes never reach the reconciler's inputs (policy.flowset.UNRELATED: issuing
# credentials, the enforcer's events, uploads of candidate versions, exports). Anything else, including an
# action added later, makes it run.
IRRELEVANT = UNRELATED
# Relevant actions that cannot change the compiled fabric (`compile_fabric_of`: topology, addressing,
# placements): after only these, the fabric read last time is reused. Anything else rereads it.
LEAVE_FABRIC = ("grant.", "policy.", "group.", "tenant.quarantine", "tenant.unquarantine", "workload.revoke",
                "workload.register", "identity.", "svid.revoke")
MAX_ATTEMPTS = 5


def relevant(action: str) -> bool:
    return not action.startswith(IRRELEVANT)


@dataclass(frozen=True)
class EnforcerConfig:
    mode: str = "auto"
    budget: Budget = field(default_factory=Budget)
    poll_seconds: float = 0.5
    resync_seconds: float = 300.0

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise InvalidInput(f"enforcer mode must be auto or manual, not {self.mode!r}")


@dataclass(frozen=True)
class Inputs:
    marker: int  # the audit log's size when these were read
    now: datetime
    fabric: Fabric
    policy_hash: str | None
    allowed: Any  # the compact data.flows.allowed_flows (None: idle, see Reconciler._read)
    revoked: frozenset[str]
    expiry_ns: int | None  # the earliest grant expiry in the data document
    events: tuple[tuple[str, str], ...]  # relevant (action, object id) since the previous run, for the cause


@dataclass
class Outcome:
    cause: str
    full: bool = False
    changed: list[str] = field(default_factory=list)  # devices whose compiled rule set changed
    published: dict[str, int] = field(default_factory=dict)  # device -> new version
    held: list[str] = field(default_factory=list)  # devices whose pending plan changed
    retired: list[str] = field(default_factory=list)
    compile_seconds: float = 0.0
    error: str | None = None
    # devices over budget compiled to fit: device -> [{tenant, entries, cost}] withheld (enforcer.fairshare)
    withheld: dict[str, list[dict[str, Any]]] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"cause": self.cause, "full": self.full, "changed": self.changed, "published": self.published,
                "held": self.held, "retired": self.retired, "compile_seconds": round(self.compile_seconds, 4),
                "error": self.error, "withheld": self.withheld}


class Stale(Exception):
    """A relevant change committed between reading the inputs and publishing: read and compile again."""


def _scan(session: Session, since: int, until: int, limit: int) -> tuple[list[tuple[str, str]], bool]:
    """(relevant (action, object id) of the events from `since`, whether every event up to `until` was seen)."""
    events, complete = changes_since(session, since, until, limit)
    return [e for e in events if relevant(e[0])], complete


def _cause(events: Iterable[tuple[str, str]]) -> str:
    items = list(dict.fromkeys(f"{a} {o}" for a, o in events))
    if not items:
        return ""
    return "; ".join(items[:5]) + (f"; +{len(items) - 5} more" if len(items) > 5 else "")


class Reconciler:
    """One per process. `run_once` is serialized by a lock, so the background loop, a request that wakes it
    and a CLI command can share one instance."""

    def __init__(self, db: Database, *, engine_factory: Callable[[], PolicyEngine], config: EnforcerConfig,
                 clock: Clock = system_clock, actor: Actor | None = None,
                 on_publish: Callable[[list[str]], None] | None = None) -> None:
        self.db = db
        self.config = config
        self.clock = clock
        self.actor = actor or Actor.system("enforcer")
        self.on_publish = on_publish
        self._factory = engine_factory
        self._engine: PolicyEngine | None = None
        self._policy_hash: str | None = None
        self._loaded = False
        self._compiled: Compiled | None = None
        self._fabric: Fabric | None = None
        self._marker = -1
        self._expiry_ns: int | None = None
        self._last_full = 0.0
        self._data_stale = False  # the engine's data document missed changes while idle: rebuild it
        self._idle = False  # no device in the fabric and none compiled for (see _read)
        self._run_lock = threading.Lock()
        self._wake = threading.Event()
        self.last: Outcome | None = None
        self.runs = 0
        # device -> (its compiled set's hash/its limit, its published set's hash, the fit): enforcer.fairshare, _fit
        self._fits: dict[str, tuple[str, str | None, Fit]] = {}
        self.fits: dict[str, Fit] = {}  # the last compile_now's (plan)
        self._warned: dict[str, str] = {}  # device -> the withheld note last logged for it (_warn)

    # ---------------------------------------------------------------- when

    def wake(self, *, fabric: bool = True) -> None:
        """Run soon (from the loop of `serve`): something committed in this process. `fabric=False`: the change
        cannot change the fabric (a grant's, an identity's): while idle (no device), nothing can come of it, so
        no look is taken (the poll still moves past it)."""
        if fabric or not self._idle:
            self._wake.set()

    def due(self) -> str | None:
        """Why a run is due now (None: nothing to do). Cheap: one statement reads the audit log's size and the
        events after the marker (on every replica after every write: issue 11)."""
        if self._marker < 0:
            return "start"
        now = self.clock()
        if self._expiry_ns is not None and to_ns(now) >= self._expiry_ns:
            return "grant expiry"
        if time.monotonic() - self._last_full >= self.config.resync_seconds:
            return "periodic resync"
        with self.db.statement() as conn:  # the size and the events after the marker: one statement
            size, seen = size_and_events_since(conn, self._marker, 10_000)
        if size == self._marker:
            return None
        complete = len(seen) == size - self._marker
        events = [(a, o) for a, o, _leaf in seen if relevant(a)]
        if not complete:
            return _cause(events) or f"{size - self._marker} changes"
        if not events or self._idle_past(events):
            self._marker = size  # nothing the inputs depend on: move past it
            return None
        return _cause(events)

    def _idle_past(self, events: list[tuple[str, str]]) -> bool:
        """Whether these (complete) events leave an idle reconciler idle: no device in the fabric, none compiled
        for, and none of them can change the fabric (a run would read nothing and compile nothing, _read)."""
        compiled, fabric = self._compiled, self._fabric
        if compiled is None or compiled.devices or fabric is None or all_devices(fabric):
            return False
        if all(a.startswith(LEAVE_FABRIC) for a, _ in events):
            self._data_stale = self._idle = True
            return True
        return False

    def serve(self, stop: threading.Event) -> None:
        """Until `stop` is set: look whether a run is due every poll_seconds, and at once when woken (a wake
        after an SVID issuance finds nothing relevant and costs one read, like a poll)."""
        while not stop.is_set():
            self._wake.wait(self.config.poll_seconds)
            self._wake.clear()
            if stop.is_set():
                return
            try:
                cause = self.due()
                if cause is not None:
                    self.run_once(cause)
            except Exception:
                log_failure(log, "enforcer reconcile failed; retrying on the next poll")

    # ---------------------------------------------------------------- what

    def run_once(self, cause: str = "run", *, full: bool = False) -> Outcome:
        """Compile from the database and publish (auto mode) or hold (manual mode, pinned devices) what changed."""
        return self._run(cause, full=full, select=None, unpin=(), force=False)

    def apply(self, devices: Collection[str] | None = None, *, actor: Actor | None = None,
              request_id: str | None = None) -> Outcome:
        """`enforcer apply`: compile now and publish every changed device (or only `devices`, which are unpinned
        too); pinned devices not named stay pinned."""
        for d in devices or ():
            service.check_device(d)
        return self._run("enforcer apply", full=False, select=set(devices) if devices else None,
                         unpin=set(devices or ()), force=True, actor=actor, request_id=request_id)

    def compile_now(self) -> tuple[Compiled, Inputs]:
        """A fresh compile of the current inputs, publishing nothing (kept as the base of the next incremental
        compile; the marker stays, so the changes it includes are still published by the next run)."""
        with self._run_lock:
            inputs = self._read()
            compiled, _full = self._compile(inputs, False)
            fits = self._fit(compiled)
            out = fitted(compiled, fits)  # a device that cannot fit: BudgetExceeded, as it always did
            self._compiled = compiled
            self.fits = fits
            return out, inputs

    def _fit(self, compiled: Compiled) -> dict[str, Fit]:
        """fit_over_budget, its fits kept across runs: a device that stays over is not fitted again on every run."""
        return fit_over_budget(self.db, compiled, self._fits)

    @property
    def compiled(self) -> Compiled | None:
        """The last compile, before fitting (the base of the next incremental one); None before the first."""
        return self._compiled

    def _warn(self, fits: Mapping[str, Fit]) -> None:
        """Log what a fitted device withholds once per change, not on every run (a device that stays over its
        budget logged the same warning every poll)."""
        notes = {d: f.note() for d, f in fits.items() if f.rules is not None}
        for d, note in sorted(notes.items()):
            if self._warned.get(d) != note:
                log.warning("enforcer: %s %s", d, note)
        self._warned = notes

    @staticmethod
    def _fitted(compiled: Compiled, fits: dict[str, Fit]) -> Compiled:
        """The compile with each device that fits by withholding in place of its over-budget set."""
        if not fits:
            return compiled
        return replace(compiled, devices={**compiled.devices, **{d: f.rules for d, f in fits.items()
                                                                  if f.rules is not None}})

    def close(self) -> None:
        if self._engine is not None:
            self._engine.close()
            self._engine = None
            self._loaded = False

    def _run(self, cause: str, *, full: bool, select: set[str] | None, unpin: Collection[str], force: bool,
             actor: Actor | None = None, request_id: str | None = None) -> Outcome:
        with self._run_lock:
            outcome = Outcome(cause)
            for _attempt in range(MAX_ATTEMPTS):
                try:
                    inputs = self._read(idle_ok=not (full or force or select is not None))
                    if inputs.allowed is None:  # no device, none compiled for: nothing to compile or publish
                        assert self._compiled is not None
                        if select is not None:
                            _check_in_fabric(select, {})
                        self._keep(self._compiled, inputs)
                        break
                    start = time.perf_counter()
                    compiled, was_full = self._compile(inputs, full)
                    outcome = Outcome(_cause(inputs.events) or cause, was_full,
                                      list(compiled.changed if not was_full else compiled.devices),
                                      compile_seconds=time.perf_counter() - start)
                    fits = self._fit(compiled)
                    unfit = [o for o in compiled.over if fits[o.device].rules is None]
                    over = {o.device for o in unfit}
                    if over and force and (select is None or over & select):
                        raise BudgetExceeded(unfit)  # an operator's apply: all or nothing, as asked
                    outcome.withheld = {d: [{k: w[k] for k in ("tenant", "entries", "cost")}
                                            for w in f.summary()["withheld"]]
                                        for d, f in fits.items() if f.rules is not None and f.withheld}
                    self._warn(fits)
                    self._publish(compiled, inputs, outcome, select=select, unpin=unpin, force=force,
                                  actor=actor or self.actor, request_id=request_id,
                                  skip={o.device: f"over budget: {o}" for o in unfit}, fits=fits)
                    if over:
                        # Only the devices that cannot fit keep their last good rule set. Holding every device
                        # back for one of them let a tenant whose grants filled one leaf stop every other change,
                        # a revocation or a quarantine included, from reaching any device.
                        outcome.error = (f"{BudgetExceeded(unfit)}; withholding the entries of the tenants over "
                                         "their fair share is not enough: those devices keep their last good rule "
                                         "set (held: their compile is their pending plan), the others were "
                                         "published")
                        log.error("enforcer: %s", outcome.error)
                except Stale:
                    continue
                except (PolicyEngineError, InvalidInput, Conflict) as exc:
                    outcome.error = str(exc)
                    log.error("enforcer: nothing published, every device keeps its last good rule set: %s", exc)
                    if force:
                        raise
                    break
                self._keep(compiled, inputs)
                break
            else:
                outcome.error = "the inputs kept changing while publishing; the next run catches up"
            self.last = outcome
            self.runs += 1
            if outcome.published and self.on_publish is not None:
                self.on_publish(sorted(outcome.published))
            return outcome

    def _keep(self, compiled: Compiled, inputs: Inputs) -> None:
        self._idle = not compiled.devices and not all_devices(inputs.fabric)
        self._compiled = compiled
        self._marker = inputs.marker
        self._expiry_ns = inputs.expiry_ns

    # ---------------------------------------------------------------- how

    def _read(self, *, idle_ok: bool = False) -> Inputs:
        """The inputs, in one snapshot. What provably did not change since the last run is not read again: the
        fabric after only LEAVE_FABRIC events; the data document after only grant events (those grants are
        patched into the engine's document, as the grants service patches its decider: policy.data.grant_ops).

        `idle_ok`: when the fabric has no device and the kept compile has none either (every replica of a
        control plane without enforced devices, or before the fabric is imported), the policy and its data
        are neither read nor evaluated (allowed is None): a compile for no device is empty whatever the
        grants say, and the grant writers' replicas must not spend a decision's CPU on it per grant. The
        engine's document is rebuilt in full by the first run that has a device again."""
        from pki.service import trust_domain

        now = self.clock()
        resync = time.monotonic() - self._last_full >= self.config.resync_seconds
        expired = self._expiry_ns is not None and to_ns(now) >= self._expiry_ns
        with self.db.read_session(snapshot=True) as s:  # one snapshot for every read below
            marker = tree_size(s)
            events: list[tuple[str, str]] = []
            complete = False
            if self._marker >= 0:
                events, complete = _scan(s, self._marker, marker, 10_000)
            td = trust_domain(s)
            if td is None:
                raise Conflict("the trust domain is not initialised: run `trustfabric init` first")
            fabric = self._fabric
            if fabric is None or resync or not complete or not all(a.startswith(LEAVE_FABRIC) for a, _ in events):
                fabric = compile_fabric_of(s, td)
            if idle_ok and not all_devices(fabric) and self._compiled is not None and not self._compiled.devices:
                self._fabric, self._data_stale = fabric, True
                if resync:
                    self._last_full = time.monotonic()
                return Inputs(marker, now, fabric, self._policy_hash, None, frozenset(), None, tuple(events))
            digest = s.exec(select(PolicyVersion.content_hash).where(col(PolicyVersion.state) == "active")).first()
            engine = self._engine_for(digest)
            modules = None
            if digest is not None and (not self._loaded or digest != self._policy_hash):
                modules = dict(s.exec(select(PolicyVersion.modules).where(col(PolicyVersion.content_hash) == digest))
                               .one())
            if (engine is not None and modules is None and complete and not (resync or expired or self._data_stale)
                    and events and all(a.startswith("grant.") for a, _ in events)):
                from policy.data import grant_ops
                from policy.models import Grant

                for grant in s.exec(select(Grant).where(col(Grant.id).in_({o for _, o in events}))).all():
                    engine.patch_data(grant_ops(engine.data(), grant, now))
                data: Any = engine.data()
            else:
                data = build_data(s, now)
                if engine is not None:
                    if modules is not None:
                        engine.load(modules, data)
                        self._policy_hash, self._loaded = digest, True
                    else:
                        sync_data(engine, data)
                self._data_stale = False
        allowed = self._allowed(engine, digest, now)
        self._fabric = fabric
        revoked = frozenset(data["tf"]["revoked"])
        return Inputs(marker, now, fabric, digest, allowed, revoked, live_until(data), tuple(events))

    def _engine_for(self, digest: str | None) -> PolicyEngine | None:
        """The engine to evaluate the active version on; None when no version is active."""
        if digest is None:
            self._policy_hash, self._loaded = None, True
            return None
        if self._engine is None:
            self._engine = self._factory()
            self._loaded = False  # a new engine holds nothing yet
        return self._engine

    def _allowed(self, engine: PolicyEngine | None, digest: str | None, now: datetime) -> Any:
        if engine is None or digest is None:
            return []  # no policy in force: nothing is allowed
        value = engine.evaluate(ALLOWED_FLOWS_QUERY, {"now_ns": to_ns(now)})
        if not isinstance(value, list):
            raise PolicyEngineError(f"the active policy ({digest[:16]}) gives no {ALLOWED_FLOWS_QUERY} list")
        return value

    def _compile(self, inputs: Inputs, full: bool) -> tuple[Compiled, bool]:
        prev = self._compiled
        if (full or prev is None or prev.fabric != inputs.fabric or prev.budget != self.config.budget
                or time.monotonic() - self._last_full >= self.config.resync_seconds):
            compiled = compile_fabric(inputs.fabric, inputs.allowed, inputs.revoked, self.config.budget, strict=False)
            self._last_full = time.monotonic()
            return compiled, True
        return recompile(prev, inputs.allowed, inputs.revoked, strict=False), False

    def _publish(self, compiled: Compiled, inputs: Inputs, outcome: Outcome, *, select: set[str] | None,
                 unpin: Collection[str], force: bool, actor: Actor, request_id: str | None,
                 skip: Mapping[str, str] | None = None, fits: Mapping[str, Fit] | None = None) -> None:
        """Publish (or hold) every compiled device that changed. Those in `skip` (over their budget even fitted:
        device -> why) keep their last good rule set and are held: their compile becomes their pending plan, so
        `enforcer status` shows a device that is not running what the policy now says, and the hold is audited
        once, when it starts or its plan changes, not on every run. Back under budget, the device is published
        (or, back in step, released) by the same run. A device in `fits` is published as fitted, its version's
        cause led by what was withheld, and an `enforcer.withhold` event is recorded when the withheld set of a
        device published (or in step) differs from the last one recorded for it."""
        skip = skip or {}
        fits = fits or {}
        now = self.clock()
        known = self._compiled.devices if self._compiled is not None else {}
        cause = outcome.cause
        if select is not None:  # `enforcer apply --device D`: a D the fabric lacks is said, not "up to date"
            _check_in_fabric(select, compiled.devices)
        if not compiled.devices and select is None:
            with self.db.read_session() as r:
                if not any(st.in_fabric for st in service.states(r).values()):
                    # no device to publish to, hold or retire: nothing to write, so no write transaction and
                    # no audit head lock (taken on every grant change, it queued the grant writers behind it)
                    return
        with self.db.session() as s:
            size = lock_head(s)
            if size != inputs.marker:
                events, complete = _scan(s, inputs.marker, size, 10_000)
                if events or not complete:
                    raise Stale()
            sts = service.states(s)
            withheld = service.withheld(s)
            for device, rs in sorted(compiled.devices.items()):
                if select is not None and device not in select:
                    continue
                fit = fits.get(device)
                if fit is not None and fit.rules is not None:
                    rs = fit.rules
                st = sts.get(device)
                if device in skip:
                    if service.hold(s, rs, why=skip[device][:500], actor=actor, now=now):
                        outcome.held.append(device)
                    continue
                unpinning = st is not None and st.pinned and device in unpin
                if st is not None and st.in_fabric and st.content_hash == rs.content_hash and not unpinning:
                    if st.pending_hash is not None:  # back in step: no pending plan any more
                        service.hold(s, rs, why="in sync", actor=actor, now=now)
                    _withhold(s, device, fit, withheld.get(device), actor, now, cause)
                    continue
                pinned = st is not None and st.pinned and not unpinning
                if pinned or (self.config.mode == "manual" and not force):
                    if service.hold(s, rs, why="pinned" if pinned else "manual mode", actor=actor, now=now):
                        outcome.held.append(device)
                    continue
                note = fit.note() if fit is not None else ""
                row = service.publish(s, rs, cause=f"{note}; {cause}" if note else cause, actor=actor, now=now,
                                      budget=self.config.budget, known=known, pin=False if unpinning else None,
                                      request_id=request_id, withheld=outcome.withheld.get(device))
                if row is not None:
                    outcome.published[device] = row.version
                _withhold(s, device, fit, withheld.get(device), actor, now, cause)
            if select is None:
                for device, st in sts.items():
                    if st.in_fabric and device not in compiled.devices:
                        service.retire(s, device, actor=actor, now=now, cause=cause)
                        outcome.retired.append(device)


def fit_over_budget(db: Database, compiled: Compiled,
                    kept: dict[str, tuple[str, str | None, Fit]] | None = None) -> dict[str, Fit]:
    """Each device over budget compiled to fit (enforcer.fairshare) against its last published rule set: what
    auto mode publishes, for the reconciler and a staged plan alike. `kept` (the reconciler's, across runs;
    device -> its compiled set's hash/its limit, its published set's hash, the fit): a device's fit is reused
    while neither its compiled set, its limit nor its published set changed; pruned to the devices still over."""
    over = sorted(o.device for o in compiled.over)
    kept = {} if kept is None else kept
    for d in [d for d in kept if d not in over]:
        del kept[d]
    if not over:
        return {}
    out: dict[str, Fit] = {}
    with db.read_session() as s:
        sts = service.states(s)
        for d in over:
            st = sts.get(d)
            published = st.content_hash if st is not None and st.in_fabric and st.version else None
            # the budget too: a new one leaves the compiled set as it was, not the fit (a fit for the old
            # limit was reused: the device published over its new budget)
            raw = f"{compiled.devices[d].content_hash}/{compiled.budget.limit(compiled.devices[d].kind)}"
            hit = kept.get(d)
            if hit is not None and hit[0] == raw and hit[1] == published:
                out[d] = hit[2]
                continue
            last = None
            if published is not None and st is not None:
                known = hit[2].rules if hit is not None else None
                last = known if known is not None and known.content_hash == published else \
                    service.ruleset_of(service.version_row(s, d, st.version))
            out[d] = fit_device(compiled, d, last)
            kept[d] = (raw, published, out[d])
    return out


def fitted(compiled: Compiled, fits: dict[str, Fit]) -> Compiled:
    """The compile as auto mode publishes it: each device over budget replaced by its fit (fit_over_budget);
    BudgetExceeded naming the devices that cannot fit even so (their skeleton and shared entries alone overflow)."""
    unfit = [o for o in compiled.over if fits[o.device].rules is None]
    if unfit:
        raise BudgetExceeded(unfit)
    return Reconciler._fitted(compiled, fits)


def _withhold(session: Session, device: str, fit: Fit | None, last: dict[str, Any] | None, actor: Actor,
              now: datetime, cause: str) -> None:
    """Record `enforcer.withhold` when what the device's published set withholds (nothing when `fit` is None)
    differs from the last recorded (`last`, None: never recorded): once per change, not on every run (the caller
    holds the audit log's head lock, so two replicas cannot both record one change)."""
    summary: dict[str, Any] = fit.summary() if fit is not None else {"device": device, "withheld": []}
    before = [(w["tenant"], w["flows"]) for w in (last or {}).get("withheld", [])]
    if before == [(w["tenant"], w["flows"]) for w in summary["withheld"]]:
        return
    record(session, actor=actor, action="enforcer.withhold", object_type="device", object_id=device, summary=summary,
           reason=(f"{(fit.note() if fit is not None else '') or 'nothing withheld: within budget'}; {cause}")[:2000],
           at=now)


# ---------------------------------------------------------------- reads for plan, staged plan, verify


@dataclass(frozen=True)
class StagedInputs:
    """What a staged compile reads: the stored fabric and the policy data document at `now`."""

    fabric: Fabric
    data: dict[str, Any]
    now_ns: int


def staged_inputs(session: Session, now: datetime) -> StagedInputs:
    from pki.service import trust_domain

    return StagedInputs(compile_fabric_of(session, trust_domain(session) or ""), build_data(session, now), to_ns(now))


def allowed_flows_under(versions: list[dict[str, str] | None], data: dict[str, Any], now_ns: int) -> list[Any]:
    """`data.flows.allowed_flows` of each policy version's modules (None: nothing allowed) on `data`, each on a
    private engine. Module-level and on plain data: workflows run it in the policy sandbox (a candidate version
    is user-supplied Rego, issue 13 item 5)."""
    out: list[Any] = []
    for modules in versions:
        allowed = answer_under(modules, data, now_ns) if modules is not None else []
        if not isinstance(allowed, list):
            raise InvalidInput(f"the policy version gives no {ALLOWED_FLOWS_QUERY} list")
        out.append(allowed)
    return out


def staged_compile(db: Database, inputs: StagedInputs, allowed: Any,
                   budget: Budget) -> tuple[Compiled, dict[str, Fit]]:
    """What every device would run under a policy version whose allowed flows are `allowed` (from
    allowed_flows_under), compiled on the stored fabric and data, publishing nothing: a device over its budget
    fitted against its published set as auto mode would publish it (fit_over_budget; with its fit), BudgetExceeded
    for one that cannot fit."""
    compiled = compile_fabric(inputs.fabric, allowed, frozenset(inputs.data["tf"]["revoked"]), budget, strict=False)
    fits = fit_over_budget(db, compiled)
    return fitted(compiled, fits), fits


def with_devices(compiled: Compiled, devices: dict[str, DeviceRuleSet]) -> Compiled:
    """The compile with other rule sets in place of its own (the published ones, for `enforcer verify`)."""
    return replace(compiled, devices=devices)


def _check_in_fabric(selected: Collection[str], devices: Collection[str]) -> None:
    """NotFound naming the selected devices that are not devices of the fabric (nothing is published then)."""
    missing = sorted(set(selected) - set(devices))
    if missing:
        raise NotFound(f"{', '.join(missing)} {'is not a device' if len(missing) == 1 else 'are not devices'} of the "
                       "fabric (`trustfabric device list` names them)")
