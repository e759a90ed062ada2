"""Assembles the FastAPI app: settings, lifespan (model loaded once), middleware, routers."""

from __future__ import annotations

import gc
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI
from fastapi.routing import APIRoute
from starlette.middleware import Middleware
from starlette.types import Receive, Scope, Send

from engine_advisor.model.recommend import warm_up
from engine_advisor.service import epp, errors
from engine_advisor.service.cache import ResponseCache
from engine_advisor.service.frontdoor import FrontDoor
from engine_advisor.service.holder import ModelHolder, load_artifact, load_default
from engine_advisor.service.metrics import Metrics
from engine_advisor.service.middleware import (
    MetricsMiddleware,
    ProxyBodyLimitMiddleware,
    RequestIdMiddleware,
)
from engine_advisor.service.proxy.entrance import PATHS as ENTRANCE_PATHS
from engine_advisor.service.proxy.entrance import Entrance
from engine_advisor.service.proxy.schemas import RouteWorkload
from engine_advisor.service.proxy.state import ProxyState, proxy_lifespan
from engine_advisor.service.routes import (
    admin,
    bench,
    crossover,
    deploy,
    health,
    observations,
    plan,
    predict,
    proxy,
    recommend,
    route,
    ui,
)
from engine_advisor.service.settings import Settings

# Matched in this order, one router after the other (FastAPI's matching costs a few
# microseconds per router passed over): the per-request routes of deployment tools and
# gateways first.
ROUTERS = (recommend.router, route.router, predict.router, crossover.router, plan.router,
           deploy.router, admin.router, health.router, proxy.router, observations.router,
           ui.router)
# Request bodies a route documents by hand (``openapi_extra``) refer to these by name.
EXTRA_SCHEMAS = (RouteWorkload,)


def operation_id(route: APIRoute) -> str:
    """Stable operation ids (the route function's name) keep openapi.yaml diffable."""
    return route.name


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    settings: Settings = app.state.settings
    if getattr(app.state, "holder", None) is None:
        loaded = (load_artifact(settings.model_path) if settings.model_path is not None
                  else load_default())
        app.state.holder = ModelHolder(loaded)
    current = app.state.holder.current
    app.state.metrics.set_model(current.version, current.source)
    warm_up(current.model)       # the compiled formulas, before /readyz answers
    # Everything loaded so far (libraries, the model) lives for the whole process: keep it out
    # of the cyclic GC's generations so full collections stay short (tail latency).
    gc.collect()
    gc.freeze()
    async with proxy_lifespan(app.state.proxy):   # upstream pools, health checks, reloads
        async with epp.serving(app):               # the gateway's endpoint picker (gRPC)
            yield


class App(FastAPI):
    """FastAPI, with ``POST /v1/chat/completions``, ``/v1/completions`` and ``/generate`` dispatched
    before FastAPI's own layers, to the proxy's entrance (engine_advisor.service.proxy.entrance
    explains why)."""

    entrance: Entrance | None = None
    # what engine_advisor.service.transport.protocol enforces
    front_door: FrontDoor | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST" \
                and scope["path"] in ENTRANCE_PATHS and self.entrance is not None:
            scope["app"] = self
            await self.entrance.asgi(scope, receive, send)
        else:
            await super().__call__(scope, receive, send)

    def openapi(self) -> dict:
        if self.openapi_schema is None:
            spec = super().openapi()
            schemas = spec.setdefault("components", {}).setdefault("schemas", {})
            for m in EXTRA_SCHEMAS:
                schemas[m.__name__] = m.model_json_schema(
                    ref_template="#/components/schemas/{model}")
            spec["components"]["schemas"] = dict(sorted(schemas.items()))
        return self.openapi_schema


def create_app(settings: Settings | None = None) -> FastAPI:
    settings = settings or Settings()
    metrics = Metrics()
    proxy_state = ProxyState(settings, metrics.registry)
    app = App(
        title="engine-advisor",
        summary="Choose vLLM or SGLang, the DCP size and the memory fraction for long-context "
                "serving, from a calibrated cost model.",
        version=_version(),
        lifespan=lifespan,
        generate_unique_id_function=operation_id,
        middleware=[Middleware(RequestIdMiddleware), Middleware(MetricsMiddleware, metrics=metrics),
                    Middleware(ProxyBodyLimitMiddleware, limit=settings.max_body_bytes,
                               cap=proxy_state.body_cap, paths=frozenset({"/v1/route"}))],
    )
    app.state.settings = settings
    app.state.metrics = metrics
    app.state.recommend_cache = ResponseCache(settings.recommend_cache_size)
    app.state.holder = None
    app.state.proxy = proxy_state
    app.entrance = Entrance(proxy_state, metrics)
    app.front_door = FrontDoor.of(settings, on_refusal=lambda r: metrics.refusals.inc((r,)))
    errors.install(app)
    if settings.bench_routes:     # first: matched no later than /v1/recommend (bench_service)
        app.include_router(bench.router)
    for router in ROUTERS:
        app.include_router(router)
    return app


def app_from_env() -> FastAPI:
    """uvicorn factory (``engine_advisor.service.main:app_from_env``): settings from
    ENGINE_ADVISOR_*."""
    return create_app(Settings())


def _version() -> str:
    from importlib import metadata

    try:
        return metadata.version("engine-advisor")
    except metadata.PackageNotFoundError:
        return "0+unknown"
