"""SGLang's native API in the simulator: ``POST /generate`` and ``/flush_cache``.

Shapes follow SGLang's HTTP server (``sglang.srt.entrypoints.http_server``, 0.5.x):

- request: ``text`` (a string, or a list for a batch) or ``input_ids`` (a list of ids, or a
  list of lists); ``sampling_params`` (an object, or one per batch item) with
  ``max_new_tokens`` (default 128), ``min_new_tokens``, ``ignore_eos``, ``temperature``,
  ``stop`` (a string or a list), ``n`` (1 only); ``stream``; ``rid``;
- answer: ``{"text", "output_ids", "meta_info": {"id", "finish_reason", "prompt_tokens",
  "completion_tokens", "cached_tokens", "e2e_latency", ...}}`` (a list of them for a batch);
  ``finish_reason`` is ``{"type": "length", "length": N}`` or ``{"type": "stop", "matched":
  token id or stop string}``;
- stream: ``data: {json}\\n\\n`` events whose ``text`` / ``output_ids`` hold everything
  generated so far (SGLang's default, non-incremental streaming), batch items tagged with
  ``index``; then ``data: [DONE]\\n\\n``;
- errors: a body of the wrong shape is refused with 400 ``{"error": "..."}`` (SGLang's schema
  gate); a request that parses but cannot run (lengths, parameters) gets 400
  ``{"error": {"message": ...}}``, or, when streaming, a 200 stream with one
  ``data: {"error": {...}}`` event before ``[DONE]``, as SGLang answers it;
- ``/flush_cache`` (GET or POST, ``?timeout=S``): empties the prefix cache when no request
  runs or waits (waiting up to ``timeout`` seconds for that), 200 text; else 400.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from engine_advisor.model import jsontext
from engine_advisor.sim.engine import EngineCore, SimRequest
from engine_advisor.sim.faults import HeaderError
from engine_advisor.sim.httputil import SSE_HEADERS, wait_disconnect
from engine_advisor.sim.textgen import OutputPlan, plan_output
from engine_advisor.sim.tokenizer import Tokenizer

if TYPE_CHECKING:
    from engine_advisor.sim.state import SimState

DEFAULT_MAX_NEW_TOKENS = 128          # SGLang's SamplingParams default
FLUSHED = ("Cache flushed.\nPlease check backend logs for more details. (When there are running "
           "or waiting requests, the operation will not be performed.)\n")


class ContractError(ValueError):
    """A body of the wrong shape (SGLang's schema gate: 400 ``{"error": "..."}``)."""


class GenerateError(ValueError):
    """A well-formed request that cannot run (SGLang's ValueError path)."""


@dataclass
class Item:
    """One sequence of a /generate request."""

    ids: list[int]
    max_new: int
    min_new: int
    ignore_eos: bool
    stop: list[str]
    rid: str
    plan: OutputPlan | None = None
    matched: Any = None
    final_text: str | None = None
    req: SimRequest | None = field(default=None, repr=False)


# ----------------------------------------------------------------------------- parsing
def _int(sp: dict, name: str, default: int) -> int:
    v = sp.get(name, default)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, int):
        raise ContractError(f"sampling_params.{name}: expected an integer, got {v!r}")
    return v


def _sampling(sp: Any, where: str) -> dict:
    if sp is None:
        return {}
    if not isinstance(sp, dict):
        raise ContractError(f"{where}: expected an object, got {type(sp).__name__}")
    return sp


def _stops(sp: dict) -> list[str]:
    stop = sp.get("stop")
    if stop is None:
        return []
    if isinstance(stop, str):
        stop = [stop]
    if not isinstance(stop, list) or not all(isinstance(s, str) and s for s in stop):
        raise ContractError("sampling_params.stop: expected a string or a list of non-empty "
                            "strings")
    return stop


