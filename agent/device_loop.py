"""One device's reconciliation: the desired rule set from the server, applied atomically, reported, and
kept in place on the device.

Three threads per device share the backend under one lock:
- the poller long-polls `GET /v1/devices/{id}/ruleset` (If-None-Match: the last hash fetched) and applies
  each new version;
- the checker reads the device back every `drift_every` seconds and re-applies the last good set when it
  differs (someone edited the flows or the nftables table by hand), then reports; it also reports
  counters every `report_every` seconds and retries a desired version that failed to apply;
- the reporter sends the status reports the other two leave (`POST /v1/devices/{id}/status`).

The lock guards the device and the loop's memory, never a request to the server (as agent/svids.py's): a slow
server holds up only the thread whose request it is, never another's apply or drift repair. A leaf's
fabric view is fetched outside it, and the set is applied under it after checking that nothing was taken
meanwhile that makes it void (a retry of a failed version, overtaken by the poller's newer one). A status is
taken under it, as it is then, and left for the reporter, which sends them in order, one report in flight per
device (a status that differs from the last one left only in its counters replaces it: nothing the server audits,
a repair or a refusal, is lost): the poller and the checker never wait for a report.

Reports are numbered (`report_seq`), so a request the server processes late (one whose client timed out, handled
after its retry and newer reports; an old agent process's last one) cannot overwrite a newer status: the server
keeps the highest number per device and answers a report numbered at or below it `stale`, changing nothing. A
report is numbered when first sent (so in sending order) and keeps its number when sent again. The number is the
wall clock in nanoseconds, made strictly increasing within the process (max(last + 1, time_ns)): it grows across
restarts without any state on disk (a counter persisted in the data directory would start again at 0 on a node
re-installed with a fresh data directory, and every report after would be stale for good; writing it before every
report would put the disk in the reporter's path). Its one weakness, a wall clock stepped back across a restart (or
a run with a clock far ahead), is caught by the server's answer: a report answered stale while the server holds a
number above it was not overtaken by this process's own (those are numbered below it), so the loop takes the
server's number as its floor and sends that status again, numbered above it. The server refuses (400) a number
more than 7 days ahead of its own clock (one near the top of the range would leave no number above it); a refused
number was not stored and does not raise the floor, so a clock that ran ahead and is set right numbers from it again.

What never happens: the device is never opened. A rule set is refused whole (content hash that does not
match its IR, an IR that does not parse or render, an apply the device rejects) and the last good one stays;
the server not answering changes nothing on the device (fail static) while the checker keeps repairing
drift against the last good set; on start nothing is cleared: the installed rules are compared with the
desired set and applied only when they differ (a restart after a crash mid-apply converges, and a restart
of a healthy agent disturbs no connection).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Any

from agent.api import VIEW_KEY, ApiClient, Refused, Unreachable
from agent.metrics import AgentMetrics
from agent.wiring import DeviceWiring
from core.testpoints import pause_point
from enforcer.errors import NotApplied
from enforcer.fabric import Fabric
from enforcer.ir import DeviceRuleSet
from enforcer.leaf_view import fabric_of_view, view_hash

log = logging.getLogger("trustfabric.agent")

MAX_DRIFT_LINES = 200
MAX_COUNTERS = 10_000
MAX_UNSENT = 32  # statuses left for the reporter while the server does not take them (see _bound_outbox)


@dataclass(frozen=True)
class LoopSettings:
    wait: int = 30  # seconds a long-poll is held by the server
    drift_every: float = 2.0
    report_every: float = 10.0
    backoff_min: float = 0.2
    backoff_max: float = 5.0


@dataclass
class Applied:
    version: int
    rules: DeviceRuleSet
    backend: Any


class BadRuleSet(Exception):
    """The server's rule set cannot be applied as it is (the reason goes into the status report)."""


