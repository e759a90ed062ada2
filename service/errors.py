"""One error envelope for every 4xx/5xx: ``{"error": {"message", "type", "param", "code"}}``."""

from __future__ import annotations

import logging
import re
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

from engine_advisor.model import jsontext

log = logging.getLogger("engine_advisor.service")

TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
         404: "not_found_error", 405: "invalid_request_error", 413: "request_too_large",
         422: "invalid_request_error", 503: "service_unavailable"}


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: int | str | None = None


class ErrorResponse(BaseModel):
    error: ErrorDetail


class ApiError(Exception):
    """An error the routes raise on purpose; rendered as the envelope."""

    def __init__(self, status: int, message: str, *, param: str | None = None,
                 type: str | None = None, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.message, self.param = status, message, param
        self.type = type or TYPES.get(status, "error")
        self.headers = headers

    def detail(self) -> ErrorDetail:
        return ErrorDetail(message=self.message, type=self.type, param=self.param,
                           code=self.status)

    def response(self) -> JSONResponse:
        return envelope(self.status, self.message, param=self.param, type=self.type,
                        headers=self.headers)


def envelope(status: int, message: str, *, param: str | None = None, type: str | None = None,
             headers: dict[str, str] | None = None) -> JSONResponse:
    body = {"error": {"message": message, "type": type or TYPES.get(status, "error"),
                      "param": param, "code": status}}
    return JSONResponse(body, status_code=status, headers=headers)


UNION_TAG = re.compile(r"^(str|int|float|bool|none|[A-Z]\w*|\w+\[.*\])$")


def _strip(loc: tuple[Any, ...] | list[Any]) -> tuple[list[str], bool]:
    """Field path without the location prefix and pydantic's union-branch tags."""
    parts = [str(p) for p in loc]
    if parts and parts[0] in ("body", "query", "path", "header"):
        parts = parts[1:]
    kept = [p for p in parts if not UNION_TAG.match(p)]
    return kept, len(kept) != len(parts)


def field_path(loc: tuple[Any, ...] | list[Any]) -> str:
    """('body', 'gpu', 'GpuSpec', 'memory_bytes') -> 'gpu.memory_bytes'."""
    return ".".join(_strip(loc)[0])


def _prune_union_branches(errors: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Of a union's branches, keep the errors inside the branch the input was meant for: a
    plain type mismatch of another branch ('gpu: Input should be a valid string') is noise
    when the input was an object that failed deeper."""
    def tagged_leaf(err: dict[str, Any]) -> bool:
        loc = [str(p) for p in err.get("loc", ())]
        return bool(loc) and bool(UNION_TAG.match(loc[-1]))

    deep = {field_path(e.get("loc", ())) for e in errors if _strip(e.get("loc", ()))[1]
            and not tagged_leaf(e)}
    out = [e for e in errors if not (tagged_leaf(e) and any(
        d.startswith(field_path(e.get("loc", ()))) for d in deep))]
    return out or errors


def _reason(err: dict[str, Any]) -> str:
    msg = str(err.get("msg", "invalid")).removeprefix("Value error, ")
    if err.get("type") == "json_invalid":
        msg = f"invalid JSON ({(err.get('ctx') or {}).get('error', 'decode error')})"
    return msg


def validation_detail(errors: list[dict[str, Any]], prefix: str = "") -> tuple[str, str | None]:
    """(message, param) of a list of pydantic errors: 'path: reason; path: reason'."""
    parts, first = [], None
    errors = _prune_union_branches(errors)
    for err in errors[:10]:
        loc = err.get("loc", ())
        path = field_path(loc) or ("body" if loc and not prefix else "")
        if err.get("type") == "json_invalid":
            path = ""
        path = ".".join(p for p in (prefix, path) if p)
        first = first if first is not None else (path or None)
        parts.append(f"{path}: {_reason(err)}" if path else _reason(err))
    if len(errors) > 10:
        parts.append(f"... and {len(errors) - 10} more")
    return "; ".join(parts) or "invalid request", first


def install(app: FastAPI) -> None:
    @app.exception_handler(ApiError)
    async def _api(_: Request, exc: ApiError) -> JSONResponse:
        return exc.response()

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = list(exc.errors())
        bad = next((e for e in errors if e.get("type") == "json_invalid"), None)
        if bad is not None:         # not JSON at all: the request's syntax, 400
            return envelope(400, _reason(bad))
        ctype = request.headers.get("content-type", "")
        if ctype and not is_json(ctype) and any(tuple(e.get("loc", ())) == ("body",)
                                                 for e in errors):
            # the body was not parsed at all: say why instead of "Input should be an object"
            return envelope(422, f"content-type: expected application/json, got {ctype[:80]!r}",
                            param="content-type")
        message, param = validation_detail(errors)
        return envelope(422, message, param=param)

    @app.exception_handler(ValidationError)
    async def _pydantic(_: Request, exc: ValidationError) -> JSONResponse:
        message, param = validation_detail(exc.errors())
        return envelope(422, message, param=param)

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        if isinstance(exc.__cause__, jsontext.PARSE_ERRORS) and exc.status_code == 400:
            # FastAPI's body parsing refused what its JSONDecodeError handling does not cover
            # (bytes that are not UTF-8, nesting too deep, an integer of too many digits):
            # invalid JSON like any other, with the reason instead of "error parsing the body"
            return envelope(400, f"invalid JSON ({jsontext.reason(exc.__cause__)})")
        message = exc.detail if isinstance(exc.detail, str) else str(exc.detail)
        return envelope(exc.status_code, message, headers=getattr(exc, "headers", None))

    @app.exception_handler(ClientDisconnect)
    async def _gone(_: Request, exc: ClientDisconnect) -> JSONResponse:
        # gone, or cut off by the front door's body timeout, before its body came: nobody
        # reads this answer, and it is no server error (nothing logged)
        return envelope(400, "the client disconnected before its body arrived")

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        return internal_error(request.method, request.url.path)


def internal_error(method: str, path: str) -> JSONResponse:
    """The 500 of an unexpected exception, logged with its traceback (call it in ``except``)."""
    log.exception("unhandled error on %s %s", method, path)
    return envelope(500, "internal error; see the server log", type="server_error")


def is_json(content_type: str) -> bool:
    media = content_type.split(";", 1)[0].strip().lower()
    return media == "application/json" or media.endswith("+json")


def error_responses(*codes: int) -> dict[int | str, dict[str, Any]]:
    """``responses=`` for a route: each code documented with the envelope."""
    return {c: {"model": ErrorResponse, "description": TYPES.get(c, "error")} for c in codes}