def _prompts(body: dict, tok: Tokenizer) -> tuple[list[list[int]], bool]:
    """Token ids of each prompt and whether the request is a single one (not a batch)."""
    text, ids = body.get("text"), body.get("input_ids")
    if (text is None) == (ids is None):
        raise GenerateError("Either text or input_ids should be provided (not both)."
                            if text is not None else
                            "Either text, input_ids or input_embeds should be provided.")
    if text is not None:
        if isinstance(text, str):
            return [tok.encode(text)], True
        if isinstance(text, list) and text and all(isinstance(t, str) for t in text):
            return [tok.encode(t) for t in text], False
        raise ContractError("text: expected a string or a non-empty list of strings")
    if not isinstance(ids, list) or not ids:
        raise GenerateError("input_ids cannot be empty.")
    single = not isinstance(ids[0], list)
    batch = [ids] if single else ids
    for i, one in enumerate(batch):
        where = "input_ids" if single else f"input_ids[{i}]"
        if not isinstance(one, list):
            raise ContractError(f"{where}: expected a list of token ids")
        if not one:
            raise GenerateError("input_ids cannot be empty.")
        why = tok.check_ids(one)
        if why:
            raise ContractError(f"{where}: {why}")
    return batch, single


def parse_generate(body: Any, tok: Tokenizer, max_model_len: int) -> tuple[list[Item], bool,
                                                                             bool]:
    """(items, single, stream) of a /generate body; raises ContractError or GenerateError."""
    if not isinstance(body, dict):
        raise ContractError("request body: expected a JSON object")
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise ContractError(f"stream: expected true or false, got {stream!r}")
    for name in ("return_logprob", "return_hidden_states", "return_routed_experts"):
        if body.get(name):
            raise GenerateError(f"{name}: not supported by the simulator")
    prompts, single = _prompts(body, tok)
    sps = body.get("sampling_params")
    if isinstance(sps, list):
        if len(sps) != len(prompts):
            raise ContractError(f"sampling_params: {len(sps)} entries for {len(prompts)} "
                                "prompts")
        sps = [_sampling(sp, f"sampling_params[{i}]") for i, sp in enumerate(sps)]
    else:
        sps = [_sampling(sps, "sampling_params")] * len(prompts)
    rids = body.get("rid")
    if rids is None:
        rids = [uuid.uuid4().hex for _ in prompts]
    elif single and isinstance(rids, str):
        rids = [rids]
    elif not (isinstance(rids, list) and len(rids) == len(prompts)
              and all(isinstance(r, str) for r in rids)):
        raise GenerateError("The rid should be a string or a list of strings.")
    elif len(set(rids)) != len(rids):
        raise GenerateError(f"Duplicate request IDs detected within the request: {rids}")
    items = []
    for ids, sp, rid in zip(prompts, sps, rids, strict=True):
        max_new = _int(sp, "max_new_tokens", DEFAULT_MAX_NEW_TOKENS)
        min_new = _int(sp, "min_new_tokens", 0)
        n = _int(sp, "n", 1)
        temperature = sp.get("temperature", 1.0)
        if isinstance(temperature, bool) or not isinstance(temperature, int | float):
            raise ContractError(f"sampling_params.temperature: expected a number, got "
                                f"{temperature!r}")
        ignore_eos = sp.get("ignore_eos", False)
        if not isinstance(ignore_eos, bool):
            raise ContractError(f"sampling_params.ignore_eos: expected true or false, got "
                                f"{ignore_eos!r}")
        if not math.isfinite(temperature) or temperature < 0:
            raise GenerateError(f"temperature must be a non-negative finite number, got "
                                f"{temperature}.")
        if n != 1:
            raise GenerateError(f"n: the simulator generates one sequence per prompt (n=1), "
                                f"got {n}")
        if max_new < 1:
            raise GenerateError(f"max_new_tokens must be at least 1 in the simulator, got "
                                f"{max_new}.")
        if not 0 <= min_new <= max_new:
            raise GenerateError(f"min_new_tokens must be in [0, max_new_tokens({max_new})], "
                                f"got {min_new}.")
        if len(ids) >= max_model_len:
            raise GenerateError(f"The input ({len(ids)} tokens) is longer than the model's "
                                f"context length ({max_model_len} tokens).")
        if len(ids) + max_new > max_model_len:
            raise GenerateError(
                f"Requested token count exceeds the model's maximum context length of "
                f"{max_model_len} tokens. You requested a total of {len(ids) + max_new} tokens: "
                f"{len(ids)} tokens from the input messages and {max_new} tokens for the "
                "completion. Please reduce the number of tokens in the input messages or the "
                "completion to fit within the limit.")
        items.append(Item(ids, max_new, min_new, ignore_eos, _stops(sp), rid))
    return items, single, stream


