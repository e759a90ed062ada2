"""Small HTTP helpers the simulator's routes share (ASGI level, no framework state)."""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.types import Receive

from engine_advisor.model import jsontext
from engine_advisor.sim.protocol import ApiError

SSE_HEADERS = [(b"content-type", b"text/event-stream; charset=utf-8"),
               (b"cache-control", b"no-cache")]


async def wait_disconnect(receive: Receive) -> None:
    while True:
        msg = await receive()
        if msg["type"] == "http.disconnect":
            return


async def read_json(request: Request) -> Any:
    """The body as JSON; a body an engine's parser refuses (engine_advisor.model.jsontext) is a
    400."""
    raw = await request.body()
    try:
        return jsontext.loads(raw)
    except jsontext.BadJson as exc:
        raise ApiError(400, f"request body: not valid JSON ({exc})") from None
