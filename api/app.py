"""The FastAPI application: composes the domain routers; holds no business logic."""

from __future__ import annotations

import gc
import logging
import threading
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Any

from fastapi import APIRouter, FastAPI

from api.auth import Authenticator, default_authenticators
from api.authz import Authorizer, Evaluator, default_engine_factory
from api.background import server_jobs
from api.caches import cache_on, check_names
from api.console import install_console
from api.edge import Edge
from api.enforcement import EnforcerRuntime, PublicationWatch
from api.errors import install_error_handlers
from api.inclusion import include_shared
from api.limits import EvaluationSlots, TokenBucket
from api.readcache import ChangeWatch, ReadCache
from api.routes import (
    audit,
    devices,
    fabric,
    flows,
    grant_explain,
    grants,
    health,
    inventory,
    metrics,
    pki,
    policy,
    security,
    tokens,
)
from api.routes.pki import MAX_X509_BATCH_BYTES
from api.tls import TrustAnchors
from api.workers import WorkerThreads
from enforcer.reconcile import Reconciler
from workflows.context import AppContext
from workflows.fabric import MAX_IMPORT_BYTES

log = logging.getLogger("trustfabric.api")
_CONFIGURED: Any = object()  # the authz engine the settings choose (policy.engines.make_engine)

# Every route module, mounted in this order. Imported by name here, so a typo or a missing module is an
# ImportError when the app is built (and a lint error before that), never a router silently left out.
ROUTERS: tuple[APIRouter, ...] = (
    health.router, pki.router, audit.router, policy.router, inventory.router, grants.router, security.router,
    tokens.router, flows.router, grant_explain.router, fabric.router, devices.router, metrics.router,
)


def create_app(
    ctx: AppContext,
    *,
    authenticators: list[Authenticator] | None = None,
    authz_engine_factory: Any = _CONFIGURED,
    grant_decider: Any = None,
    background: bool = False,
    settle_heap: bool = False,
    warm_workers: bool = False,
    extra_routers: Sequence[APIRouter] = (),
    enforcer: Reconciler | None = None,
) -> FastAPI:
    """The API over `ctx`. `authz_engine_factory` returns the engine api_authz.rego is loaded in (None:
    every request is denied); `background` runs the periodic jobs (grant expiry, CA rotation, audit
    checkpoints) and the enforcer's reconciler for the app's lifetime; `enforcer` runs that reconciler
    (tests hand one with their clock) even without the other jobs; `extra_routers` are mounted after the
    API's own (e.g. a console); `settle_heap` freezes the heap built at start-up out of the garbage collector's
    reach as the app starts (`settle`, below: a server process's app only); `warm_workers` starts the app's worker
    threads as it starts, each building its policy engines (api/workers.py: a server process's app only)."""
    from api import docs, tracing
    from pki.revocation import CrlPublisher
    from policy.flowset import FlowSets
    from policy.grant_decider import RegoGrantDecider
    from workflows.impacts import ImpactReports

    anchors = TrustAnchors()
    jobs = server_jobs(ctx, anchors) if background else None
    watch = PublicationWatch(ctx.db, ctx.settings.enforcer_poll_seconds)
    if enforcer is None and background:
        from workflows.enforcement import make_reconciler

        enforcer = make_reconciler(ctx)
    runtime = EnforcerRuntime(enforcer, watch) if enforcer is not None else None
    traces = tracing.setup(ctx.settings)

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        if settle_heap:  # before any thread of ours starts: nothing is collected on a thread it was not made on
            settle()
        if warm_workers:
            _app.state.workers.start_all(_warming(ctx, _app))
        if jobs is not None:
            jobs.start()
        if runtime is not None:
            runtime.start()
        try:
            yield
        finally:
            if runtime is not None:
                runtime.stop()
            if jobs is not None:
                jobs.stop()
            if traces is not None:
                traces.shutdown()
            _app.state.impacts.stop_background()  # no new background computation (api/computing.py)
            _app.state.flow_sets.stop_background()
            _app.state.workers.close()

    app = FastAPI(
        title="trustfabric",
        version="0.1.0",
        description="Zero-trust identity, policy and audit for a multi-tenant AI cloud.",
        lifespan=lifespan,
        docs_url=None,  # served from the package by api/docs.py: FastAPI's pages load a CDN
        redoc_url=None,
        # FastAPI's own OpenTelemetry instrumentation stays off whatever global providers a process sets: the API
        # makes its spans itself (api/tracing.py, a provider of its own per app) and its metrics (api/metrics.py);
        # on, it asked the global providers whether to run on every request and would trace each one twice
        telemetry={"tracing": False, "metrics": False, "logs": False},
    )
    app.state.tracing = traces
    app.state.ctx = ctx
    app.state.authenticators = (
        authenticators if authenticators is not None else default_authenticators(ctx)
    )
    factory: Any = authz_engine_factory
    if factory is _CONFIGURED:
        engines = ctx.settings.engines()
        factory = lambda: default_engine_factory(engines)  # noqa: E731
    off = ctx.settings.cache_off
    check_names(off)
    app.state.authorizer = Authorizer(factory if factory is not None else None, cache=cache_on(off, "authz"))
    app.state.grant_decider = (
        grant_decider if grant_decider is not None else RegoGrantDecider(
            engine_factory=lambda: ctx.engine("grants"), keep_data=cache_on(off, "grant_data"))
    )
    app.state.rate_limiter = TokenBucket(ctx.settings.rate_limit_per_second, ctx.settings.rate_limit_burst)
    app.state.evaluation_slots = EvaluationSlots(ctx.settings.policy_concurrency)
    app.state.workers = WorkerThreads(ctx.settings.worker_threads)
    app.state.background = jobs
    app.state.enforcer = runtime
    app.state.device_watch = watch
    app.state.server_stopping = watch.close  # api/server.py: held long-polls answer when the server stops
    app.state.crl = CrlPublisher()
    app.state.trust_anchors = anchors
    pages_on = ctx.settings.read_cache and cache_on(off, "grant_pages")
    app.state.grant_pages = ReadCache[bytes](ChangeWatch(ctx.db, enabled=pages_on))
    flows_on = cache_on(off, "flow_set")
    flow_changes = ChangeWatch(ctx.db, enabled=flows_on and ctx.settings.read_cache)
    app.state.flow_sets = FlowSets(ctx.db, keep=flows_on, changes=flow_changes.version)
    app.state.impacts = ImpactReports(ctx.db, app.state.flow_sets, keep=flows_on and cache_on(off, "impact"),
                                      changes=flow_changes.version)
    install_error_handlers(app)
    for router in ROUTERS:
        include_shared(app, router)
    for router in extra_routers:
        app.include_router(router)
    docs.install(app)
    install_console(app)  # the web console under /console: pages that call the routes above
    # our one outer layer (api/edge.py): a flood from one address is refused before anything else runs (issue 13,
    # item 7), not even an access-log line each; then the request id, access log, metrics and span of every
    # answer past that limit (the 413s included), the body limit, the console's headers, and after every
    # committed write the reconciler looks at once
    app.add_middleware(Edge, rate=ctx.settings.ip_rate_limit_per_second, burst=ctx.settings.ip_rate_limit_burst,
                       max_body_bytes=ctx.settings.max_body_bytes,
                       larger={"/v1/fabric/import": MAX_IMPORT_BYTES + 64 * 1024,
                               "/v1/svids/x509/batch": MAX_X509_BATCH_BYTES}, tracing=traces,
                       wake=runtime.reconciler.wake if runtime is not None else None)
    return app