def apply_stop(item: Item, plan: OutputPlan, eos_id: int) -> None:
    """Cut the plan at the first stop string (after ``min_new`` tokens) and set the match."""
    item.plan, item.matched = plan, (eos_id if plan.finish_reason == "stop" else None)
    if not item.stop:
        return
    words, indices = plan.vocab.words, plan.indices(0, plan.n)
    longest = max(len(s) for s in item.stop)
    text = ""
    for k, w in enumerate(indices, start=1):
        before = len(text)
        text += words[w]
        if k < max(item.min_new, 1):
            continue
        tail_from = max(0, before - longest + 1)
        hits = [(text.find(s, tail_from), s) for s in item.stop if s in text[tail_from:]]
        if hits:
            at, s = min(hits)
            item.plan = replace(plan, n=k, finish_reason="stop")
            item.matched, item.final_text = s, text[:at]
            return


# ----------------------------------------------------------------------------- answers
def _finish(item: Item) -> dict[str, Any]:
    if item.plan.finish_reason == "length":
        return {"type": "length", "length": item.plan.n}
    return {"type": "stop", "matched": item.matched}


def _meta(item: Item, k: int, done: bool) -> dict[str, Any]:
    req = item.req
    meta = {"id": item.rid, "finish_reason": _finish(item) if done else None,
            "prompt_tokens": len(item.ids), "weight_version": "default", "num_retractions": 0,
            "reasoning_tokens": 0, "completion_tokens": k, "cached_tokens": req.cached}
    if done:
        end = req.finished_at or asyncio.get_running_loop().time()
        meta["e2e_latency"] = max(end - req.arrival, 0.0)
    return meta


def _text(item: Item, k: int) -> str:
    if k == item.plan.n and item.final_text is not None:
        return item.final_text
    return item.plan.text(0, k)


def output(item: Item, k: int, done: bool, index: int | None = None) -> dict[str, Any]:
    out = {"text": _text(item, k), "output_ids": item.plan.token_ids(0, k),
           "meta_info": _meta(item, k, done)}
    if index is not None:
        out["index"] = index
    return out


def _event(obj: Any) -> bytes:
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


def error_event(message: str) -> bytes:
    return _event({"error": {"message": message, "type": "invalid_request_error", "code": 400,
                             "retryable": False}})


class _NativeStream(Response):
    """SGLang-framed stream of one /generate request (all items of a batch interleaved)."""

    def __init__(self, core: EngineCore, items: list[Item], single: bool,
                 done: Callable[[], None]):
        self.core, self.items, self.single, self.done = core, items, single, done

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        core, items = self.core, self.items
        watcher = asyncio.ensure_future(wait_disconnect(receive))
        sent = [0] * len(items)
        try:
            await send({"type": "http.response.start", "status": 200, "headers": SSE_HEADERS})
            while True:
                chunks = []
                for i, it in enumerate(items):
                    k = min(it.req.produced, it.plan.n)
                    if k > sent[i]:
                        chunks.append(_event(output(it, k, k == it.plan.n,
                                                    None if self.single else i)))
                        sent[i] = k
                if chunks:
                    await send({"type": "http.response.body", "body": b"".join(chunks),
                                "more_body": True})
                if watcher.done() or any(it.req.aborted for it in items):
                    return
                pending = [(i, it.req) for i, it in enumerate(items) if sent[i] < it.plan.n]
                if not pending:
                    await send({"type": "http.response.body", "body": b"data: [DONE]\n\n",
                                "more_body": False})
                    return
                for _, req in pending:
                    req.event.clear()
                if any(req.produced > sent[i] for i, req in pending):
                    continue            # progress between the send and the clear
                waiters = [asyncio.ensure_future(req.event.wait()) for _, req in pending]
                await asyncio.wait({*waiters, watcher}, return_when=asyncio.FIRST_COMPLETED)
                for w in waiters:
                    w.cancel()
        finally:
            watcher.cancel()
            for it in items:
                core.abort(it.req)
            self.done()


