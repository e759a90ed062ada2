"""HTTP routes of the simulator: the OpenAI endpoints plus each engine's own
(``engine_advisor.sim.engines``: which routes, and the engine's quirks)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Callable
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from engine_advisor.sim import native, resolution
from engine_advisor.sim.engine import EngineCore, SimRequest
from engine_advisor.sim.faults import HeaderError
from engine_advisor.sim.httputil import SSE_HEADERS, read_json, wait_disconnect
from engine_advisor.sim.protocol import (
    DONE_EVENT,
    ApiError,
    ChunkWriter,
    GenParams,
    check_model,
    error_body,
    full_response,
    new_id,
    parse_generation,
    render_chat,
)
from engine_advisor.sim.state import SimState
from engine_advisor.sim.textgen import plan_output


# ----------------------------------------------------------------------------- helpers
def _error(state: SimState, err: ApiError) -> JSONResponse:
    return JSONResponse(error_body(state.engine, err), status_code=err.status)


class _Cut(Response):
    """A response cut mid-body: the headers and ``body`` go out, then the connection closes."""

    def __init__(self, status: int, headers: list[tuple[bytes, bytes]], body: bytes,
                 after: Callable[[], None]):
        self.status = status
        self.headers_ = headers
        self.body_part = body
        self.after = after

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await send({"type": "http.response.start", "status": self.status,
                        "headers": self.headers_})
            if self.body_part:
                await send({"type": "http.response.body", "body": self.body_part,
                            "more_body": True})
        finally:
            self.after()


class _Stream(Response):
    """SSE stream of one request; the client going away aborts the engine request at once."""

    def __init__(self, core: EngineCore, req: SimRequest, writer: ChunkWriter,
                 drop_after: int | None, done: Callable[[], None]):
        self.core, self.req, self.writer = core, req, writer
        self.n, self.finish = writer.plan.n, writer.plan.finish_reason
        self.drop_after, self.done = drop_after, done

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        core, req, writer = self.core, self.req, self.writer

        async def watch() -> None:
            await wait_disconnect(receive)
            core.abort(req)

        watcher = asyncio.ensure_future(watch())
        try:
            await send({"type": "http.response.start", "status": 200, "headers": SSE_HEADERS})
            sent = 0
            limit = self.n if self.drop_after is None else min(self.n, self.drop_after)
            while True:
                if req.produced <= sent and not req.finished:
                    req.event.clear()
                    await req.event.wait()
                if req.aborted:
                    return
                k = min(req.produced, limit)
                if k > sent:
                    fin = self.finish if k == self.n else None
                    await send({"type": "http.response.body",
                                "body": writer.events(sent, k, fin).encode(), "more_body": True})
                    sent = k
                if sent >= limit and limit < self.n:
                    return          # cut: no final chunk, no [DONE], the connection closes
                if req.finished and sent >= self.n:
                    tail = writer.usage_event(sent) if writer.p.include_usage else ""
                    await send({"type": "http.response.body", "body": (tail + DONE_EVENT).encode(),
                                "more_body": False})
                    return
        finally:
            watcher.cancel()
            core.abort(req)
            self.done()


# ----------------------------------------------------------------------------- the app
def create_app(state: SimState) -> Starlette:
    cfg = state.cfg
    engine = state.engine

    async def generate(request: Request, chat: bool) -> Response:
        received = asyncio.get_running_loop().time()
        if not state.ready:
            return _error(state, ApiError(503, "The engine is starting up; try again later"))
        try:
            forced = state.faults.forced(request.headers)
            drop_after = state.faults.drop_after(request.headers)
        except HeaderError as exc:
            return _error(state, ApiError(400, str(exc)))
        if forced is not None:
            return _error(state, ApiError(forced.status, forced.message))
        try:
            body = await read_json(request)
            if isinstance(body, dict):
                check_model(body, cfg.model_name, engine)
            p: GenParams = parse_generation(body, chat=chat, max_model_len=state.max_model_len,
                                            tok=state.tok)
        except ApiError as err:
            return _error(state, err)
        core = state.core
        if state.faults.hang(request.headers):
            await wait_disconnect(request.receive)
            return Response(status_code=499)
        injected = state.faults.random_failure()
        if injected is not None:
            core.stats.errors[injected.status] = core.stats.errors.get(injected.status, 0) + 1
            return _error(state, ApiError(injected.status, injected.message))
        plan = plan_output(p.prompt_ids, server_seed=cfg.seed, request_seed=p.seed,
                           max_tokens=p.max_tokens, min_tokens=p.min_tokens,
                           ignore_eos=p.ignore_eos, vocab=state.vocab)
        if drop_after is not None and drop_after >= plan.n:
            drop_after = None       # the response ends before the cut would happen
        cached = state.prefix.lookup_and_insert(p.prompt_ids)
        req = core.submit(len(p.prompt_ids), plan.n, reason=plan.finish_reason, cached=cached,
                          received=received)
        state.in_flight += 1
        rid = new_id(engine, chat)

        def done() -> None:
            state.in_flight -= 1

        if p.stream:
            writer = ChunkWriter(p, rid, cfg.model_name, plan)
            return _Stream(core, req, writer, drop_after, done)
        watcher = asyncio.ensure_future(wait_disconnect(request.receive))
        answered = False
        try:
            while not req.finished:
                if drop_after is not None and req.produced >= drop_after:
                    break
                req.event.clear()
                waiter = asyncio.ensure_future(req.event.wait())
                await asyncio.wait({waiter, watcher}, return_when=asyncio.FIRST_COMPLETED)
                waiter.cancel()
                if watcher.done():
                    return Response(status_code=499)    # the client is gone: nobody reads it
            answered = True
        finally:
            watcher.cancel()
            if not answered:        # client gone or the server shutting down
                core.abort(req)
                done()
        if drop_after is not None:
            core.abort(req)
            payload = json.dumps(full_response(p, rid, cfg.model_name, plan)).encode()
            headers = [(b"content-type", b"application/json"),
                       (b"content-length", str(len(payload)).encode())]
            return _Cut(200, headers, payload[: len(payload) // 2], done)
        done()
        return JSONResponse(full_response(p, rid, cfg.model_name, plan))

    async def completions(request: Request) -> Response:
        return await generate(request, chat=False)

    async def chat_completions(request: Request) -> Response:
        return await generate(request, chat=True)

    async def models(request: Request) -> Response:
        card = {"id": cfg.model_name, "object": "model", "created": int(state.started),
                "owned_by": engine.name, "root": cfg.model_name, "parent": None,
                "max_model_len": state.max_model_len}
        return JSONResponse({"object": "list", "data": [card]})

    async def object_body(request: Request) -> dict:
        """The JSON object of a (de)tokenize request, for this server's model (else 400)."""
        body = await read_json(request)
        if not isinstance(body, dict):
            raise ApiError(400, "request body: expected a JSON object")
        check_model(body, cfg.model_name, engine)
        return body

    async def tokenize(request: Request) -> Response:
        tok = state.tok
        try:
            body = await object_body(request)
            prompt = body.get("prompt")
            if "messages" in body:
                ids = tok.encode(render_chat(body["messages"]))
            elif isinstance(prompt, str):
                ids = tok.encode(prompt)
            elif engine.batch_tokenize and isinstance(prompt, list) and prompt \
                    and all(isinstance(x, str) for x in prompt):     # a list of texts
                lists = [tok.encode(x) for x in prompt]
                return JSONResponse({"tokens": lists, "count": [len(x) for x in lists],
                                     "max_model_len": state.max_model_len})
            else:
                what = "a string or a list of strings" if engine.batch_tokenize else "a string"
                raise ApiError(400, f"prompt: expected {what} (or send messages)", "prompt")
        except ApiError as err:
            return _error(state, err)
        out: dict[str, Any] = {"count": len(ids), "max_model_len": state.max_model_len,
                               "tokens": ids, "token_strs": None}
        if body.get("return_token_strs"):
            out["token_strs"] = [tok.token_str(t) for t in ids]
        return JSONResponse(out)

    async def detokenize(request: Request) -> Response:
        tok = state.tok
        try:
            body = await object_body(request)
            ids = body.get("tokens")
            batch = engine.batch_tokenize and isinstance(ids, list) and bool(ids) \
                and all(isinstance(x, list) for x in ids)             # lists of ids
            for one in (ids if batch else [ids]):
                why = tok.check_ids(one)
                if why:
                    raise ApiError(400, f"tokens: {why}", "tokens")
        except ApiError as err:
            return _error(state, err)
        return JSONResponse({engine.detokenize_key: [tok.decode(x) for x in ids] if batch
                             else tok.decode(ids)})

    async def health(request: Request) -> Response:
        return Response(status_code=200 if state.ready else 503)

    async def health_generate(request: Request) -> Response:
        if not state.ready:
            return Response(status_code=503)
        req = state.core.submit(1, 1)
        while not req.finished:
            req.event.clear()
            await req.event.wait()
        return Response(status_code=200, content=engine.health_generate_text)

    async def metrics_route(request: Request) -> Response:
        if engine.json_metrics:     # TensorRT-LLM: the iteration stats since the last call
            return JSONResponse(engine.iteration_stats(state.core))
        return await prometheus_metrics(request)

    async def prometheus_metrics(request: Request) -> Response:
        info = {"gpu_memory_utilization": str(cfg.mem_fraction), "cache_dtype": "auto",
                "enable_prefix_caching": str(state.prefix_caching),
                "decode_context_parallel_size": str(cfg.dcp_size),
                "tensor_parallel_size": str(cfg.num_gpus),
                **engine.cache_info(state.pool, state.max_model_len)}
        text = engine.render_metrics(state.core, cfg.model_name, info)
        return PlainTextResponse(text, media_type="text/plain; version=0.0.4; charset=utf-8")

    async def version(request: Request) -> Response:
        return JSONResponse({"version": engine.version})

    async def load(request: Request) -> Response:
        return JSONResponse({"server_load": state.in_flight})

    async def model_info(request: Request) -> Response:
        return JSONResponse({"model_path": cfg.model_name, "tokenizer_path": cfg.model_name,
                             "is_generation": True, "preferred_sampling_params": None,
                             "weight_version": "default", "has_image_understanding": False,
                             "has_audio_understanding": False, "model_type": "simulated"})

    async def server_info(request: Request) -> Response:
        core = state.core
        internal = {"max_total_num_tokens": state.capacity,
                    "effective_max_running_requests_per_dp": state.pool.max_running,
                    "last_gen_throughput": core.stats.gen_throughput(time.monotonic()),
                    "num_running_reqs": core.num_running, "num_queue_reqs": core.num_waiting,
                    "token_usage": core.kv_usage()}
        if state.pool.state_slots:      # what the state pool holds, as SGLang records it
            internal["max_mamba_cache_size"] = state.pool.state_slots
        return JSONResponse({**state.server_args(), "internal_states": [internal],
                             "version": engine.version,
                             "simulator": {"time_scale": cfg.time_scale,
                                           "time_resolution": state.time_resolution}})

    async def sim_info(request: Request) -> Response:
        return JSONResponse(state.sim_info())

    routes = [
        Route("/v1/models", models, methods=["GET"]),
        Route("/v1/completions", completions, methods=["POST"]),
        Route("/v1/chat/completions", chat_completions, methods=["POST"]),
        Route("/health", health, methods=["GET"]),
        Route("/metrics", metrics_route, methods=["GET"]),
        Route("/sim/info", sim_info, methods=["GET"]),
        Route("/sim/probe", resolution.probe, methods=["POST"]),
    ]
    if engine.tokenize:
        routes += [Route("/tokenize", tokenize, methods=["POST"]),
                   Route("/detokenize", detokenize, methods=["POST"])]
    handlers = {"version": version, "load": load, "health_generate": health_generate,
                "model_info": model_info, "server_info": server_info, "tokenize": tokenize,
                "detokenize": detokenize, "prometheus_metrics": prometheus_metrics}
    routes += [Route(path, handlers[name], methods=[method])
               for path, name, method in engine.routes]
    if engine.native_api:
        routes += native.routes(state)

    async def http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        return JSONResponse({"detail": exc.detail}, status_code=exc.status_code)

    async def measure_resolution() -> None:
        host = "127.0.0.1" if cfg.host in ("0.0.0.0", "", "localhost") else cfg.host
        host = f"[{host}]" if ":" in host else host
        try:
            res = await asyncio.to_thread(resolution.measure, f"http://{host}:{cfg.port}",
                                          cfg.time_scale)
        except Exception as exc:        # a failed self-measurement must not stop the server
            state.note(f"time resolution not measured ({type(exc).__name__}: {exc})")
            return
        state.time_resolution = res
        state.note(resolution.describe(res))

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette):
        core = EngineCore(state.timer, state.pool, time_scale=cfg.time_scale,
                          admit_window_s=cfg.admit_window_ms / 1e3,
                          slots_per_request=engine.slots_per_request(cfg, state.pool))
        state.core = core
        engine.attach(core, cfg)
        core.start()

        async def become_ready() -> None:
            await asyncio.sleep(cfg.startup_seconds)
            await measure_resolution()
            state.ready = True
            state.log("ready")

        ready_task = asyncio.ensure_future(become_ready())
        try:
            yield
        finally:
            ready_task.cancel()
            await core.stop()

    return Starlette(routes=routes, lifespan=lifespan,
                     exception_handlers={HTTPException: http_error})