def app_from_env() -> FastAPI:
    """Factory for `uvicorn --factory` (used by `trustfabric serve --workers N`): each worker logs in the
    configured format (core/logs.py) and builds its app over the data directory, its heap settled as it starts."""
    from core import logs
    from workflows.settings import Settings

    settings = Settings.from_env()
    logs.configure(settings.log_format, settings.log_level)
    ctx = AppContext.open(settings)
    return create_app(ctx, background=True, settle_heap=True, warm_workers=True)


def _warming(ctx: AppContext, app: FastAPI) -> Callable[[], None]:
    """What each worker thread of a starting server does first: bring its copy of the grant decider's engine (grant
    requests, explain) up to the active policy, one thread after another (the first builds the policy document, the
    others reuse it; and they do not crowd the first requests off the interpreter all at once)."""
    from policy.grant_decider import RegoGrantDecider

    turn = threading.Lock()

    def warm() -> None:
        decider = app.state.grant_decider
        if not isinstance(decider, RegoGrantDecider):
            return
        with turn, ctx.db.read_session() as session:
            decider.warm(session, ctx.clock())

    return warm


def settle() -> None:
    """Move every object alive after start-up (modules, the app, its routes and validators, the SQLAlchemy and
    pydantic machinery: ~190,000 objects) into the collector's permanent generation (gc.freeze), so its full
    collections walk only what requests made since. Each walked them all: ~120 ms with the GIL held, every ~1,500
    grant requests, on whichever thread crossed the threshold (bench/asgi_layers.py's app: 80 us per request on
    average, and a stall every replica's connections waited through). Objects frozen are never collected as
    cycles, so it is done once, in a server process only: a process building many apps (the tests) would keep
    every one."""
    gc.collect()
    gc.freeze()


__all__ = ["Evaluator", "create_app", "default_authenticators"]
