"""A tiny in-process fake engine for unit tests of the sweep: an ``httpx.MockTransport``.

It streams ``max_tokens`` chunks with a small sleep between them and can be told to fail:
``fail`` maps a context length to an error body (status 500) or to ``"hang"``; ``flaky`` makes
that many upcoming completions fail with 503. ``server_info`` adds keys to SGLang's
``/get_server_info``; ``metrics`` is the ``/metrics`` text; ``max_model_len`` goes into
``/v1/models``; ``log`` (a path) gets a vLLM-style JIT line whenever a completion of a context in
``jit`` (context -> kernel name) arrives.
"""

from __future__ import annotations

import asyncio
import json

import httpx


class FakeEngine:
    def __init__(self, engine: str = "vllm", *, step_s: float = 0.001, version: str = "0.0-fake",
                 fail: dict[int, str] | None = None, models: tuple[str, ...] = ("fake-model",),
                 flaky: int = 0, server_info: dict | None = None, metrics: str | None = None,
                 max_model_len: int | None = None, log=None, jit: dict[int, str] | None = None):
        self.engine = engine
        self.step_s = step_s
        self.version = version
        self.fail = dict(fail or {})
        self.models = models
        self.requests: list[dict] = []
        self.healthy = True
        self.flaky = flaky
        self.server_info = dict(server_info or {})
        self.metrics = metrics
        self.max_model_len = max_model_len
        self.log = log
        self.jit = dict(jit or {})

    def transport(self) -> httpx.MockTransport:
        return httpx.MockTransport(self.handle)

    async def handle(self, request: httpx.Request) -> httpx.Response:
        path = request.url.path
        if path == "/health":
            return httpx.Response(200 if self.healthy else 503)
        if path == "/version" and self.engine == "vllm":
            return httpx.Response(200, json={"version": self.version})
        if path == "/get_server_info" and self.engine == "sglang":
            return httpx.Response(200, json={"version": self.version, "tp_size": 8,
                                             "mem_fraction_static": 0.9, **self.server_info})
        if path == "/metrics" and self.metrics is not None:
            return httpx.Response(200, text=self.metrics)
        if path == "/v1/models":
            extra = {"max_model_len": self.max_model_len} if self.max_model_len else {}
            return httpx.Response(200, json={"object": "list", "data": [
                {"id": m, "object": "model", **extra} for m in self.models]})
        if path == "/v1/completions":
            body = json.loads(request.content)
            self.requests.append(body)
            ctx = len(body["prompt"])
            if ctx in self.jit and self.log is not None:
                import time
                with open(self.log, "a") as f:
                    f.write(f"(EngineCore pid=1) WARNING {time.strftime('%m-%d %H:%M:%S')} "
                            "[jit_monitor.py:135] Triton kernel JIT compilation during "
                            f"inference: {self.jit.pop(ctx)}. This causes a latency spike\n")
            action = self.fail.get(ctx)
            if action == "hang":
                await asyncio.sleep(3600)
            if action is None and self.flaky > 0:
                self.flaky -= 1
                return httpx.Response(503, json={"object": "error", "message": "The engine is "
                                                 "temporarily unavailable", "code": 503})
            if action is not None:
                return httpx.Response(500, json={"error": {"message": action, "type": "Internal",
                                                           "param": None, "code": 500}})
            return httpx.Response(200, headers={"content-type": "text/event-stream"},
                                  content=self._stream(body, ctx))
        return httpx.Response(404, json={"error": {"message": "not found"}})

    async def _stream(self, body: dict, ctx: int):
        n = body["max_tokens"]
        await asyncio.sleep(self.step_s * 2)
        for i in range(n):
            chunk = {"id": "x", "object": "text_completion", "model": body["model"],
                     "choices": [{"index": 0, "text": f" t{i}", "finish_reason": None}]}
            yield f"data: {json.dumps(chunk)}\n\n".encode()
            await asyncio.sleep(self.step_s)
        usage = {"prompt_tokens": ctx, "completion_tokens": n, "total_tokens": ctx + n}
        yield f"data: {json.dumps({'choices': [], 'usage': usage})}\n\n".encode()
        yield b"data: [DONE]\n\n"