# ----------------------------------------------------------------------------- routes
def routes(state: SimState) -> list[Route]:
    cfg = state.cfg

    def refuse(status: int, message: str) -> JSONResponse:
        return JSONResponse({"error": {"message": message}}, status_code=status)

    async def generate(request: Request) -> Response:
        received = asyncio.get_running_loop().time()
        if not state.ready:
            return refuse(503, "The engine is starting up; try again later")
        try:
            forced = state.faults.forced(request.headers)
        except HeaderError as exc:
            return refuse(400, str(exc))
        if forced is not None:
            return refuse(forced.status, forced.message)
        raw = await request.body()
        try:
            body = jsontext.loads(raw)
        except jsontext.BadJson as exc:
            return JSONResponse({"error": f"request body: not valid JSON ({exc})"},
                                status_code=400)
        stream = isinstance(body, dict) and body.get("stream") is True
        try:
            items, single, stream = parse_generate(body, state.tok, state.max_model_len)
        except ContractError as exc:
            return JSONResponse({"error": str(exc)}, status_code=400)
        except GenerateError as exc:
            if stream:
                return _ErrorStream(str(exc))
            return refuse(400, str(exc))
        injected = state.faults.random_failure()
        if injected is not None:
            core = state.core
            core.stats.errors[injected.status] = core.stats.errors.get(injected.status, 0) + 1
            return refuse(injected.status, injected.message)
        core = state.core
        for it in items:
            plan = plan_output(it.ids, server_seed=cfg.seed, request_seed=None,
                               max_tokens=it.max_new, min_tokens=it.min_new,
                               ignore_eos=it.ignore_eos, vocab=state.vocab)
            apply_stop(it, plan, state.tok.eos_token_id)
            cached = state.prefix.lookup_and_insert(it.ids)
            it.req = core.submit(len(it.ids), it.plan.n, reason=it.plan.finish_reason,
                                 cached=cached, received=received)
        state.in_flight += len(items)

        def done() -> None:
            state.in_flight -= len(items)

        if stream:
            return _NativeStream(core, items, single, done)
        try:
            watcher = asyncio.ensure_future(wait_disconnect(request.receive))
            try:
                for it in items:
                    while not it.req.finished:
                        it.req.event.clear()
                        waiter = asyncio.ensure_future(it.req.event.wait())
                        await asyncio.wait({waiter, watcher},
                                           return_when=asyncio.FIRST_COMPLETED)
                        waiter.cancel()
                        if watcher.done():
                            return Response(status_code=499)
            finally:
                watcher.cancel()
                for it in items:
                    core.abort(it.req)
            outs = [output(it, it.plan.n, True) for it in items]
            return JSONResponse(outs[0] if single else outs)
        finally:
            done()

    async def flush_cache(request: Request) -> Response:
        raw = request.query_params.get("timeout", "0")
        try:
            timeout = float(raw)
            if not timeout >= 0 or math.isinf(timeout):
                raise ValueError
        except ValueError:
            return JSONResponse({"object": "error", "message": f"timeout: expected a number "
                                 f">= 0 (seconds), got {raw!r}", "type": "Bad Request",
                                 "param": None, "code": 400}, status_code=400)
        core = state.core
        deadline = time.monotonic() + timeout
        while core.num_running or core.num_waiting:
            if time.monotonic() >= deadline:
                return PlainTextResponse(
                    f"Cannot flush the cache: {core.num_running} running and "
                    f"{core.num_waiting} waiting requests.\n", status_code=400)
            await asyncio.sleep(0.01)
        state.prefix.clear()
        return PlainTextResponse(FLUSHED)

    return [Route("/generate", generate, methods=["POST", "PUT"]),
            Route("/flush_cache", flush_cache, methods=["GET", "POST"])]


class _ErrorStream(Response):
    """SGLang's answer to a streamed request it cannot run: 200, one error event, [DONE]."""

    def __init__(self, message: str):
        self.message = message

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": SSE_HEADERS})
        await send({"type": "http.response.body",
                    "body": error_event(self.message) + b"data: [DONE]\n\n", "more_body": False})
