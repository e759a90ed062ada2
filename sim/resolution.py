"""The simulator's time resolution: the smallest durations it can represent faithfully.

Every request costs wall time that no cost model asked for: the loopback HTTP exchange, parsing,
building the answer, the client's own work; every streamed event costs some more. At a small
``--time-scale`` those costs dwarf the scaled durations (a 5 ms round trip against a 0.2 ms
scaled TTFT), and a client measuring the simulator measures the overhead instead.

At startup, before it reports ready, the simulator measures both on itself: ``PROBES``
sequential round trips of ``POST /sim/probe`` (an answer built like a one-token completion,
with no simulated time) from a client thread over loopback, and ``STREAMS`` streams of
``PROBE_TOKENS`` events. ``/sim/info`` reports them under ``time_resolution``:

- ``request_overhead_s`` / ``token_overhead_s``: median wall seconds per request / per event;
- ``min_wall_s`` = ``FAITHFUL_MULTIPLE`` x request overhead: wall durations from this up are
  measured within about 1 / FAITHFUL_MULTIPLE; ``min_simulated_s`` is the same in simulated
  seconds (divided by the time scale), ``min_simulated_tpot_s`` likewise per token.

The overhead grows with the requests in flight (each one's exchange shares the same cores), so
users of these figures multiply by the concurrency.
"""

from __future__ import annotations

import datetime as dt
import statistics
import time
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.types import Receive, Scope, Send

from engine_advisor.sim.httputil import SSE_HEADERS, read_json
from engine_advisor.sim.protocol import DONE_EVENT, ApiError, ChunkWriter, GenParams, full_response
from engine_advisor.sim.textgen import plan_output

FAITHFUL_MULTIPLE = 10
PROBES = 8
STREAMS = 2
PROBE_TOKENS = 256
WARMUP = 1


def _params(n: int, stream: bool) -> GenParams:
    return GenParams(chat=False, prompt_ids=[1] * 16, max_tokens=n, min_tokens=0,
                     ignore_eos=True, stream=stream, include_usage=False,
                     continuous_usage=False, seed=None)


class _ProbeStream(Response):
    def __init__(self, writer: ChunkWriter, n: int):
        self.writer, self.n = writer, n

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": SSE_HEADERS})
        for k in range(self.n):
            fin = "length" if k == self.n - 1 else None
            await send({"type": "http.response.body", "more_body": True,
                        "body": self.writer.events(k, k + 1, fin).encode()})
        await send({"type": "http.response.body", "body": DONE_EVENT.encode(),
                    "more_body": False})


async def probe(request: Request) -> Response:
    """An answer shaped like a completion, at once: the simulator's own per-request cost."""
    try:
        body = await read_json(request)
    except ApiError as err:
        return JSONResponse({"error": err.message}, status_code=400)
    n = body.get("tokens", 1) if isinstance(body, dict) else None
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= 4096:
        return JSONResponse({"error": "tokens: expected an integer in 1 .. 4096"},
                            status_code=400)
    stream = bool(body.get("stream"))
    p = _params(n, stream)
    plan = plan_output(p.prompt_ids, server_seed=0, request_seed=None, max_tokens=n,
                       min_tokens=0, ignore_eos=True)
    if stream:
        return _ProbeStream(ChunkWriter(p, "probe", "probe", plan), n)
    return JSONResponse(full_response(p, "probe", "probe", plan))


def measure(base_url: str, time_scale: float, deadline_s: float = 15.0) -> dict[str, Any]:
    """Time the probes from this thread (blocking: run it off the event loop)."""
    import httpx

    stop = time.monotonic() + deadline_s
    with httpx.Client(base_url=base_url, timeout=5.0) as client:
        while True:                 # the server may not listen yet
            try:
                client.post("/sim/probe", json={"tokens": 1}).raise_for_status()
                break
            except httpx.TransportError:
                if time.monotonic() > stop:
                    raise
                time.sleep(0.02)
        for _ in range(WARMUP):
            client.post("/sim/probe", json={"tokens": 1})
        rts = []
        for _ in range(PROBES):
            t0 = time.perf_counter()
            client.post("/sim/probe", json={"tokens": 1}).raise_for_status()
            rts.append(time.perf_counter() - t0)
        streams = []
        for _ in range(STREAMS):
            t0 = time.perf_counter()
            with client.stream("POST", "/sim/probe",
                               json={"tokens": PROBE_TOKENS, "stream": True}) as r:
                for _ in r.iter_lines():
                    pass
            streams.append(time.perf_counter() - t0)
    request_s = statistics.median(rts)
    token_s = max(statistics.median(streams) - request_s, 0.0) / PROBE_TOKENS
    min_wall = FAITHFUL_MULTIPLE * request_s
    return {"measured_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
            "request_overhead_s": request_s, "token_overhead_s": token_s,
            "faithful_multiple": FAITHFUL_MULTIPLE, "min_wall_s": min_wall,
            "min_simulated_s": min_wall / time_scale,
            "min_simulated_tpot_s": FAITHFUL_MULTIPLE * token_s / time_scale,
            "time_scale": time_scale}


def describe(res: dict[str, Any]) -> str:
    """The startup log line."""
    return (f"time resolution: {res['request_overhead_s'] * 1e3:.2f} ms per request and "
            f"{res['token_overhead_s'] * 1e3:.3f} ms per streamed token of overhead (measured "
            f"on this machine at startup); at --time-scale {res['time_scale']:g} simulated "
            f"times from {res['min_simulated_s']:.4g} s (TTFT, E2E) and "
            f"{res['min_simulated_tpot_s'] * 1e3:.4g} ms (TPOT) up are represented within "
            f"1/{res['faithful_multiple']}, per request in flight")