class DeviceLoop:
    def __init__(self, wiring: DeviceWiring, api: ApiClient, metrics: AgentMetrics, stop: threading.Event,
                 settings: LoopSettings | None = None) -> None:
        self.wiring = wiring
        self.device = wiring.device
        self.api = api
        self.metrics = metrics
        self.stop = stop
        self.settings = settings or LoopSettings()
        self.lock = threading.RLock()
        self.good: Applied | None = None
        self.etag: str | None = None  # the hash last fetched, applied or refused
        self.pending: dict[str, Any] | None = None  # a desired version that failed to apply
        self.last_error: str | None = None
        self.drift: list[str] = []
        self.repaired = False
        self.repairs = 0
        self.view: tuple[str, Fabric] | None = None  # a Linux leaf's fabric view: (its hash, the Fabric)
        self.view_fetches = 0
        self._taken = 0  # rule sets taken (applied or refused): a retry begun before another take is void
        self._outbox: deque[dict[str, Any]] = deque()  # the statuses not sent yet, the oldest first
        self._queued = threading.Event()  # set while the outbox holds any: the reporter's turn
        self._seq = 0  # the highest report_seq the server may hold from this loop (the reporter's thread only)
        self._time_ns = time.time_ns  # the wall clock reports are numbered from (tests move it)
        self.stale_reports = 0  # reports the server answered stale (tests, diagnostics)
        self._threads: list[threading.Thread] = []
        for counter in (metrics.applies, metrics.refused, metrics.drift_repairs, metrics.server_errors):
            counter.labels(self.device)  # every series exists from the start (a 0 is an answer)

    def start(self) -> None:
        for name, fn in (("poll", self._poll_forever), ("check", self._check_forever),
                         ("report", self._report_forever)):
            t = threading.Thread(target=fn, name=f"agent-{name}-{self.device}", daemon=True)
            t.start()
            self._threads.append(t)

    def join(self, timeout: float = 10.0) -> None:
        """Wait for the checker; a poller held in a long-poll, or a reporter in its request, ends when its request
        does (it applies, or sends, nothing once stopped: see take)."""
        for t in self._threads:
            t.join(timeout if t.name.startswith("agent-check") else 0.1)

    # ------------------------------------------------------------------ poller
    def _poll_forever(self) -> None:
        backoff = self.settings.backoff_min
        while not self.stop.is_set():
            try:
                doc = self.api.ruleset(self.device, self.etag if self.good or self.pending else None,
                                       self.settings.wait)
                backoff = self.settings.backoff_min
                if doc is not None:
                    self.take(doc)
            except Unreachable as exc:  # fail static: the device keeps what it has
                self.metrics.server_errors.labels(self.device).inc()
                log.warning("%s: server unreachable, keeping the last applied rules: %s", self.device, exc)
                self.stop.wait(backoff)
                backoff = min(backoff * 2, self.settings.backoff_max)
            except Refused as exc:
                log.warning("%s: the server refused the rule set request: %s", self.device, exc)
                self.stop.wait(backoff)
                backoff = min(backoff * 2, self.settings.backoff_max)
            except Exception:
                log.exception("%s: unexpected error in the poller", self.device)
                self.stop.wait(backoff)
                backoff = min(backoff * 2, self.settings.backoff_max)

    def take(self, doc: dict[str, Any], *, retry: bool = False) -> bool:
        """Apply a rule set document from the server; False (and reported) when it was refused, or void (`retry`:
        the checker's retry of `pending`, when another set was taken meanwhile). Its requests (a leaf's fabric view,
        the report) are made outside the lock."""
        with self.lock:
            if self.stop.is_set() or (retry and self.pending is not doc):
                return False
            taken, held_view = self._taken, self.view
        checked: tuple[int, DeviceRuleSet, Any, tuple[str, Fabric] | None] | Exception
        try:
            checked = self._check(doc, held_view)
        except Unreachable:  # not refused: fetched again (no If-None-Match for it) once the server answers
            raise
        except Exception as exc:  # refused (below): the last good set stays
            checked = exc
        fetched = None if isinstance(checked, Exception) else checked[3]
        with self.lock:
            if fetched is not None:
                self.view_fetches += 1
            if self.stop.is_set():  # a long-poll answered after the agent stopped: not ours to apply any more
                return False
            if retry and (self._taken != taken or self.pending is not doc):  # the poller took a newer one meanwhile
                return False
            self._taken += 1
            digest = str(doc.get("content_hash", ""))
            self.etag = digest or self.etag
            if fetched is not None:
                self.view = fetched
            ok = False
            try:
                if isinstance(checked, Exception):
                    raise checked
                version, rules, backend, _ = checked
                installed_already = self.good is None and self._in_sync(backend, rules)
                if not installed_already:
                    started = time.perf_counter()
                    backend.apply(rules)
                    pause_point("agent.apply.unrecorded")
                    self.metrics.apply_seconds.labels(self.device).observe(time.perf_counter() - started)
                    self.metrics.applies.labels(self.device).inc()
            except Exception as exc:  # refused: the last good set stays (every backend applies atomically)
                self.pending = doc
                self.last_error = f"version {doc.get('version')} refused: {_one_line(exc)}"
                self.metrics.refused.labels(self.device).inc()
                log.error("%s: %s; keeping version %s", self.device, self.last_error,
                          self.good.version if self.good else None)
            else:
                self.good = Applied(version, rules, backend)
                self.pending, self.last_error, self.drift, self.repaired = None, None, [], False
                self.metrics.applied_version.labels(self.device).set(version)
                log.info("%s: version %d %s (%s)", self.device, version,
                         "already installed" if installed_already else "applied", digest[:12])
                ok = True
            self._report()
            return ok

    def _check(self, doc: dict[str, Any], held_view: tuple[str, Fabric] | None
               ) -> tuple[int, DeviceRuleSet, Any, tuple[str, Fabric] | None]:
        """The document's version, rules and backend, and the fabric view fetched for it (None: the held one, or a
        NIC's). Called outside the lock: it may ask the server."""
        try:
            version = int(doc["version"])
            rules = DeviceRuleSet.from_dict(doc["ir"])
        except (KeyError, TypeError, ValueError) as exc:
            raise BadRuleSet(f"the rule set does not parse: {exc!r}") from None
        if rules.device != self.device:
            raise BadRuleSet(f"the rule set is for {rules.device}, not {self.device}")
        if rules.content_hash != doc.get("content_hash"):
            raise BadRuleSet(f"its IR hashes to {rules.content_hash}, not to the content hash it came with")
        fabric, fetched = None, None
        if self.wiring.kind == "leaf":
            fabric, fetched = self._leaf_fabric(doc.get(VIEW_KEY), held_view)
        # a set that cannot render is refused by apply itself, which renders before it touches the device
        return version, rules, self.wiring.make(fabric), fetched

    def _leaf_fabric(self, want: str | None, held: tuple[str, Fabric] | None
                     ) -> tuple[Fabric, tuple[str, Fabric] | None]:
        """The fabric view the server named with the rule set: the `held` one when its hash matches, else fetched
        (a server that names none: always fetched), with (its hash, it) to hold."""
        if want is not None and held is not None and held[0] == want:
            return held[1], None
        doc = self.api.leaf_view(self.device)
        fabric = fabric_of_view(doc)
        return fabric, (view_hash(doc), fabric)

    def _in_sync(self, backend: Any, rules: DeviceRuleSet) -> bool:
        try:
            return not backend.drift(rules)
        except NotApplied:
            return False

    # ------------------------------------------------------------------ checker
    def _check_forever(self) -> None:
        last_report = time.monotonic()
        while not self.stop.wait(self.settings.drift_every):
            try:
                repaired = self.check_drift()
                due = time.monotonic() - last_report >= self.settings.report_every
                pending = self.pending
                if pending is not None and due:
                    self.take(pending, retry=True)  # a failed apply is retried (it may have been transient)
                elif repaired or due:
                    self._report()
                if repaired or due:
                    last_report = time.monotonic()
            except Unreachable:
                pass
            except Exception:
                log.exception("%s: unexpected error in the drift check", self.device)

    def check_drift(self) -> bool:
        """Compare the device with the last good set; re-apply it on any difference. True when repaired."""
        with self.lock:
            if self.good is None:
                return False
            try:
                drift = self.good.backend.drift(self.good.rules)
            except NotApplied as exc:
                drift = [f"nothing of ours installed: {exc}"]
            if not drift:
                if self.drift and not self.repaired:
                    self.drift = []
                return False
            log.warning("%s: drift from version %d (%d lines), repairing", self.device, self.good.version,
                        len(drift))
            try:
                self.good.backend.apply(self.good.rules)
            except Exception as exc:
                self.drift, self.repaired = drift[:MAX_DRIFT_LINES], False
                self.last_error = f"drift repair failed: {_one_line(exc)}"
                self._report()
                return False
            self.drift, self.repaired = drift[:MAX_DRIFT_LINES], True
            self.repairs += 1
            self.metrics.drift_repairs.labels(self.device).inc()
            self._report()  # (this status says what was repaired; the next ones no more)
            self.drift, self.repaired = [], False
            return True

    # ------------------------------------------------------------------ reporting
    def status(self) -> dict[str, Any]:
        with self.lock:
            good = self.good
            counters: dict[str, dict[str, int]] = {}
            if good is not None and hasattr(good.backend, "counters"):
                try:
                    for c in good.backend.counters(good.rules):
                        key = f"{c.where} {','.join(c.reasons)}"[:128]
                        slot = counters.setdefault(key, {"packets": 0, "bytes": 0})
                        slot["packets"] += c.packets
                        slot["bytes"] += c.bytes
                        if len(counters) >= MAX_COUNTERS:
                            break
                except Exception as exc:  # counters are informative: their failure is reported, not fatal
                    log.debug("%s: counters unreadable: %s", self.device, exc)
            for key, c in counters.items():
                self.metrics.rule_packets.labels(self.device, key).set(c["packets"])
                self.metrics.rule_bytes.labels(self.device, key).set(c["bytes"])
            return {"applied_version": good.version if good else None,
                    "applied_hash": good.rules.content_hash if good else None,
                    "counters": counters, "drift": [line[:500] for line in self.drift[:MAX_DRIFT_LINES]],
                    "drift_repaired": self.repaired, "last_error": self.last_error[:2000] if self.last_error else None}

    def _report(self) -> None:
        """Leave the status as it is now for the reporter: taken under the lock, so the statuses are left in the order
        of the states they describe; sent outside it. One that differs from the last one not sent yet only in its
        counters replaces it."""
        with self.lock:
            status = self.status()
            if self._outbox and _but_counters(self._outbox[-1]) == _but_counters(status):
                self._outbox[-1] = status
            else:
                self._outbox.append(status)
                self._bound_outbox()
            self._queued.set()

    def _bound_outbox(self) -> None:
        """At most MAX_UNSENT statuses left: over it, the oldest one the server would not audit apart from the next
        goes (its audited state is the next one's: no audited event is lost with it), else the oldest. The caller
        holds the lock."""
        if len(self._outbox) <= MAX_UNSENT:
            return
        keys = [_audited(s) for s in self._outbox]
        drop = next((i for i in range(len(keys) - 1) if keys[i] == keys[i + 1]), 0)
        del self._outbox[drop]
        if drop == 0:
            log.warning("%s: the server takes no status report; the oldest not sent is dropped", self.device)

    def _report_forever(self) -> None:
        """Send the statuses left, in order, one report in flight per device: a slow server holds up this thread
        only. A report the server fails for now (no answer, 429, 5xx) is sent again, before the newer ones, after a
        backoff: a repair or refusal made while the server is down is still audited once it is back. Nothing is sent
        once stopped."""
        backoff = self.settings.backoff_min
        while not self.stop.is_set():
            if not self._queued.wait(0.5):
                continue
            with self.lock:
                status = self._outbox.popleft() if self._outbox else None
                if not self._outbox:
                    self._queued.clear()
            if status is None or self.stop.is_set():
                continue
            if "report_seq" not in status:  # numbered once, when first sent: sent again, it keeps its number
                status = {**status, "report_seq": self._next_seq()}
            renumbered = False
            try:
                answer = self.api.report(self.device, status)
                backoff = self.settings.backoff_min
                self._seq = max(self._seq, status["report_seq"])
                if not self._behind(status, answer):
                    continue
                status, renumbered = {**status, "report_seq": self._next_seq()}, True  # above the server's
            except Unreachable as exc:
                self._seq = max(self._seq, status["report_seq"])  # it may have been stored
                self.metrics.server_errors.labels(self.device).inc()
                log.warning("%s: status not reported (server unreachable), sent again: %s", self.device, exc)
            except Refused as exc:
                if exc.status != 429 and exc.status < 500:  # this report's fault: sending it again changes nothing
                    # (nor was it stored: its number does not raise the floor, so a number the server refused, from a
                    # clock that ran ahead, is not carried on once the clock is set right)
                    log.warning("%s: status report refused: %s", self.device, exc)
                    continue
                self._seq = max(self._seq, status["report_seq"])  # it may have been stored
                log.warning("%s: status not reported, sent again: %s", self.device, exc)
            except Exception:
                self._seq = max(self._seq, status["report_seq"])  # it may have been stored
                log.exception("%s: status not reported", self.device)
                continue
            with self.lock:  # first again, before the newer ones (order kept); the bound still holds
                self._outbox.appendleft(status)
                self._bound_outbox()
                self._queued.set()
            if not renumbered:  # (renumbered: the server answers, no reason to wait)
                self.stop.wait(backoff)
                backoff = min(backoff * 2, self.settings.backoff_max)

    def _next_seq(self) -> int:
        """A number above any the server may hold from this loop: above the floor (raised once a number was sent
        and not refused, or the server answered stale above it), else the clock."""
        return max(self._seq + 1, self._time_ns())

    def _behind(self, status: dict[str, Any], answer: dict[str, Any]) -> bool:
        """True when the server answered this report stale while holding a number above it: not this process's own
        newer report (none is numbered above the one being sent), so another process's, or this one's clock is
        behind. The number to go above is taken as the floor. A stale answer at the same number is this report's
        own earlier attempt, stored already: nothing to do."""
        if not answer.get("stale"):
            return False
        self.stale_reports += 1
        stored = answer.get("report_seq")
        if not isinstance(stored, int) or stored <= status["report_seq"]:
            return False
        log.warning("%s: the server holds a status report numbered %d, above this one's %d (another agent process, "
                    "or this clock behind): numbered above it and sent again", self.device, stored,
                    status["report_seq"])
        self._seq = max(self._seq, stored)
        return True


def _audited(status: dict[str, Any]) -> tuple[Any, ...]:
    """What of a status the server audits a change of (enforcer/service.py record_status)."""
    return (status.get("applied_version"), status.get("applied_hash"), bool(status.get("drift")),
            bool(status.get("drift_repaired")), status.get("last_error"))


def _but_counters(status: dict[str, Any]) -> dict[str, Any]:
    """A status but its counters and number: a newer status that differs from it in no more replaces it."""
    return {k: v for k, v in status.items() if k not in ("counters", "report_seq")}


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:1000]
