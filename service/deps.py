"""Dependencies as ``Annotated`` aliases: ``def route(model: ModelDep, settings: SettingsDep)``."""

from __future__ import annotations

import hmac
import json
from collections.abc import Callable, Coroutine
from typing import Annotated, Any, TypeVar

from fastapi import Depends, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute
from pydantic import BaseModel, ValidationError

from engine_advisor.model import jsontext
from engine_advisor.service.cache import ResponseCache
from engine_advisor.service.errors import ApiError, is_json
from engine_advisor.service.holder import LoadedModel, ModelHolder
from engine_advisor.service.metrics import Metrics
from engine_advisor.service.proxy.state import NO_POOLS, ProxyState
from engine_advisor.service.proxy.upstreams import Pools
from engine_advisor.service.settings import Settings

M = TypeVar("M", bound=BaseModel)


async def json_body(request: Request, model: type[M]) -> M:
    """The request's body validated as ``model``, failing exactly as a FastAPI body parameter
    does (the same ``RequestValidationError``, hence the same envelope: 400 for a body that is
    not JSON, 422 for one that does not validate), without FastAPI's
    per-request dependency solving and content-type parsing: for routes whose answer costs
    about as much as that (POST /v1/recommend), documented by ``openapi_extra``."""
    raw = await request.body()
    if not raw:
        raise RequestValidationError([{"type": "missing", "loc": ("body",),
                                       "msg": "Field required", "input": None}])
    ctype = request.headers.get("content-type")
    data: Any = raw                 # not JSON by its content type: fails as a non-object
    if ctype and is_json(ctype):
        try:        # pydantic's own JSON parser: valid bodies in one pass
            return model.model_validate_json(raw)
        except ValidationError:     # invalid: parsed again, for FastAPI's errors below
            pass
        try:
            data = jsontext.loads(raw)
        except jsontext.BadJson as exc:
            raise RequestValidationError([{"type": "json_invalid", "loc": ("body",),
                                           "msg": "JSON decode error", "input": {},
                                           "ctx": {"error": str(exc)}}]) from None
    try:
        return model.model_validate(data, from_attributes=True)   # as FastAPI validates
    except ValidationError as exc:
        raise RequestValidationError([{**e, "loc": ("body", *e["loc"])}
                                      for e in exc.errors()]) from None


class JsonRequest(Request):
    """A request whose ``json()`` refuses every malformed body as ``engine_advisor.model.jsontext``
    does (Starlette's ``json.loads`` lets a lone surrogate through, and FastAPI turns a
    RecursionError into "There was an error parsing the body")."""

    async def json(self) -> Any:
        if not hasattr(self, "_json"):
            try:
                self._json = jsontext.loads(await self.body())
            except jsontext.BadJson as exc:      # FastAPI's own invalid-JSON error: a 400
                raise json.JSONDecodeError(str(exc), "", 0) from None
        return self._json


class JsonRoute(APIRoute):
    """The route class of routers whose routes take FastAPI body parameters: their bodies
    parsed by ``JsonRequest``."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()
        if self.body_field is None:
            return handler

        async def strict(request: Request) -> Response:
            return await handler(JsonRequest(request.scope, request.receive, request._send))

        return strict


async def get_settings(request: Request) -> Settings:
    return request.app.state.settings


async def get_holder(request: Request) -> ModelHolder:
    return request.app.state.holder


def current_model(request: Request) -> LoadedModel:
    """A snapshot of the loaded model for the whole request (reloads swap the holder); 503
    before the lifespan has loaded it."""
    return model_of(request.app.state)


def current_pools(request: Request) -> tuple[ProxyState, Pools]:
    """The proxy's state and its pools; 503 when it has none."""
    st: ProxyState = request.app.state.proxy
    if st.pools is None:
        raise ApiError(503, NO_POOLS)
    return st, st.pools


def model_of(state: Any) -> LoadedModel:
    """``current_model`` from the app's state."""
    # Starlette's State keeps its values in ``_state``; a plain getattr would first fail (an
    # AttributeError, its message formatted) before State.__getattr__ finds the holder
    values = getattr(state, "_state", None)
    holder = values.get("holder") if isinstance(values, dict) else getattr(state, "holder", None)
    if holder is None:
        raise ApiError(503, "the model is not loaded yet")
    return holder.current


async def get_model(request: Request) -> LoadedModel:
    return current_model(request)


async def get_metrics(request: Request) -> Metrics:
    return request.app.state.metrics


def hot_state(request: Request) -> tuple[LoadedModel, Metrics, ResponseCache]:
    """What POST /v1/recommend needs, read directly: FastAPI's dependency solving is a
    noticeable share of that request (docs/benchmarks.md)."""
    state = request.scope["app"].state
    values = state._state       # Starlette's State: its attributes, read without __getattr__
    return model_of(state), values["metrics"], values["recommend_cache"]


async def require_admin(request: Request) -> None:
    token = request.app.state.settings.admin_token
    if token is None or not token.get_secret_value():
        raise ApiError(403, "admin routes are disabled: no admin token is configured "
                            "(set ENGINE_ADVISOR_ADMIN_TOKEN)")
    auth = request.headers.get("authorization", "")
    scheme, _, given = auth.partition(" ")
    if scheme.lower() != "bearer" or not given.strip():
        raise ApiError(401, "missing bearer token: send 'Authorization: Bearer <admin token>'",
                       param="authorization", headers={"WWW-Authenticate": "Bearer"})
    if not hmac.compare_digest(given.strip().encode(), token.get_secret_value().encode()):
        raise ApiError(403, "invalid admin token", param="authorization")


SettingsDep = Annotated[Settings, Depends(get_settings)]
HolderDep = Annotated[ModelHolder, Depends(get_holder)]
ModelDep = Annotated[LoadedModel, Depends(get_model)]
MetricsDep = Annotated[Metrics, Depends(get_metrics)]
AdminDep = Annotated[None, Depends(require_admin)]
