"""POST /bench/constant: a trivial endpoint for bench/bench_service.py (only when the
``bench_routes`` setting is on; not in the OpenAPI document). It shares the app's middleware
and server options, so the bench compares /v1/recommend against the stack's floor."""

from __future__ import annotations

from fastapi import APIRouter, Response

router = APIRouter(prefix="/bench", tags=["bench"], include_in_schema=False)

CONSTANT = b'{"ok":true}'


@router.post("/constant")
async def bench_constant() -> Response:
    return Response(CONSTANT, media_type="application/json")
